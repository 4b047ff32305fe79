"""An independent model of the fair allocation: weighted, constrained max-min fair DRF.

Why it exists: tests, the fleet simulator and the demo must judge the scheduler against a
definition, not against the scheduler's own numbers. This module computes that definition in a
different way from the scheduler (a sequence of linear programs instead of progressive filling
pod by pod), so that a bug in one is not copied into the other. It must never import
`lockgate.scheduler` or lockgate's fairness code.

The definition (constrained max-min fairness, Ghodsi et al., "Choosy", EuroSys 2013, with DRF
shares and weights):
- The *pool* is every cluster together; its total is the sum of every cluster's capacity.
- A queue's demand in cluster C (pods of given shapes, optionally only on some node groups of C)
  can only be met from C's capacity (and from those node groups).
- A queue's *share* is its dominant share against the pool total, summed over clusters; its
  *cost* is share / weight.
- The fair allocation is the lexicographic max-min of the costs, fluid (pods may be split).

Algorithm: progressive filling over all clusters at once, as linear programs (HiGHS via
scipy.optimize.linprog). Each *level*: maximise the common cost t that every unfrozen queue can
reach while every frozen queue keeps its level; then find the queues that cannot rise above t
(with the others kept at t) and freeze them at t; repeat until every queue is frozen. Which
queues cannot rise is found exactly: maximise the sum of every candidate's rise; those that rise
are not stuck; repeat on the rest until the sum is zero (by convexity, if each of a set of queues
could rise on its own, all could rise together, so a zero sum means none of them can).

A queue's share is linear here: the sum over its pods of each pod's own dominant share. That is
the DRF dominant share exactly whenever a queue's shapes share one dominant resource (the usual
case: cpu-heavy pods); for a queue mixing, say, cpu-heavy and memory-heavy pods it counts a little
more than the dominant share of the sum. Tests that compare against the scheduler use queues
whose shapes share their dominant resource.

The split of a queue's allocation across clusters need not be unique; the shares are. Judge on
each queue's total (`FairAllocation.shares`, `pods`).

`hierarchical_allocation` is the same for a queue tree (issue 36; docs/scheduling.md,
"Hierarchical fair targets"): weights among siblings, guarantees and limits per node, by linear
programs as well.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

# The resources whose pool share can make a queue's dominant share (the scheduler's default).
FAIRNESS_RESOURCES: tuple[str, ...] = ("cpu", "memory", "nvidia.com/gpu")

# A queue whose best rise is below this (in pods of a typical shape) cannot rise; well above the
# solver's feasibility tolerance (1e-7) and the slack below, far below one pod.
_RISE_TOLERANCE = 1e-4
# Frozen queues keep their level less this (in pods), so that the solver's rounding never makes
# the next program infeasible.
_LEVEL_SLACK = 1e-6
# A dual value above this marks a queue's level row as binding.
_DUAL_TOLERANCE = 1e-9


class FairModelError(ValueError):
    """Input the model cannot work with (an unknown cluster, a negative count, a zero weight)."""


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one cluster that the same pods may land on; capacity is summed over its nodes."""

    name: str
    capacity: Mapping[str, float]


@dataclass(frozen=True)
class Cluster:
    """A cluster: one or more node groups. `Cluster.of(name, capacity)` makes one group."""

    name: str
    groups: tuple[NodeGroup, ...]

    @classmethod
    def of(cls, name: str, capacity: Mapping[str, float]) -> Cluster:
        return cls(name, (NodeGroup("", dict(capacity)),))

    @property
    def capacity(self) -> dict[str, float]:
        total: dict[str, float] = defaultdict(float)
        for group in self.groups:
            for resource, amount in group.capacity.items():
                total[resource] += amount
        return dict(total)


@dataclass(frozen=True)
class Demand:
    """`count` pods of one `shape` that `queue` wants in `cluster` (running or queued).

    `groups` names the node groups of the cluster its pods may land on; None means any."""

    queue: str
    cluster: str
    shape: Mapping[str, float]
    count: float
    groups: frozenset[str] | None = None



def _pool_of(clusters: Iterable[Cluster], resources: Collection[str],
             pool_total: Mapping[str, float] | None) -> dict[str, float]:
    """What shares are fractions of: `pool_total`, or every cluster's capacity summed, of the
    resources shares are over."""
    if pool_total is not None:
        return {r: float(a) for r, a in pool_total.items() if r in resources}
    total: dict[str, float] = defaultdict(float)
    for cluster in clusters:
        for resource, amount in cluster.capacity.items():
            if resource in resources:
                total[resource] += amount
    return dict(total)

def shape_key(shape: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """A hashable, order-free key of a shape (zero amounts dropped)."""
    return tuple(sorted((r, float(a)) for r, a in shape.items() if a))


@dataclass(frozen=True)
class FairAllocation:
    """The fair allocation. `shares` and `costs` are unique; the split across clusters is one of
    the possible ones (`cluster_shares`, `cluster_pods`)."""

    pool_total: dict[str, float]
    weights: dict[str, float]
    shares: dict[str, float]  # queue -> dominant share of the pool (fluid)
    cluster_shares: dict[str, dict[str, float]]  # queue -> cluster -> share
    cluster_pods: dict[str, dict[str, dict[tuple[tuple[str, float], ...], float]]]
    # queue -> cluster -> shape key -> pods (fluid)
    common_shapes: dict[str, dict[str, float]]  # queue -> its most common shape (by pod count)
    levels: int  # how many levels progressive filling took
    programs: int  # how many linear programs were solved
    demand_shares: dict[str, float] = field(default_factory=dict)  # queue -> share if fully met

    @property
    def costs(self) -> dict[str, float]:
        return {q: share / self.weights[q] for q, share in self.shares.items()}

    def dominant_share(self, shape: Mapping[str, float]) -> float:
        """One pod's dominant share of the pool."""
        return _dominant(shape, self.pool_total)

    def pods(self, queue: str, cluster: str | None = None) -> float:
        """The queue's fair allocation in pods of its most common shape (fluid), in total or in
        one cluster (one of the possible splits)."""
        share = self.shares[queue] if cluster is None else self.cluster_shares[queue].get(
            cluster, 0.0)
        unit = self.dominant_share(self.common_shapes[queue])
        return share / unit if unit > 0 else 0.0

    def resources(self, queue: str, cluster: str | None = None) -> dict[str, float]:
        """The queue's fair allocation as a resource vector (one of the possible splits)."""
        total: dict[str, float] = defaultdict(float)
        for name, by_shape in self.cluster_pods[queue].items():
            if cluster is not None and name != cluster:
                continue
            for key, count in by_shape.items():
                for resource, amount in key:
                    total[resource] += amount * count
        return dict(total)


    def resources_by_cluster(self, queue: str, resource: str = "cpu") -> dict[str, float]:
        """How much of one resource the queue's allocation holds in each cluster (one split)."""
        return {name: sum(dict(key).get(resource, 0.0) * count for key, count in by_shape.items())
                for name, by_shape in self.cluster_pods[queue].items()}


def _dominant(shape: Mapping[str, float], pool_total: Mapping[str, float]) -> float:
    return max((float(amount) / pool_total[r] for r, amount in shape.items()
                if pool_total.get(r, 0) > 0), default=0.0)


def fair_allocation(*, clusters: Sequence[Cluster], weights: Mapping[str, float],
                    demands: Iterable[Demand],
                    resources: Sequence[str] = FAIRNESS_RESOURCES,
                    pool_total: Mapping[str, float] | None = None) -> FairAllocation:
    """The weighted, constrained max-min fair DRF allocation (see the module docstring).

    `pool_total` defaults to the sum of every cluster's capacity over `resources`; pass it when
    the pool holds capacity that `clusters` does not offer (nodes taken by unmanaged pods)."""
    by_cluster = {c.name: c for c in clusters}
    if len(by_cluster) != len(clusters):
        raise FairModelError("cluster names must be unique")
    for queue, queue_weight in weights.items():
        if not queue_weight > 0:
            raise FairModelError(f"queue {queue!r}: weight must be positive, got {queue_weight}")
    demands = [d for d in demands if d.count != 0]
    for demand in demands:
        if demand.cluster not in by_cluster:
            raise FairModelError(f"queue {demand.queue!r}: unknown cluster {demand.cluster!r}")
        if demand.queue not in weights:
            raise FairModelError(f"demand for queue {demand.queue!r}, which has no weight")
        if demand.count < 0 or any(a < 0 for a in demand.shape.values()):
            raise FairModelError(f"queue {demand.queue!r}: negative demand")
    pool = _pool_of(clusters, resources, pool_total)

    queues = sorted(weights)
    queue_index = {q: i for i, q in enumerate(queues)}
    # Variables: pods of each demand on each node group it may use; then t (or the rises).
    columns: list[tuple[int, str]] = []  # (demand index, group name)
    for d_index, demand in enumerate(demands):
        for group in by_cluster[demand.cluster].groups:
            if demand.groups is None or group.name in demand.groups:
                columns.append((d_index, group.name))
    n = len(columns)
    dominant = np.array([_dominant(d.shape, pool) for d in demands]) if demands else np.zeros(0)
    positive = dominant[dominant > 0]
    # Scale shares to "pods of a typical shape", so the solver's tolerances mean fractions of a pod.
    scale = 1.0 / float(np.median(positive)) if positive.size else 1.0

    cap_rows: list[int] = []
    cap_cols: list[int] = []
    cap_vals: list[float] = []
    cap_rhs: list[float] = []
    row_of: dict[tuple[str, str, str], int] = {}
    for col, (d_index, group_name) in enumerate(columns):
        demand = demands[d_index]
        for resource, amount in demand.shape.items():
            if amount == 0:
                continue
            key = (demand.cluster, group_name, resource)
            if key not in row_of:
                row_of[key] = len(cap_rhs)
                group = next(g for g in by_cluster[demand.cluster].groups if g.name == group_name)
                cap_rhs.append(float(group.capacity.get(resource, 0.0)))
            cap_rows.append(row_of[key])
            cap_cols.append(col)
            cap_vals.append(float(amount))
    # Each demand is met at most `count` times, over its groups.
    count_rows = [d_index for d_index, _ in columns]
    count_matrix = sparse.csr_matrix((np.ones(n), (count_rows, np.arange(n))),
                                     shape=(len(demands), n))
    count_rhs = np.array([float(d.count) for d in demands])
    capacity = sparse.csr_matrix((cap_vals, (cap_rows, cap_cols)), shape=(len(cap_rhs), n))
    # Rows scaled so the largest coefficient is 1 (the solver's tolerances are absolute).
    row_max = np.asarray(abs(capacity).max(axis=1).todense()).ravel() if n else np.zeros(0)
    row_max[row_max == 0] = 1.0
    capacity = sparse.diags(1.0 / row_max) @ capacity
    cap_rhs_scaled = np.array(cap_rhs) / row_max
    # share_q = sum over its columns of pods x dominant share (scaled).
    share_matrix = sparse.csr_matrix(
        ([dominant[d] * scale for d, _ in columns],
         ([queue_index[demands[d].queue] for d, _ in columns], np.arange(n))),
        shape=(len(queues), n))
    demand_share = np.zeros(len(queues))
    for d_index, demand in enumerate(demands):
        demand_share[queue_index[demand.queue]] += dominant[d_index] * demand.count * scale
    weight = np.array([float(weights[q]) for q in queues])

    base_ub = sparse.vstack([capacity, count_matrix]).tocsr()
    base_rhs = np.concatenate([cap_rhs_scaled, count_rhs])

    frozen_level = np.full(len(queues), np.nan)  # scaled share each frozen queue keeps
    # A queue with nothing it can ask for stays at zero.
    frozen_level[demand_share <= 0] = 0.0
    saturation = demand_share / weight  # the cost at which a queue has all it asks for
    programs = 0
    levels = 0

    def solve(extra_cols: int, objective_extra: np.ndarray, rows: sparse.spmatrix,
              rhs: np.ndarray, bounds_extra: list[tuple[float, float | None]]) -> Any:
        nonlocal programs
        programs += 1
        a_ub = sparse.vstack([sparse.hstack([base_ub, sparse.csr_matrix(
            (base_ub.shape[0], extra_cols))]), rows]).tocsr()
        b_ub = np.concatenate([base_rhs, rhs])
        objective = np.concatenate([np.zeros(n), objective_extra])
        result = linprog(objective, A_ub=a_ub, b_ub=b_ub,
                         bounds=[(0, None)] * n + bounds_extra, method="highs")
        if result.status not in (0, 2):  # 2: infeasible, which a trial may be
            raise FairModelError(f"linear program failed: {result.message}")
        return result

    def floors(indices: np.ndarray, levels_: np.ndarray,
               extra_cols: int) -> tuple[sparse.spmatrix, np.ndarray]:
        """share_q >= level_q (less the slack), as -share_q <= -level_q."""
        rows = sparse.hstack([-share_matrix[indices], sparse.csr_matrix(
            (len(indices), extra_cols))])
        return rows, -(levels_ - _LEVEL_SLACK)

    def highest_level(rising: np.ndarray, satisfied: np.ndarray) -> Any:
        """max t: share_q >= w_q t for `rising`, every frozen queue keeps its level and every
        `satisfied` queue gets all it asks for. None when that is infeasible."""
        frozen = np.flatnonzero(~np.isnan(frozen_level))
        rise_rows = sparse.hstack([-share_matrix[rising],
                                   sparse.csr_matrix(weight[rising].reshape(-1, 1))])
        keep_rows, keep_rhs = floors(frozen, frozen_level[frozen], 1)
        full_rows, full_rhs = floors(satisfied, demand_share[satisfied], 1)
        ceiling = float(saturation[rising].max()) if len(rising) else 0.0
        return solve(1, np.array([-1.0]), sparse.vstack([rise_rows, keep_rows, full_rows]),
                     np.concatenate([np.zeros(len(rising)), keep_rhs, full_rhs]),
                     [(0, ceiling)])

    def reaches(result: Any, cost: float) -> bool:
        return bool(result.status == 0 and result.x[n] >= cost * (1 - 1e-9) - 1e-12)

    def cannot_rise(unfrozen: np.ndarray, level: float) -> np.ndarray:
        """The unfrozen queues that cannot rise above w_q level while the others keep it: the
        sum of the candidates' rises is maximised; those that rise are not stuck; repeated on
        the rest until the sum is zero (by convexity, if each of a set could rise on its own,
        all could rise together, so a zero sum means none can). Used only when the duals do
        not name one (numerically degenerate programs)."""
        frozen = np.flatnonzero(~np.isnan(frozen_level))
        candidates = unfrozen
        while len(candidates):
            k = len(candidates)
            is_candidate = np.isin(unfrozen, candidates)
            rise_matrix = sparse.csr_matrix(
                (np.ones(k), (np.flatnonzero(is_candidate), np.arange(k))),
                shape=(len(unfrozen), k))
            rows = sparse.hstack([-share_matrix[unfrozen], rise_matrix])
            rhs = -(weight[unfrozen] * level - _LEVEL_SLACK)
            keep_rows, keep_rhs = floors(frozen, frozen_level[frozen], k)
            result = solve(k, -np.ones(k), sparse.vstack([rows, keep_rows]),
                           np.concatenate([rhs, keep_rhs]), [(0, 1.0)] * k)
            if result.status != 0:
                raise FairModelError(f"linear program failed: {result.message}")
            rising = np.asarray(result.x)[n:] > _RISE_TOLERANCE
            if not rising.any():
                break
            candidates = candidates[~rising]
        return candidates

    while np.isnan(frozen_level).any():
        levels += 1
        if levels > 2 * len(queues) + 10:
            raise FairModelError("progressive filling made no progress (numerical trouble)")
        unfrozen = np.flatnonzero(np.isnan(frozen_level))
        order = unfrozen[np.argsort(saturation[unfrozen], kind="stable")]
        first = highest_level(order, order[:0])
        if first.status != 0:
            raise FairModelError(f"linear program failed: {first.message}")
        level = float(first.x[n])
        if reaches(first, float(saturation[order[0]])):
            # Some queues have all they ask for before any capacity stops the rise: find the
            # most that do (galloping, then bisection: each trial is one program).
            def all_met(count: int, order: np.ndarray = order) -> bool:
                return reaches(highest_level(order[count:], order[:count]),
                               float(saturation[order[count - 1]]))

            known, step = 1, 1
            while known + step <= len(order) and all_met(known + step):
                known += step
                step *= 2
            low, high = known, min(known + step, len(order) + 1)  # all_met(high) is False
            while high - low > 1:
                middle = (low + high) // 2
                if all_met(middle):
                    low = middle
                else:
                    high = middle
            met = order[:low]
            frozen_level[met] = demand_share[met]
            continue
        # Capacity stops the rise at `level`. A queue whose row has a nonzero dual is tight in
        # every optimum (complementary slackness): it cannot rise while the others keep
        # `level`. At least one row has one (the duals times the weights sum to one).
        marginals = np.asarray(first.ineqlin.marginals)[base_ub.shape[0]:][:len(order)]
        stuck = order[np.abs(marginals) > _DUAL_TOLERANCE]
        if not len(stuck):
            stuck = cannot_rise(order, level)
        frozen_level[stuck] = weight[stuck] * level

    # One split with every queue at its level (the cross-cluster split is not unique).
    solution = np.zeros(n)
    if n:
        every = np.arange(len(queues))
        keep_rows, keep_rhs = floors(every, frozen_level, 0)
        final = solve(0, np.zeros(0), keep_rows, keep_rhs, [])
        if final.status != 0:
            raise FairModelError(f"linear program failed: {final.message}")
        solution = np.asarray(final.x)[:n]

    # The final split: the last program's pods (every queue at its level).
    cluster_shares: dict[str, dict[str, float]] = {q: {} for q in queues}
    cluster_pods: dict[str, dict[str, dict[tuple[tuple[str, float], ...], float]]] = {
        q: {} for q in queues}
    for col, (d_index, _) in enumerate(columns):
        demand = demands[d_index]
        pods = float(solution[col])
        if pods <= _RISE_TOLERANCE:  # the solver's rounding, not an allocation
            continue
        shares = cluster_shares[demand.queue]
        shares[demand.cluster] = shares.get(demand.cluster, 0.0) + pods * dominant[d_index]
        by_shape = cluster_pods[demand.queue].setdefault(demand.cluster, {})
        shape = shape_key(demand.shape)
        by_shape[shape] = by_shape.get(shape, 0.0) + pods
    common: dict[str, dict[str, float]] = {}
    counts: dict[str, dict[tuple[tuple[str, float], ...], float]] = defaultdict(dict)
    for demand in demands:
        shape = shape_key(demand.shape)
        counts[demand.queue][shape] = counts[demand.queue].get(shape, 0.0) + demand.count
    for queue in queues:
        if counts[queue]:
            # Most pods first; ties to the smallest shape key, so the choice is deterministic.
            best = min(counts[queue].items(), key=lambda kv: (-kv[1], kv[0]))[0]
            common[queue] = dict(best)
        else:
            common[queue] = {}
    return FairAllocation(
        pool_total=pool,
        weights={q: float(weights[q]) for q in queues},
        shares={q: float(frozen_level[i]) / scale for i, q in enumerate(queues)},
        cluster_shares=cluster_shares,
        cluster_pods=cluster_pods,
        common_shapes=common,
        levels=levels,
        programs=programs,
        demand_shares={q: float(demand_share[i]) / scale for i, q in enumerate(queues)},
    )


@dataclass(frozen=True)
class NearestSplit:
    """The split of a fair allocation nearest a holding (`nearest_split`)."""

    largest: float  # the largest |held - part| over the judged queues' clusters, in pods
    parts: dict[tuple[str, str], float]  # (queue, cluster) -> its part there, in common pods
    by_queue: dict[str, float]  # queue -> its largest |held - part| over its clusters, in pods


def nearest_split(allocation: FairAllocation, *, clusters: Sequence[Cluster],
                  demands: Iterable[Demand], held: Mapping[tuple[str, str], float],
                  judged: Collection[str] | None = None) -> NearestSplit:
    """Of every split of `allocation` across clusters, the one nearest what the queues hold.

    Why: the fair shares are unique but their split across clusters need not be (a queue asking
    in two clusters may be served in either), so "within one pod of its target in each cluster"
    means within one pod of *some* fair split. Every split that gives each queue its unique
    fair share, within each cluster's capacity and each demand, is one (the shares are what
    max-min fairness fixes).

    Two linear programs: the first finds the smallest largest difference, in pods of each
    queue's most common shape, between what a queue of `judged` (None: every queue) holds in a
    cluster (`held`, in those pods) and its part there; the second keeps the judged queues
    within that and makes the sum of every queue's differences least, so that each queue's
    own figure (`by_queue`) is as small as that allows.

    Clusters of one node group only (the fleet simulator's); demands naming groups are refused.
    """
    demands = [d for d in demands if d.count > 0]
    capacity = {c.name: c.capacity for c in clusters}
    if any(len(c.groups) != 1 for c in clusters) or any(d.groups for d in demands):
        raise FairModelError("nearest_split: clusters of one node group only")
    pool = allocation.pool_total
    unit = {q: _dominant(shape, pool) for q, shape in allocation.common_shapes.items()}
    pairs = sorted({(d.queue, d.cluster) for d in demands} | {
        pair for pair, pods in held.items() if pods > 0})
    n, m = len(demands), len(pairs)
    # Columns: each demand's pods, then each pair's difference u, then t (the largest).
    t_col = n + m
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rhs: list[float] = []

    def row(entries: Iterable[tuple[int, float]], bound: float) -> None:
        index = len(rhs)
        for col, value in entries:
            rows.append(index)
            cols.append(col)
            vals.append(value)
        rhs.append(bound)

    # In each cluster, within its capacity.
    by_cluster_resource: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for col, demand in enumerate(demands):
        for resource, amount in demand.shape.items():
            if amount:
                by_cluster_resource[(demand.cluster, resource)].append((col, float(amount)))
    for (cluster, resource), entries in by_cluster_resource.items():
        limit = float(capacity[cluster].get(resource, 0.0))
        scale = max(v for _, v in entries)
        row(((c, v / scale) for c, v in entries), limit / scale)
    # Each queue gets its fair share (in pods of its common shape), to the solver's tolerance.
    in_pods = [(_dominant(d.shape, pool) / unit[d.queue]) if unit.get(d.queue) else 0.0
               for d in demands]
    by_queue: dict[str, list[tuple[int, float]]] = defaultdict(list)
    by_pair: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for col, demand in enumerate(demands):
        by_queue[demand.queue].append((col, in_pods[col]))
        by_pair[(demand.queue, demand.cluster)].append((col, in_pods[col]))
    for queue, entries in by_queue.items():
        fair = allocation.pods(queue) if unit.get(queue) else 0.0
        slack = 1e-6 * max(1.0, fair)
        row(entries, fair + slack)
        row(((c, -v) for c, v in entries), -(fair - slack))
    # u >= |held - part| in every pair a queue asks or holds in; u <= t for the judged.
    for index, pair in enumerate(pairs):
        entries = by_pair.get(pair, [])
        pods = float(held.get(pair, 0.0))
        row([*((c, -v) for c, v in entries), (n + index, -1.0)], -pods)
        row([*entries, (n + index, -1.0)], pods)
        if judged is None or pair[0] in judged:
            row([(n + index, 1.0), (t_col, -1.0)], 0.0)
    matrix = sparse.csr_matrix((vals, (rows, cols)), shape=(len(rhs), n + m + 1))
    bounds = [(0.0, float(d.count)) for d in demands] + [(0.0, None)] * (m + 1)

    def solve(objective: np.ndarray, bounds: Sequence[tuple[float, float | None]]) -> Any:
        result = linprog(objective, A_ub=matrix, b_ub=np.array(rhs), bounds=bounds,
                         method="highs")
        if result.status != 0:
            raise FairModelError(f"nearest_split: linear program failed: {result.message}")
        return result

    least = np.zeros(n + m + 1)
    least[t_col] = 1.0
    largest = float(solve(least, bounds).x[t_col])
    total = np.zeros(n + m + 1)
    total[n:n + m] = 1.0
    result = solve(total, [*bounds[:t_col], (0.0, largest + 1e-6 * max(1.0, largest))])
    parts: dict[tuple[str, str], float] = dict.fromkeys(pairs, 0.0)
    for col, demand in enumerate(demands):
        parts[(demand.queue, demand.cluster)] += float(result.x[col]) * in_pods[col]
    worst: dict[str, float] = {}
    for (queue, cluster), part in parts.items():
        gap = abs(float(held.get((queue, cluster), 0.0)) - part)
        worst[queue] = max(worst.get(queue, 0.0), gap)
    return NearestSplit(largest=largest, parts=parts, by_queue=worst)


# ---- the hierarchical definition (issue 36; docs/scheduling.md, "Hierarchical fair targets") --


@dataclass(frozen=True)
class TreeQueue:
    """A node of a queue tree, as the model takes it (its own type: the model shares no code
    with lockgate). `parent` None: a child of the root. Only leaves have demand. `guarantee`
    and `limit` are per resource (a limit of None: none)."""

    name: str
    parent: str | None = None
    weight: float = 1.0
    guarantee: Mapping[str, float] = field(default_factory=dict)
    limit: Mapping[str, float] | None = None


@dataclass(frozen=True)
class HierarchicalAllocation:
    """Every leaf's and every inner node's fair share (dominant share of the pool, fluid)."""

    pool_total: dict[str, float]
    shares: dict[str, float]  # every node with demand under it -> its share
    steps: int
    programs: int


def hierarchical_allocation(*, clusters: Sequence[Cluster], tree: Sequence[TreeQueue],
                            demands: Iterable[Demand],
                            resources: Sequence[str] = FAIRNESS_RESOURCES,
                            pool_total: Mapping[str, float] | None = None,
                            ) -> HierarchicalAllocation:
    """The hierarchical weighted constrained max-min fair allocation, by linear programs.

    The definition: every leaf's share rises, continuously, at a rate handed down the tree:
    the root at 1; at each node, of the children with a leaf still rising, those with the
    lowest share / weight (the water) split the node's rate by weight, and the others wait
    until the water reaches them. A leaf stops rising when it cannot rise with every other
    leaf keeping its share (all it asks, its pods have nowhere else to go, or a node above it
    is at its limit). Guarantees come first, deepest first: the leaves under the guaranteed
    nodes of one depth rise as above, each such node's total bounded by its guarantee, while
    every other leaf keeps its share; then every leaf rises, bounded by the limits alone.

    Computed differently from the scheduler (lockgate.scheduler.targets): each step is a
    linear program over the pods per (demand, node group) with every resource's capacity and
    every node's limit as rows of its own (no share units, no max flow); it finds the largest
    rise, and one more program per rising leaf finds which cannot rise further (maximise that
    leaf's share with the others kept at theirs).
    """
    nodes = {node.name: node for node in tree}
    if len(nodes) != len(tree):
        raise FairModelError("tree node names must be unique")
    children: dict[str | None, list[str]] = defaultdict(list)
    for node in tree:
        if node.parent is not None and node.parent not in nodes:
            raise FairModelError(f"{node.name!r}: unknown parent {node.parent!r}")
        if not node.weight > 0:
            raise FairModelError(f"{node.name!r}: weight must be positive")
        children[node.parent].append(node.name)

    def chain(name: str) -> list[str]:
        found = [name]
        while nodes[found[-1]].parent is not None:
            found.append(nodes[found[-1]].parent)  # type: ignore[arg-type]
            if len(found) > len(nodes):
                raise FairModelError("the tree has a cycle")
        return found

    by_cluster = {c.name: c for c in clusters}
    demands = [d for d in demands if d.count > 0]
    for demand in demands:
        if demand.queue not in nodes or children.get(demand.queue):
            raise FairModelError(f"demand for {demand.queue!r}, which is not a leaf")
        if demand.cluster not in by_cluster:
            raise FairModelError(f"unknown cluster {demand.cluster!r}")
    pool = _pool_of(clusters, resources, pool_total)
    leaves = sorted({d.queue for d in demands})
    leaf_index = {name: i for i, name in enumerate(leaves)}
    columns = [(d, g.name) for d, demand in enumerate(demands)
               for g in by_cluster[demand.cluster].groups
               if demand.groups is None or g.name in demand.groups]
    n = len(columns)
    if n == 0:
        return HierarchicalAllocation(pool_total=pool, shares={}, steps=0, programs=0)
    dominant = [_dominant(d.shape, pool) for d in demands]
    positive = sorted(x for x in dominant if x > 0)
    scale = 1.0 / positive[len(positive) // 2] if positive else 1.0
    # Each leaf's share (scaled) as a row over the columns.
    share_rows = np.zeros((len(leaves), n))
    for col, (d, _) in enumerate(columns):
        share_rows[leaf_index[demands[d].queue], col] = dominant[d] * scale
    # Fixed rows: every group's capacity per resource, every demand's count.
    fixed: list[np.ndarray] = []
    fixed_rhs: list[float] = []
    for cluster in clusters:
        for group in cluster.groups:
            resources_used = {r for d, g in columns if demands[d].cluster == cluster.name
                              and g == group.name for r, a in demands[d].shape.items() if a}
            for resource in sorted(resources_used):
                row = np.zeros(n)
                for col, (d, g) in enumerate(columns):
                    if demands[d].cluster == cluster.name and g == group.name:
                        row[col] = demands[d].shape.get(resource, 0.0)
                top = max(row.max(), 1e-300)
                fixed.append(row / top)
                fixed_rhs.append(float(group.capacity.get(resource, 0.0)) / top)
    for d, demand in enumerate(demands):
        row = np.zeros(n)
        for col, (dd, _) in enumerate(columns):
            if dd == d:
                row[col] = 1.0
        fixed.append(row)
        fixed_rhs.append(float(demand.count))
    under = {name: [leaf for leaf in leaves if name in chain(leaf)] for name in nodes}

    def bound_rows(bounds: Mapping[str, Mapping[str, float]]) -> tuple[list[np.ndarray],
                                                                      list[float]]:
        rows: list[np.ndarray] = []
        rhs: list[float] = []
        for name, amounts in bounds.items():
            for resource, amount in amounts.items():
                row = np.zeros(n)
                for col, (d, _) in enumerate(columns):
                    if demands[d].queue in under[name]:
                        row[col] = demands[d].shape.get(resource, 0.0)
                top = row.max()
                if top > 0:
                    rows.append(row / top)
                    rhs.append(float(amount) / top)
        return rows, rhs

    level = np.zeros(len(leaves))
    programs = 0
    steps = 0

    def solve(objective: np.ndarray, rows: list[np.ndarray], rhs: list[float]) -> Any:
        nonlocal programs
        programs += 1
        width = len(objective)
        matrix = np.vstack([np.hstack([r, np.zeros(width - n)]) if len(r) == n else r
                            for r in rows]) if rows else np.zeros((0, width))
        return linprog(objective, A_ub=matrix, b_ub=np.array(rhs), bounds=[(0, None)] * width,
                       method="highs")

    def rates(rising: set[str]) -> tuple[dict[str, float], float]:
        active = {node for leaf in rising for node in chain(leaf)}
        out: dict[str, float] = {}
        wait = float("inf")
        todo: list[tuple[str | None, float]] = [(None, 1.0)]
        while todo:
            name, rate = todo.pop()
            kids = [k for k in children.get(name, []) if k in active]
            if not kids:
                out[name] = rate  # type: ignore[index]
                continue
            cost = {k: sum(level[leaf_index[x]] for x in under[k]) / nodes[k].weight
                    for k in kids}
            water = min(cost.values())
            low = [k for k in kids if cost[k] <= water * (1 + 1e-7) + 1e-9]
            weight = sum(nodes[k].weight for k in low)
            for k in kids:
                if k not in low:
                    wait = min(wait, (cost[k] - water) * weight / rate)
            todo += [(k, rate * nodes[k].weight / weight) for k in low]
        return out, wait

    def rise(candidates: set[str], bounds: Mapping[str, Mapping[str, float]]) -> None:
        nonlocal steps
        extra, extra_rhs = bound_rows(bounds)
        rows = fixed + extra
        rhs = fixed_rhs + extra_rhs
        rising = set(candidates)
        while rising:
            steps += 1
            if steps > 20 * (len(nodes) + 2):
                raise FairModelError("hierarchical filling made no progress")
            rate, wait = rates(rising)
            # max delta: share_l >= level_l + rate_l delta (rising), >= level_l (others).
            keep_rows = []
            keep_rhs = []
            for leaf in leaves:
                r = rate.get(leaf, 0.0) if leaf in rising else 0.0
                keep_rows.append(np.hstack([-share_rows[leaf_index[leaf]], [r]]))
                keep_rhs.append(-(level[leaf_index[leaf]] - _LEVEL_SLACK))
            objective = np.zeros(n + 1)
            objective[n] = -1.0
            ceiling = np.zeros(n + 1)
            ceiling[n] = 1.0
            cap_rows = [*keep_rows, *([ceiling] if wait < float("inf") else [])]
            cap_rhs = [*keep_rhs, *([wait] if wait < float("inf") else [])]
            result = solve(objective, rows + cap_rows, rhs + cap_rhs)
            if result.status != 0:
                raise FairModelError(f"linear program failed: {result.message}")
            delta = float(result.x[n])
            for leaf in rising:
                level[leaf_index[leaf]] += rate.get(leaf, 0.0) * delta
            if wait < float("inf") and delta >= wait * (1 - 1e-7):
                continue  # the water reached a waiting sibling: rates change, nobody stops
            stuck = set()
            for leaf in sorted(rising):
                mine = np.zeros(n)
                mine -= share_rows[leaf_index[leaf]]
                floors = [(-share_rows[leaf_index[other]], -(level[leaf_index[other]]
                                                              - _LEVEL_SLACK))
                          for other in leaves if other != leaf]
                best = solve(mine, rows + [r for r, _ in floors], rhs + [b for _, b in floors])
                if best.status != 0:
                    raise FairModelError(f"linear program failed: {best.message}")
                if -best.fun <= level[leaf_index[leaf]] + _RISE_TOLERANCE:
                    stuck.add(leaf)
            if not stuck:
                raise FairModelError("a step stopped with no leaf stuck (numerical trouble)")
            rising -= stuck

    depth = {name: len(chain(name)) - 1 for name in nodes}
    limits = {name: dict(node.limit) for name, node in nodes.items() if node.limit is not None}
    guaranteed = sorted({depth[name] for name, node in nodes.items()
                         if any(node.guarantee.values()) and under[name]}, reverse=True)
    for at in guaranteed:
        bounds = {name: dict(amounts) for name, amounts in limits.items()}
        rising: set[str] = set()
        for name, node in nodes.items():
            if depth[name] == at and any(node.guarantee.values()) and under[name]:
                mixed = dict(bounds.get(name, {}))
                for resource, amount in node.guarantee.items():
                    mixed[resource] = min(amount, mixed.get(resource, amount))
                bounds[name] = mixed
                rising.update(under[name])
        rise(rising, bounds)
    rise(set(leaves), limits)
    shares = {leaf: float(level[leaf_index[leaf]]) / scale for leaf in leaves}
    node_shares: dict[str, float] = {}
    for leaf, share in shares.items():
        for name in chain(leaf):
            node_shares[name] = node_shares.get(name, 0.0) + share
    return HierarchicalAllocation(pool_total=pool, shares=dict(sorted(node_shares.items())),
                                  steps=steps, programs=programs)


# ---- usage that decays, written again for judges (issue 36; docs/scheduling.md, "Usage that
# decays") ------------------------------------------------------------------------------------

# The documented rule's floor on a node's factor (docs/scheduling.md: 2^-20).
HISTORY_FACTOR_FLOOR = 2.0 ** -20


class DecayedUsageModel:
    """Each leaf's decayed usage (share x seconds): the integral of its share, each moment
    weighed by 2^(-age / half-life). A judge's own bookkeeping, from what it saw run, so that
    the weights it judges with are not the scheduler's (lockgate.decayed_usage keeps the
    scheduler's). `advance(now, shares)` counts `shares` as held since the last call."""

    def __init__(self, *, half_life_seconds: float, at: float) -> None:
        if not half_life_seconds > 0:
            raise FairModelError(f"half-life must be positive, got {half_life_seconds}")
        self.rate = np.log(2.0) / half_life_seconds
        self.at = at
        self.leaves: dict[str, float] = {}

    def advance(self, *, now: float, shares: Mapping[str, float]) -> None:
        elapsed = now - self.at
        if elapsed <= 0:
            return
        kept = float(np.exp(-self.rate * elapsed))
        # A constant share s over the interval, decayed to now: s * (1 - kept) / rate.
        added = (1.0 - kept) / self.rate
        self.leaves = {name: value * kept for name, value in self.leaves.items()}
        for name, share in shares.items():
            if share > 0:
                self.leaves[name] = self.leaves.get(name, 0.0) + share * added
        self.at = now

    def of_tree(self, tree: Sequence[TreeQueue]) -> dict[str, float]:
        """Every node's usage: a leaf's own, an inner node's the sum of its leaves'."""
        parent = {node.name: node.parent for node in tree}
        usage = dict.fromkeys(parent, 0.0)
        for leaf, value in self.leaves.items():
            at: str | None = leaf
            while at is not None and at in parent:
                usage[at] += value
                at = parent[at]
        return usage


def history_effective_weights(tree: Sequence[TreeQueue],
                              usage: Mapping[str, float]) -> dict[str, float]:
    """The documented rule: among each set of siblings, a node's weight becomes
    weight x 2^(-u / s), u its part of the siblings' decayed usage (0 when none used any), s its
    part of their weights, the factor floored at `HISTORY_FACTOR_FLOOR`."""
    siblings: dict[str | None, list[TreeQueue]] = defaultdict(list)
    for node in tree:
        siblings[node.parent].append(node)
    weights: dict[str, float] = {}
    for kids in siblings.values():
        used = sum(usage.get(kid.name, 0.0) for kid in kids)
        total = sum(kid.weight for kid in kids)
        for kid in kids:
            u = usage.get(kid.name, 0.0) / used if used > 0 else 0.0
            factor = 2.0 ** -(max(0.0, u) / (kid.weight / total))
            weights[kid.name] = kid.weight * max(HISTORY_FACTOR_FLOOR, factor)
    return weights
