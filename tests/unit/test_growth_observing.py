"""Reading Karpenter's NodePools and NodeClaims (lockgate.growth_observing), from objects shaped
as Karpenter v1.13.0 writes them."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from karpenter_objects import NodePoolBuilder, a_node_claim, a_node_pool

from lockgate.events import ClusterGrowth, NodeClaimStatus, NodePoolStatus
from lockgate.growth_observing import (
    MalformedObjectError,
    ObservedGrowth,
    growth_problem,
    node_claim_status,
    node_pool_status,
)
from lockgate.placement import Requirement, Taint

NOW = datetime(2026, 12, 7, 12, 10, tzinfo=UTC)
GIB = 2**30


def gpu_pool() -> NodePoolBuilder:
    return (a_node_pool("gpu").limited_to(cpu="64", memory="256Gi", nodes="8")
            .using(cpu="8", memory="32Gi", pods="220", nodes="2").weighing(50)
            .requiring("karpenter.sh/capacity-type", "In", "on-demand", "spot")
            .requiring("kubernetes.io/arch", "In", "amd64")
            .requiring("karpenter.kwok.sh/instance-cpu", "Gt", "3")
            .labelling(team="ml").tainting("nvidia.com/gpu", "NoSchedule", "true")
            .with_startup_taint("node.cilium.io/agent-not-ready", "NoExecute").ready())


# NodePools


def test_a_ready_pool_is_read_in_canonical_units_with_what_its_nodes_carry() -> None:
    assert node_pool_status(gpu_pool().obj()) == NodePoolStatus(
        name="gpu",
        limits={"cpu": 64_000, "memory": 256 * GIB, "nodes": 8},
        in_use={"cpu": 8_000, "memory": 32 * GIB, "pods": 220, "nodes": 2},
        requirements=(
            Requirement(key="karpenter.sh/capacity-type", operator="In",
                        values=("on-demand", "spot")),
            Requirement(key="kubernetes.io/arch", operator="In", values=("amd64",)),
            Requirement(key="karpenter.kwok.sh/instance-cpu", operator="Gt", values=("3",)),
        ),
        # Karpenter labels every node it makes with its pool: pods select pools by it.
        labels={"team": "ml", "karpenter.sh/nodepool": "gpu"},
        # The startup taint goes before pods land: not kept.
        taints=(Taint(key="nvidia.com/gpu", value="true", effect="NoSchedule"),),
        ready=True, not_ready_reason="", weight=50)


def test_a_pool_without_limits_or_status_is_unbounded_and_not_reconciled_yet() -> None:
    status = node_pool_status(a_node_pool("default").obj())
    assert (status.limits, status.in_use, status.weight) == ({}, {}, 0)
    assert not status.ready
    assert "no Ready condition yet" in status.not_ready_reason


@pytest.mark.parametrize(("pool", "says"), [
    (a_node_pool("p").not_ready("NodeClassNotFound", "NodeClass not found on cluster"),
     "NodeClassReady: NodeClassNotFound: NodeClass not found on cluster"),
    (a_node_pool("p").reconciling(), "ReconcilingDependents: NodeClassReady=Unknown"),
    (a_node_pool("p").ready().being_deleted(), "being deleted"),
    (a_node_pool("p").ready().static(3), "static (spec.replicas)"),
])
def test_a_pool_karpenter_does_not_provision_from_is_not_ready_and_says_why(
        pool: NodePoolBuilder, says: str) -> None:
    status = node_pool_status(pool.obj())
    assert not status.ready
    assert says in status.not_ready_reason


@pytest.mark.parametrize(("change", "says"), [
    (lambda p: p.limited_to(cpu="lots"), "NodePool 'p': invalid quantity 'lots'"),
    (lambda p: p.limited_to(cpu="-4"), "NodePool 'p': spec.limits has negative amounts of cpu"),
    (lambda p: p.tainting("", "NoSchedule"), "spec.template.spec.taints[0] needs a key"),
    (lambda p: p.weighing("heavy"), "spec.weight 'heavy' is not an integer"),
])
def test_a_malformed_pool_is_an_error_naming_it(
        change: Callable[[NodePoolBuilder], NodePoolBuilder], says: str) -> None:
    with pytest.raises(MalformedObjectError, match=re.escape(says)):
        node_pool_status(change(a_node_pool("p").ready()).obj())


def test_an_object_that_is_not_one_is_an_error_not_a_crash() -> None:
    with pytest.raises(MalformedObjectError, match="NodePool without a name"):
        node_pool_status({"metadata": {}, "spec": {}})
    with pytest.raises(MalformedObjectError, match="spec is a list"):
        node_pool_status({"metadata": {"name": "x"}, "spec": []})
    with pytest.raises(MalformedObjectError, match="not an object"):
        node_claim_status(["not", "a", "claim"])  # type: ignore[arg-type]


# NodeClaims


def test_a_claim_goes_from_launching_to_a_node() -> None:
    claim = a_node_claim("default-x7k2p", "default")
    launching = node_claim_status(claim.obj())
    assert launching == NodeClaimStatus(
        name="default-x7k2p", node_pool="default",
        created_at=datetime(2026, 12, 7, 12, 1, 30, tzinfo=UTC))
    launched = claim.launched(cpu="3920m", memory="7Gi", pods="110")
    assert node_claim_status(launched.obj()).allocatable == {
        "cpu": 3920, "memory": 7 * GIB, "pods": 110}
    assert node_claim_status(launched.obj()).launched
    registered = node_claim_status(launched.registered("default-x7k2p").obj())
    assert (registered.registered, registered.node_name, registered.initialized) == (
        True, "default-x7k2p", False)
    done = node_claim_status(launched.registered("default-x7k2p").initialized().obj())
    assert done.initialized and not done.failure and not done.deleting


def test_a_claim_whose_launch_failed_says_why() -> None:
    # Karpenter v1.13 leaves a failed launch Unknown with the cloud provider's reason, and
    # retries it (lifecycle/launch.go).
    failed = a_node_claim("default-abcde", "default").condition(
        "Launched", "Unknown", "LaunchFailed",
        "creating instance, no instance type satisfied the requirements")
    assert node_claim_status(failed.obj()).failure == (
        "Launched: LaunchFailed: creating instance, no instance type satisfied the requirements")
    refused = a_node_claim("default-abcde", "default").condition(
        "Launched", "False", "InsufficientCapacity", "all requested instance types were "
        "unavailable during launch").being_deleted()
    status = node_claim_status(refused.obj())
    assert status.failure == ("Launched: InsufficientCapacity: all requested instance types "
                              "were unavailable during launch")
    assert status.deleting


def test_a_claim_that_registered_twice_failed_but_waiting_is_no_failure() -> None:
    twice = (a_node_claim("c", "default").launched(cpu="4")
             .condition("Registered", "False", "MultipleNodesFound",
                        "Invariant violated, matched multiple nodes"))
    assert node_claim_status(twice.obj()).failure == (
        "Registered: MultipleNodesFound: Invariant violated, matched multiple nodes")
    waiting = (a_node_claim("c", "default").launched(cpu="4")
               .condition("Registered", "Unknown", "NodeNotFound",
                          "Node not registered with cluster")
               .condition("Initialized", "Unknown", "StartupTaintsExist", "StartupTaint ..."))
    assert node_claim_status(waiting.obj()).failure == ""


def test_a_claim_without_its_pool_label_is_an_error_naming_it() -> None:
    claim = a_node_claim("stray", "default").obj()
    del claim["metadata"]["labels"]["karpenter.sh/nodepool"]
    with pytest.raises(MalformedObjectError,
                       match=re.escape("NodeClaim 'stray': it has no karpenter.sh")):
        node_claim_status(claim)


# The picture of a cluster


def observed() -> ObservedGrowth:
    return ObservedGrowth("cluster-b", now=lambda: NOW)


def test_the_picture_is_unknown_until_both_kinds_are_listed() -> None:
    growth = observed()
    assert not growth.known
    growth.relist_pools([gpu_pool().obj()])
    assert not growth.known
    growth.relist_claims([])
    assert growth.known
    assert growth.growth() == ClusterGrowth(
        cluster="cluster-b", observed_at=NOW, autoscaled=True,
        node_pools=[node_pool_status(gpu_pool().obj())])


def test_the_picture_holds_the_claims_in_flight_only() -> None:
    growth = observed()
    growth.relist_pools([gpu_pool().obj()])
    node = a_node_claim("gpu-node", "gpu").launched(cpu="4").registered("gpu-node").initialized()
    launching = a_node_claim("gpu-new", "gpu")
    failed = a_node_claim("gpu-bad", "gpu").condition("Launched", "Unknown", "LaunchFailed", "x")
    leaving = node.being_deleted().obj()
    leaving["metadata"]["name"] = "gpu-leaving"
    growth.relist_claims([node.obj(), launching.obj(), failed.obj(), leaving])
    assert [c.name for c in growth.growth().node_claims] == ["gpu-bad", "gpu-leaving", "gpu-new"]


def test_only_a_change_lockgate_reads_is_a_new_revision() -> None:
    growth = observed()
    growth.relist_pools([gpu_pool().obj()])
    claim = a_node_claim("gpu-new", "gpu").launched(cpu="4")
    growth.relist_claims([claim.obj()])
    revision = growth.revision
    growth.observe_claim(claim.with_last_pod_event("2026-12-07T12:09:00Z").obj())
    growth.relist_pools([gpu_pool().obj()])
    assert growth.revision == revision
    growth.observe_claim(claim.registered("gpu-new").obj())
    assert growth.revision == revision + 1
    growth.observe_pool(gpu_pool().using(cpu="12").obj())
    assert growth.revision == revision + 2
    growth.observe_pool(gpu_pool().obj(), deleted=True)
    assert growth.growth().node_pools == []
    assert growth.revision == revision + 3


def test_a_malformed_object_is_left_out_reported_and_forgotten_once_fixed() -> None:
    growth = observed()
    bad = a_node_pool("bad").limited_to(cpu="lots").obj()
    problems = growth.relist_pools([gpu_pool().obj(), bad])
    growth.relist_claims([])
    assert [str(p) for p in problems] == ["NodePool 'bad': invalid quantity 'lots'"]
    assert [p.name for p in growth.growth().node_pools] == ["gpu"]
    assert growth.unreadable == {("NodePool", "bad"): "NodePool 'bad': invalid quantity 'lots'"}
    # A pool that turns malformed leaves the picture rather than stay as it was.
    with pytest.raises(MalformedObjectError):
        growth.observe_pool(gpu_pool().limited_to(cpu="?").obj())
    assert growth.growth().node_pools == []
    growth.observe_pool(a_node_pool("bad").ready().obj())
    assert ("NodePool", "bad") not in growth.unreadable
    assert [p.name for p in growth.growth().node_pools] == ["bad"]


def test_a_cluster_without_the_kinds_is_not_autoscaled_and_a_later_install_is_noticed() -> None:
    growth = observed()
    assert growth.not_served()
    assert growth.known
    assert growth.growth() == ClusterGrowth(cluster="cluster-b", observed_at=NOW,
                                            autoscaled=False)
    revision = growth.revision
    assert not growth.not_served()  # no news: nothing new to publish
    assert growth.revision == revision
    growth.relist_pools([gpu_pool().obj()])
    assert not growth.known  # the claims are not listed yet
    growth.relist_claims([])
    assert growth.growth().autoscaled
    assert growth.revision > revision


# Checking a picture before it is stored


def a_growth(**changes: object) -> ClusterGrowth:
    fields: dict[str, object] = {
        "cluster": "cluster-b", "observed_at": NOW, "autoscaled": True,
        "node_pools": [NodePoolStatus(name="default", limits={"cpu": 64_000})],
        "node_claims": [NodeClaimStatus(name="c1", node_pool="default", created_at=NOW)]}
    return ClusterGrowth.model_validate({**fields, **changes})


@pytest.mark.parametrize(("changes", "problem"), [
    ({"cluster": " "}, "cluster must not be empty"),
    ({"observed_at": NOW.replace(tzinfo=None)}, "observed_at has no time zone"),
    ({"autoscaled": False}, "not autoscaled lists NodePools"),
    ({"node_pools": [NodePoolStatus(name="p"), NodePoolStatus(name="p")]},
     "NodePool 'p' is listed twice"),
    ({"node_pools": [NodePoolStatus(name="p", in_use={"cpu": -1})]}, "cpu is negative"),
    ({"node_claims": [NodeClaimStatus(name="c", node_pool="p", created_at=NOW,
                                      failure="bad\x00")]}, "NUL"),
    ({"node_claims": [NodeClaimStatus(name="c", node_pool="p",
                                      created_at=NOW - timedelta(seconds=1)),
                      NodeClaimStatus(name="c", node_pool="p", created_at=NOW)]},
     "NodeClaim 'c' is listed twice"),
])
def test_a_picture_that_cannot_be_stored_says_why(changes: dict[str, object],
                                                   problem: str) -> None:
    found = growth_problem(a_growth(**changes))
    assert found is not None and problem in found


def test_a_sound_picture_has_no_problem() -> None:
    assert growth_problem(a_growth()) is None
    assert growth_problem(ClusterGrowth(cluster="a", observed_at=NOW)) is None
