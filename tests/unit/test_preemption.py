"""Preemption to fair share: who is evicted, for whom, and that it cannot thrash.

The property tests run a closed system through the real round and planner: every round binds what
it released, evictions are carried out at once and each evicted pod comes back queued (its
controller recreates it), nothing else arrives or finishes. The no-thrash invariant
(docs/scheduling.md, "Preemption") must hold for every eviction, and evictions must stop.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from builders import a_job, a_node, a_queue, a_state

from lockgate.fairness import RoundResult, schedule_round
from lockgate.jobs import JobState
from lockgate.preemption import Eviction, PreemptionPolicy, plan_evictions
from lockgate.scheduling import SchedJob, SchedulerState

POLICY = PreemptionPolicy(preemptible_priority_classes=frozenset({"batch-low"}))


def run_round(state: SchedulerState) -> RoundResult:
    result = schedule_round(state, max_decisions=10_000, max_lookback_per_queue=1000)
    for decision in result.decisions:  # kube-scheduler binds where the round meant
        job = state.job(decision.job_id)
        assert job is not None
        state.upsert_job(replace(job, state=JobState.RUNNING, node_name=decision.node_hint))
    return result


_replacements = iter(range(10**9))


def carry_out(state: SchedulerState, evictions: list[Eviction]) -> list[SchedJob]:
    """Delete each victim; its controller creates a new pod, which queues again."""
    recreated = []
    for eviction in evictions:
        victim = state.job(eviction.job_id)
        assert victim is not None
        state.upsert_job(replace(victim, state=JobState.DELETED))
        again = replace(victim, job_id=f"{victim.cluster}/again-{next(_replacements)}",
                        state=JobState.QUEUED, node_name=None,
                        created_at=victim.created_at + 10_000)
        state.upsert_job(again)
        recreated.append(again)
    return recreated


def test_a_queue_that_filled_the_cluster_is_evicted_down_to_its_fair_share() -> None:
    running = [a_job("a").preemptible().running_on(f"node-{1 + i // 4}").build()
               for i in range(8)]
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="4").times(2))
             .with_jobs(running, a_job("b").times(6)).build())
    result = run_round(state)
    assert result.decisions == ()
    evictions = plan_evictions(state, result, policy=POLICY, evicting=())
    assert len(evictions) == 4
    assert {e.queue for e in evictions} == {"a"} and {e.for_queue for e in evictions} == {"b"}
    assert "fair share 50.0%" in evictions[0].message
    carry_out(state, evictions)
    released = run_round(state)
    assert [d.queue for d in released.decisions] == ["b"] * 4
    for _ in range(5):  # a further window: nobody is evicted again
        assert plan_evictions(state, run_round(state), policy=POLICY, evicting=()) == []
    assert state.queue_usage("a").allocated_jobs == 4
    assert state.queue_usage("b").allocated_jobs == 4


def test_nothing_that_is_not_preemptible_is_evicted() -> None:
    running = [a_job("a").running_on("node-1").build() for _ in range(4)]
    running += [a_job("a").with_priority_class("batch-low").running_on("node-2").build()
                for _ in range(4)]
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="4").times(2))
             .with_jobs(running, a_job("b").times(6)).build())
    evictions = plan_evictions(state, run_round(state), policy=POLICY, evicting=())
    assert len(evictions) == 4
    assert {e.node for e in evictions} == {"node-2"}  # the priority class listed as preemptible


def test_evictions_in_flight_are_not_repeated() -> None:
    running = [a_job("a").preemptible().running_on("node-1").build() for _ in range(4)]
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(running, a_job("b").times(4)).build())
    result = run_round(state)
    first = plan_evictions(state, result, policy=POLICY, evicting=())
    assert len(first) == 2
    # The deletions are not observed yet: the next round plans nothing more.
    again = plan_evictions(state, run_round(state), policy=POLICY,
                           evicting={e.job_id for e in first})
    assert again == []


def test_a_queue_at_its_fair_share_is_not_preempted_for_and_weights_count() -> None:
    # b has weight 1, a weight 3: a's fair share is 3/4, so a holding 3 of 4 is left alone.
    running = [a_job("a").preemptible().running_on("node-1").build() for _ in range(3)]
    running.append(a_job("b").preemptible().running_on("node-1").build())
    state = (a_state().with_queues(a_queue("a").with_weight(3), "b")
             .with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(running, a_job("b").times(3), a_job("a").times(1)).build())
    assert plan_evictions(state, run_round(state), policy=POLICY, evicting=()) == []


def test_the_limit_per_round_holds() -> None:
    running = [a_job("a").preemptible().running_on("node-1").build() for _ in range(8)]
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(running, a_job("b").times(8)).build())
    policy = PreemptionPolicy(max_evictions_per_round=3)
    assert len(plan_evictions(state, run_round(state), policy=policy, evicting=())) == 3


# ---- property: the invariant holds and evictions stop ---------------------------------------


def _random_state(rng: random.Random) -> SchedulerState:
    queues = [f"q{i}" for i in range(rng.randint(2, 4))]
    nodes = {f"node-{i}": a_node(cpu=str(rng.choice((4, 8, 16))), memory="64Gi").build()
             for i in range(rng.randint(1, 4))}
    builder = a_state().with_queues(*(a_queue(q).with_weight(rng.choice((1, 1, 2, 3)))
                                      for q in queues)).with_cluster("cluster-a", nodes)
    state = builder.build()
    # Fill the nodes with running pods of a random few queues, preemptible or not.
    for name, info in nodes.items():
        room = info.allocatable.as_dict()["cpu"] // 1000
        while room > 0:
            cpu = min(room, rng.choice((1, 1, 2)))
            job = a_job(rng.choice(queues[:2])).requesting(cpu=str(cpu)).running_on(name)
            state.upsert_job((job.preemptible() if rng.random() < 0.8 else job).build())
            room -= cpu
    for queue in queues:
        for _ in range(rng.randint(0, 12)):
            job = a_job(queue).requesting(cpu=str(rng.choice((1, 1, 2))))
            state.upsert_job(job.preemptible().build())
    return state


@pytest.mark.parametrize("seed", range(60))
def test_no_eviction_breaks_the_invariant_and_evictions_stop(seed: int) -> None:
    rng = random.Random(seed)
    state = _random_state(rng)
    per_round: list[int] = []
    pairs: set[tuple[str, str]] = set()
    for _ in range(25):
        result = run_round(state)
        evictions = plan_evictions(state, result, policy=POLICY, evicting=())
        for eviction in evictions:
            victim = state.job(eviction.job_id)
            assert victim is not None and victim.preemptible
            assert victim.queue != eviction.for_queue
            # The rule: the preemptor ends at or below its victim's cost.
            assert eviction.preemptor_cost_after <= eviction.victim_cost_after + 1e-9
            assert eviction.preemptor_share < eviction.preemptor_fair_share
            pairs.add((eviction.queue, eviction.for_queue))
        per_round.append(len(evictions))
        carry_out(state, evictions)
    # No ping-pong: no queue evicted for a queue it was itself evicted for.
    assert not any((b, a) in pairs for a, b in pairs), pairs
    # Evictions stop, and the last rounds are quiet: no thrashing.
    assert sum(per_round[-15:]) == 0, per_round
