"""Job states and the rules for moving between them.

Why: events about one pod reach lockgate at least once and sometimes out of order (restarts,
snapshots, several producers). Every consumer folds them through `advance`, which only moves a
job forward, so duplicates and stale events are harmless. The single backward move, a release
that never took effect going back to its queue, is explicit and tied to the decision it undoes.

A cancelled job set's jobs are set to CANCELLED by queue-store when it takes the cancel command,
before their pods are deleted; being terminal, the pod events that follow (deleted) leave them
cancelled.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "queued"  # gated, waiting for the fair scheduler
    RELEASED = "released"  # the scheduler decided; the gate is being removed
    UNGATED = "ungated"  # lockgate's gate is gone; kube-scheduler may bind it
    BOUND = "bound"  # bound to a node
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DELETED = "deleted"  # deleted before finishing
    CANCELLED = "cancelled"  # its job set was cancelled (the reason is in last_reason)

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def holds_capacity(self) -> bool:
        """Whether a job in this state occupies (or is about to occupy) room in its cluster."""
        return self in CAPACITY_HOLDING_STATES

    @property
    def of_the_pod(self) -> str:
        """What the state says of its pod, in words: "the pod succeeded", "the pod is running"."""
        return f"the pod {_OF_THE_POD[self]}"


_RANK: dict[JobState, int] = {
    JobState.QUEUED: 0,
    JobState.RELEASED: 1,
    JobState.UNGATED: 2,
    JobState.BOUND: 3,
    JobState.RUNNING: 4,
    JobState.SUCCEEDED: 5,
    JobState.FAILED: 5,
    JobState.DELETED: 5,
    JobState.CANCELLED: 5,
}
_OF_THE_POD: dict[JobState, str] = {
    JobState.QUEUED: "is queued",
    JobState.RELEASED: "was released and is being ungated",
    JobState.UNGATED: "was ungated and waits for kube-scheduler",
    JobState.BOUND: "is bound to a node",
    JobState.RUNNING: "is running",
    JobState.SUCCEEDED: "succeeded",
    JobState.FAILED: "failed",
    JobState.DELETED: "was deleted",
    JobState.CANCELLED: "was cancelled",
}
TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.DELETED,
                             JobState.CANCELLED})
CAPACITY_HOLDING_STATES = frozenset(
    {JobState.RELEASED, JobState.UNGATED, JobState.BOUND, JobState.RUNNING}
)


def advance(current: JobState | None, observed: JobState) -> JobState:
    """The state after observing `observed`: never backwards, terminal states are final."""
    if current is None:
        return observed
    if current.is_terminal:
        return current
    return observed if observed.rank > current.rank else current


def can_return_to_queue(current: JobState) -> bool:
    """A released job whose gate was never removed may go back to its queue."""
    return current is JobState.RELEASED


# ---- identity -------------------------------------------------------------------------------
# A job is a pod, named by the cluster it was created in and its uid (a pod's name may be reused
# after it is deleted; its uid never is). The job id "<cluster>/<uid>" is the one string form,
# made and read only here: cluster names never contain "/".


@dataclass(frozen=True, slots=True)
class JobKey:
    """Who a job is: the pod `name` in `namespace` of `cluster`, with its `uid`.

    Made once, where a job's row is read, and carried (the scheduler's feed and state keep it,
    so the leader never asks Postgres for a name again). Two keys of one job are equal: a
    pod's namespace and name never change. Use `of` to make one: it interns the cluster and
    namespace, which a million jobs share.
    """

    cluster: str
    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, *, cluster: str, namespace: str, name: str, uid: str) -> JobKey:
        return cls(sys.intern(cluster), sys.intern(namespace), name, uid)

    @classmethod
    def from_id(cls, value: str, *, namespace: str, name: str) -> JobKey:
        """The key of the job `value` (a job id) whose pod is `namespace`/`name`."""
        cluster, uid = split_job_id(value)
        return cls.of(cluster=cluster, namespace=namespace, name=name, uid=uid)

    @property
    def job_id(self) -> str:
        return job_id(self.cluster, self.uid)

    @property
    def pod(self) -> str:
        """"<namespace>/<name>", as kubectl and the logs write a pod."""
        return f"{self.namespace}/{self.name}"


def job_id(cluster: str, uid: str) -> str:
    """The id of the job of pod `uid` in `cluster`."""
    return f"{cluster}/{uid}"


def split_job_id(value: str) -> tuple[str, str]:
    """(cluster, uid) of a job id; ValueError if it is not one."""
    cluster, sep, uid = value.partition("/")
    if not sep or not cluster or not uid:
        raise ValueError(f"not a job id (<cluster>/<uid>): {value!r}")
    return cluster, uid
