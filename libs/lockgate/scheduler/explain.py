"""Why a queued pod waits, and every queue at a glance: one answer for Events, explain and status.

Why this exists: a gated pod shows only `Pending` and a gate. Its owner asks "why is my pod still
pending?", and the answer is in the scheduler's state: its queue, its place in that queue, and
what it waits for (its queue's fair share, room in its cluster, a node it fits on, a cordoned or
unknown queue). `explain` computes that answer from a `SchedulerState`; the fair-scheduler leader
uses it for the Events it sends (through `lockgate.pod-notices.v1`, written by the ungater), and
the admin API for `lockgate explain`, so both say the same. `queue_statuses` is `lockgate status`.
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
from lockgate.scheduler.costs import SHARE_EPSILON, FairShare, dominant, fair_shares
from lockgate.scheduler.groups import describe_group
from lockgate.scheduler.holds import RoomHold
from lockgate.scheduler.room import ClusterRoom, fits
from lockgate.scheduler.round import Rank, below_target, rank_in_cluster
from lockgate.scheduler.state import PendingJobs, QueueRecord, SchedJob, SchedulerState, Shape


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
    at_fair_share: bool  # its queue holds at least its fair target in the pod's cluster
    others_below_share_waiting: bool  # queues the round ranks before it there wait there
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
    below_target: bool = False  # its queue holds less than its target in the pod's cluster
    # Room held for this pod (lockgate.scheduler.holds): on which node, until when, and what
    # is free there for it now.
    held_on: str | None = None
    held_until: float | None = None
    held_free: Mapping[str, int] | None = None
    # Queues whose waiting pods in this cluster fit the room free now beyond every hold: the
    # gaps that open go to them while this pod does not fit.
    gaps_to: tuple[str, ...] = ()
    # Queues above their fair target in this cluster (what preemption could take from).
    above_target: tuple[str, ...] = ()
    preemption: bool | None = None  # whether preemption is on (None: not known here)
    # Its pod group's state (lockgate.scheduler.groups.describe_group); "" when in none.
    group: str = ""


def explain(state: SchedulerState, job_id: str, *, now: float,
            preemption: bool | None = None) -> Explanation | None:
    """Why `job_id` waits, from the state as it is (after a round, as the leader holds it)."""
    return Explainer(state, now=now, preemption=preemption).explain(job_id)


class Explainer:
    """Explains many pods of one state at one time, sharing what they have in common (the fair
    shares, each cluster's free room); build a new one after the state changed."""

    def __init__(self, state: SchedulerState, *, now: float,
                 preemption: bool | None = None) -> None:
        self.state = state
        self.now = now
        self.preemption = preemption
        self.shares = fair_shares(state)
        self.inverse = state.fairness_inverse()
        self._rounds: dict[str, ClusterRoom] = {}
        self._ranks: dict[str, dict[str, Rank]] = {}  # per cluster, per queue waiting there

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
        return _explain(state, job, position, self.shares, self.inverse, rounds, self.now,
                        ranks, self.preemption)


def _head(state: SchedulerState, queue: QueueRecord, pending: PendingJobs) -> str | None:
    """The queue's next pod in the cluster, in release order (the heap drops stale entries
    lazily, so check them)."""
    jobs = state.job_records

    def valid(entry: tuple[int, float, str]) -> bool:
        job = jobs.get(entry[2])
        return (job is not None and job.state is JobState.QUEUED and not job.parked
                and not job.held and job.queue == queue.name and job.cluster == pending.cluster
                and job.priority == -entry[0] and job.created_at == entry[1])

    if pending.heap and valid(pending.heap[0]):
        return pending.heap[0][2]
    live = [entry for entry in pending.heap if valid(entry)]
    return min(live)[2] if live else None


def _ranks_in(state: SchedulerState, cluster: str, inverse: list[float]) -> dict[str, Rank]:
    """How the round ranks each queue with pods waiting in `cluster`, by its next pod there."""
    targets = state.fair_targets(latest=True)  # those the last round ranked by
    ranks: dict[str, Rank] = {}
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
        ranks[name] = rank_in_cluster(
            before=dominant(held, inverse), after=dominant(after, inverse),
            target=0.0 if target is None else target.in_cluster(cluster),
            cost_after=dominant(total, inverse) * queue.priority_factor)
    return ranks


def _explain(state: SchedulerState, job: SchedJob, place: tuple[int, int],
             shares: Mapping[str, FairShare], inverse: list[float],
             rounds: ClusterRoom | None, now: float, ranks: Mapping[str, Rank],
             preemption: bool | None) -> Explanation:
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
    node_count = 0
    held_on: RoomHold | None = None
    held_room: list[int] | None = None
    gaps: list[str] = []
    if cluster is not None and rounds is not None:
        node_count = len(cluster.order)
        shape = state.job_records[job_id].shape
        fits_some = rounds.fits_some_node(shape)
        best = -1.0
        eligible = set(rounds.nodes_for(shape.placement))
        for index, free in enumerate(rounds.free):
            for axis, amount in enumerate(free):
                free_total[axis] += max(0, amount)
            room = [max(0, a) for a in free]
            size = dominant(room, inverse)
            if size > best:
                best, largest_free = size, room
            if index in eligible and all(free[axis] >= amount for axis, amount in shape.pairs):
                fits_free = True  # room only on a node the pod may land on
        room_hold = state.room_holds().of(job_id)
        if room_hold is not None and job_id in rounds.hold_node:
            held_free = _room_for_holder(rounds, job, ranks)
            fits_free = fits_free or fits(held_free, shape)
            held_on = room_hold
            held_room = [max(0, a) for a in held_free]
        for other in ranks:
            if other == job.queue:
                continue
            head = _head(state, state.queue_records[other],
                         state.queue_records[other].pending[job.cluster])
            if head is not None and any(
                    i in set(rounds.nodes_for(state.job_records[head].shape.placement))
                    and fits(rounds.free[i], state.job_records[head].shape)
                    for i in range(len(rounds.free))):
                gaps.append(other)
        biggest = -1.0
        for name in cluster.order:
            allocatable = cluster.nodes[name].allocatable
            size = dominant(allocatable, inverse)
            if size > biggest:
                biggest, largest_node = size, list(allocatable)
    allocation = state.queue_usage(job.queue).allocation.as_dict()
    limits = {} if spec is None else spec.limits.as_dict()
    over_limit = any(allocation.get(name, 0) + requests.get(name, 0) > limit
                     for name, limit in limits.items())
    cluster_target = 0.0 if share is None else share.cluster_targets.get(job.cluster, 0.0)
    cluster_share = 0.0 if share is None else share.cluster_shares.get(job.cluster, 0.0)
    below = below_target(cluster_share, cluster_target)
    # The round's order in this cluster, one total order: (rank, name) before this queue's.
    mine = ranks.get(job.queue)
    competing = () if mine is None else tuple(sorted(
        name for name, rank in ranks.items()
        if name != job.queue and (rank, name) < (mine, job.queue)))
    above = tuple(sorted(
        name for name, other in shares.items()
        if name != job.queue and other.cluster_shares.get(job.cluster, 0.0)
        > other.cluster_targets.get(job.cluster, 0.0) + SHARE_EPSILON))
    hold = state.controller_hold(job_id)
    reason = choose_reason(WaitFacts(
        queue_defined=spec is not None,
        cordoned=spec is not None and spec.cordoned,
        cluster_has_nodes=node_count > 0,
        fits_some_node=fits_some,
        over_queue_limit=over_limit,
        fits_free_room=fits_free,
        at_fair_share=not below,
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
        fair_target=0.0 if share is None else share.fair_target,
        cluster_target=cluster_target, cluster_share=cluster_share, below_target=below,
        held_on=None if held_on is None else held_on.node,
        held_until=None if held_on is None else held_on.until,
        held_free=None if held_room is None else named(held_room),
        gaps_to=tuple(sorted(gaps)), above_target=above, preemption=preemption,
        group=_group_text(state, job),
    )
    return _with_message(explanation)


def _group_text(state: SchedulerState, job: SchedJob) -> str:
    if job.group is None:
        return ""
    status = state.groups().summary((job.cluster, job.queue, job.group))
    return "" if status is None else describe_group(status)


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

    O(queued pods of the queue): for explaining one pod; `positions` serves many at once.
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


def positions(state: SchedulerState, job_ids: Iterable[str]) -> dict[str, tuple[int, int]]:
    """`_position` for many pods, one pass over the jobs for all of them."""
    wanted: dict[str, list[tuple[tuple[int, float, str], str]]] = {}
    for job_id in job_ids:
        record = state.job_records.get(job_id)
        if record is not None and record.state is JobState.QUEUED:
            wanted.setdefault(record.queue, []).append(
                ((-record.priority, record.created_at, job_id), job_id))
    if not wanted:
        return {}
    keys: dict[str, list[tuple[int, float, str]]] = {queue: [] for queue in wanted}
    for other_id, other in state.job_records.items():
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
    else:
        return f"{where}; not waiting ({e.state})" + (f"; {e.group}" if e.group else "")
    text = f"{where}; {why}"
    if e.group:
        text += f"; {e.group}"
    if e.max_queued_seconds is not None:
        done = "deleted" if e.max_queued_action == "delete" else "failed"
        whose = " (its job set's maximum)" if e.max_queued_by == "jobset" else ""
        text += f"; it is {done} after {format_duration(e.max_queued_seconds)} queued{whose}"
    return text


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
        parts.append(f"the gaps that open go to {_queues(e.gaps_to)}, whose waiting pods fit "
                     "them; this pod needs more room on one node")
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
