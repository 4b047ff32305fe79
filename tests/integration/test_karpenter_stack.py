"""Karpenter on the stack's autoscaled cluster, for real (no lockgate involved): the cluster grows
for pods no node can hold, never beyond its NodePool's limits, and shrinks again when they are
gone. What issue 35's tests build on: if this fails, Karpenter itself is not working here.

The pods are plain (no scheduling gate) in a namespace lockgate does not manage.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kubernetes_asyncio import client

from helpers.karpenter import (
    EIGHT_CPU_TYPES,
    NODE_POOL_LABEL,
    apply_node_class,
    apply_node_pool,
    autoscaled_cluster,
    cpu_of,
    list_node_claims,
    list_nodes,
    node_claims_cpu,
    node_pool,
    node_pool_ready,
    node_ready,
    nodes_cpu,
    read_node_pool,
    wait_for_no_nodes,
    wait_for_ready_nodes,
)
from helpers.kube import Namespaces
from helpers.pods import PodBuilder
from helpers.waiting import eventually

if TYPE_CHECKING:
    from devstack import StackInfo

CPU_LIMIT = 16.0  # the NodePool's: two nodes of 8 cpu
POD_CPU = "5"  # one pod per 8-cpu node (7.9 allocatable once kwok's 100m overhead is taken)
PODS_WITHIN_LIMIT = 2
PODS_BEYOND_LIMIT = 2
# Karpenter's batch window is 1 s idle, 10 s at most: twice the longest window with no new
# NodeClaim means Karpenter has decided not to make one.
NO_NEW_CLAIM_SECONDS = 25.0
GROW_SECONDS = 90.0
SHRINK_SECONDS = 120.0


@dataclass
class Peaks:
    """The most cpu the cluster's nodes, and its NodeClaims, ever had while it was watched."""

    nodes_cpu: float = 0.0
    claims_cpu: float = 0.0
    claims: int = 0
    samples: int = 0
    seen: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def watching(api: client.ApiClient, pool: str) -> AsyncIterator[Peaks]:
    """Samples the pool's nodes and NodeClaims every 0.2 s during the block."""
    peaks = Peaks()

    async def sample() -> None:
        while True:
            nodes = await list_nodes(api, pool)
            claims = await list_node_claims(api, pool)
            peaks.nodes_cpu = max(peaks.nodes_cpu, nodes_cpu(nodes))
            peaks.claims_cpu = max(peaks.claims_cpu, node_claims_cpu(claims))
            peaks.claims = max(peaks.claims, len(claims))
            peaks.seen = sorted({*peaks.seen, *(c["metadata"]["name"] for c in claims)})
            peaks.samples += 1
            await asyncio.sleep(0.2)

    task = asyncio.create_task(sample(), name="karpenter-peaks")
    try:
        yield peaks
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert peaks.samples > 0, "the cluster was never sampled"


def plain_pod(name: str, namespace: str, cpu: str = POD_CPU) -> dict[str, object]:
    return (PodBuilder(name).in_namespace(namespace).requesting(cpu=cpu, memory="1Gi")
            .manifest())


async def bound_node(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    pod = await core.read_namespaced_pod(name, namespace)
    return pod.spec.node_name or None


async def held_by_the_limit(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    """Karpenter said why it makes no node for the pod: its NodePool's limits."""
    events = await core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}")
    return any(e.reason == "FailedScheduling" and "exceed limits" in (e.message or "")
               and (e.source.component if e.source else "") == "karpenter"
               for e in events.items)


async def test_karpenter_grows_the_cluster_within_its_limits_and_consolidates_it(
        autoscaled_stack: StackInfo) -> None:
    tag = uuid.uuid4().hex[:6]
    node_class, pool, namespace = f"kwok-{tag}", f"pool-{tag}", f"karpenter-{tag}"
    async with autoscaled_cluster(autoscaled_stack) as api:
        core = client.CoreV1Api(api)
        assert await list_nodes(api) == [], "the autoscaled cluster must start with no node"
        namespaces = Namespaces({"autoscaled": api})
        try:
            await namespaces.create("autoscaled", namespace)
            await apply_node_class(api, node_class)
            await apply_node_pool(api, node_pool(
                pool, node_class=node_class, cpu_limit=f"{CPU_LIMIT:.0f}",
                instance_types=EIGHT_CPU_TYPES, consolidation_policy="WhenEmpty",
                consolidate_after="5s"))
            await eventually(lambda: node_pool_ready(api, pool), within=60, every=0.5,
                             what=f"NodePool {pool} Ready")

            async with watching(api, pool) as peaks:
                # Pods no node can hold (there is none): Karpenter makes a node for each.
                within = [f"within-{i}" for i in range(PODS_WITHIN_LIMIT)]
                for name in within:
                    await core.create_namespaced_pod(namespace, plain_pod(name, namespace))

                async def all_bound() -> dict[str, str] | None:
                    nodes = {name: await bound_node(core, namespace, name) for name in within}
                    return None if None in nodes.values() else nodes  # type: ignore[return-value]

                placed = await eventually(all_bound, within=GROW_SECONDS, every=0.5,
                                          what="the pods within the limit to bind")
                nodes = {node.metadata.name: node for node in await wait_for_ready_nodes(
                    api, pool, PODS_WITHIN_LIMIT, within=GROW_SECONDS)}
                assert set(placed.values()) <= set(nodes), (
                    f"pods bound to nodes not of NodePool {pool}: {placed} vs {sorted(nodes)}")
                assert all(node_ready(nodes[name]) for name in placed.values()), (
                    "a node holding a pod is not Ready and registered")
                # The node's capacity is its instance type's (what the limits count), not its
                # pod's request (Karpenter's kwok provider's; devstack's kwok Stage fixes it).
                assert {str(node.status.capacity["cpu"]) for node in nodes.values()} == {"8"}

                async def pool_counts_the_limit() -> bool:
                    status = (await read_node_pool(api, pool)).get("status") or {}
                    return cpu_of(str((status.get("resources") or {}).get("cpu", "0"))) == (
                        CPU_LIMIT)

                await eventually(pool_counts_the_limit, within=30, every=0.5,
                                 what=f"NodePool {pool}'s status.resources to count 16 cpu")
                claims = [c["metadata"]["name"] for c in await list_node_claims(api, pool)]
                assert len(claims) == PODS_WITHIN_LIMIT, (
                    f"one NodeClaim per pod was expected: {claims}")
                assert all(labels[NODE_POOL_LABEL] == pool and labels[
                    "node.kubernetes.io/instance-type"] in EIGHT_CPU_TYPES
                    for labels in (node.metadata.labels for node in nodes.values())), (
                    "a node of another instance type than the NodePool allows")

                # More pods: the pool is at its limit, so they stay pending, no NodeClaim more.
                beyond = [f"beyond-{i}" for i in range(PODS_BEYOND_LIMIT)]
                for name in beyond:
                    await core.create_namespaced_pod(namespace, plain_pod(name, namespace))

                async def unschedulable(name: str) -> bool:
                    pod = await core.read_namespaced_pod(name, namespace)
                    return any(c.type == "PodScheduled" and c.status == "False"
                               and c.reason == "Unschedulable"
                               for c in pod.status.conditions or ())

                for name in beyond:
                    await eventually(lambda name=name: unschedulable(name), within=30,
                                     every=0.5, what=f"pod {name} Unschedulable")
                for name in beyond:
                    await eventually(lambda name=name: held_by_the_limit(core, namespace, name),
                                     within=30, every=0.5,
                                     what=f"Karpenter's Event: pod {name} exceeds the limits")
                await asyncio.sleep(NO_NEW_CLAIM_SECONDS)
                for name in beyond:
                    assert await bound_node(core, namespace, name) is None, (
                        f"pod {name} bound although the pool was at its limit")
                claims_after = await list_node_claims(api, pool)
                assert len(claims_after) == PODS_WITHIN_LIMIT, (
                    "Karpenter made a NodeClaim beyond the NodePool's limit: "
                    f"{[c['metadata']['name'] for c in claims_after]}")

                # All pods gone: consolidation (WhenEmpty, 5 s) removes the empty nodes.
                await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)

                await wait_for_no_nodes(api, pool, within=SHRINK_SECONDS)

            assert 0 < peaks.nodes_cpu <= CPU_LIMIT, (
                f"the nodes' cpu peaked at {peaks.nodes_cpu} (limit {CPU_LIMIT})")
            assert peaks.claims_cpu <= CPU_LIMIT, (
                f"the NodeClaims' cpu peaked at {peaks.claims_cpu} (limit {CPU_LIMIT})")
            assert peaks.seen and len(peaks.seen) == PODS_WITHIN_LIMIT, (
                f"NodeClaims seen over the test: {peaks.seen}")
            assert await list_nodes(api) == [], "the autoscaled cluster kept a node"
        finally:
            await namespaces.delete_all()


async def test_small_pods_in_separate_batches_never_take_the_pool_beyond_its_limit(
        autoscaled_stack: StackInfo) -> None:
    """Pods of 3 cpu, each in a batch of its own: two fit an 8-cpu node, so 16 cpu hold four
    and the fifth and sixth stay pending. Were a node counted by its pods' requests (as
    Karpenter's kwok provider counts a NodeClaim), each batch would find room under the limit
    and the pool would grow to three nodes, 24 cpu."""
    tag = uuid.uuid4().hex[:6]
    node_class, pool, namespace = f"kwok-{tag}", f"pool-{tag}", f"karpenter-{tag}"
    async with autoscaled_cluster(autoscaled_stack) as api:
        core = client.CoreV1Api(api)
        namespaces = Namespaces({"autoscaled": api})
        try:
            await namespaces.create("autoscaled", namespace)
            await apply_node_class(api, node_class)
            await apply_node_pool(api, node_pool(
                pool, node_class=node_class, cpu_limit=f"{CPU_LIMIT:.0f}",
                instance_types=EIGHT_CPU_TYPES, consolidation_policy="WhenEmpty",
                consolidate_after="5s"))
            await eventually(lambda: node_pool_ready(api, pool), within=60, every=0.5,
                             what=f"NodePool {pool} Ready")
            async with watching(api, pool) as peaks:
                names = [f"small-{i}" for i in range(6)]
                for name in names:
                    await core.create_namespaced_pod(namespace, plain_pod(name, namespace, "3"))

                    async def settled(name: str = name) -> bool:
                        # Bound, or held: Karpenter has decided about it before the next one.
                        return (await bound_node(core, namespace, name) is not None
                                or await held_by_the_limit(core, namespace, name))

                    await eventually(settled, within=GROW_SECONDS, every=0.5,
                                     what=f"pod {name} bound, or held by the pool's limit")
                await asyncio.sleep(NO_NEW_CLAIM_SECONDS)
                placed = {name: await bound_node(core, namespace, name) for name in names}
                assert [name for name, node in placed.items() if node] == names[:4], placed
                assert len(set(filter(None, placed.values()))) == 2, placed
            assert peaks.nodes_cpu == CPU_LIMIT and peaks.claims_cpu <= CPU_LIMIT, (
                f"nodes peaked at {peaks.nodes_cpu} cpu, NodeClaims at {peaks.claims_cpu} "
                f"(limit {CPU_LIMIT}); NodeClaims seen: {peaks.seen}")
            assert len(peaks.seen) == 2, f"NodeClaims seen: {peaks.seen}"
        finally:
            await namespaces.delete_all()


def test_devstack_status_shows_the_autoscaled_cluster(autoscaled_stack: StackInfo) -> None:
    status = subprocess.run([sys.executable, "-m", "devstack", "status"], capture_output=True,
                            text=True, check=False)
    assert status.returncode == 0, status.stdout + status.stderr
    lines = {line.split()[0]: line for line in status.stdout.splitlines() if line.strip()}
    for kind in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
                 "karpenter"):
        assert " running " in lines[f"cluster-c/{kind}"], status.stdout
    assert "(Karpenter's) Ready" in lines["cluster-c/nodes"], status.stdout
    assert "127.0.0.1" in lines["cluster-c/karpenter"], status.stdout
