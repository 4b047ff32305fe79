"""The state keeps each autoscaled cluster's growth picture (`SchedulerState.set_growth`).

A picture is capacity the fair targets are over: a change of what the cluster may grow by must
count as a change of the cluster (its version, which the fair targets' node groups are keyed
by); the same picture again, or an older one, must not.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lockgate.events import ClusterGrowth, NodeClaimStatus, NodePoolStatus
from lockgate.placement import Requirement
from lockgate.resources import Resources
from lockgate.scheduler import NodeInfo, SchedulerState

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def a_picture(cluster: str = "b", *, at: datetime = T0, cpu_limit: int = 64_000) -> ClusterGrowth:
    return ClusterGrowth(cluster=cluster, observed_at=at, autoscaled=True, node_pools=[
        NodePoolStatus(name="default", limits={"cpu": cpu_limit}, in_use={"cpu": 0},
                       requirements=(
                           Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In",
                                       values=("4",)),
                           Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                                       values=("16Gi",))))])


def a_state() -> SchedulerState:
    state = SchedulerState()
    state.set_cluster("b", {"n1": NodeInfo(allocatable=Resources({"cpu": 4000}))})
    return state


def test_a_picture_is_kept_and_counts_as_a_change_of_the_cluster() -> None:
    state = a_state()
    version = state.cluster_records["b"].version
    picture = a_picture()
    state.set_growth("b", picture)
    assert state.growth("b") == picture
    assert state.growth_pictures == {"b": picture}
    assert state.cluster_records["b"].version > version


def test_the_same_picture_again_or_an_older_one_changes_nothing() -> None:
    state = a_state()
    state.set_growth("b", a_picture(cpu_limit=64_000))
    version = state.cluster_records["b"].version
    state.set_growth("b", a_picture(cpu_limit=64_000))
    state.set_growth("b", a_picture(at=T0 - timedelta(seconds=1), cpu_limit=8_000))
    assert state.growth("b") == a_picture(cpu_limit=64_000)
    assert state.cluster_records["b"].version == version


def test_a_newer_picture_replaces_the_old_one_and_none_forgets_it() -> None:
    state = a_state()
    state.set_growth("b", a_picture())
    newer = a_picture(at=T0 + timedelta(seconds=5), cpu_limit=8_000)
    state.set_growth("b", newer)
    assert state.growth("b") == newer
    version = state.cluster_records["b"].version
    state.set_growth("b", None)
    assert state.growth("b") is None
    assert state.cluster_records["b"].version > version
    state.set_growth("b", None)  # forgetting twice is harmless
    assert state.growth_pictures == {}


def test_a_picture_of_another_cluster_is_refused() -> None:
    with pytest.raises(ValueError, match="growth of cluster 'a' given as that of 'b'"):
        a_state().set_growth("b", a_picture("a"))


def test_virtual_nodes_follow_the_picture_and_the_real_nodes() -> None:
    state = a_state()
    claim = NodeClaimStatus(name="default-c1", node_pool="default", created_at=T0,
                            node_name="kwok-1", launched=True)
    # 12 cpu: the claim's instance and two of headroom (its in_use not updated yet).
    state.set_growth("b", a_picture(cpu_limit=12_000).model_copy(
        update={"node_claims": [claim]}))
    assert sorted(state.cluster_records["b"].order) == [
        "growth:default/0", "growth:default/1", "growth:default/claim/default-c1", "n1"]
    # The claim's Node registers: it is a node now, no longer one that may exist.
    state.set_node("b", "kwok-1", NodeInfo(allocatable=Resources({"cpu": 4000})))
    assert sorted(state.cluster_records["b"].order) == [
        "growth:default/0", "growth:default/1", "kwok-1", "n1"]
    # set_cluster replaces the real nodes and leaves the virtual ones to the plan.
    state.set_cluster("b", {"n2": NodeInfo(allocatable=Resources({"cpu": 2000}))})
    assert sorted(state.cluster_records["b"].order) == [
        "growth:default/0", "growth:default/1", "growth:default/claim/default-c1", "n2"]
    assert state.pool_total().as_dict()["cpu"] == 2000 + 3 * 4000
    with pytest.raises(ValueError, match="reserved for nodes that may exist"):
        state.set_node("b", "growth:default/9", NodeInfo(allocatable=Resources({"cpu": 1})))


def test_a_pools_size_is_read_from_its_largest_node_when_nothing_else_says() -> None:
    state = a_state()
    bare = ClusterGrowth(cluster="b", observed_at=T0, autoscaled=True, node_pools=[
        NodePoolStatus(name="default", limits={"cpu": 16_000}, in_use={"cpu": 8000})])
    state.set_growth("b", bare)
    plan = state.growth_plan("b")
    assert plan is not None and plan.pools[0].nodes == 0
    state.set_node("b", "kwok-1", NodeInfo(allocatable=Resources({"cpu": 8000}),
                                           labels={"karpenter.sh/nodepool": "default"}))
    plan = state.growth_plan("b")
    assert plan is not None
    assert (plan.pools[0].nodes, plan.pools[0].shape_source) == (1, "its largest node, kwok-1")
    assert "growth:default/0" in state.cluster_records["b"].order
