"""Fair scheduling: which queued jobs may run now, and how every queue stands against its share.

Why it exists: lockgate releases gated pods under one global, fair policy across clusters. The
policy follows Armada's dominant resource fairness. A queue's *share* is the largest, over
resources, of its allocation divided by the pool's total (every schedulable node of every
cluster); its *cost* is that share divided by its weight (1 / priority factor). A round fills
progressively: it keeps giving the next job to the queue whose cost *after* taking that job would
be lowest, so the queues furthest below their share are served first.

What a round respects: a job runs only in the cluster it was created in, and only when one node
there has room for all of it (allocatable, minus what unmanaged pods use, minus what managed jobs
hold). Jobs released earlier but not yet on a node are first placed, virtually, on the node
their release had in mind, else first-fit largest first; if one fits nowhere, the cluster gets
no new releases this round rather than risk over-committing it. A job too big for every node of
its cluster is reported unschedulable and parked off its queue until the cluster gains a node of
a new size, so it never blocks the jobs behind it. The queued jobs of a controller that backs
off (`lockgate.backoff`) are held out of their queue's line the same way, and only counted.
Cordoned queues release nothing; queue limits cap a queue's allocation over all clusters.

The round is pure computation on `SchedulerState` (no I/O, no clock) and *applies its own
decisions*: every released job is RELEASED in the state when the round returns, so the next round
accounts for it. A caller that fails to carry out a decision upserts the job as QUEUED again.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from lockgate.groups import GroupIndex, GroupKey
from lockgate.jobs import JobState
from lockgate.placement import PodPlacement, can_land
from lockgate.scheduling import (
    HeapEntry,
    SchedulerState,
    _Cluster,
    _Job,
    _Pending,
    _Queue,
    _Shape,
)

# Adjusted fair share stops redistributing when less than this much of the pool is left over...
_REDISTRIBUTION_THRESHOLD = 0.01
# ...or after this many passes.
_REDISTRIBUTION_PASSES = 10
# A queue with more distinct request shapes than this waiting in one cluster is not checked
# shape by shape for whether any could still go there; its lookback bounds the cost instead.
_SET_ASIDE_SHAPE_SCAN = 32
_QUEUED = JobState.QUEUED


class SkipReason(StrEnum):
    """Why a round looked at a queued job and did not release it."""

    NO_NODE_WITH_ROOM = "no_node_with_room"  # no node of its cluster has room for it right now
    QUEUE_LIMIT = "queue_limit"  # it would take its queue over the queue's resource limits
    CLUSTER_OVERCOMMITTED = "cluster_overcommitted"  # released jobs there fit on no node yet
    # Unschedulable: parked until the cluster gains a node of a new size.
    TOO_BIG_FOR_ANY_NODE = "too_big_for_any_node"
    NO_SCHEDULABLE_NODES = "no_schedulable_nodes"  # cluster unknown, empty or fully cordoned
    # Unschedulable: its taints, nodeSelector or required node affinity let it on no node
    # (parked like a job too big, until a node it may land on appears).
    NO_MATCHING_NODE = "no_matching_node"
    # Pod groups (lockgate.groups): released all together or not at all.
    GROUP_INCOMPLETE = "group_incomplete"  # not every member exists yet
    GROUP_TOO_BIG = "group_too_big"  # the members fit no empty cluster together
    RESERVED_FOR_GROUP = "reserved_for_group"  # the cluster waits for a group to fit
    # Its controller backs off after lockgate gave up on its pods (lockgate.backoff): held out
    # of its queue's line, so only counted (`QueueReport.backing_off`), never looked at.
    BACKING_OFF = "backing_off"


UNSCHEDULABLE_REASONS = frozenset(
    {SkipReason.TOO_BIG_FOR_ANY_NODE, SkipReason.NO_SCHEDULABLE_NODES,
     SkipReason.NO_MATCHING_NODE}
)


class QueueOutcome(StrEnum):
    """Why a queue stopped taking part in a round."""

    NOTHING_PENDING = "nothing_pending"  # nothing queued, or only unschedulable jobs
    ALL_CONSIDERED = "all_considered"  # every pending job was released or skipped
    # What it still has pending is of kinds turned down this round in every cluster it uses.
    NOTHING_FITS = "nothing_fits"
    LOOKBACK_EXCEEDED = "lookback_exceeded"  # skipped more jobs than max_lookback_per_queue
    ROUND_LIMIT = "round_limit"  # the round reached max_decisions while it still had jobs
    CORDONED = "cordoned"
    UNDEFINED = "undefined"  # its jobs name a queue nobody has defined


@dataclass(frozen=True, slots=True)
class Decision:
    """Release `job_id`. `node_hint` is where the round's snapshot placed it (advice only)."""

    job_id: str
    queue: str
    cluster: str
    node_hint: str


@dataclass(frozen=True, slots=True)
class FairShare:
    """A queue's standing; shares are fractions of the whole pool's dominant resource."""

    queue: str
    weight: float
    fair_share: float  # weight / sum of weights of active queues
    adjusted_fair_share: float  # fair share, with what others cannot use redistributed
    actual_share: float  # dominant share of its allocation
    demand_share: float  # dominant share of allocation plus schedulable queued requests


@dataclass(frozen=True, slots=True)
class QueueReport:
    """One queue after a round: the answer to "why isn't my job released?"."""

    share: FairShare  # after the round's decisions
    queued: int
    unschedulable: int
    allocated: int
    released: int  # in this round
    skipped: Mapping[SkipReason, int]  # in this round
    outcome: QueueOutcome
    # Clusters where none of its waiting jobs could go this round (no room, over its limits, or
    # the cluster over-committed), so their jobs were not looked at one by one.
    set_aside: tuple[str, ...] = ()
    backing_off: int = 0  # queued jobs held while their controller backs off


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What a round decided (already applied to the state) and how every queue fared.

    `skipped_jobs` names each job the round looked at and passed over, with the reason; jobs
    parked as unschedulable in earlier rounds are only counted, in `QueueReport.unschedulable`.
    """

    decisions: tuple[Decision, ...]
    queues: Mapping[str, QueueReport]
    skipped: Mapping[SkipReason, int]  # totals over all queues
    skipped_jobs: Mapping[str, SkipReason]  # every job the round looked at and did not release
    # Clusters that got no releases because released jobs there fit on no node: job counts.
    overcommitted_clusters: Mapping[str, int]


def adjusted_fair_shares(
    weights: Mapping[str, float], demands: Mapping[str, float]
) -> dict[str, float]:
    """Divide the pool by weight, capping each queue at its demand and re-dividing the excess.

    Passes repeat while at least 1% of the pool is left over, at most 10 times; what no queue
    can use stays unallocated.
    """
    adjusted = dict.fromkeys(weights, 0.0)
    uncapped = sorted(name for name, weight in weights.items() if weight > 0)
    left = 1.0
    for _ in range(_REDISTRIBUTION_PASSES):
        if left < _REDISTRIBUTION_THRESHOLD or not uncapped:
            break
        total_weight = sum(weights[name] for name in uncapped)
        excess = 0.0
        still_uncapped: list[str] = []
        for name in uncapped:
            share = adjusted[name] + left * weights[name] / total_weight
            demand = demands.get(name, 0.0)
            if share >= demand:
                excess += share - demand
                share = demand
            else:
                still_uncapped.append(name)
            adjusted[name] = share
        uncapped = still_uncapped
        left = excess
    return adjusted


def fair_shares(state: SchedulerState) -> dict[str, FairShare]:
    """Every known queue's fair, adjusted fair, actual and demanded share, from current state."""
    return _fair_shares(state, state.fairness_inverse())


def schedule_round(
    state: SchedulerState,
    *,
    max_decisions: int,
    max_lookback_per_queue: int,
    now: float | None = None,
    group_reserve_after_seconds: float | None = None,
) -> RoundResult:
    """Decide which queued jobs to release now, and apply those decisions to `state`.

    `max_decisions` caps releases in this round (a pod group is released whole, so a round may
    pass it by the group's size less one); each queue looks past at most
    `max_lookback_per_queue` jobs that do not fit before it drops out of the round.

    A complete pod group that does not fit, and whose newest member is at least
    `group_reserve_after_seconds` older than `now` (epoch seconds), reserves its cluster: no
    other job is released there until the group is (docs/scheduling.md, "Gangs"). Without
    `now`, groups never reserve.
    """
    if max_decisions < 0 or max_lookback_per_queue < 0:
        raise ValueError("max_decisions and max_lookback_per_queue must not be negative")
    reserve_before = (None if now is None or group_reserve_after_seconds is None
                      else now - group_reserve_after_seconds)
    return _Round(state, max_lookback_per_queue, reserve_before).run(max_decisions)


class _ClusterRound:
    """One cluster's free room per schedulable node, as the round consumes it.

    A job goes only to a node its placement lets it land on (`lockgate.placement`): per
    placement, the round works out once which nodes those are (`eligible`), and first-fit walks
    only them.
    """

    __slots__ = ("cursor", "eligible", "empty", "fits_cache", "free", "names", "overcommitted",
                 "rejected", "reserved_for", "sizes", "traits")

    def __init__(self, cluster: _Cluster, inverse_total: list[float],
                 reserved_for: GroupKey | None = None) -> None:
        self.names = cluster.order
        # A pod group this cluster waits for: nothing else is released here meanwhile.
        self.reserved_for = reserved_for
        # Each node's room with no managed job on it (computed when a group first asks).
        self.empty: list[list[int]] | None = None
        self.sizes = list(cluster.node_sizes)
        self.traits = [cluster.nodes[name].traits for name in self.names]
        self.eligible: dict[PodPlacement | None, list[int]] = {}
        self.fits_cache: dict[_Shape, bool] = {}
        # First-fit resumes per shape where it last succeeded: free room only shrinks during a
        # round, so nodes before that point cannot take that shape again.
        self.cursor: dict[_Shape, int] = {}
        # Shapes no node had room for: free room only shrinks, so they stay turned down until
        # the round ends, for every queue.
        self.rejected: set[_Shape] = set()
        self.free: list[list[int]] = []
        for name in self.names:
            node = cluster.nodes[name]
            used = cluster.used_by_node.get(name)
            if used is None:
                free = [a - u for a, u in zip(node.allocatable, node.unmanaged, strict=True)]
            else:
                free = [
                    a - u - m
                    for a, u, m in zip(node.allocatable, node.unmanaged, used, strict=True)
                ]
            self.free.append(free)
        self.overcommitted = self._place_held_unbound(cluster, inverse_total)

    def _place_held_unbound(self, cluster: _Cluster, inverse_total: list[float]) -> int:
        """Charge released-but-unbound jobs to nodes; returns how many fit nowhere."""
        if not cluster.held_unbound:
            return 0
        index = {name: i for i, name in enumerate(self.names)}
        without_room: list[_Shape] = []
        for shape, hint in cluster.held_unbound.values():
            i = index.get(hint) if hint is not None else None
            if (i is not None and _fits(self.free[i], shape)
                    and can_land(shape.placement, self.traits[i])):
                _take(self.free[i], shape)
            else:
                without_room.append(shape)
        without_room.sort(key=lambda shape: _dominant_pairs(shape, inverse_total), reverse=True)
        return sum(1 for shape in without_room if self.place(shape) < 0)

    def fits_some_node(self, shape: _Shape) -> bool:
        """Whether some schedulable node could hold `shape` when empty."""
        fits = self.fits_cache.get(shape)
        if fits is None:
            pairs = shape.pairs
            placement = shape.placement
            fits = any(all(size[a] >= amount for a, amount in pairs)
                       and can_land(placement, traits) for size, traits in self.sizes)
            self.fits_cache[shape] = fits
        return fits

    def nodes_for(self, placement: PodPlacement | None) -> list[int]:
        """Indexes of the nodes a pod with this placement may land on, in first-fit order."""
        nodes = self.eligible.get(placement)
        if nodes is None:
            nodes = self.eligible[placement] = [
                i for i, traits in enumerate(self.traits) if can_land(placement, traits)]
        return nodes

    def place(self, shape: _Shape) -> int:
        """First-fit: the index of the node now holding `shape`, or -1 when none has room."""
        free = self.free
        order = self.nodes_for(shape.placement)
        count = len(order)
        pairs = shape.pairs
        i = self.cursor.get(shape, 0)
        while i < count:
            room = free[order[i]]
            for axis, amount in pairs:
                if room[axis] < amount:
                    break
            else:
                for axis, amount in pairs:
                    room[axis] -= amount
                self.cursor[shape] = i
                return order[i]
            i += 1
        self.cursor[shape] = count
        self.rejected.add(shape)
        return -1

    def place_all(self, shapes: list[_Shape], inverse_total: list[float]) -> list[int] | None:
        """Place every shape (largest first) or none: the node of each, in the order given."""
        saved = ([room[:] for room in self.free], dict(self.cursor), set(self.rejected))
        nodes = [-1] * len(shapes)
        order = sorted(range(len(shapes)), reverse=True,
                       key=lambda i: _dominant_pairs(shapes[i], inverse_total))
        for i in order:
            node = self.place(shapes[i])
            if node < 0:
                self.free, self.cursor, self.rejected = saved
                return None
            nodes[i] = node
        return nodes

    def fits_empty(self, shapes: list[_Shape], inverse_total: list[float],
                   cluster: _Cluster) -> bool:
        """Whether the shapes fit together on the nodes with no managed job on any of them."""
        if self.empty is None:
            self.empty = [
                [a - u for a, u in zip(node.allocatable, node.unmanaged, strict=True)]
                for node in (cluster.nodes[name] for name in self.names)
            ]
        room = [free[:] for free in self.empty]
        for shape in sorted(shapes, key=lambda s: _dominant_pairs(s, inverse_total),
                            reverse=True):
            for free, traits in zip(room, self.traits, strict=True):
                if _fits(free, shape) and can_land(shape.placement, traits):
                    _take(free, shape)
                    break
            else:
                return False
        return True


class _QueueRound:
    """A queue's progress through one round."""

    __slots__ = (
        "clusters",
        "head",
        "outcome",
        "over_limit",
        "queue",
        "released",
        "set_aside",
        "share",
        "skipped",
        "skips",
    )

    def __init__(self, queue: _Queue, share: float) -> None:
        self.queue = queue
        # Its pending jobs per cluster still in play; each heap[0] is a validated job.
        self.clusters: list[_Pending] = []
        self.head: _Pending | None = None  # the one whose heap[0] goes next
        self.share = share  # dominant share of the allocation, kept current as jobs are taken
        self.skips = 0
        self.skipped: list[tuple[_Pending, HeapEntry]] = []  # popped; pushed back at the end
        # Request shapes that would take the queue over its limits: allocation only grows during
        # a round, so they stay over until it ends.
        self.over_limit: set[_Shape] = set()
        self.set_aside: list[str] = []  # clusters with room for none of its pending jobs
        self.released = 0
        self.outcome = QueueOutcome.ALL_CONSIDERED

    def choose_head(self) -> _Pending | None:
        clusters = self.clusters
        if len(clusters) == 1:
            self.head = clusters[0]
        elif clusters:
            self.head = min(clusters, key=_head_entry)
        else:
            self.head = None
            if self.set_aside:
                self.outcome = QueueOutcome.NOTHING_FITS
        return self.head


def _head_entry(pending: _Pending) -> HeapEntry:
    return pending.heap[0]


class _Round:
    def __init__(self, state: SchedulerState, max_lookback: int,
                 reserve_before: float | None = None) -> None:
        self.state = state
        self.max_lookback = max_lookback
        self.inverse_total = state.fairness_inverse()
        self.clusters: dict[str, _ClusterRound] = {}
        self.queue_rounds: dict[str, _QueueRound] = {}
        self.skipped_jobs: dict[str, SkipReason] = {}
        self.groups: GroupIndex = state._groups
        # A group's members are judged together once per round: why it was not released.
        self.groups_done: dict[GroupKey, SkipReason] = {}
        self.reserve_before = reserve_before

    def run(self, max_decisions: int) -> RoundResult:
        state = self.state
        jobs = state._jobs
        inverse = self.inverse_total
        for cluster_name, key in list(self.groups.reserved.items()):
            status = self.groups.status(key)
            owner = state._queues.get(key[1])
            if status is None or not status.complete or owner is None or not owner.schedulable:
                # Released, gone, no longer whole, or its queue cordoned or undefined: a
                # reservation nobody can use must not hold the cluster.
                del self.groups.reserved[cluster_name]
        candidates: list[tuple[float, str, _QueueRound]] = []
        for name, queue in state._queues.items():
            if not queue.schedulable or queue.queued == queue.parked + queue.held:
                continue
            progress = self.queue_rounds[name] = _QueueRound(
                queue, _dominant(queue.allocation, inverse)
            )
            for in_cluster in queue.pending.values():
                if in_cluster.live and self._validate_head(progress, in_cluster):
                    progress.clusters.append(in_cluster)
            head = progress.choose_head()
            if head is None:
                progress.outcome = QueueOutcome.NOTHING_PENDING
                continue
            cost = self._cost_after(progress, self._unit_pairs(head, jobs[head.heap[0][2]]))
            candidates.append((cost, name, progress))
        heapq.heapify(candidates)

        decisions: list[Decision] = []
        skipped_jobs = self.skipped_jobs
        max_lookback = self.max_lookback
        while candidates:
            if len(decisions) >= max_decisions:
                for _, _, progress in candidates:
                    progress.outcome = QueueOutcome.ROUND_LIMIT
                break
            _, name, progress = heapq.heappop(candidates)
            queue = progress.queue
            pending = progress.head
            assert pending is not None  # a candidate always has a head
            entry = pending.heap[0]
            job = jobs[entry[2]]
            cluster = self.clusters[pending.cluster]
            shape = job.shape
            if (
                shape in cluster.rejected or shape in progress.over_limit or cluster.overcommitted
            ) and self._nothing_can_go(progress, pending, cluster):
                # Everything this queue has waiting in that cluster is of a kind already turned
                # down there this round: set the cluster aside rather than look at each job.
                progress.clusters.remove(pending)
                progress.set_aside.append(pending.cluster)
            elif job.group is not None:
                heapq.heappop(pending.heap)
                reason, counted = self._group_turn(progress, pending, cluster, job, decisions)
                if reason is not None:
                    progress.skipped.append((pending, entry))
                    skipped_jobs[entry[2]] = reason
                    if counted:
                        progress.skips += 1
                        if progress.skips > max_lookback:
                            progress.outcome = QueueOutcome.LOOKBACK_EXCEEDED
                            continue
                if not self._validate_head(progress, pending):
                    progress.clusters.remove(pending)
            else:
                heapq.heappop(pending.heap)
                node = -1
                if queue.limit_pairs and _exceeds(queue.allocation, shape, queue.limit_pairs):
                    reason = SkipReason.QUEUE_LIMIT
                    progress.over_limit.add(shape)
                elif cluster.overcommitted:
                    reason = SkipReason.CLUSTER_OVERCOMMITTED
                elif cluster.reserved_for is not None:
                    reason = SkipReason.RESERVED_FOR_GROUP
                else:
                    node = cluster.place(shape)
                    reason = None if node >= 0 else SkipReason.NO_NODE_WITH_ROOM
                if reason is None:
                    hint = cluster.names[node]
                    state._mark_released(entry[2], job, hint)
                    decisions.append(Decision(entry[2], name, pending.cluster, hint))
                    progress.released += 1
                    allocation = queue.allocation
                    for axis, _amount in shape.pairs:
                        share = allocation[axis] * inverse[axis]
                        if share > progress.share:
                            progress.share = share
                else:
                    progress.skipped.append((pending, entry))
                    skipped_jobs[entry[2]] = reason
                    progress.skips += 1
                    if progress.skips > max_lookback:
                        progress.outcome = QueueOutcome.LOOKBACK_EXCEEDED
                        continue
                if not self._validate_head(progress, pending):
                    progress.clusters.remove(pending)
            head = progress.choose_head()
            if head is None:
                continue
            cost = self._cost_after(progress, self._unit_pairs(head, jobs[head.heap[0][2]]))
            heapq.heappush(candidates, (cost, name, progress))

        for progress in self.queue_rounds.values():
            for pending, entry in progress.skipped:
                heapq.heappush(pending.heap, entry)
        return self._result(decisions)

    def _group_turn(self, progress: _QueueRound, pending: _Pending, cluster: _ClusterRound,
                    job: _Job, decisions: list[Decision]) -> tuple[SkipReason | None, bool]:
        """A group member came up: release every member of its group now, or none.

        Returns why not (None: released) and whether this counts as a skip of the queue's (a
        group counts once per round, however many members come up).
        """
        queue = progress.queue
        assert job.group is not None
        key = (pending.cluster, queue.name, job.group)
        done = self.groups_done.get(key)
        if done is not None:
            return done, False
        status = self.groups.status(key)
        jobs = self.state._jobs
        member_ids = self.groups.queued_members(key)
        members = [jobs[member] for member in member_ids]
        shapes = [member.shape for member in members]
        reason: SkipReason | None = None
        if status is None or not status.complete:
            reason = SkipReason.GROUP_INCOMPLETE
        elif any(member.held for member in members):
            reason = SkipReason.BACKING_OFF
        elif any(member.parked for member in members):
            reason = SkipReason.TOO_BIG_FOR_ANY_NODE
        elif queue.limit_pairs and _exceeds_all(queue.allocation, shapes, queue.limit_pairs):
            reason = SkipReason.QUEUE_LIMIT
        elif cluster.overcommitted:
            reason = SkipReason.CLUSTER_OVERCOMMITTED
        elif cluster.reserved_for not in (None, key):
            reason = SkipReason.RESERVED_FOR_GROUP
        elif not cluster.fits_empty(shapes, self.inverse_total,
                                    self.state._clusters[pending.cluster]):
            reason = SkipReason.GROUP_TOO_BIG
        else:
            nodes = cluster.place_all(shapes, self.inverse_total)
            if nodes is None:
                reason = SkipReason.NO_NODE_WITH_ROOM
                if (cluster.reserved_for is None and self.reserve_before is not None
                        and status.last_created_at <= self.reserve_before):
                    # It waited long enough behind smaller jobs: hold every gap that opens
                    # in this cluster for it from now on.
                    cluster.reserved_for = self.groups.reserved[pending.cluster] = key
            else:
                inverse = self.inverse_total
                for member_id, member, node in zip(member_ids, members, nodes, strict=True):
                    hint = cluster.names[node]
                    self.state._mark_released(member_id, member, hint)
                    decisions.append(Decision(member_id, queue.name, pending.cluster, hint))
                    progress.released += 1
                    for axis, _amount in member.shape.pairs:
                        share = queue.allocation[axis] * inverse[axis]
                        if share > progress.share:
                            progress.share = share
                if cluster.reserved_for == key:
                    cluster.reserved_for = None
                    self.groups.reserved.pop(pending.cluster, None)
                return None, True
        if cluster.reserved_for == key and reason is not SkipReason.NO_NODE_WITH_ROOM:
            # It no longer waits for room only (e.g. its queue reached its limits): release the
            # cluster rather than hold it for what room cannot fix.
            cluster.reserved_for = None
            self.groups.reserved.pop(pending.cluster, None)
        self.groups_done[key] = reason
        return reason, True

    def _unit_pairs(self, pending: _Pending, job: _Job) -> tuple[tuple[int, int], ...]:
        """What taking the queue's next unit costs: the job, or its whole group."""
        if job.group is None:
            return job.shape.pairs
        key = (pending.cluster, job.queue, job.group)
        if key in self.groups_done:
            return job.shape.pairs  # judged already: it only passes through
        total: dict[int, int] = {}
        jobs = self.state._jobs
        for member in self.groups.queued_members(key):
            for axis, amount in jobs[member].shape.pairs:
                total[axis] = total.get(axis, 0) + amount
        return tuple(sorted(total.items())) or job.shape.pairs

    @staticmethod
    def _nothing_can_go(progress: _QueueRound, pending: _Pending, cluster: _ClusterRound) -> bool:
        """Whether every kind of job the queue has waiting in this cluster was turned down."""
        if cluster.overcommitted:
            return True
        reserved = cluster.reserved_for
        if reserved is not None and reserved[1] != progress.queue.name:
            return True
        shapes = pending.shapes
        if len(shapes) > _SET_ASIDE_SHAPE_SCAN:
            return False
        no_room = cluster.rejected
        over_limit = progress.over_limit
        return all(
            shape in no_room or shape in over_limit or not cluster.fits_some_node(shape)
            for shape in shapes
        )

    def _validate_head(self, progress: _QueueRound, pending: _Pending) -> bool:
        """Make heap[0] a job the round may consider: drop stale entries and park jobs too big
        for every node of their cluster. False when nothing is left."""
        heap = pending.heap
        jobs = self.state._jobs
        name = progress.queue.name
        cluster_name = pending.cluster
        skipped_jobs = self.skipped_jobs
        while heap:
            entry = heap[0]
            job = jobs.get(entry[2])
            if (
                job is None
                or job.state is not _QUEUED
                or job.parked
                or job.held
                or job.queue != name
                or job.cluster != cluster_name
                or job.priority != -entry[0]
                or job.created_at != entry[1]
                or entry[2] in skipped_jobs  # a second entry for a job already looked at
            ):
                heapq.heappop(heap)
                continue
            cluster = self.clusters.get(cluster_name)
            if cluster is None:
                cluster = self.clusters[cluster_name] = _ClusterRound(
                    self.state._clusters[cluster_name], self.inverse_total,
                    self.groups.reserved.get(cluster_name),
                )
            if not cluster.fits_some_node(job.shape):
                heapq.heappop(heap)
                self.state._park(progress.queue, pending, job, entry)
                skipped_jobs[entry[2]] = (
                    SkipReason.NO_SCHEDULABLE_NODES if not cluster.sizes
                    else SkipReason.NO_MATCHING_NODE if not cluster.nodes_for(job.shape.placement)
                    else SkipReason.TOO_BIG_FOR_ANY_NODE
                )
                continue
            return True
        return False

    def _cost_after(self, progress: _QueueRound, pairs: tuple[tuple[int, int], ...]) -> float:
        share = progress.share
        allocation = progress.queue.allocation
        inverse = self.inverse_total
        for axis, amount in pairs:
            after = (allocation[axis] + amount) * inverse[axis]
            if after > share:
                share = after
        return share * progress.queue.priority_factor

    def _result(self, decisions: list[Decision]) -> RoundResult:
        shares = _fair_shares(self.state, self.inverse_total)
        totals: dict[SkipReason, int] = {}
        per_queue: dict[str, dict[SkipReason, int]] = {}
        for job_id, reason in self.skipped_jobs.items():
            totals[reason] = totals.get(reason, 0) + 1
            record = self.state._jobs.get(job_id)
            if record is not None:
                counts = per_queue.setdefault(record.queue, {})
                counts[reason] = counts.get(reason, 0) + 1
        backing_off = SkipReason.BACKING_OFF
        for name, queue in self.state._queues.items():
            if queue.held:  # skipped without being looked at, as parked jobs are
                counts = per_queue.setdefault(name, {})
                counts[backing_off] = counts.get(backing_off, 0) + queue.held
                totals[backing_off] = totals.get(backing_off, 0) + queue.held
        reports: dict[str, QueueReport] = {}
        for name, queue in self.state._queues.items():
            progress = self.queue_rounds.get(name)
            if progress is not None:
                outcome = progress.outcome
            elif queue.spec is None:
                outcome = QueueOutcome.UNDEFINED
            elif queue.spec.cordoned:
                outcome = QueueOutcome.CORDONED
            else:
                outcome = QueueOutcome.NOTHING_PENDING
            reports[name] = QueueReport(
                share=shares[name],
                queued=queue.queued,
                unschedulable=queue.parked,
                allocated=queue.allocated,
                released=0 if progress is None else progress.released,
                skipped=per_queue.get(name, {}),
                outcome=outcome,
                set_aside=() if progress is None else tuple(sorted(progress.set_aside)),
                backing_off=queue.held,
            )
        return RoundResult(
            decisions=tuple(decisions),
            queues=reports,
            skipped=totals,
            skipped_jobs=self.skipped_jobs,
            overcommitted_clusters={
                name: cluster.overcommitted
                for name, cluster in self.clusters.items()
                if cluster.overcommitted
            },
        )


def _fair_shares(state: SchedulerState, inverse: list[float]) -> dict[str, FairShare]:
    weights: dict[str, float] = {}
    demands: dict[str, float] = {}
    actual: dict[str, float] = {}
    for name, queue in state._queues.items():
        actual[name] = _dominant(queue.allocation, inverse)
        # Only defined queues share the pool: jobs naming a queue nobody defined (or one since
        # deleted) still hold what they hold, but do not dilute the others' fair shares.
        if queue.is_empty() or queue.spec is None:
            continue
        weights[name] = queue.weight
        demands[name] = (
            _dominant_sum(queue.allocation, queue.demand, inverse)
            if queue.schedulable
            else actual[name]
        )
    total_weight = sum(weights.values())
    adjusted = adjusted_fair_shares(weights, demands)
    return {
        name: FairShare(
            queue=name,
            weight=queue.weight,
            fair_share=weights[name] / total_weight if name in weights else 0.0,
            adjusted_fair_share=adjusted.get(name, 0.0),
            actual_share=actual[name],
            demand_share=demands.get(name, actual[name]),
        )
        for name, queue in state._queues.items()
    }


def _dominant(vector: list[int], inverse: list[float]) -> float:
    return max((amount * inv for amount, inv in zip(vector, inverse, strict=False)), default=0.0)


def _dominant_sum(first: list[int], second: list[int], inverse: list[float]) -> float:
    return max(
        ((a + b) * inv for a, b, inv in zip(first, second, inverse, strict=False)), default=0.0
    )


def _dominant_pairs(shape: _Shape, inverse: list[float]) -> float:
    return max((amount * inverse[axis] for axis, amount in shape.pairs), default=0.0)


def _fits(room: list[int], shape: _Shape) -> bool:
    return all(room[axis] >= amount for axis, amount in shape.pairs)


def _take(room: list[int], shape: _Shape) -> None:
    for axis, amount in shape.pairs:
        room[axis] -= amount


def _exceeds_all(allocation: list[int], shapes: list[_Shape],
                 limits: tuple[tuple[int, int], ...]) -> bool:
    requested: dict[int, int] = {}
    for shape in shapes:
        for axis, amount in shape.pairs:
            requested[axis] = requested.get(axis, 0) + amount
    return any(allocation[axis] + requested.get(axis, 0) > limit for axis, limit in limits)


def _exceeds(allocation: list[int], shape: _Shape, limits: tuple[tuple[int, int], ...]) -> bool:
    requested = dict(shape.pairs)
    return any(allocation[axis] + requested.get(axis, 0) > limit for axis, limit in limits)
