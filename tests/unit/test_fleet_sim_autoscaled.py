"""Scenario (d) in the fleet simulator (devstack.fleet_sim with devstack.sim_autoscaler): a
small fleet with one autoscaled cluster, and the mechanics of its figures and verdicts (what
they count and how they are judged, not how fast)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devstack.fleet_sim import (
    Report,
    Scenario,
    ScenarioError,
    Targets,
    _Fleet,
    plot,
    simulate,
)

SCENARIOS = Path(__file__).resolve().parents[2] / "bench" / "scenarios"
AUTOSCALING: dict[str, Any] = {
    "fraction": 0.5, "fixed_nodes": 1,
    "node_pool": {
        "limits": {"cpu": 32, "memory_gi": 128},
        "instance_types": [{"name": "m-4x", "cpu": 4, "memory_gi": 16},
                           {"name": "m-16x", "cpu": 16, "memory_gi": 64}],
        "provisioning_seconds": [5, 60], "consolidate_after_seconds": 30}}


def small_autoscaled(**changes: Any) -> dict[str, Any]:
    """Two clusters of 4 x 8 cpu, the second autoscaled from one of those nodes under a pool
    of at most 32 cpu; three queues; demand well above what both can hold."""
    scenario: dict[str, Any] = {
        "name": "small_d", "clusters": {"count": 2, "nodes": 4, "cpu": 8, "memory_gi": 32},
        "queues": {"count": 3, "weights": [1, 2]}, "clusters_per_queue": 2,
        "shapes": [{"cpu": 1, "memory_gi": 2}],
        "jobs": 300, "duration_seconds": 3600, "arrival_fraction": 0.1,
        "runtime_seconds": [300, 600], "round_seconds": 10, "sample_seconds": 120,
        "autoscaling": AUTOSCALING,
        "targets": {"deviation_pods_max": 1, "nodes_provisioned_ratio_max": 1.1},
    }
    scenario.update(changes)
    return scenario


def test_a_small_autoscaled_fleet_grows_and_its_figures_count_what_they_say(
        tmp_path: Path) -> None:
    report = simulate(Scenario.from_mapping(small_autoscaled()))
    summary = report.summary()
    ((name, side),) = report.autoscaled.items()
    assert name == "c001" and summary["autoscaled_clusters"] == 1
    assert summary["nodes"] == 4 + 1  # at the start: the fixed cluster's, the pool's fixed one
    assert summary["pool_limit_nodes"] == 2  # 32 cpu in 16-cpu instances
    # The cluster grew for the pods released for growth (issue 35's bug: it never did).
    assert summary["released_unschedulable"] > 0 and side.created > 0, summary
    assert summary["nodes_provisioned"] == side.created
    assert summary["nodes_consolidated"] == side.consolidated
    # The fewest: the most pool nodes any sample's fair split needed beyond the fixed node.
    fewest = max(s.fewest_nodes.get(name, 0) for s in report.samples)
    assert summary["nodes_fewest"] == fewest > 0, summary
    assert summary["nodes_provisioned_ratio"] == round(side.created / fewest, 3)
    assert summary["pool_nodes_peak"] == max(s.pool_nodes[name] for s in report.samples)
    assert summary["pool_nodes_peak"] <= 32 // 4  # never more than the limits hold
    for sample in report.samples:
        # Utilisation is over existing capacity plus headroom: never above one.
        assert all(0.0 <= u <= 1.0 for u in sample.utilisation.values()), sample
        assert sample.fewest_nodes.get(name, 0) <= 2  # the fair split fits under the limits
    # Judged at scale 1 (this scenario's): the ratio's verdict says what its value is.
    ratio = summary["nodes_provisioned_ratio"]
    verdict = summary["verdicts"]["nodes_provisioned_ratio_max"]
    assert verdict.startswith("met" if 1.0 <= ratio <= 1.1 else "MISSED"), (ratio, verdict)
    assert str(ratio) in verdict
    assert summary["verdicts"]["deviation_pods_max"].split(":")[0] in ("met", "MISSED")
    assert plot(report, tmp_path).stat().st_size > 10_000  # with the pool's nodes, a third panel


def test_the_nodes_verdict_is_judged_from_both_sides() -> None:
    scenario = Scenario.from_mapping(small_autoscaled())
    report = Report(scenario=scenario)
    base = {"round_ms_p99": 1.0, "contested_utilisation_min": 1.0, "deviation_pods_max": 0.5}

    def verdict(ratio: float | None) -> str:
        return report.verdicts({**base, "nodes_provisioned_ratio": ratio})[
            "nodes_provisioned_ratio_max"]

    # Fewer nodes than the fair allocation needs: some cluster never reached its part.
    assert verdict(0.5).startswith("MISSED")
    assert verdict(1.0).startswith("met") and verdict(1.1).startswith("met")
    assert verdict(1.25).startswith("MISSED")
    assert verdict(None) == "not judged: no autoscaled cluster needed a node"
    scaled = Report(scenario=replace(scenario, scale=0.5))
    assert scaled.verdicts({**base, "nodes_provisioned_ratio": 3.0})[
        "nodes_provisioned_ratio_max"].startswith("not judged: the target holds at scale 1")
    # A scenario without the target has no such verdict; one without autoscaling, no figures.
    plain = Report(scenario=replace(scenario, targets=Targets()))
    assert plain.verdicts({**base, "nodes_provisioned_ratio": 0.5}) == {}


def test_scenario_d_is_scenario_a_with_its_last_half_of_clusters_autoscaled() -> None:
    fleet_a = Scenario.load(SCENARIOS / "a_fleet_day.yaml")
    fleet_d = Scenario.load(SCENARIOS / "d_fleet_day_autoscaled.yaml")
    assert fleet_d.autoscaling is not None and fleet_a.autoscaling is None
    assert replace(fleet_d, name=fleet_a.name, autoscaling=None, targets=fleet_a.targets) == \
        fleet_a
    a, d = (_Fleet(s.scaled(0.05), random.Random(17)) for s in (fleet_a, fleet_d))
    # The same queues, weights, pinning, shapes and arrivals.
    assert (a.weights, a.pinned, a.shape, a.arrivals) == (d.weights, d.pinned, d.shape,
                                                          d.arrivals)
    assert a.autoscaled == [] and d.autoscaled == d.clusters[len(d.clusters) // 2:]
    assert [d.node_count(c) for c in d.autoscaled] == [2] * len(d.autoscaled)
    # Limits shrink with the nodes (square root of the scale), in whole 16-cpu instances.
    full = fleet_d.scaled(1.0).node_pool()
    tiny = fleet_d.scaled(0.01).node_pool()
    assert full is not None and tiny is not None
    assert (full.limits["cpu"], tiny.limits["cpu"]) == (4800 * 1000, 480 * 1000)


@pytest.mark.parametrize("change, message", [
    ({"fraction": 0}, "fraction"),
    ({"node_pool": {"instance_types": []}}, "limits"),
    ({"node_pool": {"limits": {"cpu": 8, "memory_gi": 8}, "instance_types": []}},
     "at least one instance type"),
    ({"node_pool": {**AUTOSCALING["node_pool"], "provisioning_seconds": [9, 1]}},
     "provisioning_seconds"),
    ({"fixed_nodes": -1}, "not negative"),
])
def test_bad_autoscaling_is_refused_with_a_reason(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_mapping(small_autoscaled(autoscaling={**AUTOSCALING, **change}))


def test_pods_that_avoid_smaller_types_make_the_nodes_lockgate_counted() -> None:
    # The pool's headroom is two 16-cpu instances. Released as they come, a few 1-cpu pods at a
    # time, the pods make 4-cpu nodes (Karpenter launches the cheapest type that holds a
    # batch); with the node affinity lockgate asks for (`GrowthNote.avoid`), 16-cpu ones.
    def run(steer: bool) -> Report:
        return simulate(Scenario.from_mapping(small_autoscaled(autoscaling={
            **AUTOSCALING, "steer_instance_size": steer, "gather_seconds": 0})))

    plain, steered = run(False), run(True)
    ((_, plain_side),) = plain.autoscaled.items()
    ((_, steered_side),) = steered.autoscaled.items()
    assert plain_side.created_by_type.get("m-4x", 0) > 0, plain_side.created_by_type
    assert set(steered_side.created_by_type) == {"m-16x"}, steered_side.created_by_type
    summary = steered.summary()
    assert summary["nodes_provisioned_by_type"] == {"m-16x": steered_side.created}
    assert 1.0 <= summary["nodes_provisioned_ratio"] < plain.summary()["nodes_provisioned_ratio"]
    # Every pod released for growth waited: from its first round owed a node to its binding.
    assert len(steered.growth_waits) > 0 and min(steered.growth_waits) >= 0
    assert summary["growth_wait_seconds_p99"] >= summary["growth_wait_seconds_p50"] > 0
    # The scenario's keys are read (and a wrong one refused).
    scenario = Scenario.from_mapping(small_autoscaled(autoscaling={
        **AUTOSCALING, "steer_instance_size": True, "gather_seconds": 0}))
    assert scenario.autoscaling is not None
    assert (scenario.autoscaling.steer_instance_size, scenario.autoscaling.gather_seconds) == (
        True, 0.0)
    with pytest.raises(ScenarioError, match="gather_seconds"):
        Scenario.from_mapping(small_autoscaled(autoscaling={**AUTOSCALING,
                                                            "gather_seconds": -1}))


def test_scenario_d_sized_is_scenario_d_with_its_pods_sized_at_the_leaders_defaults() -> None:
    fleet_d = Scenario.load(SCENARIOS / "d_fleet_day_autoscaled.yaml")
    sized = Scenario.load(SCENARIOS / "d_fleet_day_autoscaled_sized.yaml")
    assert fleet_d.autoscaling is not None and sized.autoscaling is not None
    assert not fleet_d.autoscaling.steer_instance_size
    # Both at the leader's default gathering: the sized one models the product.
    assert fleet_d.autoscaling.gather_seconds is None and sized.autoscaling.gather_seconds is None
    assert sized.autoscaling.steer_instance_size
    assert replace(sized, name=fleet_d.name, autoscaling=replace(
        sized.autoscaling, steer_instance_size=False)) == fleet_d


def test_with_sized_pods_the_default_gathering_holds_nothing() -> None:
    # A release onto a size the pool names is never held to gather (lockgate.scheduler.round):
    # with the leader's default gathering (12 s) the sized fleet decides exactly as with none.
    def summary(**gathering: float) -> dict[str, Any]:
        return simulate(Scenario.from_mapping(small_autoscaled(autoscaling={
            **AUTOSCALING, "steer_instance_size": True, **gathering}))).summary()

    default, none = summary(), summary(gather_seconds=0)
    assert default["released_unschedulable"] > 0  # it did grow for pods
    assert (default["decisions_digest"], default["skipped_digest"]) == (
        none["decisions_digest"], none["skipped_digest"])
