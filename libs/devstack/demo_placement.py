"""The demo's GPU pool: placement as kube-scheduler sees it, shown on a tainted pool of kwok nodes.

Why a separate step after the fairness workloads: the fairness workloads' pods tolerate every
taint (as the benchmark's do), so a pool added while they run would change the capacity their
fairness is judged against. Afterwards, the demo adds two kwok nodes with 4 `nvidia.com/gpu`
each, tainted `nvidia.com/gpu=present:NoSchedule` and labelled `pool=gpu`, to the first cluster,
and creates in a queue of its own:

- GPU pods that tolerate the taint and select the pool: lockgate releases as many as there are
  GPUs, and kube-scheduler binds every one of them to the pool;
- GPU pods that do not tolerate the taint: lockgate parks them as unschedulable and never
  releases them (nowhere could kube-scheduler put them).

The summary shows where each kind went; a pod released that kube-scheduler then refused, or a
non-tolerating pod released at all, fails the demo. The nodes and pods go afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

import aiohttp
import asyncpg
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.launcher import Lockgate
from lockgate.labels import MANAGED_NAMESPACE_LABEL, QUEUE_LABEL, SCHEDULING_GATE

GPU = "nvidia.com/gpu"
NODES, GPUS_PER_NODE = 2, 4
TOLERATING, NOT_TOLERATING = 10, 3
QUEUE = "gpu"


def _pod(name: str, run: str, *, tolerating: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "busybox", "resources": {
            "requests": {"cpu": "1", "memory": "1Gi", GPU: "1"}, "limits": {GPU: "1"}}}],
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
    }
    if tolerating:
        spec["tolerations"] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
        spec["nodeSelector"] = {"pool": f"gpu-{run}"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: QUEUE}}, "spec": spec}


async def gpu_pool(lockgate: Lockgate, api: client.ApiClient, pool: asyncpg.Pool, run: str,
                   failures: list[str], *, within: float = 120.0,
                   cluster: str = "cluster-a") -> list[str]:
    """Run the GPU-pool step; returns the summary's lines, appends to `failures`."""
    core = client.CoreV1Api(api)
    namespace = f"demo-{run}-gpu"
    nodes = [f"demo-{run}-gpu-{i}" for i in range(NODES)]
    try:
        binding = [{"cluster": "*", "names": [namespace]}]
        async with aiohttp.ClientSession(headers=lockgate.admin_headers) as session, \
                session.post(f"{lockgate.admin_url}/api/v1/queues",
                             json={"name": QUEUE, "namespaces": binding}) as response:
            if response.status not in (200, 201, 409):
                raise RuntimeError(f"queue {QUEUE}: {await response.text()}")
        await lockgate.wait_for_queues({QUEUE: {"cordoned": False, "namespaces": binding}})
        for name in nodes:
            allocatable = {"cpu": "32", "memory": "128Gi", "pods": "110", GPU: str(GPUS_PER_NODE)}
            await core.create_node({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {"kubernetes.io/hostname": name, "pool": f"gpu-{run}"}},
                "spec": {"taints": [{"key": GPU, "value": "present", "effect": "NoSchedule"}]},
                "status": {"capacity": allocatable, "allocatable": allocatable}})
        await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": namespace, "labels": {MANAGED_NAMESPACE_LABEL: "true",
                                          **lockgate.run_namespace_labels}}})
        await _until_nodes_known(pool, nodes, within)
        for i in range(TOLERATING):
            await core.create_namespaced_pod(namespace, _pod(f"tolerating-{i}", run,
                                                             tolerating=True))
        for i in range(NOT_TOLERATING):
            await core.create_namespaced_pod(namespace, _pod(f"not-tolerating-{i}", run,
                                                             tolerating=False))
        # Only this cluster's rows: tests sharing the stack watch it under aliases of their own.
        placed = await _until_settled(core, namespace, pool, within, cluster)
    except (ApiException, TimeoutError, RuntimeError) as error:
        failures.append(f"GPU pool: {error}")
        return [f"  GPU pool: failed ({error})"]
    finally:
        with contextlib.suppress(ApiException):
            await core.delete_namespace(namespace)
        for name in nodes:
            with contextlib.suppress(ApiException):
                await core.delete_node(name)
    capacity = NODES * GPUS_PER_NODE
    bound = Counter(node for kind, node, _ in placed if kind == "tolerating" and node)
    released_not_tolerating = sum(1 for kind, _, gated in placed
                                  if kind == "not-tolerating" and not gated)
    refused = sum(1 for kind, node, gated in placed if not gated and not node)
    if sum(bound.values()) != min(capacity, TOLERATING):
        failures.append(f"GPU pool: {sum(bound.values())} tolerating pods bound, expected "
                        f"{min(capacity, TOLERATING)}")
    if released_not_tolerating or refused:
        failures.append(f"GPU pool: {released_not_tolerating} non-tolerating pods released, "
                        f"{refused} released pods kube-scheduler did not bind")
    return [
        f"  GPU pool: {NODES} kwok nodes x {GPUS_PER_NODE} {GPU}, tainted "
        f"{GPU}=present:NoSchedule, in queue '{QUEUE}':",
        f"    {TOLERATING} pods tolerating the taint: {sum(bound.values())} released and bound "
        f"({', '.join(f'{n}: {c}' for n, c in sorted(bound.items()))}), "
        f"{TOLERATING - sum(bound.values())} waiting for a GPU",
        f"    {NOT_TOLERATING} GPU pods not tolerating it: {released_not_tolerating} released "
        "(parked as unschedulable: no node they may land on has a GPU)",
        f"    released pods kube-scheduler refused: {refused}",
    ]


async def _until_nodes_known(pool: asyncpg.Pool, nodes: list[str], within: float) -> None:
    deadline = time.monotonic() + within
    while await pool.fetchval("SELECT count(*) FROM cluster_nodes WHERE node = ANY($1::text[])"
                              " AND present AND schedulable", nodes) < len(nodes):
        if time.monotonic() > deadline:
            raise TimeoutError("the GPU nodes never showed up Ready in lockgate's capacity")
        await asyncio.sleep(0.2)


async def _until_settled(core: client.CoreV1Api, namespace: str, pool: asyncpg.Pool,
                         within: float, cluster: str) -> list[tuple[str, str, bool]]:
    """(kind, node, gated) per pod once the scheduler parked every non-tolerating pod and the
    pool's GPUs are all bound (or the tolerating pods all are)."""
    deadline = time.monotonic() + within
    while True:
        listed = await core.list_namespaced_pod(namespace)
        placed = [(p.metadata.name.rsplit("-", 1)[0], p.spec.node_name or "",
                   SCHEDULING_GATE in {g.name for g in p.spec.scheduling_gates or ()})
                  for p in listed.items]
        bound = sum(1 for kind, node, _ in placed if kind == "tolerating" and node)
        parked = await pool.fetchval(
            "SELECT count(*) FROM jobs WHERE queue = $1 AND state = 'queued'"
            " AND name LIKE 'not-tolerating-%' AND namespace = $2 AND cluster = $3", QUEUE,
            namespace, cluster)
        if bound >= min(NODES * GPUS_PER_NODE, TOLERATING) and parked == NOT_TOLERATING:
            return placed
        if time.monotonic() > deadline:
            raise TimeoutError(f"GPU pool not settled after {within:.0f}s: {placed}")
        await asyncio.sleep(0.5)
