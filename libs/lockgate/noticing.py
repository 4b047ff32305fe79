"""Telling a pod's owner, on the pod itself, why lockgate keeps it gated.

Why this exists: the admission webhook checks a pod's queue against a copy of the queue
definitions, and that copy may be stale, so a pod can be admitted (and gated) for a queue that
turns out not to exist. Such a pod stays gated and queued, which is right, but its owner only sees
a gate. The fair-scheduler leader knows each round which queued jobs name an undefined queue; it
picks them here, a bounded number per round and each once per leadership term, and publishes a
`PodNotice`; the ungater turns the notice into a Kubernetes Event on the pod, so
`kubectl describe pod` says why.

Everything here is pure: which jobs are due a notice, what the notice says, and the Event
written for it, with its deterministic name (which makes writing it idempotent).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from lockgate.events import PodNotice, ReleaseCommand
from lockgate.jobs import JobState
from lockgate.labels import MANAGED_NAMESPACE_LABEL, QUEUE_LABEL

if TYPE_CHECKING:  # (at run time lockgate.scheduler.feed imports this module)
    from lockgate.scheduler.state import SchedJob

# A Kubernetes object name (DNS subdomain) is at most this long.
_MAX_NAME = 253
# Who wrote the Event, as `kubectl describe pod` shows it ("From").
EVENT_SOURCE = "lockgate-ungater"


class NoticeReason(StrEnum):
    """Why a pod stays gated: the Event's `reason` (CamelCase, as Kubernetes reasons are).

    Open: `lockgate.scheduler.explain` adds the reasons of pods that wait their turn, and an ungater
    writes a reason it does not know as it is.
    """

    QUEUE_UNKNOWN = "LockgateQueueUnknown"
    # A released pod kube-scheduler kept reporting Unschedulable (lockgate.unplaceable).
    UNPLACEABLE = "LockgateUnplaceable"
    # The pod is removed (PodNotice.action): evicted to fair share, or its group timed out.
    PREEMPTED = "LockgatePreempted"
    GROUP_TIMED_OUT = "LockgateGroupTimedOut"
    # A pod of a queue that lockgate never gated (sent by cluster-watcher, which noticed it).
    SKIPPED_GATE = "LockgateSkippedGate"
    # Written by the ungater as it ungates a pod released for growth (ReleaseCommand.growth): a
    # Normal Event saying which NodePool lockgate expects to grow for it.
    RELEASED_FOR_GROWTH = "LockgateReleasedForGrowth"
    # Written by the ungater when the apiserver refused the node affinity a release asked for
    # (ReleaseCommand.node_requirements): a Warning Event; the pod was released without it.
    NOT_NARROWED = "LockgateNodeAffinityNotNarrowed"


# Notices about pods lockgate already released: written whether or not the pod is still gated.
ABOUT_RELEASED_PODS = frozenset({NoticeReason.UNPLACEABLE.value, NoticeReason.PREEMPTED.value,
                                 NoticeReason.GROUP_TIMED_OUT.value,
                                 NoticeReason.SKIPPED_GATE.value})



_SLUGS: dict[str, str] = {NoticeReason.QUEUE_UNKNOWN: "queue-unknown",
                          NoticeReason.UNPLACEABLE: "unplaceable",
                          NoticeReason.PREEMPTED: "preempted",
                          NoticeReason.GROUP_TIMED_OUT: "group-timed-out",
                          NoticeReason.SKIPPED_GATE: "skipped-gate",
                          NoticeReason.RELEASED_FOR_GROWTH: "released-for-growth"}


def reason_slug(reason: str) -> str:
    """A reason as part of an object name: lower-case and DNS-safe, also for a reason a newer
    scheduler sent that this code does not know."""
    known = _SLUGS.get(reason)
    if known is not None:
        return known
    return "".join(c for c in reason.lower() if c.isalnum())[:40] or "notice"


def queue_unknown_message(queue: str) -> str:
    """What a pod whose queue does not exist is told, and what its owner can do."""
    return (f'lockgate queue "{queue}" does not exist (it was deleted, or never created): '
            "this pod stays gated until the queue exists again or the pod is deleted; "
            f"see `lockgate jobs list --queue {queue}`")


def skipped_gate_message(*, queue: str, namespace: str,
                         served_labels: Mapping[str, str] | None = None) -> str:
    """What a pod that carries a queue's label but that lockgate never gated is told (and what
    `lockgate explain` says of it), and why that happens.

    `served_labels`: the labels this installation's webhook requires of a namespace besides
    `lockgate.io/managed=true`, when the namespace lacks some of them (None: unknown, or the
    namespace has them all, so the webhook was bypassed some other way).
    """
    head = (f'lockgate never gated this pod: it carries {QUEUE_LABEL}={queue} but ran without '
            f"waiting its turn in queue {queue}; lockgate counts it as the queue's usage. ")
    if served_labels:
        wanted = ", ".join(f"{key}={value}" for key, value in sorted(served_labels.items()))
        return head + (f"lockgate's webhook does not serve namespace {namespace}: it serves "
                       f"only namespaces labelled {MANAGED_NAMESPACE_LABEL}=true, {wanted}. "
                       f"Label the namespace ({wanted}) so its next pods wait their turn")
    return head + (f"Why: lockgate's webhook did not serve namespace {namespace} when the pod "
                   f"was created. It serves only namespaces labelled "
                   f"{MANAGED_NAMESPACE_LABEL}=true and the installation's own labels (under "
                   "`make run`: lockgate.io/run=dev; see the namespaceSelector of its "
                   "MutatingWebhookConfiguration), or it was down and let the pod through "
                   "(failurePolicy Ignore), or the pod was bound to a node when created")


def event_name(*, pod_name: str, reason: str, uid: str, series: str = "") -> str:
    """The Event's name: one per (pod uid, reason, series), so writing it twice writes it once.

    The pod's name is shortened if needed to keep the whole a valid DNS subdomain; the uid's
    prefix tells apart pods that reused a name; `series` tells apart repeated notices.
    """
    tail = "-" + "".join(c for c in series.lower() if c.isalnum())[:20] if series else ""
    suffix = f".lockgate-{reason_slug(reason)}-{uid[:8].lower()}{tail}"
    prefix = pod_name[: _MAX_NAME - len(suffix)].rstrip(".-")
    return prefix + suffix


def growth_release_notice(command: ReleaseCommand, *, at: datetime) -> PodNotice | None:
    """What the pod of a release for growth is told as its gate goes (None: the release was
    not for growth). One Event per release (its decision is the series), so a pod released for
    growth again after an eviction is told again, and a redelivered command writes it once."""
    if not command.growth:
        return None
    return PodNotice(cluster=command.cluster, namespace=command.namespace, name=command.name,
                     uid=command.uid, queue=command.queue,
                     reason=NoticeReason.RELEASED_FOR_GROWTH.value, message=command.growth,
                     at=at, event_type="Normal", series=command.decision_id)


def not_narrowed_notice(command: ReleaseCommand, *, refused: str, at: datetime) -> PodNotice:
    """What a pod is told when the node affinity its release asked for was refused: it was
    released as it came (so Karpenter may make a smaller node for it than lockgate counted)."""
    asked = "; ".join(f"{r.key} {r.operator} [{', '.join(r.values)}]"
                      for r in command.node_requirements)
    return PodNotice(cluster=command.cluster, namespace=command.namespace, name=command.name,
                     uid=command.uid, queue=command.queue,
                     reason=NoticeReason.NOT_NARROWED.value,
                     message=f"released without the node affinity {asked}: the apiserver "
                             f"refused it ({refused})"[:1000],
                     at=at, event_type="Warning", series=command.decision_id)


def event_for(notice: PodNotice) -> dict[str, Any]:
    """The core/v1 Event that tells the notice's pod, named once per (uid, reason, series).

    Old-style (core/v1 `source`, first/last timestamps, count), which every apiserver takes and
    `kubectl describe pod` lists.
    """
    at = notice.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # RFC 3339, as Kubernetes
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": event_name(pod_name=notice.name, reason=notice.reason, uid=notice.uid,
                               series=notice.series),
            "namespace": notice.namespace,
            "labels": {"app.kubernetes.io/managed-by": "lockgate"},
            # Owned by its pod: Kubernetes' garbage collector deletes it with the pod, rather
            # than only at the apiserver's event TTL.
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": notice.name,
                                 "uid": notice.uid}],
        },
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": notice.namespace,
                           "name": notice.name, "uid": notice.uid},
        "type": notice.event_type,
        "reason": notice.reason,
        "message": notice.message,
        "source": {"component": EVENT_SOURCE},
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    }


class UndefinedQueueNotices:
    """Which queued jobs name an undefined queue and have not been noticed this term.

    Fed every job row the leader applies (`observe`); asked after each round (`due`) for at most
    `limit` jobs whose queue is undefined right now; told which were published (`noticed`).
    A job is forgotten when it stops being queued, so one that is queued again (e.g. after its
    queue came back and went again) may be noticed again; so may every job after a new leader
    takes over. Both are fine: the Event's name makes the ungater's write idempotent.
    """

    def __init__(self) -> None:
        self._queue_of: dict[str, str] = {}  # every queued job seen -> its queue
        # queue -> its queued jobs not noticed yet, oldest seen first; noticed ones leave it, so
        # `due` never walks past them again.
        self._waiting: dict[str, dict[str, None]] = {}

    def observe(self, job: SchedJob) -> None:
        """Record a job's current row: queued jobs are candidates, others are forgotten."""
        old = self._queue_of.get(job.job_id)
        if job.state is not JobState.QUEUED:
            self.forget(job.job_id)
        elif old != job.queue:
            self.forget(job.job_id)  # a notice for another queue no longer applies
            self._queue_of[job.job_id] = job.queue
            self._waiting.setdefault(job.queue, {})[job.job_id] = None

    def forget(self, job_id: str) -> None:
        queue = self._queue_of.pop(job_id, None)
        if queue is not None:
            self._unwait(job_id, queue)

    def due(self, *, is_undefined: Callable[[str], bool], limit: int) -> list[tuple[str, str]]:
        """Up to `limit` (job id, queue) of queued jobs whose queue is undefined right now and
        that were not noticed yet; costs the queues with waiting jobs plus the jobs returned."""
        picked: list[tuple[str, str]] = []
        for queue, jobs in self._waiting.items():
            if len(picked) >= limit:
                break
            if not is_undefined(queue):
                continue
            for job_id in jobs:
                picked.append((job_id, queue))
                if len(picked) >= limit:
                    break
        return picked

    def noticed(self, job_ids: list[str]) -> None:
        """These jobs' notices were published: do not notice them again while they stay
        queued in the same queue."""
        for job_id in job_ids:
            queue = self._queue_of.get(job_id)
            if queue is not None:
                self._unwait(job_id, queue)

    def __len__(self) -> int:
        return len(self._queue_of)

    def _unwait(self, job_id: str, queue: str) -> None:
        jobs = self._waiting.get(queue)
        if jobs is None:
            return
        jobs.pop(job_id, None)
        if not jobs:
            del self._waiting[queue]
