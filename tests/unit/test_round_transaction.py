"""A round's transaction (`SchedulerState.begin_round`, `RoundTransaction`): the round's releases
stand once its caller commits them, and a release left out is taken back, its job queued again
exactly as before the round (issue 37, "a round is a transaction")."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import a_job, a_node, a_state, released_ids

from lockgate.jobs import JobState
from lockgate.scheduler import RoundResult, SchedulerState, schedule_round
from lockgate.scheduler.state import RoundTransaction


def two_queues() -> SchedulerState:
    """Two queues of four 1-cpu jobs each, room for five: a round releases five of eight."""
    return (a_state().with_queues("a", "b")
            .with_cluster("cluster-a", a_node(cpu="2").times(2) | {"big": a_node(cpu="1").build()})
            .with_jobs(a_job("a").times(4), a_job("b").times(4))
            .build())


def a_round(state: SchedulerState, transaction: RoundTransaction | None = None) -> RoundResult:
    return schedule_round(state, max_decisions=100, max_lookback_per_queue=10,
                          transaction=transaction)


def picture(state: SchedulerState) -> tuple[object, ...]:
    """What a round decides from: every job as the state holds it, and every queue's usage."""
    return (sorted((job_id, state.job(job_id)) for job_id in state.job_records),
            [state.queue_usage(name) for name in state.queue_names()])


def test_a_round_taken_back_leaves_the_state_as_before_and_decides_the_same_again() -> None:
    state = two_queues()
    before = picture(state)
    transaction = state.begin_round()
    first = a_round(state, transaction)
    assert len(first.decisions) == 5
    assert transaction.rollback() == released_ids(first)
    assert picture(state) == before
    # Each job kept its place in line, and the room came back: the same decisions again.
    again = a_round(state)
    assert [(d.job_id, d.node_hint) for d in again.decisions] == [
        (d.job_id, d.node_hint) for d in first.decisions]


def test_a_commit_keeps_the_recorded_releases_and_takes_the_others_back() -> None:
    state = two_queues()
    originals = {job_id: state.job(job_id) for job_id in state.job_records}
    transaction = state.begin_round()
    decided = released_ids(a_round(state, transaction))
    kept, dropped = decided[:3], decided[3:]
    assert transaction.commit(kept=set(kept)) == dropped
    for job_id in kept:
        job = state.job(job_id)
        assert job is not None and job.state is JobState.RELEASED
    assert [state.job(job_id) for job_id in dropped] == [originals[j] for j in dropped]
    assert state.queue_usage("a").allocated_jobs + state.queue_usage("b").allocated_jobs == 3
    # The room the dropped ones took is free again: the next round gives it out.
    assert len(a_round(state).decisions) == 2


def test_a_commit_keeping_every_release_changes_nothing() -> None:
    state = two_queues()
    transaction = state.begin_round()
    result = a_round(state, transaction)
    after_round = picture(state)
    assert transaction.commit() == []
    assert transaction.released == released_ids(result)
    assert picture(state) == after_round


def test_a_job_changed_between_the_round_and_the_commit_is_the_changes() -> None:
    """The feed may apply a row while the leader writes (not today's leader, which awaits only
    the write; a caller that does must not have its news undone)."""
    state = two_queues()
    transaction = state.begin_round()
    first, second, *_ = released_ids(a_round(state, transaction))
    job = state.job(first)
    assert job is not None
    running = replace(job, state=JobState.RUNNING, node_name="node-0")
    state.upsert_job(running)
    state.remove_job(second)
    assert transaction.rollback()[:2] == [first, second]
    assert state.job(first) == running
    assert state.job(second) is None


def test_one_transaction_at_a_time_each_committed_once() -> None:
    state = two_queues()
    transaction = state.begin_round()
    with pytest.raises(RuntimeError, match="open already"):
        state.begin_round()
    with pytest.raises(RuntimeError, match="open already"):
        a_round(state)  # a round without one opens its own
    with pytest.raises(ValueError, match="another state's"):
        a_round(two_queues(), transaction)
    a_round(state, transaction)
    transaction.commit()
    with pytest.raises(RuntimeError, match="closed"):
        transaction.commit()
    state.begin_round().rollback()  # the next round's may open


def test_the_invariants_are_checked_when_a_transaction_is_committed() -> None:
    """tests/unit/conftest.py checks the state on every commit: a slip there fails the test
    at the commit that caused it."""
    state = two_queues()
    transaction = state.begin_round()
    a_round(state, transaction)
    state.queue_records["a"].allocated += 1  # a bookkeeping slip
    with pytest.raises(AssertionError, match="allocated"):
        transaction.commit()
