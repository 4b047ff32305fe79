"""The ephemeral namespaces' collection state machine and triggers (lockgate.namespaces)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from lockgate import namespaces as ns
from lockgate.jobs import JobState, advance
from lockgate.namespaces import NamespaceState as S

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CHECK = timedelta(seconds=1)
GRACE = timedelta(minutes=5)


def record(state: S = S.ACTIVE, **changes: object) -> ns.NamespaceRecord:
    base = ns.NamespaceRecord(cluster="cluster-a", name="job-1", queue="team-a", jobset="js",
                              state=state, created_at=T0, state_changed_at=T0)
    return replace(base, **changes)  # type: ignore[arg-type]


def facts(*, queue_exists: bool = True, jobs: int = 0, unfinished: int = 0,
          last_finished_at: datetime | None = None) -> ns.TriggerFacts:
    return ns.TriggerFacts(queue_exists=queue_exists,
                           activity=ns.JobSetActivity(jobs, unfinished, last_finished_at),
                           finished_grace=GRACE)


# The state machine ------------------------------------------------------------------------------

def test_the_whole_way_is_active_expiring_deleting_deleted_with_time_and_cause() -> None:
    history = []
    change = ns.expire(record(), ns.Trigger.CANCELLED, cause="by alice: done", at=T0)
    assert change is not None
    history.append(change.transition)
    change = ns.after_delete(change.record, ns.DeleteAnswer.ACCEPTED, at=T0 + CHECK,
                             check_after=CHECK)
    history.append(change.transition)
    waiting = ns.after_check(change.record, ns.CheckAnswer.TERMINATING, at=T0 + 2 * CHECK,
                             check_after=CHECK)
    assert waiting.transition is None  # still terminating: no new state, a later look
    assert waiting.record.next_attempt_at == T0 + 3 * CHECK
    change = ns.after_check(waiting.record, ns.CheckAnswer.GONE, at=T0 + 3 * CHECK,
                            check_after=CHECK)
    history.append(change.transition)

    assert [(t.from_state, t.to_state) for t in history if t] == [
        (S.ACTIVE, S.EXPIRING), (S.EXPIRING, S.DELETING), (S.DELETING, S.DELETED)]
    assert [t.at for t in history if t] == [T0, T0 + CHECK, T0 + 3 * CHECK]
    assert history[0] is not None and history[0].cause == "cancelled: by alice: done"
    assert change.record.state is S.DELETED and change.record.deleted_at == T0 + 3 * CHECK
    assert change.record.trigger is ns.Trigger.CANCELLED


@pytest.mark.parametrize(("current", "target"), [
    (S.DELETED, S.ACTIVE), (S.DELETED, S.DELETING), (S.ACTIVE, S.DELETED),
    (S.ACTIVE, S.DELETING), (S.EXPIRING, S.DELETED), (S.DELETING, S.ACTIVE),
    (S.FAILED, S.DELETED), (S.EXPIRING, S.ACTIVE),
])
def test_illegal_transitions_are_refused_naming_the_record_and_the_allowed_moves(
        current: S, target: S) -> None:
    with pytest.raises(ns.IllegalTransitionError) as refused:
        ns.move(record(current), target, cause="test", at=T0)
    message = str(refused.value)
    assert f"cluster-a/job-1 cannot go from {current.value} to {target.value}" in message
    assert "it may go to" in message


def test_a_deleted_record_says_it_is_final() -> None:
    with pytest.raises(ns.IllegalTransitionError, match="none: it is final"):
        ns.move(record(S.DELETED), S.FAILED, cause="x", at=T0)


def test_expiring_twice_changes_nothing_the_first_trigger_is_kept() -> None:
    first = ns.expire(record(), ns.Trigger.TTL, cause="ttl", at=T0)
    assert first is not None
    assert ns.expire(first.record, ns.Trigger.CANCELLED, cause="again", at=T0) is None
    assert first.record.trigger is ns.Trigger.TTL


def test_a_404_on_delete_is_checked_at_once_and_only_the_check_counts_it_deleted() -> None:
    expiring = record(S.EXPIRING)
    change = ns.after_delete(expiring, ns.DeleteAnswer.GONE, at=T0, check_after=CHECK)
    assert change.record.state is S.DELETING
    assert change.record.next_attempt_at == T0
    assert change.record.deleted_at is None


def test_a_namespace_present_and_not_terminating_after_deletion_is_deleted_again() -> None:
    deleting = record(S.DELETING)
    change = ns.after_check(deleting, ns.CheckAnswer.PRESENT, at=T0, check_after=CHECK)
    assert change.record.state is S.FAILED
    assert ns.next_step(change.record) is ns.Step.DELETE
    assert change.record.due(T0)


def test_failures_back_off_exponentially_capped_and_never_drop_the_record() -> None:
    backoff = ns.Backoff(initial_seconds=1, max_seconds=8)
    current = record(S.EXPIRING)
    waits = []
    for _ in range(6):
        change = ns.after_failure(current, "cluster unreachable: timeout", at=T0,
                                  backoff=backoff)
        assert change.transition is not None
        assert change.transition.to_state is S.FAILED
        current = change.record
        assert current.next_attempt_at is not None
        waits.append((current.next_attempt_at - T0).total_seconds())
    assert waits == [1, 2, 4, 8, 8, 8]
    assert current.attempts == 6 and current.failure_reason == "cluster unreachable: timeout"
    assert not current.due(T0) and current.due(T0 + timedelta(seconds=8))
    # The retry takes up where it failed: delete again, then deleting.
    assert ns.next_step(current) is ns.Step.DELETE
    retried = ns.after_delete(current, ns.DeleteAnswer.ACCEPTED, at=T0, check_after=CHECK)
    assert retried.record.state is S.DELETING and retried.record.failure_reason == ""


def test_backoff_of_a_record_failing_for_weeks_stays_capped() -> None:
    assert ns.Backoff(max_seconds=60).after(10_000) == timedelta(seconds=60)


def test_steps_per_state() -> None:
    assert [ns.next_step(record(s)) for s in S] == [
        ns.Step.NONE, ns.Step.DELETE, ns.Step.CHECK, ns.Step.NONE, ns.Step.DELETE]
    assert not record(S.ACTIVE).due(T0) and not record(S.DELETED).due(T0)


# Triggers -------------------------------------------------------------------------------------

def test_ttl_fires_once_it_has_passed() -> None:
    r = record(expires_at=T0 + timedelta(minutes=10))
    assert ns.fired_trigger(r, facts(), T0 + timedelta(minutes=9)) is None
    fired = ns.fired_trigger(r, facts(), T0 + timedelta(minutes=10))
    assert fired is not None and fired[0] is ns.Trigger.TTL


def test_finished_fires_after_the_grace_since_the_last_job_ended() -> None:
    ended = T0 + timedelta(minutes=1)
    done = facts(jobs=3, unfinished=0, last_finished_at=ended)
    assert ns.fired_trigger(record(), done, ended + GRACE - timedelta(seconds=1)) is None
    fired = ns.fired_trigger(record(), done, ended + GRACE)
    assert fired is not None and fired[0] is ns.Trigger.FINISHED
    assert "no unfinished pods since" in fired[1]


def test_finished_does_not_fire_while_a_pod_is_unfinished_or_before_any_pod() -> None:
    late = T0 + timedelta(days=1)
    assert ns.fired_trigger(record(), facts(jobs=3, unfinished=1, last_finished_at=T0),
                            late) is None
    assert ns.fired_trigger(record(), facts(jobs=0), late) is None


def test_queue_deleted_fires_and_comes_before_the_others() -> None:
    fired = ns.fired_trigger(record(expires_at=T0), facts(queue_exists=False), T0)
    assert fired is not None and fired[0] is ns.Trigger.QUEUE_DELETED
    assert "team-a" in fired[1]


def test_no_trigger_fires_for_a_record_already_collecting() -> None:
    for state in (S.EXPIRING, S.DELETING, S.FAILED, S.DELETED):
        assert ns.fired_trigger(record(state, expires_at=T0), facts(queue_exists=False),
                                T0) is None


# Cancelled jobs ---------------------------------------------------------------------------------

def test_cancelled_is_terminal_and_later_pod_events_leave_it() -> None:
    assert JobState.CANCELLED.is_terminal and not JobState.CANCELLED.holds_capacity
    assert advance(JobState.CANCELLED, JobState.DELETED) is JobState.CANCELLED
    assert advance(JobState.CANCELLED, JobState.RUNNING) is JobState.CANCELLED
    assert advance(JobState.QUEUED, JobState.CANCELLED) is JobState.CANCELLED
