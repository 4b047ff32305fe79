"""Release path benchmarks on the local stack: latency and sustained throughput.

- release latency: pod creation (client side, before the create call) to the moment a watch sees
  lockgate's gate removed, one pod at a time with room to spare; p50 and p99.
- burst latency: the same, for 1,000 pods created at once (release_latency_burst).
- latency while releasing: a queue with nothing running sends a pod every 0.1 s while the
  sustained release below runs (release_latency_while_releasing).
- sustained release throughput: N gated pods over Q queues and both clusters are created while
  the fair-scheduler is stopped; then it starts and we time how fast the gates come off.
  Reported as a ratio to the raw rate at which a tight kubernetes-asyncio client removes the
  same gate from pods on the same apiservers, measured in the same run.

Prints one JSON object per measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from collections.abc import Iterable
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import devstack
from devstack.demo import fresh_database
from devstack.launcher import Lockgate
from devstack.pod_creation import create_pod_as_a_controller
from devstack.ports import ServicePorts
from lockgate.labels import (
    JOBSET_LABEL,
    MANAGED_NAMESPACE_LABEL,
    QUEUE_LABEL,
    SCHEDULING_GATE,
)
from lockgate_adapters.kube import api_client
from stack_counts import difference, stack_counts

BENCH_NODE_LABEL = "lockgate.io/bench-node"
# How long a pod is created again after the webhook's 503, as a controller would.
RETRY_503_SECONDS = 120.0


COMPONENTS = ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "kwok",
              "kafka.Kafka", "postgres", "queue_store", "cluster_watcher", "fair_scheduler",
              "ungater", "admission_webhook", "bench_release.py")


def cpu_seconds_by_component() -> dict[str, float]:
    """CPU time used so far by each part of the stack and of lockgate, from /proc.

    With LOCKGATE_STACK_DIR set, only that stack's processes count: those whose command line,
    or an ancestor's, names the stack's directory (Go binaries, Kafka, the postmaster and its
    backends), and this process's descendants (the services it starts). Another stack on the
    same machine is not counted."""
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    stack_dir = os.environ.get("LOCKGATE_STACK_DIR", "")
    processes: dict[str, tuple[str, str, list[str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        processes[entry] = (cmdline, fields[1], fields)

    def ours(pid: str) -> bool:
        seen = 0
        while pid in processes and seen < 64:
            cmdline, parent, _ = processes[pid]
            if stack_dir in cmdline or pid == str(os.getpid()):
                return True
            pid, seen = parent, seen + 1
        return False

    for entry, (cmdline, _parent, fields) in processes.items():
        if stack_dir and not ours(entry):
            continue
        # Go binaries by their own name (their cache path names other components too);
        # Python services and Kafka by their module or main class.
        program = cmdline.split(" ", 1)[0].rsplit("/", 1)[-1].rstrip(":")
        name = program if program in COMPONENTS else next(
            (c for c in COMPONENTS if f" {c}" in cmdline or f"/{c}" in cmdline), None)
        if name is None:
            continue
        # utime and stime are fields 14 and 15 of /proc/<pid>/stat (1-based).
        used = (int(fields[11]) + int(fields[12])) / ticks
        totals[name] = totals.get(name, 0.0) + used
    return totals


def cpu_breakdown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after.get(name, 0.0) - before.get(name, 0.0), 1)
            for name in sorted(after, key=lambda n: before.get(n, 0.0) - after[n])}


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


async def gather_bounded(coroutines: Iterable[Any], limit: int) -> list[Any]:
    semaphore = asyncio.Semaphore(limit)

    async def run(coroutine: Any) -> Any:
        async with semaphore:
            return await coroutine

    return await asyncio.gather(*(run(c) for c in coroutines))


async def add_bench_nodes(api: client.ApiClient, cluster: str, count: int) -> list[str]:
    """Extra kwok nodes with room for thousands of small pods, removed afterwards."""
    core = client.CoreV1Api(api)
    names = [f"{cluster}-bench-{i}" for i in range(count)]
    capacity = {"cpu": "1000", "memory": "4Ti", "pods": "500"}

    async def create(name: str) -> None:
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"type": "kwok", BENCH_NODE_LABEL: "true"},
                         "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "status": {"capacity": capacity, "allocatable": capacity},
        }
        try:
            await core.create_node(body)
        except ApiException as error:
            if error.status != 409:
                raise

    await gather_bounded((create(n) for n in names), 16)
    return names


async def remove_bench_nodes(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await core.delete_collection_node(label_selector=f"{BENCH_NODE_LABEL}=true")


def pod_body(name: str, *, gated: bool, queue: str | None = None,
             jobset: str = "bench") -> dict[str, Any]:
    labels = {"app": "lockgate-bench"}
    if queue is not None:
        labels[QUEUE_LABEL] = queue
        labels[JOBSET_LABEL] = jobset
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.invalid/bench:1",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
        "tolerations": [{"operator": "Exists"}],
        "terminationGracePeriodSeconds": 0,
    }
    if gated:
        spec["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": spec}


async def create_namespace(api: client.ApiClient, name: str, labels: dict[str, str]) -> None:
    await client.CoreV1Api(api).create_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    )


async def delete_namespace(api: client.ApiClient, name: str) -> None:
    try:
        await client.CoreV1Api(api).delete_namespace(name)
    except ApiException as error:
        if error.status != 404:
            raise


async def until_namespace_gone(api: client.ApiClient, name: str, within: float = 300) -> None:
    """Wait for a deleted namespace's pods to be gone: the next phase must not share the
    machine with deleting a phase's thousands of pods."""
    core = client.CoreV1Api(api)
    deadline = time.perf_counter() + within
    while time.perf_counter() < deadline:
        try:
            await core.read_namespace(name)
        except ApiException as error:
            if error.status == 404:
                return
            raise
        await asyncio.sleep(0.5)
    raise RuntimeError(f"namespace {name} still there {within:.0f} s after its deletion")


async def raw_patch_rate(apis: dict[str, client.ApiClient], pods_per_cluster: int,
                         concurrency: int) -> dict[str, Any]:
    """The apiservers' own limit: a tight client removing the gate from pre-created pods."""
    namespace = f"bench-raw-{uuid.uuid4().hex[:6]}"
    for api in apis.values():
        await create_namespace(api, namespace, {})
    try:
        for api in apis.values():
            core = client.CoreV1Api(api)
            await gather_bounded(
                (core.create_namespaced_pod(namespace, pod_body(f"raw-{i}", gated=True))
                 for i in range(pods_per_cluster)), concurrency)
        patch = [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": SCHEDULING_GATE},
                 {"op": "remove", "path": "/spec/schedulingGates/0"}]
        started = time.perf_counter()
        cpu_before = cpu_seconds_by_component()

        async def ungate(api: client.ApiClient, name: str) -> None:
            await client.CoreV1Api(api).patch_namespaced_pod(
                name, namespace, patch, _content_type="application/json-patch+json")

        await gather_bounded(
            (ungate(api, f"raw-{i}") for api in apis.values() for i in range(pods_per_cluster)),
            concurrency * len(apis))
        elapsed = time.perf_counter() - started
        cpu_used = cpu_breakdown(cpu_before, cpu_seconds_by_component())
    finally:
        for api in apis.values():
            await delete_namespace(api, namespace)
    for api in apis.values():
        await until_namespace_gone(api, namespace)
    total = pods_per_cluster * len(apis)
    return {"name": "raw_patch_rate", "pods": total, "concurrency": concurrency,
            "seconds": round(elapsed, 3), "pods_per_second": round(total / elapsed, 1),
            "cpu_seconds_by_component": cpu_used}


class GateWatcher:
    """Records when each pod in a namespace was first seen without lockgate's gate."""

    def __init__(self) -> None:
        self.ungated_at: dict[str, float] = {}
        self.changed = asyncio.Event()

    async def run(self, api: client.ApiClient, namespace: str, cluster: str) -> None:
        # Raw watch lines, not client models: the measuring must not steal the CPU it measures.
        core = client.CoreV1Api(api)
        resource_version = ""
        while True:
            response = await core.list_namespaced_pod(
                namespace, watch=True, resource_version=resource_version, timeout_seconds=300,
                allow_watch_bookmarks=False, _preload_content=False)
            try:
                async for line in response.content:
                    event = json.loads(line)
                    pod = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        resource_version = ""  # expired: relist from now
                        break
                    metadata = pod.get("metadata") or {}
                    resource_version = metadata.get("resourceVersion", resource_version)
                    gates = {g.get("name") for g in (pod.get("spec") or {}).get(
                        "schedulingGates") or ()}
                    key = f"{cluster}/{metadata.get('name')}"
                    if SCHEDULING_GATE not in gates and key not in self.ungated_at \
                            and event.get("type") in ("ADDED", "MODIFIED"):
                        self.ungated_at[key] = time.perf_counter()
                        self.changed.set()
            finally:
                response.release()

    async def wait_for(self, count: int, deadline: float) -> bool:
        while len(self.ungated_at) < count:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 1.0))
        return True


def latency_record(name: str, watcher: GateWatcher, created_at: dict[str, float],
                   complete: bool) -> dict[str, Any]:
    """p50 and p99 from each pod's creation (client side) to its gate seen gone."""
    latencies = sorted(watcher.ungated_at[k] - t for k, t in created_at.items()
                       if k in watcher.ungated_at)
    return {
        "name": name, "pods": len(created_at), "complete": complete,
        "p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None,
        "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1)
        if latencies else None,
    }


async def create_queues(admin_url: str, names: Iterable[str], namespace: str, *,
                        headers: dict[str, str]) -> None:
    import aiohttp

    async with aiohttp.ClientSession(headers=headers) as session:
        for name in names:
            async with session.post(f"{admin_url}/api/v1/queues", json={
                    "name": name, "priority_factor": 1.0,
                    "namespaces": [{"cluster": "*", "names": [namespace]}]}) as response:
                if response.status not in (200, 201, 409):
                    raise RuntimeError(f"creating queue {name}: {response.status} "
                                       f"{await response.text()}")


async def lockgate_release(apis: dict[str, client.ApiClient], lockgate: Lockgate, *,
                           pods_per_cluster: int, queues: int, latency_pods: int,
                           burst_pods: int, probe_pods: int, concurrency: int,
                           deadline_seconds: float) -> list[dict[str, Any]]:
    run = uuid.uuid4().hex[:6]
    queue_names = [f"bench-{run}-{i}" for i in range(queues)]
    probe_queue = f"bench-{run}-probe"
    namespace = f"bench-lg-{run}"
    await create_queues(lockgate.admin_url, [*queue_names, probe_queue], namespace,
                        headers=lockgate.admin_headers)
    await lockgate.wait_for_queues({q: {"cordoned": False, "namespaces": [
        {"cluster": "*", "names": [namespace]}]} for q in [*queue_names, probe_queue]})
    for api in apis.values():
        await create_namespace(api, namespace, {MANAGED_NAMESPACE_LABEL: "true",
                                                QUEUE_LABEL: queue_names[0],
                                                **lockgate.run_namespace_labels})
    watcher = GateWatcher()
    watch_tasks = [asyncio.create_task(watcher.run(api, namespace, cluster))
                   for cluster, api in apis.items()]
    results: list[dict[str, Any]] = []
    try:
        # Latency with room to spare: one pod at a time, all services running.
        created_at: dict[str, float] = {}
        clusters = list(apis)
        for i in range(latency_pods):
            cluster = clusters[i % len(clusters)]
            name = f"lat-{i}"
            body = pod_body(name, gated=False, queue=queue_names[i % queues])
            created_at[f"{cluster}/{name}"] = time.perf_counter()
            await client.CoreV1Api(apis[cluster]).create_namespaced_pod(namespace, body)
            await asyncio.sleep(0.05)
        ok = await watcher.wait_for(latency_pods, time.perf_counter() + 120)
        results.append(latency_record("release_latency", watcher, created_at, ok))

        # A burst: burst_pods created at once (bounded only by the client's concurrency),
        # room to spare, the scheduler running.
        burst_at: dict[str, float] = {}

        async def create_burst_pod(i: int) -> None:
            cluster = clusters[i % len(clusters)]
            name = f"burst-{i}"
            burst_at[f"{cluster}/{name}"] = time.perf_counter()
            burst_retries[0] += await create_pod_as_a_controller(
                client.CoreV1Api(apis[cluster]), namespace,
                pod_body(name, gated=False, queue=queue_names[i % queues]),
                retry_seconds=RETRY_503_SECONDS)

        burst_retries = [0]
        await gather_bounded((create_burst_pod(i) for i in range(burst_pods)), concurrency)
        ok = await watcher.wait_for(latency_pods + burst_pods, time.perf_counter() + 300)
        results.append({**latency_record("release_latency_burst", watcher, burst_at, ok),
                        "webhook_retries": burst_retries[0]})

        # Sustained throughput: build a backlog with the scheduler stopped, then release it.
        for name in ("fair-scheduler-standby", "fair-scheduler"):
            if name in lockgate.processes:
                await lockgate.processes[name].stop()
        before = len(watcher.ungated_at)
        started_creating = time.perf_counter()
        for api in apis.values():
            core = client.CoreV1Api(api)
            await gather_bounded(
                (core.create_namespaced_pod(
                    namespace, pod_body(f"tp-{i}", gated=False, queue=queue_names[i % queues]))
                 for i in range(pods_per_cluster)), concurrency)
        creation_seconds = time.perf_counter() - started_creating
        total = pods_per_cluster * len(apis)
        # Let ingest catch up so the scheduler sees the whole backlog at once.
        await wait_for_backlog(lockgate.postgres_dsn, queue_names, total,
                               time.perf_counter() + deadline_seconds)
        started = time.perf_counter()
        counts_before = await stack_counts(lockgate.kafka_bootstrap, lockgate.postgres_dsn)
        cpu_before = cpu_seconds_by_component()
        await lockgate.start(only=["fair-scheduler"])
        # Meanwhile, a pod of a queue with nothing running arrives every 0.1 s: how long a
        # newcomer waits while the backlog is being released (fair share puts it first).
        probe_at: dict[str, float] = {}
        probe_retries = [0]

        async def probe() -> None:
            for i in range(probe_pods):
                cluster = clusters[i % len(clusters)]
                name = f"probe-{i}"
                probe_at[f"{cluster}/{name}"] = time.perf_counter()
                probe_retries[0] += await create_pod_as_a_controller(
                    client.CoreV1Api(apis[cluster]), namespace,
                    pod_body(name, gated=False, queue=probe_queue),
                    retry_seconds=RETRY_503_SECONDS)
                await asyncio.sleep(0.1)

        probing = asyncio.create_task(probe())
        ok = await watcher.wait_for(before + total, started + deadline_seconds)
        cpu_used = cpu_breakdown(cpu_before, cpu_seconds_by_component())
        counts_window = await stack_counts(lockgate.kafka_bootstrap, lockgate.postgres_dsn)
        await probing
        probes_ok = await watcher.wait_for(before + total + probe_pods,
                                           time.perf_counter() + 120)
        await asyncio.sleep(10)  # the pods' later events (bound, Running) are stored too
        counts_settled = await stack_counts(lockgate.kafka_bootstrap, lockgate.postgres_dsn)
        probe_keys = set(probe_at)
        released = len([k for k in watcher.ungated_at if k not in probe_keys]) - before
        times = sorted(t for k, t in watcher.ungated_at.items() if k not in probe_keys)[before:]
        elapsed = (times[-1] - started) if times else float("nan")
        results.append({
            "name": "release_throughput", "pending_pods": total, "queues": queues,
            "clusters": len(apis), "complete": ok, "released": released,
            "seconds": round(elapsed, 3), "pods_per_second": round(released / elapsed, 1)
            if times else 0.0, "pod_creation_seconds": round(creation_seconds, 1),
            "cpu_seconds_by_component": cpu_used,
            # [count, per pod] of the backlog; "settled": also the later events and the probes.
            "counts_in_window": difference(counts_before, counts_window, total),
            "counts_settled": difference(counts_before, counts_settled, total),
        })
        results.append({**latency_record("release_latency_while_releasing", watcher, probe_at,
                                         probes_ok),
                        "while_releasing_pods": total, "webhook_retries": probe_retries[0],
                        "probes_before_backlog_done": sum(
                            1 for k in probe_at if k in watcher.ungated_at
                            and times and watcher.ungated_at[k] <= times[-1])})
    finally:
        for task in watch_tasks:
            task.cancel()
        await asyncio.gather(*watch_tasks, return_exceptions=True)
        for api in apis.values():
            await delete_namespace(api, namespace)
    return results


async def wait_for_backlog(dsn: str, queues: list[str], count: int, deadline: float) -> None:
    import asyncpg

    connection = await asyncpg.connect(dsn)
    try:
        while time.perf_counter() < deadline:
            queued = await connection.fetchval(
                "SELECT count(*) FROM jobs WHERE queue = ANY($1::text[]) AND state = 'queued'",
                queues)
            if queued >= count:
                return
            await asyncio.sleep(0.5)
        raise RuntimeError(f"only {queued} of {count} pods reached Postgres as queued jobs")
    finally:
        await connection.close()


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods-per-cluster", type=int, default=5000)
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--raw-pods-per-cluster", type=int, default=1000)
    parser.add_argument("--latency-pods", type=int, default=100)
    parser.add_argument("--burst-pods", type=int, default=1000,
                        help="pods created at once, room to spare, scheduler running")
    parser.add_argument("--probe-pods", type=int, default=100,
                        help="a newcomer queue's pods, one every 0.1 s, during the release")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--bench-nodes-per-cluster", type=int, default=24)
    parser.add_argument("--deadline-seconds", type=float, default=900)
    args = parser.parse_args(argv)

    info = devstack.ensure_up()
    apis = {cluster: await api_client(path) for cluster, path in info.kubeconfigs.items()}
    # A database and consumer groups of its own: earlier runs on this stack must not count.
    dsn = await fresh_database(info.postgres_dsn, "lockgate_bench")
    # Ports free now, not the fixed ones: a run on another stack of this machine uses those.
    lockgate = Lockgate.for_stack(info, postgres_dsn=dsn, standby_scheduler=False,
                                  run_id=f"bench-{uuid.uuid4().hex[:5]}",
                                  ports=ServicePorts.free())
    try:
        for cluster, api in apis.items():
            await add_bench_nodes(api, cluster, args.bench_nodes_per_cluster)
        raw = await raw_patch_rate(apis, args.raw_pods_per_cluster, args.concurrency)
        emit(raw)
        await lockgate.start()
        for record in await lockgate_release(
                apis, lockgate, pods_per_cluster=args.pods_per_cluster, queues=args.queues,
                latency_pods=args.latency_pods, burst_pods=args.burst_pods,
                probe_pods=args.probe_pods, concurrency=args.concurrency,
                deadline_seconds=args.deadline_seconds):
            if record["name"] == "release_throughput" and record["pods_per_second"]:
                record["ratio_to_raw_patch_rate"] = round(
                    record["pods_per_second"] / raw["pods_per_second"], 3)
            emit(record)
    finally:
        await lockgate.stop()
        for api in apis.values():
            await remove_bench_nodes(api)
            await api.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
