"""`make demo`, first part: weights for pods pinned to their cluster, the natural way.

The fair-scheduler already runs, with preemption on. The three demo queues (weights 1:1:2)
arrive one after another with Deployments of long-running, preemptible pods, each in the
cluster it is created in, and demand is uneven across the clusters:

    t=0s   etl        cluster-a  24 pods x 2 cpu    (takes what it finds: it is alone)
    t=4s   dask       cluster-b  24 pods x 2 cpu
    t=8s   analytics  cluster-a  12 pods x 4 cpu    (weight 2)
    t=12s  analytics  cluster-b   5 pods x 4 cpu

Nothing is staged: whoever comes first takes the room, and preemption has to move the queues to
their fair allocation. That allocation is computed here, independently of the scheduler, by
`devstack.fair_model` from what this module created and the capacity the apiservers report; what
each queue holds is read from the apiservers (its pods bound to a node). The part passes when
every queue is within a pod of the model and then nothing moves for a while
(`devstack.demo_fairness`). With pinning the model is not DRF over the pool: analytics can use
only 20 cpu of cluster-b, so dask (weight 1) gets 22 pods and etl (weight 1) 14, and analytics
(weight 2) 9 + 5 pods of 4 cpu.

The numbers are chosen so that the fluid fair allocation is whole pods of each shape. Otherwise
"within a pod" would judge rounding, not fairness: with 6 analytics pods in cluster-b the model
gives etl 14.67 pods and analytics 8.67 in cluster-a, and since analytics' pods are twice etl's,
the whole-pod splits of cluster-a are 16 : 8 or 14 : 9, etl 1.33 or 0.67 pods from its fluid
share. The scheduler keeps 16 : 8 (room for a ninth analytics pod would take etl below its
target), which a one-pod tolerance would call unfair.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from devstack.demo_fairness import Look, SettleJudge
from devstack.fair_model import Cluster, Demand, FairAllocation, fair_allocation
from lockgate.labels import JOBSET_LABEL, PREEMPTIBLE_LABEL, QUEUE_LABEL
from lockgate.resources import canonical_amount

RESOURCES = ("cpu", "memory")
JOBSET_PREFIX = "steady-"  # the job sets of this part's pods


@dataclass(frozen=True)
class Workload:
    """One Deployment of long-running, preemptible pods of one queue in one cluster."""

    queue: str
    cluster: str
    replicas: int
    cpu: str
    memory: str
    after: float  # seconds after the part starts

    @property
    def name(self) -> str:
        return f"{self.queue}-steady"

    def shape(self) -> dict[str, float]:
        return {"cpu": float(canonical_amount("cpu", self.cpu)),
                "memory": float(canonical_amount("memory", self.memory))}


WORKLOADS = (
    Workload("etl", "cluster-a", 24, "2", "2Gi", after=0),
    Workload("dask", "cluster-b", 24, "2", "2Gi", after=4),
    Workload("analytics", "cluster-a", 12, "4", "4Gi", after=8),
    Workload("analytics", "cluster-b", 5, "4", "4Gi", after=12),
)


def deployment(workload: Workload, jobset: str) -> dict[str, Any]:
    labels = {"app": workload.name, QUEUE_LABEL: workload.queue, JOBSET_LABEL: jobset,
              PREEMPTIBLE_LABEL: "true"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": workload.name},
        "spec": {
            "replicas": workload.replicas,
            "selector": {"matchLabels": {"app": workload.name}},
            "template": {"metadata": {"labels": labels}, "spec": {
                "terminationGracePeriodSeconds": 0,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "main", "image": "registry.invalid/demo:1",
                                "resources": {"requests": {"cpu": workload.cpu,
                                                           "memory": workload.memory}}}]}},
        },
    }


async def schedulable_capacity(apis: Mapping[str, client.ApiClient]) -> list[Cluster]:
    """Each cluster's schedulable capacity (nodes neither cordoned nor tainted), as its
    apiserver reports it, for the independent model: lockgate's own view is not asked."""
    clusters = []
    for name, api in apis.items():
        total = dict.fromkeys(RESOURCES, 0.0)
        for node in (await client.CoreV1Api(api).list_node()).items:
            if node.spec.unschedulable or any(
                    t.effect in ("NoSchedule", "NoExecute") for t in node.spec.taints or ()):
                continue
            for resource in RESOURCES:
                total[resource] += canonical_amount(resource, node.status.allocatable[resource])
        clusters.append(Cluster.of(name, total))
    return clusters


async def look(apis: Mapping[str, client.ApiClient], namespaces: Mapping[str, str],
               at: float) -> Look:
    """Each queue's pods of this part bound to a node and not being deleted."""
    bound: dict[str, set[str]] = {queue: set() for queue in namespaces}
    for cluster, api in apis.items():
        core = client.CoreV1Api(api)
        for queue, namespace in namespaces.items():
            pods = (await core.list_namespaced_pod(
                namespace, label_selector=f"app={queue}-steady")).items
            bound[queue].update(
                f"{cluster}/{namespace}/{p.metadata.name}" for p in pods
                if p.spec.node_name and p.metadata.deletion_timestamp is None
                and p.status.phase in ("Pending", "Running"))
    return Look(at, {queue: frozenset(pods) for queue, pods in bound.items()})


@dataclass
class WeightsResult:
    model: FairAllocation | None = None
    judge: SettleJudge | None = None
    last: Look | None = None
    by_cluster: dict[str, dict[str, int]] | None = None  # queue -> cluster -> bound pods
    evictions: int = 0

    def lines(self, weights: Mapping[str, float]) -> list[str]:
        out = ["\n=== weights for pinned pods (arriving while the scheduler runs, preemption on) "
               "==="]
        if self.model is None or self.judge is None or self.last is None:
            return [*out, "  did not run"]
        out.append("  fair allocation from an independent model (devstack.fair_model: "
                   "constrained max-min DRF over both clusters, each pod only in its own "
                   "cluster); holding: pods bound to a node, as the apiservers show them")
        clusters = sorted({w.cluster for w in WORKLOADS})
        out.append(f"  {'queue':<10} {'weight':>6} {'fair pods':>9} {'holding':>8} "
                   + " ".join(f"{c:>10}" for c in clusters))
        counts = self.last.counts()
        for queue, weight in weights.items():
            split = (self.by_cluster or {}).get(queue, {})
            out.append(f"  {queue:<10} {weight:>6.1f} {self.model.pods(queue):>9.2f} "
                       f"{counts.get(queue, 0):>8} "
                       + " ".join(f"{split.get(c, 0):>10}" for c in clusters))
        judge = self.judge
        reached = "never" if judge.reached_at is None else f"at t={judge.reached_at:.0f}s"
        settled = ("did not settle" if judge.settled_at is None
                   else f"then nothing moved for {judge.window:.0f}s")
        out.append(f"  reached the fair allocation (every queue within {judge.tolerance:g} pod) "
                   f"{reached}, {settled}; {self.evictions} pods evicted on the way; "
                   f"{len(judge.moves)} moves after first reaching it")
        return out


async def run(*, apis: Mapping[str, client.ApiClient], namespaces: Mapping[str, str],
              weights: Mapping[str, float], jobset: str, evictions: Any,
              failures: list[str], within: float = 240.0, window: float = 20.0,
              ) -> WeightsResult:
    """Create the workloads over time, judge, then delete them. `namespaces`: queue -> its
    namespace (the same name in every cluster); `evictions`: an async callable counting the
    preemptions recorded so far."""
    result = WeightsResult()
    started = time.monotonic()
    model = fair_allocation(
        clusters=await schedulable_capacity(apis), weights=weights,
        demands=[Demand(w.queue, w.cluster, w.shape(), w.replicas) for w in WORKLOADS])
    result.model = model
    targets = {queue: model.pods(queue) for queue in weights}
    judge = result.judge = SettleJudge(targets=targets, tolerance=1.0, window=window)
    print("weights for pinned pods: the fair-scheduler runs with preemption on; the queues "
          "arrive one after another (Deployments of preemptible pods that run until deleted):",
          flush=True)
    for workload in WORKLOADS:
        print(f"  t={workload.after:>3.0f}s {workload.queue:<10} in {workload.cluster}: "
              f"{workload.replicas} pods x {workload.cpu} cpu", flush=True)
    print("  the independent model's fair allocation, in pods: " + ", ".join(
        f"{queue} {target:.2f}" for queue, target in targets.items()), flush=True)
    before = await evictions()

    async def arrive() -> None:
        for workload in WORKLOADS:
            await asyncio.sleep(max(0.0, started + workload.after - time.monotonic()))
            await client.AppsV1Api(apis[workload.cluster]).create_namespaced_deployment(
                namespaces[workload.queue], deployment(workload, jobset))

    arrivals = asyncio.create_task(arrive())
    try:
        last_print = -5.0
        while judge.settled_at is None and time.monotonic() - started < within:
            now = time.monotonic() - started
            seen = result.last = await look(apis, namespaces, now)
            if arrivals.done():
                await arrivals  # raises what creating a Deployment raised
                judge.see(seen)  # judged once every queue's demand exists
            if now - last_print >= 5:
                last_print = now
                print(f"  t={now:5.0f}s holding " + ", ".join(
                    f"{queue} {count}" for queue, count in seen.counts().items())
                    + f" (fair {', '.join(f'{t:.1f}' for t in targets.values())})", flush=True)
            await asyncio.sleep(1.0)  # sampling the apiservers, not waiting for a condition
        if result.last is not None:
            result.by_cluster = {
                queue: {cluster: sum(1 for pod in pods if pod.startswith(f"{cluster}/"))
                        for cluster in apis}
                for queue, pods in result.last.bound.items()}
        result.evictions = await evictions() - before
        failures.extend(f"weights for pinned pods: {failure}" for failure in judge.verdict())
    finally:
        arrivals.cancel()
        with contextlib.suppress(asyncio.CancelledError, client.ApiException):
            await arrivals
        for workload in WORKLOADS:
            try:
                await client.AppsV1Api(apis[workload.cluster]).delete_namespaced_deployment(
                    workload.name, namespaces[workload.queue], propagation_policy="Foreground")
            except client.ApiException as error:
                if error.status != 404:
                    raise
    return result
