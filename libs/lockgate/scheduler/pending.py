"""A queue's pending jobs in one cluster: a heap in release order, changed only through its methods.

Why a module of its own: the state pushes a job's entry when it queues, the round pops entries as
it looks at jobs and pushes back those it passed over, and both once dropped stale entries by
hand on the list itself. Here the heap is private (`_heap`); readers (explain, preemption, the
invariants) get it read-only (`entries`, `smallest`), and every change keeps heap order.

Deletion is lazy: a job that changes leaves its old entry behind, and whoever reads the top
checks it against the job's record (the round's `_validate_head`); `compact` drops the stale
ones once they outnumber the live, O(1) amortised per change. The counts beside the heap (`live`,
`shapes`, `parked`) are the state's to keep, in step with its records.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from lockgate.scheduler.records import HeapEntry, JobKind, Shape

# A heap holding more stale entries than this beyond twice its live ones is compacted.
_STALE_SLACK = 64


class PendingJobs:
    """A queue's pending jobs in one cluster: a heap in release order, lazily deleted.

    Split per cluster so that a round can set a whole cluster aside for a queue once that cluster
    has no room for any kind of job the queue has waiting there.
    """

    __slots__ = ("_heap", "cluster", "head", "head_kind", "live", "parked", "parked_entries",
                 "shapes")

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self._heap: list[HeapEntry] = []
        # The heap entry a round last found valid at the top, and its job's kind, until that
        # job changes (`forget_head`): the next round starts from it without looking the job
        # up among a million (issue 17, the round's memory traffic).
        self.head: HeapEntry | None = None
        self.head_kind: JobKind | None = None
        self.live = 0  # queued jobs not parked; each has at least one valid heap entry
        self.shapes: dict[Shape, int] = {}  # live jobs per request shape
        self.parked = 0
        self.parked_entries: list[HeapEntry] = []

    # ---- the heap ----------------------------------------------------------------------------

    @property
    def entries(self) -> Sequence[HeapEntry]:
        """Every entry, stale ones included, in heap order (read-only: change it through the
        methods below)."""
        return self._heap

    def first(self) -> HeapEntry | None:
        """The entry at the top (perhaps stale), or None when the heap is empty."""
        heap = self._heap
        return heap[0] if heap else None

    def top(self) -> HeapEntry:
        """The entry at the top; the heap must not be empty."""
        return self._heap[0]

    def pop(self) -> HeapEntry:
        """Take the entry at the top off the heap."""
        return heapq.heappop(self._heap)

    def push(self, entry: HeapEntry) -> None:
        heapq.heappush(self._heap, entry)

    def smallest(self, count: int) -> list[HeapEntry]:
        """The first `count` entries in release order (stale ones included)."""
        return heapq.nsmallest(count, self._heap)

    def mostly_stale(self) -> bool:
        """Whether stale entries outnumber the live ones (then `compact`)."""
        return len(self._heap) > 2 * self.live + _STALE_SLACK

    def compact(self, valid: Callable[[HeapEntry], bool]) -> None:
        """Drop stale entries (`valid` says which are live)."""
        self._heap = unique([e for e in self._heap if valid(e)])
        heapq.heapify(self._heap)

    # ---- the head a round kept ---------------------------------------------------------------

    def keep_head(self, entry: HeapEntry | None, kind: JobKind | None) -> None:
        """Keep `entry` (the top, validated; its job's kind) for the next round to start from,
        or forget the kept one (None)."""
        self.head, self.head_kind = entry, kind

    def forget_head(self, entry: HeapEntry) -> None:
        """A queued job whose entry this is changed: if it is the kept head, the next round
        looks at the top again."""
        if self.head is entry:
            self.head = self.head_kind = None

    # ---- parked jobs -------------------------------------------------------------------------

    def park(self, entry: HeapEntry) -> bool:
        """Set a job's entry aside among the parked (already off the heap); returns whether
        stale ones now outnumber the current (then `compact_parked`)."""
        self.parked_entries.append(entry)
        return len(self.parked_entries) > 2 * self.parked + _STALE_SLACK

    def compact_parked(self, valid: Callable[[HeapEntry], bool]) -> None:
        """Drop parked entries no longer current (`valid` says which are)."""
        self.parked_entries = unique([e for e in self.parked_entries if valid(e)])


def unique(entries: list[HeapEntry]) -> list[HeapEntry]:
    """Valid entries without repeats: a job that left its queue and came back may have two."""
    seen: set[str] = set()
    kept: list[HeapEntry] = []
    for entry in entries:
        if entry[2] not in seen:
            seen.add(entry[2])
            kept.append(entry)
    return kept
