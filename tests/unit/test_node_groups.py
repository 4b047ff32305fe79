"""The cluster-autoscaler's node groups as NodePools: headroom = (max - current) x one node."""

from __future__ import annotations

from datetime import UTC, datetime

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

NOW = datetime(2026, 12, 7, tzinfo=UTC)
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
    growth = node_groups_growth("cluster-y", groups, [], NOW)
    assert growth is not None and growth.autoscaled
    assert [pool.name for pool in growth.node_pools] == ["spot"]
    assert node_groups_growth("cluster-z", groups, [], NOW) is None


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
