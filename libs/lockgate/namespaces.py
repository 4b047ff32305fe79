"""Ephemeral namespaces' garbage-collection records: states, triggers and collection steps.

Why pure: a namespace must go when its job ends, even if lockgate crashes half-way through
cleaning up, and must never count as gone while its cluster still holds it. Those rules live
here, tested without Postgres or an apiserver. The collector (queue-store) reads a record, asks
`next_step` what to do, makes the one apiserver call, folds the answer with `after_delete` or
`after_check`, and stores the result with its transition in one transaction. Every step is
idempotent, so a crash at any point only repeats a step.

States (migration 005): active -> expiring -> deleting -> deleted, and failed (with its reason)
from expiring or deleting when a step could not be carried out; a failed record is retried at
`next_attempt_at`, after an exponential backoff capped at `Backoff.max_seconds`. Every change of
state, and every failed attempt, is a `Transition` with its time and cause. Anything else is an
`IllegalTransitionError`, which names the record and the moves it allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any


class NamespaceState(StrEnum):
    ACTIVE = "active"  # its job may use it
    EXPIRING = "expiring"  # a trigger fired; the collector has not asked the cluster yet
    DELETING = "deleting"  # the cluster was asked to delete it; not gone yet
    DELETED = "deleted"  # its cluster says it is gone (terminal)
    FAILED = "failed"  # the last step failed; retried at next_attempt_at


class Trigger(StrEnum):
    """Why collection started."""

    CANCELLED = "cancelled"  # its job set was cancelled
    FINISHED = "finished"  # its job set has had no unfinished pods for the grace period
    TTL = "ttl"  # its time to live passed
    QUEUE_DELETED = "queue_deleted"  # its queue was deleted
    REQUESTED = "requested"  # an operator asked (`lockgate namespace delete`)


ALLOWED: Mapping[NamespaceState, frozenset[NamespaceState]] = {
    NamespaceState.ACTIVE: frozenset({NamespaceState.EXPIRING}),
    NamespaceState.EXPIRING: frozenset({NamespaceState.DELETING, NamespaceState.FAILED}),
    NamespaceState.DELETING: frozenset({NamespaceState.DELETED, NamespaceState.FAILED}),
    # failed -> failed: another attempt failed (kept, with its reason, in the history).
    NamespaceState.FAILED: frozenset({NamespaceState.DELETING, NamespaceState.FAILED}),
    NamespaceState.DELETED: frozenset(),
}


class IllegalTransitionError(ValueError):
    """A move the state machine does not allow, e.g. deleted -> active."""

    def __init__(self, key: tuple[str, str], current: NamespaceState,
                 target: NamespaceState) -> None:
        allowed = sorted(s.value for s in ALLOWED[current]) or ["none: it is final"]
        super().__init__(
            f"namespace {key[0]}/{key[1]} cannot go from {current.value} to {target.value}; "
            f"from {current.value} it may go to {', '.join(allowed)}")
        self.key, self.current, self.target = key, current, target


@dataclass(frozen=True, slots=True)
class Backoff:
    """When a failed step is tried again: initial * multiplier**(attempts - 1), capped."""

    initial_seconds: float = 1.0
    max_seconds: float = 60.0
    multiplier: float = 2.0

    def after(self, attempts: int) -> timedelta:
        exponent = max(0, attempts - 1)
        # Capped before the power can overflow a float on a record that failed for weeks.
        seconds = self.initial_seconds * self.multiplier ** min(exponent, 64)
        return timedelta(seconds=min(self.max_seconds, seconds))


@dataclass(frozen=True, slots=True)
class NamespaceRecord:
    """One row of `ephemeral_namespaces`."""

    cluster: str
    name: str
    queue: str
    jobset: str
    state: NamespaceState
    created_at: datetime
    state_changed_at: datetime
    expires_at: datetime | None = None
    trigger: Trigger | None = None
    failure_reason: str = ""
    attempts: int = 0
    next_attempt_at: datetime | None = None
    deleted_at: datetime | None = None
    # What creation wrote and collection never changes: the coordinator ServiceAccount, the
    # time to live, and the job set's maximum time queued (lockgate.max_queued.JobSetMaxQueued
    # as JSON, stamped on the namespace for the webhook).
    service_account: str = ""
    ttl_seconds: int | None = None
    max_queued: Mapping[str, Any] | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.cluster, self.name)

    @property
    def collecting(self) -> bool:
        """Whether the collector has work on it (every state but active and deleted)."""
        return self.state not in (NamespaceState.ACTIVE, NamespaceState.DELETED)

    def due(self, now: datetime) -> bool:
        """Whether the collector should take a step on it now."""
        return self.collecting and (self.next_attempt_at is None or self.next_attempt_at <= now)


@dataclass(frozen=True, slots=True)
class Transition:
    """One line of a record's history (`ephemeral_namespace_transitions`)."""

    cluster: str
    name: str
    from_state: NamespaceState | None  # None: the record was created
    to_state: NamespaceState
    cause: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Change:
    """A record after a step, and the transition to store with it (None: no change of state,
    e.g. a namespace still terminating whose next look is merely rescheduled)."""

    record: NamespaceRecord
    transition: Transition | None


def move(record: NamespaceRecord, target: NamespaceState, *, cause: str,
         at: datetime) -> Change:
    """`record` in `target`, with its transition; raises IllegalTransitionError."""
    if target not in ALLOWED[record.state]:
        raise IllegalTransitionError(record.key, record.state, target)
    moved = replace(record, state=target, state_changed_at=at)
    return Change(moved, Transition(record.cluster, record.name, record.state, target, cause, at))


# Triggers -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class JobSetActivity:
    """What Postgres knows of a job set's pods, for the finished trigger."""

    jobs: int  # every job of the job set ever stored
    unfinished: int  # jobs in a non-terminal state
    last_finished_at: datetime | None  # when the last one reached a terminal state


@dataclass(frozen=True, slots=True)
class TriggerFacts:
    """Everything the triggers of one active record are judged by."""

    queue_exists: bool
    activity: JobSetActivity
    finished_grace: timedelta


def fired_trigger(record: NamespaceRecord, facts: TriggerFacts,
                  now: datetime) -> tuple[Trigger, str] | None:
    """The trigger that fires for an active record now, with its cause; None if none does.

    Cancellation and operators' requests come as commands (`expire`), not from here. The finished
    trigger needs at least one job: a namespace whose coordinator has not started yet is not
    finished. Its grace runs from the last job's end, so a job set that starts new pods after a
    lull keeps its namespace.
    """
    if record.state is not NamespaceState.ACTIVE:
        return None
    if not facts.queue_exists:
        return Trigger.QUEUE_DELETED, f"queue {record.queue} was deleted"
    if record.expires_at is not None and record.expires_at <= now:
        return Trigger.TTL, f"its TTL passed at {record.expires_at.isoformat()}"
    activity = facts.activity
    if activity.jobs and not activity.unfinished and activity.last_finished_at is not None:
        quiet_since = activity.last_finished_at
        if now - quiet_since >= facts.finished_grace:
            return Trigger.FINISHED, (
                f"job set {record.jobset} has had no unfinished pods since "
                f"{quiet_since.isoformat()} (grace {facts.finished_grace.total_seconds():g}s)")
    return None


def expire(record: NamespaceRecord, trigger: Trigger, *, cause: str,
           at: datetime) -> Change | None:
    """Start collecting an active record; None when collection started already (idempotent:
    a second trigger, or a redelivered command, changes nothing)."""
    if record.state is not NamespaceState.ACTIVE:
        return None
    change = move(record, NamespaceState.EXPIRING, cause=f"{trigger.value}: {cause}", at=at)
    return Change(replace(change.record, trigger=trigger, next_attempt_at=None),
                  change.transition)


# Collection steps -----------------------------------------------------------------------------

class Step(StrEnum):
    DELETE = "delete"  # ask the cluster to delete the namespace (again)
    CHECK = "check"  # ask the cluster whether the namespace is gone
    NONE = "none"


def next_step(record: NamespaceRecord) -> Step:
    if record.state in (NamespaceState.EXPIRING, NamespaceState.FAILED):
        return Step.DELETE
    if record.state is NamespaceState.DELETING:
        return Step.CHECK
    return Step.NONE


class DeleteAnswer(StrEnum):
    ACCEPTED = "accepted"  # the cluster took the request (or is deleting it already)
    GONE = "gone"  # 404: nothing to delete


class CheckAnswer(StrEnum):
    GONE = "gone"  # 404: the namespace is gone, finalizers included
    TERMINATING = "terminating"  # still there, with a deletionTimestamp: wait
    PRESENT = "present"  # still there and not being deleted (someone recreated it): delete again


def after_delete(record: NamespaceRecord, answer: DeleteAnswer, *, at: datetime,
                 check_after: timedelta) -> Change:
    """The record once the cluster answered a delete request: deleting, checked soon."""
    cause = ("the cluster accepted the deletion" if answer is DeleteAnswer.ACCEPTED
             else "the cluster has no such namespace")
    change = move(record, NamespaceState.DELETING, cause=cause, at=at)
    # A 404 is checked at once: only a check counts a namespace as deleted.
    when = at if answer is DeleteAnswer.GONE else at + check_after
    return Change(replace(change.record, next_attempt_at=when, failure_reason=""),
                  change.transition)


def after_check(record: NamespaceRecord, answer: CheckAnswer, *, at: datetime,
                check_after: timedelta) -> Change:
    """The record once the cluster said whether the namespace is gone."""
    if answer is CheckAnswer.GONE:
        change = move(record, NamespaceState.DELETED,
                      cause="the cluster reports the namespace gone", at=at)
        return Change(replace(change.record, deleted_at=at, next_attempt_at=None,
                              failure_reason=""), change.transition)
    if answer is CheckAnswer.TERMINATING:
        return Change(replace(record, next_attempt_at=at + check_after), None)
    # Present and not terminating: the next step deletes it again (a stale read, or a
    # namespace recreated under the same name, which is collected too: the record owns the name).
    change = move(record, NamespaceState.FAILED,
                  cause="the namespace exists and is not being deleted", at=at)
    return Change(replace(change.record, failure_reason="present after deletion",
                          next_attempt_at=at), change.transition)


def after_failure(record: NamespaceRecord, reason: str, *, at: datetime,
                  backoff: Backoff) -> Change:
    """A step that could not be carried out (cluster unreachable, refused): failed, retried
    after the backoff. The record is never dropped."""
    attempts = record.attempts + 1
    change = move(record, NamespaceState.FAILED,
                  cause=f"attempt {attempts} failed: {reason}", at=at)
    return Change(replace(change.record, failure_reason=reason, attempts=attempts,
                          next_attempt_at=at + backoff.after(attempts)), change.transition)
