"""When a queued pod is told why it waits, and which pods waited longer than their maximum.

Why it exists: a backlog of a million gated pods must not flood an apiserver with Events.
`WaitingPods` decides *when* a pod is told (what it is told is `lockgate.scheduler.explain`):
once when it is queued, a few more times soon after (`early`: 15 s and 45 s after the first by
default), then at most every `pod_interval` seconds; and at most `cluster_rate` notices per
second per cluster (a token bucket). The early ones are for clients that give a pod a short
time to start (JupyterHub's spawner, 60 s by default, shows the pod's Events on its progress
page): they see why it waits before they give up, while a pod that waits for hours costs no
more Events than before. It also finds the pods that waited longer than
their maximum time queued: their queue's or their job set's, whichever is stricter
(`lockgate.max_queued`).

Pure: the clock is passed in, as epoch seconds (pods' creation times are epoch seconds too).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from lockgate.jobs import JobState
from lockgate.max_queued import JobSetMaxQueued, Limit, stricter
from lockgate.queues import MaxQueued
from lockgate.scheduler.state import SchedJob


@dataclass(slots=True)
class TokenBucket:
    """At most `rate` per second on average, `burst` at once."""

    rate: float
    burst: float
    tokens: float = -1.0
    at: float = 0.0

    def take(self, now: float) -> bool:
        if self.tokens < 0:
            self.tokens, self.at = self.burst, now
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(frozen=True, slots=True)
class NoticeLimits:
    pod_interval: float  # seconds between two notices to one pod, once the early ones went out
    cluster_rate: float  # notices per second per cluster, on average
    cluster_burst: float  # ... and at once
    # Seconds after its first notice at which a pod gets the next few, increasing: (15, 45)
    # tells it at 0, 15 and 45 s, then every `pod_interval` after the last.
    early: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if any(not later > earlier for earlier, later in zip((0.0, *self.early), self.early,
                                                             strict=False)):
            raise ValueError(f"early notice times {list(self.early)} must be positive and "
                             "increasing, in seconds after the first notice (e.g. [15, 45])")

    def gap_after(self, told: int) -> float:
        """Seconds from a pod's `told`-th notice (1 is the first) to its next one."""
        if told <= len(self.early):
            return self.early[told - 1] - (self.early[told - 2] if told >= 2 else 0.0)
        return self.pod_interval


@dataclass(slots=True)
class _Waiting:
    queue: str
    cluster: str
    created_at: float
    due: float
    own: JobSetMaxQueued | None = None  # its job set's maximum time queued
    told: int = 0  # notices that went out; the first says "queued"
    expired: bool = False  # reported by `expired` already


@dataclass
class WaitingPods:
    """Queued pods: which are due a notice now, and which waited past their maximum.

    Fed every job row the leader applies (`observe`). `due(now)` pops the pods due a notice,
    oldest due first per cluster, as far as each cluster's bucket allows; `told` schedules the
    next one. `expired(now, max_queued_of)` pops the pods older than their maximum: a heap per
    queue by creation time for the queue's rule, one heap by deadline for pods whose job set has
    its own. Everything is O(log n) per pod and event; heaps are lazily cleaned.
    """

    limits: NoticeLimits
    _pods: dict[str, _Waiting] = field(default_factory=dict)
    _due: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # per cluster
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)
    _by_age: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # per queue
    _live: dict[str, int] = field(default_factory=dict)  # pods per queue
    # (creation + its job set's maximum, job id) of pods whose job set has one.
    _own_deadlines: list[tuple[float, str]] = field(default_factory=list)

    def observe(self, job: SchedJob, now: float) -> None:
        current = self._pods.get(job.job_id)
        if job.state is not JobState.QUEUED:
            self.forget(job.job_id)
            return
        # A queued pod that took a deleted pod's place after it was stored (lockgate.places)
        # changes its time in line: its maximum counts anew, and it is told again, as queued.
        if (current is not None and current.queue == job.queue and current.cluster == job.cluster
                and current.created_at == job.created_at):
            if current.own != job.max_queued:
                current.own = job.max_queued
                self._push_own_deadline(job.job_id, current)
            return
        self.forget(job.job_id)
        waiting = self._pods[job.job_id] = _Waiting(job.queue, job.cluster, job.created_at, now,
                                                    own=job.max_queued)
        self._push_own_deadline(job.job_id, waiting)
        heapq.heappush(self._due.setdefault(job.cluster, []), (now, job.job_id))
        heap = self._by_age.setdefault(job.queue, [])
        heapq.heappush(heap, (job.created_at, job.job_id))
        live = self._live[job.queue] = self._live.get(job.queue, 0) + 1
        if len(heap) > 2 * live + 64:
            # Pods that left without expiring leave entries behind: drop them now and then.
            kept = {(w.created_at, job_id) for job_id, w in self._pods.items()
                    if w.queue == job.queue}
            self._by_age[job.queue] = [entry for entry in heap if entry in kept]
            heapq.heapify(self._by_age[job.queue])

    def _push_own_deadline(self, job_id: str, waiting: _Waiting) -> None:
        if waiting.own is None:
            return
        heapq.heappush(self._own_deadlines, (waiting.created_at + waiting.own.seconds, job_id))
        if len(self._own_deadlines) > 2 * len(self._pods) + 64:
            self._own_deadlines = [
                entry for entry in self._own_deadlines
                if (w := self._pods.get(entry[1])) is not None and w.own is not None
                and entry[0] == w.created_at + w.own.seconds]
            heapq.heapify(self._own_deadlines)

    def forget(self, job_id: str) -> None:
        waiting = self._pods.pop(job_id, None)
        if waiting is not None:
            left = self._live[waiting.queue] - 1
            if left:
                self._live[waiting.queue] = left
            else:
                del self._live[waiting.queue]
                self._by_age.pop(waiting.queue, None)

    def due(self, now: float, *, limit: int) -> list[tuple[str, bool]]:
        """Up to `limit` (job id, first notice?) due now, within each cluster's rate."""
        picked: list[tuple[str, bool]] = []
        for cluster, heap in self._due.items():
            bucket = self._buckets.get(cluster)
            if bucket is None:
                bucket = self._buckets[cluster] = TokenBucket(self.limits.cluster_rate,
                                                              self.limits.cluster_burst)
            while heap and len(picked) < limit and heap[0][0] <= now:
                at, job_id = heap[0]
                waiting = self._pods.get(job_id)
                if waiting is None or waiting.cluster != cluster or waiting.due != at:
                    heapq.heappop(heap)  # stale
                    continue
                if not bucket.take(now):
                    break
                heapq.heappop(heap)
                picked.append((job_id, waiting.told == 0))
                waiting.due = float("inf")  # until told or untold
        return picked

    def told(self, job_ids: Iterable[str], now: float) -> None:
        for job_id in job_ids:
            waiting = self._pods.get(job_id)
            if waiting is not None:
                waiting.told += 1
                self._schedule(job_id, waiting, now + self.limits.gap_after(waiting.told))

    def untold(self, job_ids: Iterable[str], now: float) -> None:
        """Their notices did not go out: due again at once (the bucket still bounds them)."""
        for job_id in job_ids:
            waiting = self._pods.get(job_id)
            if waiting is not None:
                self._schedule(job_id, waiting, now)

    def expired(self, now: float, max_queued_of: Callable[[str], MaxQueued | None]
                ) -> list[tuple[str, Limit]]:
        """Pods queued longer (since their creation) than their maximum, popped, each with the
        rule it ends by (the stricter of its queue's and its job set's): each is returned once
        while it stays queued."""
        found: list[tuple[str, Limit]] = []

        def end(job_id: str, waiting: _Waiting) -> None:
            limit = stricter(max_queued_of(waiting.queue), waiting.own)
            # Popped by one rule's deadline: the stricter one has passed too.
            if limit is not None and waiting.created_at + limit.seconds <= now:
                waiting.expired = True
                found.append((job_id, limit))

        for queue, heap in self._by_age.items():
            queue_limit = max_queued_of(queue)
            if queue_limit is None:
                continue
            while heap and heap[0][0] + queue_limit.seconds <= now:
                created_at, job_id = heapq.heappop(heap)
                waiting = self._pods.get(job_id)
                if (waiting is None or waiting.queue != queue or waiting.created_at != created_at
                        or waiting.expired):
                    continue
                end(job_id, waiting)
        own = self._own_deadlines
        while own and own[0][0] <= now:
            deadline, job_id = heapq.heappop(own)
            waiting = self._pods.get(job_id)
            if (waiting is None or waiting.own is None or waiting.expired
                    or deadline != waiting.created_at + waiting.own.seconds):
                continue
            end(job_id, waiting)
        return found

    def next_due(self) -> float:
        return min((heap[0][0] for heap in self._due.values() if heap), default=float("inf"))

    def __len__(self) -> int:
        return len(self._pods)

    def _schedule(self, job_id: str, waiting: _Waiting, at: float) -> None:
        waiting.due = at
        heapq.heappush(self._due.setdefault(waiting.cluster, []), (at, job_id))
