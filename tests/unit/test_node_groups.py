"""The cluster-autoscaler's node groups as NodePools: headroom = (max - current) x one node."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lockgate.node_groups import (
    NODE_POOL_LABEL,
    NodeGroup,
    check_node_groups,
    node_group_pool,
    node_groups_growth,
)
from lockgate.placement import Taint

BATCH = {"eks.amazonaws.com/nodegroup": "batch"}


def group(**overrides: object) -> NodeGroup:
    fields: dict[str, object] = {
        "cluster": "cluster-x", "name": "batch", "max_size": 10,
        "node_allocatable": {"cpu": "8", "memory": "32Gi"}, "node_labels": BATCH}
    fields.update(overrides)
    return NodeGroup.model_validate(fields)


def test_a_group_is_a_pool_limited_to_its_maximum_and_using_its_current_nodes() -> None:
    nodes = [BATCH, BATCH, {**BATCH, "zone": "a"}, {"eks.amazonaws.com/nodegroup": "other"}, {}]
    pool = node_group_pool(group(), nodes)
    assert pool.name == "batch"
    assert pool.limits == {"cpu": 80_000, "memory": 10 * 32 * 2**30}
    # Three of the five nodes carry the group's label.
    assert pool.in_use == {"cpu": 24_000, "memory": 3 * 32 * 2**30}
    assert pool.labels == {**BATCH, NODE_POOL_LABEL: "batch"}
    assert [(r.key, r.operator, r.values) for r in pool.requirements] == [
        ("eks.amazonaws.com/nodegroup", "In", ("batch",))]


def test_taints_of_the_groups_nodes_travel_with_it() -> None:
    taint = Taint(key="gpu", value="true", effect="NoSchedule")
    assert node_group_pool(group(node_taints=(taint,)), []).taints == (taint,)


def test_only_the_clusters_own_groups_make_its_growth() -> None:
    groups = [group(), group(cluster="cluster-y", name="spot")]
    growth = node_groups_growth("cluster-y", groups, [])
    assert growth is not None and growth.autoscaled
    assert [pool.name for pool in growth.node_pools] == ["spot"]
    assert node_groups_growth("cluster-z", groups, []) is None


@pytest.mark.parametrize(("overrides", "words"), [
    ({"max_size": -1}, "greater than or equal to 0"),
    ({"node_allocatable": {"cpu": "eight"}}, "node_allocatable"),
    ({"node_allocatable": {"cpu": "0"}}, "must be positive"),
    ({"node_allocatable": {}}, "at least 1"),
    ({"node_labels": {}}, "at least 1"),
    ({"name": "a/b"}, "may not contain"),
    ({"surprise": 1}, "Extra inputs"),
])
def test_a_group_stated_wrongly_is_refused_with_a_reason(overrides: dict[str, object],
                                                          words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        group(**overrides)


def test_one_group_given_twice_is_refused() -> None:
    check_node_groups([group(), group(cluster="cluster-y")])
    with pytest.raises(ValueError, match="given twice"):
        check_node_groups([group(), group(max_size=3)])


# ---- in the scheduler's state: a cluster with groups and no Karpenter grows within them ----


def test_a_cluster_with_node_groups_grows_within_them_by_the_nodepool_rule() -> None:
    from builders import a_job, a_state

    from lockgate.growth import GrowthPolicy, is_virtual
    from lockgate.resources import Resources
    from lockgate.scheduler import NodeInfo, schedule_round

    batch = group(cluster="b", max_size=3, node_allocatable={"cpu": "4", "memory": "16Gi"})
    jobs = a_job("a").in_cluster("b").requesting(cpu="4", memory="1Gi").times(4)
    first = NodeInfo(allocatable=Resources({"cpu": 4000, "memory": 16 << 30}), labels=BATCH)
    state = (a_state().with_queues("a").with_cluster("b", {"n1": first})
             .with_jobs(jobs).build())
    state.set_growth_policy(GrowthPolicy(node_groups=(batch,), wave_wait_seconds=0))

    def virtual() -> list[str]:
        return sorted(n for n in state.cluster_records["b"].nodes if is_virtual(n))

    # One of three nodes exists: two more may.
    assert len(virtual()) == 2
    result = schedule_round(state, max_decisions=10, max_lookback_per_queue=10,
                            now=1_800_000_000.0)
    # One pod on the real node, two for growth; the fourth has nowhere to go, even to grow.
    assert len(result.decisions) == 3
    assert sorted(d.growth.pool for d in result.decisions if d.growth is not None) == [
        "batch", "batch"]
    # The group's second node appears: the group may add one more, not two.
    state.set_node("b", "n2", NodeInfo(allocatable=Resources({"cpu": 4000, "memory": 16 << 30}),
                                       labels=BATCH))
    assert len(virtual()) == 1
    # A node of another group changes nothing.
    state.set_node("b", "other", NodeInfo(allocatable=Resources({"cpu": 4000}),
                                          labels={"eks.amazonaws.com/nodegroup": "x"}))
    assert len(virtual()) == 1
    # Without the groups the cluster grows by nothing, as before issue 35.
    state.set_growth_policy(GrowthPolicy())
    assert virtual() == []
