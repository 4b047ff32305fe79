"""The scheduler state's invariant check (lockgate.scheduler.invariants): it catches each kind of
bookkeeping slip, and random sequences of every operation keep the state consistent (the
autouse fixture in conftest.py checks after each one)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from builders import a_job, a_node, a_queue, a_state

from lockgate.backoff import ControllerBackoff
from lockgate.jobs import JobState
from lockgate.placement import Taint
from lockgate.resources import Resources
from lockgate.scheduler import (
    NodeInfo,
    PreemptionPolicy,
    SchedJob,
    SchedulerState,
    plan_evictions,
    schedule_round,
)
from lockgate.scheduler.invariants import check_invariants

T0 = 1_700_000_000.0


def _busy_state() -> SchedulerState:
    state = (a_state().with_queues("a", "b")
             .with_cluster("cluster-a", a_node(cpu="4", memory="8Gi").times(2))
             .with_jobs(a_job("a").running_on("node-1"), a_job("a").released(),
                        a_job("b").times(3), a_job("b").requesting(cpu="64"),
                        a_job("b").in_group("ns/g", 2).times(2))
             .build())
    check_invariants(state)
    return state


def test_a_consistent_state_passes() -> None:
    check_invariants(SchedulerState())
    check_invariants(_busy_state())


def test_an_allocation_that_is_not_the_sum_of_its_jobs_is_named() -> None:
    state = _busy_state()
    state.queue_records["a"].allocation[0] += 1
    with pytest.raises(AssertionError, match=r"queue 'a''s allocation .* is not the sum"):
        check_invariants(state)


def test_a_waiting_job_missing_from_its_heap_is_named() -> None:
    state = _busy_state()
    pending = state.queue_records["b"].pending["cluster-a"]
    job_id = pending.pop()[2]  # the heap loses its top job, and keeps the rest
    assert all(entry[2] != job_id for entry in pending.entries)
    with pytest.raises(AssertionError, match=f"heap lacks waiting jobs \\['{job_id}'\\]"):
        check_invariants(state)


def test_a_pool_total_that_is_not_the_sum_of_its_nodes_is_named() -> None:
    state = _busy_state()
    state.pool_vector[0] -= 1000
    with pytest.raises(AssertionError, match="pool total"):
        check_invariants(state)


def test_node_usage_that_disagrees_with_the_bound_jobs_is_named() -> None:
    state = _busy_state()
    state.cluster_records["cluster-a"].used_by_node["node-1"][0] = 0
    with pytest.raises(AssertionError, match="usage of node 'node-1'"):
        check_invariants(state)


def test_a_group_index_that_lost_a_member_is_named() -> None:
    state = _busy_state()
    key = ("cluster-a", "b", "ns/g")
    member = state.groups().queued_members(key)[0]
    state.groups().remove(key, member, queued=True)
    with pytest.raises(AssertionError, match=r"group .*'s queued members"):
        check_invariants(state)


def test_a_job_held_without_its_controller_backing_off_is_named() -> None:
    state = _busy_state()
    record = next(r for r in state.job_records.values() if r.state is JobState.QUEUED)
    record.kind = record.kind._replace(held=True)  # as only a bug in the state would
    with pytest.raises(AssertionError, match="held"):
        check_invariants(state)


def test_a_room_index_that_missed_a_change_of_free_room_is_named() -> None:
    state = _busy_state()
    cluster = state.cluster_records["cluster-a"]
    cluster.current_caches()
    cluster.nodes["node-2"].free[0] -= 1000  # changed without telling the index
    with pytest.raises(AssertionError, match="index of its nodes' free room is stale"):
        check_invariants(state)


def test_a_kept_head_whose_job_changed_is_named() -> None:
    state = _busy_state()
    schedule_round(state, max_decisions=0, max_lookback_per_queue=10)
    pending = state.queue_records["b"].pending["cluster-a"]
    assert pending.head is not None
    record = state.job_records[pending.head[2]]
    record.kind = record.kind._replace(parked=True)  # as only a bug in the state would
    with pytest.raises(AssertionError, match="as its validated head, which has changed"):
        check_invariants(state)


# ---- random operations ----------------------------------------------------------------------

_SHAPES = ({"cpu": "1"}, {"cpu": "2", "memory": "1Gi"}, {"cpu": "500m"},
           {"cpu": "1", "nvidia.com/gpu": "1"}, {"cpu": "16"}, {"cpu": "1", "pods": "1"})
_STATES = (JobState.QUEUED, JobState.RELEASED, JobState.UNGATED, JobState.BOUND,
           JobState.RUNNING, JobState.SUCCEEDED, JobState.DELETED)


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_keep_the_state_consistent(seed: int) -> None:
    rng = random.Random(seed)
    clusters = ("cluster-a", "cluster-b")
    queues = ("a", "b", "c")
    state = SchedulerState()
    jobs: dict[str, SchedJob] = {}
    nodes = {cluster: [f"{cluster}-n{i}" for i in range(3)] for cluster in clusters}
    for step in range(300):
        roll = rng.random()
        if roll < 0.05:
            name = rng.choice(queues)
            if rng.random() < 0.2:
                state.remove_queue(name)
            else:
                state.upsert_queue(a_queue(name).with_weight(rng.choice((1, 2, 3)))
                                   .build())
        elif roll < 0.12:
            cluster = rng.choice(clusters)
            node = rng.choice(nodes[cluster])
            if rng.random() < 0.15:
                state.set_node(cluster, node, None)
            else:
                cpu = rng.choice(("2", "4", "8"))
                tainted = rng.random() < 0.2
                taints = (Taint(key="gpu", value="yes", effect="NoSchedule"),) if tainted else ()
                state.set_node(cluster, node, NodeInfo(
                    allocatable=Resources.from_kubernetes(
                        {"cpu": cpu, "memory": "8Gi", "nvidia.com/gpu": "1", "pods": "110"}),
                    schedulable=rng.random() < 0.9, taints=taints))
        elif roll < 0.5 or not jobs:
            cluster = rng.choice(clusters)
            builder = (a_job(rng.choice(queues)).in_cluster(cluster)
                       .requesting_resources(rng.choice(_SHAPES))
                       .with_priority(rng.choice((0, 0, 5))).created_at(step))
            if rng.random() < 0.2:
                builder = builder.in_group(f"ns/g{rng.randrange(3)}", rng.choice((2, 3)))
            if rng.random() < 0.3:
                builder = builder.controlled_by(f"rs-{rng.randrange(3)}")
            if rng.random() < 0.5:
                builder = builder.preemptible()
            job = builder.build()
            jobs[job.job_id] = job
            state.upsert_job(job)
        elif roll < 0.75:
            job_id = rng.choice(sorted(jobs))
            moved = rng.choice(_STATES)
            node = rng.choice(nodes[jobs[job_id].cluster]) if moved in (
                JobState.BOUND, JobState.RUNNING) else None
            job = replace(jobs[job_id], state=moved, node_name=node)
            if rng.random() < 0.1:
                job = replace(job, queue=rng.choice(queues))
            jobs[job_id] = job
            state.upsert_job(job)
            if job.state.is_terminal:
                del jobs[job_id]
        elif roll < 0.8:
            job_id = rng.choice(sorted(jobs))
            state.remove_job(job_id)
            del jobs[job_id]
        elif roll < 0.86:
            cluster, controller = rng.choice(clusters), f"rs-{rng.randrange(3)}"
            if rng.random() < 0.5:
                state.hold_controller(ControllerBackoff(cluster, controller, 1, T0, T0 + 60))
            else:
                state.release_controller((cluster, controller))
        else:
            result = schedule_round(state, max_decisions=rng.choice((1, 5, 100)),
                                    max_lookback_per_queue=rng.choice((0, 3, 100)),
                                    now=T0 + step, group_reserve_after_seconds=10)
            for decision in result.decisions:  # the state holds them as released now
                current = state.job(decision.job_id)
                assert current is not None
                jobs[decision.job_id] = replace(jobs[decision.job_id], state=current.state)
            if rng.random() < 0.5:
                plan_evictions(state, result, policy=PreemptionPolicy(), evicting=())
        check_invariants(state)  # (also checked by the fixture, inside each operation)
