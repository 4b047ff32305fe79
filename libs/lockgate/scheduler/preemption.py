"""Preemption to fair share: free room for a queue below its fair share by evicting pods of
queues above theirs, by a rule that cannot thrash.

Why it exists: a queue that took idle capacity first keeps it for as long as its pods live, and
a Deployment's pods live forever. Without preemption a queue that arrives later waits for
capacity that never comes back. With it, running pods marked preemptible (the pod label
`lockgate.io/preemptible=true`, or a priority class the operator lists) may be evicted, that is
deleted; their controller creates them again, gated, and they queue again.

A waiting *unit* J of queue B is a single pod, or a complete pod group (lockgate.groups) judged
as one: J is then the sum of its queued members. The rule (compare Kueue's
`LessThanOrEqualToFinalShare`), with cost = dominant share / weight, the quantity progressive
filling equalises: pods V of queues A may be evicted for J only if

  1. B is below its fair target in J's cluster and short of its whole target (the round owes
     it room there, `costs.owed`); a group J keeps it at or below its target there;
  2. no A drops below its adjusted fair share without its pods in V; except, for a single pod J
     that keeps B within its target in the cluster or within its whole target, A may end short
     of its target there by less than its smallest pod there if no queue then holds more than
     its target there by that pod or more, A's whole allocation over its whole target stays at
     or above B's with J, and the round ranks J before every pod A would then have waiting
     there (`_Planner.may_fall_short`, `ranks_first`): whole pods otherwise leave a big pod
     waiting for room that queues above their targets by less than one of their pods each
     cannot give;
  3. cost(B with J) <= cost(A without V_A)   (each eviction of a batch judged cumulatively);
     for a single pod, also cost(B with U) for each unit U before J that gets no room: the
     round ranks B by them before it reaches J;
  4. V is preemptible, runs (bound to a node) in J's cluster, is not B's, and V makes room for
     J: a single pod on one node; a group all at once, every member on some node (largest
     first, first fit, as the round places groups), or nothing at all is evicted for it.

Elastic groups (docs/scheduling.md, "Elastic groups"): a member of a group that has started is a
unit of its own, like a single pod; a group that has not started is judged by its gang (its
minimum). Among victims, the members of a group within its minimum (its oldest `size` running
members) are taken last: the planner first looks for room on every node without them, and only
then lets a unit break a group's minimum, so above-minimum members and single pods of queues over
their targets go first.

With a queue tree (lockgate.queue_tree) the targets are the hierarchical ones, so a node below
its guarantee or its fair target has leaves below theirs, and the rules above reclaim the room
they borrowed out, unchanged: they judge leaves against their targets, and the targets already
say what each level is due. What the tree changes is whom to take from first: victims are
ordered by their branch from the root down, the subtree furthest over its own share first
(at the highest level where two victims' branches differ, the one whose subtree's actual share
over its fair target is higher), then within it the same way, down to the leaf
(`_Planner.branch_costs`). So room production is owed comes from nlp, far over its share of
research, before vision, at its share, even when one of vision's leaves is further over its own
share than any of nlp's.

Rule 3 is the no-thrash invariant; docs/scheduling.md ("Preemption") proves that it rules out
evicting back and forth, and that in a closed system every run of evictions ends. Room freed for
a group must reach the group, not the small pods of other queues in the next rounds: the planner
reserves the group's cluster for it (`GroupIndex.reserved`, as an aged group reserves) as soon as
it plans room for it, so the round releases nothing else there until the group goes.

Pure: the caller passes the state after a round, that round's result (which jobs found no
room), and the jobs already being evicted (still running until their deletion is observed: they
are counted as gone, so a later round does not evict again for the same need). Its only effect
on the state is those reservations.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

from lockgate.growth import is_virtual
from lockgate.jobs import JobState
from lockgate.labels import PREEMPTIBLE_LABEL
from lockgate.placement import can_land
from lockgate.scheduler.costs import (
    below_target,
    cost,
    cost_below,
    dominant,
    dominant_of,
    fraction,
    owed,
    within_target,
)
from lockgate.scheduler.groups import GroupKey
from lockgate.scheduler.records import JobRecord, Shape, add_pairs, subtract_pairs
from lockgate.scheduler.room import fits, give, take
from lockgate.scheduler.round import (
    Rank,
    RoundResult,
    SkipReason,
    rank_in_cluster,
    uncontested,
)
from lockgate.scheduler.state import SchedulerState

__all__ = ["PREEMPTIBLE_LABEL", "Eviction", "PreemptionPolicy", "plan_evictions"]


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    """Off unless configured: the scheduler runs `plan_evictions` only when enabled."""

    preemptible_priority_classes: frozenset[str] = frozenset()
    max_evictions_per_round: int = 100


@dataclass(frozen=True, slots=True)
class Eviction:
    """Delete `job_id` (queue `queue`, on `node`) to make room for `for_job` of `for_queue`
    (for a pod group, `for_job` is its first member and `for_group` names the group)."""

    job_id: str
    queue: str
    cluster: str
    node: str
    for_job: str
    for_queue: str
    # Costs (share / weight) the rule compared, and the shares, for the record and the Event.
    victim_cost_after: float
    preemptor_cost_after: float
    victim_share: float
    victim_fair_share: float
    preemptor_share: float
    preemptor_fair_share: float
    for_group: str | None = None  # "<namespace>/<name>"
    for_group_size: int = 0  # its queued members, all of which the evictions make room for

    @property
    def message(self) -> str:
        waiting = ("a pod" if self.for_group is None else
                   f"a pod group {self.for_group!r} of {self.for_group_size} pods")
        return (
            f"preempted by lockgate to fair targets: in cluster {self.cluster}, queue "
            f"{self.queue!r} holds {self.victim_share:.1%} of the pool (fair target there "
            f"{self.victim_fair_share:.1%}); queue {self.for_queue!r} holds "
            f"{self.preemptor_share:.1%} (fair target there "
            f"{self.preemptor_fair_share:.1%}) and has {waiting} waiting for this room. The "
            f"pod's controller may create it again; it then waits in queue {self.queue!r}.")


@dataclass(frozen=True, slots=True)
class _Unit:
    """What a queue has waiting, in release order: a single pod, or a whole group (at its first
    member). Only a *candidate* may be preempted for: it waits where the round found no room,
    and for nothing but room. The others still count, for what the round ranks the queue by
    before it reaches a candidate (see `_Planner.plan`)."""

    job_id: str
    group: GroupKey | None
    candidate: bool


def is_preemptible(job: JobRecord, policy: PreemptionPolicy) -> bool:
    return job.preemptible or (
        bool(job.priority_class) and job.priority_class in policy.preemptible_priority_classes)


def plan_evictions(state: SchedulerState, result: RoundResult, *, policy: PreemptionPolicy,
                   evicting: Collection[str]) -> list[Eviction]:
    """Evictions that would let queues below their fair share run their waiting pods and
    groups; reserves the cluster of each group it plans room for (see the module docstring).

    When some queue below its fair share has a unit that found no room, costs the running pods
    of the clusters it reads (from the state's index, `SchedulerState.bound_jobs`) and the
    units it reads; nothing otherwise. No pass over every job: most of them are queued.
    """
    if policy.max_evictions_per_round <= 0:
        return []
    waiting = _waiting_for_room(state, result, policy.max_evictions_per_round)
    if not waiting:
        return []
    return _Planner(state, policy, evicting).plan(waiting)


@dataclass(slots=True)
class _Waiting:
    """A queue's units in release order from its first candidate on (`_units`, read as the plan
    goes), and the clusters where they may be candidates."""

    where: set[str]
    units: Iterator[_Unit]


def _waiting_for_room(state: SchedulerState, result: RoundResult,
                      limit: int) -> dict[str, _Waiting]:
    """Per queue that has a unit waiting for room, its units in release order over all its
    clusters, from its first candidate up to its `limit`-th, found as the plan reads them (it
    may stop early: `_Planner.plan`).

    A unit is a candidate when it waits in a cluster where the round found no room for one of
    the queue's pods (or set the cluster aside for it, or the cluster is reserved for one of its
    groups), and, for a group, when it is complete and only room keeps it waiting.
    """
    jobs = state.job_records
    clusters: dict[str, set[str]] = {}
    for job_id, reason in result.skipped_jobs.items():
        job = jobs.get(job_id)
        if reason is SkipReason.NO_NODE_WITH_ROOM and job is not None:
            clusters.setdefault(job.queue, set()).add(job.cluster)
    for name, report in result.queues.items():
        if report.set_aside:
            clusters.setdefault(name, set()).update(report.set_aside)
    for cluster_name, key in state.groups().reserved.items():
        clusters.setdefault(key[1], set()).add(cluster_name)
    waiting: dict[str, _Waiting] = {}
    for name, where in clusters.items():
        queue = state.queue_records.get(name)
        if queue is None:
            continue
        # A unit in a cluster outside `where` is no candidate, and only candidates count
        # (towards the limit, and for the plan): those clusters' entries are not read. Stale
        # entries are filtered in `_units`; twice the limit leaves room for them.
        entries = heapq.merge(*(pending.smallest(2 * limit + 16)
                                for cluster_name, pending in queue.pending.items()
                                if cluster_name in where))
        units = _units(state, result, name, entries, where, limit)
        # The plan skips every unit before the first candidate: they are dropped here.
        first = next((unit for unit in units if unit.candidate), None)
        if first is not None:
            waiting[name] = _Waiting(where, itertools.chain((first,), units))
    return waiting


def _units(state: SchedulerState, result: RoundResult, queue: str,
           entries: Iterable[tuple[int, float, str]], where: set[str],
           limit: int) -> Iterator[_Unit]:
    """The queue's units in the heap entries given (sorted: release order), fresh entries only,
    up to the `limit`-th candidate. Read lazily while the plan runs: what it reads (the jobs,
    the groups' members, the round's result) the plan does not change."""
    jobs = state.job_records
    seen: set[str] = set()
    seen_groups: set[GroupKey] = set()
    candidates = 0
    for priority, created_at, job_id in entries:
        job = jobs.get(job_id)
        if (job_id in seen or job is None or job.state is not JobState.QUEUED
                or job.parked or job.queue != queue
                or job.priority != -priority or job.created_at != created_at):
            continue
        seen.add(job_id)
        key = None if job.group is None else (job.cluster, job.queue, job.group)
        if key is None or state.groups().started(key):
            # A single pod, or a member of a started group, which joins alone (unless the
            # group holds its maximum: no room helps it).
            candidate = job.cluster in where and (key is None or not state.groups().at_max(key))
            yield _Unit(job_id, None, candidate)
        else:
            if key in seen_groups:
                continue  # a later member of a group already listed
            seen_groups.add(key)
            candidate = job.cluster in where and _waits_for_room_only(state, result, key)
            yield _Unit(job_id, key, candidate)
        candidates += candidate
        if candidates >= limit:
            return


def _waits_for_room_only(state: SchedulerState, result: RoundResult, key: GroupKey) -> bool:
    """Whether a group waits for nothing but room: complete, no member parked as too big, within
    its queue's limits, and not turned down this round for another reason."""
    status = state.groups().status(key)
    if status is None or not status.complete:
        return False
    member_ids = state.groups().gang(key)
    members = [state.job_records[member] for member in member_ids]
    if any(member.parked for member in members):
        return False
    # A member the round did not look at (lookback, set aside) has no reason: room it is.
    if any(result.skipped_jobs.get(member, SkipReason.NO_NODE_WITH_ROOM)
           is not SkipReason.NO_NODE_WITH_ROOM for member in member_ids):
        return False
    queue = state.queue_records[key[1]]
    if queue.limit_pairs:
        total = queue.allocation[:]
        for member in members:
            _add(total, member.shape)
        if any(total[axis] > limit for axis, limit in queue.limit_pairs):
            return False
    return True


@dataclass(slots=True)
class _Search:
    """One search for room for a pod (or a group's member) in a cluster, over its nodes: what
    the rule's answer for a victim depends on besides the victim and the victims chosen before
    it on the same node. `first_picks` remembers the answers for victims chosen first on their
    node (`_Planner._may_take_first`); it is valid while the planner's state stands, that is for
    the search (nothing changes until it has chosen)."""

    cluster: str
    queue: str  # the preemptor's
    shape: Shape
    preemptor_cost: float
    alloc: dict[str, list[int]]  # per queue, as the search counts it
    alloc_in: dict[str, list[int]] | None  # per queue in the cluster; None: the planner's
    short_by_a_pod: bool
    first_picks: dict[tuple[str, Shape], bool] = field(default_factory=dict)

    def held_in(self, planner: _Planner, queue: str) -> list[int]:
        return self.alloc_in[queue] if self.alloc_in is not None else planner.in_cluster(
            queue, self.cluster)


class _Planner:
    def __init__(self, state: SchedulerState, policy: PreemptionPolicy,
                 evicting: Collection[str]) -> None:
        self.state = state
        self.policy = policy
        # The one cost model's measure (the fairness resources) and the constrained fair
        # targets, the shares preemption converges to: per queue, and per queue and cluster.
        self.inverse = state.fairness_inverse()
        targets = state.fair_targets(latest=True)  # those the round just ranked by
        self.fair = {name: target.share for name, target in targets.queues.items()}
        self.targets = targets
        self.top_cost = targets.top_cost
        self.uncontested: dict[str, bool] = {}  # per cluster, of the queues still waiting
        self.fair_in = {(name, cluster): share for name, target in targets.queues.items()
                        for cluster, share in target.cluster_shares.items()}
        self.alloc = {name: queue.allocation[:] for name, queue in state.queue_records.items()}
        self.alloc_in = {(name, cluster): vector[:]
                         for name, queue in state.queue_records.items()
                         for cluster, vector in queue.alloc_in.items()}
        self.factor = {name: queue.priority_factor for name, queue in state.queue_records.items()}
        # Per cluster, the queues that held room there when the plan began (rule 2's
        # exception looks at each one's excess), found on first use.
        self.queues_in: dict[str, list[str]] = {}
        self.evicting = set(evicting)
        self.free: dict[str, dict[str, list[int]] | None] = {}
        self.victims: dict[str, dict[str, list[tuple[str, JobRecord]]]] = {}
        # Per cluster, per (queue, shape) of its victims, the nodes they run on (`_worth_trying`).
        self.victim_kinds: dict[str, dict[tuple[str, Shape], set[str]]] = {}
        # Running group members within their group's minimum: taken only when nothing else
        # will do (see the module docstring), filled in per cluster with its victims.
        self.within_min: set[str] = set()
        jobs = state.job_records
        for job_id in self.evicting:
            job = jobs.get(job_id)
            if job is not None and job.state is not JobState.QUEUED:
                _subtract(self.alloc[job.queue], job.shape)  # as good as gone
                _subtract(self.in_cluster(job.queue, job.cluster), job.shape)
        self.reserved = state.groups().reserved
        # With a queue tree: each node's fair target (share units, its leaves' added), and the
        # victims' branches' costs, recounted from `alloc` when it changed (`branch_costs`).
        self.tree = state.queue_tree
        self.node_targets = dict(targets.node_shares)
        self._branch_costs: dict[str, tuple[float, ...]] | None = None
        # Answers that stand until an allocation changes (`allocations_changed`): rule 1 per
        # (queue, cluster), asked for each of thousands of waiting pods at saturation.
        self._owed: dict[tuple[str, str], bool] = {}
        # Answers that stand for the whole plan (they read the state only, which the plan does
        # not change): each queue's smallest pod per cluster.
        self._smallest_pod: dict[tuple[str, str], float] = {}
        self._minimum_nodes: dict[str, set[str]] = {}  # per cluster (`_holds_minimums`)

    def branch_costs(self, queue: str) -> tuple[float, ...]:
        """With a queue tree, the costs (actual share / fair target) of the queue's branch from
        the root's child down to the queue itself: victims are taken from the subtree furthest
        over its own share first (the module docstring). () without a tree."""
        tree = self.tree
        if tree is None or queue not in tree:
            return ()
        costs = self._branch_costs
        if costs is None:
            actual: dict[str, float] = {}
            for leaf in tree.leaves:
                vector = self.alloc.get(leaf)
                if vector is None:
                    continue
                held = self.share(leaf, vector)
                for node in (leaf, *tree.ancestors(leaf)):
                    actual[node] = actual.get(node, 0.0) + held
            node_cost: dict[str, float] = {}
            for node, held in actual.items():
                target = self.node_targets.get(node, 0.0)
                node_cost[node] = (held / target if target > 0
                                   else float("inf") if held > 0 else 0.0)
            costs = self._branch_costs = {
                leaf: tuple(node_cost.get(node, 0.0)
                            for node in (*reversed(tree.ancestors(leaf)), leaf))
                for leaf in tree.leaves}
        return costs.get(queue, ())

    def allocations_changed(self) -> None:
        """The branches' costs and rule 1's answers are recounted when next asked."""
        self._branch_costs = None
        self._owed.clear()

    def share(self, queue: str, vector: list[int] | None = None) -> float:
        vector = self.alloc[queue] if vector is None else vector
        return dominant(vector, self.inverse)

    def cost(self, queue: str, vector: list[int] | None = None) -> float:
        """How far the queue is towards its fair target: share / target (the targets are
        weighted already, so this is what the round equalises within targets)."""
        share = self.share(queue, vector)
        target = self.fair.get(queue, 0.0)
        if target <= 0:
            return float("inf") if share > 0 else 0.0
        return share / target

    def in_cluster(self, queue: str, cluster: str) -> list[int]:
        vector = self.alloc_in.get((queue, cluster))
        if vector is None:
            vector = self.alloc_in[(queue, cluster)] = [0] * len(self.inverse)
        return vector

    def cost_in(self, queue: str, cluster: str, vector_in: list[int] | None = None) -> float:
        """How far the queue is towards its fair target in `cluster`: share there / target
        there (infinite where its target there is nothing but it holds some)."""
        held = self.in_cluster(queue, cluster) if vector_in is None else vector_in
        share = self.share(queue, held)
        target = self.fair_in.get((queue, cluster), 0.0)
        if target <= 0:
            return float("inf") if share > 0 else 1.0  # holding nothing is its target
        return share / target

    def within_target(self, queue: str, cluster: str, vector_in: list[int]) -> bool:
        """Rule 1 for a group: with it (`vector_in`, what the queue would hold in the cluster)
        the queue is at or below its fair target there."""
        return within_target(self.share(queue, vector_in), self.fair_in.get((queue, cluster), 0.0))

    def owed(self, queue: str, cluster: str) -> bool:
        """Rule 1 for a single pod, as the round ranks it (`costs.owed`): the queue holds less
        than its target in the pod's cluster, and its whole allocation is short of its whole
        target. A pod the round ranks by cost (the room is nobody's due) is never preempted
        for: the round could give the room freed to another queue, and preemption would free
        it again."""
        known = self._owed.get((queue, cluster))
        if known is None:
            known = self._owed[(queue, cluster)] = self._owed_now(queue, cluster)
        return known

    def _owed_now(self, queue: str, cluster: str) -> bool:
        return owed(before=self.share(queue, self.in_cluster(queue, cluster)),
                    target=self.fair_in.get((queue, cluster), 0.0),
                    overall_before=fraction(self.share(queue), self.fair.get(queue, 0.0)))

    def smallest_pod(self, queue: str, cluster: str) -> float:
        """The dominant share of the queue's smallest pod in the cluster, running or waiting."""
        known = self._smallest_pod.get((queue, cluster))
        if known is None:
            known = self._smallest_pod[(queue, cluster)] = min(
                (dominant_of(shape, self.inverse)
                 for shapes in (self.state.queue_records[queue].alloc_shapes.get(cluster, {}),
                                self._waiting_shapes(queue, cluster))
                 for shape in shapes), default=0.0)
        return known

    def may_fall_short(self, victim: str, cluster: str, without_in: list[int],
                       held_in: dict[str, list[int]]) -> bool:
        """Rule 2's exception for a single pod: the victim's queue, holding `without_in` in
        the cluster, is short of its target there by less than its smallest pod there, and
        no queue (`held_in`: the planned holdings in the cluster of those that differ from
        the planner's) holds more than its target there by that pod or more. Such a victim
        is owed room only for pods that carry it past its target, and nobody then has room
        to spare for one of them, so it preempts nobody back."""
        smallest = self.smallest_pod(victim, cluster)
        if within_target(self.share(victim, without_in) + smallest,
                         self.fair_in.get((victim, cluster), 0.0)):
            return False
        names = self.queues_in.get(cluster)
        if names is None:
            names = self.queues_in[cluster] = [
                name for (name, where) in self.alloc_in if where == cluster]
        for name in {*names, *held_in}:
            if name == victim:
                continue
            vector = held_in.get(name)
            held = self.share(name, self.in_cluster(name, cluster) if vector is None else vector)
            if not below_target(held, self.fair_in.get((name, cluster), 0.0) + smallest):
                return False  # it holds its target there and that pod, or more
        return True

    def _uncontested(self, cluster: str) -> bool:
        known = self.uncontested.get(cluster)
        if known is None:
            known = self.uncontested[cluster] = uncontested(self.state, self.targets, cluster)
        return known

    def round_rank(self, queue: str, cluster: str, held_in: list[int], held: list[int],
                   shape: Shape) -> tuple[Rank, str]:
        """How the round ranks the queue in `cluster` for a pod of `shape`, holding `held_in`
        there and `held` in all (`round.rank_in_cluster`, then the queue's name)."""
        whole = self.fair.get(queue, 0.0)
        after = _plus(held, shape)
        return (rank_in_cluster(
            before=self.share(queue, held_in), after=self.share(queue, _plus(held_in, shape)),
            target=self.fair_in.get((queue, cluster), 0.0),
            cost_after=cost(self.share(queue, after), self.factor.get(queue, 1.0)),
            size=dominant_of(shape, self.inverse),
            overall_before=fraction(self.share(queue, held), whole),
            overall_after=fraction(self.share(queue, after), whole),
            by_cost=self._uncontested(cluster), top_cost=self.top_cost), queue)

    def ranks_first(self, queue: str, cluster: str, shape: Shape, held: list[int],
                    victim_queue: str, victim_shape: Shape, without_in: list[int],
                    without: list[int]) -> bool:
        """Whether the round ranks the preemptor's pod (`shape`, its queue holding `held`)
        before every pod its victim's queue would then have waiting in the cluster (the
        victim's replacement, and its other waiting shapes)."""
        mine = self.round_rank(queue, cluster, self.in_cluster(queue, cluster), held, shape)
        return all(mine < self.round_rank(victim_queue, cluster, without_in, without, theirs)
                   for theirs in {victim_shape, *self._waiting_shapes(victim_queue, cluster)})

    def _waiting_shapes(self, queue: str, cluster: str) -> list[Shape]:
        pending = self.state.queue_records[queue].pending.get(cluster)
        return [] if pending is None else [shape for shape, n in pending.shapes.items() if n]

    def at_or_above_target(self, queue: str, cluster: str, vector_in: list[int]) -> bool:
        """Rule 2: a victim's queue keeps at least its fair target in the cluster."""
        return not below_target(self.share(queue, vector_in),
                                self.fair_in.get((queue, cluster), 0.0))

    def plan(self, waiting: dict[str, _Waiting]) -> list[Eviction]:
        state = self.state
        preemptors = [name for name in waiting if state.queue_records[name].schedulable]
        preemptors.sort(key=lambda name: (self.cost(name), name))
        evictions: list[Eviction] = []
        limit = self.policy.max_evictions_per_round
        # (queue, cluster, shape) no node could be freed for. Within a plan that stays so: the
        # preemptor's cost only rises as it gains, victims' queues only lose, and free room only
        # gets taken, so its queue's later pods of that shape there are not tried again (they
        # cost O(nodes x pods) each, seconds per round with thousands waiting).
        unfreeable: set[tuple[str, str, Shape]] = set()
        with_groups = self._queues_with_groups()
        for name in preemptors:
            # The clusters where the queue's single pods may still be preempted for. One where
            # rule 1 fails, or a group of another queue holds the reservation, stays so while
            # this queue's units are planned: its allocation only grows, its pods are nobody's
            # victims here, and only its own groups reserve. When none is left and it has no
            # group waiting in them, its later units would all be passed over: they are not
            # read (at saturation, thousands a round).
            open_to_singles = set(waiting[name].where)
            groups_in = {cluster for cluster in open_to_singles if (cluster, name) in with_groups}
            holds_ahead: dict[str, set[str]] = {}  # per cluster (`_holds_ahead`)
            for unit in waiting[name].units:
                if len(evictions) >= limit:
                    return evictions
                if not unit.candidate:
                    continue
                cluster = state.job_records[unit.job_id].cluster
                if unit.group is None and cluster not in open_to_singles:
                    continue
                if unit.group is not None:
                    # Its cluster is reserved for it once room is planned. One too large for
                    # its queue's target there is passed over (it can never be preempted for);
                    # the queue's later units may still be.
                    found = self._make_room_for_group(name, unit.job_id, unit.group,
                                                      limit - len(evictions))
                    if found is not None:
                        evictions.extend(found)
                    continue
                job = state.job_records[unit.job_id]
                holder = self.reserved.get(job.cluster)
                # rule 1: nothing to free for it (as the round ranks it); or room freed there
                # would go to that group
                if not self.owed(name, cluster) or (holder is not None and holder[1] != name):
                    open_to_singles.discard(cluster)
                    if not open_to_singles and not groups_in:
                        break
                    continue
                # A pod with room held for it has that room besides: it is always tried.
                tried_alike = self.state.room_holds().of(unit.job_id) is None
                if not tried_alike:
                    self._holds_ahead(name, cluster, holds_ahead).discard(unit.job_id)
                elif (name, cluster, job.shape) in unfreeable:
                    continue
                found = self._make_room(name, unit.job_id, job, limit - len(evictions),
                                        self.cost_in(name, cluster))
                if found is None and tried_alike:
                    unfreeable.add((name, cluster, job.shape))
                if found is not None:
                    _add(self.alloc[name], job.shape)
                    _add(self.in_cluster(name, cluster), job.shape)
                    self.allocations_changed()
                    evictions.extend(found)
                if (found is None or not tried_alike) and self._tried_every_shape(
                        name, cluster, unfreeable, self._holds_ahead(name, cluster, holds_ahead)):
                    open_to_singles.discard(cluster)
                    if not open_to_singles and not groups_in:
                        break
        return evictions

    def _holds_ahead(self, queue: str, cluster: str, known: dict[str, set[str]]) -> set[str]:
        """The queue's pods in the cluster with room held for them (always tried), less those
        the plan has read (it discards them): found once per cluster and queue."""
        ahead = known.get(cluster)
        if ahead is None:
            jobs = self.state.job_records
            ahead = known[cluster] = {
                hold.job_id for hold in self.state.room_holds().in_cluster(cluster)
                if (job := jobs.get(hold.job_id)) is not None and job.queue == queue}
        return ahead

    def _tried_every_shape(self, queue: str, cluster: str,
                           unfreeable: set[tuple[str, str, Shape]], holds_ahead: set[str]) -> bool:
        """Whether no node can be freed for any shape the queue has waiting in the cluster
        (its pending record's shapes: every job of it queued there, unless parked or held back,
        and none is held back), and none of its pods there not read yet has room held (those
        are always tried): then none of its later pods there is tried."""
        record = self.state.queue_records[queue]
        pending = record.pending.get(cluster)
        if pending is None or record.held or holds_ahead:
            return False
        return not any(n and (queue, cluster, shape) not in unfreeable
                       for shape, n in pending.shapes.items())

    def _queues_with_groups(self) -> set[tuple[str, str]]:
        """(cluster, queue) of every group with a member unfinished (a superset of those with
        one waiting: enough to know where no group can be a unit)."""
        unfinished = self.state.groups().keys()
        return {(cluster, queue) for cluster, queue, _ in unfinished}

    def _make_room(self, queue: str, job_id: str, job: JobRecord, budget: int,
                   preemptor_cost: float) -> list[Eviction] | None:
        """Evictions that make room for `job` on one node (empty if room is already free), and
        take that room for it; None when no node can be freed by the rule, with victims' costs
        kept at or above `preemptor_cost`."""
        rooms = self._rooms(job.cluster)
        if rooms is None:
            return None
        shape = job.shape
        nodes = self._nodes_for(job.cluster, shape, rooms)
        own = self.state.room_holds().of(job_id)
        if own is not None and own.node in rooms:
            give(rooms[own.node], shape)  # its own hold's room is its own
            nodes.sort(key=lambda node: node != own.node)  # and room freed there meets it
        for node in nodes:
            room = rooms[node]
            if fits(room, shape):
                take(room, shape)  # freed already (earlier evictions in flight), or free
                return []
        # Only a pod that keeps its queue within its target there, or within its whole target,
        # may leave a victim short of its own (rule 2's exception, `may_fall_short`).
        within = self.within_target(queue, job.cluster,
                                    _plus(self.in_cluster(queue, job.cluster), shape)) or (
            within_target(self.share(queue, _plus(self.alloc[queue], shape)),
                          self.fair.get(queue, 0.0)))
        search = _Search(job.cluster, queue, shape, preemptor_cost, self.alloc, None,
                         short_by_a_pod=within)
        worth_trying = self._worth_trying(search)
        for spare_minimums in (True, False):  # break no group's minimum while room exists without
            for node in nodes:
                if node not in worth_trying:
                    continue  # no room there, and no pod there may go first
                if not spare_minimums and not self._holds_minimums(job.cluster, node):
                    continue  # the same victims as the first pass: it found nothing here
                room = rooms[node]
                chosen = self._victims_on(search, node, room, (),
                                          spare_minimums=spare_minimums)
                if chosen is None or len(chosen) > budget:
                    continue
                evictions = self._record(
                    [(victim_id, victim, node) for victim_id, victim in chosen],
                    cluster=job.cluster, for_job=job_id, for_queue=queue,
                    preemptor_cost=preemptor_cost)
                for _, victim in chosen:
                    _add(room, victim.shape)
                take(room, shape)
                return evictions
        return None

    def _make_room_for_group(self, queue: str, first_id: str, key: GroupKey,
                             budget: int) -> list[Eviction] | None:
        """Evictions that make room for every queued member of a group at once (empty if the
        room is already free), and take that room for them; None, with nothing changed, when
        the rule cannot make all of them fit or it would take more than `budget` evictions.

        On success the group's cluster is reserved for it, so the room reaches it.
        """
        cluster = key[0]
        holder = self.reserved.get(cluster)
        if holder is not None and holder != key:
            return None  # one reservation per cluster: room freed there goes to that group
        rooms = self._rooms(cluster)
        if rooms is None:
            return None
        jobs = self.state.job_records
        members = [jobs[member] for member in self.state.groups().gang(key)]
        with_group = self.alloc[queue][:]
        with_group_in = self.in_cluster(queue, cluster)[:]
        for member in members:
            _add(with_group, member.shape)
            _add(with_group_in, member.shape)
        if not self.within_target(queue, cluster, with_group_in):
            return None  # rule 1, with J the whole group
        preemptor_cost = self.cost_in(queue, cluster, with_group_in)
        # Worked on copies: a group that cannot be made to fit leaves everything as it was.
        trial_rooms = {node: room[:] for node, room in rooms.items()}
        trial_alloc = {name: vector[:] for name, vector in self.alloc.items()}
        trial_in = {name: self.in_cluster(name, cluster)[:] for name in self.alloc}
        taken: set[str] = set()
        chosen: list[tuple[str, JobRecord, str]] = []
        inverse = self.inverse
        # Largest first, as the round places a group (a stable sort keeps ties in order).
        for member in sorted(members, reverse=True,
                             key=lambda m: dominant_of(m.shape, inverse)):
            shape = member.shape
            nodes = self._nodes_for(cluster, shape, trial_rooms)
            node = next((node for node in nodes if fits(trial_rooms[node], shape)), None)
            if node is None:
                search = _Search(cluster, queue, shape, preemptor_cost, trial_alloc, trial_in,
                                 short_by_a_pod=False)
                worth_trying = self._worth_trying(search)
                for spare_minimums, candidate in [(spare, node) for spare in (True, False)
                                                  for node in nodes]:
                    if candidate not in worth_trying:
                        continue  # no room there, and no pod there may go first
                    if not spare_minimums and not self._holds_minimums(cluster, candidate):
                        continue  # the same victims as the first pass: it found nothing here
                    victims = self._victims_on(search, candidate, trial_rooms[candidate], taken,
                                               spare_minimums=spare_minimums)
                    if victims is None or len(chosen) + len(victims) > budget:
                        continue
                    for victim_id, victim in victims:
                        _subtract(trial_alloc[victim.queue], victim.shape)
                        _subtract(trial_in[victim.queue], victim.shape)
                        _add(trial_rooms[candidate], victim.shape)
                        taken.add(victim_id)
                        chosen.append((victim_id, victim, candidate))
                    node = candidate
                    break
                else:
                    return None  # all or nothing: this member cannot be made to fit
            take(trial_rooms[node], shape)
        evictions = self._record(chosen, cluster=cluster, for_job=first_id, for_queue=queue,
                                 preemptor_cost=preemptor_cost, group=key[2],
                                 size=len(members))
        for node, room in trial_rooms.items():
            rooms[node][:] = room
        self.alloc[queue] = with_group
        self.alloc_in[(queue, cluster)] = with_group_in
        self.allocations_changed()
        self.reserved[cluster] = key
        return evictions

    def _record(self, chosen: list[tuple[str, JobRecord, str]], *, cluster: str, for_job: str,
                for_queue: str, preemptor_cost: float, group: str | None = None,
                size: int = 0) -> list[Eviction]:
        """Count the victims (id, job, node) as gone from their queues' allocations, each after
        the ones before it, and describe each eviction."""
        evictions = []
        for victim_id, victim, node in chosen:
            before = self.share(victim.queue, self.in_cluster(victim.queue, cluster))
            _subtract(self.alloc[victim.queue], victim.shape)
            _subtract(self.in_cluster(victim.queue, cluster), victim.shape)
            self.allocations_changed()
            self.evicting.add(victim_id)
            evictions.append(Eviction(
                job_id=victim_id, queue=victim.queue, cluster=cluster, node=node,
                for_job=for_job, for_queue=for_queue,
                victim_cost_after=self.cost_in(victim.queue, cluster),
                preemptor_cost_after=preemptor_cost,
                victim_share=before,
                victim_fair_share=self.fair_in.get((victim.queue, cluster), 0.0),
                preemptor_share=self.share(for_queue, self.in_cluster(for_queue, cluster)),
                preemptor_fair_share=self.fair_in.get((for_queue, cluster), 0.0),
                for_group=group, for_group_size=size))
        return evictions

    def _nodes_for(self, cluster: str, shape: Shape, rooms: dict[str, list[int]]) -> list[str]:
        """The nodes (first-fit order) the pod's taints, selectors and affinity let it on."""
        if shape.placement is None:
            return list(rooms)
        nodes = self.state.cluster_records[cluster].nodes
        return [name for name in rooms if can_land(shape.placement, nodes[name].traits)]

    def _victims_on(self, search: _Search, node: str, room: list[int], taken: Collection[str],
                    *, spare_minimums: bool = False) -> list[tuple[str, JobRecord]] | None:
        """The fewest-first greedy choice of victims on `node` that the rule allows, given the
        allocations `search.alloc` (victims chosen before for the same unit already taken out),
        and that make room for `search.shape`; None if they cannot. With `spare_minimums`, no
        member within its group's minimum is taken; without, they are taken last. With
        `search.short_by_a_pod` (for a single pod), rule 2's exception applies
        (`may_fall_short`): then rule 3 is judged by the whole targets, and the round must rank
        the pod before any the victim's queue would then have waiting there."""
        cluster, queue, shape = search.cluster, search.queue, search.shape
        within_min = self.within_min
        candidates = [(victim_id, victim) for victim_id, victim
                      in self.victims[cluster].get(node, ())
                      if victim.queue != queue and victim_id not in self.evicting
                      and victim_id not in taken
                      and not (spare_minimums and victim_id in within_min)]
        if not candidates:
            return None

        def helps(victim: JobRecord, short: list[int]) -> bool:
            return any(axis in short for axis, _ in victim.shape.pairs)

        # Until a victim is chosen each is judged as the first pick: if none may be taken first
        # and help, none is ever taken here, whatever the order.
        short = [axis for axis, amount in shape.pairs if room[axis] < amount]
        if not any(helps(victim, short) and self._may_take_first(search, victim.queue,
                                                                  victim.shape)
                   for _, victim in candidates):
            return [] if fits(room, shape) else None
        # Take from the most over-served queue first (with a tree: from the subtree furthest
        # over its own share, level by level, `branch_costs`), its lowest priority and newest
        # pods first.
        queue_order: dict[str, tuple[tuple[float, ...], float]] = {}

        def order_of(name: str) -> tuple[tuple[float, ...], float]:
            known = queue_order.get(name)
            if known is None:
                known = queue_order[name] = (tuple(-c for c in self.branch_costs(name)),
                                             -self.cost_in(name, cluster, search.held_in(self,
                                                                                         name)))
            return known

        candidates.sort(key=lambda item: (item[0] in within_min, *order_of(item[1].queue),
                                          item[1].priority, -item[1].created_at, item[0]))
        freed = room[:]
        trial: dict[str, list[int]] = {}  # the victims' queues' allocations, as chosen so far
        trial_in: dict[str, list[int]] = {}  # ... and in this cluster
        chosen: list[tuple[str, JobRecord]] = []
        for victim_id, victim in candidates:
            if fits(freed, shape):
                break
            short = [axis for axis, amount in shape.pairs if freed[axis] < amount]
            if not helps(victim, short):
                continue  # would not help
            if not (self._may_take(search, victim.queue, victim.shape, trial, trial_in)
                    if chosen else self._may_take_first(search, victim.queue, victim.shape)):
                continue
            trial[victim.queue] = _minus(trial.get(victim.queue, search.alloc[victim.queue]),
                                         victim.shape)
            trial_in[victim.queue] = _minus(
                trial_in.get(victim.queue, search.held_in(self, victim.queue)), victim.shape)
            _add(freed, victim.shape)
            chosen.append((victim_id, victim))
        return chosen if fits(freed, shape) else None

    def _may_take(self, search: _Search, victim_queue: str, victim_shape: Shape,
                  trial: dict[str, list[int]], trial_in: dict[str, list[int]]) -> bool:
        """Rules 2 and 3 for a pod of `victim_shape` of `victim_queue`, that queue holding
        `trial` / `trial_in` (where a victim of it was chosen before on the node) or else what
        the search gives (`alloc`, `held_in`)."""
        cluster, queue, shape, alloc = search.cluster, search.queue, search.shape, search.alloc
        without = _minus(trial.get(victim_queue, alloc[victim_queue]), victim_shape)
        without_in = _minus(trial_in.get(victim_queue, search.held_in(self, victim_queue)),
                            victim_shape)
        if self.at_or_above_target(victim_queue, cluster, without_in):
            # rule 3: the preemptor must not end up further towards its target
            return not cost_below(self.cost_in(victim_queue, cluster, without_in),
                                  search.preemptor_cost)
        if not search.short_by_a_pod or not self.may_fall_short(
                victim_queue, cluster, without_in,
                {**trial_in, victim_queue: without_in,
                 queue: _plus(self.in_cluster(queue, cluster), shape)}):
            return False  # rule 2: never below its own fair target
        if cost_below(self.cost(victim_queue, without), self.cost(queue, _plus(alloc[queue],
                                                                               shape))):
            return False  # rule 3, by the whole targets (the round's order, `costs.owed`)
        # else the round would give the room back to the victim
        return self.ranks_first(queue, cluster, shape, alloc[queue], victim_queue, victim_shape,
                                without_in, without)

    def _may_take_first(self, search: _Search, victim_queue: str, victim_shape: Shape) -> bool:
        """`_may_take` for a pod chosen first on its node (nothing chosen before it there): the
        answer reads nothing node-specific, so the search remembers it."""
        key = (victim_queue, victim_shape)
        known = search.first_picks.get(key)
        if known is None:
            known = search.first_picks[key] = self._may_take(search, victim_queue, victim_shape,
                                                             {}, {})
        return known

    def _worth_trying(self, search: _Search) -> set[str]:
        """The nodes of the search's cluster with a victim of a (queue, shape) that may go
        first. On the others, where the search has found no free room already, no victim is
        ever chosen (`_victims_on`): at saturation that is most nodes for most searches, passed
        over without looking at their pods."""
        nodes: set[str] = set()
        for (victim_queue, victim_shape), where in self.victim_kinds[search.cluster].items():
            if victim_queue != search.queue and not where <= nodes and self._may_take_first(
                    search, victim_queue, victim_shape):
                nodes |= where
        return nodes

    def _holds_minimums(self, cluster: str, node: str) -> bool:
        """Whether a running member within its group's minimum is a victim on the node."""
        nodes = self._minimum_nodes.get(cluster)
        if nodes is None:
            within_min = self.within_min
            nodes = self._minimum_nodes[cluster] = {
                name for name, victims in self.victims.get(cluster, {}).items()
                if any(victim_id in within_min for victim_id, _ in victims)}
        return node in nodes

    def _rooms(self, cluster_name: str) -> dict[str, list[int]] | None:
        """Free room per schedulable node of a cluster, counting evictions in flight as done;
        None while released pods there are not bound yet (they may be about to take it)."""
        if cluster_name in self.free:
            return self.free[cluster_name]
        cluster = self.state.cluster_records.get(cluster_name)
        rooms: dict[str, list[int]] | None = None
        if cluster is not None and not cluster.held_unbound:
            # Only nodes that exist: evicting makes no room on a node that may exist.
            rooms = {name: cluster.nodes[name].free[:] for name in cluster.order
                     if not is_virtual(name)}
            victims: dict[str, list[tuple[str, JobRecord]]] = {}
            members: dict[GroupKey, list[tuple[float, str]]] = {}
            # The pods holding a node, from the state's index (`bound_jobs`): the plan costs
            # the running pods of the clusters it reads, not a pass over every job. Their order
            # decides nothing: victims are sorted on keys ending with the job id, and a
            # group's members on (created_at, job id).
            for node_name, bound_there in self.state.bound_jobs(cluster_name).items():
                room = rooms.get(node_name)
                if room is None:
                    continue
                for job_id, job in bound_there.items():
                    if job_id in self.evicting:
                        _add(room, job.shape)
                        continue
                    if is_preemptible(job, self.policy):
                        victims.setdefault(node_name, []).append((job_id, job))
                    if job.group is not None:
                        members.setdefault((cluster_name, job.queue, job.group), []).append(
                            (job.created_at, job_id))
            self.victims[cluster_name] = victims
            kinds: dict[tuple[str, Shape], set[str]] = {}
            for node_name, on_node in victims.items():
                for _, victim in on_node:
                    kinds.setdefault((victim.queue, victim.shape), set()).add(node_name)
            self.victim_kinds[cluster_name] = kinds
            # A group's oldest `size` running members are its minimum; newer ones are above it.
            for key, running in members.items():
                running.sort()
                self.within_min.update(
                    job_id for _, job_id in running[:self.state.groups().declared_size(key)])
            # Room held for pods below their targets is theirs (lockgate.scheduler.holds).
            for hold in self.state.room_holds().in_cluster(cluster_name):
                held = self.state.job_records.get(hold.job_id)
                if held is not None and held.state is JobState.QUEUED and hold.node in rooms:
                    take(rooms[hold.node], held.shape)
        self.free[cluster_name] = rooms
        return rooms


def _add(room: list[int], shape: Shape) -> None:
    add_pairs(room, shape.pairs)


def _subtract(vector: list[int], shape: Shape) -> None:
    subtract_pairs(vector, shape.pairs)


def _plus(vector: list[int], shape: Shape) -> list[int]:
    result = vector[:]
    _add(result, shape)
    return result


def _minus(vector: list[int], shape: Shape) -> list[int]:
    result = vector[:]
    _subtract(result, shape)
    return result
