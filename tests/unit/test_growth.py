"""What an autoscaled cluster may still grow by (`lockgate.growth`): headroom and virtual nodes.

The arithmetic is checked on numbers worked out by hand in each test: limits less what is in
use, rounded down to whole instances; a resource a pool does not limit bounded only by the
cluster's cap (or the per-pool node bound); the per-node overhead; pools not Ready or of an
unknown size add nothing and say why; NodeClaims in flight are nodes of their own until their
Node exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import pytest

from lockgate.events import ClusterGrowth, NodeClaimStatus, NodePoolStatus
from lockgate.growth import (
    NODE_POOL_LABEL,
    GrowthPlan,
    GrowthPolicy,
    describe_amounts,
    is_virtual,
    plan_growth,
    wave_answered,
)
from lockgate.placement import Requirement, Taint

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
GI = 1 << 30
KWOK_4X16 = (Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In", values=("4",)),
             Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                         values=("16Gi",)))


@dataclass(frozen=True)
class PoolBuilder:
    name: str = "default"
    limits: Mapping[str, int] = field(default_factory=dict)
    in_use: Mapping[str, int] = field(default_factory=dict)
    requirements: tuple[Requirement, ...] = KWOK_4X16
    weight: int = 0

    def limited_to(self, **amounts: int) -> PoolBuilder:
        return replace(self, limits=dict(amounts))

    def using(self, **amounts: int) -> PoolBuilder:
        return replace(self, in_use=dict(amounts))

    def requiring(self, *requirements: Requirement) -> PoolBuilder:
        return replace(self, requirements=requirements)

    def build(self, **changes: object) -> NodePoolStatus:
        pool = NodePoolStatus(name=self.name, limits=dict(self.limits), in_use=dict(self.in_use),
                              requirements=self.requirements, weight=self.weight)
        return pool.model_copy(update=changes)


def a_pool(name: str = "default") -> PoolBuilder:
    return PoolBuilder(name=name)


def plan(*pools: NodePoolStatus, claims: tuple[NodeClaimStatus, ...] = (),
         policy: GrowthPolicy | None = None, nodes: Mapping[str, Mapping[str, int]] | None = None,
         node_pools: Mapping[str, str] | None = None) -> GrowthPlan:
    """The plan of a cluster "b" whose existing nodes are `nodes` (name -> allocatable), each
    of the pool `node_pools` names."""
    existing = nodes or {}
    pools_of = node_pools or {}

    def largest(pool: str) -> tuple[str, Mapping[str, int]] | None:
        mine = [(dict(a).get("cpu", 0), n) for n, a in existing.items() if pools_of.get(n) == pool]
        if not mine:
            return None
        name = max(mine)[1]
        return name, existing[name]

    growth = ClusterGrowth(cluster="b", observed_at=T0, autoscaled=True,
                           node_pools=list(pools), node_claims=list(claims))
    return plan_growth(growth, policy=policy or GrowthPolicy(), largest_node_of=largest,
                       has_node=lambda name: name in existing,
                       pool_nodes=lambda pool: {n: a for n, a in existing.items()
                                                if pools_of.get(n) == pool})


def test_headroom_is_limits_less_in_use_rounded_down_to_whole_instances() -> None:
    # cpu: (64 - 16) / 4 = 12 nodes; memory: (100Gi - 20Gi) / 16Gi = 5 nodes: memory binds.
    result = plan(a_pool().limited_to(cpu=64_000, memory=100 * GI)
                  .using(cpu=16_000, memory=20 * GI).build())
    pool = result.headroom("default")
    assert pool is not None
    assert pool.nodes == 5
    assert pool.remaining == {"cpu": 48_000, "memory": 80 * GI}
    assert pool.shape == {"cpu": 4000, "memory": 16 * GI}
    assert [n.name for n in result.nodes] == [f"growth:default/{i}" for i in range(5)]
    # 7 cores left of 4-core instances: one whole instance, not 1.75.
    rounded = plan(a_pool().limited_to(cpu=23_000).using(cpu=16_000).build()).headroom("default")
    assert rounded is not None and rounded.nodes == 1


def test_a_pool_over_its_limits_adds_nothing_and_says_so() -> None:
    over = plan(a_pool().limited_to(cpu=8000).using(cpu=10_000).build()).headroom("default")
    assert over is not None
    assert over.nodes == 0
    assert over.why_none == "NodePool default is at its limits (no cpu left)"


def test_an_unlimited_resource_is_bounded_by_the_clusters_cap_shared_by_weight() -> None:
    policy = GrowthPolicy(cluster_caps={"b": {"cpu": 26_000}}, max_nodes_per_pool=100)
    heavy = a_pool("heavy").build(weight=10)
    light = a_pool("light").build(weight=1)
    result = plan(light, heavy, policy=policy)
    # The heavier pool first: 26 cores / 4 = 6 nodes (24 cores); 2 cores left: none for light.
    assert [(p.pool, p.nodes) for p in result.pools] == [("heavy", 6), ("light", 0)]
    # With neither a limit nor a cap, only the per-pool bound stops the count.
    unbounded = plan(a_pool().build(), policy=GrowthPolicy(max_nodes_per_pool=7))
    assert unbounded.pools[0].nodes == 7
    assert unbounded.pools[0].remaining == {}


def test_virtual_nodes_carry_the_pools_labels_and_taints_less_the_per_node_overhead() -> None:
    gpu = Taint(key="gpu", value="yes", effect="NoSchedule")
    pool = a_pool("gpu").limited_to(cpu=8000).requiring(
        *KWOK_4X16,
        Requirement(key="topology.kubernetes.io/zone", operator="In", values=("z1",)),
        Requirement(key="karpenter.sh/capacity-type", operator="In",
                    values=("spot", "on-demand"))).build(labels={"team": "ml"}, taints=(gpu,))
    policy = GrowthPolicy(node_overhead={"cpu": 250, "memory": GI})
    nodes = plan(pool, policy=policy).nodes
    assert len(nodes) == 2
    node = nodes[0]
    assert node.allocatable == {"cpu": 3750, "memory": 15 * GI}
    # A requirement with one value fixes the label; one with several does not.
    assert node.labels == {"karpenter.kwok.sh/instance-cpu": "4",
                           "karpenter.kwok.sh/instance-memory": "16Gi",
                           "topology.kubernetes.io/zone": "z1", "team": "ml",
                           NODE_POOL_LABEL: "gpu"}
    assert node.taints == (gpu,)
    assert is_virtual(node.name) and not is_virtual("ip-10-0-0-1.ec2.internal")


def test_a_pool_not_ready_or_of_unknown_size_adds_nothing_and_says_why() -> None:
    not_ready = plan(a_pool().limited_to(cpu=64_000).build(
        ready=False, not_ready_reason="NodeClassNotReady: EC2NodeClass default not found"))
    assert not_ready.nodes == ()
    assert not_ready.pools[0].why_none == (
        "NodePool default is not Ready (NodeClassNotReady: EC2NodeClass default not found)")
    unknown = plan(a_pool().limited_to(cpu=64_000).requiring().build())
    assert unknown.nodes == ()
    assert unknown.pools[0].why_none.startswith("NodePool default: the size of its nodes is "
                                                "unknown (its requirements name no instance")


def test_the_instance_shape_comes_from_the_policy_then_requirements_then_the_largest_node(
) -> None:
    aws = a_pool().limited_to(cpu=64_000).requiring(
        Requirement(key="karpenter.k8s.aws/instance-cpu", operator="In", values=("4", "8")),
        Requirement(key="karpenter.k8s.aws/instance-memory", operator="In",
                    values=("16384", "32768"))).build()
    # AWS writes memory in MiB; of several sizes allowed, the largest.
    assert plan(aws).pools[0].shape == {"cpu": 8000, "memory": 32 * GI}
    bare = a_pool().limited_to(cpu=64_000).requiring().build()
    from_nodes = plan(bare,
                      nodes={"n1": {"cpu": 2000}, "n2": {"cpu": 16_000}, "n3": {"cpu": 32_000}},
                      node_pools={"n1": "default", "n2": "default", "n3": "other"})
    assert from_nodes.pools[0].shape == {"cpu": 16_000}
    assert from_nodes.pools[0].shape_source == "its largest node, n2"
    # The pool's two nodes (18 cpu) are in use, whatever its late status says: (64 - 18) / 16.
    assert from_nodes.pools[0].nodes == 2
    override = GrowthPolicy(instance_shapes={"b/default": {"cpu": 32_000, "memory": 64 * GI}})
    assert plan(aws, policy=override).pools[0].nodes == 2


def test_claims_in_flight_are_nodes_until_their_node_exists_and_a_failed_one_stalls() -> None:
    pool = a_pool().limited_to(cpu=20_000).using(cpu=12_000).build()
    launching = NodeClaimStatus(name="default-abc", node_pool="default", created_at=T0)
    launched = NodeClaimStatus(name="default-def", node_pool="default", created_at=T0,
                               allocatable={"cpu": 3900, "memory": 15 * GI},
                               node_name="kwok-node-1", launched=True)
    registered = NodeClaimStatus(name="default-ghi", node_pool="default", created_at=T0,
                                 node_name="kwok-node-2", registered=True)
    result = plan(pool, claims=(launching, launched, registered),
                  nodes={"kwok-node-2": {"cpu": 4000}})
    # Two claims in flight (the third's Node exists: it is a node already), then headroom of
    # (20 - 12) / 4 = 2 nodes; in_use counts the claims, so nothing is counted twice.
    assert result.claims_in_flight == ("default-abc", "default-def")
    assert [(n.name, n.claim, dict(n.allocatable)) for n in result.nodes] == [
        ("growth:default/claim/default-abc", "default-abc", {"cpu": 4000, "memory": 16 * GI}),
        ("growth:default/claim/default-def", "default-def", {"cpu": 3900, "memory": 15 * GI}),
        ("growth:default/0", "", {"cpu": 4000, "memory": 16 * GI}),
        ("growth:default/1", "", {"cpu": 4000, "memory": 16 * GI})]
    failed = launching.model_copy(
        update={"failure": "InsufficientCapacity: no offering for c-4x in z1"})
    stalled = plan(pool, claims=(failed,))
    assert stalled.failed_claim == (
        "NodeClaim default-abc: InsufficientCapacity: no offering for c-4x in z1")
    assert all(not n.claim for n in stalled.nodes)


def test_a_claim_the_pools_in_use_does_not_count_yet_is_not_also_headroom() -> None:
    # Karpenter writes a NodeClaim before it adds it to the pool's status.resources; a picture
    # taken in between (seen on the stack) must not offer that node twice: as the claim in
    # flight and as headroom. Five 8-cpu nodes exist (in_use 40) and a sixth claim is new.
    shape = GrowthPolicy(instance_shapes={"default": {"cpu": 8000, "memory": 16 * GI}})
    pool = a_pool().limited_to(cpu=48_000).using(cpu=40_000).build()
    claims = tuple(NodeClaimStatus(name=f"default-{i}", node_pool="default", created_at=T0,
                                   node_name=f"node-{i}", registered=True) for i in range(5))
    new = NodeClaimStatus(name="default-new", node_pool="default", created_at=T0)
    result = plan(pool, claims=(*claims, new), policy=shape,
                  nodes={f"node-{i}": {"cpu": 7900} for i in range(5)})
    assert result.claims_in_flight == ("default-new",)
    headroom = result.headroom("default")
    assert headroom is not None and headroom.nodes == 0, headroom
    assert [n.name for n in result.nodes] == ["growth:default/claim/default-new"]
    # Once in_use counts it, the same: one node that may exist, no headroom.
    caught_up = plan(pool.model_copy(update={"in_use": {"cpu": 48_000}}),
                     claims=(*claims, new), policy=shape,
                     nodes={f"node-{i}": {"cpu": 7900} for i in range(5)})
    assert [n.name for n in caught_up.nodes] == ["growth:default/claim/default-new"]
    # Failed or deleting claims are not counted as the pool's use.
    gone = plan(pool, claims=(*claims, new.model_copy(update={"deleting": True})),
                policy=shape, nodes={f"node-{i}": {"cpu": 7900} for i in range(5)})
    assert [n.name for n in gone.nodes] == ["growth:default/0"]


def test_a_stale_in_use_does_not_count_the_pools_new_claims_and_nodes_as_headroom_too(
) -> None:
    # Karpenter updates status.resources seconds after the claims and nodes it counts exist:
    # two claims made (one a node already) while in_use still says 0. Headroom is what the
    # limits leave beside them, (16 - 2 x 4) / 4 = 2, not 4 nodes.
    pool = a_pool().limited_to(cpu=16_000).using(cpu=0).build()
    made = (NodeClaimStatus(name="default-abc", node_pool="default", created_at=T0),
            NodeClaimStatus(name="default-def", node_pool="default", created_at=T0,
                            node_name="kwok-node-1", registered=True))
    result = plan(pool, claims=made, nodes={"kwok-node-1": {"cpu": 4000}})
    headroom = result.headroom("default")
    assert headroom is not None and headroom.nodes == 2
    assert headroom.remaining == {"cpu": 8000}
    # In all: one claim in flight, one real node, two of headroom: the limit's four.
    assert [n.name for n in result.nodes] == [
        "growth:default/claim/default-abc", "growth:default/0", "growth:default/1"]
    # A failed claim makes nothing; an up-to-date in_use larger than the claims wins.
    failed = made[0].model_copy(update={"failure": "InsufficientCapacity: none"})
    assert plan(pool, claims=(failed,)).headroom("default").nodes == 4  # type: ignore[union-attr]
    counted = pool.model_copy(update={"in_use": {"cpu": 12_000}})
    assert plan(counted, claims=made).headroom("default").nodes == 1  # type: ignore[union-attr]


def test_a_cluster_that_is_not_autoscaled_grows_by_nothing() -> None:
    growth = ClusterGrowth(cluster="a", observed_at=T0, autoscaled=False)
    result = plan_growth(growth, policy=GrowthPolicy(), largest_node_of=lambda _: None,
                         has_node=lambda _: False)
    assert result.nodes == () and result.pools == ()


def test_a_wave_is_answered_by_a_pool_using_more_not_by_a_claim_alone() -> None:
    pool = a_pool().limited_to(cpu=64_000).using(cpu=8000).build()
    before = plan(pool).marker
    assert not wave_answered(before, plan(pool).marker)
    grown = plan(pool.model_copy(update={"in_use": {"cpu": 12_000}})).marker
    assert wave_answered(before, grown)
    # A new claim the pool's in_use does not count yet: the picture between Karpenter's two
    # writes, whose headroom is still the old one. The wave is answered once in_use grows.
    claimed = plan(pool, claims=(NodeClaimStatus(name="c1", node_pool="default",
                                                 created_at=T0),)).marker
    assert not wave_answered(before, claimed)
    shrunk = plan(pool.model_copy(update={"in_use": {"cpu": 4000}})).marker
    assert not wave_answered(before, shrunk)


def test_bad_policies_are_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="node_overhead: negative amounts of cpu"):
        GrowthPolicy(node_overhead={"cpu": -1})
    with pytest.raises(ValueError, match="stall_after_seconds must be positive"):
        GrowthPolicy(stall_after_seconds=0)
    with pytest.raises(ValueError, match="max_nodes_per_pool must not be negative"):
        GrowthPolicy(max_nodes_per_pool=-1)


def test_amounts_read_as_people_write_them() -> None:
    assert describe_amounts({"cpu": 48_000, "memory": 96 * GI, "pods": 110}) == (
        "cpu=48 memory=96Gi pods=110")


def test_the_pools_nodes_count_as_its_use_when_its_status_is_late() -> None:
    # The watcher publishes only claims in flight: once initialized, a claim's node is just a
    # node labelled with its pool. Two such nodes exist while in_use still says 0: the pool
    # may add (16 - 2 x 4) / 4 = 2 more, not 4.
    pool = a_pool().limited_to(cpu=16_000).using(cpu=0).build()
    nodes = {"kwok-1": {"cpu": 4000}, "kwok-2": {"cpu": 4000}, "other": {"cpu": 4000}}
    result = plan(pool, nodes=nodes, node_pools={"kwok-1": "default", "kwok-2": "default"})
    headroom = result.headroom("default")
    assert headroom is not None and headroom.nodes == 2
    # A claim naming one of those nodes counts once, not twice.
    claim = NodeClaimStatus(name="default-a", node_pool="default", created_at=T0,
                            node_name="kwok-1", registered=True)
    again = plan(pool, claims=(claim,), nodes=nodes,
                 node_pools={"kwok-1": "default", "kwok-2": "default"}).headroom("default")
    assert again is not None and again.nodes == 2

KWOK_M_FAMILY = (Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In",
                             values=("4", "8", "16")),
                 Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                             values=("16384", "32768", "65536")))


def test_headroom_left_after_the_biggest_type_is_smaller_types_that_fit() -> None:
    # 60 cpu / 240Gi left, types 16/64Gi, 8/32Gi, 4/16Gi: 3 x 16 (48 cpu), then 12 cpu left:
    # 1 x 8, then 4 left: 1 x 4. Memory (4Gi per cpu) ties exactly.
    result = plan(a_pool().requiring(*KWOK_M_FAMILY)
                  .limited_to(cpu=100_000, memory=400 * GI)
                  .using(cpu=40_000, memory=160 * GI).build())
    pool = result.headroom("default")
    assert pool is not None
    assert pool.nodes == 5
    assert [(dict(size), count) for size, count in pool.instances] == [
        ({"cpu": 16_000, "memory": 64 * GI}, 3),
        ({"cpu": 8_000, "memory": 32 * GI}, 1),
        ({"cpu": 4_000, "memory": 16 * GI}, 1)]
    assert sorted(n.allocatable["cpu"] for n in result.nodes) == [
        4000, 8000, 16_000, 16_000, 16_000]
    assert len({n.name for n in result.nodes}) == 5


def test_less_than_one_biggest_instance_left_still_adds_the_smaller_ones() -> None:
    # 12 cpu left: no 16, one 8, one 4 (the issue's "whole instances of the types that fit").
    pool = plan(a_pool().requiring(*KWOK_M_FAMILY).limited_to(cpu=12_000).build()) \
        .headroom("default")
    assert pool is not None and pool.nodes == 2 and pool.why_none == ""
    assert [size["cpu"] for size, _ in pool.instances] == [8000, 4000]
    # 3 cpu left: no type fits; the reason is the biggest type's.
    none = plan(a_pool().requiring(*KWOK_M_FAMILY).limited_to(cpu=3_000).build()) \
        .headroom("default")
    assert none is not None and none.nodes == 0
    assert "cpu=3 left: less than a node" in none.why_none


def test_a_smaller_type_never_gets_more_memory_per_cpu_than_the_biggest() -> None:
    # Memory values 16Gi and 64Gi only: the 8-cpu type would need at most 32Gi -> 16Gi (the
    # largest allowed value below it); the 4-cpu type -> 16Gi.
    requirements = (Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In",
                                values=("4", "8", "16")),
                    Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                                values=("16Gi", "64Gi")))
    pool = plan(a_pool().requiring(*requirements).limited_to(cpu=28_000).build()) \
        .headroom("default")
    assert pool is not None
    assert [(size["cpu"], size["memory"] // GI, count) for size, count in pool.instances] == [
        (16_000, 64, 1), (8000, 16, 1), (4000, 16, 1)]


def test_the_max_nodes_bound_counts_every_type() -> None:
    pool = plan(a_pool().requiring(*KWOK_M_FAMILY).limited_to(cpu=60_000).build(),
                policy=GrowthPolicy(max_nodes_per_pool=4)).headroom("default")
    assert pool is not None and pool.nodes == 4
    assert [(size["cpu"], count) for size, count in pool.instances] == [(16_000, 3), (8000, 1)]


def test_a_shape_from_the_policy_is_the_only_type() -> None:
    policy = GrowthPolicy(instance_shapes={"default": {"cpu": 16_000, "memory": 64 * GI}})
    pool = plan(a_pool().requiring(*KWOK_M_FAMILY).limited_to(cpu=28_000).build(),
                policy=policy).headroom("default")
    assert pool is not None and pool.nodes == 1
    assert [size["cpu"] for size, _ in pool.instances] == [16_000]


def test_headroom_nodes_say_which_smaller_types_a_pod_released_onto_them_must_avoid() -> None:
    # 28 cpu left of 4, 8 and 16-cpu types: one 16 (avoid 4 and 8), one 8 (avoid 4), one 4
    # (nothing smaller). Karpenter launches the cheapest type that holds a batch, so without
    # this a pod or two released onto the 16 would make a 4.
    result = plan(a_pool().requiring(*KWOK_M_FAMILY).limited_to(cpu=28_000).build())
    cpu_label = "karpenter.kwok.sh/instance-cpu"
    by_size = {n.allocatable["cpu"]: n for n in result.nodes}
    assert by_size[16_000].avoid == Requirement(key=cpu_label, operator="NotIn",
                                                values=("4", "8"))
    assert by_size[8000].avoid == Requirement(key=cpu_label, operator="NotIn", values=("4",))
    assert by_size[4000].avoid is None
    # Each carries its own size's labels, so a pod that names a size lands on that size only.
    assert {n.allocatable["cpu"]: (n.labels[cpu_label],
                                   n.labels["karpenter.kwok.sh/instance-memory"])
            for n in result.nodes} == {16_000: ("16", "65536"), 8000: ("8", "32768"),
                                       4000: ("4", "16384")}


def test_a_launched_claim_avoids_smaller_types_and_one_size_has_nothing_to_avoid() -> None:
    pool = a_pool().requiring(*KWOK_M_FAMILY).limited_to(cpu=64_000).using(cpu=16_000).build()
    claim = NodeClaimStatus(name="default-a", node_pool="default", created_at=T0,
                            allocatable={"cpu": 16_000, "memory": 64 * GI})
    result = plan(pool, claims=(claim,))
    (in_flight,) = [n for n in result.nodes if n.claim]
    # A pod released onto it that Karpenter cannot pack there after all makes a 16, not a 4.
    assert in_flight.avoid == Requirement(key="karpenter.kwok.sh/instance-cpu",
                                          operator="NotIn", values=("4", "8"))
    assert all(n.avoid is not None for n in result.nodes if not n.claim)
    # Before it launches its size is not known: nothing to avoid.
    unlaunched = plan(pool, claims=(claim.model_copy(update={"allocatable": {}}),))
    assert [n.avoid for n in unlaunched.nodes if n.claim] == [None]
    # One instance size (KWOK_4X16): nothing smaller to rule out.
    single = plan(a_pool().limited_to(cpu=16_000).build())
    assert single.nodes and all(n.avoid is None for n in single.nodes)
    # A shape from the policy, with no instance-cpu requirement: nothing to name.
    stated = plan(a_pool().requiring().limited_to(cpu=16_000).build(),
                  policy=GrowthPolicy(instance_shapes={"default": {"cpu": 4000,
                                                                   "memory": 16 * GI}}))
    assert stated.nodes and all(n.avoid is None for n in stated.nodes)


KWOK_C_8X = (Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In", values=("8",)),
             Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                         values=("16Gi",)))


def test_a_claims_allocatable_loses_the_overhead_once_not_twice() -> None:
    # The stack's kwok c-8x: 8 cpu / 16Gi instance, allocatable 7900m / 16374Mi (100m and 10Mi
    # kept back), `node_overhead` 100m / 10Mi. Headroom: 8000 - 100 = 7900m. A launched claim
    # says allocatable 7900m: its node has 7900m, not 7900 - 100.
    policy = GrowthPolicy(node_overhead={"cpu": 100, "memory": 10 << 20})
    pool = a_pool().requiring(*KWOK_C_8X).limited_to(cpu=16_000).using(cpu=8000).build()
    claim = NodeClaimStatus(name="default-a", node_pool="default", created_at=T0,
                            allocatable={"cpu": 7900, "memory": 16374 << 20, "pods": 110})
    result = plan(pool, claims=(claim,), policy=policy)
    (in_flight,) = [n for n in result.nodes if n.claim]
    (headroom,) = [n for n in result.nodes if not n.claim]
    assert in_flight.allocatable == {"cpu": 7900, "memory": 16374 << 20, "pods": 110}
    assert headroom.allocatable == {"cpu": 7900, "memory": (16 * GI) - (10 << 20)}
    # A claim whose allocatable is its whole capacity (no reserve): the overhead is taken once.
    whole = claim.model_copy(update={"allocatable": {"cpu": 8000, "memory": 16 * GI}})
    (node,) = [n for n in plan(pool, claims=(whole,), policy=policy).nodes if n.claim]
    assert node.allocatable == {"cpu": 7900, "memory": (16 * GI) - (10 << 20)}
    # A pool sized by the policy (its nodes' allocatable): the overhead is subtracted as before.
    stated = GrowthPolicy(node_overhead={"cpu": 100},
                          instance_shapes={"default": {"cpu": 7900, "memory": 16 * GI}})
    (node,) = [n for n in plan(pool.model_copy(update={"requirements": ()}), claims=(claim,),
                               policy=stated).nodes if n.claim]
    assert node.allocatable["cpu"] == 7800


def test_a_node_names_its_size_when_the_pool_lets_karpenter_make_only_that_size() -> None:
    # Of 4, 8 and 16-cpu types, each headroom node carries its instance cpu (and the smaller
    # are avoided); a pool of one size carries it too. A pool whose size comes from lockgate's
    # setting alone names none: Karpenter chooses, and releases there may gather a node's worth.
    family = plan(a_pool().requiring(*KWOK_M_FAMILY).limited_to(cpu=28_000).build())
    assert [(n.allocatable["cpu"], n.size_named) for n in family.nodes] == [
        (16_000, True), (8000, True), (4000, True)]
    one = plan(a_pool().requiring(*KWOK_4X16).limited_to(cpu=8000).build())
    assert [n.size_named for n in one.nodes] == [True, True]
    unnamed = plan(a_pool().requiring().limited_to(cpu=32_000).build(), policy=GrowthPolicy(
        instance_shapes={"default": {"cpu": 16_000, "memory": 64 * GI}}))
    assert [n.size_named for n in unnamed.nodes] == [False, False]
