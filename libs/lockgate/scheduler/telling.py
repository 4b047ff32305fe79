"""What the leader tells pods, and which pods it gives up on or removes, decided without I/O.

Why it exists: who times out, who is given up on and the words a pod's owner reads are the
scheduler's decisions, not the leader's. The leader (services/fair_scheduler/leading.py) reads
what it needs (the kept places), calls these functions, records and publishes what they return,
and nothing else; tests/unit/test_telling.py tests them without Kafka or Postgres:

- `queue_unknown_notices`: pods queued for a queue nobody defined (lockgate.noticing);
- `unplaceable_give_ups`: released pods kube-scheduler kept reporting Unschedulable
  (lockgate.unplaceable), with the notice each gets and the reason recorded for it;
- `waiting_notices`: why queued pods wait (lockgate.scheduler.explain), and the pods that
  waited past their maximum time queued, which leave the feed here (`Feed.expire`);
- `timed_out_groups`: the queued members of pod groups that did not fill up in time;
- `removal_notice`: the notice that has the ungater remove a pod (preempted or timed out).

`keys` says who a job is (`Feed.key_of`: the feed keeps every job's pod name, read with its
row); a job it does not know is told nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from lockgate.events import PodNotice
from lockgate.groups import GroupTimeoutAction
from lockgate.jobs import JobKey
from lockgate.max_queued import Limit
from lockgate.noticing import NoticeReason, queue_unknown_message
from lockgate.places import kept_place_note
from lockgate.scheduler.explain import (
    EVENT_REASONS,
    MAX_QUEUED_EVENT_REASON,
    QUEUED_EVENT_REASON,
    Explainer,
    Explanation,
    format_duration,
)
from lockgate.scheduler.feed import Feed
from lockgate.scheduler.groups import timed_out, timeout_message
from lockgate.scheduler.state import SchedJob, SchedulerState
from lockgate.unplaceable import event_message, last_reason


class _Estimate(Protocol):
    def text(self) -> str: ...


class WaitEstimates(Protocol):
    """How long a pod may still wait (`lockgate.wait_estimates.ReleaseRates`, which imports
    the scheduler: named by its shape here, so the two packages do not import each other)."""

    def estimate_for(self, explanation: Explanation, *, now: float) -> _Estimate: ...

Keys = Callable[[str], JobKey | None]  # who a job is, by its id (None: not known)

# What each kind of removal (eviction_store's `kind`) is told as.
REMOVAL_REASONS: dict[str, NoticeReason] = {"preempted": NoticeReason.PREEMPTED,
                                            "group_timeout": NoticeReason.GROUP_TIMED_OUT}


def queue_unknown_notices(due: Sequence[tuple[str, str]], *, keys: Keys, at: datetime
                          ) -> tuple[list[PodNotice], list[str]]:
    """The notices for pods (job id, queue) whose queue nobody defined, and the job ids that
    are not known any more (to forget)."""
    notices: list[PodNotice] = []
    gone: list[str] = []
    for job_id, queue in due:
        key = keys(job_id)
        if key is None:
            gone.append(job_id)
            continue
        notices.append(PodNotice(
            cluster=key.cluster, namespace=key.namespace, name=key.name, uid=key.uid, queue=queue,
            reason=NoticeReason.QUEUE_UNKNOWN.value, message=queue_unknown_message(queue),
            at=at))
    return notices, gone


@dataclass(frozen=True, slots=True)
class GiveUp:
    """A released pod the leader gives up on: what `jobs.last_reason` records, and what the
    pod is told (None: its pod is not known), deleting it when a controller owns it."""

    job: SchedJob
    reason: str
    notice: PodNotice | None

    @property
    def deleting(self) -> bool:
        return self.notice is not None and self.notice.delete_pod


def unplaceable_give_ups(due: Sequence[SchedJob], *, now: float, at: datetime,
                         delete_controlled: bool) -> list[GiveUp]:
    """One `GiveUp` for each job due (`Feed.unplaceable_due`, rows that name their pod), in
    order."""
    give_ups = []
    for job in due:
        notice = None
        if job.name:
            key = job.key
            deleting = job.controlled and delete_controlled
            notice = PodNotice(
                cluster=key.cluster, namespace=key.namespace, name=key.name, uid=key.uid,
                queue=job.queue,
                reason=NoticeReason.UNPLACEABLE.value,
                message=event_message(job, now, deleting=deleting), at=at, delete_pod=deleting)
        give_ups.append(GiveUp(job=job, reason=last_reason(job, now), notice=notice))
    return give_ups


@dataclass(frozen=True, slots=True)
class WaitingNotices:
    """What `waiting_notices` decided: the notices of pods told why they wait (`told`, their
    job ids, to mark told once published) and of pods past their maximum time queued."""

    told: list[str]
    waiting: list[PodNotice]
    expiries: list[PodNotice]


def waiting_notices(feed: Feed, *, due: Sequence[tuple[str, bool]],
                    expired: Sequence[tuple[str, Limit]], kept: Mapping[str, str],
                    places: Mapping[str, tuple[int, int]], rates: WaitEstimates,
                    explainer: Explainer, at: datetime) -> WaitingNotices:
    """Tell the pods `due` (job id, whether first: `WaitingPods.due`) why they wait, and the
    pods `expired` (`Feed.expired_due`) that lockgate fails or deletes them; each expired pod
    leaves the feed here (no round may release it while the ungater acts). `kept`: the deleted
    pod whose place a job kept (lockgate.places), by job id. `places`: each pod's (place, of
    how many) in its queue's line, as Postgres's index of the line says (the place `explain`
    gives); a pod due without one is no longer queued there (released or gone since), so it is
    not told now. Pods due that can no longer be explained are forgotten by the feed's waiting
    list.

    Why the places come from the caller: working them out here was a pass over every job the
    leader holds (a million at fleet scale, 1.5 s of its loop each time pods were told), and
    the place in line Postgres keeps is the one `explain` and the web UI show."""
    now = at.timestamp()
    told: list[str] = []
    waiting: list[PodNotice] = []
    for job_id, first in due:
        place = places.get(job_id)
        if place is None:
            continue  # not queued in Postgres any more: the feed hears of it next
        key = feed.key_of(job_id)
        explanation = explainer.explain(job_id, place)
        if key is None or explanation is None or explanation.reason is None:
            feed.waiting.forget(job_id)
            continue
        reason, warning = EVENT_REASONS[explanation.reason]
        waiting.append(PodNotice(
            cluster=key.cluster, namespace=key.namespace, name=key.name, uid=key.uid,
            queue=explanation.queue, reason=QUEUED_EVENT_REASON if first else reason,
            message=("queued: " if first else "still waiting: ")
            + (kept_place_note(deleted_pod=kept[job_id],
                               waited=format_duration(explanation.waited_seconds))
               if first and job_id in kept else "")
            + explanation.message + "; "
            + rates.estimate_for(explanation, now=now).text(),
            at=at, event_type="Warning" if warning else "Normal",
            series="" if first else str(int(now))))
        told.append(job_id)
    expiries: list[PodNotice] = []
    for job_id, limit in expired:
        key = feed.key_of(job_id)
        if key is None:
            continue
        place = places.get(job_id)
        # Without a place, no explanation: finding the place here is a pass over every job.
        explanation = None if place is None else explainer.explain(job_id, place)
        job = feed.expire(job_id)
        if job is None:
            continue
        expiries.append(PodNotice(
            cluster=key.cluster, namespace=key.namespace, name=key.name, uid=key.uid,
            queue=job.queue,
            reason=MAX_QUEUED_EVENT_REASON, event_type="Warning", action=limit.action, at=at,
            message=expiry_message(job, limit, now=now,
                                   waiting=None if explanation is None
                                   else explanation.message)))
    return WaitingNotices(told=told, waiting=waiting, expiries=expiries)


def expiry_message(job: SchedJob, limit: Limit, *, now: float, waiting: str | None) -> str:
    """What a pod past its maximum time queued is told; `waiting`: why it was waiting."""
    waited = format_duration(now - job.created_at)
    why = "" if waiting is None else f"; it was waiting: {waiting}"
    done = "failed" if limit.action == "fail" else "deleted"
    whose = f'queue "{job.queue}"' if limit.by == "queue" else "its job set"
    return (f"lockgate {done} this pod: it waited {waited} queued, longer than "
            f"{whose} allows ({format_duration(limit.seconds)}){why}")


@dataclass(frozen=True, slots=True)
class GroupRemoval:
    """A queued member of a pod group that timed out, and what its queue does to it."""

    job_id: str
    action: GroupTimeoutAction
    message: str


def timed_out_groups(state: SchedulerState, *, now: float, removing: Collection[str]
                     ) -> list[GroupRemoval]:
    """The queued members (not being removed already) of every pod group whose queue's group
    timeout passed before it filled up (`lockgate.scheduler.groups.timed_out`)."""
    timeouts: dict[str, float | None] = {}
    actions: dict[str, GroupTimeoutAction] = {}
    for name in state.queue_names():
        spec = state.queue_spec(name)
        if spec is not None:
            timeouts[name] = spec.group_timeout_seconds
            actions[name] = spec.group_timeout_action
    removals: list[GroupRemoval] = []
    groups = state.groups()
    for status in timed_out(groups, now=now, timeout_of=timeouts):
        queue = status.key[1]
        timeout = timeouts[queue]
        assert timeout is not None
        message = timeout_message(status, timeout=timeout, action=actions[queue])
        removals.extend(GroupRemoval(job_id=job_id, action=actions[queue], message=message)
                        for job_id in groups.queued_members(status.key)
                        if job_id not in removing)
    return removals


def removal_notice(*, cluster: str, namespace: str, name: str, uid: str, queue: str, kind: str,
                   action: str, message: str, at: datetime) -> PodNotice:
    """The notice that has the ungater remove a pod (`kind`: "preempted" or "group_timeout";
    `action`: "delete", or "fail" to mark it Failed)."""
    removal: Literal["delete", "fail"] = "delete" if action == "delete" else "fail"
    return PodNotice(cluster=cluster, namespace=namespace, name=name, uid=uid, queue=queue,
                     reason=REMOVAL_REASONS[kind].value, message=message, at=at, action=removal)
