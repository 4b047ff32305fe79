"""Pods the autoscaler disrupts come back through their controllers, gated again, and keep their
place in line (issue 35, item 5); a tenant evicting their own pod gains none.

Every lockgate service runs as a process on the real stack, over its autoscaled cluster-c with
real Karpenter (devstack.karpenter). A NodePool of one 8-cpu node at most; a Deployment of two
3-cpu pods, released for growth: Karpenter makes the node and they run. A later pod of the same
queue (3 cpu) then waits: the pool is at its limit. Deleting the node's NodeClaim makes
Karpenter disrupt the node (the `karpenter.sh/disrupted` taint, then evictions); the
ReplicaSet's replacements are gated again, keep the evicted pods' place (before the later pod's),
and are released for the new node before the later pod, which does not fit beside them.

Then the attack: a tenant (a ServiceAccount of the run's namespace, allowed to read, delete and
evict its pods) evicts one of its running pods. Its replacement keeps no place: it is behind
the later pod, which takes the room freed.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.karpenter import (
    AUTOSCALED_CLUSTER,
    EIGHT_CPU_TYPES,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    NODE_CLAIMS,
    apply_node_class,
    apply_node_pool,
    autoscaled_cluster,
    list_node_claims,
    node_pool,
    node_pool_ready,
    read_node_pool,
)
from helpers.pods import a_deployment, a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate_adapters.kube import api_client

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

POD_CPU = "3"  # two fit the 8-cpu node (7.9 allocatable), three do not
GROW_SECONDS = 90.0
SETTLE_SECONDS = 8.0  # several scheduling rounds: long enough for a wrong release to show
TENANT_ROLE = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
]


@pytest.fixture
async def karpenter(autoscaled_stack: StackInfo) -> AsyncIterator[tuple[client.ApiClient, str]]:
    """The autoscaled cluster, owned by this test, with a NodePool of one 8-cpu node at most
    that Karpenter does not consolidate during the test."""
    tag = uuid.uuid4().hex[:6]
    async with autoscaled_cluster(autoscaled_stack) as api:
        await apply_node_class(api, f"kwok-{tag}")
        pool = f"pool-{tag}"
        await apply_node_pool(api, node_pool(pool, node_class=f"kwok-{tag}", cpu_limit="8",
                                             instance_types=EIGHT_CPU_TYPES,
                                             consolidation_policy="WhenEmpty",
                                             consolidate_after="10m"))
        await eventually(lambda: node_pool_ready(api, pool), within=60, every=0.5,
                         what=f"NodePool {pool} Ready")
        yield api, pool


@pytest.fixture
async def run(karpenter: tuple[client.ApiClient, str], autoscaled_stack: StackInfo,
              tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LockgateRun]:
    _, pool = karpenter
    # The pool's nodes are c-8x-amd64-linux (8 cpu, 16Gi), less kwok's 100m: its requirements
    # name the instance type only, so lockgate is told the size (docs/autoscaling.md).
    async with lockgate_run(autoscaled_stack, tmp_path_factory.mktemp("runs"),
                            name="disrupted", clusters=(AUTOSCALED_CLUSTER,), env={
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "0.5",
            "LOCKGATE_SCHEDULER_GROWTH_INSTANCE_SHAPES": json.dumps(
                {pool: {"cpu": "8", "memory": "16Gi"}}),
            "LOCKGATE_SCHEDULER_GROWTH_NODE_OVERHEAD": json.dumps({"cpu": "100m"})}) as running:
        alias = running.alias(AUTOSCALED_CLUSTER)
        await running.create_namespace(alias)
        await running.create_queues([QUEUE], namespaces=[running.namespace])
        yield running


QUEUE = f"web-{uuid.uuid4().hex[:6]}"


def gated(pod: client.V1Pod) -> bool:
    return bool(pod.spec.scheduling_gates)


async def web_pods(run: LockgateRun, alias: str) -> dict[str, client.V1Pod]:
    """The Deployment's pods that are not being deleted, by uid."""
    found = await run.core(alias).list_namespaced_pod(run.namespace, label_selector="app=web")
    return {pod.metadata.uid: pod for pod in found.items
            if pod.metadata.deletion_timestamp is None}


async def job_row(run: LockgateRun, alias: str, uid: str) -> asyncpg.Record:
    async def stored() -> asyncpg.Record | None:
        return await run.job(uid, alias=alias)

    row: asyncpg.Record = await eventually(stored, within=60, every=0.3,
                                           what=f"pod {uid} stored by queue-store")
    return row


async def running_pods(run: LockgateRun, alias: str, count: int,
                       not_uids: set[str]) -> dict[str, client.V1Pod]:
    """Once `count` of the Deployment's pods (none of `not_uids`) run: those pods."""
    async def probe() -> dict[str, client.V1Pod] | None:
        pods = {uid: pod for uid, pod in (await web_pods(run, alias)).items()
                if uid not in not_uids}
        running = {uid: pod for uid, pod in pods.items()
                   if pod.status.phase == "Running" and not gated(pod)}
        return running if len(running) == count else None

    try:
        pods: dict[str, client.V1Pod] = await eventually(
            probe, within=GROW_SECONDS, every=1.0,
            what=f"{count} new pods of the Deployment running")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{await diagnosis(run, alias)}") from None
    return pods


async def diagnosis(run: LockgateRun, alias: str) -> str:
    """What lockgate knew of the cluster's jobs and growth, and its services' logs."""
    jobs = await run.pool.fetch("SELECT name, state, last_reason, node_name, queued_since,"
                                " created_at, released_at FROM jobs"
                                " WHERE cluster = $1 ORDER BY created_at", alias)
    nodes = await run.pool.fetch("SELECT node, present, schedulable, taints, allocatable"
                                 " FROM cluster_nodes WHERE cluster = $1", alias)
    growth = await run.pool.fetch("SELECT * FROM cluster_growth")
    pods = await run.core(alias).list_namespaced_pod(run.namespace)
    return "\n".join([
        "jobs: " + "; ".join(str(dict(row)) for row in jobs),
        "growth: " + "; ".join(str(dict(row)) for row in growth),
        "nodes: " + "; ".join(str(dict(row)) for row in nodes),
        "pods: " + "; ".join(f"{p.metadata.name} {p.status.phase} node={p.spec.node_name} "
                             f"gates={p.spec.scheduling_gates}" for p in pods.items),
        run.logs(40)])


async def still_gated(run: LockgateRun, alias: str, name: str, why: str) -> None:
    """The pod stays gated through several rounds."""
    for _ in range(int(SETTLE_SECONDS / 0.5)):
        pod = await run.pod(name, alias=alias)
        if pod is None or not gated(pod):
            raise AssertionError(f"{why}\n{await diagnosis(run, alias)}")
        await asyncio.sleep(0.5)


async def test_disrupted_pods_keep_their_place_and_an_owners_eviction_gains_none(
        run: LockgateRun, karpenter: tuple[client.ApiClient, str], tmp_path: Path) -> None:
    api, pool = karpenter
    alias = run.alias(AUTOSCALED_CLUSTER)
    template = (a_pod("web").in_queue(QUEUE)
                .requesting(cpu=POD_CPU, memory="256Mi"))
    await run.apps(alias).create_namespaced_deployment(
        run.namespace, a_deployment("web").with_replicas(2).of(template).manifest())

    # Released for growth: Karpenter makes the node, both run.
    originals = await running_pods(run, alias, 2, set())
    original_rows = {uid: await job_row(run, alias, uid) for uid in originals}
    original_since = {row["queued_since"] or row["created_at"] for row in original_rows.values()}
    (claim,) = [c["metadata"]["name"] for c in await list_node_claims(api, pool)]

    async def pool_counts_its_node() -> bool:
        # The pool's status.resources lags its node; until it counts it, the pool looks as if it
        # had room for another node (that is lockgate's headroom), and the later pod would go.
        status = (await read_node_pool(api, pool)).get("status") or {}
        return str((status.get("resources") or {}).get("cpu", "0")) == "8"

    await eventually(pool_counts_its_node, within=60, every=0.5,
                     what=f"NodePool {pool}'s status to count its 8-cpu node")

    # A later pod of the same queue waits: the pool is at its limit.
    await asyncio.sleep(1.1)  # creationTimestamps are whole seconds
    later = await run.create_pod(template.named("later").manifest(), alias=alias)
    later_row = await job_row(run, alias, later.metadata.uid)
    assert later_row["state"] == "queued", later_row
    assert max(original_since) < later_row["created_at"]
    await still_gated(run, alias, "later",
                      "the later pod was released although the pool was at its limit")

    # Karpenter disrupts the node: taint, evictions. The ReplicaSet's replacements are gated.
    await client.CustomObjectsApi(api).delete_cluster_custom_object(
        KARPENTER_GROUP, KARPENTER_VERSION, NODE_CLAIMS, claim)

    async def two_replacements() -> dict[str, client.V1Pod] | None:
        pods = {uid: pod for uid, pod in (await web_pods(run, alias)).items()
                if uid not in originals}
        return pods if len(pods) == 2 else None

    replacements = await eventually(two_replacements, within=GROW_SECONDS, every=0.5,
                                    what="the ReplicaSet's two replacements")
    replacement_rows = {uid: await job_row(run, alias, uid) for uid in replacements}
    originals_by_name = {pod.metadata.name for pod in originals.values()}
    for uid, row in replacement_rows.items():
        assert row["kept_place_of"] in originals_by_name, (
            f"replacement {replacements[uid].metadata.name} kept no disrupted pod's place: "
            f"{dict(row)}")
        assert row["queued_since"] in original_since, dict(row)
        assert row["queued_since"] < later_row["created_at"], (
            "the replacement is not ahead of the later pod")
        assert row["created_at"] > later_row["created_at"]  # created after it nonetheless
    assert len({row["kept_place_of"] for row in replacement_rows.values()}) == 2, (
        "two replacements took one place")
    for uid in original_rows:
        stored = await run.job(uid, alias=alias)
        assert stored is not None and stored["state"] == "deleted", dict(stored or {})

    # Room for two again (a new node): the replacements go before the later pod.
    now_running = await running_pods(run, alias, 2, set(originals))
    assert set(now_running) == set(replacements), (
        f"other pods than the replacements run: {sorted(now_running)}")
    released_replacements = [(await job_row(run, alias, uid))["released_at"]
                             for uid in replacements]
    assert None not in released_replacements
    later_row = await job_row(run, alias, later.metadata.uid)
    assert (later_row["released_at"] is None
            or later_row["released_at"] >= max(released_replacements)), (
        f"the later pod went before the disrupted pods' replacements: later "
        f"{later_row['released_at']}, replacements {released_replacements}\n"
        f"{await diagnosis(run, alias)}")

    # The attack: the tenant evicts its own running pod (DisruptionTarget set by the Eviction
    # API, as Karpenter's), on a node nobody disrupts. Its replacement keeps no place.
    kubeconfig = await run.identity_kubeconfig("tenant", TENANT_ROLE, tmp_path / "tenant",
                                               alias=alias)
    tenant = await api_client(kubeconfig)
    try:
        victim = next(iter(now_running.values()))
        await client.CoreV1Api(tenant).create_namespaced_pod_eviction(
            victim.metadata.name, run.namespace,
            client.V1Eviction(metadata=client.V1ObjectMeta(name=victim.metadata.name,
                                                           namespace=run.namespace)))
    finally:
        await tenant.close()
    known = set(originals) | set(replacements)

    async def new_replacement() -> str | None:
        return next((uid for uid in await web_pods(run, alias) if uid not in known), None)

    retry_uid = await eventually(new_replacement, within=60, every=0.5,
                                        what="the ReplicaSet's replacement of the evicted pod")
    retry_row = await job_row(run, alias, retry_uid)
    assert retry_row["kept_place_of"] == "" and retry_row["queued_since"] is None, (
        f"the owner's eviction gained a place: {dict(retry_row)}")
    victim_row = await run.job(victim.metadata.uid, alias=alias)
    assert victim_row is not None
    places: list[Any] = await run.pool.fetch(
        "SELECT * FROM left_places WHERE cluster = $1 AND uid = $2", alias, victim.metadata.uid)
    assert not places, f"the evicted pod left a place: {[dict(p) for p in places]}"

    assert retry_row["created_at"] > later_row["created_at"]

    # The room it freed goes to the later pod (if it has not gone yet), ahead of the eviction's
    # replacement: it is behind the later pod in line.
    async def later_released() -> asyncpg.Record | None:
        row = await run.job(later.metadata.uid, alias=alias)
        return row if row is not None and row["released_at"] is not None else None

    later_row = await eventually(later_released, within=GROW_SECONDS, every=0.5,
                                 what="the later pod released")
    retry_row = await job_row(run, alias, retry_uid)
    assert (retry_row["released_at"] is None
            or retry_row["released_at"] >= later_row["released_at"]), (
        f"the evicted pod's replacement went before the later pod: {dict(retry_row)}\n"
        f"{await diagnosis(run, alias)}")
