"""The fair targets' inputs, kept change by change, and the targets last computed from them.

Why a module of its own: the fair targets (`lockgate.scheduler.targets`) are worked out from
every queue's demand and holding per cluster and placement, and at fleet scale (1,000 queues, 50
clusters, a million jobs) gathering those per round would cost more than the round. The state
tells a `TargetInputs` each change as it makes it (`slot_add`, `slot_remove`, `pending_came`,
`pending_went`, `queues_changed`, `note_change`) and asks it for the targets (`fair_targets`);
it keeps one `TargetSlot` per (queue, cluster, placement), builds the inputs again only for the
clusters that changed (`inputs`), and solves again only when they changed in what matters, or
hands the problem to a worker (`target_problem`, `hand_over_targets`, `adopt_targets`).

It reads the state's cluster records and axis names (shared, never changed here) and asks the
state for the queues' weights and the pool (`weights_now`, `pool`), only when they may have
changed; `lockgate.scheduler.invariants` compares what it keeps with the state's recount.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

from lockgate.placement import PodPlacement, can_land
from lockgate.queue_tree import QueueTree
from lockgate.scheduler.records import Shape, placement_key
from lockgate.scheduler.room_caches import ClusterRecord
from lockgate.scheduler.targets import (
    Demand,
    FairTargets,
    NodeGroup,
    TargetProblem,
    fair_targets,
    hierarchical_fair_targets,
)

# Per placement, the node groups of a cluster it may land on.
Usable = dict[PodPlacement | None, tuple[str, ...]]
# What the fair targets are computed from: node groups, weights, demands, and the structure and
# amounts they are compared by (`TargetsKey`).
Inputs = tuple[list[NodeGroup], dict[str, float], list[Demand], object, object]


class TargetSlot:
    """What one queue holds and has queued in one cluster, for pods of one placement: one
    demand of the fair targets, kept change by change (`TargetInputs.inputs`).

    `held` sums the requests of its jobs holding capacity there, `pending` those of its queued
    jobs that are neither parked nor held (its queue's `PendingJobs.shapes`); `stamp` moves
    with every change of either. It exists while it counts a job.
    """

    __slots__ = ("held", "held_jobs", "home", "pending", "pending_jobs", "placement_id", "queue",
                 "stamp")

    def __init__(self, queue: str, placement_id: int, axes: int, home: TargetCluster) -> None:
        self.home = home  # its cluster's bookkeeping
        self.queue = queue
        self.placement_id = placement_id
        self.held = [0] * axes
        self.pending = [0] * axes
        self.held_jobs = 0
        self.pending_jobs = 0
        self.stamp = 0


class _ClusterPart:
    """One cluster's share of the fair targets' inputs, as last built (`TargetInputs.inputs`)."""

    __slots__ = ("demands", "entries", "groups", "key", "layout", "ordered", "present",
                 "structure", "usable", "values", "version")

    def __init__(self) -> None:
        self.key: tuple[int, int, int] = (-1, -1, -1)
        self.layout = -1
        self.version = -1
        self.present = False
        self.ordered: list[TargetSlot] = []
        self.groups: list[NodeGroup] = []
        self.usable: dict[int, tuple[str, ...]] = {}
        self.structure: object = ()
        # Per slot (by identity, in `ordered`): its stamp, its amounts entry and its demand.
        self.entries: dict[int, tuple[int, tuple[tuple[int, ...], tuple[int, ...]], Demand]] = {}
        self.values: tuple[object, ...] = ()  # the amounts, in `ordered`'s order
        self.demands: list[Demand] = []


class TargetCluster:
    """The fair targets' bookkeeping for one cluster: its slots by (queue, placement id), and
    the queues with a `PendingJobs` there (a queue's pending entry puts the cluster among the
    targets' inputs even when it counts no live job, as the recount does)."""

    __slots__ = ("layout", "part", "pending_queues", "slots", "version")

    def __init__(self) -> None:
        self.slots: dict[tuple[str, int], TargetSlot] = {}
        self.pending_queues: set[str] = set()
        self.version = 0  # any change of its slots or pending queues
        self.layout = 0  # a slot or a pending queue came or went, or a slot's counts hit 0
        self.part = _ClusterPart()


class TargetsKey(NamedTuple):
    """What fair targets were computed from, as `TargetInputs.target_problem` gave it: the
    demands' structure (who asks where, weights, nodes) and their amounts."""

    structure: object
    amounts: object


class TargetInputs:
    """The fair targets' inputs and the last targets (see the module docstring).

    `clusters` and `axis_names` are the state's own (read here, changed only by the state);
    `weights_now` gives the defined, non-empty queues' weights and whether each is schedulable;
    `pool` what the targets divide (per fairness resource, the pool's total).
    """

    def __init__(self, *, clusters: Mapping[str, ClusterRecord], axis_names: list[str],
                 weights_now: Callable[[], tuple[dict[str, float], dict[str, bool]]],
                 pool: Callable[[], dict[str, float]]) -> None:
        self._clusters = clusters
        self._axis_names = axis_names
        self._weights_now = weights_now
        self._pool = pool
        # The last fair targets, what they were computed from, when, and whether they were
        # computed elsewhere and adopted (`fair_targets`, `adopt_targets`).
        self._targets: tuple[object, object, float, FairTargets, bool] | None = None
        self._node_groups: dict[str, tuple[object, list[NodeGroup], Usable]] = {}
        # Per cluster its slots; every placement seen, by number, with its repr (what they
        # sort by); a counter of every change the inputs depend on, and one of the queues'
        # weights and status.
        self._target_clusters: dict[str, TargetCluster] = {}
        self._slots: dict[tuple[str, str, int], TargetSlot] = {}  # the same, by (q, cluster, id)
        self._placement_ids: dict[PodPlacement | None, int] = {None: 0}
        self._placements: list[PodPlacement | None] = [None]
        self._placement_reprs: list[str] = [repr(None)]
        self._changes = 0
        self._queues_version = 0
        # (queues version seen, weights, per included queue whether it is schedulable, the
        # weights' sorted items, a generation that moves only when any of them changed).
        self._weights: tuple[int, dict[str, float], dict[str, bool], object, int] = (
            -1, {}, {}, None, 0)
        self._inputs: tuple[int, Inputs] | None = None
        # The queue tree the targets divide by (None: today's flat queues; `use_queue_tree`).
        self._tree: QueueTree | None = None
        # Effective weights by node from usage history (`use_history_weights`; empty: none).
        self._history: dict[str, float] = {}

    # ---- the targets -------------------------------------------------------------------------

    def fair_targets(self, *, now: float | None = None, max_age: float = 0.0,
                     latest: bool = False, adopted_max_age: float | None = None,
                     ) -> FairTargets:
        """Every queue's constrained fair target (lockgate.scheduler.targets), from the demand,
        weights and capacity as they are now.

        Recomputed only when what it depends on changed; with `now`, a result at most `max_age`
        seconds old is kept while only amounts changed (the same queues asking in the same
        clusters, the same weights and nodes), which bounds its cost at scale. `latest` keeps
        the last result whenever only amounts changed, and an adopted one whatever changed:
        for readers right after a round (its report, preemption, explain), which must judge by
        the targets the round used.

        `adopted_max_age`: the caller keeps the targets current from another process
        (`target_problem`, `adopt_targets`): the last adopted result is kept whatever changed
        since, while at most this many seconds old (with `now`); only without one that recent
        are they computed here.
        """
        cached = self._targets
        if cached is not None and cached[4] and (latest or (
                adopted_max_age is not None and now is not None
                and now - cached[2] <= adopted_max_age)):
            return cached[3]
        groups, weights, demands, structure, amounts = self.inputs()
        if cached is not None:
            old_structure, old_amounts, at, targets, _ = cached
            if (old_structure is structure or old_structure == structure) and (
                    latest or old_amounts is amounts or old_amounts == amounts
                    or (now is not None and now - at < max_age)):
                return targets
        tree = self.weighted_tree()
        targets = (fair_targets(groups=groups, weights=weights, demands=demands,
                                pool=self._pool()) if tree is None else
                   hierarchical_fair_targets(tree=tree, groups=groups, demands=demands,
                                             pool=self._pool()))
        self._targets = (structure, amounts, -1e18 if now is None else now, targets, False)
        return targets

    def use_queue_tree(self, tree: QueueTree | None) -> None:
        """Divide by `tree` from now on (None: today's flat queues, by each queue's weight).
        The last targets are dropped: the tree is not part of `inputs`' structure (kept equal
        to the state's recount), so an unchanged key must not keep targets of another tree."""
        self._tree = tree
        self._targets = None
        self.queues_changed()

    @property
    def queue_tree(self) -> QueueTree | None:
        """The tree the targets divide by, with its configured weights (None: flat queues)."""
        return self._tree

    def weighted_tree(self) -> QueueTree | None:
        """The tree with the history weights in force on its nodes (None: flat queues)."""
        tree = self._tree
        if tree is None or not self._history:
            return tree
        return tree.with_weights({name: weight for name, weight in self._history.items()
                                  if name in tree})

    def use_history_weights(self, weights: Mapping[str, float]) -> None:
        """Divide by these effective weights (lockgate.scheduler.history; by node name, leaves
        being queues) in place of the configured ones from now on; empty: the configured ones.
        The last targets are dropped, as for a new tree (a tree's weights are not part of
        `inputs`' structure)."""
        for name, weight in weights.items():
            if not (weight > 0 and math.isfinite(weight)):
                raise ValueError(f"history weight of {name!r} must be positive, got {weight}")
        self._history = dict(weights)
        self._targets = None
        self.queues_changed()

    def weight_of(self, name: str, configured: float) -> float:
        """A queue's weight as the flat targets divide by it: its history weight if any."""
        return self._history.get(name, configured)

    def target_problem(self) -> tuple[TargetProblem, TargetsKey]:
        """The fair targets' inputs as one value to solve elsewhere (`TargetProblem.solve`),
        and the key to adopt its answer under (`adopt_targets`)."""
        groups, weights, demands, structure, amounts = self.inputs()
        problem = TargetProblem(groups=tuple(groups), weights=dict(weights),
                                demands=tuple(demands), pool=self._pool(),
                                tree=self.weighted_tree())
        return problem, TargetsKey(structure, amounts)

    def hand_over_targets(self, *, at: float, min_demands: int = 0,
                          ) -> tuple[TargetProblem, TargetsKey] | None:
        """What to solve elsewhere now (`target_problem`), or None: when it has fewer than
        `min_demands` demands (small enough for a round to solve), or when the last targets
        were computed from the inputs as they are (then they are as good as solved at `at`,
        and count as adopted then, so rounds keep using them without solving them again)."""
        problem, key = self.target_problem()
        if len(problem.demands) < min_demands:
            return None
        cached = self._targets
        if cached is not None and self.targets_current(key):
            self._targets = (cached[0], cached[1], max(at, cached[2]), cached[3], True)
            return None
        return problem, key

    def adopt_targets(self, key: TargetsKey, targets: FairTargets, *, at: float) -> None:
        """Keep `targets`, solved elsewhere from the problem `target_problem` gave with `key`
        when the clock read `at`, as the fair targets (`fair_targets(adopted_max_age=...)`)."""
        self._targets = (key.structure, key.amounts, at, targets, True)

    def targets_current(self, key: TargetsKey) -> bool:
        """Whether the last targets were computed from the inputs `key` names."""
        cached = self._targets
        return cached is not None and (cached[0] is key.structure
                                       or cached[0] == key.structure) and (
            cached[1] is key.amounts or cached[1] == key.amounts)

    def inputs(self) -> Inputs:
        """What the fair targets are computed from: node groups per cluster, the weights of
        defined queues, and per (queue, cluster, node filters) what is held and queued.

        Kept change by change in `TargetSlot`s, so that an unchanged state costs one comparison
        and a changed one a pass over the changed clusters' slots (a new demand only for a
        changed slot). Equal, demand for demand, to `SchedulerState.recount_target_inputs`,
        and `structure` and `amounts` compare equal exactly when the recount's would (they are
        grouped per cluster, not flat); the invariants check it.
        """
        cached = self._inputs
        if cached is not None and cached[0] == self._changes:
            return cached[1]
        if self._weights[0] != self._queues_version:
            weights, included = self._weights_now()
            _, old_weights, old_included, old_key, generation = self._weights
            if weights == old_weights and included == old_included and old_key is not None:
                # (a queue emptied and filled again within one change, say): parts stay valid
                self._weights = (self._queues_version, old_weights, old_included, old_key,
                                 generation)
            else:
                self._weights = (self._queues_version, weights, included,
                                 tuple(sorted(weights.items())), generation + 1)
        _, weights, included, weights_key, generation = self._weights
        groups: list[NodeGroup] = []
        demands: list[Demand] = []
        structure: list[object] = []
        amounts: list[object] = []
        for cluster_name in sorted(self._target_clusters):
            part = self._cluster_part(cluster_name, self._target_clusters[cluster_name],
                                      included, generation)
            if part.present:
                groups += part.groups
                demands += part.demands
                structure.append(part.structure)
                amounts.append(part.values)
        result = (groups, weights, demands, (weights_key, tuple(structure)), tuple(amounts))
        self._inputs = (self._changes, result)
        return result

    @property
    def target_clusters(self) -> Mapping[str, TargetCluster]:
        """The fair targets' bookkeeping per cluster (callers must not change it)."""
        return self._target_clusters

    @property
    def target_slots(self) -> Mapping[tuple[str, str, int], TargetSlot]:
        """Every slot of `target_clusters`, by (queue, cluster, placement id)."""
        return self._slots

    @property
    def placement_ids(self) -> Mapping[PodPlacement | None, int]:
        """Every placement seen, by its number (`Shape.placement_id`)."""
        return self._placement_ids

    def _cluster_part(self, cluster_name: str, bookkeeping: TargetCluster,
                      included: Mapping[str, bool], generation: int) -> _ClusterPart:
        """One cluster's groups, demands, structure and amounts for the fair targets, built
        again only as far as its slots changed since the last call."""
        part = bookkeeping.part
        cluster = self._clusters.get(cluster_name)
        key = (generation, -1 if cluster is None else cluster.version, len(self._axis_names))
        if part.version == bookkeeping.version and part.key == key:
            return part
        if part.key != key or part.layout != bookkeeping.layout:
            reprs = self._placement_reprs
            ordered = sorted(
                (slot for slot in bookkeeping.slots.values()
                 if slot.queue in included
                 and (slot.held_jobs or (slot.pending_jobs and included[slot.queue]))),
                key=lambda slot: (slot.queue, reprs[slot.placement_id]))
            part.key = key
            part.layout = bookkeeping.layout
            part.entries = {}
            part.ordered = ordered
            part.present = bool(ordered) or any(
                included.get(name, False) for name in bookkeeping.pending_queues)
            if part.present:
                ids = sorted({slot.placement_id for slot in ordered}, key=reprs.__getitem__)
                cluster_groups, usable = self.groups_for(
                    cluster_name, [self._placements[i] for i in ids])
                part.groups = cluster_groups
                part.usable = {i: usable[self._placements[i]] for i in ids}
                part.structure = (
                    cluster_name,
                    tuple((g.name, tuple(sorted(g.capacity.items()))) for g in cluster_groups),
                    tuple((slot.queue, reprs[slot.placement_id]) for slot in ordered))
        part.version = bookkeeping.version
        if not part.present:
            part.values, part.demands = (), []
            return part
        names = self._axis_names
        entries = part.entries
        values: list[object] = []
        demands: list[Demand] = []
        for slot in part.ordered:
            known = entries.get(id(slot))
            if known is None or known[0] != slot.stamp:
                held = slot.held
                asked = ([h + p for h, p in zip(held, slot.pending, strict=True)]
                         if included[slot.queue] else held)
                known = entries[id(slot)] = (slot.stamp, (tuple(asked), tuple(held)), Demand(
                    queue=slot.queue, cluster=cluster_name,
                    amount={names[a]: float(v) for a, v in enumerate(asked) if v},
                    held={names[a]: float(v) for a, v in enumerate(held) if v},
                    groups=part.usable[slot.placement_id]))
            values.append(known[1])
            demands.append(known[2])
        part.values = tuple(values)
        part.demands = demands
        return part

    def groups_for(self, cluster_name: str, placements: list[PodPlacement | None]
                    ) -> tuple[list[NodeGroup], dict[PodPlacement | None, tuple[str, ...]]]:
        """The cluster's schedulable nodes grouped by which of these placements may land on
        them, with each group's room (allocatable less unmanaged use); cached per node change."""
        cluster = self._clusters.get(cluster_name)
        if cluster is None:
            return [], dict.fromkeys(placements, ())
        key = (cluster.version, tuple(placements))
        cached = self._node_groups.get(cluster_name)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        names = self._axis_names
        by_signature: dict[tuple[bool, ...], list[int]] = {}
        for node_name in cluster.order:
            node = cluster.nodes[node_name]
            signature = tuple(can_land(placement, node.traits) for placement in placements)
            if not any(signature):
                continue
            room = by_signature.setdefault(signature, [0] * len(names))
            for axis, (a, u) in enumerate(zip(node.allocatable, node.unmanaged, strict=True)):
                room[axis] += max(0, a - u)
        groups: list[NodeGroup] = []
        usable: dict[PodPlacement | None, list[str]] = {p: [] for p in placements}
        for index, (signature, room) in enumerate(sorted(by_signature.items(), reverse=True)):
            group = NodeGroup(cluster=cluster_name, name=f"g{index}",
                              capacity={names[a]: float(v) for a, v in enumerate(room) if v})
            groups.append(group)
            for placement, lands in zip(placements, signature, strict=True):
                if lands:
                    usable[placement].append(group.name)
        result = {p: tuple(names_) for p, names_ in usable.items()}
        self._node_groups[cluster_name] = (key, groups, result)
        return groups, result

    # ---- what the state tells it -------------------------------------------------------------

    def note_change(self) -> None:
        """Something the inputs depend on changed (a node, a new resource axis)."""
        self._changes += 1

    def placement_id(self, placement: PodPlacement | None) -> int:
        """The number of a placement (equal placements, one number), given on first sight."""
        placement_id = self._placement_ids.get(placement)
        if placement_id is None:
            placement_id = self._placement_ids[placement] = len(self._placements)
            self._placements.append(placement)
            self._placement_reprs.append(placement_key(placement))
        return placement_id

    def slot_vectors(self) -> list[list[int]]:
        """Every slot's dense vectors, for the state to grow when a new axis appears."""
        return [vector for bookkeeping in self._target_clusters.values()
                for slot in bookkeeping.slots.values() for vector in (slot.held, slot.pending)]

    def slot_add(self, queue: str, cluster: str, shape: Shape, held: bool) -> None:
        """A job of this shape starts counting as held (or queued) in its queue's slot of the
        fair targets' inputs. (On every change of a job: kept lean on purpose.)"""
        key = (queue, cluster, shape.placement_id)
        slot = self._slots.get(key)
        if slot is None:
            home = self._target_clusters.get(cluster)
            if home is None:
                home = self._target_clusters[cluster] = TargetCluster()
            slot = self._slots[key] = home.slots[(queue, shape.placement_id)] = TargetSlot(
                queue, shape.placement_id, len(self._axis_names), home)
        home = slot.home
        if held:
            vector = slot.held
            slot.held_jobs += 1
            if slot.held_jobs == 1:
                home.layout += 1
        else:
            vector = slot.pending
            slot.pending_jobs += 1
            if slot.pending_jobs == 1:
                home.layout += 1
        for axis, amount in shape.pairs:
            vector[axis] += amount
        slot.stamp += 1
        home.version += 1
        self._changes += 1

    def slot_remove(self, queue: str, cluster: str, shape: Shape, held: bool) -> None:
        """A job of this shape stops counting as held (or queued) in its queue's slot."""
        key = (queue, cluster, shape.placement_id)
        slot = self._slots[key]
        home = slot.home
        if held:
            vector = slot.held
            slot.held_jobs -= 1
            edge = not slot.held_jobs
        else:
            vector = slot.pending
            slot.pending_jobs -= 1
            edge = not slot.pending_jobs
        for axis, amount in shape.pairs:
            vector[axis] -= amount
        if edge:
            home.layout += 1
            if not slot.held_jobs and not slot.pending_jobs:
                del self._slots[key]
                del home.slots[(queue, shape.placement_id)]
        slot.stamp += 1
        home.version += 1
        self._changes += 1

    def pending_came(self, queue: str, cluster: str) -> None:
        bookkeeping = self._target_clusters.get(cluster)
        if bookkeeping is None:
            bookkeeping = self._target_clusters[cluster] = TargetCluster()
        bookkeeping.pending_queues.add(queue)
        bookkeeping.layout += 1
        bookkeeping.version += 1
        self._changes += 1

    def pending_went(self, queue: str, cluster: str) -> None:
        bookkeeping = self._target_clusters[cluster]
        bookkeeping.pending_queues.discard(queue)
        bookkeeping.layout += 1
        bookkeeping.version += 1
        self._changes += 1

    def queues_changed(self) -> None:
        """A queue's weight or status, or whether it is empty, changed (fair targets)."""
        self._queues_version += 1
        self._changes += 1
