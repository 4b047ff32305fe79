"""The fleet simulator's Karpenter (devstack.sim_autoscaler): what it sees, its batch window,
its limits, its provisioning delay and its consolidation of empty nodes, in simulated time."""

from __future__ import annotations

import random
from typing import Any

import pytest

from devstack.sim_autoscaler import (
    AutoscalerError,
    InstanceType,
    NodePoolSpec,
    SimCluster,
    SimEvent,
    fewest_nodes,
)
from lockgate.placement import Requirement

GI = 2**30
SMALL = InstanceType("m-4x", 4000, 16 * GI)
MEDIUM = InstanceType("m-8x", 8000, 32 * GI)
LARGE = InstanceType("m-16x", 16000, 64 * GI)


def pool(**changes: Any) -> NodePoolSpec:
    spec: dict[str, Any] = {
        "name": "default", "instance_types": (SMALL, MEDIUM, LARGE),
        "limits": {"cpu": 64000, "memory": 256 * GI}, "provisioning_seconds": (5.0, 60.0),
        "consolidate_after_seconds": 30.0}
    spec.update(changes)
    return NodePoolSpec(**spec)


def cluster(spec: NodePoolSpec | None = None, *, fixed: int = 0, seed: int = 3) -> SimCluster:
    return SimCluster("c1", spec or pool(), rng=random.Random(seed),
                      fixed_nodes={f"c1-n{i}": {"cpu": 4000, "memory": 16 * GI}
                                   for i in range(fixed)})


def cpu(cores: float) -> dict[str, int]:
    return {"cpu": int(cores * 1000), "memory": int(cores * 2 * GI)}


def test_a_pod_that_fits_a_node_is_bound_and_the_autoscaler_never_sees_it() -> None:
    side = cluster(fixed=1)
    assert side.release("p1", cpu(3), None, at=0.0) == "c1-n0"
    assert side.release("p2", cpu(1), "c1-n0", at=0.0) == "c1-n0"
    assert side.advance(120.0) == []
    assert (side.created, side.waiting, side.in_use()) == (0, {}, {"cpu": 0, "memory": 0})
    # The node is full now: the next pod is unschedulable, and only then provisionable.
    assert side.release("p3", cpu(1), "c1-n0", at=120.0) is None
    assert list(side.waiting) == ["p3"]


def test_a_batch_closes_after_one_idle_second() -> None:
    side = cluster()
    for at, pod in ((0.0, "a"), (0.5, "b"), (1.2, "c")):
        side.advance(at)
        assert side.release(pod, cpu(1), None, at=at) is None
    side.advance(2.19)  # the last pod came at 1.2: the window is still open
    assert side.created == 0
    side.advance(2.2)
    # One batch, packed together: three 1-cpu pods on one 4-cpu instance.
    assert side.created == 1
    (claim,) = side.claims.values()
    assert (claim.instance, claim.created_at, claim.nominated) == (SMALL, 2.2, {"a", "b", "c"})


def test_a_batch_closes_ten_seconds_after_it_opened_while_pods_keep_coming() -> None:
    side = cluster(pool(limits={"cpu": 640000, "memory": 2560 * GI}))
    at = 0.0
    while at < 14.0:
        side.advance(at)
        side.release(f"p{at:.1f}", cpu(4), None, at=at)
        at = round(at + 0.9, 1)
    side.advance(14.0)
    # The first window closed at 10 s with the pods sent before it; the next is still open.
    made_at = {c.created_at for c in side.claims.values()}
    assert made_at == {10.0}
    nominated = {p for c in side.claims.values() for p in c.nominated}
    assert nominated == {f"p{t / 10:.1f}" for t in range(0, 100, 9)}
    assert set(side.waiting) - nominated == {"p10.8", "p11.7", "p12.6", "p13.5"}
    side.advance(14.5)  # 13.5 + 1 s idle
    assert {c.created_at for c in side.claims.values()} == {10.0, 14.5}


def test_first_fit_decreasing_onto_the_smallest_type_that_holds_each_node() -> None:
    side = cluster()
    sizes = [4, 4, 4, 4, 4, 4, 4, 4, 2, 1]  # 35 cpu
    for index, cores in enumerate(sizes):
        side.release(f"p{index}", cpu(cores), None, at=0.0)
    side.advance(1.0)
    kinds = sorted((c.instance.name, len(c.nominated)) for c in side.claims.values())
    # Two 16-cpu nodes of four 4-cpu pods each, then the 2 and the 1 on one 4-cpu node.
    assert kinds == [("m-16x", 4), ("m-16x", 4), ("m-4x", 2)]


def test_claims_in_flight_take_pods_before_a_new_claim_is_made() -> None:
    side = cluster()
    side.release("first", cpu(12), None, at=0.0)
    side.advance(1.0)
    (claim,) = side.claims.values()
    assert claim.instance == LARGE
    side.release("second", cpu(4), None, at=2.0)  # fits the 16-cpu claim still in flight
    side.advance(3.0)
    assert side.created == 1 and claim.nominated == {"first", "second"}


def test_limits_are_never_exceeded_and_pods_beyond_them_stay_unschedulable() -> None:
    rng = random.Random(11)
    spec = pool(limits={"cpu": 40000, "memory": 160 * GI})
    side = cluster(spec)
    at, number = 0.0, 0
    for _ in range(300):
        at += rng.choice([0.1, 0.5, 2.0, 15.0])
        side.advance(at)
        for _ in range(rng.randint(0, 3)):
            number += 1
            side.release(f"p{number}", cpu(rng.choice([1, 2, 4])), None, at=at)
        if side.bound and rng.random() < 0.3:
            side.finish(rng.choice(sorted(side.bound)), at=at)
        used = side.in_use()
        assert used["cpu"] <= 40000 and used["memory"] <= 160 * GI, (at, used)
        pool_cpu = sum(n.allocatable["cpu"] for n in side.nodes.values() if n.pool)
        assert pool_cpu <= used["cpu"]  # every pool node is a claim the limits counted
    # Demand far above 40 cpu: the pool reached its limits and pods wait beyond them.
    assert side.in_use()["cpu"] > 40000 - LARGE.cpu
    assert side.waiting
    # A pod waiting beyond the limits is nominated to no claim.
    nominated = {p for c in side.claims.values() for p in c.nominated}
    assert set(side.waiting) - nominated


def test_a_node_registers_after_its_provisioning_delay_and_waiting_pods_bind_to_it() -> None:
    side = cluster(pool(provisioning_seconds=(20.0, 40.0)))
    side.release("p", cpu(2), None, at=0.0)
    side.advance(1.0)
    (claim,) = side.claims.values()
    assert 21.0 <= claim.ready_at <= 41.0
    assert side.advance(claim.ready_at - 0.01) == []
    assert "p" in side.waiting
    events = side.advance(claim.ready_at)
    assert events == [
        SimEvent(at=claim.ready_at, node=claim.node_name, allocatable=SMALL.resources),
        SimEvent(at=claim.ready_at, node=claim.node_name, pod="p")]
    assert [e.kind for e in events] == ["added", "bound"]
    assert side.bound == {"p": claim.node_name} and not side.waiting
    growth = side.growth()
    assert growth.node_claims[0].registered and growth.node_claims[0].node_name


def test_delays_are_seeded_and_stay_within_the_pool_s_range() -> None:
    def delays(seed: int) -> list[float]:
        side = cluster(seed=seed)
        for index in range(40):
            side.release(f"p{index}", cpu(4), None, at=float(index * 5))
            side.advance(float(index * 5))
        side.advance(500.0)
        return side.delays

    assert delays(1) == delays(1) != delays(2)
    assert all(5.0 <= d <= 60.0 for d in delays(1)) and len(delays(1)) >= 5


def test_an_empty_pool_node_is_consolidated_after_consolidate_after() -> None:
    side = cluster(fixed=1)
    side.release("fixed", cpu(4), None, at=0.0)  # fills the fixed node
    side.release("p", cpu(2), None, at=0.0)
    side.advance(1.0)
    (claim,) = side.claims.values()
    side.advance(claim.ready_at)
    side.advance(200.0)
    assert claim.node_name in side.nodes  # a pod runs there: kept
    assert side.finish("p", at=200.0) == []
    assert side.finish("fixed", at=200.0) == []
    assert side.advance(229.9) == []
    assert side.advance(230.0) == [SimEvent(at=230.0, node=claim.node_name)]
    assert claim.node_name not in side.nodes and not side.claims
    assert side.in_use() == {"cpu": 0, "memory": 0} and side.consolidated == 1
    side.advance(10_000.0)
    assert "c1-n0" in side.nodes  # the fixed node, empty, is not the pool's: never removed


def test_a_node_that_gets_a_pod_again_before_consolidation_stays() -> None:
    side = cluster()
    side.release("p", cpu(2), None, at=0.0)
    side.advance(1.0)
    (claim,) = side.claims.values()
    side.advance(claim.ready_at)
    side.finish("p", at=100.0)
    side.advance(120.0)
    assert side.release("q", cpu(2), None, at=120.0) == claim.node_name
    side.advance(1_000.0)
    assert claim.node_name in side.nodes and side.consolidated == 0


def test_consolidation_gives_limits_back_to_pods_waiting_beyond_them() -> None:
    # Room on the empty node itself would take the waiting pod; here the pod needs another
    # type (memory-heavy), which the limits allow only once the empty node is gone.
    high_memory = InstanceType("r-2x", 2000, 60 * GI)
    side = cluster(pool(instance_types=(SMALL, high_memory),
                        limits={"cpu": 4000, "memory": 80 * GI}))
    side.release("first", cpu(4), None, at=0.0)
    side.advance(1.0)
    side.release("late", {"cpu": 1000, "memory": 40 * GI}, None, at=2.0)
    side.advance(5.0)
    assert side.created == 1 and "late" in side.waiting  # no room left under the limits
    (claim,) = side.claims.values()
    side.advance(claim.ready_at)
    side.finish("first", at=200.0)
    side.advance(229.0)
    assert side.created == 1 and "late" in side.waiting  # it fits no room on the 4-cpu node
    side.advance(300.0)
    # The empty node went after 30 s; its share of the limits went to the pod that waited.
    assert side.consolidated == 1 and side.created == 2
    (late,) = side.claims.values()
    assert late.instance == high_memory and late.created_at == 231.0
    assert late.nominated == {"late"} or side.bound.get("late") == late.node_name


def test_headroom_is_in_whole_instances_within_the_limits() -> None:
    spec = pool(limits={"cpu": 20000, "memory": 256 * GI})
    assert spec.headroom({"cpu": 0, "memory": 0}) == {"cpu": 20000, "memory": 80 * GI}
    assert spec.headroom({"cpu": 17000, "memory": 0}) == {"cpu": 0, "memory": 0}
    side = cluster(spec)
    side.release("p", cpu(10), None, at=0.0)
    side.advance(1.0)  # one 16-cpu claim in flight counts against the limits
    assert side.in_use()["cpu"] == 16000 and side.headroom()["cpu"] == 4000
    growth = side.growth()
    assert growth.autoscaled and growth.node_pools[0].in_use["cpu"] == 16000
    assert not growth.node_claims[0].registered and growth.node_claims[0].node_name == ""
    with pytest.raises(AutoscalerError, match="limits on cpu and memory"):
        pool(limits={"cpu": 1000}).headroom({})


def test_the_fewest_nodes_are_bounded_by_each_resource_on_the_biggest_type() -> None:
    types = (SMALL, MEDIUM, LARGE)
    assert fewest_nodes({"cpu": 0.0, "memory": 0.0}, types) == 0
    assert fewest_nodes({"cpu": -5000.0, "memory": -1.0}, types) == 0
    assert fewest_nodes({"cpu": 16000.0, "memory": 1.0}, types) == 1
    assert fewest_nodes({"cpu": 16000.5, "memory": 1.0}, types) == 2
    assert fewest_nodes({"cpu": 1000.0, "memory": 130.0 * GI}, types) == 3


@pytest.mark.parametrize("change, message", [
    ({"instance_types": ()}, "at least one instance type"),
    ({"limits": {"cpu": -1}}, "not be negative"),
    ({"provisioning_seconds": (10.0, 5.0)}, "provisioning_seconds"),
    ({"consolidate_after_seconds": -1.0}, "consolidate_after"),
])
def test_a_bad_node_pool_is_refused_with_a_reason(change: dict[str, Any], message: str) -> None:
    with pytest.raises(AutoscalerError, match=message):
        pool(**change)


def test_time_never_goes_back_and_unknown_pods_are_refused() -> None:
    side = cluster()
    side.advance(10.0)
    with pytest.raises(AutoscalerError, match="time went back"):
        side.release("p", cpu(1), None, at=5.0)
    with pytest.raises(AutoscalerError, match="not in this cluster"):
        side.finish("nobody", at=10.0)
    side.release("p", cpu(1), None, at=10.0)
    with pytest.raises(AutoscalerError, match="released twice"):
        side.release("p", cpu(1), None, at=10.0)


NOT_SMALLER_THAN_16 = Requirement(key="karpenter.kwok.sh/instance-cpu", operator="NotIn",
                                  values=("4", "8"))


def test_a_pod_that_avoids_smaller_types_makes_the_type_it_allows() -> None:
    side = cluster()
    # Alone, 2 cpu makes a 4-cpu node (the cheapest that holds it)...
    side.release("plain", cpu(2), None, at=0.0)
    side.advance(1.0)
    assert [c.instance for c in side.claims.values()] == [SMALL]
    # ...but a pod whose affinity rules out 4 and 8 makes a 16, and is not packed onto the
    # 4-cpu claim in flight, though it would fit there.
    side.release("steered", cpu(1), None, at=2.0, avoid=(NOT_SMALLER_THAN_16,))
    side.advance(3.0)
    by_pod = {p: c.instance for c in side.claims.values() for p in c.nominated}
    assert by_pod == {"plain": SMALL, "steered": LARGE}
    # The next batch: the steered pod joins the 16-cpu claim in flight, the plain one the
    # first claim in flight that holds it (the 4-cpu one); no new claim.
    side.release("steered-2", cpu(1), None, at=4.0, avoid=(NOT_SMALLER_THAN_16,))
    side.release("plain-2", cpu(2), None, at=4.0)
    side.advance(5.0)
    assert side.created == 2
    by_pod = {p: c.instance for c in side.claims.values() for p in c.nominated}
    assert by_pod == {"plain": SMALL, "plain-2": SMALL, "steered": LARGE, "steered-2": LARGE}


def test_a_pod_that_avoids_a_type_never_binds_to_a_node_of_it_but_binds_to_fixed_nodes() -> None:
    side = cluster(fixed=1)
    side.release("fill", cpu(4), "c1-n0", at=0.0)  # the fixed node is full
    side.release("small", cpu(1), None, at=0.0)
    side.advance(200.0)  # a 4-cpu node registered, 3 cpu free on it
    small_node = side.bound["small"]
    assert side.nodes[small_node].instance == SMALL
    assert side.release("steered", cpu(1), small_node, at=200.0,
                        avoid=(NOT_SMALLER_THAN_16,)) is None
    side.finish("fill", at=201.0)  # room on the fixed node (no instance label): it binds there
    assert side.bound["steered"] == "c1-n0"
