"""The fair scheduler's growth settings (LOCKGATE_SCHEDULER_GROWTH_*) become one GrowthPolicy."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from fair_scheduler.settings import SchedulerSettings


def test_growth_settings_from_the_environment_make_the_policy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_SCHEDULER_GROWTH_CLUSTER_CAPS",
                       json.dumps({"cluster-b": {"cpu": "256", "memory": "1Ti"}}))
    monkeypatch.setenv("LOCKGATE_SCHEDULER_GROWTH_INSTANCE_SHAPES",
                       json.dumps({"cluster-b/default": {"cpu": "8", "memory": "32Gi"}}))
    monkeypatch.setenv("LOCKGATE_SCHEDULER_GROWTH_NODE_OVERHEAD", json.dumps({"cpu": "100m"}))
    monkeypatch.setenv("LOCKGATE_SCHEDULER_GROWTH_STALL_AFTER_SECONDS", "5m")
    monkeypatch.setenv("LOCKGATE_SCHEDULER_GROWTH_GATHER_SECONDS", "20")
    monkeypatch.setenv("LOCKGATE_SCHEDULER_GROWTH_NODE_GROUPS", json.dumps([{
        "cluster": "cluster-x", "name": "batch", "max_size": 20,
        "node_allocatable": {"cpu": "8", "memory": "32Gi"},
        "node_labels": {"eks.amazonaws.com/nodegroup": "batch"}}]))
    policy = SchedulerSettings().growth_policy()
    assert policy.cluster_caps == {"cluster-b": {"cpu": 256_000, "memory": 2**40}}
    assert policy.shape_for("cluster-b", "default") == {"cpu": 8000, "memory": 32 * 2**30}
    assert policy.shape_for("cluster-x", "batch") == {"cpu": 8000, "memory": 32 * 2**30}
    assert policy.node_overhead == {"cpu": 100}
    assert policy.stall_after_seconds == 300
    assert policy.gather_seconds == 20
    assert [group.name for group in policy.node_groups] == ["batch"]


def test_the_default_policy_grows_only_what_an_autoscaler_publishes() -> None:
    policy = SchedulerSettings().growth_policy()
    assert policy.cluster_caps == {} and policy.node_groups == ()
    assert policy.gather_seconds == 12  # gathered into a node's worth by default


@pytest.mark.parametrize(("name", "value", "words"), [
    ("GROWTH_CLUSTER_CAPS", {"cluster-b": {"cpu": "lots"}}, "growth_cluster_caps"),
    ("GROWTH_NODE_OVERHEAD", {"cpu": "-1"}, "negative"),
    ("GROWTH_GATHER_SECONDS", -1, "growth_gather_seconds"),
    ("GROWTH_NODE_GROUPS", [{"cluster": "x", "name": "g", "max_size": 1,
                             "node_allocatable": {"cpu": "1"}, "node_labels": {"a": "b"}}] * 2,
     "given twice"),
])
def test_a_wrong_growth_setting_stops_the_scheduler_with_a_reason(
        monkeypatch: pytest.MonkeyPatch, name: str, value: object, words: str) -> None:
    monkeypatch.setenv(f"LOCKGATE_SCHEDULER_{name}", json.dumps(value))
    with pytest.raises(ValidationError, match=words):
        SchedulerSettings()
