"""Released pods that kube-scheduler cannot place: when lockgate gives up on them, and what it says.

Why this exists: lockgate releases a pod where its model of the cluster says it fits. The model
can be wrong (a node tainted right after the decision, a filter lockgate does not model such as
inter-pod affinity, an unmanaged pod that took the room). kube-scheduler then reports the pod
PodScheduled=False, reason Unschedulable, and the pod would hold its queue's share and its
cluster's room in the model for good. A gate cannot be put back, so after
`unplaceable_after_seconds` of Unschedulable the leader gives up on it:

- it is no longer charged: not to its queue's allocation, not to its cluster's room (so it can
  neither hold the queue below its share nor make its cluster look over-committed);
- `jobs.last_reason` says why (`lockgate explain` shows it) and a Warning Event
  `LockgateUnplaceable` on the pod says it too;
- a pod with a controller (ReplicaSet, Job, StatefulSet...) is deleted, so its controller
  creates a replacement that is gated and queued again, and placed by what lockgate knows now
  (after a back-off of its controller's, so a model wrong for good does not churn:
  `lockgate.backoff`); a bare pod is left alone (deleting it would lose it), still reported.

If kube-scheduler binds it after all, it is charged again from then on (bound pods always are).

Pure: the leader feeds it every job row and asks, after each round, which are due.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from lockgate.jobs import JobState

if TYPE_CHECKING:  # (at run time lockgate.scheduler.feed imports this module)
    from lockgate.scheduler.state import SchedJob

_UNBOUND_RELEASED = frozenset({JobState.RELEASED, JobState.UNGATED})

REASON = "LockgateUnplaceable"


def is_given_up(job: SchedJob) -> bool:
    """Whether the leader gave up on the job and it is still unbound: it must not be charged."""
    return job.unplaceable and job.state in _UNBOUND_RELEASED


class UnplaceableWatch:
    """Released, unbound jobs that kube-scheduler reports Unschedulable, by when they are due."""

    def __init__(self, after_seconds: float) -> None:
        if after_seconds <= 0:
            raise ValueError("after_seconds must be positive")
        self.after_seconds = after_seconds
        self._stuck: dict[str, SchedJob] = {}

    def observe(self, job: SchedJob) -> None:
        """Take a job's current row: tracked while released, unbound, Unschedulable and not
        given up on yet; forgotten otherwise."""
        if (job.state in _UNBOUND_RELEASED and job.unschedulable_since is not None
                and not job.unplaceable):
            self._stuck[job.job_id] = job
        else:
            self._stuck.pop(job.job_id, None)

    def forget(self, job_id: str) -> None:
        self._stuck.pop(job_id, None)

    def due(self, now: float, limit: int) -> list[SchedJob]:
        """Up to `limit` jobs Unschedulable for at least `after_seconds` at `now` (epoch s)."""
        cutoff = now - self.after_seconds
        due = [job for job in self._stuck.values()
               if job.unschedulable_since is not None and job.unschedulable_since <= cutoff]
        due.sort(key=lambda job: (job.unschedulable_since or 0.0, job.job_id))
        return due[:limit]

    def next_due(self) -> float:
        """When (epoch s) the next tracked job becomes due; infinity when none is tracked."""
        return min((job.unschedulable_since + self.after_seconds
                    for job in self._stuck.values() if job.unschedulable_since is not None),
                   default=math.inf)

    def __len__(self) -> int:
        return len(self._stuck)


def last_reason(job: SchedJob, now: float) -> str:
    """What `jobs.last_reason` (and so `lockgate explain`) says of a job given up on."""
    waited = now - (job.unschedulable_since or now)
    said = f": {job.unschedulable_message}" if job.unschedulable_message else ""
    return (f"unplaceable: released, but kube-scheduler reported it Unschedulable for "
            f"{waited:.0f}s{said}")


def event_message(job: SchedJob, now: float, *, deleting: bool) -> str:
    """The Warning Event's message: what happened, and what happens to the pod."""
    then = ("lockgate deletes this pod so that its controller creates a replacement, which is "
            "queued again" if deleting else
            "lockgate no longer counts it against its queue; it has no controller, so it is "
            "left alone: delete it, or change what keeps it off every node")
    return f"{last_reason(job, now)}. {then}."
