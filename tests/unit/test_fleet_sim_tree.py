"""Scenario (e) in the fleet simulator (devstack.fleet_sim): (a)'s queues as the leaves of a
three-level tree with guarantees and usage that decays, judged against the independent
hierarchical model (devstack.fair_model.hierarchical_allocation) with weights from the judge's
own decayed usage. What its figures count and that its judge can fail; not how fast."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devstack.fair_model import (
    Cluster,
    DecayedUsageModel,
    TreeQueue,
    history_effective_weights,
)
from devstack.fleet_sim import (
    Scenario,
    ScenarioError,
    _Fleet,
    _tree_judgement,
    _TreeRun,
    simulate,
)
from lockgate.queue_tree import QueueTree, TreeNode
from lockgate.scheduler.costs import history_weights

SCENARIOS = Path(__file__).resolve().parents[2] / "bench" / "scenarios"
TREE: dict[str, Any] = {"divisions": 2, "teams_per_division": 2, "division_weights": [1, 2],
                        "team_weights": [1, 2], "guaranteed_teams": 0.25,
                        "guarantee_times_share": 2, "idle_until": 0.25,
                        "burst_times_guarantee": 1.5, "preempt_for_seconds": 600}


def small_tree(**changes: Any) -> dict[str, Any]:
    """Two clusters of 4 x 8 cpu, eight leaves under four teams under two divisions, one team
    guaranteed half the fleet and idle for the first 10 minutes (evictions planned for 10
    minutes from then); demand well above capacity, usage decaying with a 10-minute
    half-life."""
    scenario: dict[str, Any] = {
        "name": "small_e", "clusters": {"count": 2, "nodes": 4, "cpu": 8, "memory_gi": 32},
        "queues": {"count": 8, "weights": [1, 2]}, "clusters_per_queue": 2,
        "shapes": [{"cpu": 1, "memory_gi": 2}],
        "jobs": 1000, "duration_seconds": 2400, "arrival_fraction": 1.0,
        "arrivals_by_weight": True, "runtime_seconds": [300, 600], "round_seconds": 10,
        "sample_seconds": 300, "preemption": True, "tree": TREE,
        "history": {"half_life_seconds": 600, "recompute_seconds": 30, "tolerance": 0.05},
        "targets": {"deviation_pods_max": 1, "round_p99_ms": 250},
    }
    scenario.update(changes)
    return scenario


def test_the_shipped_scenario_is_a_three_level_tree_of_a_thousand_leaves_over_a_fleet() -> None:
    e = Scenario.load(SCENARIOS / "e_fleet_tree.yaml")
    a = Scenario.load(SCENARIOS / "a_fleet_day.yaml")
    assert e.tree is not None and e.history is not None and e.preemption
    assert e.history.half_life_seconds > 0
    assert e.targets.round_p99_ms == a.targets.round_p99_ms  # (a)'s target
    assert e.targets.deviation_pods_max == 1
    full = replace(e.scaled(1.0), jobs=10)  # the fleet and tree, not 2M arrivals
    fleet = _Fleet(full, random.Random(17))
    levels = [fleet.level[node.name] for node in fleet.tree]
    assert (levels.count("division"), levels.count("team"), levels.count("leaf")) == (
        10, 100, 1000)
    # Three levels: every leaf hangs from a team, every team from a division, which is a
    # child of the root.
    for leaf in fleet.weights:
        team, division = fleet.ancestors(leaf)
        assert (fleet.level[team], fleet.level[division]) == ("team", "division")
    assert 1 <= len(fleet.guarantees) <= 100
    # At its default scale it is (a)'s fleet: the same queues, weights, pinning and shapes
    # for a seed, and the tree over them is three levels still.
    e_small, a_small = e.scaled(e.scale), a.scaled(a.scale)
    fleet_e, fleet_a = _Fleet(e_small, random.Random(17)), _Fleet(a_small, random.Random(17))
    assert (fleet_e.weights, fleet_e.pinned, fleet_e.shape, fleet_e.arrivals) == (
        fleet_a.weights, fleet_a.pinned, fleet_a.shape, fleet_a.arrivals)
    assert {len(fleet_e.ancestors(leaf)) for leaf in fleet_e.weights} == {2}


@pytest.mark.parametrize("change, message", [
    ({"history": {"recompute_seconds": 60}}, "half_life_seconds"),
    ({"history": {"half_life_seconds": 0}}, "positive"),
    ({"tree": {**TREE, "guaranteed_teams": 1.0, "guarantee_times_share": 2}},
     "at most the fleet"),
    ({"tree": {"divisions": 2}}, "teams_per_division"),
    ({"tree": {**TREE, "team_weights": [0]}}, "weights positive"),
])
def test_bad_trees_and_histories_are_refused_with_a_reason(change: dict[str, Any],
                                                           message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_mapping(small_tree(**change))


def test_the_judges_history_rule_is_the_documented_one_written_apart() -> None:
    """The judge's rule (fair_model) against the scheduler's (costs.history_weights) on one
    tree and one usage: the same weights from two codes."""
    nodes = [TreeQueue("research", None, 3), TreeQueue("production", None, 2),
             TreeQueue("vision", "research", 1), TreeQueue("nlp", "research", 1),
             TreeQueue("alice", "vision", 1), TreeQueue("bob", "vision", 2)]
    usage = DecayedUsageModel(half_life_seconds=3600, at=0.0)
    usage.advance(now=1800.0, shares={"alice": 0.5, "bob": 0.1, "production": 0.2})
    usage.advance(now=5400.0, shares={"nlp": 0.3})
    by_node = usage.of_tree(nodes)
    assert by_node["research"] == pytest.approx(by_node["alice"] + by_node["bob"]
                                                + by_node["nlp"])
    mine = history_effective_weights(nodes, by_node)
    tree = QueueTree.build([TreeNode(n.name, n.parent, n.weight) for n in nodes])
    theirs = history_weights(tree, by_node)
    assert mine == pytest.approx(theirs, rel=1e-12)
    assert mine["alice"] < mine["bob"]  # alice used far more than her share of vision


def test_a_small_tree_runs_judged_per_level_with_its_guarantee_reclaimed() -> None:
    scenario = Scenario.from_mapping(small_tree())
    report = simulate(scenario)
    summary = report.summary()
    tree = report.tree
    assert tree is not None
    assert summary["tree_nodes"] == {"division": 2, "team": 4, "leaf": 8}
    # The idle team sent nothing before its burst, then its burst came past its guarantee.
    assert summary["reclaim_burst_at_seconds"] == 600
    assert summary["reclaim_burst_pods"] * min(tree.unit.values()) >= 1.5 * 0.5 - 1e-9
    # Its guarantee (half the fleet) is reclaimed by preemption, and the time is measured.
    assert summary["reclaim_goal_share"] is not None and summary["reclaim_goal_share"] > 0
    assert summary["guarantee_reclaim_seconds"] is not None
    assert 0 <= summary["guarantee_reclaim_seconds"] <= 600
    assert summary["evictions"] > 0
    # History was kept on the simulated clock: the leader's usage is at the last round's
    # simulated time, and its weights in force are the judge's, computed apart.
    assert tree.history is not None and tree.judge_usage is not None
    assert tree.history.usage.at == tree.judge_usage.at
    assert summary["history_weight_changes"] > 1
    assert tree.judge_weights == pytest.approx(dict(tree.history.weights_in_force), rel=1e-6)
    # Every level is judged at the settled samples.
    levels = summary["deviation_by_level_every_node_pods"]
    assert all(levels[level] is not None for level in ("leaf", "team", "division")), summary
    assert summary["settled_samples"] > 0 and summary["deviation_pods_max"] is not None


def test_the_judge_catches_an_allocation_that_is_not_the_fair_one() -> None:
    """At one saturated moment: what the model gives each leaf is judged near zero; the same
    pods moved from one team to another are judged off by what was moved, at the leaf, the
    team and the division."""
    scenario = Scenario.from_mapping(small_tree(history=None))
    fleet = _Fleet(scenario, random.Random(17))
    tree_run = _TreeRun(scenario, fleet)
    clusters = [Cluster.of(c, fleet.fixed_capacity(c)) for c in fleet.clusters]
    demand = {(leaf, cluster): 100 for leaf in fleet.weights for cluster in fleet.pinned[leaf]}
    shares = tree_run.model(demand, clusters)
    fair = {leaf: round(shares[leaf] / tree_run.unit[leaf]) for leaf in fleet.weights}
    levels: dict[str, dict[str, float]] = {}
    _tree_judgement(tree_run, demand, clusters, fair, levels)
    assert max(abs(d) for nodes in levels.values() for d in nodes.values()) <= 1.0, levels
    # Move 6 pods from a leaf of one division to a leaf of the other.
    giver = next(leaf for leaf in fleet.weights if fair[leaf] >= 6)
    taker = next(leaf for leaf in fleet.weights
                 if fleet.ancestors(leaf)[-1] != fleet.ancestors(giver)[-1])
    wrong = {**fair, giver: fair[giver] - 6, taker: fair[taker] + 6}
    levels = {}
    _tree_judgement(tree_run, demand, clusters, wrong, levels)
    assert levels["leaf"][giver] == pytest.approx(-6, abs=1.0)
    assert levels["leaf"][taker] == pytest.approx(6, abs=1.0)
    assert levels["team"][fleet.parent[giver]] <= -5
    assert levels["division"][fleet.ancestors(taker)[-1]] >= 5


def test_decay_changes_what_the_judge_calls_fair() -> None:
    """A leaf that used far more than its sibling is given less by the judge's model once
    history weighs (so judging with configured weights would be judging the wrong thing)."""
    scenario = Scenario.from_mapping(small_tree())
    fleet = _Fleet(scenario, random.Random(17))
    tree_run = _TreeRun(scenario, fleet)
    clusters = [Cluster.of(c, fleet.fixed_capacity(c)) for c in fleet.clusters]
    demand = {(leaf, cluster): 100 for leaf in fleet.weights for cluster in fleet.pinned[leaf]}
    before = tree_run.model(demand, clusters)
    heavy = sorted(fleet.weights)[1]
    tree_run.ran(heavy, 30)
    tree_run.judge_history(0.0)
    tree_run.judge_history(3600.0)
    after = tree_run.model(demand, clusters)
    assert after[heavy] < before[heavy] - 1e-3
