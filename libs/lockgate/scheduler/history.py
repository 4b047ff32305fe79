"""The leader's bookkeeping of usage that decays (issue 36 item 3): what it advances each round,
when it recomputes the history weights, what it stores, what it says.

Why it exists: `DecayedUsage` keeps the numbers and `costs.history_weights` is the one rule;
the leader needs more around them, and all of it is policy, so it lives here without I/O:

- *When weights move.* The fair targets, and with them preemption's goal, depend on the
  weights. Recomputed every round, they would drift a little every round, and preemption could
  chase a target that moved since it evicted. So the weights in force change only on a period
  (`recompute_seconds`), and even then only when some node's weight moved by more than a
  relative `tolerance`: between two changes the targets stand still, as "Why it cannot thrash"
  under Preemption needs (docs/scheduling.md, "Usage that decays").
- *What it says.* Per node: its decayed usage, its part of its siblings' usage and of their
  weights, the factor the rule gave it and its effective weight (`NodeHistory`); and, for a node
  history ranks below a sibling, the words explain uses ("ranked below its sibling bob: used
  2.3x its share over the last half-life").
- *Rebuilding.* If the stored usage is lost (or was kept with another half-life), it is
  rebuilt from what ran when (`rebuild_usage`): each run's dominant share over its interval,
  integrated exactly with decay.

Pure: no I/O, no clock (the caller passes the time).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lockgate.decayed_usage import DecayedUsage, HistoryPolicyError
from lockgate.queue_tree import QueueTree
from lockgate.scheduler.costs import cost_below, history_weights


@dataclass(frozen=True, slots=True)
class NodeHistory:
    """How history weighs on one node of the tree, as the weights in force say."""

    name: str
    usage: float  # decayed usage now, share x seconds
    usage_fraction: float  # its part of its siblings' usage when the weights were computed
    share_fraction: float  # its part of its siblings' weights
    weight: float  # as configured
    effective_weight: float  # in force: weight x 2^(-usage_fraction / share_fraction)

    @property
    def factor(self) -> float:
        return self.effective_weight / self.weight if self.weight > 0 else 1.0

    @property
    def times_its_share(self) -> float:
        """How many times its share of its siblings' usage it used (1: exactly its share)."""
        return self.usage_fraction / self.share_fraction if self.share_fraction > 0 else 0.0


@dataclass(frozen=True, slots=True)
class HistoryReport:
    """What the leader says of usage history after a round (status, explain, the web UI)."""

    half_life_seconds: float
    recompute_seconds: float
    usage_at: float  # when the usage was last brought up to date
    recomputed_at: float | None  # when the weights in force were computed (None: never yet)
    nodes: Mapping[str, NodeHistory]  # every node of the tree, by name
    words: Mapping[str, str]  # per leaf, how history holds it back ("": it does not)
    tree: QueueTree | None = None  # the tree it was made for


def history_json(report: HistoryReport) -> dict[str, object]:
    """The report as the leader's status JSON carries it."""
    return {
        "half_life_seconds": report.half_life_seconds,
        "recompute_seconds": report.recompute_seconds,
        "usage_at": report.usage_at, "recomputed_at": report.recomputed_at,
        "nodes": {name: {"decayed_usage": node.usage, "usage_fraction": node.usage_fraction,
                         "share_fraction": node.share_fraction, "weight": node.weight,
                         "effective_weight": node.effective_weight,
                         "factor": node.factor, "times_its_share": node.times_its_share,
                         "held_back": report.words.get(name, "")}
                  for name, node in sorted(report.nodes.items())}}


@dataclass(frozen=True, slots=True)
class RunInterval:
    """One pod's run as the records keep it, for `rebuild_usage`: its leaf, its dominant share
    of the pool, and from when to when it held it (`until` None: it still does)."""

    leaf: str
    share: float
    since: float
    until: float | None


class UsageHistory:
    """Decayed usage per node, the history weights in force, and when to recompute them."""

    __slots__ = ("_basis", "_in_force", "_next_recompute", "_recompute", "_recomputed_at",
                 "_tolerance", "_usage")

    def __init__(self, *, half_life_seconds: float, recompute_seconds: float,
                 tolerance: float, at: float,
                 restored: Mapping[str, float] | None = None) -> None:
        """`restored`: each leaf's usage as stored at `at` (after a failover) or rebuilt."""
        if not (recompute_seconds > 0 and math.isfinite(recompute_seconds)):
            raise HistoryPolicyError(
                f"history weights must be recomputed on a positive period, "
                f"got {recompute_seconds}s")
        if not (0 <= tolerance < 1):
            raise HistoryPolicyError(
                f"the history weights' tolerance is a fraction in [0, 1), got {tolerance}")
        self._usage = DecayedUsage(half_life_seconds=half_life_seconds, at=at, restored=restored)
        self._recompute = recompute_seconds
        self._tolerance = tolerance
        self._next_recompute = -math.inf  # the first call computes them
        self._in_force: dict[str, float] = {}
        # Every node's usage when the weights in force were computed (what their words cite).
        self._basis: dict[str, float] = {}
        self._recomputed_at: float | None = None

    @property
    def usage(self) -> DecayedUsage:
        return self._usage

    @property
    def half_life_seconds(self) -> float:
        return self._usage.half_life_seconds

    @property
    def weights_in_force(self) -> Mapping[str, float]:
        """Every node's effective weight now used by the fair targets (empty before the first
        recomputation)."""
        return self._in_force

    def observe(self, *, now: float, shares: Mapping[str, float]) -> None:
        """What each leaf has held since the last call (its dominant share of the pool)."""
        self._usage.advance(now=now, shares=shares)

    def due(self, now: float) -> bool:
        return now >= self._next_recompute

    def recompute(self, tree: QueueTree, *, now: float, force: bool = False) -> bool:
        """When due (or `force`d): the rule's weights from the usage now; they replace the
        weights in force only if the tree's nodes changed or some node's weight moved by more
        than the tolerance (relative). Returns whether the weights in force changed."""
        if not force and not self.due(now):
            return False
        self._next_recompute = now + self._recompute
        usage = self._usage.of_tree(tree)
        weights = history_weights(tree, usage)
        if not force and not self._moved(weights):
            return False
        self._in_force = weights
        self._basis = usage
        self._recomputed_at = now
        return True

    def _moved(self, weights: Mapping[str, float]) -> bool:
        old = self._in_force
        if old.keys() != weights.keys():
            return True
        return any(abs(weights[name] - old[name]) > self._tolerance * old[name]
                   for name in weights)

    def standings(self, tree: QueueTree) -> dict[str, NodeHistory]:
        """Every node's `NodeHistory`: its usage now, and the fractions behind the weights in
        force (a node new since they were computed has its configured weight)."""
        now_usage = self._usage.of_tree(tree)
        standings: dict[str, NodeHistory] = {}
        for parent in (None, *tree.names):
            kids = tree.children(parent)
            if not kids:
                continue
            used = sum(self._basis.get(kid, 0.0) for kid in kids)
            total = sum(tree.node(kid).weight for kid in kids)
            for kid in kids:
                weight = tree.node(kid).weight
                standings[kid] = NodeHistory(
                    name=kid, usage=now_usage.get(kid, 0.0),
                    usage_fraction=self._basis.get(kid, 0.0) / used if used > 0 else 0.0,
                    share_fraction=weight / total, weight=weight,
                    effective_weight=self._in_force.get(kid, weight))
        return standings

    def leaves(self) -> dict[str, float]:
        """Every leaf's usage (what to store durably), as of `usage.at`."""
        return self._usage.leaves()

    def report(self, tree: QueueTree) -> HistoryReport:
        nodes = self.standings(tree)
        leaders = sibling_leaders(tree, nodes)
        return HistoryReport(
            half_life_seconds=self.half_life_seconds, recompute_seconds=self._recompute,
            usage_at=self._usage.at, recomputed_at=self._recomputed_at, nodes=nodes,
            words={leaf: held_back_words(tree, nodes, leaf, leaders=leaders)
                   for leaf in tree.leaves}, tree=tree)


def held_back_words(tree: QueueTree, standings: Mapping[str, NodeHistory], leaf: str, *,
                    leaders: Mapping[str | None, list[NodeHistory]] | None = None) -> str:
    """Why history holds `leaf` back, in the words explain uses, at the lowest level where its
    factor is below a sibling's: "ranked below its sibling bob: alice used 2.3x its share over
    the last half-life (...)". "" when history ranks it below no sibling at any level.
    `leaders`: `sibling_leaders(tree, standings)`, computed once for many leaves."""
    if leaf not in tree:
        return ""
    if leaders is None:
        leaders = sibling_leaders(tree, standings)
    for node in (leaf, *tree.ancestors(leaf)):
        mine = standings.get(node)
        if mine is None:
            continue
        best = next((s for s in leaders.get(tree.parent(node), []) if s.name != node), None)
        if best is None or not cost_below(mine.factor, best.factor):
            continue
        who = "its sibling" if node == leaf else f"{node}'s sibling"
        return (f"ranked below {who} {best.name}: {node} used "
                f"{mine.times_its_share:.1f}x its share over the last half-life "
                f"(weight {mine.weight:g} counts as {mine.effective_weight:.3g}, "
                f"{best.name}'s {best.weight:g} as {best.effective_weight:.3g})")
    return ""


def sibling_leaders(tree: QueueTree, standings: Mapping[str, NodeHistory],
                    ) -> dict[str | None, list[NodeHistory]]:
    """Per parent (None: the root), its two children history favours most (highest factor,
    then name): the one a node is ranked below is the first that is not itself. O(nodes), so
    the words for every leaf cost O(nodes x depth), not O(siblings^2)."""
    leaders: dict[str | None, list[NodeHistory]] = {}
    for parent in (None, *tree.names):
        kids = [standings[kid] for kid in tree.children(parent) if kid in standings]
        if kids:
            leaders[parent] = sorted(kids, key=lambda s: (-s.factor, s.name))[:2]
    return leaders


def rebuild_usage(runs: Iterable[RunInterval], *, half_life_seconds: float,
                  now: float) -> dict[str, float]:
    """Each leaf's decayed usage at `now` from the runs the records keep: a run holding share
    s from t0 to t1 adds s x (e^(-r(now-t1)) - e^(-r(now-t0))) / r, r = ln 2 / half-life (the
    same integral `DecayedUsage.advance` adds, so a rebuild of faithful records equals the kept
    usage). Runs that ended before `now` by many half-lives add nothing measurable."""
    DecayedUsage(half_life_seconds=half_life_seconds, at=now)  # validates the half-life
    rate = math.log(2) / half_life_seconds
    usage: dict[str, float] = {}
    for run in runs:
        if not (run.share >= 0 and math.isfinite(run.share)):
            raise ValueError(f"a run of {run.leaf!r} has share {run.share}")
        until = now if run.until is None else min(run.until, now)
        since = min(run.since, until)
        if run.share == 0 or until <= since:
            continue
        gained = run.share * (math.exp(-rate * (now - until))
                              - math.exp(-rate * (now - since))) / rate
        usage[run.leaf] = usage.get(run.leaf, 0.0) + gained
    return usage
