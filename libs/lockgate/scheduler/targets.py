"""Fair targets for pods that must run where they were created: constrained max-min DRF.

Why it exists: lockgate's pods are pinned to the cluster they were created in (and, within it,
to the nodes their taints, selectors and affinity let them on). Dominant resource fairness
against the whole pool then promises queues shares they can never use: two queues crowded into
one cluster of a two-cluster pool both look satisfied at a quarter each, and weights stop
mattering. The fair allocation that respects pinning is the weighted *constrained* max-min fair
one (Ghodsi et al., "Choosy", EuroSys 2013): raise every queue's share together, in proportion to
its weight (progressive filling), where a queue's demand in cluster C can only be met from C's
capacity, and stop raising a queue when it has all it asks for or when no rearrangement of what
the others hold can give it more. A queue's share still sums over clusters (dominant share
against the pool, cost = share / weight, the one cost model), so a queue that holds most of
cluster-b is not owed more of cluster-a.

The result is a target per queue (its fair share, unique) and per cluster (its split, which need
not be unique: we pick the one that keeps a queue where it already runs, then the first in name
order, deterministically).

The algorithm (docs/scheduling.md, "Fair targets"):

- Demand is a vector per (queue, cluster, node filters): what the queue holds there plus what it
  has queued there. Each is measured in *share units*: its dominant share of the pool.
- Capacity is a vector per *node group*: the schedulable nodes of one cluster that the same set of
  demands may use (one group per cluster when no taints or selectors tell nodes apart). A group's
  capacity is measured in the share units of the demand mix that may use it.
- A flow network: source -> queue (its level) -> demand (its amount) -> node groups it may use
  -> sink (the group's capacity). Level t is reachable for the queues still rising when a max
  flow saturates every source edge (frozen queues keep their level; the others ask
  min(t * weight, demand)).
- Each filling step finds the highest reachable t by Dinkelbach's method on the min cut (start
  from "everyone gets all it asks", and each failed max flow's min cut gives the exact level at
  which that cut stops binding), then freezes every queue that has all its demand and every
  queue that cannot reach the sink in the residual network (it is in a saturated cut: no
  rearrangement gives it more). A greedy, per-step choice of cluster would not do: with q1
  asking 10 in A and 10 in B, q2 asking 10 in A, and A = B = 10, only the flow sees that q1
  belongs in B and q2 gets all of A.
- The split per cluster is a last max flow at the final levels, routed first through what each
  queue already holds (so a queue is not moved without need), then in proportion to what it asks
  in each cluster (so a queue that may run anywhere is owed room everywhere it asks, evenly, not
  all in the first cluster by name), then through all it asks.

Exact for one resource, and for several when each queue's demands in a node group share one
resource profile (cpu-only pods, or pods of one cpu:memory ratio). With mixed profiles a queue's
share is counted as the sum of its demands' dominant shares (an upper bound of the dominant share
of the sum) and a group's capacity in the mix it is asked for: an approximation of what is,
exactly, a linear program per level (Choosy, section 4).

Cost: F filling steps (each freezes at least one queue; in practice one per distinct bottleneck,
a few per contested cluster), each a few max flows (Dinic, O(V^2 E) worst case, near linear on
these shallow networks) over V = queues + demands + node groups, E = demands x their groups.
The result depends only on capacity, weights and demand, so callers recompute it only when those
changed, not per round (see docs/scheduling.md, "Fair targets"); and each connected part is
solved again only when its own inputs changed.

Pure: no I/O, no clock (a memo of parts solved lately changes no answer).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lockgate.queue_tree import QueueTree

# Shares are fractions of the pool: anything below this is rounding, not room.
_EPSILON = 1e-12
# A retired node's depth in `_FlowNetwork.max_flow`: never one more than any node's.
_RETIRED = 1 << 40
# Cuts kept to start the next filling step's search below the top (`_Problem.cuts`).
_CUTS_KEPT = 12
# Dinkelbach's iterations per filling step: each strictly lowers the level and changes the cut;
# in practice two or three. The bound only guards against floating-point stalls.
_MAX_DINKELBACH = 64


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """Schedulable capacity in one cluster that one set of demands may use.

    `name` is unique within its cluster; `capacity` is per resource, in canonical units.
    """

    cluster: str
    name: str
    capacity: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Demand:
    """What one queue asks for in one cluster, for pods with one set of node filters.

    `amount` is what it holds there plus what it has queued; `held` is the part it holds (the
    split prefers to keep it there). `groups` names the node groups of `cluster` its pods may use
    (None: every group of the cluster).
    """

    queue: str
    cluster: str
    amount: Mapping[str, float]
    held: Mapping[str, float] = field(default_factory=dict)
    groups: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class QueueTarget:
    """A queue's constrained fair allocation.

    `share` is the dominant share of its whole target against the pool, the quantity the cost
    model compares (cost = share / weight). `clusters` holds, per cluster it asks for room in,
    the resources its target gives it there, and `cluster_shares` their dominant share of the
    pool. `demand_share` is what it asks for, in the same terms; `capped` says it gets all of it.
    """

    queue: str
    weight: float
    share: float
    demand_share: float
    clusters: Mapping[str, Mapping[str, float]]
    cluster_shares: Mapping[str, float]

    @property
    def capped(self) -> bool:
        """It gets everything it asks for (it is not held back by anyone)."""
        return self.share >= self.demand_share - 1e-9

    def in_cluster(self, cluster: str) -> float:
        """Its target in `cluster`, as a dominant share of the pool (0 if it asks for none)."""
        return self.cluster_shares.get(cluster, 0.0)


@dataclass(frozen=True, slots=True)
class FairTargets:
    """Every queue's target, and the pool total the shares are fractions of."""

    queues: Mapping[str, QueueTarget]
    pool: Mapping[str, float]
    levels: int = 0  # filling steps taken (for benchmarks and tests)
    # The highest cost (share / weight) any queue's target gives: the water's level where it
    # is highest, which the round measures a capped queue's rise against.
    top_cost: float = 0.0
    # Per node of a queue tree (`hierarchical_fair_targets`): the sum of its leaves' shares.
    # Empty for a flat tree, whose nodes are the queues.
    node_shares: Mapping[str, float] = field(default_factory=dict)

    def of(self, queue: str) -> QueueTarget | None:
        return self.queues.get(queue)


def _share_axes(groups: Sequence[NodeGroup], resources: Collection[str] | None,
                pool: Mapping[str, float] | None,
                ) -> tuple[Mapping[str, float], list[str], list[float]]:
    """The pool (as given, or the groups' capacity summed), the resources shares are over (the
    pool's that are positive and among `resources`), and 1 / the pool's amount of each."""
    if pool is None:
        totals: dict[str, float] = {}
        for group in groups:
            for name, amount in group.capacity.items():
                totals[name] = totals.get(name, 0.0) + amount
        pool = totals
    axes = sorted(name for name, amount in pool.items()
                  if amount > 0 and (resources is None or name in resources))
    return pool, axes, [1.0 / pool[name] for name in axes]


def fair_targets(
    *,
    groups: Iterable[NodeGroup],
    weights: Mapping[str, float],
    demands: Iterable[Demand],
    resources: Collection[str] | None = None,
    pool: Mapping[str, float] | None = None,
) -> FairTargets:
    """The weighted constrained max-min fair allocation of `groups` to the queues' `demands`.

    `resources` are the resources shares are over (None: every resource named); `pool` is what
    shares are fractions of (None: the sum of the groups' capacity). Queues without a positive
    weight get nothing; demands naming such a queue, a cluster without groups, or groups that
    do not exist are met from nothing (target 0).
    """
    group_list = sorted(groups, key=lambda g: (g.cluster, g.name))
    pool, axes, inverse = _share_axes(group_list, resources, pool)
    queues: dict[str, QueueTarget] = {}
    levels = 0
    # Queues that share no node group never compete: solve each connected part on its own
    # (pinned fleets fall apart into about one part per cluster, each small).
    # A part whose inputs did not change since an earlier call has the same answer: between two
    # rounds usually only a few parts changed, so only those are solved again.
    # Only this call's parts are kept for the next: at fleet scale the fleet is one part whose
    # inputs change every round, and a memo of many would hold gigabytes of answers never asked
    # for again.
    kept: dict[object, tuple[int, dict[str, QueueTarget]]] = {}
    for part_groups, part_demands in _components(group_list, list(demands)):
        key = _part_key(axes, inverse, part_groups, weights, part_demands)
        solved = _SOLVED.get(key) or kept.get(key)
        if solved is None:
            problem = _Problem(axes, inverse, part_groups, weights, part_demands)
            solved = (problem.fill(), problem.targets())
        kept[key] = solved
        levels += solved[0]
        queues.update(solved[1])
    _SOLVED.clear()
    _SOLVED.update(kept)
    top_cost = max((t.share / t.weight for t in queues.values() if t.weight > 0), default=0.0)
    return FairTargets(queues=dict(sorted(queues.items())), pool=dict(pool), levels=levels,
                       top_cost=top_cost)


@dataclass(frozen=True, slots=True)
class TargetProblem:
    """Everything the fair targets are computed from, as one value: what a caller hands to
    another process so that a round need not wait for them (docs/scheduling.md, "Fair targets
    off the round's path"). Picklable."""

    groups: tuple[NodeGroup, ...]
    weights: Mapping[str, float]
    demands: tuple[Demand, ...]
    pool: Mapping[str, float]
    # A queue tree (None: today's flat queues): its weights, guarantees and limits count, and
    # `weights` only says which queues are in.
    tree: QueueTree | None = None

    def solve(self) -> FairTargets:
        if self.tree is not None:
            return hierarchical_fair_targets(tree=self.tree, groups=self.groups,
                                             demands=self.demands, pool=self.pool)
        return fair_targets(groups=self.groups, weights=self.weights, demands=self.demands,
                            pool=self.pool)


def solve_problem(problem: TargetProblem) -> FairTargets:
    """`problem.solve()` as a module-level function (what a process pool can call)."""
    return problem.solve()


# The parts the last call solved, by their inputs (a memo: the answer is a function of them).
_SOLVED: dict[object, tuple[int, dict[str, QueueTarget]]] = {}


def _part_key(axes: list[str], inverse: list[float], groups: list[NodeGroup],
              weights: Mapping[str, float], demands: list[Demand]) -> object:
    names = sorted({d.queue for d in demands})
    return (tuple(axes), tuple(inverse),
            tuple((g.cluster, g.name, tuple(sorted(g.capacity.items()))) for g in groups),
            tuple((name, weights.get(name, 0.0)) for name in names),
            tuple((d.queue, d.cluster, tuple(sorted(d.amount.items())),
                   tuple(sorted(d.held.items())), d.groups) for d in demands))


def _components(groups: list[NodeGroup], demands: list[Demand]
                ) -> list[tuple[list[NodeGroup], list[Demand]]]:
    """Split into parts joined by demand: a queue and every node group its demands may use."""
    parent: dict[tuple[str, str, str], tuple[str, str, str]] = {}

    def find(key: tuple[str, str, str]) -> tuple[str, str, str]:
        root = parent.setdefault(key, key)
        while root != parent[root]:
            root = parent[root]
        while parent[key] != root:
            parent[key], key = root, parent[key]
        return root

    by_cluster: dict[str, list[str]] = {}
    for group in groups:
        by_cluster.setdefault(group.cluster, []).append(group.name)
        find(("g", group.cluster, group.name))
    for demand in demands:
        queue = find(("q", demand.queue, ""))
        names = by_cluster.get(demand.cluster, []) if demand.groups is None else demand.groups
        for name in names:
            key = ("g", demand.cluster, name)
            if key in parent:
                root = find(key)
                if root != queue:
                    parent[root] = queue
    parts: dict[tuple[str, str, str], tuple[list[NodeGroup], list[Demand]]] = {}
    for group in groups:
        parts.setdefault(find(("g", group.cluster, group.name)), ([], []))[0].append(group)
    for demand in demands:
        parts.setdefault(find(("q", demand.queue, "")), ([], []))[1].append(demand)
    return [parts[key] for key in sorted(parts)]


def _vector(amounts: Mapping[str, float], axes: Sequence[str], inverse: Sequence[float]
            ) -> list[float]:
    """Resource amounts as fractions of the pool, per axis."""
    return [amounts.get(name, 0.0) * inv for name, inv in zip(axes, inverse, strict=True)]


class _Problem:
    """The network and the filling state for one computation."""

    def __init__(self, axes: list[str], inverse: list[float], groups: list[NodeGroup],
                 weights: Mapping[str, float], demands: list[Demand]) -> None:
        self.axes = axes
        self.inverse = inverse
        # Demands merged per (queue, cluster, groups), in a fixed order.
        merged: dict[tuple[str, str, tuple[str, ...] | None], list[list[float]]] = {}
        for demand in demands:
            key = (demand.queue, demand.cluster,
                   None if demand.groups is None else tuple(sorted(set(demand.groups))))
            amount = _vector(demand.amount, axes, inverse)
            held = _vector(demand.held, axes, inverse)
            slot = merged.get(key)
            if slot is None:
                merged[key] = [amount, held]
            else:
                slot[0] = [a + b for a, b in zip(slot[0], amount, strict=True)]
                slot[1] = [a + b for a, b in zip(slot[1], held, strict=True)]
        by_cluster: dict[str, list[NodeGroup]] = {}
        for group in groups:
            by_cluster.setdefault(group.cluster, []).append(group)
        self.queue_names = sorted({key[0] for key in merged
                                   if weights.get(key[0], 0.0) > 0})
        self.weights = {name: weights[name] for name in self.queue_names}
        # Demand records: (queue, cluster, share units asked, share units held, profile,
        # indexes of the groups it may use).
        self.demands: list[tuple[str, str, float, float, list[float], list[int]]] = []
        self.groups = groups
        group_index = {(g.cluster, g.name): i for i, g in enumerate(groups)}
        for (queue, cluster, names), (amount, held) in sorted(
                merged.items(), key=lambda item: (item[0][0], item[0][1], item[0][2] or ())):
            if queue not in self.weights:
                continue
            dominant = max(amount, default=0.0)
            if dominant <= _EPSILON:
                continue
            profile = [a / dominant for a in amount]
            held_units = min(dominant, max(held, default=0.0))
            if names is None:
                usable = [group_index[(cluster, g.name)] for g in by_cluster.get(cluster, [])]
            else:
                usable = [group_index[(cluster, n)] for n in names if (cluster, n) in group_index]
            self.demands.append((queue, cluster, dominant, held_units, profile, usable))
        # Each group's capacity in the share units of the demand mix that may use it.
        mix = [[0.0] * len(axes) for _ in groups]
        for _, _, dominant, _, profile, usable in self.demands:
            for g in usable:
                row = mix[g]
                for axis, p in enumerate(profile):
                    row[axis] += dominant * p
        self.capacity: list[float] = []
        for g, group in enumerate(groups):
            cap = _vector(group.capacity, axes, inverse)
            weight = max(mix[g], default=0.0)
            if weight <= _EPSILON:
                self.capacity.append(0.0)
                continue
            self.capacity.append(min(
                (c / (m / weight) for c, m in zip(cap, mix[g], strict=True) if m > _EPSILON),
                default=0.0))
        self.asked = dict.fromkeys(self.queue_names, 0.0)
        for queue, _, dominant, _, _, _ in self.demands:
            self.asked[queue] += dominant
        self.level: dict[str, float] = {}  # frozen queues' shares
        # The min cuts of the latest failed max flows: each bounds the level from above for as
        # long as it has rising queues (what leaves it does not depend on the level).
        self.cuts: deque[_Cut] = deque(maxlen=_CUTS_KEPT)
        self.split: list[float] = [0.0] * len(self.demands)

    # ---- the network ----------------------------------------------------------------------

    def _network(self, caps: Mapping[str, float], *, prefer_held: bool = False
                 ) -> tuple[_FlowNetwork, list[int], list[int]]:
        """source -> queues (caps) -> demands -> groups -> sink. Returns the network, each
        queue's source edge and each demand's queue edge."""
        nq, nd, ng = len(self.queue_names), len(self.demands), len(self.groups)
        source, sink = 0, 1 + nq + nd + ng
        net = _FlowNetwork(sink + 1)
        queue_node = {name: 1 + i for i, name in enumerate(self.queue_names)}
        source_edges = [net.add(source, queue_node[name], caps.get(name, 0.0))
                        for name in self.queue_names]
        demand_edges = []
        for d, (queue, _, dominant, held, _, usable) in enumerate(self.demands):
            node = 1 + nq + d
            demand_edges.append(net.add(queue_node[queue], node,
                                        held if prefer_held else dominant))
            for g in usable:
                net.add(node, 1 + nq + nd + g, float("inf"))
        for g in range(ng):
            net.add(1 + nq + nd + g, sink, self.capacity[g])
        net.layer = [0] + [1] * nq + [2] * nd + [3] * ng + [4]
        return net, source_edges, demand_edges

    def _caps(self, level: float) -> dict[str, float]:
        caps = dict(self.level)
        for name in self.queue_names:
            if name not in caps:
                caps[name] = min(level * self.weights[name], self.asked[name])
        return caps

    # ---- progressive filling --------------------------------------------------------------

    def fill(self) -> int:
        if self._everyone_fits():
            # No max flow needed: every queue gets all it asks, and every demand is met where
            # it asks (what the filling and the split would find, in one step).
            self.level = dict(self.asked)
            self.split = [dominant for _, _, dominant, _, _, _ in self.demands]
            return 1
        steps = 0
        # One network for the whole filling: each max flow starts from the last one's flow,
        # with only the queues' caps (their source edges) changed (`set_capacity`). The max
        # flow's value, and who reaches the sink, do not depend on where it started.
        net: _FlowNetwork | None = None
        source_edges: list[int] = []
        floor = 0.0  # the last step's level: the next one is no lower
        live: set[int] | None = None  # nodes not retired yet (all but the source, at first)
        position = {name: i for i, name in enumerate(self.queue_names)}
        # The queues whose caps may still change: those rising at the last step's start (the
        # ones it froze take their frozen level once more). Work per step is O(these).
        touch = list(self.queue_names)
        frozen_total = 0.0  # what the frozen queues' levels add up to
        while len(self.level) < len(self.queue_names):
            steps += 1
            rising = [name for name in touch if name not in self.level]
            # Dinkelbach from above: from everyone having all it asks, or lower where a cut
            # found in the last steps already says the level cannot be higher.
            level = max(self.asked[name] / self.weights[name] for name in rising)
            level = max(floor, min([level, *(cut.level(self, level) for cut in self.cuts)]))
            for _ in range(_MAX_DINKELBACH):
                if net is None:
                    net, source_edges, _ = self._network(self._caps(level))
                else:
                    for name in touch:
                        edge = source_edges[position[name]]
                        cap = self.level.get(name)
                        if cap is None:
                            cap = min(level * self.weights[name], self.asked[name])
                        if cap != net.original[edge]:
                            net.set_capacity(edge, cap)
                total = frozen_total + sum(min(level * self.weights[name], self.asked[name])
                                           for name in rising)
                flow = net.max_flow(0, net.size - 1)
                if flow >= total - _EPSILON * max(1.0, total):
                    break
                lower = self._level_of_cut(net, level)
                if lower >= level - _EPSILON:
                    break  # floating point: the cut no longer moves; take what flows
                level = lower
            # Freeze who has all it asks, and who sits behind a saturated cut.
            assert net is not None
            reaches_sink = net.reaching(net.size - 1)
            frozen = False
            for name in rising:
                asked = self.asked[name]
                if level * self.weights[name] >= asked - _EPSILON:
                    self.level[name] = asked
                    frozen = True
                elif (1 + position[name]) not in reaches_sink:
                    self.level[name] = min(asked, net.flow_of(source_edges[position[name]]))
                    frozen = True
            if not frozen:  # numerically stuck: freeze everyone where they stand
                for name in rising:
                    self.level[name] = min(self.asked[name], level * self.weights[name])
            frozen_total += sum(self.level[name] for name in rising if name in self.level)
            touch = rising
            # What cannot reach the sink now never will while caps only rise (lowering one
            # cancels flow only along paths that can): later max flows need not visit it.
            if live is None:
                live = set(range(1, net.size))
            gone = live.difference(reaches_sink)
            net.retire(gone)
            live -= gone
            floor = level
        self._split()
        return steps

    def _everyone_fits(self) -> bool:
        """Whether every node group could take every demand that may use it at once: then
        all demands fit together, whichever group each goes to (a sufficient test, O(demands
        x their groups), for the uncontested parts that most of a quiet fleet is)."""
        load = [0.0] * len(self.groups)
        for _, _, dominant, _, _, usable in self.demands:
            if not usable:
                return False
            for g in usable:
                load[g] += dominant
        return all(used <= room * (1 - _EPSILON) for used, room in zip(
            load, self.capacity, strict=True))

    def _level_of_cut(self, net: _FlowNetwork, level: float) -> float:
        """The highest level at which the min cut of this failed max flow stops binding:
        the queues on its source side S may ask together at most what leaves S elsewhere."""
        side = net.reachable_from(0)
        leaving = 0.0
        for u in side:
            if u == 0:
                continue  # source edges are the level's own, counted on the left
            for e in net.edges_of[u]:
                if e % 2 == 0 and net.to[e] not in side:
                    leaving += net.original[e]  # saturated: a min cut's forward edge
        cut = _Cut([name for i, name in enumerate(self.queue_names) if 1 + i in side], leaving)
        self.cuts.append(cut)
        return cut.level(self, level)

    def _split(self) -> None:
        """Route the final levels: first through what queues hold; then each queue's level
        in proportion to what it asks in each cluster, as far as room allows; then through
        all it asks (augmenting paths move a flexible queue out of a cluster a pinned one
        needs). Each stage only widens edges, so what an earlier stage routed stays routed
        unless a later one needs it moved."""
        net, _, demand_edges = self._network(self.level, prefer_held=True)
        net.max_flow(0, net.size - 1)

        def widen(edge: int, to: float) -> None:
            routed = net.flow_of(edge)
            to = max(to, routed)
            net.capacity[edge] = max(0.0, to - routed)
            net.original[edge] = to

        for d, edge in enumerate(demand_edges):
            queue, _, dominant, _, _, _ = self.demands[d]
            asked = self.asked[queue]
            widen(edge, dominant * self.level.get(queue, 0.0) / asked if asked > 0 else 0.0)
        net.max_flow(0, net.size - 1)
        for d, edge in enumerate(demand_edges):
            widen(edge, self.demands[d][2])
        net.max_flow(0, net.size - 1)
        self.split = [net.flow_of(edge) for edge in demand_edges]

    # ---- the answer -----------------------------------------------------------------------

    def targets(self) -> dict[str, QueueTarget]:
        per_cluster: dict[str, dict[str, list[float]]] = {}
        asked: dict[str, list[float]] = {}
        for (queue, cluster, dominant, _, profile, _), units in zip(
                self.demands, self.split, strict=True):
            vector = per_cluster.setdefault(queue, {}).setdefault(
                cluster, [0.0] * len(self.axes))
            for axis, p in enumerate(profile):
                vector[axis] += units * p
            want = asked.setdefault(queue, [0.0] * len(self.axes))
            for axis, p in enumerate(profile):
                want[axis] += dominant * p
        result: dict[str, QueueTarget] = {}
        for name in self.queue_names:
            clusters = per_cluster.get(name, {})
            total = [0.0] * len(self.axes)
            for vector in clusters.values():
                for axis, amount in enumerate(vector):
                    total[axis] += amount
            result[name] = QueueTarget(
                queue=name,
                weight=self.weights[name],
                share=max(total, default=0.0),
                demand_share=max(asked.get(name, []), default=0.0),
                clusters={
                    cluster: {axis: amount / inv for axis, amount, inv
                              in zip(self.axes, vector, self.inverse, strict=True)}
                    for cluster, vector in sorted(clusters.items())},
                cluster_shares={cluster: max(vector, default=0.0)
                                for cluster, vector in sorted(clusters.items())},
            )
        return result


class _Cut:
    """A min cut of a failed max flow: the queues on its source side and the capacity of the
    edges leaving it (other than the source's, which are the queues' own caps)."""

    __slots__ = ("fixed", "leaving", "rising")

    def __init__(self, queues: list[str], leaving: float) -> None:
        self.rising = queues  # those not frozen when last asked
        self.fixed = 0.0  # the frozen ones' levels
        self.leaving = leaving

    def level(self, problem: _Problem, ceiling: float) -> float:
        """The highest level (at most `ceiling`) at which the queues on its side fit through
        it: the queues rising may ask together what leaves it less what the frozen hold."""
        frozen = problem.level
        if any(name in frozen for name in self.rising):
            self.fixed += sum(frozen[name] for name in self.rising if name in frozen)
            self.rising = [name for name in self.rising if name not in frozen]
        return _highest_level([(problem.weights[name], problem.asked[name])
                               for name in self.rising], self.leaving - self.fixed, ceiling)


def _highest_level(rising: list[tuple[float, float]], budget: float, ceiling: float) -> float:
    """The largest t <= ceiling with sum(min(t * weight, asked)) <= budget."""
    if budget <= 0 or not rising:
        return 0.0 if rising else ceiling
    # sum(min(t w, a)) is increasing and piecewise linear, with a knee at each a / w.
    knees = sorted(rising, key=lambda item: item[1] / item[0])
    capped = 0.0  # asked of queues capped below t
    slope = sum(weight for weight, _ in knees)
    start = 0.0
    for weight, asked in knees:
        knee = asked / weight
        value_at_knee = capped + slope * knee
        if value_at_knee > budget:
            return min(ceiling, max(start, (budget - capped) / slope))
        capped += asked
        slope -= weight
        start = knee
    return ceiling


class _FlowNetwork:
    """A residual network with float capacities and Dinic's max flow (iterative DFS)."""

    __slots__ = ("capacity", "edges_of", "fresh_depth", "layer", "original", "size", "to")

    def __init__(self, size: int) -> None:
        self.size = size
        # Where a max flow's search starts: -1 (not reached yet) for every node but those
        # retired (`retire`), which look reached at a depth no path ever has.
        self.fresh_depth = [-1] * size
        # Each node's layer when every edge goes from one layer to the next (None: unknown):
        # a max flow first pushes along such forward paths alone, with no search for levels.
        self.layer: list[int] | None = None
        self.edges_of: list[list[int]] = [[] for _ in range(size)]
        self.to: list[int] = []
        self.capacity: list[float] = []  # residual
        self.original: list[float] = []

    def add(self, u: int, v: int, capacity: float) -> int:
        """An edge u -> v; returns its index (its reverse is index ^ 1)."""
        edge = len(self.to)
        self.to += (v, u)
        self.capacity += (capacity, 0.0)
        self.original += (capacity, 0.0)
        self.edges_of[u].append(edge)
        self.edges_of[v].append(edge + 1)
        return edge

    def flow_of(self, edge: int) -> float:
        return self.capacity[edge ^ 1]

    def retire(self, nodes: Iterable[int]) -> None:
        """Nodes with no residual path to the sink: augmenting paths never pass them, so max
        flows skip them (the caller keeps it true: caps only rise, or fall by `set_capacity`,
        which cancels flow only through nodes not retired)."""
        for node in nodes:
            self.fresh_depth[node] = _RETIRED
            if self.layer is not None:
                self.layer[node] = _RETIRED

    def set_capacity(self, edge: int, capacity: float) -> None:
        """Give a source edge a new capacity, keeping the flow a flow: where more flows
        through it than that, the excess is cancelled along the paths it takes to the sink
        (the network is layered, without cycles). `max_flow` then augments from there."""
        flow = self.capacity[edge ^ 1]
        if flow > capacity:
            self._cancel(self.to[edge], flow - capacity)
            flow = capacity
        self.capacity[edge] = capacity - flow
        self.capacity[edge ^ 1] = flow
        self.original[edge] = capacity

    def _cancel(self, node: int, amount: float) -> None:
        """Cancel `amount` of the flow leaving `node` forwards, down to the sink."""
        capacity, to, fresh = self.capacity, self.to, self.fresh_depth
        for e in self.edges_of[node]:
            if amount <= 0:
                return
            flow = capacity[e ^ 1]
            if e % 2 or flow <= 0 or fresh[to[e]] == _RETIRED:
                continue  # a reverse edge, no flow, or flow that must stay where it is
            taken = flow if flow < amount else amount
            self._cancel(to[e], taken)
            capacity[e] += taken
            capacity[e ^ 1] -= taken
            amount -= taken

    def max_flow(self, source: int, sink: int) -> float:
        """Augment to a max flow from the current flow; returns the total flow out of source."""
        capacity, to, edges_of = self.capacity, self.to, self.edges_of
        if self.layer is not None:
            # Most of what a changed cap lets through goes straight down an unsaturated path:
            # push that first (the layers are a level graph of forward edges, found for free),
            # and leave to Dinic's phases only what needs flow moved aside.
            depth, cursor = self.layer[:], [0] * self.size
            while self._augment(source, sink, depth, cursor) > _EPSILON:
                pass
        while True:
            depth = self.fresh_depth[:]
            depth[source] = 0
            queue = deque([source])
            while queue:
                u = queue.popleft()
                for e in edges_of[u]:
                    v = to[e]
                    if depth[v] < 0 and capacity[e] > _EPSILON:
                        depth[v] = depth[u] + 1
                        queue.append(v)
            if depth[sink] < 0:
                break
            cursor = [0] * self.size
            while True:
                pushed = self._augment(source, sink, depth, cursor)
                if pushed <= _EPSILON:
                    break
        return sum(self.capacity[e ^ 1] for e in edges_of[source] if e % 2 == 0)

    def _augment(self, source: int, sink: int, depth: list[int], cursor: list[int]) -> float:
        """One augmenting path in the level graph (iterative DFS), pushed; its amount."""
        capacity, to, edges_of = self.capacity, self.to, self.edges_of
        path: list[int] = []
        u = source
        while True:
            if u == sink:
                amount = min(capacity[e] for e in path)
                for e in path:
                    capacity[e] -= amount
                    capacity[e ^ 1] += amount
                return amount
            edges = edges_of[u]
            advanced = False
            while cursor[u] < len(edges):
                e = edges[cursor[u]]
                v = to[e]
                if capacity[e] > _EPSILON and depth[v] == depth[u] + 1:
                    path.append(e)
                    u = v
                    advanced = True
                    break
                cursor[u] += 1
            if advanced:
                continue
            if not path:
                return 0.0
            depth[u] = -1  # a dead end: never again this phase
            e = path.pop()
            u = to[e ^ 1]
            cursor[u] += 1

    def reachable_from(self, source: int) -> set[int]:
        seen = {source}
        queue = deque([source])
        while queue:
            u = queue.popleft()
            for e in self.edges_of[u]:
                v = self.to[e]
                if v not in seen and self.capacity[e] > _EPSILON:
                    seen.add(v)
                    queue.append(v)
        return seen

    def reaching(self, sink: int) -> set[int]:
        """Nodes with a residual path to `sink`."""
        seen = {sink}
        queue = deque([sink])
        while queue:
            v = queue.popleft()
            for e in self.edges_of[v]:
                # e leaves v; its reverse e ^ 1 enters v from to[e].
                u = self.to[e]
                if u not in seen and self.capacity[e ^ 1] > _EPSILON:
                    seen.add(u)
                    queue.append(u)
        return seen


# ---- hierarchical fair targets (issue 36; docs/scheduling.md, "Hierarchical fair targets") ----


def hierarchical_fair_targets(
    *,
    tree: QueueTree,
    groups: Iterable[NodeGroup],
    demands: Iterable[Demand],
    resources: Collection[str] | None = None,
    pool: Mapping[str, float] | None = None,
) -> FairTargets:
    """The hierarchical constrained max-min fair allocation of `groups` to the leaves' demands.

    A flat tree (every queue a child of the root, no guarantee, no limit) is today's problem,
    solved by today's code (`fair_targets`): its answer is exactly today's, bit for bit.

    Otherwise, at every node its children split what it gets by weighted max-min, constrained
    by where each leaf's pods may run: progressive filling where the level raised is per tree
    node. Guarantees first (deepest first: a child's guarantee is served inside its parent's,
    then the rest of the parent's by weight), then weights, with limits capping a subtree's
    total throughout. Demands naming a queue that is not a leaf of `tree` get nothing.
    """
    group_list = sorted(groups, key=lambda g: (g.cluster, g.name))
    if tree.is_flat:
        return fair_targets(groups=group_list,
                            weights={name: tree.node(name).weight for name in tree.names},
                            demands=demands, resources=resources, pool=pool)
    pool, axes, inverse = _share_axes(group_list, resources, pool)
    leaves = set(tree.leaves)
    problem = _Problem(axes, inverse, group_list, dict.fromkeys(leaves, 1.0),
                       [d for d in demands if d.queue in leaves])
    filling = _TreeFilling(problem, tree)
    steps = filling.fill()
    problem.level = filling.level
    problem._split()
    solved = problem.targets()
    queues = {name: QueueTarget(
        queue=name, weight=tree.node(name).weight, share=target.share,
        demand_share=target.demand_share, clusters=target.clusters,
        cluster_shares=target.cluster_shares) for name, target in sorted(solved.items())}
    node_shares: dict[str, float] = {}
    for name, target in queues.items():
        for node in (name, *tree.ancestors(name)):
            node_shares[node] = node_shares.get(node, 0.0) + target.share
    top_cost = max((t.share / t.weight for t in queues.values() if t.weight > 0), default=0.0)
    return FairTargets(queues=queues, pool=dict(pool), levels=steps, top_cost=top_cost,
                       node_shares=dict(sorted(node_shares.items())))


class _TreeFilling:
    """Progressive filling over a queue tree, on a `_Problem`'s network (its leaves are the
    problem's queues).

    Every leaf still asking rises at a *rate*: the root rises at rate 1, and each rising node
    passes its rate to those of its rising children at the water (the lowest share / weight),
    in proportion to their weights; a child above the water (a guarantee gave it more) waits
    until the water reaches it (`_rates`). So at every node the rising children's costs stay
    equal (weighted max-min among siblings, a guarantee being a floor), and what a frozen
    child no longer takes goes to its siblings, then, when the whole subtree is frozen, to the
    parent's siblings (H-DRF's rule: raise every node that is not blocked). Guarantees first,
    deepest first, each phase a filling of its own (`fill`), then weights.

    Shares are counted in share units, the sum of the leaves' dominant shares, so a node's
    share is its leaves' added: a child's rise on one resource never shows as its parent's rise
    on another (what makes recursive DRF starve; Bhattacharya et al., SoCC 2013).

    A step raises every rising leaf by rate x delta, where delta is the largest rise at which
    (a) no leaf passes what it asks, (b) no node passes its bound (a limit, or the guarantee
    being served), (c) the water reaches no waiting sibling, and (d) a max flow still routes
    every leaf's level: Dinkelbach's method on
    the min cut, as `_Problem.fill` (within a step every level is linear in delta, so each
    failed max flow's cut gives the exact delta at which it stops binding). Then it freezes
    every leaf with all it asks, every leaf under a node at its bound, and every leaf that
    cannot reach the sink in the residual network (no rearrangement gives it more). Rates
    change only when some leaf freezes or a waiting node joins the water, so each step does
    one of the two: at most 2 x (leaves + nodes) steps per phase.
    """

    def __init__(self, problem: _Problem, tree: QueueTree) -> None:
        self.problem = problem
        self.tree = tree
        self.leaves = list(problem.queue_names)
        self.level: dict[str, float] = dict.fromkeys(self.leaves, 0.0)
        # Each leaf's demand mix per axis (share units), to measure a node's bounds in the
        # share units of what its subtree asks for (as a node group's capacity is measured).
        mix: dict[str, list[float]] = {name: [0.0] * len(problem.axes) for name in self.leaves}
        for queue, _, dominant, _, profile, _ in problem.demands:
            row = mix[queue]
            for axis, p in enumerate(profile):
                row[axis] += dominant * p
        self.under: dict[str, list[str]] = {}  # node -> its leaves with demand
        node_mix: dict[str, list[float]] = {}
        for name in self.leaves:
            for node in (name, *tree.ancestors(name)):
                self.under.setdefault(node, []).append(name)
                row = node_mix.setdefault(node, [0.0] * len(problem.axes))
                for axis, amount in enumerate(mix[name]):
                    row[axis] += amount
        self.node_mix = node_mix
        self.limit = {node: self._units(node, tree.node(node).limit) for node in self.under}
        self.guarantee = {node: self._units(node, tree.node(node).guarantee or None)
                          for node in self.under}
        self.net, self.source_edges, _ = problem._network(self.level)
        self.position = {name: i for i, name in enumerate(self.leaves)}
        # Nodes not retired yet (`_FlowNetwork.retire`): as in `_Problem.fill`, what cannot
        # reach the sink after a step never will while levels only rise, in every phase.
        self.live: set[int] = set(range(1, self.net.size))

    def _units(self, node: str, amounts: Mapping[str, float] | None) -> float:
        """A node's bound in share units: the most of its demand mix that fits in `amounts`
        (infinite without a bound; resources other than the fairness axes do not bound)."""
        if amounts is None:
            return float("inf")
        row = self.node_mix[node]
        top = max(row, default=0.0)
        bound = float("inf")
        if top <= _EPSILON:
            return bound
        for axis, name in enumerate(self.problem.axes):
            if name in amounts and row[axis] > _EPSILON:
                bound = min(bound, amounts[name] * self.problem.inverse[axis]
                            / (row[axis] / top))
        return bound

    def fill(self) -> int:
        steps = 0
        # Guarantees, deepest first: the leaves under a guaranteed node rise within it up to
        # its guarantee (and every bound above), the others keep what they have.
        guaranteed = sorted({self.tree.depth(node) for node, units in self.guarantee.items()
                             if units < float("inf")}, reverse=True)
        for depth in guaranteed:
            bounds = dict(self.limit)
            rising: set[str] = set()
            for node, units in self.guarantee.items():
                if units < float("inf") and self.tree.depth(node) == depth:
                    bounds[node] = min(bounds[node], units)
                    rising.update(self.under[node])
            steps += self._rise(rising, bounds)
        # Then weights, bounded by the limits alone.
        steps += self._rise(set(self.leaves), self.limit)
        return steps

    def _rates(self, rising: set[str]) -> tuple[dict[str, float], float]:
        """Each rising leaf's rate, and how far the step may go before the water reaches a
        sibling that waits above it.

        The root rises at rate 1. At each node, of its children with a leaf still rising, those
        at the water (the lowest cost, total / weight) share the node's rate by weight; those
        above it (a guarantee served them more) wait until the water reaches them: a guarantee
        is a floor, not a bonus on top of the weighted share."""
        tree, level = self.tree, self.level
        active: set[str] = set()
        for name in rising:
            active.add(name)
            active.update(tree.ancestors(name))
        rates: dict[str, float] = {}
        reach = float("inf")
        stack: list[tuple[str | None, float]] = [(None, 1.0)]
        while stack:
            node, rate = stack.pop()
            kids = [kid for kid in tree.children(node) if kid in active]
            if not kids:
                if node is not None:
                    rates[node] = rate
                continue
            cost = {kid: sum(level[name] for name in self.under[kid]) / tree.node(kid).weight
                    for kid in kids}
            water = min(cost.values())
            tolerance = _EPSILON + water * 1e-9
            at = [kid for kid in kids if cost[kid] <= water + tolerance]
            total = sum(tree.node(kid).weight for kid in at)
            for kid in kids:
                if kid not in at:
                    reach = min(reach, (cost[kid] - water) * total / rate)
            stack.extend((kid, rate * tree.node(kid).weight / total) for kid in at)
        return {name: rates.get(name, 0.0) for name in rising}, reach

    def _rise(self, candidates: set[str], bounds: Mapping[str, float]) -> int:
        problem, net, level = self.problem, self.net, self.level
        asked = problem.asked

        def total_of(node: str) -> float:
            return sum(level[name] for name in self.under[node])

        bounded = [node for node, bound in bounds.items() if bound < float("inf")]
        full = {node for node in bounded
                if total_of(node) >= bounds[node] - _EPSILON * max(1.0, bounds[node])}
        rising = {name for name in candidates if level[name] < asked[name] - _EPSILON
                  and not any(node in full for node in (name, *self.tree.ancestors(name)))}
        steps = 0
        # Each step freezes a leaf or brings a waiting node to the water: a bound on steps
        # that only floating-point trouble could reach.
        most = 2 * (len(self.leaves) + len(self.tree)) + 8
        while rising:
            steps += 1
            rate, reach = self._rates(rising)
            delta = reach
            # (a) and (b): the first leaf to have all it asks, the first node at its bound.
            delta = min([delta, *((asked[name] - level[name]) / rate[name]
                                  for name in rising if rate[name] > 0)])
            for node in bounded:
                node_rate = sum(rate.get(name, 0.0) for name in self.under[node])
                if node_rate > 0:
                    delta = min(delta, max(0.0, bounds[node] - total_of(node)) / node_rate)
            order = sorted(rising)
            # (c): Dinkelbach from above on the min cut.
            for _ in range(_MAX_DINKELBACH):
                for name in order:
                    cap = min(asked[name], level[name] + rate[name] * delta)
                    edge = self.source_edges[self.position[name]]
                    if cap != net.original[edge]:
                        net.set_capacity(edge, cap)
                total = sum(net.original[e] for e in self.source_edges)
                flow = net.max_flow(0, net.size - 1)
                if flow >= total - _EPSILON * max(1.0, total):
                    break
                side = net.reachable_from(0)
                leaving = 0.0
                for u in side:
                    if u == 0:
                        continue
                    for e in net.edges_of[u]:
                        if e % 2 == 0 and net.to[e] not in side:
                            leaving += net.original[e]
                inside = [name for name in self.leaves if 1 + self.position[name] in side]
                slope = sum(rate.get(name, 0.0) for name in inside)
                if slope <= 0:
                    break  # only frozen leaves: cannot bind; rounding
                lower = max(0.0, (leaving - sum(level[name] for name in inside)) / slope)
                if lower >= delta - _EPSILON:
                    break  # floating point: the cut no longer moves; take what flows
                delta = lower
            reaches_sink = net.reaching(net.size - 1)
            frozen: list[str] = []
            for name in order:
                edge = self.source_edges[self.position[name]]
                level[name] = min(asked[name], level[name] + rate[name] * delta,
                                  net.flow_of(edge) + _EPSILON)
                if level[name] >= asked[name] - _EPSILON:
                    level[name] = asked[name]
                    frozen.append(name)
                elif (1 + self.position[name]) not in reaches_sink:
                    level[name] = min(level[name], net.flow_of(edge))
                    frozen.append(name)
            for node in bounded:
                if total_of(node) >= bounds[node] - _EPSILON * max(1.0, bounds[node]):
                    frozen.extend(name for name in self.under[node] if name in rising)
            gone = self.live.difference(reaches_sink)
            net.retire(gone)
            self.live -= gone
            if steps >= most or (not frozen and not (
                    0 < reach < float("inf") and delta >= reach * (1 - 1e-9))):
                frozen = order  # numerically stuck: freeze everyone where they stand
            rising.difference_update(frozen)
        # The network keeps every leaf's final level as its cap (the next phase's start).
        for name in self.leaves:
            edge = self.source_edges[self.position[name]]
            if net.original[edge] != level[name]:
                net.set_capacity(edge, level[name])
        return steps
