"""`make demo`, second part: a gang and a preemption, on cluster-a, with a lockgate of their own.

Why separate: the main demo judges fairness without preemption; this part turns preemption on,
so it runs after the main part with its own services, database and queues, watching cluster-a
under an alias of its own (so the pool is that one cluster and nobody else's rows count).

- gang: a pod group of 4 whose members arrive one by one; the first 3 wait (the group is not
  complete), and all 4 are released in one round once the fourth exists;
- preemption: queue "svc" fills what room is left with a Deployment of preemptible pods; queue
  "batch", same weight, arrives with pods that wait; svc is evicted down to its fair share (each
  eviction recorded in Postgres, with a LockgatePreempted Event on the pod), batch's pods run, and
  over a further 10 s nothing is evicted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.isolation import keep_only_clusters
from devstack.launcher import Lockgate
from devstack.ports import ServicePorts
from devstack.stack import StackInfo
from lockgate.groups import GROUP_LABEL, GROUP_SIZE_KEY
from lockgate.labels import MANAGED_NAMESPACE_LABEL, PREEMPTIBLE_LABEL, QUEUE_LABEL
from lockgate.resources import Resources
from lockgate_adapters.kube import api_client
from lockgate_adapters.postgres import connect_pool, create_database, migrate
from lockgate_adapters.settings import RetryPolicy

POD_CPU = "8"
GANG_SIZE = 4
QUEUES = ("gang", "svc", "batch")
SERVICES = ("queue-store", "admission-webhook", "cluster-watcher", "ungater", "fair-scheduler")


@dataclass
class SchedulingDemo:
    """What the summary says about the gang and the preemption."""

    gang_waited: float | None = None  # seconds the first members waited for the last one
    gang_rounds: int | None = None  # rounds the members' releases took (1: together)
    slots: int = 0  # pods of POD_CPU the cluster had room for
    evicted: list[str] = field(default_factory=list)
    evicted_later: int = 0  # evictions in the quiet window after the first ones
    events: int = 0  # LockgatePreempted Events seen
    running: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def print_summary(self) -> None:
        print("\n=== gang and preemption (cluster-a, preemption on) ===")
        if self.gang_rounds is not None:
            print(f"  gang: a pod group of {GANG_SIZE}; its first members waited "
                  f"{self.gang_waited or 0:.0f}s for the last, then all {GANG_SIZE} were "
                  f"released in {self.gang_rounds} round(s)")
        print(f"  preemption: svc filled {self.slots} slots of {POD_CPU} cpu with preemptible "
              f"pods; batch (same weight) arrived; {len(self.evicted)} svc pods evicted "
              f"(recorded in Postgres, {self.events} LockgatePreempted Events), then running "
              f"svc={self.running.get('svc', 0)} batch={self.running.get('batch', 0)}; "
              f"{self.evicted_later} evicted in the next 10s")
        for failure in self.failures:
            print(f"  FAILED: {failure}")


async def run_and_summarise(info: StackInfo) -> list[str]:
    """Run both, print their summary section; returns what failed."""
    result = await run(info)
    result.print_summary()
    return result.failures


async def run(info: StackInfo) -> SchedulingDemo:
    result = SchedulingDemo()
    tag = uuid.uuid4().hex[:5]
    alias = f"demo-{tag}-sched-a"
    namespace = f"demo-{tag}-sched"
    dsn = await create_database(info.postgres_dsn, "lockgate_demo_scheduling", replace=True)
    await _keep_only(dsn, alias)
    lockgate = Lockgate.for_stack(
        info, clusters={alias: "cluster-a"}, postgres_dsn=dsn, run_id=f"demo-{tag}-sched",
        ports=ServicePorts.free(),
        extra_env={"LOCKGATE_SCHEDULER_PREEMPTION_ENABLED": "true",
                   "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1"})
    api = await api_client(info.kubeconfigs["cluster-a"])
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        print("gang and preemption: starting a lockgate of their own, preemption on",
              flush=True)
        await lockgate.start(only=SERVICES)
        binding = [{"cluster": "*", "names": [namespace]}]
        async with aiohttp.ClientSession(headers=lockgate.admin_headers) as session:
            for name in QUEUES:
                async with session.post(f"{lockgate.admin_url}/api/v1/queues", json={
                        "name": name, "namespaces": binding}) as response:
                    if response.status not in (200, 201):
                        raise RuntimeError(f"queue {name}: {await response.text()}")
        await lockgate.wait_for_queues({name: {"cordoned": False, "namespaces": binding}
                                        for name in QUEUES})
        await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": namespace,
            "labels": {MANAGED_NAMESPACE_LABEL: "true", **lockgate.run_namespace_labels}}})
        await _wait_for_service_account(core, namespace)
        await _gang(core, pool, namespace, result)
        await _preemption(core, apps, pool, namespace, result)
    except (RuntimeError, TimeoutError, ApiException, asyncpg.PostgresError) as error:
        result.failures.append(f"gang and preemption: {type(error).__name__}: {error}")
    finally:
        with contextlib.suppress(ApiException):
            await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            await core.delete_namespace(namespace)
        codes = await lockgate.stop()
        result.failures += [f"{name} did not stop gracefully ({code})"
                            for name, code in codes.items() if code not in (0, None)]
        await pool.close()
        await api.close()
    return result


async def _gang(core: client.CoreV1Api, pool: asyncpg.Pool, namespace: str,
                result: SchedulingDemo) -> None:
    first = time.monotonic()
    for i in range(GANG_SIZE):
        if i == GANG_SIZE - 1:
            await _until(lambda: _count(pool, "SELECT count(*) FROM jobs WHERE queue = 'gang'"),
                         GANG_SIZE - 1, 60, "the first members to be queued")
            await asyncio.sleep(3)  # a few rounds look at the incomplete group
            waiting = await _count(pool, "SELECT count(*) FROM jobs WHERE queue = 'gang'"
                                         " AND state <> 'queued'")
            if waiting:
                result.failures.append(f"gang: {waiting} members released before all existed")
        await core.create_namespaced_pod(namespace, _pod(
            f"gang-{i}", "gang", labels={GROUP_LABEL: "demo"},
            annotations={GROUP_SIZE_KEY: str(GANG_SIZE)}))
    await _until(lambda: _count(pool, "SELECT count(*) FROM jobs WHERE queue = 'gang'"
                                      " AND released_at IS NOT NULL"),
                 GANG_SIZE, 60, "the gang to be released")
    result.gang_waited = time.monotonic() - first
    result.gang_rounds = await _count(
        pool, "SELECT count(DISTINCT released_at) FROM jobs WHERE queue = 'gang'")
    if result.gang_rounds != 1:
        result.failures.append(f"gang: released over {result.gang_rounds} rounds, not one")
    await core.delete_collection_namespaced_pod(namespace, label_selector=f"{GROUP_LABEL}=demo",
                                                grace_period_seconds=0)
    await _until(lambda: _count(pool, "SELECT count(*) FROM jobs WHERE queue = 'gang'"
                                      " AND state = 'deleted'"), GANG_SIZE, 60,
                 "the gang's pods to be gone")


async def _preemption(core: client.CoreV1Api, apps: client.AppsV1Api, pool: asyncpg.Pool,
                      namespace: str, result: SchedulingDemo) -> None:
    result.slots = await _slots(pool)
    if result.slots < 2:
        raise RuntimeError(f"cluster-a has room for {result.slots} pods of {POD_CPU} cpu; "
                           "preemption needs at least 2")
    template = _pod("svc", "svc", labels={"app": "svc", PREEMPTIBLE_LABEL: "true"})
    template["spec"].pop("restartPolicy")
    await apps.create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "svc"},
        "spec": {"replicas": result.slots, "selector": {"matchLabels": {"app": "svc"}},
                 "template": {"metadata": {"labels": template["metadata"]["labels"]},
                              "spec": template["spec"]}}})
    running = "SELECT count(*) FROM jobs WHERE queue = $1 AND state IN ('bound', 'running')"
    await _until(lambda: _count(pool, running, "svc"), result.slots, 120,
                 "svc to fill the cluster")
    for i in range(result.slots):
        await core.create_namespaced_pod(namespace, _pod(f"batch-{i}", "batch"))
    half = result.slots // 2
    await _until(lambda: _count(pool, running, "batch"), half, 120,
                 "batch to get its fair share")
    result.evicted = [r["name"] for r in await pool.fetch(
        "SELECT name FROM evictions WHERE kind = 'preempted' ORDER BY decided_at")]
    await asyncio.sleep(10)
    result.evicted_later = await _count(pool, "SELECT count(*) FROM evictions") - len(
        result.evicted)
    result.running = {q: await _count(pool, running, q) for q in ("svc", "batch")}
    events = await core.list_namespaced_event(namespace)
    result.events = sum(1 for e in events.items if e.reason == "LockgatePreempted")
    if not result.evicted or result.evicted_later:
        result.failures.append(f"preemption: {len(result.evicted)} evicted, then "
                               f"{result.evicted_later} more")


def _pod(name: str, queue: str, *, labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue, **(labels or {})},
                     "annotations": annotations or {}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.invalid/demo:1",
                            "resources": {"requests": {"cpu": POD_CPU, "memory": "1Gi"}}}],
        },
    }


async def _slots(pool: asyncpg.Pool) -> int:
    """Pods of POD_CPU the watched cluster has room for, node by node."""
    rows: list[asyncpg.Record] = []
    deadline = time.monotonic() + 60
    while not rows and time.monotonic() < deadline:
        rows = await pool.fetch("SELECT allocatable, unmanaged_usage FROM cluster_nodes"
                                " WHERE present AND schedulable")
        await asyncio.sleep(0.5)
    size = Resources.from_kubernetes({"cpu": POD_CPU}).as_dict()["cpu"]
    return sum(max(0, (_json(r["allocatable"]).get("cpu", 0)
                       - _json(r["unmanaged_usage"]).get("cpu", 0)) // size) for r in rows)


def _json(value: Any) -> dict[str, int]:
    return dict(json.loads(value) if isinstance(value, str) else value)


async def _count(pool: asyncpg.Pool, query: str, *args: object) -> int:
    return int(await pool.fetchval(query, *args))


async def _until(probe: Any, want: int, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while (got := await probe()) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {got} of {want} after {within:.0f}s")
        await asyncio.sleep(0.5)


async def _wait_for_service_account(core: client.CoreV1Api, namespace: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await core.read_namespaced_service_account("default", namespace)
            return
        except ApiException as error:
            if error.status != 404 or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


async def _keep_only(dsn: str, alias: str) -> None:
    """Migrate, then drop rows of clusters other than ours (other runs' watchers of the same
    clusters publish to the same topics)."""
    migrating = await connect_pool(dsn, policy=RetryPolicy(), min_size=1, max_size=1)
    try:
        await migrate(migrating)
    finally:
        await migrating.close()
    await keep_only_clusters(dsn, [alias])
