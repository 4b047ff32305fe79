"""Karpenter on the stack's autoscaled cluster, for tests: the one piece the tests and `make demo`
share lives in `devstack.karpenter_pools` (devstack must not import the tests); this gives the
tests its names.

    async with autoscaled_cluster(autoscaled_stack) as api:   # emptied before and after
        await apply_node_class(api, "t-class")
        await apply_node_pool(api, node_pool("t-pool", node_class="t-class", cpu_limit="16"))
"""

from __future__ import annotations

from devstack.karpenter_pools import (
    AUTOSCALED_CLUSTER,
    EIGHT_CPU_TYPES,
    INSTANCE_TYPE_LABEL,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    KWOK_GROUP,
    KWOK_VERSION,
    NODE_CLAIMS,
    NODE_CLASSES,
    NODE_POOL_LABEL,
    NODE_POOLS,
    UNREGISTERED_TAINT,
    apply_node_class,
    apply_node_pool,
    autoscaled_cluster,
    condition_is,
    cpu_of,
    list_node_claims,
    list_nodes,
    node_claims_cpu,
    node_pool,
    node_pool_ready,
    node_ready,
    nodes_cpu,
    read_node_pool,
    remove_all,
    wait_for_no_nodes,
    wait_for_ready_nodes,
)

__all__ = [
    "AUTOSCALED_CLUSTER", "EIGHT_CPU_TYPES", "INSTANCE_TYPE_LABEL", "KARPENTER_GROUP",
    "KARPENTER_VERSION", "KWOK_GROUP", "KWOK_VERSION", "NODE_CLAIMS", "NODE_CLASSES",
    "NODE_POOLS", "NODE_POOL_LABEL", "UNREGISTERED_TAINT", "apply_node_class",
    "apply_node_pool", "autoscaled_cluster", "condition_is", "cpu_of", "list_node_claims",
    "list_nodes", "node_claims_cpu", "node_pool", "node_pool_ready", "node_ready", "nodes_cpu",
    "read_node_pool", "remove_all", "wait_for_no_nodes", "wait_for_ready_nodes",
]
