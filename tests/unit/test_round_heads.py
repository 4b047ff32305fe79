"""A round starts from the head each (queue, cluster) had validated in an earlier round
(`PendingJobs.head`), unless its job changed since: then the round looks again, so no change
between rounds lets it release a job that is gone, held, parked or behind another now."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from builders import a_job, a_node, a_state

from lockgate.backoff import ControllerBackoff
from lockgate.jobs import JobState
from lockgate.scheduler import SchedulerState, schedule_round
from lockgate.scheduler.invariants import check_invariants

T0 = 1_700_000_000.0


def _waiting_behind_a_full_node() -> SchedulerState:
    """Queue a waits in a full cluster: A (2 cpu, priority 5) first, then B (1 cpu)."""
    return (a_state().with_queues("a")
            .with_cluster("cluster-a", {"node-1": a_node(cpu="2", memory="8Gi").build()})
            .with_jobs(a_job("a").named("R").requesting(cpu="2").running_on("node-1"),
                       a_job("a").named("A").requesting(cpu="2").with_priority(5)
                       .controlled_by("rs-a"),
                       a_job("a").named("B").requesting(cpu="1"))
            .build())


def _round(state: SchedulerState) -> list[str]:
    result = schedule_round(state, max_decisions=10, max_lookback_per_queue=10, now=T0)
    return [decision.job_id for decision in result.decisions]


def _job(state: SchedulerState, job_id: str) -> object:
    job = state.job(job_id)
    assert job is not None
    return job


CHANGES: dict[str, Callable[[SchedulerState], None]] = {
    "removed": lambda state: state.remove_job("A"),
    "put behind B": lambda state: state.upsert_job(
        replace(state.job("A"), priority=-1)),  # type: ignore[type-var]
    "held while its controller backs off": lambda state: state.hold_controller(
        ControllerBackoff("cluster-a", "rs-a", 1, T0, T0 + 600)),
    "parked: no node fits it any more": lambda state: state.set_node(
        "cluster-a", "node-1", a_node(cpu="1", memory="8Gi").build()),
    "released by an earlier leader": lambda state: state.upsert_job(
        replace(state.job("A"), state=JobState.RELEASED)),  # type: ignore[type-var]
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_head_whose_job_changed_between_rounds_is_looked_at_again(change: str) -> None:
    state = _waiting_behind_a_full_node()
    assert _round(state) == []  # no room: A was looked at first, and stays the head
    pending = state.queue_records["a"].pending["cluster-a"]
    assert pending.head is not None and pending.head[2] == "A"
    CHANGES[change](state)
    state.remove_job("R")  # room for A, or for B
    released = _round(state)
    check_invariants(state)
    assert "A" not in released
    if change != "released by an earlier leader":  # else A holds the node, unbound
        assert released == ["B"]


def test_an_unchanged_head_is_released_when_room_comes() -> None:
    state = _waiting_behind_a_full_node()
    assert _round(state) == []
    state.remove_job("R")
    assert _round(state) == ["A"]
