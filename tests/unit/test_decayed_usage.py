"""Decayed usage and the one history rule (issue 36 item 3): lockgate.decayed_usage keeps
each node's usage, lockgate.scheduler.costs.effective_weight turns it into a weight, and the
hierarchical fair targets move as the rule says. Expected values are worked out here by hand
from the definitions (the integral of a share, each moment weighed by 2^(-age / half-life))."""

from __future__ import annotations

import math
import random

import pytest

from lockgate.decayed_usage import DecayedUsage, HistoryPolicy, HistoryPolicyError
from lockgate.queue_tree import QueueTree, TreeNode
from lockgate.scheduler.costs import HISTORY_FACTOR_FLOOR, effective_weight, history_weights
from lockgate.scheduler.targets import Demand, NodeGroup, hierarchical_fair_targets


def test_history_is_off_by_default_and_on_without_a_half_life_is_an_error() -> None:
    assert HistoryPolicy() == HistoryPolicy(enabled=False, half_life_seconds=None)
    with pytest.raises(HistoryPolicyError, match="no half-life"):
        HistoryPolicy(enabled=True)
    for bad in (0.0, -5.0, math.inf, math.nan):
        with pytest.raises(HistoryPolicyError, match="positive number of seconds"):
            HistoryPolicy(enabled=True, half_life_seconds=bad)
    assert HistoryPolicy(enabled=True, half_life_seconds=120).half_life_seconds == 120


def test_usage_integrates_the_share_and_halves_every_half_life() -> None:
    usage = DecayedUsage(half_life_seconds=120, at=0.0)
    usage.advance(now=300.0, shares={"alice": 1.0})  # held the whole pool for 5 minutes
    rate = math.log(2) / 120
    held = (1 - math.exp(-rate * 300)) / rate  # integral of 2^-(300 - s)/120 ds over [0, 300]
    assert usage.of_leaf("alice") == pytest.approx(held, rel=1e-12)
    usage.advance(now=420.0, shares={})  # one half-life idle
    assert usage.of_leaf("alice") == pytest.approx(held / 2, rel=1e-12)
    assert usage.of_leaf("bob") == 0.0
    with pytest.raises(ValueError, match="back in time"):
        usage.advance(now=400.0, shares={})
    with pytest.raises(ValueError, match="must be >= 0"):
        usage.advance(now=500.0, shares={"alice": -0.1})


def test_many_small_steps_equal_one_large_one() -> None:
    rng = random.Random(7)
    one = DecayedUsage(half_life_seconds=60, at=0.0)
    many = DecayedUsage(half_life_seconds=60, at=0.0)
    one.advance(now=1000.0, shares={"a": 0.25, "b": 0.5})
    now = 0.0
    while now < 1000.0:
        step = min(1000.0 - now, rng.uniform(0.1, 30.0))
        now += step
        many.advance(now=now, shares={"a": 0.25, "b": 0.5})
    for name in ("a", "b"):
        assert many.of_leaf(name) == pytest.approx(one.of_leaf(name), rel=1e-9)


def test_inner_nodes_sum_their_leaves_and_usage_survives_a_restore() -> None:
    tree = QueueTree.build([TreeNode("research"), TreeNode("vision", parent="research"),
                            TreeNode("alice", parent="vision"), TreeNode("bob", parent="vision"),
                            TreeNode("production")])
    usage = DecayedUsage(half_life_seconds=100, at=10.0)
    usage.advance(now=60.0, shares={"alice": 0.5, "bob": 0.25})
    nodes = usage.of_tree(tree)
    assert nodes["vision"] == pytest.approx(nodes["alice"] + nodes["bob"])
    assert nodes["research"] == nodes["vision"] and nodes["production"] == 0.0
    again = DecayedUsage(half_life_seconds=100, at=usage.at, restored=usage.leaves())
    assert again.of_tree(tree) == nodes
    with pytest.raises(HistoryPolicyError, match="must be >= 0"):
        DecayedUsage(half_life_seconds=100, at=0.0, restored={"alice": -1.0})


def test_the_rule_is_slurms_classic_factor_on_the_weight_among_siblings() -> None:
    assert effective_weight(weight=2.0, usage_fraction=0.0, share_fraction=0.5) == 2.0
    assert effective_weight(weight=2.0, usage_fraction=0.5, share_fraction=0.5) == 1.0
    assert effective_weight(weight=1.0, usage_fraction=1.0, share_fraction=0.5) == 0.25
    assert effective_weight(weight=1.0, usage_fraction=1.0, share_fraction=0.01) == (
        HISTORY_FACTOR_FLOOR)
    with pytest.raises(ValueError, match="must be positive"):
        effective_weight(weight=1.0, usage_fraction=0.5, share_fraction=0.0)
    tree = QueueTree.build([TreeNode("a", weight=1), TreeNode("b", weight=3),
                            TreeNode("a1", parent="a"), TreeNode("a2", parent="a")])
    # Siblings that used exactly their shares keep their ratio; a node with no used sibling
    # set (a1, a2 never ran) keeps its weight.
    weights = history_weights(tree, {"a": 1.0, "b": 3.0, "a1": 0.0, "a2": 0.0})
    assert weights["b"] / weights["a"] == pytest.approx(3.0)
    assert weights["a1"] == weights["a2"] == 1.0


def test_a_leaf_that_held_the_cluster_ranks_below_its_idle_sibling() -> None:
    """The issue's second test, in the pure core: half-life 2 minutes, alice held the whole
    cluster for 5 minutes, bob held nothing; both now ask for all of it."""
    tree = QueueTree.build([TreeNode("team", limit={"cpu": 1e9}), TreeNode("alice", parent="team"),
                            TreeNode("bob", parent="team")])
    usage = DecayedUsage(half_life_seconds=120, at=0.0)
    usage.advance(now=300.0, shares={"alice": 1.0})
    weights = history_weights(tree, usage.of_tree(tree))
    # alice used all of team's usage with half of its weight: 2^-(1 / 0.5) = 1/4.
    assert weights["alice"] == pytest.approx(0.25) and weights["bob"] == 1.0
    groups = [NodeGroup("c", "g", {"cpu": 100.0})]
    demands = [Demand("alice", "c", {"cpu": 100.0}), Demand("bob", "c", {"cpu": 100.0})]
    without = hierarchical_fair_targets(tree=tree, groups=groups, demands=demands)
    with_history = hierarchical_fair_targets(tree=tree.with_weights(weights), groups=groups,
                                             demands=demands)
    assert without.queues["alice"].share == pytest.approx(0.5)
    assert with_history.queues["alice"].share == pytest.approx(0.2)  # 0.25 / (0.25 + 1)
    assert with_history.queues["bob"].share == pytest.approx(0.8)
