"""explain against the fair targets: it never contradicts itself, and it says where a queue
stands against its target, what would change it, who gets the gaps and what room is held."""

from __future__ import annotations

import random
from itertools import combinations

from builders import a_job, a_node, a_queue, a_state

from lockgate.scheduler import Explainer, SchedulerState, WaitReason, schedule_round

T0 = 1_700_000_000.0


def test_two_waiting_pods_never_name_each_others_queue_as_going_first() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        queues = [a_queue(f"q{i}").with_priority_factor(rng.choice([0.5, 1.0, 2.0]))
                  for i in range(4)]
        builder = (a_state().with_queues(*queues)
                   .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(2))
                   .with_cluster("cluster-b", a_node(cpu="4", memory="16Gi").times(2)))
        for i in range(4):
            for cluster in ("cluster-a", "cluster-b"):
                running = rng.randint(0, 3)
                builder = builder.with_jobs(
                    [a_job(f"q{i}").in_cluster(cluster).running_on(f"node-{1 + n % 2}").build()
                     for n in range(running)],
                    a_job(f"q{i}").in_cluster(cluster).requesting(
                        cpu=rng.choice(["1", "2"])).times(rng.randint(0, 3)))
        state = builder.build()
        explainer = Explainer(state, now=T0)
        waiting = [job_id for job_id in state.job_records
                   if state.job_records[job_id].state.value == "queued"]
        told = {job_id: explainer.explain(job_id) for job_id in waiting}
        for one, other in combinations(waiting, 2):
            a, b = told[one], told[other]
            assert a is not None and b is not None
            if a.cluster != b.cluster or a.queue == b.queue:
                continue
            assert not (b.queue in a.competing_queues and a.queue in b.competing_queues), (
                seed, a.message, b.message)


def _crowded() -> SchedulerState:
    """cluster-a (2 x 4 cpu) full of comp's 1-cpu pods with more waiting; q waits with 2-cpu
    pods; cluster-b idle."""
    return (a_state()
            .with_queues("comp", "q")
            .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(2, prefix="a"))
            .with_cluster("cluster-b", a_node(cpu="4", memory="16Gi").times(2, prefix="b"))
            .with_jobs([a_job("comp").running_on("a-1").named(f"c1-{i}").build()
                        for i in range(4)],
                       [a_job("comp").running_on("a-2").named(f"c2-{i}").build()
                        for i in range(3)],
                       a_job("comp").times(5), a_job("q").requesting(cpu="2").named("big"))
            .build())


def test_a_queue_below_its_target_without_preemption_is_told_so_and_what_would_change_it(
) -> None:
    state = _crowded()
    explained = Explainer(state, now=T0, preemption=False).explain("big")
    assert explained is not None
    assert explained.reason is WaitReason.CLUSTER_ROOM
    assert explained.below_target and explained.cluster_target > explained.cluster_share
    assert explained.above_target == ("comp",)
    assert "below its fair target there" in explained.message
    assert "preemption is off" in explained.message
    assert "LOCKGATE_SCHEDULER_PREEMPTION_ENABLED=true" in explained.message
    assert "lockgate.io/preemptible=true" in explained.message
    on = Explainer(state, now=T0, preemption=True).explain("big")
    assert on is not None and "preemption may evict preemptible pods of queue" in on.message


def test_it_says_who_gets_the_gaps_and_then_that_room_is_held_for_it() -> None:
    state = _crowded()
    # Without holds: a-2 has a 1-cpu gap; comp's waiting 1-cpu pods fit it, the 2-cpu pod not.
    before = Explainer(state, now=T0, holds=False).explain("big")
    assert before is not None
    assert before.gaps_to == ("comp",) and before.held_on is None
    assert not before.room_gathers
    assert 'the gaps that open go to queue "comp"' in before.message
    # With holds (the leader's default) comp, above its target, takes no room in cluster-a
    # while big (owed room, able to use either node) waits: the round sets it aside.
    gathering = Explainer(state, now=T0).explain("big")
    assert gathering is not None and gathering.gaps_to == () and gathering.room_gathers
    assert "what frees on any node of cluster cluster-a is kept for queues owed room there" \
        in gathering.message
    released = schedule_round(state, max_decisions=100, max_lookback_per_queue=100, now=T0,
                              room_hold_seconds=60)
    assert all(decision.queue != "comp" for decision in released.decisions)
    assert released.queues["comp"].set_aside == ("cluster-a",)
    held = Explainer(state, now=T0 + 1).explain("big")
    assert held is not None and held.held_on == "a-2"
    assert held.held_until == T0 + 60
    assert "room is being held for it on node a-2" in held.message
    assert held.held_free is not None and held.held_free["cpu"] == 1000
    # The gap it waits in is no one else's now: comp is told nothing fits for it there.
    assert held.gaps_to == ()
