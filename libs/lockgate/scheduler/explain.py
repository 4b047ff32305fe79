"""Why a queued pod waits, and every queue at a glance: one answer for Events, explain and status.

Why this exists: a gated pod shows only `Pending` and a gate. Its owner asks "why is my pod still
pending?", and the answer is in the scheduler's state: its queue, its place in that queue, and
what it waits for (its queue's fair share, room in its cluster, a node it fits on, a cordoned or
unknown queue). `explain` computes that answer from a `SchedulerState`; the fair-scheduler leader
uses it for the Events it sends (through `lockgate.pod-notices.v1`, written by the ungater), and
`lockgate explain` and the web UI (through the leader's round report), so all say the same.
`queue_statuses` is every queue's standing by a pass over the jobs: the reference the tests hold
the round report's running tallies to (`lockgate status` reads the report).
When a pod is told is `lockgate.scheduler.waiting`.

Pure: the clock is passed in, as epoch seconds (pods' creation times are epoch seconds too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum

from lockgate.backoff import backing_off_message
from lockgate.jobs import JobState
from lockgate.max_queued import stricter
from lockgate.scheduler.costs import (
    FairShare,
    cost,
    dominant,
    dominant_of,
    dominant_of_pairs,
    fair_shares,
    fraction,
    owed,
    within_target,
)
from lockgate.scheduler.groups import GroupKey, GroupStatus
from lockgate.scheduler.holds import RoomHold
from lockgate.scheduler.pending import PendingJobs
from lockgate.scheduler.records import Shape
from lockgate.scheduler.room import ClusterRoom, fits, take
from lockgate.scheduler.room_caches import ClusterRecord
from lockgate.scheduler.round import (
    GrowthGate,
    GrowthNote,
    Rank,
    growth_gate,
    rank_in_cluster,
    room_gathers_for,
    uncontested,
    waits_while_room_gathers,
)
from lockgate.scheduler.state import QueueRecord, SchedJob, SchedulerState
from lockgate.scheduler.tree_status import TreeNodeStatus, holding_level, tree_statuses


class WaitReason(StrEnum):
    """What a queued pod waits for. Open: readers show a value they do not know as it is."""

    # Its queue holds its fair target in the pod's cluster, and queues the round ranks before it
    # there (below their own targets) go first.
    FAIR_SHARE = "fair_share"
    CLUSTER_ROOM = "cluster_room"  # no node of its cluster has room for it right now
    NODE_FIT = "node_fit"  # it fits no node of its cluster, even an empty one
    NO_NODES = "no_nodes"  # its cluster has no schedulable node (unknown, empty, cordoned)
    QUEUE_LIMIT = "queue_limit"  # it would take its queue over the queue's resource limits
    QUEUE_CORDONED = "queue_cordoned"  # its queue releases nothing until uncordoned
    QUEUE_UNKNOWN = "queue_unknown"  # nobody defined its queue
    # Its controller backs off: lockgate gave up on its pods that kube-scheduler kept refusing
    # (lockgate.backoff); it waits until the back-off ends.
    BACKING_OFF = "backing_off"
    # Its pod group has fewer members than it releases together: it waits for the rest.
    GROUP_INCOMPLETE = "group_incomplete"
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
    WaitReason.GROUP_INCOMPLETE: ("LockgateWaitingForGroup", False),
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
    at_fair_share: bool  # its queue holds at least its fair target in the pod's cluster
    others_below_share_waiting: bool  # queues the round ranks before it there wait there
    backing_off: bool = False  # its controller backs off (lockgate.backoff)
    group_incomplete: bool = False  # its pod group lacks members it releases together


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
    # Before limits and room: neither can be judged, nor helps, until the gang is whole.
    if facts.group_incomplete:
        return WaitReason.GROUP_INCOMPLETE
    if facts.over_queue_limit:
        return WaitReason.QUEUE_LIMIT
    if facts.at_fair_share and facts.others_below_share_waiting:
        return WaitReason.FAIR_SHARE
    if not facts.fits_free_room:
        return WaitReason.CLUSTER_ROOM
    return WaitReason.NEXT_ROUND


class Reservation(StrEnum):
    """Where a pod group that has not started stands with the reservation of its cluster
    (docs/scheduling.md, "Gangs": a complete group that has not fitted for the ageing time after
    its newest member arrived reserves its cluster)."""

    RESERVING = "reserving"  # the scheduler holds its cluster for it
    DUE = "due"  # aged and still not fitting: the next round reserves
    BEHIND = "behind"  # aged, but another group holds the cluster's one reservation
    LATER = "later"  # complete, not fitting: it reserves when it has aged
    ONCE_COMPLETE = "once_complete"  # members still to come: the ageing starts at the last
    AT_LIMIT = "at_limit"  # its queue's limits block it, which a reservation cannot fix
    NEVER = "never"  # it does not fit its cluster even empty
    STARTED = "started"  # a member holds capacity: the rest go one at a time, reserving nothing
    NONE = "none"  # nothing to say: it fits now, its queue releases nothing, or no ageing known


@dataclass(frozen=True, slots=True)
class GroupStanding:
    """A member's pod group as explain sees it: the facts its sentence is built from."""

    name: str
    size: int  # released together: a static group's size, an elastic group's minimum
    max_size: int  # the most members holding capacity at once (a static group's: its size)
    queued: int
    held: int  # members holding capacity (released, running)
    # What the members released together ask in all: its gang, the oldest `size` queued
    # members (while incomplete, those queued so far); empty once it started.
    needs: Mapping[str, int]
    reservation: Reservation
    reserve_at: float | None = None  # epoch seconds: its newest member's arrival plus the ageing
    # The ageing, seconds (LOCKGATE_SCHEDULER_GROUP_RESERVE_AFTER_SECONDS); None: not known.
    reserve_after: float | None = None
    reserved_by: str = ""  # BEHIND: the group holding the cluster, e.g. "pod group 'ns/h' of ..."

    @property
    def elastic(self) -> bool:
        return self.max_size != self.size

    @property
    def complete(self) -> bool:
        return self.queued + self.held >= self.size


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
    # Queues with pods waiting in the same cluster that the round ranks before this pod's queue
    # there (the round's order: below their fair target first, in proportion to it). Two pods
    # never list each other's queue: the order is one total order.
    competing_queues: tuple[str, ...]
    message: str = ""
    max_queued_by: str | None = None  # whose maximum applies: "queue" or "jobset"
    # Its controller's back-off (lockgate.backoff): consecutive give-ups, and until when
    # (epoch seconds) it waits; 0 and None when it does not back off.
    backoff_attempts: int = 0
    backoff_until: float | None = None
    # The constrained fair target (lockgate.scheduler.targets) of its queue, over the pool and
    # in the pod's cluster, and what the queue holds there (shares of the pool).
    fair_target: float = 0.0
    cluster_target: float = 0.0
    cluster_share: float = 0.0
    # Its queue holds less than its target in the pod's cluster, and less than its whole
    # target overall: the round owes it room there (costs.owed).
    below_target: bool = False
    # Room held for this pod (lockgate.scheduler.holds): on which node, until when, and what
    # is free there for it now.
    held_on: str | None = None
    held_until: float | None = None
    held_free: Mapping[str, int] | None = None
    # Queues whose waiting pods in this cluster fit the room free now beyond every hold: the
    # gaps that open go to them while this pod does not fit.
    gaps_to: tuple[str, ...] = ()
    # What frees on any node of its cluster goes to queues owed room there, its own among
    # them: queues owed nothing there take none while it waits (round: room nobody is owed
    # waits for the owed; with holds on, for a pod within its target that could use any node).
    room_gathers: bool = False
    # Queues above their fair target in this cluster (what preemption could take from).
    above_target: tuple[str, ...] = ()
    preemption: bool | None = None  # whether preemption is on (None: not known here)
    # Its pod group's state in a sentence (`group_text`), and the facts behind it; "" and None
    # when in none.
    group: str = ""
    group_standing: GroupStanding | None = None
    # Its cluster's growth, as it concerns this pod (lockgate.growth; docs/autoscaling.md): what
    # kind of answer (`GrowthStanding`; "" when its cluster cannot grow for it, or need not)
    # and the words.
    growth_standing: str = ""
    growth: str = ""
    # With a queue tree: each level of the pod's branch against its share of its parent, and
    # who is owed the room where the branch is held back (`tree_status.holding_level`).
    tree: str = ""
    # How usage history holds its queue back (lockgate.scheduler.history.held_back_words):
    # "ranked below its sibling bob: alice used 2.3x its share over the last half-life";
    # "" when history is off or holds it back nowhere.
    history: str = ""


class GrowthStanding(StrEnum):
    """How a pod stands with its cluster's growth (`Explanation.growth_standing`)."""

    RELEASED = "released_for_growth"  # released onto a node that may exist, not bound yet
    OVER_SHARE = "over_share"  # no room on the nodes that exist; not owed room, so no growth
    WAITING = "waiting_for_nodes"  # the last wave's NodeClaims have not appeared yet
    STALLED = "stalled"  # a NodeClaim failed, or a pod released for growth stayed unbound
    # Owed room on a node that may exist; held until the cluster's owed pods fill a node of
    # its pool, or `GrowthPolicy.gather_seconds` pass.
    GATHERING = "gathering_to_fill_a_node"


# Said of a pod at or over its share that the cluster could grow for (`GrowthStanding`).
OVER_SHARE_FOR_GROWTH = "held: over its fair share, so the cluster will not grow for it"


def explain(state: SchedulerState, job_id: str, *, now: float,
            preemption: bool | None = None, group_reserve_after: float | None = None,
            holds: bool = True) -> Explanation | None:
    """Why `job_id` waits, from the state as it is (after a round, as the leader holds it)."""
    return Explainer(state, now=now, preemption=preemption,
                     group_reserve_after=group_reserve_after, holds=holds).explain(job_id)


class Explainer:
    """Explains many pods of one state at one time, sharing what they have in common (the fair
    shares, each cluster's free room); build a new one after the state changed."""

    def __init__(self, state: SchedulerState, *, now: float,
                 preemption: bool | None = None, group_reserve_after: float | None = None,
                 holds: bool = True, shares: Mapping[str, FairShare] | None = None) -> None:
        """`group_reserve_after`: the leader's group ageing (None: not known, so explain says
        nothing of when a group reserves). `holds`: whether the leader holds room
        (`room_hold_seconds` above 0, its default). `shares`: every queue's fair share as the
        last round reported them (None: worked out from the state, a pass over every queue in
        every cluster). Only the leader's state, which its rounds ran on, is explained: its
        reservations and holds are in it."""
        self.state = state
        self.holds = holds
        self.now = now
        self.preemption = preemption
        self.group_reserve_after = group_reserve_after
        self.shares = fair_shares(state) if shares is None else shares
        self.inverse = state.fairness_inverse()
        self._rounds: dict[str, ClusterRoom] = {}
        self._ranks: dict[str, dict[str, Rank]] = {}  # per cluster, per queue waiting there
        # Per pod group, its gang's facts: the same for every member (O(members) to find).
        self._gangs: dict[GroupKey, _Gang | None] = {}
        # Per cluster, per queue waiting there: whether its next pod fits the room free now (the
        # gaps that open go to it). The same for every pod of the cluster explained.
        self._heads_fit: dict[str, dict[str, bool]] = {}
        self._room_stats: dict[str, _RoomStats] = {}
        self._above_in: dict[str, tuple[str, ...]] = {}  # per cluster, queues above target
        self._growth_gates: dict[str, GrowthGate] = {}  # per autoscaled cluster asked about
        self._tree_nodes: dict[str, TreeNodeStatus] | None = None  # the queue tree, once asked
        # Per queue, how usage history holds it back (the leader sets it; empty: history off).
        self.history_words: Mapping[str, str] = {}

    def explain(self, job_id: str, position: tuple[int, int] | None = None
                ) -> Explanation | None:
        """`position` (place, of how many) if known, else computed (O(jobs))."""
        explanation = self._explain_now(job_id, position)
        if explanation is None or explanation.reason not in _HISTORY_SAYS:
            return explanation
        words = self.history_words.get(explanation.queue, "")
        return _with_message(replace(explanation, history=words)) if words else explanation

    def _explain_now(self, job_id: str, position: tuple[int, int] | None
                     ) -> Explanation | None:
        state = self.state
        job = state.job(job_id)
        if job is None:
            return None
        queued = job.state is JobState.QUEUED
        if position is None:
            position = _position(state, job) if queued else (
                0, state.queue_usage(job.queue).queued_jobs)
        rounds = self._rounds.get(job.cluster)
        cluster = state.cluster_records.get(job.cluster)
        if rounds is None and cluster is not None and cluster.order:
            rounds = self._rounds[job.cluster] = ClusterRoom(cluster, self.inverse)
            index = {node: i for i, node in enumerate(rounds.names)}
            axes = len(self.inverse)
            for hold in state.room_holds().in_cluster(job.cluster):
                held = state.job_records.get(hold.job_id)
                if (held is not None and held.state is JobState.QUEUED
                        and hold.node in index):
                    rounds.hold(hold.job_id, hold.queue, held.shape, axes,
                                node=index[hold.node])
        ranks = self._ranks.get(job.cluster)
        if ranks is None:
            ranks = self._ranks[job.cluster] = _ranks_in(state, job.cluster, self.inverse)
        explanation = _explain(state, job, position, self.shares, self.inverse, rounds,
                               self.now, ranks, self.preemption, self.group_reserve_after,
                               self._gangs, holds=self.holds,
                               heads_fit=self._heads_fit.setdefault(job.cluster, {}),
                               cluster_stats=self._room_stats, above_in=self._above_in)
        if (state.queue_tree is not None and explanation.reason in (
                WaitReason.FAIR_SHARE, WaitReason.CLUSTER_ROOM)):
            # Which level of the queue tree holds it back (lockgate.scheduler.tree_status).
            if self._tree_nodes is None:
                self._tree_nodes = {node.name: node for node in tree_statuses(state)}
            words = holding_level(self._tree_nodes, job.queue)
            if words:
                explanation = _with_message(replace(explanation, tree=words))
        if state.growth_plan(job.cluster) is None:
            return explanation  # its cluster does not grow: nothing to add
        gate = self._growth_gates.get(job.cluster)
        if gate is None:
            gate = self._growth_gates[job.cluster] = growth_gate(state, job.cluster,
                                                                 now=self.now)
        standing, words = _growth_standing(state, job, explanation, rounds, gate)
        if not standing and not words:
            return explanation
        return _with_message(replace(explanation, growth_standing=standing, growth=words))


def _growth_standing(state: SchedulerState, job: SchedJob, e: Explanation,
                     rounds: ClusterRoom | None, gate: GrowthGate) -> tuple[str, str]:
    """How the pod stands with its cluster's growth, and the words (("", "") when there is
    nothing to say: the cluster's nodes have room for it, or no node that may exist could
    take it)."""
    release = state.growth_releases.get(job.job_id)
    if release is not None:
        plan = gate.plan
        note = GrowthNote(pool=release.pool, node=release.node, claim=release.claim,
                          headroom=None if plan is None else plan.headroom(release.pool))
        words = note.words(job.cluster)
        if not release.claim:
            claims = () if plan is None else plan.claims_in_flight
            words += ("; waiting for a node (NodeClaims in flight: "
                      f"{', '.join(claims)})" if claims else
                      "; waiting for the autoscaler to make a node (no NodeClaim yet)")
        if gate.stalled:
            words += f"; {gate.stalled}"
        return GrowthStanding.RELEASED.value, words
    fits_growth = rounds is not None and rounds.fits_growth(
        state.job_records[job.job_id].shape)
    if not fits_growth and not gate.stalled and e.reason in (
            WaitReason.NO_NODES, WaitReason.NODE_FIT, WaitReason.CLUSTER_ROOM):
        # No node that exists has room, and none that may exist could take it: say why the
        # pools add nothing (an unknown instance size, not Ready, at their limits).
        plan = gate.plan
        why = [] if plan is None else [pool.why_none for pool in plan.pools if pool.why_none]
        if why:
            return "", "its cluster cannot grow for it: " + "; ".join(why)
    if e.reason not in (WaitReason.CLUSTER_ROOM, WaitReason.FAIR_SHARE) or rounds is None:
        return "", ""
    if fits_growth and not e.below_target:
        return GrowthStanding.OVER_SHARE.value, OVER_SHARE_FOR_GROWTH
    if gate.stalled:
        return GrowthStanding.STALLED.value, gate.stalled
    if fits_growth and gate.waiting:
        return GrowthStanding.WAITING.value, gate.waiting
    gathering = state.growth_gathering.get(job.cluster)
    if fits_growth and gathering is not None:
        return GrowthStanding.GATHERING.value, gathering.words
    return "", ""


def _head(state: SchedulerState, queue: QueueRecord, pending: PendingJobs) -> str | None:
    """The queue's next pod in the cluster, in release order (the heap drops stale entries
    lazily, so check them)."""
    jobs = state.job_records

    def valid(entry: tuple[int, float, str]) -> bool:
        job = jobs.get(entry[2])
        return (job is not None and job.state is JobState.QUEUED and not job.parked
                and not job.held and job.queue == queue.name and job.cluster == pending.cluster
                and job.priority == -entry[0] and job.created_at == entry[1])

    first = pending.first()
    if first is not None and valid(first):
        return first[2]
    live = [entry for entry in pending.entries if valid(entry)]
    return min(live)[2] if live else None


def _ranks_in(state: SchedulerState, cluster: str, inverse: list[float]) -> dict[str, Rank]:
    """How the round ranks each queue with pods waiting in `cluster`, by its next pod there."""
    targets = state.fair_targets(latest=True)  # those the last round ranked by
    ranks: dict[str, Rank] = {}
    by_cost = uncontested(state, targets, cluster)
    for name, queue in state.queue_records.items():
        pending = queue.pending.get(cluster)
        if not queue.schedulable or pending is None or pending.live == 0:
            continue
        head = _head(state, queue, pending)
        if head is None:
            continue
        pairs = state.job_records[head].shape.pairs
        held = queue.alloc_in.get(cluster, [0] * len(inverse))
        after = held[:]
        total = queue.allocation[:]
        for axis, amount in pairs:
            after[axis] += amount
            total[axis] += amount
        target = targets.queues.get(name)
        whole = 0.0 if target is None else target.share
        ranks[name] = rank_in_cluster(
            before=dominant(held, inverse), after=dominant(after, inverse),
            target=0.0 if target is None else target.in_cluster(cluster),
            cost_after=cost(dominant(total, inverse), queue.priority_factor),
            size=dominant_of_pairs(pairs, inverse),
            overall_before=fraction(dominant(queue.allocation, inverse), whole),
            overall_after=fraction(dominant(total, inverse), whole),
            by_cost=by_cost, top_cost=targets.top_cost)
    return ranks


def _explain(state: SchedulerState, job: SchedJob, place: tuple[int, int],
             shares: Mapping[str, FairShare], inverse: list[float],
             rounds: ClusterRoom | None, now: float, ranks: Mapping[str, Rank],
             preemption: bool | None, reserve_after: float | None = None,
             gangs: dict[GroupKey, _Gang | None] | None = None, *,
             holds: bool = True, heads_fit: dict[str, bool] | None = None,
             cluster_stats: dict[str, _RoomStats] | None = None,
             above_in: dict[str, tuple[str, ...]] | None = None) -> Explanation:
    job_id = job.job_id
    spec = state.queue_spec(job.queue)
    share = shares.get(job.queue)
    cluster = state.cluster_records.get(job.cluster)
    names = state.axis_names
    requests = job.requests.as_dict()
    queued = job.state is JobState.QUEUED
    position, count = place
    free_total = [0] * len(names)
    largest_free: list[int] = []
    largest_node: list[int] = []
    fits_some = fits_free = False
    node_count = real_nodes = 0
    held_on: RoomHold | None = None
    held_room: list[int] | None = None
    gaps: list[str] = []
    gathers = False
    if cluster is not None and rounds is not None:
        # Nodes that may exist (lockgate.growth) count as nodes it may go to, not among the
        # cluster's nodes the explanation shows.
        node_count = len(cluster.order)
        real_nodes = cluster.real_nodes
        shape = state.job_records[job_id].shape
        fits_some = rounds.fits_some_node(shape)
        stats = None if cluster_stats is None else cluster_stats.get(job.cluster)
        if stats is None:
            stats = _room_stats(cluster, rounds, inverse, len(names))
            if cluster_stats is not None:
                cluster_stats[job.cluster] = stats
        free_total, largest_free, largest_node = (list(part) for part in stats)
        free = rounds.free
        # Room only on a node the pod may land on.
        fits_free = any(all(free[index][axis] >= amount for axis, amount in shape.pairs)
                        for index in rounds.nodes_for(shape.placement))
        room_hold = state.room_holds().of(job_id)
        if room_hold is not None and job_id in rounds.hold_node:
            held_free = _room_for_holder(rounds, job, ranks)
            fits_free = fits_free or fits(held_free, shape)
            held_on = room_hold
            held_room = [max(0, a) for a in held_free]
        mine = ranks.get(job.queue)
        gathers = (queued and job.group is None and mine is not None and room_gathers_for(
            mine, holds=holds, could_use_every_node=rounds.could_use_every_node(shape)))
        for other in ranks:
            if other == job.queue or (gathers and waits_while_room_gathers(ranks[other])):
                continue  # it takes no room there while this pod waits
            fits_now = None if heads_fit is None else heads_fit.get(other)
            if fits_now is None:
                fits_now = _head_fits_free(state, other, job.cluster, rounds)
                if heads_fit is not None:
                    heads_fit[other] = fits_now
            if fits_now:
                gaps.append(other)
    allocation = state.queue_usage(job.queue).allocation.as_dict()
    limits = {} if spec is None else spec.limits.as_dict()
    # A member of a group that has not started goes with its gang: judge the gang's needs.
    gang = None
    if queued and job.group is not None:
        gangs = {} if gangs is None else gangs
        key = (job.cluster, job.queue, job.group)
        if key not in gangs:
            gangs[key] = _gang(state, job, rounds, inverse)
        gang = gangs[key]
    asks = requests if gang is None else gang.needs
    over_limit = any(allocation.get(name, 0) + asks.get(name, 0) > limit
                     for name, limit in limits.items())
    cluster_target = 0.0 if share is None else share.cluster_targets.get(job.cluster, 0.0)
    cluster_share = 0.0 if share is None else share.cluster_shares.get(job.cluster, 0.0)
    # Owed room there as the round ranks it (costs.owed): below its target in the cluster,
    # and its whole allocation short of its whole target.
    below = share is not None and owed(
        before=cluster_share, target=cluster_target,
        overall_before=fraction(share.actual_share, share.fair_target))
    # The round's order in this cluster, one total order: (rank, name) before this queue's.
    mine = ranks.get(job.queue)
    competing = () if mine is None else tuple(sorted(
        name for name, rank in ranks.items()
        if name != job.queue and (rank, name) < (mine, job.queue)))
    # Every queue above its target in the cluster: the same for each pod explained there (a
    # pass over every queue, once per cluster in `above_in`), less the pod's own queue.
    over = None if above_in is None else above_in.get(job.cluster)
    if over is None:
        over = tuple(sorted(
            name for name, other in shares.items()
            if not within_target(other.cluster_shares.get(job.cluster, 0.0),
                                 other.cluster_targets.get(job.cluster, 0.0))))
        if above_in is not None:
            above_in[job.cluster] = over
    above = tuple(name for name in over if name != job.queue)
    hold = state.controller_hold(job_id)
    reason = choose_reason(WaitFacts(
        queue_defined=spec is not None,
        cordoned=spec is not None and spec.cordoned,
        cluster_has_nodes=node_count > 0,
        fits_some_node=fits_some and (gang is None or not gang.complete or gang.fits_empty),
        over_queue_limit=over_limit,
        fits_free_room=fits_free if gang is None else gang.fits_free,
        at_fair_share=not below,
        others_below_share_waiting=bool(competing),
        backing_off=hold is not None,
        group_incomplete=gang is not None and not gang.complete,
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
        queue_limits=limits, queue_allocation=allocation, cluster_nodes=real_nodes,
        cluster_free=named(free_total), largest_free_node=named(largest_free),
        largest_node=named(largest_node),
        max_queued_seconds=None if max_queued is None else max_queued.seconds,
        max_queued_action=None if max_queued is None else max_queued.action,
        competing_queues=competing,
        max_queued_by=None if max_queued is None else max_queued.by,
        backoff_attempts=0 if hold is None else hold.attempts,
        backoff_until=None if hold is None else hold.until,
        fair_target=0.0 if share is None else share.fair_target,
        cluster_target=cluster_target, cluster_share=cluster_share, below_target=below,
        held_on=None if held_on is None else held_on.node,
        held_until=None if held_on is None else held_on.until,
        held_free=None if held_room is None else named(held_room),
        gaps_to=tuple(sorted(gaps)), room_gathers=gathers, above_target=above,
        preemption=preemption,
    )
    standing = _standing(state, job, gang, reason, now=now, after=reserve_after)
    if standing is not None:
        explanation = replace(explanation, group_standing=standing,
                              group=group_text(standing, cluster=job.cluster, now=now))
    return _with_message(explanation)


@dataclass(frozen=True, slots=True)
class _Gang:
    """A queued member's group that has not started: its status and what its gang needs."""

    status: GroupStatus
    needs: dict[str, int]
    complete: bool
    fits_empty: bool  # the gang fits its cluster with no managed pod on any node
    fits_free: bool  # the gang fits the room free now, all at once


def _gang(state: SchedulerState, job: SchedJob, rounds: ClusterRoom | None,
          inverse: list[float]) -> _Gang | None:
    if job.group is None:
        return None
    groups = state.groups()
    key = (job.cluster, job.queue, job.group)
    status = groups.summary(key)
    if status is None or status.started:
        return None
    shapes = [state.job_records[member].shape for member in groups.gang(key)]
    total = [0] * len(state.axis_names)
    for shape in shapes:
        for axis, amount in shape.pairs:
            total[axis] += amount
    needs = {state.axis_names[axis]: amount for axis, amount in enumerate(total) if amount}
    cluster = state.cluster_records.get(job.cluster)
    fits_empty = (rounds is not None and cluster is not None
                  and rounds.fits_empty(shapes, inverse))
    return _Gang(status=status, needs=needs, complete=status.complete, fits_empty=fits_empty,
                 fits_free=fits_empty and rounds is not None
                 and _fits_at_once(rounds, shapes, inverse))


def _fits_at_once(rounds: ClusterRoom, shapes: list[Shape], inverse: list[float]) -> bool:
    """Whether the shapes fit the free room together, largest first, first fit (as the round
    places a gang), on a copy: the explainer's room is shared by the pods it explains."""
    room = [free[:] for free in rounds.free]
    for shape in sorted(shapes, key=lambda s: dominant_of(s, inverse), reverse=True):
        for index in rounds.nodes_for(shape.placement):
            if fits(room[index], shape):
                take(room[index], shape)
                break
        else:
            return False
    return True


def _standing(state: SchedulerState, job: SchedJob, gang: _Gang | None,
              reason: WaitReason | None, *, now: float,
              after: float | None) -> GroupStanding | None:
    if job.group is None:
        return None
    groups = state.groups()
    key: GroupKey = (job.cluster, job.queue, job.group)
    status = groups.summary(key)
    if status is None:
        return None
    most = status.max_size or status.size
    if gang is None:  # started (or it is not queued): its members go one at a time
        return GroupStanding(name=key[2], size=status.size, max_size=most, queued=status.queued,
                             held=status.held, needs={}, reservation=Reservation.STARTED)
    at = None if after is None else status.last_created_at + after
    holder = groups.reserved.get(key[0])
    reserved_by = ""
    if holder == key:
        # Also when preemption reserved it before it aged: `reserve_at` is then still ahead.
        where = Reservation.RESERVING
    elif reason in (WaitReason.QUEUE_UNKNOWN, WaitReason.QUEUE_CORDONED, WaitReason.NO_NODES,
                    WaitReason.BACKING_OFF, WaitReason.NEXT_ROUND, None):
        where = Reservation.NONE  # nothing, or nothing but the round, stands in its way
    elif gang.complete and not gang.fits_empty:
        where = Reservation.NEVER
    elif reason is WaitReason.QUEUE_LIMIT:
        where = Reservation.AT_LIMIT
    elif at is None:
        where = Reservation.NONE  # the ageing is not known here
    elif not gang.complete:
        where = Reservation.ONCE_COMPLETE  # whether it will fit is not known yet
    elif gang.fits_free:
        where = Reservation.NONE  # it fits: only fair share holds it back
    elif at > now:
        where = Reservation.LATER
    elif holder is not None:
        where = Reservation.BEHIND
        reserved_by = f"pod group {holder[2]!r} of queue \"{holder[1]}\""
    else:
        where = Reservation.DUE
    return GroupStanding(name=key[2], size=status.size, max_size=most, queued=status.queued,
                         held=status.held, needs=gang.needs, reservation=where, reserve_at=at,
                         reserve_after=after, reserved_by=reserved_by)


def group_text(g: GroupStanding, *, cluster: str, now: float) -> str:
    """A member's pod group in a sentence, for explain and the Events of its members: how many
    members arrived, what those released together ask in all, and its reservation."""
    name = f"pod group {g.name!r}"
    bounds = f" (minimum {g.size}, maximum {g.max_size})" if g.elastic else ""
    arrived = g.queued + g.held
    members = "member" if arrived == 1 else "members"
    if g.held:
        return _started_text(g, name)
    if g.elastic and g.complete:
        text = (f"{name}{bounds}: {arrived} {members} arrived; its first {g.size} need "
                f"{_amounts(g.needs)} in all and are released together or not at all, the "
                "rest one at a time after them")
    elif g.elastic:
        text = (f"{name}{bounds}: {arrived} of its minimum {g.size} arrived (asking "
                f"{_amounts(g.needs)} so far); none is released before its first {g.size} "
                "are here")
    else:
        text = f"{name}: {arrived} of {g.size} {members} arrived"
        if g.complete:
            text += f", needing {_amounts(g.needs)} in all, released together or not at all"
        else:
            text += (f" (asking {_amounts(g.needs)} so far); none is released before all "
                     f"{g.size} are here")
    reservation = reservation_text(g, cluster=cluster, now=now)
    return f"{text}; {reservation}" if reservation else text


def _started_text(g: GroupStanding, name: str) -> str:
    bounds = (f"minimum {g.size}, maximum {g.max_size}" if g.elastic else f"of {g.size}")
    if g.held >= g.max_size:
        return (f"{name} ({bounds}) holds its maximum, {g.held} members"
                + (f"; {g.queued} wait until members end" if g.queued else ""))
    if g.held < g.size:
        text = (f"{name} ({bounds}) runs below its minimum: {_hold(g.held)} after members "
                "ended, and it keeps running")
    else:
        above = ", above its minimum" if g.held > g.size else ""
        text = f"{name} ({bounds}): {_hold(g.held)}{above}"
    if g.queued:
        text += (f"; its {g.queued} queued members are released one at a time, as fair share "
                 "and room allow, and it reserves no cluster")
    return text


def _hold(count: int) -> str:
    return f"{count} hold{'s' if count == 1 else ''} capacity"


def reservation_text(g: GroupStanding, *, cluster: str, now: float) -> str:
    """When a group that has not started reserves its cluster, that it does, or why it never
    will; "" when there is nothing to say (it fits now, or its queue releases nothing)."""
    at = "" if g.reserve_at is None else _clock(g.reserve_at)
    after = "" if g.reserve_after is None else format_duration(g.reserve_after)
    where = g.reservation
    if where is Reservation.RESERVING:
        if g.reserve_at is None or g.reserve_at > now:  # preemption reserved it, unaged
            return (f"cluster {cluster} is reserved for it while preemption makes room: nothing "
                    "else is released there until it fits")
        return (f"cluster {cluster} is reserved for it since about {at}: nothing else is "
                "released there until it fits")
    if where is Reservation.DUE:
        return f"it reserves cluster {cluster} at the next round (due since about {at})"
    if where is Reservation.BEHIND:
        return (f"it reserves cluster {cluster} once {g.reserved_by}, which holds the "
                "cluster's one reservation, is released or gone")
    if where is Reservation.LATER:
        return (f"if it does not fit by then, it reserves cluster {cluster} from about {at}, "
                f"{after} after its last member arrived")
    if where is Reservation.ONCE_COMPLETE:
        return (f"once all are here, it reserves cluster {cluster} if it has not fitted "
                f"{after} after the last arrives")
    if where is Reservation.AT_LIMIT:
        return "it reserves no room while its queue's limits hold it back"
    if where is Reservation.NEVER:
        return f"it never reserves cluster {cluster}, which cannot hold it even empty"
    return ""


# A cluster's room as explain reports it: free in all, the most free on one node, the largest
# node's allocatable (each per axis).
_RoomStats = tuple[list[int], list[int], list[int]]


def _room_stats(cluster: ClusterRecord, rounds: ClusterRoom, inverse: list[float],
                axes: int) -> _RoomStats:
    """The same for every pod of the cluster explained: worked out once per explainer (a pass
    over the cluster's nodes, 400 at fleet scale, was most of explaining one pod)."""
    free_total = [0] * axes
    largest_free: list[int] = []
    best = -1.0
    virtual = set(cluster.virtual_order)  # room there is growth's, said apart (`growth`)
    for node, free in enumerate(rounds.free):
        if node in virtual:
            continue
        for axis, amount in enumerate(free):
            free_total[axis] += max(0, amount)
        room = [max(0, a) for a in free]
        size = dominant(room, inverse)
        if size > best:
            best, largest_free = size, room
    largest_node: list[int] = []
    biggest = -1.0
    for name in cluster.order:
        allocatable = cluster.nodes[name].allocatable
        size = dominant(allocatable, inverse)
        if size > biggest:
            biggest, largest_node = size, list(allocatable)
    return free_total, largest_free, largest_node


def _head_fits_free(state: SchedulerState, queue: str, cluster: str,
                    rounds: ClusterRoom) -> bool:
    """Whether the queue's next pod in the cluster fits the room free now on a node it may land
    on. O(its eligible nodes): at fleet scale a cluster has 400 nodes and a thousand queues, and
    building the eligible set per node looked at made explaining one pod take seconds."""
    record = state.queue_records[queue]
    head = _head(state, record, record.pending[cluster])
    if head is None:
        return False
    shape = state.job_records[head].shape
    return any(fits(rounds.free[i], shape) for i in rounds.nodes_for(shape.placement))


def _room_for_holder(rounds: ClusterRoom, job: SchedJob,
                     ranks: Mapping[str, Rank]) -> list[int]:
    """What is free for a held pod on its node, as the round serves holds there: in the fair
    order of the queues' ranks (`ClusterRoom.room_for_held`)."""
    mine = ranks.get(job.queue)

    def yields(other: str, shape: Shape) -> bool:
        theirs = ranks.get(other)
        return theirs is None or (mine is not None and (theirs, other) > (mine, job.queue))

    return rounds.room_for_held(job.job_id, job.queue, yields)


def _position(state: SchedulerState, job: SchedJob) -> tuple[int, int]:
    """Its 1-based place among its queue's queued pods in release order, and how many there are.

    O(every job the state holds): only for a pod whose place nobody knew (the leader's callers
    pass the place Postgres's index of the line gives).
    """
    mine = (-job.priority, job.created_at, job.job_id)
    ahead = count = 0
    for other_id, other in state.job_records.items():
        if other.queue != job.queue or other.state is not JobState.QUEUED:
            continue
        count += 1
        if (-other.priority, other.created_at, other_id) < mine:
            ahead += 1
    return ahead + 1, count


def _percent(share: float) -> str:
    return f"{share * 100:.1f}%"


def _with_message(e: Explanation) -> Explanation:
    return replace(e, message=wait_message(e))


def wait_message(e: Explanation) -> str:
    """One paragraph for the Event and the top of `lockgate explain`: queue, position, why."""
    where = f'queue "{e.queue}", position {e.position} of {e.queued_in_queue}'
    reason = e.reason
    g = e.group_standing
    gang = g is not None and not g.held  # it goes with its gang, judged as one
    if gang and g is not None and reason is not None:
        why = _gang_why(e, g, reason)
        if why:
            return _finish(e, f"{where}; {why}")
    if reason is WaitReason.FAIR_SHARE:
        why = (f"waiting for its queue's fair share: in cluster {e.cluster} the queue holds "
               f"{_percent(e.cluster_share)} of the pool, its fair target there is "
               f"{_percent(e.cluster_target)}, and queues the round ranks before it there go "
               f"first ({', '.join(e.competing_queues)})")
    elif reason is WaitReason.CLUSTER_ROOM:
        why = (f"waiting for room in cluster {e.cluster}: no node has {_amounts(e.requests)} "
               f"free (most on one node: {_amounts(e.largest_free_node) or 'nothing'})")
        why += _room_detail(e)
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
    elif e.growth:
        return f"{where}; {e.growth}" + (f"; {e.group}" if e.group else "")
    else:
        return f"{where}; not waiting ({e.state})" + (f"; {e.group}" if e.group else "")
    if e.tree:
        why += f"; in the queue tree, {e.tree}"
    if e.history:
        why += f"; {e.history}"
    if e.growth:
        why += f"; {e.growth}"
    return _finish(e, f"{where}; {why}")


# The reasons a lower history weight can be behind: the queue's share, or room owed first to
# queues ranked before it.
_HISTORY_SAYS = frozenset({WaitReason.FAIR_SHARE, WaitReason.CLUSTER_ROOM})


def _finish(e: Explanation, text: str) -> str:
    """The pod's group and its maximum time queued after what it waits for."""
    if e.group:
        text += f"; {e.group}"
    if e.max_queued_seconds is not None:
        done = "deleted" if e.max_queued_action == "delete" else "failed"
        whose = " (its job set's maximum)" if e.max_queued_by == "jobset" else ""
        text += f"; it is {done} after {format_duration(e.max_queued_seconds)} queued{whose}"
    return text


def _gang_why(e: Explanation, g: GroupStanding, reason: WaitReason) -> str:
    """What a member of a group that has not started waits for, said of the group (its gang
    is released as one); "" where the pod's own words say it (cordons, back-off, fair share)."""
    if reason is WaitReason.GROUP_INCOMPLETE:
        missing = g.size - g.queued - g.held
        return (f"waiting for {missing} more member{'s' if missing != 1 else ''} of its pod "
                "group to arrive")
    if reason is WaitReason.CLUSTER_ROOM:
        return (f"waiting for room in cluster {e.cluster} for its whole pod group: it needs "
                f"{_amounts(g.needs)} at once, free there "
                f"{_amounts(e.cluster_free) or 'nothing'} (most on one node: "
                f"{_amounts(e.largest_free_node) or 'nothing'})" + _room_detail(e))
    if reason is WaitReason.NODE_FIT and g.reservation is Reservation.NEVER:
        return (f"its pod group does not fit cluster {e.cluster} even with every node empty: "
                f"it needs {_amounts(g.needs)} in all, the largest node offers "
                f"{_amounts(e.largest_node)}; lower the members' requests or the group's size, "
                "or add nodes")
    if reason is WaitReason.QUEUE_LIMIT:
        return (f"its queue would exceed its limits with its whole pod group "
                f"({_amounts(e.queue_limits)}; it holds "
                f"{_amounts(e.queue_allocation) or 'nothing'})")
    if reason is WaitReason.NEXT_ROUND:
        return "there is room for its whole pod group: the next scheduling round releases it"
    return ""


def _room_detail(e: Explanation) -> str:
    """For a pod waiting for room: what is held for it, who gets the gaps, where its queue
    stands against its target, and what would change that."""
    parts: list[str] = []
    if e.held_on is not None and e.held_until is not None:
        parts.append(
            f"room is being held for it on node {e.held_on} until "
            f"{_clock(e.held_until)} (free there for it now: "
            f"{_amounts(e.held_free or {}) or 'nothing'}); what frees there is kept for it")
    elif e.gaps_to:
        needs = ("its pod group needs more room at once"
                 if e.group_standing is not None and not e.group_standing.held
                 else "this pod needs more room on one node")
        parts.append(f"the gaps that open go to {_queues(e.gaps_to)}, whose waiting pods fit "
                     f"them; {needs}")
    elif e.room_gathers:
        parts.append(f"what frees on any node of cluster {e.cluster} is kept for queues owed "
                     "room there, its own among them: queues above their targets there take "
                     "none of it while it waits")
    if e.competing_queues:
        parts.append(f"ranked before it in cluster {e.cluster}: {_queues(e.competing_queues)}")
    if e.below_target:
        parts.append(f"its queue holds {_percent(e.cluster_share)} of the pool in cluster "
                     f"{e.cluster}, below its fair target there of "
                     f"{_percent(e.cluster_target)}")
        over = _queues(e.above_target) if e.above_target else "other queues"
        if e.preemption is True:
            parts.append(f"preemption may evict preemptible pods of {over} (above their "
                         "targets there) to make room for it")
        else:
            off = "preemption is off" if e.preemption is False else "without preemption"
            parts.append(
                f"{off}, it gets room as pods of {over} (above their targets there) finish; "
                "turning preemption on (LOCKGATE_SCHEDULER_PREEMPTION_ENABLED=true) and "
                "marking their pods preemptible (label lockgate.io/preemptible=true) would "
                "free room for it sooner")
    return "".join(f"; {part}" for part in parts)


def _queues(names: Iterable[str]) -> str:
    listed = [f'"{name}"' for name in names]
    return ("queue " if len(listed) == 1 else "queues ") + ", ".join(listed)


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%H:%M:%SZ")


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
    # Its constrained fair target (lockgate.scheduler.targets), over the pool and per cluster,
    # and what it holds per cluster: shares of the pool.
    fair_target: float = 0.0
    cluster_targets: Mapping[str, float] = field(default_factory=dict)
    cluster_shares: Mapping[str, float] = field(default_factory=dict)
    # Usage history (lockgate.scheduler.history), None when it is off: its decayed usage
    # (share x seconds), the weight the targets divide by, and how history holds it back.
    decayed_usage: float | None = None
    effective_weight: float | None = None
    history: str = ""


def queue_statuses(state: SchedulerState) -> list[QueueStatus]:
    """Each queue's standing and its pods by phase, by name: one pass over the jobs."""
    shares = fair_shares(state)
    counts: dict[str, list[int]] = {}
    oldest: dict[str, float] = {}
    for record in state.job_records.values():
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
            backing_off=usage.backing_off_jobs, fair_target=share.fair_target,
            cluster_targets=dict(share.cluster_targets),
            cluster_shares=dict(share.cluster_shares)))
    return statuses
