"""`make demo`: lockgate's main job on the local stack, end to end, in a few minutes.

Starts every service (queue-store, admission-webhook, cluster-watcher, ungater, a leader and a
standby fair-scheduler), creates three queues with weights 1:1:2, and three workloads that ask
for more than both clusters hold together:

- dask: a Dask-like coordinator that creates its worker pods directly through the Kubernetes API
  (as dask-kubernetes does), each worker finishing its task after a while, until all tasks ran;
- etl: a Kubernetes Job per cluster, whose pods inherit the queue from the Job;
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

import aiohttp
import asyncpg
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import devstack
from devstack.launcher import Lockgate
from lockgate.labels import JOBSET_LABEL, MANAGED_NAMESPACE_LABEL, QUEUE_LABEL
from lockgate.resources import Resources
from lockgate_adapters.kube import api_client
from lockgate_adapters.postgres import connect_pool, create_database
from lockgate_adapters.settings import RetryPolicy

QUEUES = {"dask": 1.0, "etl": 1.0, "analytics": 0.5}  # priority factors: weights 1:1:2
POD_CPU, POD_MEMORY = "2", "2Gi"
COMPLETE_ANNOTATION = "lockgate.io/complete-after"


async def fresh_database(dsn: str, database: str) -> str:
    """The demo runs in its own database, recreated each time, so earlier runs don't show."""
    return await create_database(dsn, database, replace=True)


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


def task_duration(seconds: int, index: int) -> str:
    """Tasks of slightly different lengths, so capacity frees up gradually, as in real work."""
    return f"{max(1, seconds + index % 7 - 3)}s"


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
                                   complete_after=task_duration(self.task_seconds,
                                                                self.created)))
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
    # Every queue has pods waiting in every cluster: only then must shares match fair shares,
    # since a pod runs only in its own cluster and room freed in one cluster cannot go to a
    # queue whose waiting pods are all in the other.
    saturated: bool


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
    rows = await pool.fetch(
        "SELECT queue, state, count(*) AS n, count(released_at) AS ever_released"
        " FROM jobs GROUP BY queue, state")
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        queue = counts.setdefault(row["queue"], {})
        queue[row["state"]] = row["n"]
        queue["ever_released"] = queue.get("ever_released", 0) + row["ever_released"]
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
        released = c.get("ever_released", 0)
        lines.append(
            f"  {name:<10} {report.get('weight', 1 / QUEUES[name]):>6.2f} "
            f"{report.get('fair_share', 0):>6.1%} {report.get('adjusted_fair_share', 0):>8.1%} "
            f"{report.get('actual_share', 0):>7.1%} {c.get('queued', 0):>7} {released:>9} "
            f"{c.get('running', 0):>8} {c.get('succeeded', 0):>6}")
    return "\n".join(lines)


async def saturated_everywhere(pool: asyncpg.Pool, clusters: int) -> bool:
    rows = await pool.fetch("SELECT queue, count(DISTINCT cluster) AS clusters FROM jobs"
                            " WHERE state = 'queued' GROUP BY queue")
    waiting = {row["queue"]: row["clusters"] for row in rows}
    return all(waiting.get(queue, 0) == clusters for queue in QUEUES)


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
                        postgres_dsn=dsn, run_id=f"demo-{run}")
    apis = {cluster: await api_client(path) for cluster, path in info.kubeconfigs.items()}
    failures: list[str] = []
    samples: list[Sample] = []
    namespaces: list[tuple[str, str]] = []
    pool = await connect_pool(dsn, policy=RetryPolicy(), min_size=1, max_size=2)
    stopping = asyncio.Event()
    coordinators: list[DaskLikeCoordinator] = []
    final_counts: dict[str, dict[str, int]] = {}
    started = time.monotonic()
    try:
        print("starting lockgate: queue-store, admission-webhook, cluster-watcher, ungater, "
              "fair-scheduler (leader + standby)", flush=True)
        await lockgate.start()
        admin = f"http://127.0.0.1:{lockgate.ports.admin_api}/api/v1/queues"
        async with aiohttp.ClientSession() as session:
            for name, factor in QUEUES.items():
                # Each queue may be used by its own namespace only, in every cluster.
                binding = {"cluster": "*", "names": [f"demo-{run}-{name}"]}
                async with session.post(admin, json={
                        "name": name, "priority_factor": factor,
                        "namespaces": [binding]}) as response:
                    if response.status not in (200, 201, 409):
                        raise RuntimeError(f"queue {name}: {await response.text()}")
                print(f"  lockgate queue create {name} --priority-factor {factor} "
                      f"--namespace demo-{run}-{name}", flush=True)
            # Admission decides from each cluster's copy of the queues: wait until it has them.
            await lockgate.wait_for_queues({name: {"cordoned": False, "namespaces": [{
                "cluster": "*", "names": [f"demo-{run}-{name}"]}]} for name in QUEUES})

            for cluster, api in apis.items():
                core = client.CoreV1Api(api)
                batch = client.BatchV1Api(api)
                for queue in QUEUES:
                    ns = f"demo-{run}-{queue}"
                    labels = {MANAGED_NAMESPACE_LABEL: "true", **lockgate.run_namespace_labels}
                    if queue != "etl":  # etl pods inherit from their Job instead
                        labels.update({QUEUE_LABEL: queue, JOBSET_LABEL: f"{queue}-{run}"})
                    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns, "labels": labels}})
                    namespaces.append((cluster, ns))
                template = worker_pod("x", labels={"app": "etl"},
                                      complete_after=f"{args.task_seconds}s")
                await batch.create_namespaced_job(f"demo-{run}-etl", {
                    "apiVersion": "batch/v1", "kind": "Job",
                    "metadata": {"name": "etl", "labels": {QUEUE_LABEL: "etl",
                                                           JOBSET_LABEL: f"etl-{run}"}},
                    "spec": {"parallelism": args.etl_parallelism,
                             "completions": args.etl_completions, "backoffLimit": 0,
                             "template": {"metadata": template["metadata"],
                                          "spec": template["spec"]}},
                })
                for i in range(args.analytics_pods):
                    await core.create_namespaced_pod(
                        f"demo-{run}-analytics",
                        worker_pod(f"analytics-{i}",
                                   complete_after=task_duration(args.task_seconds, i)))
                coordinators.append(DaskLikeCoordinator(
                    api=api, namespace=f"demo-{run}-dask", tasks=args.dask_tasks,
                    max_workers=args.dask_workers, task_seconds=args.task_seconds))
            print(f"workloads in {', '.join(apis)}, each: a Dask-like coordinator running "
                  f"{args.dask_tasks} tasks on up to {args.dask_workers} worker pods it creates "
                  f"itself; an etl Job ({args.etl_completions} pods, {args.etl_parallelism} at "
                  f"a time) whose pods inherit their queue from the Job; {args.analytics_pods} "
                  "analytics pods inheriting from their namespace. Every pod asks for "
                  f"{POD_CPU} cpu / {POD_MEMORY} and runs {args.task_seconds}s.", flush=True)
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
                                          {q["name"]: q for q in fairness.get("queues", [])},
                                          await saturated_everywhere(pool, len(apis))))
                crashed = [n for n in lockgate.crashed()]
                if crashed:
                    failures.append(f"services exited: {', '.join(crashed)}")
                    break
                done = all(t.done() for t in coordinator_tasks) and \
                    counts.get("analytics", {}).get("succeeded", 0) >= \
                    args.analytics_pods * len(apis) and \
                    counts.get("etl", {}).get("succeeded", 0) >= \
                    args.etl_completions * len(apis)
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
        final_counts = await job_counts(pool)
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
    print_summary(samples, final_counts, failures, time.monotonic() - started)
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
    saturated = [s for s in samples if s.saturated]
    if not saturated:
        failures.append("the queues were never all saturated at once: fairness not exercised")
    else:
        # Allocation converges as pods finish (there is no preemption): judge the second half.
        steady = saturated[len(saturated) // 2:]
        worst = max((abs(gap) for s in steady
                     for gap in share_deviation_in_jobs(s, job_share).values()), default=0.0)
        print(f"fairness: {len(saturated)} samples with every queue waiting in every cluster; "
              f"in the last {len(steady)}, the largest gap to a fair share was {worst:.2f} jobs")
        if worst > tolerance_jobs + 1e-6:
            failures.append(f"a saturated queue was {worst:.1f} jobs from its fair share")
    return failures


def print_summary(samples: list[Sample], counts: dict[str, dict[str, int]],
                  failures: list[str], elapsed: float) -> None:
    print("\n=== lockgate demo summary ===")
    last_saturated = next((s for s in reversed(samples) if s.saturated), None)
    print("  fair and actual share: the last moment every queue had pods waiting in every "
          "cluster; pod counts: at the end")
    print(f"  {'queue':<10} {'weight':>6} {'fair':>6} {'actual':>7} {'queued':>7} "
          f"{'released':>9} {'running':>8} {'succeeded':>10}")
    for name in QUEUES:
        q = last_saturated.queues.get(name, {}) if last_saturated else {}
        c = counts.get(name, {})
        print(f"  {name:<10} {1 / QUEUES[name]:>6.1f} {q.get('fair_share', 0):>6.1%} "
              f"{q.get('actual_share', 0):>7.1%} {c.get('queued', 0):>7} "
              f"{c.get('ever_released', 0):>9} {c.get('running', 0):>8} "
              f"{c.get('succeeded', 0):>10}")
    print(json.dumps({"elapsed_seconds": round(elapsed, 1), "failures": failures}))
    print("RESULT:", "PASS" if not failures else "FAIL")


def main() -> None:
    parser = argparse.ArgumentParser(description="lockgate's end-to-end demo")
    parser.add_argument("--dask-tasks", type=int, default=48)
    parser.add_argument("--dask-workers", type=int, default=24)
    parser.add_argument("--etl-completions", type=int, default=48)
    parser.add_argument("--etl-parallelism", type=int, default=24)
    parser.add_argument("--analytics-pods", type=int, default=64)
    parser.add_argument("--task-seconds", type=int, default=15)
    parser.add_argument("--deadline-seconds", type=float, default=420)
    parser.add_argument("--fairness-tolerance-jobs", type=float, default=1.0)
    sys.exit(asyncio.run(demo(parser.parse_args())))


if __name__ == "__main__":
    main()
