"""What the state keeps per job, small and shared: interned request shapes, job kinds, records.

Why a module of its own: the state's parts (`pending`, the pending heaps; `room_caches`, the
clusters' nodes and the room rounds copy; `target_inputs`, the fair targets' inputs) and the
round all speak of jobs in these terms, and none of them may import the state that holds them
(pyproject.toml's layers). A million queued jobs typically share a handful of request shapes and
a few thousand kinds, so a job's record is only its heap entry and an interned `JobKind`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from lockgate.backoff import ControllerKey
from lockgate.jobs import JobState
from lockgate.max_queued import JobSetMaxQueued
from lockgate.placement import PodPlacement
from lockgate.resources import Resources

# A pending job's place in its queue's heap: higher priority first, then older, then by id.
HeapEntry = tuple[int, float, str]


class Shape:
    """An interned request vector: shared by every job that asks for exactly the same."""

    __slots__ = ("key", "pairs", "placement", "placement_id", "refs", "requests")

    def __init__(
        self,
        key: tuple[frozenset[tuple[str, int]], PodPlacement | None],
        requests: Resources,
        pairs: tuple[tuple[int, int], ...],
        placement: PodPlacement | None,
        placement_id: int,
    ) -> None:
        self.key = key
        self.requests = requests
        self.pairs = pairs
        self.placement = placement
        # The state's number for its placement (equal placements, one number): the fair
        # targets' bookkeeping keys by it, so a placement is hashed once per shape, not per job.
        self.placement_id = placement_id
        self.refs = 0


@functools.lru_cache(maxsize=4096)
def placement_key(placement: PodPlacement | None) -> str:
    """A placement's repr, made once: the fair targets sort and compare by it every round, and
    a pydantic model's repr took a quarter of the leader's CPU on the release benchmark."""
    return repr(placement)



class JobKind(NamedTuple):
    """Everything about a job but its place in line, shared by every job alike: a million queued
    jobs are typically a few thousand kinds (queue x cluster x request shape), so keeping these
    fields once per kind instead of once per job is most of a record's memory (issue 19).
    A tuple, so that it is its own key in the state's table of kinds.

    Parked: queued, but too big for every node of its cluster; kept out of the heap until the
    cluster gains a node of a new size. Held: queued while its controller backs off; out of the
    heap and of its queue's demand (never parked meanwhile) until the back-off ends.
    """

    queue: str
    cluster: str
    shape: Shape
    state: JobState
    node_name: str | None
    parked: bool
    held: bool
    group: str | None
    group_size: int
    group_max_size: int
    preemptible: bool
    priority_class: str
    max_queued: JobSetMaxQueued | None
    controller: ControllerKey | None


class JobRecord:
    """The state's record of one job; `job_id` is its key in the state's table of jobs.

    Three references only (a record is one of a million): its heap entry, which is its
    priority, its time in line and its id; its interned `JobKind`, which is everything else
    shared; and its pod, "<namespace>/<name>" in one string ("" if not known), which no other
    job shares. The attributes below read through them; only `SchedulerState` changes a record.
    """

    __slots__ = ("entry", "kind", "pod")

    def __init__(self, entry: HeapEntry, kind: JobKind, pod: str = "") -> None:
        self.entry = entry
        self.kind = kind
        self.pod = pod

    @property
    def priority(self) -> int:
        return -self.entry[0]

    @property
    def created_at(self) -> float:
        return self.entry[1]

    @property
    def queue(self) -> str:
        return self.kind.queue

    @property
    def cluster(self) -> str:
        return self.kind.cluster

    @property
    def shape(self) -> Shape:
        return self.kind.shape

    @property
    def state(self) -> JobState:
        return self.kind.state

    @property
    def node_name(self) -> str | None:
        return self.kind.node_name

    @property
    def parked(self) -> bool:
        return self.kind.parked

    @property
    def held(self) -> bool:
        return self.kind.held

    @property
    def group(self) -> str | None:
        return self.kind.group

    @property
    def group_size(self) -> int:
        return self.kind.group_size

    @property
    def group_max_size(self) -> int:
        return self.kind.group_max_size

    @property
    def preemptible(self) -> bool:
        return self.kind.preemptible

    @property
    def priority_class(self) -> str:
        return self.kind.priority_class

    @property
    def max_queued(self) -> JobSetMaxQueued | None:
        return self.kind.max_queued

    @property
    def controller(self) -> ControllerKey | None:
        return self.kind.controller



def add_pairs(vector: list[int], pairs: tuple[tuple[int, int], ...]) -> None:
    for axis, amount in pairs:
        vector[axis] += amount


def subtract_pairs(vector: list[int], pairs: tuple[tuple[int, int], ...]) -> None:
    for axis, amount in pairs:
        vector[axis] -= amount

