"""The scheduling round: which queued jobs may run now, and how every queue fared.

Why it exists: lockgate releases gated pods under one global, fair policy across clusters. A round
fills progressively by the cost model (`lockgate.scheduler.costs`): it keeps giving the next job
to the queue whose cost *after* taking that job would be lowest, so the queues furthest below
their share are served first.

What a round respects: a job runs only in the cluster it was created in, and only where a node
there has room for all of it (`lockgate.scheduler.room`). A job too big for every node of
its cluster is reported unschedulable and parked off its queue until the cluster gains a node of
a new size, so it never blocks the jobs behind it. The queued jobs of a controller that backs
off (`lockgate.backoff`) are held out of their queue's line the same way, and only counted.
Cordoned queues release nothing; queue limits cap a queue's allocation over all clusters. A pod
group is released whole or not at all (`lockgate.scheduler.groups`). In a cluster whose
autoscaler may add nodes (lockgate.growth), a pod that finds no room on the nodes that exist may
be released *for growth*, onto a node that may exist, only while its queue is owed room there
and the cluster's growth is neither stalled nor waiting for the last wave's NodeClaims
(`growth_gate`; docs/autoscaling.md).

The round is pure computation on `SchedulerState` (no I/O, no clock) and *applies its own
decisions*, through the state's transaction (`SchedulerState.begin_round`): every released job
is RELEASED in the state when the round returns, so the rest of the round and the next one
account for it. Its caller commits the transaction once it has recorded the decisions, keeping
those it recorded; each other release is taken back, its job queued again as before the round.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from lockgate.growth import GrowthPlan, PoolHeadroom, describe_amounts, wave_answered
from lockgate.jobs import JobState
from lockgate.placement import Requirement
from lockgate.scheduler.costs import (
    FairShare,
    cost_after,
    dominant,
    dominant_of_pairs,
    fair_shares_over,
    fraction,
    owed,
    share_after,
    within_target,
)
from lockgate.scheduler.groups import GroupIndex, GroupKey
from lockgate.scheduler.holds import RoomHold
from lockgate.scheduler.pending import PendingJobs
from lockgate.scheduler.records import HeapEntry, JobKind, JobRecord, Shape
from lockgate.scheduler.room import ClusterRoom, exceeds, exceeds_all
from lockgate.scheduler.state import (
    GrowthGathering,
    GrowthRelease,
    QueueRecord,
    RoundTransaction,
    SchedulerState,
)
from lockgate.scheduler.targets import FairTargets

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
    # An elastic group (or a running static one) holds as many members as its maximum allows.
    GROUP_AT_MAX = "group_at_max"
    # Its controller backs off after lockgate gave up on its pods (lockgate.backoff): held out
    # of its queue's line, so only counted (`QueueReport.backing_off`), never looked at.
    BACKING_OFF = "backing_off"
    # No room on the nodes that exist, and its cluster could grow for it, but its queue is not
    # below its fair target there: the cluster does not grow for it (lockgate.growth).
    OVER_SHARE_FOR_GROWTH = "over_share_for_growth"
    # No room on the nodes that exist; its cluster grows, and the next wave of releases for
    # growth waits until the last wave's NodeClaims appear (`GrowthGate.waiting`).
    WAITING_FOR_GROWTH = "waiting_for_growth"
    # Owed room on a node that may exist, but the cluster's releases for growth this round
    # would fill less than one node of its pool: held, owed, until a node's worth is owed or
    # `GrowthPolicy.gather_seconds` pass (`_gather_for_growth`).
    GATHERING_FOR_GROWTH = "gathering_for_growth"


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
    # Skipped more than max_lookback_per_queue jobs in a cluster (each cluster has its own count).
    LOOKBACK_EXCEEDED = "lookback_exceeded"
    ROUND_LIMIT = "round_limit"  # the round reached max_decisions while it still had jobs
    # Its clusters with waiting jobs had as many releases in flight as the round may add to
    # (`release_budget`): it waits for the ungaters to carry some out.
    PACED = "paced"
    CORDONED = "cordoned"
    UNDEFINED = "undefined"  # its jobs name a queue nobody has defined


@dataclass(frozen=True, slots=True)
class GrowthNote:
    """A release for growth: the pod goes to a node that may exist (lockgate.growth), so
    that its cluster grows for it."""

    pool: str  # the NodePool that would make the node
    node: str  # the virtual node it is charged to
    claim: str  # the NodeClaim in flight it waits for ("": a node the pool may still add)
    headroom: PoolHeadroom | None  # the pool's headroom when released
    # The node affinity that makes the pool make the size of node counted (headroom only,
    # `lockgate.growth.smaller_instances`); None: nothing to add.
    avoid: Requirement | None = None
    # Karpenter makes the size of the node it is charged to (`VirtualNode.size_named`): never
    # held to gather a node's worth.
    size_named: bool = False

    def words(self, cluster: str) -> str:
        """"released so that cluster-b grows (NodePool default: headroom cpu=48)"."""
        left = "" if self.headroom is None or not self.headroom.remaining else (
            f": headroom {describe_amounts(self.headroom.remaining)}")
        text = f"released so that {cluster} grows (NodePool {self.pool}{left})"
        if self.claim:
            text += f"; waiting for a node (NodeClaim {self.claim})"
        return text


@dataclass(frozen=True, slots=True)
class Decision:
    """Release `job_id`. `node_hint` is where the round's snapshot placed it (advice only);
    `growth`: it was released for growth (its node hint a node that may exist)."""

    job_id: str
    queue: str
    cluster: str
    node_hint: str
    growth: GrowthNote | None = None


@dataclass(frozen=True, slots=True)
class GrowthGate:
    """Whether a round may release pods for growth into a cluster now (`growth_gate`)."""

    plan: GrowthPlan | None
    stalled: str = ""  # "growth stalled: ..." ("": not stalled)
    waiting: str = ""  # why the next wave waits ("": it need not)

    @property
    def open(self) -> bool:
        return self.plan is not None and not self.stalled and not self.waiting


def growth_gate(state: SchedulerState, cluster: str, *, now: float | None,
                round_number: int | None = None) -> GrowthGate:
    """Whether pods may be released for growth into `cluster` (docs/autoscaling.md): not when
    a NodeClaim of the cluster failed, or a pod released for growth is still unbound
    `stall_after_seconds` after its release (growth stalled); not while the last wave's
    NodeClaims have not appeared (a new claim, or a pool's in_use grew), for at most
    `wave_wait_seconds` (pacing; without a clock, until they appear). Releases of round
    `round_number` itself are one wave."""
    plan = state.growth_plan(cluster)
    if plan is None or not plan.nodes:
        return GrowthGate(plan)
    if plan.failed_claim:
        return GrowthGate(plan, stalled=f"growth stalled: {plan.failed_claim}")
    policy = state.growth_policy
    waiting = ""
    jobs = state.job_records
    for job_id, release in state.growth_releases.items():
        if release.cluster != cluster:
            continue
        age = None if now is None or release.at is None else now - release.at
        if age is not None and age >= policy.stall_after_seconds:
            job = jobs.get(job_id)
            pod = job.pod if job is not None and job.pod else job_id
            return GrowthGate(plan, stalled=(
                f"growth stalled: pod {pod}, released for growth {age:.0f}s ago, is still on "
                f"no node"))
        if (not waiting and release.round != round_number
                and not wave_answered(release.marker, plan.marker)
                and (age is None or age < policy.wave_wait_seconds)):
            waiting = (f"waiting for the NodeClaims of the last wave released for growth "
                       f"(NodePool {release.pool})")
    return GrowthGate(plan, waiting=waiting)


class RoundShares:
    """Every queue's fair-share report after a round (`fair_shares_over`, with the targets the
    round ranked by), worked out when first read: it decides nothing, and at fleet scale it was
    a tenth of the round (1,000 queues), which the leader reads only after publishing."""

    __slots__ = ("_inverse", "_shares", "_state", "_targets")

    def __init__(self, state: SchedulerState, inverse: list[float],
                 targets: FairTargets) -> None:
        self._state = state
        self._inverse = inverse
        self._targets = targets
        self._shares: dict[str, FairShare] | None = None

    def of(self, queue: str) -> FairShare:
        return self.every()[queue]

    def every(self) -> Mapping[str, FairShare]:
        """Every queue's share (those the state holds), worked out once."""
        if self._shares is None:
            self._shares = fair_shares_over(self._state, self._inverse, self._targets)
        return self._shares


@dataclass(frozen=True, slots=True)
class QueueReport:
    """One queue after a round: the answer to "why isn't my job released?"."""

    name: str
    shares: RoundShares  # `share`: after the round's decisions, read when asked
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
    # Clusters it had jobs waiting in that had no release budget left this round (not a lack
    # of room: preemption does not count them).
    paced: tuple[str, ...] = ()

    @property
    def share(self) -> FairShare:
        return self.shares.of(self.name)


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What a round decided (applied to the state through its transaction) and how every queue
    fared.

    `skipped_jobs` names each job the round looked at and passed over, with the reason; jobs
    parked as unschedulable in earlier rounds are only counted, in `QueueReport.unschedulable`.
    """

    decisions: tuple[Decision, ...]
    queues: Mapping[str, QueueReport]
    skipped: Mapping[SkipReason, int]  # totals over all queues
    skipped_jobs: Mapping[str, SkipReason]  # every job the round looked at and did not release
    # Clusters that got no releases because released jobs there fit on no node: job counts.
    overcommitted_clusters: Mapping[str, int]
    # Every queue's share after the round (what its reports read): the explainer of the round's
    # report reads them too, rather than working them out again.
    shares: RoundShares | None = None


def schedule_round(
    state: SchedulerState,
    *,
    max_decisions: int,
    max_lookback_per_queue: int,
    now: float | None = None,
    group_reserve_after_seconds: float | None = None,
    room_hold_seconds: float | None = None,
    room_holds_per_queue: int = 1,
    targets_max_age: float = 0.0,
    adopted_targets_max_age: float | None = None,
    release_budget: Mapping[str, int] | None = None,
    transaction: RoundTransaction | None = None,
) -> RoundResult:
    """Decide which queued jobs to release now, and apply those decisions to `state`.

    The releases go through `transaction` (`SchedulerState.begin_round`), which the caller
    commits once it has recorded them, keeping those it recorded; without one, the round opens
    its own and commits it, keeping every release.

    `max_decisions` caps releases in this round (a pod group is released whole, so a round may
    pass it by the group's size less one); each queue looks past at most
    `max_lookback_per_queue` jobs that do not fit before it drops out of the round.

    A complete pod group that does not fit, and whose newest member is at least
    `group_reserve_after_seconds` older than `now` (epoch seconds), reserves its cluster: no
    other job is released there until the group is (docs/scheduling.md, "Gangs"). Without
    `now`, groups never reserve.

    The order in a contested cluster follows the queues' fair targets there
    (`SchedulerState.fair_targets`, kept at most `targets_max_age` seconds while only amounts
    change; with `adopted_targets_max_age`, the caller keeps them current from another process
    and the round takes the last adopted ones while at most that many seconds old, whatever
    changed since): queues owed room there (below their target there and short of their whole
    target) first, the furthest short of its whole target first (`rank_in_cluster`). A pod of
    a queue owed room that finds no room has room held for it on one node for at most
    `room_hold_seconds` (None: never; needs `now`), so smaller pods cannot take every gap; a
    queue has room held for at most `room_holds_per_queue` of its pods in a cluster at a time
    (1: its next pod).

    `release_budget` caps this round's releases per cluster named in it (the leader gives
    each cluster what its ungaters' backlog may still grow by); a cluster that reaches its cap
    drops out of the round for everyone, in fair order up to there, so a newcomer's pods do
    not wait behind thousands already handed to the ungaters. A pod group is released whole
    once the budget lets its first member go.
    """
    if max_decisions < 0 or max_lookback_per_queue < 0 or room_holds_per_queue < 1:
        raise ValueError("max_decisions and max_lookback_per_queue must not be negative, "
                         "room_holds_per_queue must be 1 or more")
    reserve_before = (None if now is None or group_reserve_after_seconds is None
                      else now - group_reserve_after_seconds)
    own = transaction is None
    releasing = state.begin_round() if transaction is None else transaction
    if releasing.state is not state:
        raise ValueError("the transaction is another state's")
    try:
        result = _Round(state, releasing, max_lookback_per_queue, reserve_before, now=now,
                        hold_seconds=room_hold_seconds, holds_per_queue=room_holds_per_queue,
                        targets_max_age=targets_max_age,
                        adopted_targets_max_age=adopted_targets_max_age,
                        release_budget=release_budget).run(max_decisions)
    except BaseException:
        if own:
            releasing.rollback()
        raise
    if own:
        releasing.commit()
    return result


class _QueueRound:
    """A queue's progress through one round."""

    __slots__ = (
        "clusters",
        "head",
        "looked_past",
        "outcome",
        "over_limit",
        "paced",
        "queue",
        "ranks",
        "released",
        "set_aside",
        "share",
        "skipped",
        "skips",
        "still_open",
    )

    def __init__(self, queue: QueueRecord, share: float) -> None:
        self.queue = queue
        # Its pending jobs per cluster still in play; each one's top is a validated job.
        self.clusters: list[PendingJobs] = []
        self.head: PendingJobs | None = None  # the one whose top goes next
        self.share = share  # dominant share of the allocation, kept current as jobs are taken
        # Jobs looked past per cluster: a queue's lookback is spent cluster by cluster, so jobs
        # that find no room where its pods are pinned do not keep it out of its other clusters.
        self.skips: dict[str, int] = {}
        self.looked_past: list[str] = []  # clusters it looked past max_lookback jobs in
        self.skipped: list[tuple[PendingJobs, HeapEntry]] = []  # popped; pushed back at the end
        # Request shapes that would take the queue over its limits: allocation only grows during
        # a round, so they stay over until it ends.
        self.over_limit: set[Shape] = set()
        self.set_aside: list[str] = []  # clusters with room for none of its pending jobs
        self.paced: list[str] = []  # clusters with jobs of its waiting, out of release budget
        self.released = 0
        self.outcome = QueueOutcome.ALL_CONSIDERED
        # Per cluster, the rank last worked out: for which head entry, at which allocation
        # (jobs allocated, share), and the rank. A rank depends on nothing else that changes in
        # a round, so after a skip only the cluster whose head moved is ranked again.
        self.ranks: dict[str, tuple[HeapEntry, int, float, Rank]] = {}
        # Per cluster, what was true when `_Round._closed_to` last found it still open to the
        # queue: its head entry, and how many shapes were turned down there and for the queue.
        self.still_open: dict[str, tuple[HeapEntry, int, int]] = {}

    def skip(self, pending: PendingJobs, max_lookback: int) -> bool:
        """Count a job looked past in `pending`'s cluster. True when that makes more than
        `max_lookback` there: the cluster leaves the queue's round (its others stay in)."""
        cluster = pending.cluster
        skips = self.skips[cluster] = self.skips.get(cluster, 0) + 1
        if skips <= max_lookback:
            return False
        self.clusters.remove(pending)
        self.looked_past.append(cluster)
        return True

# A queue's rank in a cluster for its next unit; lower goes first (docs/scheduling.md, "Fair
# targets"):
#   (0, how far it has risen after the unit, 0) while the unit keeps it within its target
#       there: in a contested cluster (a queue waiting there is held back: its target is less
#       than it asks), queues owed room there fill in proportion to their whole targets, how
#       far being its fraction of its whole target. Where every queue waiting in the cluster
#       is given all it asks (`uncontested`), the order changes no allocation, only who waits
#       meanwhile: there it goes by cost, as in Armada, how far being its cost over the highest
#       cost any target gives (`FairTargets.top_cost`, so that it compares with the fractions
#       of other clusters). By its fraction of its own target, a queue asking for little (a
#       newcomer's one pod) would wait behind every other queue's backlog;
#   (1, -size of the unit, fraction of its whole target after it) for the unit that carries it
#       past its target there: pods are whole, so someone's last pod rounds up; the biggest go
#       first (small pods fit the gaps a big one leaves, not the other way round), then the
#       queue furthest short overall; it waits while room gathers for a pod of the first tier
#       (`waits_while_room_gathers`);
#   (2, its cost after the unit, 0) otherwise: room nobody is owed goes by cost.
# Ranks 0 and 1 (the queue is owed room there) need both: it holds less than its target in the
# cluster, and its whole allocation is short of its whole target. Its target is judged on its
# total (the split across clusters need not be unique), so a queue that rounded up elsewhere,
# or holds more than its split somewhere, is owed nothing more here.
# Owed, below and within a target are the cost model's (`costs.owed`), shared with preemption
# and explain.
Rank = tuple[int, float, float]


def waits_while_room_gathers(rank: Rank) -> bool:
    """Whether a queue at `rank` in a cluster takes no room there while room gathers for the
    owed (`room_gathers_for`): a queue owed nothing there (the last tier), and one whose next
    unit would carry it past its target there (the middle tier). Rounding up waits for the
    queues still short of their targets: when every queue of small pods took its last pod
    past its target in the gaps that opened, the room went from queues of big pods, which
    stayed a few pods short of theirs (docs/scheduling.md, "Holds")."""
    return rank[0] >= 1


def room_gathers_for(rank: Rank, *, holds: bool, could_use_every_node: bool) -> bool:
    """Whether a pod at `rank` that finds no room in its cluster makes room there gather for
    the queues owed it (docs/scheduling.md, "Holds"): with holds on, a pod of a queue owed room
    there that keeps it within its target (the first tier) and could use any node of the
    cluster once its managed pods end. Queues that `waits_while_room_gathers` there then take
    no room there."""
    return holds and rank[0] == 0 and could_use_every_node


def uncontested(state: SchedulerState, targets: FairTargets, cluster: str) -> bool:
    """Whether every queue with pods waiting in `cluster` is given all it asks for by its
    target (`QueueTarget.capped`): then the round's order there decides only who waits
    meanwhile, not what anyone ends up with, and goes by cost (`rank_in_cluster`)."""
    return cluster not in contested_clusters(state, targets)


def contested_clusters(state: SchedulerState, targets: FairTargets) -> set[str]:
    """The clusters that are not `uncontested`, in one pass over the queues' waiting pods
    (asked cluster by cluster, every queue was looked at once per cluster: 50,000 times a
    round at fleet scale)."""
    contested: set[str] = set()
    for name, queue in state.queue_records.items():
        if not queue.schedulable:
            continue
        target = targets.queues.get(name)
        if target is not None and target.capped:
            continue
        for cluster, pending in queue.pending.items():
            if pending.live:
                contested.add(cluster)
    return contested


def rank_in_cluster(*, before: float, after: float, target: float, cost_after: float,
                    size: float, overall_before: float, overall_after: float,
                    by_cost: bool, top_cost: float) -> Rank:
    """The round's order in a cluster (docs/scheduling.md, "Fair targets"). `before` and
    `after`: the queue's dominant share in the cluster without and with the unit, `size` the
    unit's; `overall_*` its whole allocation without and with the unit over its whole
    target (infinite without one); `by_cost`: the cluster is `uncontested`; `top_cost`: the
    highest cost any queue's target gives."""
    if owed(before=before, target=target, overall_before=overall_before):
        if within_target(after, target):
            risen = cost_after / top_cost if by_cost and top_cost > 0 else overall_after
            return (0, risen, 0.0)
        return (1, -size, overall_after)
    return (2, cost_after, 0.0)


class _Round:
    def __init__(self, state: SchedulerState, transaction: RoundTransaction, max_lookback: int,
                 reserve_before: float | None = None, *, now: float | None = None,
                 hold_seconds: float | None = None, holds_per_queue: int = 1,
                 targets_max_age: float = 0.0, adopted_targets_max_age: float | None = None,
                 release_budget: Mapping[str, int] | None = None) -> None:
        self.state = state
        self.transaction = transaction  # every release goes through it
        # The clusters where some queue waiting is not given all it asks (not `uncontested`),
        # as the round began ranking.
        self._contested: set[str] | None = None
        # Releases each paced cluster may still take this round.
        self.budget: dict[str, int] = dict(release_budget or {})
        self.now = now
        # Room is held for pods below their target only with a clock (holds end in time).
        self.hold_seconds = hold_seconds if now is not None and hold_seconds else None
        self.holds_per_queue = holds_per_queue
        self.targets = state.fair_targets(now=now, max_age=targets_max_age,
                                          adopted_max_age=adopted_targets_max_age)
        self.holds_by_cluster: dict[str, list[RoomHold]] = {}
        # Clusters where a pod of a queue owed room there (rank tier 0: within its target),
        # able to use every node there, found no room this round: queues owed nothing there
        # take no room there after it (docs/scheduling.md, "Holds").
        self.owed_turned_down: set[str] = set()
        # (cluster, queue) -> jobs held for it from earlier rounds the round has not looked at.
        self.unlooked_held: dict[tuple[str, str], set[str]] = {}
        # Per (queue, cluster, shape held): the queue's rank there, and how many jobs it had
        # released when that was worked out (`_yields_to`).
        self.hold_ranks: dict[tuple[str, str, Shape], tuple[int, Rank]] = {}
        # (cluster, queue, shape) -> (rank, releases made) when its held pod last found no
        # room held by others that yield to it (`_place_held`).
        self.found_no_yield: dict[tuple[str, str, Shape], tuple[Rank, int]] = {}
        self.max_lookback = max_lookback
        self.inverse_total = state.fairness_inverse()
        self.clusters: dict[str, ClusterRoom] = {}
        self.queue_rounds: dict[str, _QueueRound] = {}
        self.skipped_jobs: dict[str, SkipReason] = {}
        # The same counted per queue and reason, as the round goes (`_skipped`).
        self.skips_by_queue: dict[str, dict[SkipReason, int]] = {}
        self.groups: GroupIndex = state.groups()
        # A group's members are judged together once per round: why it was not released.
        self.groups_done: dict[GroupKey, SkipReason] = {}
        self.reserve_before = reserve_before
        # (cluster, queue) -> its complete, unstarted groups old enough to reserve; found once,
        # the first time a queue would set a cluster aside.
        self._aged_groups: dict[tuple[str, str], list[GroupKey]] | None = None
        self._reservable: set[str] | None = None  # clusters with such groups (`_may_reserve`)
        # Per autoscaled cluster, whether it may grow this round (`growth_gate`), when first
        # asked.
        self.growth_gates: dict[str, GrowthGate] = {}
        # With a queue tree whose inner nodes have limits (`resource_limits`): per leaf, its
        # limited ancestors and their limit pairs, and what each such subtree holds, kept as
        # the round releases. A leaf's own limit is `queue.limit_pairs`, as before trees.
        self.subtree_limits, self.subtree_held = subtree_limits(state)

    def run(self, max_decisions: int) -> RoundResult:
        state = self.state
        jobs = state.job_records
        inverse = self.inverse_total
        for cluster_name, key in list(self.groups.reserved.items()):
            status = self.groups.status(key)
            owner = state.queue_records.get(key[1])
            if (status is None or not status.complete or status.started or owner is None
                    or not owner.schedulable):
                # Released (or started: its members go alone), gone, no longer whole, or its
                # queue cordoned or undefined: a reservation nobody can use must not hold the
                # cluster.
                del self.groups.reserved[cluster_name]
        self._prepare_holds()
        for name, queue in state.queue_records.items():
            if not queue.schedulable or queue.queued == queue.parked + queue.held:
                continue
            progress = self.queue_rounds[name] = _QueueRound(
                queue, dominant(queue.allocation, inverse)
            )
            for in_cluster in queue.pending.values():
                if in_cluster.live and self._validate_head(progress, in_cluster, fresh=True):
                    progress.clusters.append(in_cluster)
        decisions: list[Decision] = []
        self._reserved_groups_first(decisions, max_decisions)
        candidates: list[tuple[Rank, str, _QueueRound]] = []
        for name, progress in self.queue_rounds.items():
            rank = self._choose_head(progress)
            if rank is None:
                if not progress.released and not progress.set_aside:
                    progress.outcome = QueueOutcome.NOTHING_PENDING
                continue
            candidates.append((rank, name, progress))
        heapq.heapify(candidates)

        max_lookback = self.max_lookback
        while candidates:
            if len(decisions) >= max_decisions:
                for _, _, progress in candidates:
                    progress.outcome = QueueOutcome.ROUND_LIMIT
                break
            popped_rank, name, progress = heapq.heappop(candidates)
            queue = progress.queue
            pending = progress.head
            assert pending is not None  # a candidate always has a head
            entry = pending.top()
            kind = pending.head_kind  # the top's, validated (`_validate_head`)
            assert kind is not None
            cluster = self.clusters[pending.cluster]
            shape = kind.shape
            if pending.cluster in self.owed_turned_down and waits_while_room_gathers(popped_rank):
                # A queue owed room here found none this round: room nobody is owed does not
                # go to others meanwhile, so what frees here gathers for it ("Holds").
                progress.clusters.remove(pending)
                progress.set_aside.append(pending.cluster)
            elif self.budget.get(pending.cluster, 1) <= 0:
                # Its ungaters have as many releases in hand as allowed: the cluster waits for
                # their answers (a later round), for every queue, without spending lookback.
                progress.clusters.remove(pending)
                progress.paced.append(pending.cluster)
            elif cluster.reserved_for is not None:
                # The cluster waits for the group it is reserved for, and that group had its
                # turn this round already (first thing, or when it reserved): nothing else
                # goes there this round. One job says why; the queue sets the cluster aside,
                # without using up its lookback, which is for jobs that could go.
                pending.pop()
                progress.skipped.append((pending, entry))
                why = SkipReason.RESERVED_FOR_GROUP
                if kind.group is not None:  # its own group's reason, if it was judged
                    why = self.groups_done.get((pending.cluster, name, kind.group), why)
                self._skipped(entry[2], name, why)
                progress.clusters.remove(pending)
            elif (
                shape in cluster.rejected or shape in progress.over_limit or cluster.overcommitted
            ) and self._nothing_can_go(progress, pending, cluster) and not self._holds_may_serve(
                    progress.queue, pending.cluster, cluster) and not self._aged_group_unjudged(
                        pending.cluster, name):
                # Everything this queue has waiting in that cluster is of a kind already turned
                # down there this round: set the cluster aside rather than look at each job.
                progress.clusters.remove(pending)
                progress.set_aside.append(pending.cluster)
            elif kind.group is not None and not self.groups.started(
                    (pending.cluster, name, kind.group)):
                job = jobs[entry[2]]
                pending.pop()
                self._looked_at(pending.cluster, name, entry[2])
                # Once judged, a member's unit is itself, not its gang: rank it again.
                progress.ranks.pop(pending.cluster, None)
                reason, counted = self._group_turn(progress, pending, cluster, job, decisions)
                dropped = False
                if reason is None and job.state is _QUEUED:
                    # Its gang (the oldest members) went without it: it joins alone, later.
                    pending.push(entry)
                elif reason is not None:
                    progress.skipped.append((pending, entry))
                    self._skipped(entry[2], name, reason)
                    dropped = counted and progress.skip(pending, max_lookback)
                if not dropped and not self._validate_head(progress, pending):
                    progress.clusters.remove(pending)
            else:
                # A single pod, or a member of a started group: it joins alone (groups.py).
                job = jobs[entry[2]]
                pending.pop()
                self._looked_at(pending.cluster, name, entry[2])
                node = -1
                counted = True
                dropped = False
                if kind.group is not None and self.groups.at_max(
                        (pending.cluster, name, kind.group)):
                    # Waits until a member ends; not a job that could go, so no lookback spent.
                    reason = SkipReason.GROUP_AT_MAX
                    counted = False
                elif (queue.limit_pairs and exceeds(queue.allocation, shape, queue.limit_pairs)
                      ) or (name in self.subtree_limits and self._over_subtree(name, [shape])):
                    reason = SkipReason.QUEUE_LIMIT
                    progress.over_limit.add(shape)
                elif cluster.overcommitted:
                    reason = SkipReason.CLUSTER_OVERCOMMITTED
                elif entry[2] in cluster.hold_node:
                    node = self._place_held(entry[2], name, pending.cluster, cluster, shape,
                                            popped_rank, len(decisions))
                    growth_why = None
                    if node < 0 and cluster.record.virtual_order:
                        node, growth_why = self._place_for_growth(queue, pending.cluster,
                                                                  cluster, shape)
                        if node >= 0:
                            cluster.unhold(entry[2], name, shape)
                    reason = None if node >= 0 else growth_why or SkipReason.NO_NODE_WITH_ROOM
                else:
                    node = cluster.place(shape)
                    growth_why = None
                    if node < 0 and cluster.record.virtual_order:
                        # No room on the nodes that exist: a node that may exist, if the
                        # queue is owed room here and the cluster may grow now.
                        node, growth_why = self._place_for_growth(queue, pending.cluster,
                                                                  cluster, shape)
                    if (node < 0 and growth_why is None and self.hold_seconds is not None
                            and self._maybe_hold(
                                progress, pending, cluster, entry[2], shape,
                                self._yields_to(popped_rank, name, pending.cluster))):
                        # Room held for a queue that ranks after this one is this one's
                        # first: take it now rather than a round later.
                        node = self._place_held(entry[2], name, pending.cluster, cluster,
                                                shape, popped_rank, len(decisions))
                    reason = None if node >= 0 else growth_why or SkipReason.NO_NODE_WITH_ROOM
                if reason is None:
                    hint = cluster.names[node]
                    state.room_holds().end(entry[2])
                    progress.share = share_after(progress.share, queue.allocation, shape.pairs,
                                                 inverse)
                    note, growth = self._growth_release(pending.cluster, cluster, node)
                    self.transaction.release(entry[2], job, hint, growth=growth)
                    if name in self.subtree_limits:
                        self._charge_subtree(name, shape.pairs)
                    decisions.append(Decision(entry[2], name, pending.cluster, hint, note))
                    self._spend(pending.cluster, 1)
                    progress.released += 1
                else:
                    progress.skipped.append((pending, entry))
                    self._skipped(entry[2], name, reason)
                    if (reason is SkipReason.NO_NODE_WITH_ROOM
                            and pending.cluster not in self.owed_turned_down
                            and room_gathers_for(
                                popped_rank, holds=self.hold_seconds is not None,
                                could_use_every_node=cluster.could_use_every_node(shape))):
                        self.owed_turned_down.add(pending.cluster)
                    dropped = counted and progress.skip(pending, max_lookback)
                if not dropped and not self._validate_head(progress, pending):
                    progress.clusters.remove(pending)
            rank = self._choose_head(progress)
            if rank is None:
                continue
            heapq.heappush(candidates, (rank, name, progress))

        for progress in self.queue_rounds.values():
            for pending, entry in progress.skipped:
                pending.push(entry)
            for pending, _ in progress.skipped:
                self._keep_head(pending)
        decisions = self._gather_for_growth(decisions)
        return self._result(decisions)

    def _gather_for_growth(self, decisions: list[Decision]) -> list[Decision]:
        """Hold a cluster's releases for growth onto nodes its pools may still add when
        together they fill less than one node of the pool (the biggest its headroom holds, in
        any resource that node has), until they do or `GrowthPolicy.gather_seconds` passed
        since the first was held: Karpenter makes nodes the size of its batches, so a few pods
        released as they arrive make small nodes where one big one would hold them all. Held
        pods are taken back (queued again, in their place, still owed) and said to gather
        (`SkipReason.GATHERING_FOR_GROWTH`). A gang goes whole or waits whole. Releases onto
        NodeClaims in flight are never held (their node is coming anyway). Without a clock,
        nothing is held."""
        state = self.state
        gathering = state.growth_gathering
        policy = state.growth_policy
        by_cluster: dict[str, list[Decision]] = {}
        for decision in decisions:
            if decision.growth is not None and not decision.growth.claim \
                    and not decision.growth.size_named:
                by_cluster.setdefault(decision.cluster, []).append(decision)
        for cluster_name in [c for c in gathering if c not in by_cluster]:
            del gathering[cluster_name]  # nothing owed for growth there this round
        if not by_cluster or self.now is None or policy.gather_seconds <= 0:
            gathering.clear()
            return decisions
        jobs = state.job_records
        axes = state.axis_names
        held: set[str] = set()
        for cluster_name, growing in by_cluster.items():
            plan = state.growth_plan(cluster_name)
            since = gathering.get(cluster_name)
            if plan is None or (since is not None
                                and self.now - since.since >= policy.gather_seconds):
                gathering.pop(cluster_name, None)
                continue
            pools = {d.growth.pool for d in growing if d.growth is not None}
            node = max((v for v in plan.nodes if not v.claim and v.pool in pools),
                       key=lambda v: (v.allocatable.get("cpu", 0),
                                      v.allocatable.get("memory", 0)), default=None)
            owed: dict[str, int] = {}
            for decision in growing:
                for axis, amount in jobs[decision.job_id].shape.pairs:
                    owed[axes[axis]] = owed.get(axes[axis], 0) + amount
            if node is None:
                gathering.pop(cluster_name, None)
                continue
            sizes = {resource: size for resource, size in node.allocatable.items() if size > 0}
            # Whole nodes' worth owed, in the resource that fills first.
            whole = max((owed.get(resource, 0) // size for resource, size in sizes.items()),
                        default=0)
            waiting = growing
            if whole > 0:
                # Those that fill `whole` nodes go (in release order, a gang as one); the
                # rest, less than a node, are gathered anew.
                going: dict[str, int] = {}
                units = _growth_units(growing, jobs)
                cut = len(units)
                for index, unit in enumerate(units):
                    after = dict(going)
                    for decision in unit:
                        for axis, amount in jobs[decision.job_id].shape.pairs:
                            after[axes[axis]] = after.get(axes[axis], 0) + amount
                    if any(after.get(r, 0) > whole * size for r, size in sizes.items()):
                        cut = index
                        break
                    going = after
                waiting = [decision for unit in units[cut:] for decision in unit]
                since = None
                owed = {r: owed[r] - going.get(r, 0) for r in owed}
            if not waiting:
                gathering.pop(cluster_name, None)  # whole nodes' worth: they go now
                continue
            started = self.now if since is None else since.since
            gathering[cluster_name] = GrowthGathering(since=started, words=(
                f"waiting to fill a node of the pool (NodePool {node.pool}): "
                f"{_owed_of(owed, node.allocatable)} owed; released by "
                f"{policy.gather_seconds - (self.now - started):.0f}s at the latest"))
            held.update(d.job_id for d in waiting)
        if not held:
            return decisions
        # A gang waits whole: its members released this round onto nodes that exist too.
        gangs = {(jobs[j].cluster, jobs[j].queue, jobs[j].group) for j in held
                 if jobs[j].group is not None}
        if gangs:
            held.update(d.job_id for d in decisions
                        if jobs[d.job_id].group is not None
                        and (d.cluster, d.queue, jobs[d.job_id].group) in gangs)
        self.transaction.take_back(held)
        kept: list[Decision] = []
        for decision in decisions:
            if decision.job_id in held:
                self._skipped(decision.job_id, decision.queue,
                              SkipReason.GATHERING_FOR_GROWTH)
                progress = self.queue_rounds.get(decision.queue)
                if progress is not None:
                    progress.released -= 1
            else:
                kept.append(decision)
        return kept

    def _keep_head(self, pending: PendingJobs) -> None:
        """After the round pushed back the jobs it passed over: keep the one at the top as
        the head the next round starts from (`_validate_head`), as the state holds it."""
        entry = pending.top()
        if entry is pending.head:
            return
        job = self.state.job_records.get(entry[2])
        kind = None if job is None else job.kind
        if (job is not None and kind is not None and job.entry is entry
                and entry[2] in self.skipped_jobs and kind.state is _QUEUED
                and not kind.parked and not kind.held):
            pending.keep_head(entry, kind)
        else:
            pending.keep_head(None, None)

    def _skipped(self, job_id: str, queue: str, reason: SkipReason) -> None:
        """The round looked at a job of `queue` and passed it over, for `reason`."""
        counts = self.skips_by_queue.get(queue)
        if counts is None:
            counts = self.skips_by_queue[queue] = {}
        earlier = self.skipped_jobs.get(job_id)
        if earlier is not None:
            counts[earlier] -= 1
        self.skipped_jobs[job_id] = reason
        counts[reason] = counts.get(reason, 0) + 1

    def _spend(self, cluster: str, releases: int) -> None:
        left = self.budget.get(cluster)
        if left is not None:
            self.budget[cluster] = left - releases

    def _choose_head(self, progress: _QueueRound) -> Rank | None:
        """The queue's next unit: in the cluster where its rank is lowest (then in release
        order); None when it has nothing left in play."""
        clusters = progress.clusters
        best: tuple[Rank, HeapEntry] | None = None
        ranks = progress.ranks
        closed: list[PendingJobs] | None = None
        allocated, share = progress.queue.allocated, progress.share
        for pending in clusters:
            entry = pending.top()
            if self._closed_to(progress, pending, entry):
                if closed is None:
                    closed = []
                closed.append(pending)
                continue
            known = ranks.get(pending.cluster)
            if (known is not None and known[0] is entry and known[1] == allocated
                    and known[2] == share):
                rank = known[3]
            else:
                kind = pending.head_kind
                assert kind is not None  # the top is validated
                rank = self.rank(progress, pending.cluster, self._unit_pairs(pending, kind))
                ranks[pending.cluster] = (entry, allocated, share, rank)
            if best is None or (rank, entry) < best:
                best = (rank, entry)
                progress.head = pending
        if closed is not None:
            for pending in closed:
                clusters.remove(pending)
                progress.set_aside.append(pending.cluster)
        if best is None:
            progress.head = None
            if progress.looked_past:
                progress.outcome = QueueOutcome.LOOKBACK_EXCEEDED
            elif progress.set_aside:
                progress.outcome = QueueOutcome.NOTHING_FITS
            elif progress.paced:
                progress.outcome = QueueOutcome.PACED
            return None
        return best[0]

    def _closed_to(self, progress: _QueueRound, pending: PendingJobs, entry: HeapEntry) -> bool:
        """Whether `run` would set the cluster aside for the queue when it comes up, because
        every kind of job it waits with there was turned down (and holds cannot serve it): it
        is set aside now, without a trip through the candidates' heap. At fleet scale most of
        a round's ~4,000 trips (1,000 queues, 4 clusters each) ended so.

        What decides that only moves one way in a round: shapes are only ever turned down
        (for the cluster or the queue), holds only stop serving the queue there (its shares
        only grow, and only its own turns there change its holds), aged groups only get
        judged. Not where something else could come first when it comes up: a cluster with a
        release budget (it may run out: paced), or one a group holds or may reserve this
        round (`run` would skip a job for the group)."""
        name = pending.cluster
        cluster = self.clusters[name]
        over_limit = progress.over_limit
        rejected = cluster.rejected
        if not (rejected or over_limit or cluster.overcommitted):
            return False
        seen = progress.still_open.get(name)
        if (seen is not None and seen[0] is entry and seen[1] == len(rejected)
                and seen[2] == len(over_limit)):
            return False  # nothing turned down since it was found open
        kind = pending.head_kind
        assert kind is not None  # the top is validated
        shape = kind.shape
        if (
            (shape in rejected or shape in over_limit or cluster.overcommitted)
            and name not in self.budget
            and cluster.reserved_for is None
            and not self._may_reserve(name)
            and self._nothing_can_go(progress, pending, cluster)
            and not self._holds_may_serve(progress.queue, name, cluster)
            and not self._aged_group_unjudged(name, progress.queue.name)
        ):
            return True
        progress.still_open[name] = (entry, len(rejected), len(over_limit))
        return False

    def _may_reserve(self, cluster_name: str) -> bool:
        """Whether a group old enough to reserve the cluster waits there (any queue's)."""
        if self._reservable is None:
            self._reservable = {cluster for cluster, _ in self._aged()}
        return cluster_name in self._reservable

    def target_in(self, queue: str, cluster: str) -> float:
        target = self.targets.queues.get(queue)
        return 0.0 if target is None else target.in_cluster(cluster)

    def share_in(self, queue: QueueRecord, cluster: str, pairs: tuple[tuple[int, int], ...],
                 extra: list[int] | None = None) -> float:
        """The dominant share of what the queue holds in `cluster`, plus `pairs` (and
        `extra`, a dense vector), against the pool."""
        inverse = self.inverse_total
        held = queue.alloc_in.get(cluster)
        if held is not None and extra is None:
            # Only the axes taken can rise (costs.share_after): no copy of the vector.
            return share_after(dominant(held, inverse), held, pairs, inverse)
        total = [0] * len(inverse) if held is None else held[:]
        if extra is not None:
            for axis, amount in enumerate(extra):
                total[axis] += amount
        for axis, amount in pairs:
            total[axis] += amount
        return dominant(total, inverse)

    def owes(self, queue: QueueRecord, cluster: str, held: list[int] | None) -> bool:
        """Whether the round owes the queue room in `cluster` (`owed`), counting room `held`
        for it there (a dense vector) as its."""
        inverse = self.inverse_total
        whole = self.targets.queues.get(queue.name)
        total = queue.allocation if held is None else [
            a + h for a, h in zip(queue.allocation, held, strict=True)]
        return owed(before=self.share_in(queue, cluster, (), held),
                    target=self.target_in(queue.name, cluster),
                    overall_before=fraction(dominant(total, inverse),
                                             0.0 if whole is None else whole.share))

    def rank(self, progress: _QueueRound, cluster: str,
             pairs: tuple[tuple[int, int], ...]) -> Rank:
        queue = progress.queue
        inverse = self.inverse_total
        whole = self.targets.queues.get(queue.name)
        whole_share = 0.0 if whole is None else whole.share
        after = share_after(progress.share, queue.allocation, pairs, inverse)
        contested = self._contested
        if contested is None:
            contested = self._contested = contested_clusters(self.state, self.targets)
        by_cost = cluster not in contested
        size = dominant_of_pairs(pairs, inverse)
        # What it holds in the cluster, without and with the unit (`share_in`, inlined: this
        # runs for every cluster of a queue each time it releases).
        held = queue.alloc_in.get(cluster)
        if held is None:
            before, in_cluster_after = 0.0, size
        else:
            before = dominant(held, inverse)
            in_cluster_after = share_after(before, held, pairs, inverse)
        return rank_in_cluster(before=before, after=in_cluster_after,
                               target=0.0 if whole is None else whole.in_cluster(cluster),
                               cost_after=self._cost_after(progress, pairs), size=size,
                               overall_before=fraction(progress.share, whole_share),
                               overall_after=fraction(after, whole_share), by_cost=by_cost,
                               top_cost=self.targets.top_cost)

    def _prepare_holds(self) -> None:
        """Keep the holds that still serve a pod below its queue's target, oldest first;
        end the others (expired ones remember their node as tried)."""
        holds = self.state.room_holds()
        if not len(holds):
            return
        if self.hold_seconds is None or self.now is None:
            for hold in holds:
                holds.end(hold.job_id)
            return
        jobs = self.state.job_records
        queues = self.state.queue_records
        taken: dict[tuple[str, str], list[int]] = {}
        count: dict[tuple[str, str], int] = {}
        for hold in sorted(holds, key=lambda h: h.seq):
            job = jobs.get(hold.job_id)
            queue = queues.get(hold.queue)
            cluster = self.state.cluster_records.get(hold.cluster)
            if hold.until <= self.now:
                holds.end(hold.job_id, expired=True)
                continue
            if (job is None or job.state is not _QUEUED or job.parked or job.held
                    or job.queue != hold.queue or job.cluster != hold.cluster
                    or (job.group is not None and not self._joins_alone(job))
                    or queue is None or not queue.schedulable
                    or cluster is None or hold.node not in cluster.nodes
                    or not cluster.nodes[hold.node].info.schedulable):
                holds.end(hold.job_id)
                continue
            held = taken.setdefault((hold.queue, hold.cluster), [0] * len(self.inverse_total))
            kept = count.get((hold.queue, hold.cluster), 0)
            if kept >= self.holds_per_queue:
                holds.end(hold.job_id)  # beyond how many a queue may hold (the oldest stay)
                continue
            if not self.owes(queue, hold.cluster, held):
                holds.end(hold.job_id)  # its queue no longer needs that much to reach it
                continue
            _add_pairs_to(held, job.shape.pairs)
            count[(hold.queue, hold.cluster)] = kept + 1
            self.holds_by_cluster.setdefault(hold.cluster, []).append(hold)

    def _joins_alone(self, job: JobRecord) -> bool:
        """A member of a started group below its maximum: a unit of its own, like a single
        pod, which room may be held for (docs/scheduling.md, "Elastic groups")."""
        assert job.group is not None
        key = (job.cluster, job.queue, job.group)
        return self.groups.started(key) and not self.groups.at_max(key)

    def _yields_to(self, rank: Rank, name: str, cluster: str) -> Callable[[str, Shape], bool]:
        """Whether a hold of another queue's in `cluster` yields to queue `name`, which the
        round serves now at `rank`: its queue ranks after `name` for the pod held (the
        round's heap order, rank then name). Holds on a node are served in that order."""
        mine = (rank, name)
        ranks = self.hold_ranks

        def yields(other: str, shape: Shape) -> bool:
            progress = self.queue_rounds.get(other)
            if progress is None:
                return True
            # A queue's rank moves only when it takes room: keep it until then.
            known = ranks.get((other, cluster, shape))
            if known is None or known[0] != progress.released:
                known = ranks[(other, cluster, shape)] = (
                    progress.released, self.rank(progress, cluster, shape.pairs))
            return (known[1], other) > mine

        return yields

    def _place_held(self, job_id: str, name: str, cluster_name: str, cluster: ClusterRoom,
                    shape: Shape, rank: Rank, released: int) -> int:
        """`ClusterRoom.place_held` for a held pod of queue `name` served at `rank`, when the
        round has made `released` releases. Room held by queues that yield to it on other
        nodes is looked for only if something changed since a pod of its queue and shape
        last found none there: nobody took room since (yields move only when a queue takes
        room, and room only shrinks in a round) at the same rank means the same answer. A
        queue with 50 held pods looked at in a row looks once, not 50 times."""
        key = (cluster_name, name, shape)
        stamp = (rank, released)
        elsewhere = self.found_no_yield.get(key) != stamp
        node = cluster.place_held(job_id, name, shape, self._yields_to(rank, name, cluster_name),
                                  elsewhere=elsewhere)
        if node < 0 and elsewhere:
            self.found_no_yield[key] = stamp
        return node

    def _looked_at(self, cluster: str, queue: str, job_id: str) -> None:
        if self.unlooked_held:
            unlooked = self.unlooked_held.get((cluster, queue))
            if unlooked:
                unlooked.discard(job_id)

    def _holds_may_serve(self, queue: QueueRecord, cluster_name: str,
                         cluster: ClusterRoom) -> bool:
        """Whether holds may still release one of the queue's jobs in the cluster this round
        although every shape it has waiting there was turned down: a job of its held from an
        earlier round not looked at yet (its node's held room is its first), or room it is
        still owed there counting what is held for it (its next job may get a hold, and take
        it at once). Otherwise the cluster is set aside for it: without this every queue with
        a hold looked past its whole lookback there, every round (about 2,300 pods a round to
        release 40 in the fleet simulator at scale 0.05)."""
        held = cluster.held_by.get(queue.name)
        if held is None or not any(held):
            return False
        return bool(self.unlooked_held.get((cluster_name, queue.name))) or (
            cluster.holds_of.get(queue.name, 0) < self.holds_per_queue
            and self.owes(queue, cluster_name, held))

    def _maybe_hold(self, progress: _QueueRound, pending: PendingJobs, cluster: ClusterRoom,
                    job_id: str, shape: Shape, yields: Callable[[str, Shape], bool]) -> bool:
        """A pod found no room: if the round owes its queue room in this cluster, counting
        what it holds already (`owes`), hold room for it (lockgate.scheduler.holds), on the
        node closest to having room for it counting what queues that rank after it hold
        there. Returns whether it holds."""
        queue = progress.queue
        if cluster.holds_of.get(queue.name, 0) >= self.holds_per_queue or not self.owes(
                queue, pending.cluster, cluster.held_by.get(queue.name)):
            return False
        assert self.now is not None and self.hold_seconds is not None
        holds = self.state.room_holds()
        node = cluster.hold(job_id, queue.name, shape, len(self.inverse_total),
                            avoid=holds.tried(job_id), inverse_total=self.inverse_total,
                            yields=yields)
        if node < 0:
            return False
        holds.hold(job_id=job_id, queue=queue.name, cluster=pending.cluster,
                   node=cluster.names[node], now=self.now, seconds=self.hold_seconds)
        return True

    def _reserved_groups_first(self, decisions: list[Decision], max_decisions: int) -> None:
        """Give every group a cluster is reserved for its turn, before progressive filling.

        The reservation was its place in the fair order: nothing else goes in its cluster
        until it does, so going first takes no room there from anyone. Waiting for its
        queue's turn instead, behind that queue's jobs there (which wait on the reservation
        too) or its lookback spent elsewhere, it could miss room it fits in, round after
        round, while its cluster drained empty.
        """
        for cluster_name, key in list(self.groups.reserved.items()):
            if len(decisions) >= max_decisions:
                return
            if self.budget.get(cluster_name, 1) <= 0:
                continue  # keeps its reservation; its turn comes when the cluster has budget
            progress = self.queue_rounds.get(key[1])
            pending = None if progress is None else next(
                (p for p in progress.clusters if p.cluster == cluster_name), None)
            members = self.groups.queued_members(key)
            if progress is None or pending is None or not members:
                # None of its members is in play (parked, or its controller backs off): room
                # cannot help it, so the reservation must not hold the cluster.
                del self.groups.reserved[cluster_name]
                room = self.clusters.get(cluster_name)
                if room is not None:
                    room.reserved_for = None
                continue
            cluster = self.clusters[cluster_name]
            first = self.state.job_records[members[0]]
            reason, _ = self._group_turn(progress, pending, cluster, first, decisions)
            if reason is None and not self._validate_head(progress, pending):
                progress.clusters.remove(pending)

    def _group_turn(self, progress: _QueueRound, pending: PendingJobs, cluster: ClusterRoom,
                    job: JobRecord, decisions: list[Decision]) -> tuple[SkipReason | None, bool]:

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
        jobs = self.state.job_records
        member_ids = self.groups.gang(key)  # its minimum, oldest first; later ones go alone
        members = [jobs[member] for member in member_ids]
        shapes = [member.shape for member in members]
        reason: SkipReason | None = None
        if status is None or not status.complete:
            reason = SkipReason.GROUP_INCOMPLETE
        elif any(member.held for member in members):
            reason = SkipReason.BACKING_OFF
        elif any(member.parked for member in members):
            reason = SkipReason.TOO_BIG_FOR_ANY_NODE
        elif (queue.limit_pairs and exceeds_all(queue.allocation, shapes, queue.limit_pairs)
              ) or (queue.name in self.subtree_limits and self._over_subtree(queue.name, shapes)):
            reason = SkipReason.QUEUE_LIMIT
        elif cluster.overcommitted:
            reason = SkipReason.CLUSTER_OVERCOMMITTED
        elif not cluster.fits_empty(shapes, self.inverse_total):
            reason = SkipReason.GROUP_TOO_BIG
        else:
            nodes = cluster.place_all(shapes, self.inverse_total)
            growth_reason: SkipReason | None = None
            if nodes is None and cluster.record.virtual_order:
                # A gang released for growth goes in one round: the autoscaler sees its pods
                # within one batch window and makes their nodes together.
                growth_reason = self._growth_refused(queue, pending.cluster)
                if growth_reason is None:
                    nodes = cluster.place_all(shapes, self.inverse_total, growth=True)
            if nodes is None:
                reason = growth_reason or SkipReason.NO_NODE_WITH_ROOM
                if (cluster.reserved_for is None and self.reserve_before is not None
                        and status.last_created_at <= self.reserve_before):
                    # It waited long enough behind smaller jobs: hold every gap that opens
                    # in this cluster for it from now on.
                    cluster.reserved_for = self.groups.reserved[pending.cluster] = key
            else:
                inverse = self.inverse_total
                for member_id, member, node in zip(member_ids, members, nodes, strict=True):
                    hint = cluster.names[node]
                    progress.share = share_after(progress.share, queue.allocation,
                                                 member.shape.pairs, inverse)
                    note, growth = self._growth_release(pending.cluster, cluster, node)
                    self.transaction.release(member_id, member, hint, growth=growth)
                    if queue.name in self.subtree_limits:
                        self._charge_subtree(queue.name, member.shape.pairs)
                    decisions.append(Decision(member_id, queue.name, pending.cluster, hint,
                                              note))
                    progress.released += 1
                self._spend(pending.cluster, len(member_ids))
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

    def _over_subtree(self, leaf: str, shapes: list[Shape]) -> bool:
        """Whether releasing `shapes` of `leaf` takes a subtree above it past its limit."""
        return any(exceeds_all(self.subtree_held[node], shapes, pairs)
                   for node, pairs in self.subtree_limits[leaf])

    def _charge_subtree(self, leaf: str, pairs: tuple[tuple[int, int], ...]) -> None:
        for node, _ in self.subtree_limits[leaf]:
            _add_pairs_to(self.subtree_held[node], pairs)

    def _unit_pairs(self, pending: PendingJobs, job: JobKind) -> tuple[tuple[int, int], ...]:
        """What taking the queue's next unit costs: the job, or its group's gang (the members
        released together; a started group's member goes alone)."""
        if job.group is None:
            return job.shape.pairs
        key = (pending.cluster, job.queue, job.group)
        if key in self.groups_done:
            return job.shape.pairs  # judged already: it only passes through
        total: dict[int, int] = {}
        jobs = self.state.job_records
        for member in self.groups.gang(key):
            for axis, amount in jobs[member].shape.pairs:
                total[axis] = total.get(axis, 0) + amount
        return tuple(sorted(total.items())) or job.shape.pairs

    def _aged_group_unjudged(self, cluster_name: str, queue_name: str) -> bool:
        """Whether the queue has a group in the cluster that aged enough to reserve it and has
        not had its turn this round. Such a queue must not set the cluster aside because a pod
        of the same shape was turned down there: a group waits for room its size, not a gap,
        and only its own turn can reserve it (else a stream of small pods starves it)."""
        return any(key not in self.groups_done
                   for key in self._aged().get((cluster_name, queue_name), ()))

    def _aged(self) -> dict[tuple[str, str], list[GroupKey]]:
        """(cluster, queue) -> its complete, unstarted groups old enough to reserve the
        cluster (none without `reserve_before`); found once a round, when first asked."""
        if self._aged_groups is None:
            aged: dict[tuple[str, str], list[GroupKey]] = {}
            if self.reserve_before is not None:
                for status in self.groups.waiting():
                    if (status.complete and not status.started
                            and status.last_created_at <= self.reserve_before):
                        aged.setdefault((status.key[0], status.key[1]), []).append(status.key)
            self._aged_groups = aged
        return self._aged_groups

    def _growth_refused(self, queue: QueueRecord, cluster_name: str) -> SkipReason | None:
        """Why the round may not release the queue's next unit for growth in the cluster now
        (None: it may). Only a queue owed room there (`owes`: below its fair target in the
        cluster and overall, the cost model's one rule) is released for growth: the cluster
        never grows for a queue at or over its share."""
        gate = self.growth_gates.get(cluster_name)
        if gate is None:
            gate = self.growth_gates[cluster_name] = growth_gate(
                self.state, cluster_name, now=self.now, round_number=self.transaction.number)
        if gate.stalled:
            return SkipReason.NO_NODE_WITH_ROOM
        if gate.waiting:
            return SkipReason.WAITING_FOR_GROWTH
        if gate.plan is None or not self.owes(queue, cluster_name, None):
            return SkipReason.OVER_SHARE_FOR_GROWTH
        return None

    def _place_for_growth(self, queue: QueueRecord, cluster_name: str, cluster: ClusterRoom,
                          shape: Shape) -> tuple[int, SkipReason | None]:
        """Place a pod that found no room on the real nodes on a node that may exist, if the
        round may release it for growth (`_growth_refused`): the node's index (-1: none), and
        why the cluster does not grow for it when a node that may exist could take it (None:
        no such reason, the pod waits for room as any other)."""
        refused = self._growth_refused(queue, cluster_name)
        if refused is None:
            return cluster.place_growth(shape), None
        if refused is not SkipReason.NO_NODE_WITH_ROOM and cluster.fits_growth(shape):
            return -1, refused
        return -1, None

    def _growth_release(self, cluster_name: str, cluster: ClusterRoom, node: int,
                        ) -> tuple[GrowthNote | None, GrowthRelease | None]:
        """What a release onto `node` says and keeps when the node may exist; (None, None)
        for a real node."""
        if not cluster.record.virtual_order or not cluster.is_virtual(node):
            return None, None
        gate = self.growth_gates[cluster_name]
        assert gate.plan is not None
        name = cluster.names[node]
        virtual = next(v for v in gate.plan.nodes if v.name == name)
        note = GrowthNote(pool=virtual.pool, node=name, claim=virtual.claim,
                          headroom=gate.plan.headroom(virtual.pool), avoid=virtual.avoid,
                          size_named=virtual.size_named)
        return note, GrowthRelease(cluster=cluster_name, pool=virtual.pool, node=name,
                                   claim=virtual.claim, at=self.now,
                                   round=self.transaction.number, marker=gate.plan.marker)

    def _nothing_can_go(self, progress: _QueueRound, pending: PendingJobs,
                        cluster: ClusterRoom) -> bool:
        """Whether every kind of job the queue has waiting in this cluster was turned down
        (on the real nodes, and, where the cluster may grow for the queue, on the nodes that
        may exist). Monotone in a round, as `_closed_to` needs: the queue's share only grows
        (so it is owed less), the room on nodes that may exist only shrinks, and whether the
        cluster may grow is decided once a round."""
        if cluster.overcommitted:
            return True
        shapes = pending.shapes
        if len(shapes) > _SET_ASIDE_SHAPE_SCAN:
            return False
        if (cluster.record.virtual_order
                and self._growth_refused(progress.queue, pending.cluster) is None
                and any(cluster.fits_growth(shape) for shape in shapes)):
            return False  # turned down on the real nodes, it may go to a node that may exist
        no_room = cluster.rejected
        over_limit = progress.over_limit
        return all(
            shape in no_room or shape in over_limit or not cluster.fits_some_node(shape)
            for shape in shapes
        )

    def _validate_head(self, progress: _QueueRound, pending: PendingJobs, *,
                       fresh: bool = False) -> bool:
        """Make the heap's top a job the round may consider: drop stale entries and park jobs
        too big for every node of their cluster. False when nothing is left. Keeps the top as
        `pending.head` (and its kind).

        `fresh`: the round has not looked at this queue's jobs in the cluster yet. Then a head
        an earlier round validated whose job has not changed since (`PendingJobs.head`) is
        taken as it is: the state forgets it when its job changes."""
        jobs = self.state.job_records
        name = progress.queue.name
        cluster_name = pending.cluster
        skipped_jobs = self.skipped_jobs
        entry = pending.first()
        if fresh and entry is not None and entry is pending.head and pending.head_kind is not None:
            if self._fits_cluster(cluster_name, pending.head_kind.shape):
                return True
            pending.keep_head(None, None)
        while entry is not None:
            job = jobs.get(entry[2])
            kind = None if job is None else job.kind  # the fields, without the properties
            if (
                job is None
                or kind is None
                or kind.state is not _QUEUED
                or kind.parked
                or kind.held
                or kind.queue != name
                or kind.cluster != cluster_name
                or job.entry[0] != entry[0]
                or job.entry[1] != entry[1]
                or entry[2] in skipped_jobs  # a second entry for a job already looked at
            ):
                pending.pop()
                entry = pending.first()
                continue
            if not self._fits_cluster(cluster_name, kind.shape):
                cluster = self.clusters[cluster_name]
                pending.pop()
                self.state.park(progress.queue, pending, job, entry)
                self._skipped(
                    entry[2], name,
                    SkipReason.NO_SCHEDULABLE_NODES if not cluster.sizes
                    else SkipReason.NO_MATCHING_NODE if not cluster.nodes_for_shape(job.shape)
                    else SkipReason.TOO_BIG_FOR_ANY_NODE,
                )
                entry = pending.first()
                continue
            # Kept only as the job's own entry: the state forgets it when the job changes.
            pending.keep_head(entry if job.entry is entry else None, kind)
            return True
        return False

    def _fits_cluster(self, cluster_name: str, shape: Shape) -> bool:
        """`ClusterRoom.fits_some_node` in the cluster's room for this round (made when the
        round first looks at a job there)."""
        cluster = self.clusters.get(cluster_name)
        if cluster is None:
            jobs = self.state.job_records
            cluster = self.clusters[cluster_name] = ClusterRoom(
                self.state.cluster_records[cluster_name], self.inverse_total,
                self.groups.reserved.get(cluster_name),
            )
            index = cluster.record.positions
            for hold in self.holds_by_cluster.get(cluster_name, ()):
                cluster.hold(hold.job_id, hold.queue, jobs[hold.job_id].shape,
                             len(self.inverse_total), node=index[hold.node])
                self.unlooked_held.setdefault((cluster_name, hold.queue), set()).add(
                    hold.job_id)
        return cluster.fits_some_node(shape)

    def _cost_after(self, progress: _QueueRound, pairs: tuple[tuple[int, int], ...]) -> float:
        """The queue's cost once it takes `pairs` (its next unit): what the round ranks by."""
        queue = progress.queue
        return cost_after(progress.share, queue.allocation, pairs, self.inverse_total,
                          queue.priority_factor)

    def _result(self, decisions: list[Decision]) -> RoundResult:
        shares = RoundShares(self.state, self.inverse_total, self.targets)
        totals: dict[SkipReason, int] = {}
        # Counted as jobs were passed over: looking a few thousand up among a million jobs
        # here was a tenth of a round at fleet scale (scattered in memory).
        per_queue = {name: {reason: count for reason, count in counts.items() if count}
                     for name, counts in self.skips_by_queue.items()}
        for counts in per_queue.values():
            for reason, count in counts.items():
                totals[reason] = totals.get(reason, 0) + count
        backing_off = SkipReason.BACKING_OFF
        for name, queue in self.state.queue_records.items():
            if queue.held:  # skipped without being looked at, as parked jobs are
                counts = per_queue.setdefault(name, {})
                counts[backing_off] = counts.get(backing_off, 0) + queue.held
                totals[backing_off] = totals.get(backing_off, 0) + queue.held
        reports: dict[str, QueueReport] = {}
        for name, queue in self.state.queue_records.items():
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
                name=name,
                shares=shares,
                queued=queue.queued,
                unschedulable=queue.parked,
                allocated=queue.allocated,
                released=0 if progress is None else progress.released,
                skipped=per_queue.get(name, {}),
                outcome=outcome,
                set_aside=() if progress is None else tuple(sorted(progress.set_aside)),
                paced=() if progress is None else tuple(sorted(progress.paced)),
                backing_off=queue.held,
            )
        return RoundResult(
            decisions=tuple(decisions),
            shares=shares,
            queues=reports,
            skipped=totals,
            skipped_jobs=self.skipped_jobs,
            overcommitted_clusters={
                name: cluster.overcommitted
                for name, cluster in self.clusters.items()
                if cluster.overcommitted
            },
        )


def _growth_units(growing: list[Decision], jobs: Mapping[str, JobRecord]) -> list[list[Decision]]:
    """A cluster's releases for growth in release order, a gang's members together (at its
    first member's place): what gathering keeps or holds as one."""
    units: list[list[Decision]] = []
    gang_units: dict[tuple[str, str, str], list[Decision]] = {}
    for decision in growing:
        group = jobs[decision.job_id].group
        if group is None:
            units.append([decision])
            continue
        key = (decision.cluster, decision.queue, group)
        unit = gang_units.get(key)
        if unit is None:
            unit = gang_units[key] = []
            units.append(unit)
        unit.append(decision)
    return units


def _owed_of(owed: Mapping[str, int], node: Mapping[str, int]) -> str:
    """"3 of 16 cpu" (cpu, when the node has it; else its first resource)."""
    resource = "cpu" if node.get("cpu", 0) > 0 else min(node)
    amount, size = owed.get(resource, 0), node[resource]
    if resource == "cpu":
        return f"{amount / 1000:g} of {size / 1000:g} cpu"
    return f"{describe_amounts({resource: amount})} of {describe_amounts({resource: size})}"


def subtree_limits(state: SchedulerState) -> tuple[
        dict[str, list[tuple[str, tuple[tuple[int, int], ...]]]], dict[str, list[int]]]:
    """The round's view of inner nodes' limits (a queue tree's `resource_limits` on a node
    with children: what its subtree's pods never hold more of, borrowing included): per leaf,
    its limited ancestors with their limit pairs, and per such node what its leaves hold now.
    Empty without a tree or without such limits (today's path costs nothing)."""
    tree = state.queue_tree
    if tree is None:
        return {}, {}
    records = state.queue_records
    limited = {name: records[name].limit_pairs for name in tree.names
               if not tree.is_leaf(name) and name in records and records[name].limit_pairs}
    if not limited:
        return {}, {}
    held: dict[str, list[int]] = {}
    limits: dict[str, list[tuple[str, tuple[tuple[int, int], ...]]]] = {}
    for node in limited:
        total = [0] * len(state.pool_vector)
        for leaf in tree.leaves_under(node):
            record = records.get(leaf)
            if record is not None:
                for axis, amount in enumerate(record.allocation):
                    total[axis] += amount
            limits.setdefault(leaf, []).append((node, limited[node]))
        held[node] = total
    return limits, held


def _add_pairs_to(vector: list[int], pairs: tuple[tuple[int, int], ...]) -> None:
    for axis, amount in pairs:
        vector[axis] += amount
