"""Karpenter on the stack's autoscaled cluster (devstack.karpenter), for tests and `make demo`: a
KWOKNodeClass and NodePools of their own, the NodeClaims and nodes they make, and a clean-up that
returns the cluster to no node at all. (tests/helpers/karpenter.py gives the tests these names.)

    api = await api_client(stack.autoscaled_kubeconfigs["cluster-c"])
    await apply_node_class(api, "t-class")
    await apply_node_pool(api, node_pool("t-pool", node_class="t-class", cpu_limit="16"))
    ...
    await remove_all(api)   # in a finally: pools, claims, nodes and classes gone, 0 nodes

Why a clean-up of everything: an autoscaled cluster starts with no node, and tests (and the
demo) count its nodes and NodeClaims; whatever one leaves is counted by the next.

A wait that does not come true raises TimeoutError naming what never came.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.stack import StackInfo
from lockgate_adapters.kube import api_client

T = TypeVar("T")

KARPENTER_GROUP = "karpenter.sh"
KARPENTER_VERSION = "v1"
NODE_POOLS = "nodepools"
NODE_CLAIMS = "nodeclaims"
KWOK_GROUP = "karpenter.kwok.sh"
KWOK_VERSION = "v1alpha1"
NODE_CLASSES = "kwoknodeclasses"
NODE_POOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Karpenter's kwok provider's instance types are "<family>-<cpus>x-<arch>-<os>" (its
# kwok/cloudprovider/instance_types.json): c-8x-amd64-linux has 8 cpu and 16Gi.
EIGHT_CPU_TYPES = ("c-8x-amd64-linux",)
UNREGISTERED_TAINT = "karpenter.sh/unregistered"
# The stack's autoscaled cluster the tests (tests/conftest.py's `autoscaled_stack`) and the demo
# use.
AUTOSCALED_CLUSTER = "cluster-c"


@contextlib.asynccontextmanager
async def autoscaled_cluster(info: StackInfo, *,
                             wait_for_others: float = 1800.0) -> AsyncIterator[client.ApiClient]:
    """An admin client of the autoscaled cluster, emptied (`remove_all`) before and after the
    block: the block starts with no node, and leaves none.

    One block at a time on a stack, across test sessions and `make demo` (a file lock in the
    cluster's stack dir): the cluster's nodes, NodePools and NodeClaims are counted whole and
    removed whole, and the engineers sharing a stack run their sessions at once. Waits up to
    `wait_for_others` seconds for another session's block to end.
    """
    async with _only_user(Path(info.stack_dir) / AUTOSCALED_CLUSTER / "tests.lock",
                          wait_for_others):
        api = await api_client(info.kubeconfigs[AUTOSCALED_CLUSTER])
        try:
            await remove_all(api)
            yield api
        finally:
            try:
                await remove_all(api)
            finally:
                await api.close()


@contextlib.asynccontextmanager
async def _only_user(lock_path: Path, within: float) -> AsyncIterator[None]:
    """An exclusive flock on `lock_path` for the block, polled (never blocking the loop)."""
    lock = os.open(lock_path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + within
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"another test session (or demo) has used {AUTOSCALED_CLUSTER} for "
                        f"over {within:.0f}s (lock {lock_path})") from None
                await asyncio.sleep(0.5)
        yield
    finally:
        os.close(lock)  # releases the lock


async def apply_node_class(api: client.ApiClient, name: str, *,
                           registration_delay: str | None = None) -> dict[str, Any]:
    """A KWOKNodeClass `name`, and its status condition Ready=True.

    Why the status: nothing in Karpenter's kwok provider marks a KWOKNodeClass Ready, and a
    NodePool whose NodeClass is not Ready provisions nothing (its NodeClassReady is False).
    `registration_delay` (a Go duration) delays each node's creation after its NodeClaim's.
    """
    objects = client.CustomObjectsApi(api)
    spec: dict[str, Any] = {}
    if registration_delay is not None:
        spec["nodeRegistrationDelay"] = registration_delay
    body = {"apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}", "kind": "KWOKNodeClass",
            "metadata": {"name": name}, "spec": spec}
    created = await objects.create_cluster_custom_object(KWOK_GROUP, KWOK_VERSION, NODE_CLASSES,
                                                         body)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "Ready", "message": "",
        "lastTransitionTime": now,
        "observedGeneration": created["metadata"].get("generation", 1)}]}}
    answer: dict[str, Any] = await objects.patch_cluster_custom_object_status(
        KWOK_GROUP, KWOK_VERSION, NODE_CLASSES, name, ready,
        _content_type="application/merge-patch+json")
    return answer


def node_pool(name: str, *, node_class: str, cpu_limit: str | None,
              instance_types: Sequence[str] = EIGHT_CPU_TYPES,
              consolidation_policy: str = "WhenEmpty", consolidate_after: str = "5s",
              labels: Mapping[str, str] | None = None,
              taints: Sequence[Mapping[str, str]] = (),
              limits: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A NodePool manifest: nodes of `instance_types` only (on-demand, linux/amd64), at most
    `cpu_limit` cpu in all (None: no cpu limit; `limits` adds others), consolidated by
    `consolidation_policy` (WhenEmpty or WhenEmptyOrUnderutilized) `consolidate_after` a node
    qualifies. The disruption budget allows every node at once (Karpenter's default, 10%,
    would let consolidation remove a small pool's nodes one at a time)."""
    if consolidation_policy not in ("WhenEmpty", "WhenEmptyOrUnderutilized"):
        raise ValueError(f"consolidation_policy {consolidation_policy!r}: WhenEmpty or "
                         "WhenEmptyOrUnderutilized")
    if not instance_types:
        raise ValueError("a NodePool needs at least one instance type")
    all_limits = {**({"cpu": cpu_limit} if cpu_limit is not None else {}), **(limits or {})}
    template_spec: dict[str, Any] = {
        "nodeClassRef": {"group": KWOK_GROUP, "kind": "KWOKNodeClass", "name": node_class},
        "requirements": [
            {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(instance_types)},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        ],
        "expireAfter": "Never",
    }
    if taints:
        template_spec["taints"] = [dict(taint) for taint in taints]
    spec: dict[str, Any] = {
        "template": {"metadata": {"labels": dict(labels or {})}, "spec": template_spec},
        "disruption": {"consolidationPolicy": consolidation_policy,
                       "consolidateAfter": consolidate_after,
                       "budgets": [{"nodes": "100%"}]},
    }
    if all_limits:
        spec["limits"] = all_limits
    return {"apiVersion": f"{KARPENTER_GROUP}/{KARPENTER_VERSION}", "kind": "NodePool",
            "metadata": {"name": name}, "spec": spec}


async def apply_node_pool(api: client.ApiClient, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Create the NodePool of `manifest` (see `node_pool`)."""
    created: dict[str, Any] = await client.CustomObjectsApi(api).create_cluster_custom_object(
        KARPENTER_GROUP, KARPENTER_VERSION, NODE_POOLS, dict(manifest))
    return created


async def read_node_pool(api: client.ApiClient, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await client.CustomObjectsApi(api).get_cluster_custom_object(
        KARPENTER_GROUP, KARPENTER_VERSION, NODE_POOLS, name)
    return found


async def node_pool_ready(api: client.ApiClient, name: str) -> bool:
    """Whether Karpenter has marked the NodePool Ready (its NodeClass found Ready, validated)."""
    pool = await read_node_pool(api, name)
    return condition_is(pool, "Ready", "True")


async def list_node_claims(api: client.ApiClient,
                           node_pool_name: str | None = None) -> list[dict[str, Any]]:
    """The NodeClaims (of one NodePool, if named), as JSON objects."""
    selector = f"{NODE_POOL_LABEL}={node_pool_name}" if node_pool_name else ""
    found = await client.CustomObjectsApi(api).list_cluster_custom_object(
        KARPENTER_GROUP, KARPENTER_VERSION, NODE_CLAIMS, label_selector=selector)
    items: list[dict[str, Any]] = found.get("items", [])
    return items


async def list_nodes(api: client.ApiClient,
                     node_pool_name: str | None = None) -> list[client.V1Node]:
    """The cluster's nodes (those of one NodePool, if named)."""
    selector = f"{NODE_POOL_LABEL}={node_pool_name}" if node_pool_name else ""
    nodes: list[client.V1Node] = (await client.CoreV1Api(api).list_node(
        label_selector=selector)).items
    return nodes


async def wait_for_ready_nodes(api: client.ApiClient, node_pool_name: str, count: int, *,
                               within: float = 90.0) -> list[client.V1Node]:
    """Once the pool has exactly `count` nodes, each Ready and registered: those nodes."""
    last = "nothing yet"

    async def probe() -> list[client.V1Node] | None:
        nonlocal last
        nodes = await list_nodes(api, node_pool_name)
        last = ", ".join(f"{n.metadata.name} ready={node_ready(n)}" for n in nodes) or "no node"
        return nodes if len(nodes) == count and all(map(node_ready, nodes)) else None

    return await eventually(probe, within=within, every=0.5,
                            what=lambda: f"{count} Ready nodes of NodePool {node_pool_name} "
                                         f"(last seen: {last})")


async def wait_for_no_nodes(api: client.ApiClient, node_pool_name: str | None = None, *,
                            within: float = 120.0) -> None:
    """Until the pool (or the cluster) has neither a node nor a NodeClaim left: consolidation
    or a clean-up has removed them."""
    async def gone() -> bool:
        return not await list_nodes(api, node_pool_name) and not await list_node_claims(
            api, node_pool_name)

    await eventually(gone, within=within, every=1.0,
                     what=f"no node nor NodeClaim left of {node_pool_name or 'the cluster'}")


def condition_is(obj: Mapping[str, Any], kind: str, status: str) -> bool:
    """Whether a custom object's status condition `kind` has `status` ("True", "False")."""
    return any(c.get("type") == kind and c.get("status") == status
               for c in (obj.get("status") or {}).get("conditions") or [])


def node_ready(node: client.V1Node) -> bool:
    """Ready, and registered with Karpenter (its karpenter.sh/unregistered taint removed)."""
    ready = any(c.type == "Ready" and c.status == "True"
                for c in (node.status.conditions or []))
    return ready and not any(t.key == UNREGISTERED_TAINT for t in (node.spec.taints or []))


def cpu_of(quantity: str) -> float:
    """Kubernetes cpu quantity ("8", "7900m") in cores."""
    if quantity.endswith("m"):
        return int(quantity[:-1]) / 1000
    return float(quantity)


def nodes_cpu(nodes: Sequence[client.V1Node]) -> float:
    """The nodes' cpu capacity in all (what a NodePool's cpu limit counts)."""
    return sum(cpu_of(str((node.status.capacity or {}).get("cpu", "0"))) for node in nodes)


def node_claims_cpu(claims: Sequence[Mapping[str, Any]]) -> float:
    """The NodeClaims' cpu in all, by their instance types (the label kwok's types carry,
    karpenter.kwok.sh/instance-cpu), else by status.capacity.

    Why the label first: Karpenter's kwok provider (v1.13) gives a NodeClaim the capacity of
    the pod requests it was made for (a 5-cpu pod: 5), not its instance type's (8); the stack's
    kwok gives the node its instance type's (devstack.kube.instance_sized_stages), and that is
    what the NodePool's limits count."""
    total = 0.0
    for claim in claims:
        labels = (claim.get("metadata") or {}).get("labels") or {}
        if f"{KWOK_GROUP}/instance-cpu" in labels:
            total += float(labels[f"{KWOK_GROUP}/instance-cpu"])
            continue
        capacity = (claim.get("status") or {}).get("capacity") or {}
        total += cpu_of(str(capacity.get("cpu", "0")))
    return total


async def remove_all(api: client.ApiClient, *, within: float = 120.0) -> None:
    """Delete every NodePool, NodeClaim and KWOKNodeClass, and the nodes Karpenter made, and
    wait until none is left: the autoscaled cluster is back to no node.

    NodePools first: Karpenter then stops provisioning and terminates their NodeClaims (a
    NodeClaim's finalizer deletes its node). The NodeClaims are also deleted directly, and any
    node still there after its claim is gone is deleted too (an orphan of an interrupted test).
    """
    objects = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    await _unless_gone(objects.delete_collection_cluster_custom_object(
        KARPENTER_GROUP, KARPENTER_VERSION, NODE_POOLS))
    await _unless_gone(objects.delete_collection_cluster_custom_object(
        KARPENTER_GROUP, KARPENTER_VERSION, NODE_CLAIMS))

    async def no_claims() -> bool:
        return not await list_node_claims(api)

    await eventually(no_claims, within=within, every=0.5,
                     what=lambda: "the autoscaled cluster's NodeClaims to be gone")

    async def no_nodes() -> bool:
        left = await list_nodes(api)
        for node in left:
            if node.metadata.deletion_timestamp is None:
                await _unless_gone(core.delete_node(node.metadata.name))
        return not left

    await eventually(no_nodes, within=within, every=0.5,
                     what="the autoscaled cluster's nodes to be gone")
    await _unless_gone(objects.delete_collection_cluster_custom_object(
        KWOK_GROUP, KWOK_VERSION, NODE_CLASSES))

    async def no_classes() -> bool:
        found = await objects.list_cluster_custom_object(KWOK_GROUP, KWOK_VERSION, NODE_CLASSES)
        return not found.get("items")

    await eventually(no_classes, within=within, every=0.5,
                     what="the autoscaled cluster's KWOKNodeClasses to be gone")


async def eventually(probe: Callable[[], Awaitable[T | None]], *, within: float,
                     what: str | Callable[[], str], every: float = 0.5) -> T:
    """The first answer of `probe()` that is neither None nor False; TimeoutError naming `what`
    (a string, or a function saying it at the time) after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = await probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            raise TimeoutError(f"timed out after {within:.0f}s waiting for {said}")
        await asyncio.sleep(every)


async def _unless_gone(call: Any) -> None:
    try:
        await call
    except ApiException as error:
        if error.status not in (404, 409):
            raise
