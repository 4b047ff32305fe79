"""`make demo`: lockgate's main job on the local stack, end to end, in a few minutes.

Starts every service (queue-store, admission-webhook, cluster-watcher, ungater, a leader and a
standby fair-scheduler, preemption on for preemptible pods) and creates three queues with weights
1:1:2. Then, with the scheduler running and nothing staged:

1. weights for pinned pods (`devstack.demo_weights`): the queues arrive one after another with
   Deployments of preemptible pods, unevenly across the two clusters; what each queue holds, as
   the apiservers show it, must reach the fair allocation that an independent model computes
   (constrained max-min DRF, `devstack.fair_model`) and then stay there;
2. batch work that ends: three workloads that ask for more than both clusters hold together, run
   to completion:
   - dask: a Dask-like coordinator that creates its worker pods directly through the Kubernetes
     API (as dask-kubernetes does), each worker finishing its task after a while;
   - etl: a Kubernetes Job per cluster, whose pods inherit the queue from the Job;
   - analytics: bare pods in a namespace that carries the queue label.

3. clusters that grow (`devstack.demo_growth`): the autoscaled cluster-c, from 0 nodes, grown
   by real Karpenter for the queue owed room and not for the one over its share, then shrunk.

It shows, live and then in a summary, per queue: weight, fair share, actual share, queued,
released, running. It ends by itself and exits non-zero if anything failed: a service crashed,
a workload did not finish in time, a pod was released twice, or the queues did not reach and
hold their fair allocation in part 1.
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
from devstack import (
    demo_ephemeral,
    demo_growth,
    demo_placement,
    demo_scheduling,
    demo_tree,
    demo_unfinished,
    demo_weights,
)
from devstack.launcher import Lockgate
from devstack.ports import ServicePorts
from lockgate.labels import JOBSET_LABEL, MANAGED_NAMESPACE_LABEL, QUEUE_LABEL
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


INGEST_SERVICES = ("queue-store", "admission-webhook", "cluster-watcher", "ungater")
SCHEDULERS = ("fair-scheduler", "fair-scheduler-standby")


async def create_pods(core: client.CoreV1Api, namespace: str, pods: list[dict[str, Any]],
                      concurrency: int = 16) -> None:
    """Create pods a few at a time, as a controller would: one by one takes a busy machine
    long enough for the first pods to be released alone."""
    gate = asyncio.Semaphore(concurrency)

    async def create(pod: dict[str, Any]) -> None:
        async with gate:
            await core.create_namespaced_pod(namespace, pod)

    await asyncio.gather(*(create(pod) for pod in pods))


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
            pods = (await core.list_namespaced_pod(
                self.namespace, label_selector="app=dask-worker")).items
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


async def job_counts(pool: asyncpg.Pool, clusters: list[str]) -> dict[str, dict[str, int]]:
    """Per queue and state, the batch part's jobs (not the weights part's job sets) in the
    demo's clusters (tests sharing the stack watch them under aliases of their own)."""
    rows = await pool.fetch(
        "SELECT queue, state, count(*) AS n, count(released_at) AS ever_released"
        " FROM jobs WHERE jobset NOT LIKE $1 AND cluster = ANY($2::text[])"
        " GROUP BY queue, state", f"{demo_weights.JOBSET_PREFIX}%", clusters)
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


WEIGHTS = {queue: 1 / factor for queue, factor in QUEUES.items()}


async def demo(args: argparse.Namespace) -> int:
    # The autoscaled cluster of the growth scene too, started if missing (nothing restarts).
    info = devstack.ensure_up(autoscaled=[demo_growth.CLUSTER])
    dsn = await fresh_database(info.postgres_dsn, "lockgate_demo")
    run = uuid.uuid4().hex[:5]
    # Preemption is on for the whole demo; only pods labelled preemptible are ever evicted.
    lockgate = Lockgate.for_stack(info, postgres_dsn=dsn, run_id=f"demo-{run}",
                                  ports=ServicePorts.free(),
                                  extra_env={"LOCKGATE_SCHEDULER_PREEMPTION_ENABLED": "true"})
    apis = {cluster: await api_client(path) for cluster, path in info.kubeconfigs.items()}
    failures: list[str] = []
    namespaces: list[tuple[str, str]] = []
    pool = await connect_pool(dsn, policy=RetryPolicy(), min_size=1, max_size=2)
    stopping = asyncio.Event()
    coordinators: list[DaskLikeCoordinator] = []
    final_counts: dict[str, dict[str, int]] = {}
    placement_lines: list[str] = []
    weights = demo_weights.WeightsResult()
    batch_seconds = 0.0
    started = time.monotonic()
    try:
        print("starting lockgate: queue-store, admission-webhook, cluster-watcher, ungater, "
              "fair-scheduler (leader + standby; preemption on for preemptible pods)", flush=True)
        await lockgate.start(only=INGEST_SERVICES + SCHEDULERS)
        admin = f"{lockgate.admin_url}/api/v1/queues"
        async with aiohttp.ClientSession() as session:
            for name, factor in QUEUES.items():
                # Each queue may be used by its own namespace only, in every cluster.
                binding = {"cluster": "*", "names": [f"demo-{run}-{name}"]}
                async with session.post(admin, json={
                        "name": name, "priority_factor": factor,
                        "namespaces": [binding]}, headers=lockgate.admin_headers) as response:
                    if response.status not in (200, 201, 409):
                        raise RuntimeError(f"queue {name}: {await response.text()}")
                print(f"  lockgate queue create {name} --priority-factor {factor} "
                      f"--namespace demo-{run}-{name}", flush=True)
            tokens = lockgate.write_token_files()
            print(f"  (the admin API wants a token: lockgate --api {lockgate.admin_url} "
                  f"--token-file {tokens['read-only']} jobs list)", flush=True)
            # Admission decides from each cluster's copy of the queues: wait until it has them.
            await lockgate.wait_for_queues({name: {"cordoned": False, "namespaces": [{
                "cluster": "*", "names": [f"demo-{run}-{name}"]}]} for name in QUEUES})
            for cluster, api in apis.items():
                core = client.CoreV1Api(api)
                for queue in QUEUES:
                    ns = f"demo-{run}-{queue}"
                    labels = {MANAGED_NAMESPACE_LABEL: "true", **lockgate.run_namespace_labels}
                    if queue != "etl":  # etl pods inherit from their Job instead
                        labels.update({QUEUE_LABEL: queue, JOBSET_LABEL: f"{queue}-{run}"})
                    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": ns, "labels": labels}})
                    namespaces.append((cluster, ns))

            async def preempted() -> int:
                return int(await pool.fetchval(
                    "SELECT count(*) FROM evictions WHERE kind = 'preempted'"))

            weights = await demo_weights.run(
                apis=apis, namespaces={queue: f"demo-{run}-{queue}" for queue in QUEUES},
                weights=WEIGHTS, jobset=f"{demo_weights.JOBSET_PREFIX}{run}",
                evictions=preempted, failures=failures, within=args.weights_seconds)

            batch_started = time.monotonic()
            for api in apis.values():
                core = client.CoreV1Api(api)
                batch = client.BatchV1Api(api)
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
                await create_pods(core, f"demo-{run}-analytics", [
                    worker_pod(f"analytics-{i}",
                               complete_after=task_duration(args.task_seconds, i))
                    for i in range(args.analytics_pods)])
                coordinators.append(DaskLikeCoordinator(
                    api=api, namespace=f"demo-{run}-dask", tasks=args.dask_tasks,
                    max_workers=args.dask_workers, task_seconds=args.task_seconds))
            print(f"\nbatch work that ends, in {', '.join(apis)}, each: a Dask-like coordinator "
                  f"running {args.dask_tasks} tasks on up to {args.dask_workers} worker pods it "
                  f"creates itself; an etl Job ({args.etl_completions} pods, "
                  f"{args.etl_parallelism} at a time) whose pods inherit their queue from the "
                  f"Job; {args.analytics_pods} analytics pods inheriting from their namespace. "
                  f"Every pod asks for {POD_CPU} cpu / {POD_MEMORY} and runs "
                  f"{args.task_seconds}s. The scheduler runs throughout.", flush=True)
            coordinator_tasks = [asyncio.create_task(c.run(stopping)) for c in coordinators]
            deadline = batch_started + args.deadline_seconds
            last_render = 0.0
            while True:
                await asyncio.sleep(2)
                fairness = await fetch_fairness(session, lockgate.ports.scheduler_health) \
                    or await fetch_fairness(session, lockgate.ports.standby_scheduler_health)
                counts = await job_counts(pool, list(apis))
                if time.monotonic() - last_render >= 2:
                    last_render = time.monotonic()
                    print(render(fairness, counts, last_render - started), flush=True)
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
                    failures.append(f"batch workloads not finished after "
                                    f"{args.deadline_seconds}s")
                    # Before the namespaces go: where the missing work is, as both sides see it.
                    unfinished = await demo_unfinished.explain(apis, pool, namespaces)
                    print("\nwhat the clusters show that lockgate does not account for:")
                    for line in unfinished:
                        print(f"  {line}", flush=True)
                    failures += [line for line in unfinished if not line.startswith("Job ")]
                    break
            batch_seconds = time.monotonic() - batch_started
        stopping.set()
        for coordinator in coordinators:
            failures.extend(coordinator.errors)
        failures.extend(await released_twice(pool))
        final_counts = await job_counts(pool, list(apis))
        placement_lines = await demo_placement.gpu_pool(lockgate, apis["cluster-a"], pool, run,
                                                        failures)
        failures.extend(await demo_ephemeral.run(lockgate, apis, pool, run))
        tree_failures, tree_lines = await demo_tree.run(lockgate, apis, pool, run)
        failures.extend(tree_failures)
        placement_lines.extend(tree_lines)
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
    failures.extend(await demo_scheduling.run_and_summarise(info))  # a gang, a preemption
    # cluster-c grown by Karpenter for the queue owed room, and shrunk (devstack.demo_growth).
    failures.extend(await demo_growth.run_and_summarise(info))
    print_summary(weights, final_counts, batch_seconds, failures, time.monotonic() - started,
                  placement_lines)
    return 1 if failures else 0


async def released_twice(pool: asyncpg.Pool) -> list[str]:
    doubles = await pool.fetchval(
        "SELECT count(*) FROM (SELECT cluster, uid FROM release_decisions"
        " WHERE outcome IS DISTINCT FROM 'failed' GROUP BY cluster, uid HAVING count(*) > 1) d")
    return [f"{doubles} pods were released more than once"] if doubles else []


def print_summary(weights: demo_weights.WeightsResult, counts: dict[str, dict[str, int]],
                  batch_seconds: float, failures: list[str], elapsed: float,
                  extra: list[str] | None = None) -> None:
    print("\n=== lockgate demo summary ===")
    for line in weights.lines(WEIGHTS):
        print(line)
    print(f"\n=== batch work that ends (both clusters, {batch_seconds:.0f}s) ===")
    print(f"  {'queue':<10} {'weight':>6} {'queued':>7} {'released':>9} {'running':>8} "
          f"{'succeeded':>10}")
    for name in QUEUES:
        c = counts.get(name, {})
        print(f"  {name:<10} {WEIGHTS[name]:>6.1f} {c.get('queued', 0):>7} "
              f"{c.get('ever_released', 0):>9} {c.get('running', 0):>8} "
              f"{c.get('succeeded', 0):>10}")
    for line in extra or ():  # sections of demo_<area> modules
        print(line)
    judge = weights.judge
    print(json.dumps({"elapsed_seconds": round(elapsed, 1),
                      "weights_reached_at": judge.reached_at if judge else None,
                      "weights_settled_at": judge.settled_at if judge else None,
                      "weights_evictions": weights.evictions, "failures": failures}))
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
    parser.add_argument("--weights-seconds", type=float, default=240,
                        help="how long the queues may take to reach and hold their fair "
                        "allocation in the first part")
    sys.exit(asyncio.run(demo(parser.parse_args())))


if __name__ == "__main__":
    main()
