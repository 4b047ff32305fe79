"""Why a queued pod waits, told on the pod at a bounded rate, and when it has waited too long.

Why this exists: a gated pod shows only `Pending` and a gate. Its owner asks "why is my pod still
pending?", and the answer is in the scheduler's state: its queue, its place in that queue, and
what it waits for (its queue's fair share, room in its cluster, a node it fits on, a cordoned or
unknown queue). `explain` computes that answer from a `SchedulerState`; the fair-scheduler leader
uses it for the Events it sends (through `lockgate.pod-notices.v1`, written by the ungater), and
the admin API for `lockgate explain`, so both say the same.

`WaitingPods` decides *when* a pod is told: once when it is queued, then at most every
`pod_interval` seconds, and at most `cluster_rate` notices per second per cluster (a token
bucket), so a backlog of a million pods cannot flood an apiserver with Events. It also finds the
pods that waited longer than their maximum time queued: their queue's or their job set's,
whichever is stricter (`lockgate.max_queued`).

Pure: the clock is passed in, as epoch seconds (pods' creation times are epoch seconds too).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from lockgate.backoff import backing_off_message
from lockgate.fairness import FairShare, _ClusterRound, fair_shares
from lockgate.jobs import JobState
from lockgate.max_queued import JobSetMaxQueued, Limit, stricter
from lockgate.queues import MaxQueued
from lockgate.scheduling import SchedJob, SchedulerState

# A queue this close to its adjusted fair share counts as at it.
_SHARE_EPSILON = 1e-9


class WaitReason(StrEnum):
    """What a queued pod waits for. Open: readers show a value they do not know as it is."""

    FAIR_SHARE = "fair_share"  # its queue holds its fair share; queues below theirs go first
    CLUSTER_ROOM = "cluster_room"  # no node of its cluster has room for it right now
    NODE_FIT = "node_fit"  # it fits no node of its cluster, even an empty one
    NO_NODES = "no_nodes"  # its cluster has no schedulable node (unknown, empty, cordoned)
    QUEUE_LIMIT = "queue_limit"  # it would take its queue over the queue's resource limits
    QUEUE_CORDONED = "queue_cordoned"  # its queue releases nothing until uncordoned
    QUEUE_UNKNOWN = "queue_unknown"  # nobody defined its queue
    # Its controller backs off: lockgate gave up on its pods that kube-scheduler kept refusing
    # (lockgate.backoff); it waits until the back-off ends.
    BACKING_OFF = "backing_off"
    NEXT_ROUND = "next_round"  # there is room and nothing ahead of it: the next round takes it


# The Event reason for each (CamelCase, as Kubernetes reasons are), and whether it is a Warning:
# a pod that merely waits its turn is Normal; one that needs its owner is a Warning.
EVENT_REASONS: dict[WaitReason, tuple[str, bool]] = {
    WaitReason.FAIR_SHARE: ("LockgateWaitingForFairShare", False),
    WaitReason.CLUSTER_ROOM: ("LockgateWaitingForRoom", False),
    WaitReason.NODE_FIT: ("LockgateFitsNoNode", True),
    WaitReason.NO_NODES: ("LockgateNoSchedulableNodes", True),
    WaitReason.QUEUE_LIMIT: ("LockgateQueueLimit", False),
    WaitReason.QUEUE_CORDONED: ("LockgateQueueCordoned", True),
    WaitReason.QUEUE_UNKNOWN: ("LockgateQueueUnknown", True),
    WaitReason.BACKING_OFF: ("LockgateBackingOff", True),
    WaitReason.NEXT_ROUND: ("LockgateWaitingForRound", False),
}
QUEUED_EVENT_REASON = "LockgateQueued"
MAX_QUEUED_EVENT_REASON = "LockgateMaxQueuedTimeExceeded"


@dataclass(frozen=True, slots=True)
class WaitFacts:
    """What reason selection looks at; each is cheap to compute from the state."""

    queue_defined: bool
    cordoned: bool
    cluster_has_nodes: bool
    fits_some_node: bool  # some schedulable node could hold it when empty
    over_queue_limit: bool
    fits_free_room: bool  # some node has room for it now
    at_fair_share: bool  # its queue holds at least its adjusted fair share
    others_below_share_waiting: bool  # another queue below its share waits in the same cluster
    backing_off: bool = False  # its controller backs off (lockgate.backoff)


def choose_reason(facts: WaitFacts) -> WaitReason:
    """The one reason that, removed, would bring the pod closest to release: the most blocking
    first (a cordoned queue releases nothing, whatever the room)."""
    if not facts.queue_defined:
        return WaitReason.QUEUE_UNKNOWN
    if facts.cordoned:
        return WaitReason.QUEUE_CORDONED
    if facts.backing_off:
        return WaitReason.BACKING_OFF
    if not facts.cluster_has_nodes:
        return WaitReason.NO_NODES
    if not facts.fits_some_node:
        return WaitReason.NODE_FIT
    if facts.over_queue_limit:
        return WaitReason.QUEUE_LIMIT
    if facts.at_fair_share and facts.others_below_share_waiting:
        return WaitReason.FAIR_SHARE
    if not facts.fits_free_room:
        return WaitReason.CLUSTER_ROOM
    return WaitReason.NEXT_ROUND


@dataclass(frozen=True, slots=True)
class Explanation:
    """The full answer for one queued pod, with the numbers behind it."""

    job_id: str
    cluster: str
    queue: str
    state: str
    reason: WaitReason | None  # None: it is not waiting (released, running)
    position: int  # 1-based among its queue's queued pods, in release order; 0 if not queued
    queued_in_queue: int
    waited_seconds: float
    requests: Mapping[str, int]  # canonical units (cpu millicores, memory bytes)
    weight: float
    fair_share: float
    adjusted_fair_share: float
    actual_share: float
    cordoned: bool
    queue_defined: bool
    queue_limits: Mapping[str, int]
    queue_allocation: Mapping[str, int]
    cluster_nodes: int  # schedulable
    cluster_free: Mapping[str, int]  # room left over all schedulable nodes of its cluster
    largest_free_node: Mapping[str, int]  # the most room on one node, by its dominant resource
    largest_node: Mapping[str, int]  # the largest allocatable of one node
    max_queued_seconds: float | None
    max_queued_action: str | None
    competing_queues: tuple[str, ...]  # queues below their share waiting in the same cluster
    message: str = ""
    max_queued_by: str | None = None  # whose maximum applies: "queue" or "jobset"
    # Its controller's back-off (lockgate.backoff): consecutive give-ups, and until when
    # (epoch seconds) it waits; 0 and None when it does not back off.
    backoff_attempts: int = 0
    backoff_until: float | None = None


def explain(state: SchedulerState, job_id: str, *, now: float) -> Explanation | None:
    """Why `job_id` waits, from the state as it is (after a round, as the leader holds it)."""
    return Explainer(state, now=now).explain(job_id)


class Explainer:
    """Explains many pods of one state at one time, sharing what they have in common (the fair
    shares, each cluster's free room); build a new one after the state changed."""

    def __init__(self, state: SchedulerState, *, now: float) -> None:
        self.state = state
        self.now = now
        self.shares = fair_shares(state)
        self.inverse = state.fairness_inverse()
        self._rounds: dict[str, _ClusterRound] = {}

    def explain(self, job_id: str, position: tuple[int, int] | None = None
                ) -> Explanation | None:
        """`position` (place, of how many) if known, else computed (O(jobs))."""
        state = self.state
        job = state.job(job_id)
        if job is None:
            return None
        queued = job.state is JobState.QUEUED
        if position is None:
            position = _position(state, job) if queued else (
                0, state.queue_usage(job.queue).queued_jobs)
        rounds = self._rounds.get(job.cluster)
        cluster = state._clusters.get(job.cluster)
        if rounds is None and cluster is not None and cluster.order:
            rounds = self._rounds[job.cluster] = _ClusterRound(cluster, self.inverse)
        return _explain(state, job, position, self.shares, self.inverse, rounds, self.now)


def _explain(state: SchedulerState, job: SchedJob, place: tuple[int, int],
             shares: Mapping[str, FairShare], inverse: list[float],
             rounds: _ClusterRound | None, now: float) -> Explanation:
    job_id = job.job_id
    spec = state.queue_spec(job.queue)
    share = shares.get(job.queue)
    cluster = state._clusters.get(job.cluster)
    names = state._axis_names
    requests = job.requests.as_dict()
    queued = job.state is JobState.QUEUED
    position, count = place
    free_total = [0] * len(names)
    largest_free: list[int] = []
    largest_node: list[int] = []
    fits_some = fits_free = False
    node_count = 0
    if cluster is not None and rounds is not None:
        node_count = len(cluster.order)
        shape = state._jobs[job_id].shape
        fits_some = rounds.fits_some_node(shape)
        best = -1.0
        eligible = set(rounds.nodes_for(shape.placement))
        for index, free in enumerate(rounds.free):
            for axis, amount in enumerate(free):
                free_total[axis] += max(0, amount)
            dominant = max((max(0, a) * i for a, i in zip(free, inverse, strict=False)),
                           default=0.0)
            if dominant > best:
                best, largest_free = dominant, [max(0, a) for a in free]
            if index in eligible and all(free[axis] >= amount for axis, amount in shape.pairs):
                fits_free = True  # room only on a node the pod may land on
        biggest = -1.0
        for name in cluster.order:
            allocatable = cluster.nodes[name].allocatable
            dominant = max((a * i for a, i in zip(allocatable, inverse, strict=False)),
                           default=0.0)
            if dominant > biggest:
                biggest, largest_node = dominant, list(allocatable)
    allocation = state.queue_usage(job.queue).allocation.as_dict()
    limits = {} if spec is None else spec.limits.as_dict()
    over_limit = any(allocation.get(name, 0) + requests.get(name, 0) > limit
                     for name, limit in limits.items())
    at_share = share is not None and (
        share.actual_share + _SHARE_EPSILON >= share.adjusted_fair_share)
    competing = tuple(sorted(
        name for name, other in state._queues.items()
        if name != job.queue and other.schedulable
        and (pending := other.pending.get(job.cluster)) is not None and pending.live > 0
        and shares[name].actual_share + _SHARE_EPSILON < shares[name].adjusted_fair_share))
    hold = state.controller_hold(job_id)
    reason = choose_reason(WaitFacts(
        queue_defined=spec is not None,
        cordoned=spec is not None and spec.cordoned,
        cluster_has_nodes=node_count > 0,
        fits_some_node=fits_some,
        over_queue_limit=over_limit,
        fits_free_room=fits_free,
        at_fair_share=at_share,
        others_below_share_waiting=bool(competing),
        backing_off=hold is not None,
    )) if queued else None
    max_queued = stricter(None if spec is None else spec.max_queued, job.max_queued)

    def named(vector: list[int]) -> dict[str, int]:
        # Zero where the pod asks for some ("cpu 0" says what is missing); else nonzero only.
        return {names[axis]: amount for axis, amount in enumerate(vector)
                if amount or names[axis] in requests}

    explanation = Explanation(
        job_id=job_id, cluster=job.cluster, queue=job.queue, state=job.state.value,
        reason=reason, position=position, queued_in_queue=count,
        waited_seconds=max(0.0, now - job.created_at), requests=requests,
        weight=0.0 if spec is None else spec.weight,
        fair_share=0.0 if share is None else share.fair_share,
        adjusted_fair_share=0.0 if share is None else share.adjusted_fair_share,
        actual_share=0.0 if share is None else share.actual_share,
        cordoned=spec is not None and spec.cordoned, queue_defined=spec is not None,
        queue_limits=limits, queue_allocation=allocation, cluster_nodes=node_count,
        cluster_free=named(free_total), largest_free_node=named(largest_free),
        largest_node=named(largest_node),
        max_queued_seconds=None if max_queued is None else max_queued.seconds,
        max_queued_action=None if max_queued is None else max_queued.action,
        competing_queues=competing,
        max_queued_by=None if max_queued is None else max_queued.by,
        backoff_attempts=0 if hold is None else hold.attempts,
        backoff_until=None if hold is None else hold.until,
    )
    return _with_message(explanation)


def _position(state: SchedulerState, job: SchedJob) -> tuple[int, int]:
    """Its 1-based place among its queue's queued pods in release order, and how many there are.

    O(queued pods of the queue): for explaining one pod; `positions` serves many at once.
    """
    mine = (-job.priority, job.created_at, job.job_id)
    ahead = count = 0
    for other_id, other in state._jobs.items():
        if other.queue != job.queue or other.state is not JobState.QUEUED:
            continue
        count += 1
        if (-other.priority, other.created_at, other_id) < mine:
            ahead += 1
    return ahead + 1, count


def positions(state: SchedulerState, job_ids: Iterable[str]) -> dict[str, tuple[int, int]]:
    """`_position` for many pods, one pass over the jobs for all of them."""
    wanted: dict[str, list[tuple[tuple[int, float, str], str]]] = {}
    for job_id in job_ids:
        record = state._jobs.get(job_id)
        if record is not None and record.state is JobState.QUEUED:
            wanted.setdefault(record.queue, []).append(
                ((-record.priority, record.created_at, job_id), job_id))
    if not wanted:
        return {}
    keys: dict[str, list[tuple[int, float, str]]] = {queue: [] for queue in wanted}
    for other_id, other in state._jobs.items():
        bucket = keys.get(other.queue)
        if bucket is not None and other.state is JobState.QUEUED:
            bucket.append((-other.priority, other.created_at, other_id))
    found: dict[str, tuple[int, int]] = {}
    for queue, mine in wanted.items():
        ordered = sorted(keys[queue])
        rank = {key: index for index, key in enumerate(ordered)}
        for key, job_id in mine:
            found[job_id] = (rank[key] + 1, len(ordered))
    return found


def _percent(share: float) -> str:
    return f"{share * 100:.1f}%"


def _with_message(e: Explanation) -> Explanation:
    return replace(e, message=wait_message(e))


def wait_message(e: Explanation) -> str:
    """One paragraph for the Event and the top of `lockgate explain`: queue, position, why."""
    where = f'queue "{e.queue}", position {e.position} of {e.queued_in_queue}'
    reason = e.reason
    if reason is WaitReason.FAIR_SHARE:
        why = (f"waiting for its queue's fair share: the queue holds {_percent(e.actual_share)} "
               f"of the pool, its adjusted fair share is {_percent(e.adjusted_fair_share)}, and "
               f"queues below theirs go first ({', '.join(e.competing_queues)})")
    elif reason is WaitReason.CLUSTER_ROOM:
        why = (f"waiting for room in cluster {e.cluster}: no node has {_amounts(e.requests)} "
               f"free (most on one node: {_amounts(e.largest_free_node) or 'nothing'})")
    elif reason is WaitReason.NODE_FIT:
        why = (f"fits no node of cluster {e.cluster}: it asks {_amounts(e.requests)}, the "
               f"largest node offers {_amounts(e.largest_node)}; lower its requests, or add a "
               "larger node")
    elif reason is WaitReason.NO_NODES:
        why = f"cluster {e.cluster} has no schedulable node"
    elif reason is WaitReason.QUEUE_LIMIT:
        why = (f"its queue would exceed its limits ({_amounts(e.queue_limits)}; it holds "
               f"{_amounts(e.queue_allocation) or 'nothing'})")
    elif reason is WaitReason.QUEUE_CORDONED:
        why = (f'queue "{e.queue}" is cordoned: nothing is released until '
               f"`lockgate queue uncordon {e.queue}`")
    elif reason is WaitReason.QUEUE_UNKNOWN:
        why = f'queue "{e.queue}" does not exist: it waits until the queue is created'
    elif reason is WaitReason.BACKING_OFF and e.backoff_until is not None:
        why = backing_off_message(e.backoff_attempts, e.backoff_until)
    elif reason is WaitReason.NEXT_ROUND:
        why = "there is room: the next scheduling round releases it"
    else:
        return f"{where}; not waiting ({e.state})"
    text = f"{where}; {why}"
    if e.max_queued_seconds is not None:
        done = "deleted" if e.max_queued_action == "delete" else "failed"
        whose = " (its job set's maximum)" if e.max_queued_by == "jobset" else ""
        text += f"; it is {done} after {format_duration(e.max_queued_seconds)} queued{whose}"
    return text


def _amounts(amounts: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {format_amount(name, amount)}"
                     for name, amount in sorted(amounts.items()))


def format_amount(resource: str, amount: float) -> str:
    """A canonical amount in human units: cpu in cores (from millicores), bytes in Ki..Ti."""
    if resource == "cpu":
        cores = amount / 1000
        return f"{cores:g}" if cores == int(cores) else f"{cores:.3g}"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if abs(amount) >= size:
                value = amount / size
                return f"{value:.3g}{unit}" if value != int(value) else f"{int(value)}{unit}"
        return f"{int(amount)}"
    return f"{amount:g}"


def format_duration(seconds: float) -> str:
    """3m12s, 2h5m, 4d3h, 45s: the two largest units, as kubectl prints ages."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    return f"{secs}s"


# ---- when to tell, and who waited too long ---------------------------------------------------

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
    pod_interval: float  # seconds between two notices to one pod
    cluster_rate: float  # notices per second per cluster, on average
    cluster_burst: float  # ... and at once


@dataclass(slots=True)
class _Waiting:
    queue: str
    cluster: str
    created_at: float
    due: float
    own: JobSetMaxQueued | None = None  # its job set's maximum time queued
    told: bool = False  # its first ("queued") notice went out
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
        if current is not None and current.queue == job.queue and current.cluster == job.cluster:
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
                picked.append((job_id, not waiting.told))
                waiting.due = float("inf")  # until told or untold
        return picked

    def told(self, job_ids: Iterable[str], now: float) -> None:
        for job_id in job_ids:
            waiting = self._pods.get(job_id)
            if waiting is not None:
                waiting.told = True
                self._schedule(job_id, waiting, now + self.limits.pod_interval)

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


# ---- every queue at a glance (`lockgate status`) ---------------------------------------------

_RELEASED_STATES = frozenset({JobState.RELEASED, JobState.UNGATED})
_RUNNING_STATES = frozenset({JobState.BOUND, JobState.RUNNING})


@dataclass(frozen=True, slots=True)
class QueueStatus:
    queue: str
    defined: bool
    cordoned: bool
    weight: float
    fair_share: float
    adjusted_fair_share: float
    actual_share: float
    queued: int
    unschedulable: int  # queued, but fitting no node of their cluster
    released: int  # gate being removed, or removed and not bound yet
    running: int  # bound or running
    oldest_queued_at: float | None  # epoch seconds: the creation of its oldest queued pod
    max_queued_seconds: float | None
    backing_off: int = 0  # queued, held while their controller backs off (lockgate.backoff)


def queue_statuses(state: SchedulerState) -> list[QueueStatus]:
    """Each queue's standing and its pods by phase, by name: one pass over the jobs."""
    shares = fair_shares(state)
    counts: dict[str, list[int]] = {}
    oldest: dict[str, float] = {}
    for record in state._jobs.values():
        phase = counts.setdefault(record.queue, [0, 0])
        if record.state in _RELEASED_STATES:
            phase[0] += 1
        elif record.state in _RUNNING_STATES:
            phase[1] += 1
        elif record.state is JobState.QUEUED and record.created_at < oldest.get(
                record.queue, float("inf")):
            oldest[record.queue] = record.created_at
    statuses = []
    for name in state.queue_names():
        spec = state.queue_spec(name)
        share = shares[name]
        usage = state.queue_usage(name)
        released, running = counts.get(name, [0, 0])
        statuses.append(QueueStatus(
            queue=name, defined=spec is not None, cordoned=spec is not None and spec.cordoned,
            weight=share.weight if spec is not None else 0.0, fair_share=share.fair_share,
            adjusted_fair_share=share.adjusted_fair_share, actual_share=share.actual_share,
            queued=usage.queued_jobs, unschedulable=usage.unschedulable_jobs,
            released=released, running=running, oldest_queued_at=oldest.get(name),
            max_queued_seconds=None if spec is None or spec.max_queued is None
            else spec.max_queued.seconds,
            backing_off=usage.backing_off_jobs))
    return statuses
