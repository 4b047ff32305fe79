"""Holds of freed room for a queue below its fair target: no starvation by size.

Why it exists: when a queue below its fair target in a cluster has a pod that does not fit, and
another queue streams smaller pods there, every gap that a finishing pod leaves is smaller than
the big pod and goes to the small ones, for ever. So the round *holds* room for the big pod on
one node it may land on: from then on, the room that frees on that node is kept for it (other
pods may use only what is left there beyond what the holds on that node need), until the pod
fits there and is released. A queue holds only as much as keeps it within its fair target in
that cluster, so holds never serve a queue past its share.

A hold is bounded in time: after `seconds` it ends, and the node is remembered as tried for that
pod, so a node whose pods never finish does not keep room idle for it for ever; the next hold
for the pod goes to another node it may use (and when every one was tried, they all may be
tried again).

Held here, in the scheduler's state, across rounds; the round (`lockgate.fairness`) makes and
honours them, explain shows them. Pure: times are passed in.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RoomHold:
    """Room on `node` of `cluster` kept for queued pod `job_id` of `queue` until `until`."""

    job_id: str
    queue: str
    cluster: str
    node: str
    since: float  # epoch seconds
    until: float
    seq: int  # creation order: on one node, earlier holds are served first


class RoomHolds:
    """Every hold, by pod; O(1) per change, O(holds in a cluster) to list them."""

    __slots__ = ("_by_job", "_seq", "_tried")

    def __init__(self) -> None:
        self._by_job: dict[str, RoomHold] = {}
        self._tried: dict[str, set[str]] = {}
        self._seq = 0

    def hold(self, *, job_id: str, queue: str, cluster: str, node: str, now: float,
             seconds: float) -> RoomHold:
        self._seq += 1
        hold = self._by_job[job_id] = RoomHold(job_id, queue, cluster, node, now, now + seconds,
                                               self._seq)
        return hold

    def of(self, job_id: str) -> RoomHold | None:
        return self._by_job.get(job_id)

    def in_cluster(self, cluster: str) -> list[RoomHold]:
        """The cluster's holds, oldest first."""
        return sorted((h for h in self._by_job.values() if h.cluster == cluster),
                      key=lambda h: h.seq)

    def clusters(self) -> set[str]:
        return {h.cluster for h in self._by_job.values()}

    def end(self, job_id: str, *, expired: bool = False) -> None:
        """The pod was released, left, or no longer needs the room; `expired`: its time ran
        out, so the node is not held for it again until every other was tried."""
        hold = self._by_job.pop(job_id, None)
        if hold is not None and expired:
            self._tried.setdefault(job_id, set()).add(hold.node)
        elif not expired:
            self._tried.pop(job_id, None)

    def tried(self, job_id: str) -> set[str]:
        return self._tried.get(job_id, set())

    def forget_tried(self, job_id: str) -> None:
        self._tried.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._by_job)

    def __iter__(self) -> Iterator[RoomHold]:
        return iter(list(self._by_job.values()))
