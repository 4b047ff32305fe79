"""`make demo`: lockgate's main job on the local stack, end to end, in a few minutes.

Starts every service (queue-store, admission-webhook, cluster-watcher, ungater, a leader and a
standby fair-scheduler), creates three queues with weights 1:1:2, and three workloads that ask
for more than both clusters hold together:

- dask: a Dask-like coordinator that creates its worker pods directly through the Kubernetes API
  (as dask-kubernetes does), each worker finishing its task after a while, until all tasks ran;
- etl: a plain Deployment per cluster, whose pods inherit the queue from the Deployment;
- analytics: bare pods in a namespace that carries the queue label.

It shows, live and then in a summary, per queue: weight, fair share, actual share, queued,
released, running. It ends by itself and exits non-zero if anything failed: a service crashed,
a workload did not finish in time, a pod was released twice, or a saturated queue's share was
more than one job away from its fair share.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import devstack
from devstack.launcher import Lockgate
from lockgate.labels import JOBSET_LABEL, MANAGED_NAMESPACE_LABEL, QUEUE_LABEL
from lockgate.resources import Resources
from lockgate_adapters.kube import api_client

QUEUES = {"dask": 1.0, "etl": 1.0, "analytics": 0.5}  # priority factors: weights 1:1:2
POD_CPU, POD_MEMORY = "2", "2Gi"
COMPLETE_ANNOTATION = "lockgate.io/complete-after"


def with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{database}"))


async def fresh_database(dsn: str, database: str) -> str:
    """The demo runs in its own database, recreated each time, so earlier runs don't show."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await connection.execute(f'CREATE DATABASE "{database}"')
    finally:
        await connection.close()
    return with_database(dsn, database)


def worker_pod(name: str, *, labels: dict[str, str] | None = None,
               complete_after: str | None = None) -> dict[str, Any]:
    annotations = {COMPLETE_ANNOTATION: complete_after} if complete_after else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "registry.invalid/demo:1",
                            "resources": {"requests": {"cpu": POD_CPU, "memory": POD_MEMORY}}}],
        },
    }


@dataclass
class DaskLikeCoordinator:
    """Runs `tasks` tasks on at most `max_workers` worker pods, creating pods directly."""

    api: client.ApiClient
    namespace: str
    tasks: int
    max_workers: int
    task_seconds: int
    created: int = 0
    succeeded: int = 0
    errors: list[str] = field(default_factory=list)

    async def run(self, stopping: asyncio.Event) -> None:
        core = client.CoreV1Api(self.api)
        while self.succeeded < self.tasks and not stopping.is_set():
            pods = (await core.list_namespaced_pod(self.namespace)).items
            self.succeeded = sum(1 for p in pods if p.status.phase == "Succeeded")
            active = sum(1 for p in pods if p.status.phase in ("Pending", "Running"))
            while active < self.max_workers and self.created < self.tasks:
                name = f"dask-worker-{self.created}"
                try:
                    await core.create_namespaced_pod(
                        self.namespace,
                        worker_pod(name, labels={"app": "dask-worker"},
                                   complete_after=f"{self.task_seconds}s"))
                except ApiException as error:
                    self.errors.append(f"creating {name}: {error.status} {error.reason}")
                    return
                self.created += 1
                active += 1
            await asyncio.sleep(1)


@dataclass
class Sample:
    at: float
    queues: dict[str, dict[str, Any]]


async def fetch_fairness(session: aiohttp.ClientSession, port: int) -> dict[str, Any] | None:
    try:
        async with session.get(f"http://127.0.0.1:{port}/api/v1/fairness",
                               timeout=aiohttp.ClientTimeout(total=2)) as response:
            if response.status == 200:
                body: dict[str, Any] = await response.json()
                return body
    except (aiohttp.ClientError, TimeoutError):
        return None
    return None


async def job_counts(pool: asyncpg.Pool) -> dict[str, dict[str, int]]:
    rows = await pool.fetch("SELECT queue, state, count(*) AS n FROM jobs GROUP BY queue, state")
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        counts.setdefault(row["queue"], {})[row["state"]] = row["n"]
    return counts


def render(fairness: dict[str, Any] | None, counts: dict[str, dict[str, int]],
           elapsed: float) -> str:
    by_queue = {q["name"]: q for q in (fairness or {}).get("queues", [])}
    lines = [f"t={elapsed:5.0f}s  leader={(fairness or {}).get('leader', '?')}",
             f"  {'queue':<10} {'weight':>6} {'fair':>6} {'adjusted':>8} {'actual':>7} "
             f"{'queued':>7} {'released':>9} {'running':>8} {'done':>6}"]
    for name in QUEUES:
        report = by_queue.get(name, {})
        c = counts.get(name, {})
        released = c.get("released", 0) + c.get("ungated", 0) + c.get("bound", 0)
        lines.append(
            f"  {name:<10} {report.get('weight', 1 / QUEUES[name]):>6.2f} "
            f"{report.get('fair_share', 0):>6.1%} {report.get('adjusted_fair_share', 0):>8.1%} "
            f"{report.get('actual_share', 0):>7.1%} {c.get('queued', 0):>7} {released:>9} "
            f"{c.get('running', 0):>8} {c.get('succeeded', 0):>6}")
    return "\n".join(lines)


def share_deviation_in_jobs(sample: Sample, job_share: float) -> dict[str, float]:
    """How many jobs each saturated queue is away from its adjusted fair share."""
    deviations = {}
    for name, report in sample.queues.items():
        if report.get("queued", 0) > 0:  # only queues that want more are held to their share
            gap = report.get("adjusted_fair_share", 0) - report.get("actual_share", 0)
            deviations[name] = gap / job_share
    return deviations


async def demo(args: argparse.Namespace) -> int:
    info = devstack.ensure_up()
    dsn = await fresh_database(info.postgres_dsn, "lockgate_demo")
    run = uuid.uuid4().hex[:5]
    lockgate = Lockgate(kubeconfigs=info.kubeconfigs, kafka_bootstrap=info.kafka_bootstrap,
                        postgres_dsn=dsn)
    apis = {cluster: await api_client(path) for cluster, path in info.kubeconfigs.items()}
    failures: list[str] = []
    samples: list[Sample] = []
    namespaces: list[tuple[str, str]] = []
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    stopping = asyncio.Event()
    coordinators: list[DaskLikeCoordinator] = []
    started = time.monotonic()
    try:
        print("starting lockgate: queue-store, admission-webhook, cluster-watcher, ungater, "
              "fair-scheduler (leader + standby)", flush=True)
        await lockgate.start()
        admin = f"http://127.0.0.1:{lockgate.ports.admin_api}/api/v1/queues"
        async with aiohttp.ClientSession() as session:
            for name, factor in QUEUES.items():
                async with session.post(admin, json={"name": name,
                                                     "priority_factor": factor}) as response:
                    if response.status not in (200, 201, 409):
                        raise RuntimeError(f"queue {name}: {await response.text()}")
                print(f"  lockgate queue create {name} --priority-factor {factor}", flush=True)

            for cluster, api in apis.items():
                core = client.CoreV1Api(api)
                apps = client.AppsV1Api(api)
                for queue in QUEUES:
                    ns = f"demo-{run}-{queue}"
                    labels = {MANAGED_NAMESPACE_LABEL: "true"}
                    if queue != "etl":  # etl pods inherit from their Deployment instead
                        labels.update({QUEUE_LABEL: queue, JOBSET_LABEL: f"{queue}-{run}"})
                    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns, "labels": labels}})
                    namespaces.append((cluster, ns))
                template = worker_pod("x")
                template["spec"].pop("restartPolicy")
                await apps.create_namespaced_deployment(f"demo-{run}-etl", {
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": "etl", "labels": {QUEUE_LABEL: "etl",
                                                           JOBSET_LABEL: f"etl-{run}"}},
                    "spec": {"replicas": args.etl_replicas,
                             "selector": {"matchLabels": {"app": "etl"}},
                             "template": {"metadata": {"labels": {"app": "etl"}},
                                          "spec": template["spec"]}},
                })
                for i in range(args.analytics_pods):
                    await core.create_namespaced_pod(
                        f"demo-{run}-analytics",
                        worker_pod(f"analytics-{i}", complete_after=f"{args.task_seconds}s"))
                coordinators.append(DaskLikeCoordinator(
                    api=api, namespace=f"demo-{run}-dask", tasks=args.dask_tasks,
                    max_workers=args.dask_workers, task_seconds=args.task_seconds))
            print(f"workloads created in {', '.join(apis)}: dask coordinator "
                  f"({args.dask_tasks} tasks per cluster), etl Deployment "
                  f"({args.etl_replicas} replicas per cluster), {args.analytics_pods} analytics "
                  "pods per cluster", flush=True)
            coordinator_tasks = [asyncio.create_task(c.run(stopping)) for c in coordinators]

            deadline = started + args.deadline_seconds
            while True:
                await asyncio.sleep(2)
                fairness = await fetch_fairness(session, lockgate.ports.scheduler_health) \
                    or await fetch_fairness(session, lockgate.ports.standby_scheduler_health)
                counts = await job_counts(pool)
                print(render(fairness, counts, time.monotonic() - started), flush=True)
                if fairness:
                    samples.append(Sample(time.monotonic(),
                                          {q["name"]: q for q in fairness.get("queues", [])}))
                crashed = [n for n in lockgate.crashed()]
                if crashed:
                    failures.append(f"services exited: {', '.join(crashed)}")
                    break
                done = all(t.done() for t in coordinator_tasks) and \
                    counts.get("analytics", {}).get("succeeded", 0) >= \
                    args.analytics_pods * len(apis)
                if done:
                    break
                if time.monotonic() > deadline:
                    failures.append(f"workloads not finished after {args.deadline_seconds}s")
                    break
        stopping.set()
        for coordinator in coordinators:
            failures.extend(coordinator.errors)
        failures.extend(await verify(pool, samples, args.fairness_tolerance_jobs,
                                     await one_job_share(pool)))
    finally:
        stopping.set()
        for cluster, ns in namespaces:
            with contextlib.suppress(ApiException):
                await client.CoreV1Api(apis[cluster]).delete_namespace(ns)
        codes = await lockgate.stop()
        for name, code in codes.items():
            if code not in (0, None):
                failures.append(f"{name} did not stop gracefully (exit code {code}); "
                                f"log {lockgate.processes[name].log_path}")
        await pool.close()
        for api in apis.values():
            await api.close()
    print_summary(samples, failures, time.monotonic() - started)
    return 1 if failures else 0


async def one_job_share(pool: asyncpg.Pool) -> float:
    """The dominant share of one demo pod in the whole pool: the unit of 'within one job'."""
    rows = await pool.fetch("SELECT allocatable FROM cluster_nodes WHERE present")
    cpu = sum(int(r["allocatable"].get("cpu", 0)) for r in rows)
    memory = sum(int(r["allocatable"].get("memory", 0)) for r in rows)
    requests = Resources.from_kubernetes({"cpu": POD_CPU, "memory": POD_MEMORY})
    if not cpu or not memory:
        return 1.0
    return max(requests["cpu"] / cpu, requests["memory"] / memory)


async def verify(pool: asyncpg.Pool, samples: list[Sample], tolerance_jobs: float,
                 job_share: float) -> list[str]:
    failures = []
    doubles = await pool.fetchval(
        "SELECT count(*) FROM (SELECT cluster, uid FROM release_decisions"
        " WHERE outcome IS DISTINCT FROM 'failed' GROUP BY cluster, uid HAVING count(*) > 1) d")
    if doubles:
        failures.append(f"{doubles} pods were released more than once")
    saturated = [s for s in samples
                 if all(s.queues.get(q, {}).get("queued", 0) > 0 for q in QUEUES)]
    if not saturated:
        failures.append("the queues were never all saturated at once: fairness not exercised")
    else:
        # Judge the steady state: the last third of the saturated samples.
        steady = saturated[len(saturated) * 2 // 3:]
        worst = max((abs(gap) for s in steady
                     for gap in share_deviation_in_jobs(s, job_share).values()), default=0.0)
        if worst > tolerance_jobs:
            failures.append(f"a saturated queue was {worst:.1f} jobs from its fair share")
    return failures


def print_summary(samples: list[Sample], failures: list[str], elapsed: float) -> None:
    print("\n=== lockgate demo summary ===")
    if samples:
        last_saturated = next((s for s in reversed(samples)
                               if all(s.queues.get(q, {}).get("queued", 0) for q in QUEUES)),
                              samples[-1])
        print("while every queue wanted more than its share:")
        for name in QUEUES:
            q = last_saturated.queues.get(name, {})
            print(f"  {name:<10} weight {q.get('weight', 0):.1f}  fair share "
                  f"{q.get('fair_share', 0):.1%}  actual {q.get('actual_share', 0):.1%}")
    print(json.dumps({"elapsed_seconds": round(elapsed, 1), "failures": failures}))
    print("RESULT:", "PASS" if not failures else "FAIL")


def main() -> None:
    parser = argparse.ArgumentParser(description="lockgate's end-to-end demo")
    parser.add_argument("--dask-tasks", type=int, default=24)
    parser.add_argument("--dask-workers", type=int, default=16)
    parser.add_argument("--etl-replicas", type=int, default=24)
    parser.add_argument("--analytics-pods", type=int, default=32)
    parser.add_argument("--task-seconds", type=int, default=20)
    parser.add_argument("--deadline-seconds", type=float, default=420)
    parser.add_argument("--fairness-tolerance-jobs", type=float, default=1.0)
    sys.exit(asyncio.run(demo(parser.parse_args())))


if __name__ == "__main__":
    main()
