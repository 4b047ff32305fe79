"""A job set's own maximum time queued, and which rule a waiting pod ends by: its queue's or its
job set's, the stricter.

Why it exists: issue 9 lets a queue *or a job set* bound how long a pod waits gated. The queue's
rule is in its definition (`QueueSpec.max_queued`); a job set says its own on its pods, with the
annotations below, written by whoever creates them or stamped by the admission webhook from the
pod's namespace (an ephemeral namespace made with `lockgate namespace create --max-queued-time`
carries them). The webhook refuses a value it cannot read, with a message that says what to
write; the watcher reads the value into `PodEvent.max_queued`, queue-store keeps it in
`jobs.max_queued`, and the scheduler leader ends a pod by whichever rule is stricter.

What ends it, and how:
- the earlier deadline wins (the queue's when both are equal: the operator's rule);
- a job set's deadline ends the pod as its `lockgate.io/on-max-queued` says, else as its queue's
  rule says, else `fail`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lockgate.durations import whole_seconds
from lockgate.labels import DOMAIN
from lockgate.queues import MaxQueued

MAX_QUEUED_TIME_ANNOTATION = f"{DOMAIN}/max-queued-time"
ON_MAX_QUEUED_ANNOTATION = f"{DOMAIN}/on-max-queued"
MAX_SECONDS = 366 * 86400  # as a queue's maximum
ACTIONS = ("fail", "delete")

Action = Literal["fail", "delete"]


class InvalidMaxQueuedError(ValueError):
    """An annotation lockgate cannot honour; the message says what to write instead."""


class JobSetMaxQueued(BaseModel):
    """How long a job set's pod may wait gated; `action` None: as its queue says (else fail)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seconds: float = Field(gt=0, le=MAX_SECONDS)
    action: Action | None = None


@dataclass(frozen=True, slots=True)
class Limit:
    """The rule a waiting pod ends by: `by` "queue" or "jobset"."""

    max_queued: MaxQueued
    by: Literal["queue", "jobset"]

    @property
    def seconds(self) -> float:
        return self.max_queued.seconds

    @property
    def action(self) -> Action:
        return self.max_queued.action


def _where(source: str) -> str:
    return "on the pod" if source == "pod" else f"on {source}"


def parse_annotations(annotations: Mapping[str, str], *, source: str = "pod"
                      ) -> tuple[int | None, Action | None]:
    """The time (seconds) and action `annotations` set, each None when absent; raises
    InvalidMaxQueuedError naming the annotation, where it is (`source`) and what to write."""
    seconds: int | None = None
    action: Action | None = None
    text = annotations.get(MAX_QUEUED_TIME_ANNOTATION)
    if text is not None:
        try:
            seconds = whole_seconds(text)
        except ValueError as error:
            raise InvalidMaxQueuedError(
                f"annotation {MAX_QUEUED_TIME_ANNOTATION}={text!r} {_where(source)} is not a "
                "duration: write it like 90s, 30m, 2h or 7d") from error
        if seconds > MAX_SECONDS:
            raise InvalidMaxQueuedError(
                f"annotation {MAX_QUEUED_TIME_ANNOTATION}={text!r} {_where(source)} is longer "
                f"than the most lockgate allows (366d)")
    spelled = annotations.get(ON_MAX_QUEUED_ANNOTATION)
    if spelled is not None:
        if spelled not in ACTIONS:
            raise InvalidMaxQueuedError(
                f"annotation {ON_MAX_QUEUED_ANNOTATION}={spelled!r} {_where(source)} is "
                "invalid: write delete or fail")
        action = "delete" if spelled == "delete" else "fail"
    return seconds, action


def jobset_max_queued(pod_annotations: Mapping[str, str],
                      namespace_annotations: Mapping[str, str] | None = None,
                      *, namespace: str = "") -> JobSetMaxQueued | None:
    """The job set's rule for a pod: the shorter time of the pod's and its namespace's, and the
    pod's action, else the namespace's. None when neither sets a time; raises
    InvalidMaxQueuedError (also for an action with no time to go with it)."""
    own_seconds, own_action = parse_annotations(pod_annotations)
    ns_seconds, ns_action = parse_annotations(namespace_annotations or {},
                                              source=f"namespace {namespace}".strip())
    times = [s for s in (own_seconds, ns_seconds) if s is not None]
    action = own_action or ns_action
    if not times:
        if action is not None:
            raise InvalidMaxQueuedError(
                f"annotation {ON_MAX_QUEUED_ANNOTATION}={action!r} says what to do after a "
                f"maximum time queued, but no {MAX_QUEUED_TIME_ANNOTATION} sets one: add it "
                "(e.g. 30m) or remove the action")
        return None
    return JobSetMaxQueued(seconds=min(times), action=action)


def stamped_annotations(limit: JobSetMaxQueued | None) -> dict[str, str]:
    """What the webhook writes on a pod so that it carries its job set's rule itself."""
    if limit is None:
        return {}
    stamped = {MAX_QUEUED_TIME_ANNOTATION: f"{int(limit.seconds)}s"}
    if limit.action is not None:
        stamped[ON_MAX_QUEUED_ANNOTATION] = limit.action
    return stamped


def read_from_pod(annotations: Mapping[str, str]) -> JobSetMaxQueued | None:
    """The rule a pod carries (as the webhook left it), None if none or unreadable (the webhook
    refuses unreadable values at admission; one changed later is ignored, not fatal)."""
    try:
        return jobset_max_queued(annotations)
    except InvalidMaxQueuedError:
        return None


def stricter(queue: MaxQueued | None, jobset: JobSetMaxQueued | None) -> Limit | None:
    """The rule that ends the pod first; the queue's on a tie."""
    if jobset is None:
        return None if queue is None else Limit(queue, "queue")
    if queue is not None and queue.seconds <= jobset.seconds:
        return Limit(queue, "queue")
    action: Action = jobset.action or (queue.action if queue is not None else "fail")
    return Limit(MaxQueued(seconds=jobset.seconds, action=action), "jobset")
