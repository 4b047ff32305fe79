"""The cost model: how much of the pool a queue holds, what it is owed, and what it costs.

Why it exists: the round, preemption, explain and status must judge a queue by the same numbers,
or they contradict each other (a pod told to wait for a share that preemption thinks is met).
The policy follows Armada's dominant resource fairness. A queue's *share* is the largest, over
the fairness resources (`SchedulerState.fairness_inverse`: 1 / the pool's total per axis, 0 on
every other axis), of its allocation divided by the pool's total (every schedulable node of
every cluster); its *cost* is that share divided by its weight (1 / priority factor).
Progressive filling keeps giving the next job to the queue whose cost *after* taking it would be
lowest, so the queues furthest below their share go first.

Everything that weighs a queue uses the functions here with that one inverse: the round
(`share_after`, `cost_after`, `owed`; `owed` also decides whether a pod may be released for
growth, onto a node that may exist, lockgate.growth), preemption (its rules compare shares and
costs with `below_target` and `within_target`), explain and status (`fair_shares`, `owed`).
Nothing else measures a queue against the pool, and nothing else compares shares: the
tolerances live here alone (tests/unit/test_cost_model.py keeps it so). The fair-target solver
(targets.py, below this module) keeps its own numerical tolerances; room.py measures nodes, not
queues.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import mul

from lockgate.queue_tree import QueueTree
from lockgate.scheduler.records import Shape
from lockgate.scheduler.state import QueueRecord, SchedulerState
from lockgate.scheduler.targets import FairTargets

# Shares are floats: a queue exactly at its target must not look a hair above or below it. A
# share within this fraction of a target (plus `_SHARE_FLOOR`, for targets near nothing) is at
# it, on either side.
SHARE_SLACK = 1e-9
_SHARE_FLOOR = 1e-12
# Adjusted fair share stops redistributing when less than this much of the pool is left over...
_REDISTRIBUTION_THRESHOLD = 0.01
# ...or after this many passes.
_REDISTRIBUTION_PASSES = 10


@dataclass(frozen=True, slots=True)
class FairShare:
    """A queue's standing; shares are fractions of the whole pool's dominant resource."""

    queue: str
    weight: float
    fair_share: float  # weight / sum of weights of active queues
    adjusted_fair_share: float  # fair share, with what others cannot use redistributed
    actual_share: float  # dominant share of its allocation
    demand_share: float  # dominant share of allocation plus schedulable queued requests
    # Its constrained fair target (lockgate.scheduler.targets): over the pool, and per cluster
    # it asks for room in; and what it holds in each cluster (all as shares of the pool).
    fair_target: float = 0.0
    cluster_targets: Mapping[str, float] = field(default_factory=dict)
    cluster_shares: Mapping[str, float] = field(default_factory=dict)


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
    return fair_shares_over(state, state.fairness_inverse())


def fair_shares_over(state: SchedulerState, inverse: list[float],
                     targets: FairTargets | None = None) -> dict[str, FairShare]:
    """`fair_shares` with the pool's inverse already at hand (a round computes it once), and
    the fair targets to report (None: the state's latest)."""
    weights: dict[str, float] = {}
    demands: dict[str, float] = {}
    actual: dict[str, float] = {}
    for name, queue in state.queue_records.items():
        actual[name] = dominant(queue.allocation, inverse)
        # Only defined queues share the pool: jobs naming a queue nobody defined (or one since
        # deleted) still hold what they hold, but do not dilute the others' fair shares.
        if queue.is_empty() or queue.spec is None:
            continue
        weights[name] = queue.weight
        demands[name] = (
            dominant_sum(queue.allocation, queue.demand, inverse)
            if queue.schedulable
            else actual[name]
        )
    total_weight = sum(weights.values())
    adjusted = adjusted_fair_shares(weights, demands)
    if targets is None:
        targets = state.fair_targets(latest=True)  # the round's, when one ran
    shares: dict[str, FairShare] = {}
    for name, queue in state.queue_records.items():
        target = targets.queues.get(name)
        shares[name] = FairShare(
            queue=name,
            weight=queue.weight,
            fair_share=weights[name] / total_weight if name in weights else 0.0,
            adjusted_fair_share=adjusted.get(name, 0.0),
            actual_share=actual[name],
            demand_share=demands.get(name, actual[name]),
            fair_target=0.0 if target is None else target.share,
            # Neither is copied: the targets are never changed once solved, nor `shares_in`'s
            # answer once given (1,000 queues x 50 clusters, after every round).
            cluster_targets={} if target is None else target.cluster_shares,
            cluster_shares=shares_in(queue, inverse),
        )
    return shares


def shares_in(queue: QueueRecord, inverse: list[float]) -> Mapping[str, float]:
    """A queue's dominant share of the pool in each cluster it holds capacity in, by cluster
    name, sorted. Worked out again only after what it holds changed (`alloc_changes`) or the
    pool did: the leader reports every queue's share in every cluster after each round
    (50,000 of them at 1,000 queues in 50 clusters, most of its report's cost), and a round
    changes a few queues' holdings. Never changed in place once given: readers keep it."""
    cached = queue.shares_in_cache
    if cached is not None and cached[0] == queue.alloc_changes and cached[1] == inverse:
        return cached[2]
    shares = {cluster: dominant(vector, inverse)
              for cluster, vector in sorted(queue.alloc_in.items())}
    queue.shares_in_cache = (queue.alloc_changes, list(inverse), shares)
    return shares


def dominant(vector: list[int], inverse: list[float]) -> float:
    """The dominant share of a vector: its largest amount over the pool's, on fairness axes."""
    # map over operator.mul, not a generator: the same products, in C (the leader reports
    # every queue's share in every cluster after each round: 20,000 of these at 1,000 queues).
    return max(map(mul, vector, inverse), default=0.0)


def dominant_sum(first: list[int], second: list[int], inverse: list[float]) -> float:
    """The dominant share of `first + second`, without building the sum."""
    return max(
        ((a + b) * inv for a, b, inv in zip(first, second, inverse, strict=False)), default=0.0
    )


def dominant_of(shape: Shape, inverse: list[float]) -> float:
    """A request shape's own dominant share: how large it is, as the pool measures it."""
    return dominant_of_pairs(shape.pairs, inverse)


def share_after(share: float, allocation: list[int], pairs: tuple[tuple[int, int], ...],
                inverse: list[float]) -> float:
    """The dominant share of `allocation` plus `pairs`, given `share`, that of `allocation`:
    only the axes taken can rise, so this costs O(len(pairs))."""
    for axis, amount in pairs:
        after = (allocation[axis] + amount) * inverse[axis]
        if after > share:
            share = after
    return share


def cost_after(share: float, allocation: list[int], pairs: tuple[tuple[int, int], ...],
               inverse: list[float], priority_factor: float) -> float:
    """`cost(share_after(...))` in one call: the round ranks every queue by it, per unit."""
    for axis, amount in pairs:
        after = (allocation[axis] + amount) * inverse[axis]
        if after > share:
            share = after
    return share * priority_factor


def cost(share: float, priority_factor: float) -> float:
    """A queue's cost: its share divided by its weight (weight = 1 / priority factor)."""
    return share * priority_factor


def dominant_of_pairs(pairs: tuple[tuple[int, int], ...], inverse: list[float]) -> float:
    """`dominant_of` for a shape's (axis, amount) pairs."""
    return max((amount * inverse[axis] for axis, amount in pairs), default=0.0)


def fraction(share: float, target: float) -> float:
    """A share as a fraction of a target: how far towards it (infinite without one)."""
    return share / target if target > 0 else float("inf")


def below_target(share: float, target: float) -> bool:
    """Whether a share is short of its target (pods are whole: a queue below its target may
    take its next pod even if that pod carries it past the target, by less than the pod).
    Nothing is below no target; `not below_target` is "at or above it"."""
    return target > 0 and share < target * (1 - SHARE_SLACK) - _SHARE_FLOOR


def within_target(share: float, target: float) -> bool:
    """Whether a share is at most its target; `not within_target` is "above it"."""
    return share <= target * (1 + SHARE_SLACK) + _SHARE_FLOOR


def cost_below(cost: float, other: float) -> bool:
    """Whether one cost (or share) is below another by more than float rounding
    (`below_target`, with `other` for the target)."""
    return below_target(cost, other)


def owed(*, before: float, target: float, overall_before: float) -> bool:
    """Whether the round owes a queue room in a cluster: it holds less than its target there
    (`before` < `target`) and its whole allocation is short of its whole target
    (`overall_before`, their `fraction`, below 1)."""
    return below_target(before, target) and overall_before < 1 - SHARE_SLACK


# ---- history: decayed usage (lockgate.decayed_usage; docs/scheduling.md, "Usage that decays") --

# The history factor never falls below this: a sibling that used everything keeps a weight (it
# still gets what the others leave), and weights stay far from float underflow.
HISTORY_FACTOR_FLOOR = 2.0 ** -20


def effective_weight(*, weight: float, usage_fraction: float, share_fraction: float) -> float:
    """The one rule for how history weighs: Slurm's classic fair-share factor applied to a
    node's weight among its siblings, weight x 2^(-usage / share), where `usage_fraction` is
    the node's part of its siblings' decayed usage (all together 1; 0 when none used any) and
    `share_fraction` its part of their weights. A node that used exactly its share keeps
    2^-1 of its weight, as do siblings that all did so: their split is unchanged; one that used
    more than its share falls, one that used nothing keeps all. (Floored at
    `HISTORY_FACTOR_FLOOR`.)"""
    if not share_fraction > 0:
        raise ValueError(f"a node's share among its siblings must be positive, "
                         f"got {share_fraction}")
    factor: float = 2.0 ** -(max(0.0, usage_fraction) / share_fraction)
    return weight * max(HISTORY_FACTOR_FLOOR, factor)


def history_weights(tree: QueueTree, usage: Mapping[str, float]) -> dict[str, float]:
    """Every node's effective weight (`effective_weight`) from every node's decayed usage
    (`DecayedUsage.of_tree`), sibling set by sibling set: what the fair targets divide by
    when history is on (`tree.with_weights(...)`)."""
    weights: dict[str, float] = {}
    for parent in (None, *tree.names):
        kids = tree.children(parent)
        if not kids:
            continue
        used = sum(usage.get(kid, 0.0) for kid in kids)
        total = sum(tree.node(kid).weight for kid in kids)
        for kid in kids:
            weight = tree.node(kid).weight
            weights[kid] = effective_weight(
                weight=weight,
                usage_fraction=usage.get(kid, 0.0) / used if used > 0 else 0.0,
                share_fraction=weight / total)
    return weights
