"""`make demo`, the queue tree (issue 36): research borrows, production reclaims its guarantee.

The organisation is the issue's:

    research   (weight 3)                    production (weight 2, guarantee 32 cpu)
      vision: alice, bob
      nlp:    carol

Only leaves hold pods. The fair-scheduler runs with preemption on; each leaf's work arrives as a
Deployment of 1-cpu preemptible pods in one cluster (TREE_CLUSTER, 64 cpu), research's first:

    t=0s   alice 24 pods, bob 24 pods, carol 40 pods   (production idle: research borrows all)
    then   production 40 pods                           (it reclaims 32 cpu, its guarantee)

Why these numbers: on 64 cpu production's weight alone would give it 25.6 cpu; its guarantee
gives it 32, research the other 32 (vision 16, nlp 16), so every level's share is whole pods and
"within one pod" judges the scheduler, not rounding.

What each leaf holds is read from the apiserver (its pods bound to a node) and judged against the
independent model `devstack.fair_model.hierarchical_allocation` (linear programs, no code shared
with the scheduler) fed with what this part created and the capacity the apiservers report. It
passes when research's leaves reach the model with production idle, production then holds its
guarantee within RECLAIM_SECONDS (by preemption) and every leaf ends within a pod of the model.
The tree is printed as `lockgate status --tree` shows it (the leader's picture), beside the pods
bound and the model's, as it moves.

`python -m devstack.demo_tree` runs this part alone, with a lockgate of its own.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any

import aiohttp
import asyncpg
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import devstack
from devstack.demo_weights import schedulable_capacity
from devstack.fair_model import Demand, TreeQueue, hierarchical_allocation
from devstack.launcher import Lockgate
from devstack.ports import ServicePorts
from lockgate.labels import MANAGED_NAMESPACE_LABEL, PREEMPTIBLE_LABEL, QUEUE_LABEL
from lockgate.resources import canonical_amount
from lockgate_adapters.kube import api_client
from lockgate_adapters.postgres import connect_pool, create_database
from lockgate_adapters.settings import RetryPolicy

TREE_CLUSTER = os.environ.get("LOCKGATE_DEMO_TREE_CLUSTER", "cluster-a")
MEMORY = "64Mi"  # cpu is every pod's dominant resource
GUARANTEE_CPU = 32
RECLAIM_SECONDS = 60.0  # the issue: production gets its guarantee within a minute
SETTLE_SECONDS = 150.0  # each phase's time to reach the model
# The tree: name -> (parent, priority factor = 1 / weight, guarantee).
INNER = {"research": (None, 1 / 3), "vision": ("research", 1.0), "nlp": ("research", 1.0)}
LEAVES = {"alice": "vision", "bob": "vision", "carol": "nlp", "production": None}
PODS = {"alice": 24, "bob": 24, "carol": 40, "production": 40}


def _names(run_id: str) -> dict[str, str]:
    """The demo's node names -> the queue names of this run (another run's may still exist)."""
    return {node: f"{node}-{run_id}" for node in (*INNER, *LEAVES)}


def _branch(leaf: str) -> list[str]:
    """The leaf and the inner nodes above it."""
    found = [leaf]
    parent = LEAVES[leaf]
    while parent is not None:
        found.append(parent)
        parent = INNER[parent][0]
    return found


def _deployment(queue: str) -> dict[str, Any]:
    labels = {"app": "tree-demo", QUEUE_LABEL: queue, PREEMPTIBLE_LABEL: "true"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "tree-demo"},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "tree-demo"}},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "terminationGracePeriodSeconds": 0,
                         # No toleration: the pods go only where the model's capacity is
                         # (untainted nodes), never on a tainted pool another part adds.
                         "containers": [{"name": "main", "image": "registry.invalid/demo:1",
                                         "resources": {"requests": {"cpu": "1",
                                                                    "memory": MEMORY}}}]}}}}


class TreeScene:
    def __init__(self, lockgate: Lockgate, apis: Mapping[str, client.ApiClient],
                 pool: asyncpg.Pool, run_id: str) -> None:
        self.lockgate, self.pool = lockgate, pool
        self.api = apis[TREE_CLUSTER]
        self.apis = apis
        self.names = _names(run_id)
        self.namespaces = {leaf: f"demo-{run_id}-tree-{leaf}" for leaf in LEAVES}
        self.started = time.monotonic()
        self.last_print = -10.0

    async def create(self, session: aiohttp.ClientSession) -> None:
        names = self.names
        specs: list[dict[str, Any]] = [
            {"name": names[node], "priority_factor": factor, "namespaces": [],
             **({"parent": names[parent]} if parent else {})}
            for node, (parent, factor) in INNER.items()]
        for leaf, parent in LEAVES.items():
            spec: dict[str, Any] = {"name": names[leaf], "namespaces": [
                {"cluster": "*", "names": [self.namespaces[leaf]]}]}
            if parent is None:  # production: a child of the root
                spec.update(priority_factor=0.5, guarantee={"cpu": str(GUARANTEE_CPU)})
            else:
                spec["parent"] = names[parent]
            specs.append(spec)
        created: dict[str, Any] = {}
        for spec in specs:
            async with session.post(f"{self.lockgate.admin_url}/api/v1/queues", json=spec,
                                    headers=self.lockgate.admin_headers) as reply:
                if reply.status not in (200, 201):
                    raise RuntimeError(f"queue {spec['name']}: {await reply.text()}")
                created[spec["name"]] = await reply.json()
            print(f"  lockgate queue create {spec['name']}"
                  + (f" --parent {spec['parent']}" if "parent" in spec else "")
                  + f" --priority-factor {spec.get('priority_factor', 1.0):.3g}"
                  + (f" --guarantee cpu={GUARANTEE_CPU}" if "guarantee" in spec else ""),
                  flush=True)
        # Admission decides from each cluster's copy of the queues: wait until it has them.
        await self.lockgate.wait_for_queues({names[leaf]: created[names[leaf]]
                                             for leaf in LEAVES})
        core = client.CoreV1Api(self.api)
        apps = client.AppsV1Api(self.api)
        for leaf, namespace in self.namespaces.items():
            await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": namespace, "labels": {MANAGED_NAMESPACE_LABEL: "true",
                                              **self.lockgate.run_namespace_labels}}})
            await apps.create_namespaced_deployment(namespace, _deployment(names[leaf]))

    async def scale(self, leaf: str) -> None:
        await client.AppsV1Api(self.api).patch_namespaced_deployment_scale(
            "tree-demo", self.namespaces[leaf], {"spec": {"replicas": PODS[leaf]}})

    async def bound(self) -> dict[str, int]:
        core = client.CoreV1Api(self.api)
        found = {}
        for leaf, namespace in self.namespaces.items():
            pods = (await core.list_namespaced_pod(namespace)).items
            found[leaf] = sum(1 for p in pods if p.spec.node_name
                              and p.metadata.deletion_timestamp is None
                              and p.status.phase in ("Pending", "Running"))
        return found

    async def model(self, asking: list[str]) -> tuple[dict[str, float], float]:
        """The independent model's pods per leaf for the leaves asking, and the pool in cpu."""
        clusters = [c for c in await schedulable_capacity(self.apis)
                    if c.capacity.get("cpu", 0.0) > 0]
        one_cpu = float(canonical_amount("cpu", "1"))
        shape = {"cpu": one_cpu, "memory": float(canonical_amount("memory", MEMORY))}
        names = self.names
        tree = [TreeQueue(names["research"], weight=3.0),
                TreeQueue(names["vision"], parent=names["research"]),
                TreeQueue(names["nlp"], parent=names["research"]),
                *(TreeQueue(names[leaf], parent=names[parent])
                  for leaf, parent in LEAVES.items() if parent is not None),
                TreeQueue(names["production"], weight=2.0,
                          guarantee={"cpu": GUARANTEE_CPU * one_cpu})]
        allocation = hierarchical_allocation(
            clusters=clusters, tree=tree,
            demands=[Demand(names[leaf], TREE_CLUSTER, shape, PODS[leaf]) for leaf in asking])
        pool_cpu = allocation.pool_total["cpu"] / one_cpu
        return ({leaf: allocation.shares.get(names[leaf], 0.0) * pool_cpu for leaf in LEAVES},
                pool_cpu)

    async def status_tree(self, session: aiohttp.ClientSession) -> list[dict[str, Any]]:
        """`lockgate status --tree`'s picture: the leader's."""
        async with session.get(f"{self.lockgate.admin_url}/api/v1/status",
                               headers=self.lockgate.admin_headers) as reply:
            if reply.status != 200:
                return []
            return list((await reply.json()).get("tree") or [])

    def render(self, tree: list[dict[str, Any]], bound: Mapping[str, int],
               model: Mapping[str, float], pool_cpu: float, title: str) -> list[str]:
        """The tree as a person follows it: each node's weight, guarantee, the leader's target
        and holding (in cpu), and for leaves the pods bound and the model's pods."""
        ours = {name: node for node, name in self.names.items()}
        out = [f"  t={time.monotonic() - self.started:4.0f}s {title}",
               f"    {'node':<18} {'weight':>11} {'guarantee':>9} {'target':>7} {'holds':>6}"
               f" {'bound':>6} {'model':>6}"]
        for node in tree:
            name = ours.get(node.get("name", ""))
            if name is None:
                continue  # another part's queue (idle here)
            subtree = [leaf for leaf in LEAVES if name in _branch(leaf)]
            guarantee = node.get("guarantee") or {}
            among = 100 * node.get("weight_among_siblings", 0)
            weight = f"{node.get('weight', 0):g} ({among:.0f}%)"
            out.append(
                f"    {'  ' * int(node.get('depth', 0)) + name:<18} {weight:>11} "
                f"{guarantee.get('cpu', '-'):>9} "
                f"{node.get('fair_target', 0) * pool_cpu:>7.1f} "
                f"{node.get('actual_share', 0) * pool_cpu:>6.1f} "
                f"{sum(bound[leaf] for leaf in subtree):>6} "
                f"{sum(model[leaf] for leaf in subtree):>6.1f}")
        return out

    async def until_model(self, session: aiohttp.ClientSession, asking: list[str], title: str,
                          *, within: float, also: Any = None) -> tuple[float | None,
                                                                       dict[str, int]]:
        """Print the tree every few seconds until every leaf is within a pod of the model;
        returns when (seconds since this phase began; None: never) and the last look."""
        model, pool_cpu = await self.model(asking)
        print("  the independent model, in 1-cpu pods: "
              + ", ".join(f"{leaf} {pods:.1f}" for leaf, pods in model.items()), flush=True)
        began = time.monotonic()
        bound: dict[str, int] = {}
        while time.monotonic() - began < within:
            bound = await self.bound()
            if also is not None:
                also(bound, time.monotonic() - began)
            reached = all(abs(bound[leaf] - model[leaf]) <= 1 for leaf in LEAVES)
            if reached or time.monotonic() - self.last_print >= 10:
                self.last_print = time.monotonic()
                print("\n".join(self.render(await self.status_tree(session), bound, model,
                                            pool_cpu, title)), flush=True)
            if reached:
                return time.monotonic() - began, bound
            await asyncio.sleep(1.0)  # sampling the apiserver, not waiting for a condition
        return None, bound

    async def remove(self) -> None:
        core = client.CoreV1Api(self.api)
        for namespace in self.namespaces.values():
            try:
                await core.delete_namespace(namespace)
            except ApiException as error:
                if error.status != 404:
                    raise


async def run(lockgate: Lockgate, apis: Mapping[str, client.ApiClient], pool: asyncpg.Pool,
              run_id: str) -> tuple[list[str], list[str]]:
    """The scene: (failures, summary lines)."""
    failures: list[str] = []
    summary = ["\n=== the queue tree (research borrows, production reclaims its guarantee) ==="]
    scene = TreeScene(lockgate, apis, pool, run_id)
    print(f"\nthe queue tree, in {TREE_CLUSTER}: research (weight 3: vision with alice and bob, "
          f"nlp with carol) and production (weight 2, guarantee {GUARANTEE_CPU} cpu); "
          "Deployments of 1-cpu preemptible pods, the scheduler running, preemption on; "
          "weight (%): over its siblings' (the root's other queues are idle here); target "
          "and holds: cpu, the leader's (`lockgate status --tree`); bound: the apiserver's "
          "pods on a node; model: devstack.fair_model's", flush=True)
    evicted = "SELECT count(*) FROM evictions WHERE kind = 'preempted'"
    try:
        async with aiohttp.ClientSession() as session:
            await scene.create(session)
            for leaf in ("alice", "bob", "carol"):
                await scene.scale(leaf)
                print(f"  {leaf}: {PODS[leaf]} pods", flush=True)
            borrowed, _ = await scene.until_model(
                session, ["alice", "bob", "carol"], "production idle: research borrows",
                within=SETTLE_SECONDS)
            if borrowed is None:
                failures.append("queue tree: research did not borrow the cluster as the model "
                                f"says within {SETTLE_SECONDS:.0f}s")
                return failures, [*summary, "  research did not borrow: stopped there"]
            summary.append(f"  production idle: research borrowed the whole cluster in "
                           f"{borrowed:.0f}s, each leaf within a pod of the model")
            before = int(await pool.fetchval(evicted))
            await scene.scale("production")
            print(f"  production: {PODS['production']} pods", flush=True)
            guaranteed_at: list[float] = []

            def watch(bound: Mapping[str, int], seconds: float) -> None:
                if not guaranteed_at and bound["production"] >= GUARANTEE_CPU:
                    guaranteed_at.append(seconds)

            settled, last = await scene.until_model(
                session, list(LEAVES), "production's work arrived: it reclaims its guarantee",
                within=SETTLE_SECONDS, also=watch)
            preempted = int(await pool.fetchval(evicted)) - before
            if not guaranteed_at:
                failures.append(f"queue tree: production never held its guarantee "
                                f"({GUARANTEE_CPU} cpu); it holds {last.get('production')}")
            elif guaranteed_at[0] > RECLAIM_SECONDS:
                failures.append(f"queue tree: production held its guarantee after "
                                f"{guaranteed_at[0]:.0f}s, over {RECLAIM_SECONDS:.0f}s")
            if settled is None:
                failures.append(f"queue tree: the leaves did not reach the model within "
                                f"{SETTLE_SECONDS:.0f}s: {last}")
            if preempted <= 0:
                failures.append("queue tree: production's room came without a preemption")
            summary.append(
                f"  production arrived: its guarantee ({GUARANTEE_CPU} cpu) "
                + (f"held after {guaranteed_at[0]:.0f}s" if guaranteed_at else "never held")
                + f", {preempted} research pods preempted; "
                + (f"every leaf within a pod of the model after {settled:.0f}s"
                   if settled is not None else "the leaves did not reach the model")
                + ": " + ", ".join(f"{leaf} {count}" for leaf, count in last.items()))
    finally:
        await scene.remove()
    summary.append(f"  {'PASS' if not failures else 'FAIL'}: judged against "
                   "devstack.fair_model.hierarchical_allocation")
    return failures, summary


async def _alone() -> int:
    """This part of the demo by itself: a fresh database and a lockgate of its own."""
    info = devstack.ensure_up()
    run_id = uuid.uuid4().hex[:5]
    dsn = await create_database(info.postgres_dsn, "lockgate_demo_tree", replace=True)
    lockgate = Lockgate.for_stack(info, postgres_dsn=dsn, run_id=f"demo-{run_id}",
                                  ports=ServicePorts.free(), extra_env={
                                      "LOCKGATE_SCHEDULER_PREEMPTION_ENABLED": "true"})
    apis = {cluster: await api_client(path) for cluster, path in info.kubeconfigs.items()}
    pool = await connect_pool(dsn, policy=RetryPolicy(), min_size=1, max_size=2)
    started = time.monotonic()
    try:
        await lockgate.start()
        failures, summary = await run(lockgate, apis, pool, run_id)
    finally:
        codes = await lockgate.stop()
        await pool.close()
        for api in apis.values():
            await api.close()
    failures += [f"{name} did not stop gracefully (exit code {code})"
                 for name, code in codes.items() if code not in (0, None)]
    print("\n".join(summary))
    print("\n".join(f"FAILED: {failure}" for failure in failures)
          or f"queue tree demo: OK in {time.monotonic() - started:.0f}s")
    return 1 if failures else 0


def main() -> None:
    sys.exit(asyncio.run(_alone()))


if __name__ == "__main__":
    main()
