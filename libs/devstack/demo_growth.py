"""`make demo`, the clusters-that-grow scene: real Karpenter grows the stack's autoscaled cluster
(cluster-c) from no node at all, for the queue that is owed room, not for the one over its share,
and shrinks it again when the work ends (docs/autoscaling.md).

Why a lockgate of its own: the scene watches cluster-c alone (under an alias of its own), so the
pool is that one cluster's nodes plus what its NodePool may still add, and nobody else's rows
count. cluster-c is shared with the tests: the scene holds its lock
(`devstack.karpenter_pools.autoscaled_cluster`), which empties it before and after.

The NodePool allows 6 nodes of 8 cpu (limit cpu=48); each pod asks for 2 cpu, so 3 fit a node
(7.9 cpu allocatable). Queues alpha and beta weigh the same.

1. alpha alone, with 15 pods: it is owed the whole pool, so lockgate releases them for growth
   (a LockgateReleasedForGrowth Event on each) and Karpenter makes 5 nodes, the fewest that hold
   them;
2. beta arrives with 12 pods, then alpha asks for 3 more. The independent model
   (`devstack.fair_model`, over 6 nodes: the 5 that exist and the 1 the pool may add) gives each
   queue 23.7 cpu: alpha holds 30, over its share, so none of its new pods is released and the
   cluster does not grow for them; beta, owed room, gets the sixth node;
3. the pods are deleted, and Karpenter's consolidation removes every node.

Each step passes or fails on what it checks; the summary says how many nodes were made against
the fewest the fair allocation needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack import karpenter_pools
from devstack.fair_model import Cluster, Demand, fair_allocation
from devstack.isolation import keep_only_clusters
from devstack.launcher import Lockgate
from devstack.ports import ServicePorts
from devstack.stack import StackInfo
from lockgate.labels import MANAGED_NAMESPACE_LABEL, QUEUE_LABEL
from lockgate.noticing import NoticeReason
from lockgate_adapters.postgres import connect_pool, create_database, migrate
from lockgate_adapters.settings import RetryPolicy

CLUSTER = karpenter_pools.AUTOSCALED_CLUSTER
POOL, NODE_CLASS = "demo-growth", "demo-growth"
NODE_CPU, NODE_ALLOCATABLE_CPU, MAX_NODES = 8, 7.9, 6  # c-8x-amd64-linux keeps 100m back
POD_CPU, POD_MEMORY = 2, "1Gi"
PODS_PER_NODE = int(NODE_ALLOCATABLE_CPU // POD_CPU)
ALPHA_FIRST, BETA, ALPHA_MORE = 15, 12, 3
QUEUES = ("alpha", "beta")
SERVICES = ("queue-store", "admission-webhook", "cluster-watcher", "ungater", "fair-scheduler")
# Karpenter provisions within seconds here (batch window 1s to 10s; kwok's nodes are Ready at
# once); these bound a step that goes wrong.
GROW_WITHIN, SHRINK_WITHIN = 120.0, 150.0
REGISTRATION_DELAY = "10s"


@dataclass
class GrowthDemo:
    """What the summary says about the scene."""

    alias: str = ""
    steps: list[str] = field(default_factory=list)  # what happened, in order
    nodes_made: int = 0  # nodes Karpenter made in all
    fewest_nodes: int = 0  # the fewest nodes the fair allocation needed
    started: float = 0.0  # monotonic time the scene had cluster-c to itself
    failures: list[str] = field(default_factory=list)

    def print_summary(self) -> None:
        print(f"\n=== clusters that grow ({CLUSTER} with Karpenter, from 0 nodes) ===")
        for line in self.steps:
            print(f"  {line}")
        print(f"  nodes made: {self.nodes_made}, the fewest the fair allocation needs: "
              f"{self.fewest_nodes}")
        for failure in self.failures:
            print(f"  FAILED: {failure}")


async def run_and_summarise(info: StackInfo) -> list[str]:
    """Run the scene, print its summary section; returns what failed."""
    result = GrowthDemo()
    started = time.monotonic()
    try:
        await run(info.including_autoscaled(), result)
    except (RuntimeError, TimeoutError, ApiException, asyncpg.PostgresError,
            aiohttp.ClientError) as error:
        result.failures.append(f"clusters that grow: {type(error).__name__}: {error}")
    waited = result.started - started if result.started else 0.0
    result.steps.append(f"the scene took {time.monotonic() - started:.0f}s" + (
        f", {waited:.0f}s of it waiting for {CLUSTER}'s other users" if waited >= 1 else ""))
    result.print_summary()
    return result.failures


def say(result: GrowthDemo, line: str) -> None:
    result.steps.append(line)
    print(f"  growth: {line}", flush=True)


async def run(info: StackInfo, result: GrowthDemo) -> None:
    if CLUSTER not in info.kubeconfigs:
        raise RuntimeError(f"the stack has no autoscaled {CLUSTER}: `python -m devstack up "
                           f"--autoscaled {CLUSTER}` (make demo does)")
    tag = uuid.uuid4().hex[:5]
    alias = result.alias = f"demo-{tag}-grow-c"
    namespace = f"demo-{tag}-grow"
    dsn = await create_database(info.postgres_dsn, "lockgate_demo_growth", replace=True)
    migrating = await connect_pool(dsn, policy=RetryPolicy(), min_size=1, max_size=1)
    try:
        await migrate(migrating)
    finally:
        await migrating.close()
    await keep_only_clusters(dsn, [alias])
    lockgate = Lockgate.for_stack(
        info, clusters={alias: CLUSTER}, postgres_dsn=dsn, run_id=f"demo-{tag}-grow",
        ports=ServicePorts.free(),
        extra_env={"LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1",
                   # The pool's nodes, as Karpenter's kwok provider makes them.
                   "LOCKGATE_SCHEDULER_GROWTH_INSTANCE_SHAPES": json.dumps(
                       {POOL: {"cpu": str(NODE_CPU), "memory": "16Gi"}}),
                   "LOCKGATE_SCHEDULER_GROWTH_NODE_OVERHEAD": json.dumps({"cpu": "100m"})})
    print(f"\nclusters that grow: {CLUSTER} (watched as {alias}) with real Karpenter, a NodePool "
          f"of at most {MAX_NODES} nodes of {NODE_CPU} cpu, starting from 0 nodes", flush=True)
    async with karpenter_pools.autoscaled_cluster(info) as api:
        result.started = time.monotonic()
        core = client.CoreV1Api(api)
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        try:
            # Nodes register a few seconds after their NodeClaims, as a cloud's take a while:
            # long enough to read what a pod released for growth is told while it waits.
            await karpenter_pools.apply_node_class(api, NODE_CLASS,
                                                   registration_delay=REGISTRATION_DELAY)
            await karpenter_pools.apply_node_pool(api, karpenter_pools.node_pool(
                POOL, node_class=NODE_CLASS, cpu_limit=str(NODE_CPU * MAX_NODES),
                consolidation_policy="WhenEmpty", consolidate_after="5s"))
            await karpenter_pools.eventually(
                lambda: karpenter_pools.node_pool_ready(api, POOL), within=60,
                what=f"NodePool {POOL} to be Ready")
            await lockgate.start(only=SERVICES)
            async with aiohttp.ClientSession(headers=lockgate.admin_headers) as session:
                await _scene(lockgate, session, api, core, pool, namespace, result)
        finally:
            with contextlib.suppress(ApiException):
                await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
            with contextlib.suppress(ApiException):
                await core.delete_namespace(namespace)
            codes = await lockgate.stop()
            result.failures += [f"{name} did not stop gracefully ({code})"
                                for name, code in codes.items() if code not in (0, None)]
            await pool.close()


async def _scene(lockgate: Lockgate, session: aiohttp.ClientSession, api: client.ApiClient,
                 core: client.CoreV1Api, pool: asyncpg.Pool, namespace: str,
                 result: GrowthDemo) -> None:
    binding = [{"cluster": "*", "names": [namespace]}]
    for name in QUEUES:
        async with session.post(f"{lockgate.admin_url}/api/v1/queues",
                                json={"name": name, "namespaces": binding}) as response:
            if response.status not in (200, 201):
                raise RuntimeError(f"queue {name}: {await response.text()}")
    await lockgate.wait_for_queues({name: {"cordoned": False, "namespaces": binding}
                                    for name in QUEUES})
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": namespace,
        "labels": {MANAGED_NAMESPACE_LABEL: "true", **lockgate.run_namespace_labels}}})
    await _service_account(core, namespace)
    alias = result.alias
    status = f"{lockgate.admin_url}/api/v1/status"

    # 1. alpha alone: owed the whole pool, so its pods are released for growth.
    say(result, f"alpha creates {ALPHA_FIRST} pods of {POD_CPU} cpu; {CLUSTER} has "
                f"{len(await karpenter_pools.list_nodes(api))} nodes")
    await _create(core, namespace, "alpha", range(ALPHA_FIRST))
    first = _fewest_nodes(ALPHA_FIRST)
    released = ""

    async def explained_as_released() -> bool:
        nonlocal released
        released = await _explain(session, lockgate, alias, namespace, "alpha-0")
        return "released so that" in released
    try:
        await karpenter_pools.eventually(explained_as_released, within=60, every=0.5,
                                         what="alpha-0 explained as released for growth")
    except TimeoutError:
        result.failures.append(f"alpha-0 was never explained as released for growth; last: "
                               f"{released!r}")
    say(result, f"while its node is made, lockgate explain {alias}/{namespace}/alpha-0: "
                f"\"{released}\"")
    await _wait(lambda: _bound(core, namespace, "alpha"), ALPHA_FIRST, GROW_WITHIN,
                f"alpha's {ALPHA_FIRST} pods to run on new nodes")
    nodes = await karpenter_pools.list_nodes(api, POOL)
    say(result, f"Karpenter made {len(nodes)} nodes for alpha's {ALPHA_FIRST} pods (the fewest: "
                f"{first}); all {ALPHA_FIRST} run")
    if len(nodes) != first:
        result.failures.append(f"alpha alone: {len(nodes)} nodes made, {first} needed")
    told = await _growth_events(core, namespace)
    if told:
        say(result, f"{len(told)} pods were told (Event {NoticeReason.RELEASED_FOR_GROWTH}): "
                    f"\"{told[0]}\"")
    if len(told) < ALPHA_FIRST or not all(f"released so that {alias} grows (NodePool {POOL}"
                                          in words for words in told):
        result.failures.append(f"alpha alone: {len(told)} of {ALPHA_FIRST} pods told they were "
                               f"released for growth, in the words expected ({told[:1]})")
    await _say_growth(session, status, alias, result)

    # 2. beta arrives; then alpha, over its share, asks for more.
    say(result, f"beta (same weight) creates {BETA} pods; once lockgate has them, alpha "
                f"creates {ALPHA_MORE} more")
    await _create(core, namespace, "beta", range(BETA))
    await _wait(lambda: _count(pool, "SELECT count(*) FROM jobs WHERE queue = 'beta'"), BETA,
                60, "beta's pods to reach lockgate")
    demands = {"alpha": ALPHA_FIRST + ALPHA_MORE, "beta": BETA}
    shares = _model_pods(demands)
    alpha_held = ALPHA_FIRST
    say(result, f"the model's fair allocation over {MAX_NODES} nodes (5 exist, 1 may be added): "
                f"alpha {shares['alpha']:.1f} pods, beta {shares['beta']:.1f}; alpha holds "
                f"{alpha_held}: over its share, so the cluster may grow for beta only")
    if alpha_held < shares["alpha"]:
        result.failures.append(f"the scene is wrong: alpha holds {alpha_held} pods, its fair "
                               f"allocation is {shares['alpha']:.1f}")
    await _create(core, namespace, "alpha", range(ALPHA_FIRST, ALPHA_FIRST + ALPHA_MORE))
    beta_room = MAX_NODES * PODS_PER_NODE - ALPHA_FIRST
    await _wait(lambda: _bound(core, namespace, "beta"), beta_room, GROW_WITHIN,
                f"beta's first {beta_room} pods to run on the node made for them")
    await asyncio.sleep(5)  # rounds that could release alpha's new pods, if lockgate would
    released_more = await _count(
        pool, "SELECT count(*) FROM jobs WHERE queue = 'alpha' AND released_at IS NOT NULL")
    nodes = await karpenter_pools.list_nodes(api, POOL)
    say(result, f"beta's {beta_room} pods run on node {len(nodes)}; alpha's new pods released: "
                f"{released_more - ALPHA_FIRST}")
    if released_more != ALPHA_FIRST:
        result.failures.append(f"alpha, over its share, had {released_more - ALPHA_FIRST} more "
                               "pods released")
    if len(nodes) != MAX_NODES:
        result.failures.append(f"after beta: {len(nodes)} nodes, {MAX_NODES} expected")
    # Never more released for growth than the pool can make: every beta pod released is bound.
    beta_released = await _count(
        pool, "SELECT count(*) FROM jobs WHERE queue = 'beta' AND released_at IS NOT NULL")
    if beta_released != beta_room:
        result.failures.append(f"beta had {beta_released} pods released where the pool could "
                               f"make room for {beta_room}: "
                               f"{beta_released - beta_room} wait for a node that will not come")
    result.nodes_made = len(nodes)
    result.fewest_nodes = _fewest_nodes(ALPHA_FIRST + beta_room)
    held = await _explained(session, lockgate, alias, namespace, f"alpha-{ALPHA_FIRST}")
    say(result, f"lockgate explain {alias}/{namespace}/alpha-{ALPHA_FIRST}: "
                f"\"{held.get('message')}\"")
    # Over its share: the fair-share reason, or the growth words while the pool has room left
    # ("held: over its fair share, so the cluster will not grow for it").
    standing = held.get("explanation") or {}
    if standing.get("reason") != "fair_share" and standing.get("growth_standing") != "over_share":
        result.failures.append(f"alpha's held pod is not said to wait for being over its share: "
                               f"{held.get('message')!r}")
    beta_waiting = await _explain(session, lockgate, alias, namespace, f"beta-{BETA - 1}")
    say(result, f"lockgate explain {alias}/{namespace}/beta-{BETA - 1}: \"{beta_waiting}\"")
    await _say_growth(session, status, alias, result)

    # 3. the work ends: consolidation removes the empty nodes.
    await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    shrink_started = time.monotonic()
    say(result, "every pod deleted; waiting for Karpenter to remove the empty nodes")
    await karpenter_pools.wait_for_no_nodes(api, POOL, within=SHRINK_WITHIN)
    say(result, f"{CLUSTER} is back to 0 nodes after {time.monotonic() - shrink_started:.0f}s")


def _model_pods(demands: dict[str, int]) -> dict[str, float]:
    """Each queue's fair allocation in pods, from the independent model, over the pool's whole
    size (the nodes that exist plus those the NodePool may add)."""
    shape = {"cpu": POD_CPU * 1000.0}
    allocation = fair_allocation(
        clusters=[Cluster.of(CLUSTER, {"cpu": MAX_NODES * NODE_ALLOCATABLE_CPU * 1000})],
        weights=dict.fromkeys(QUEUES, 1.0),
        demands=[Demand(queue, CLUSTER, shape, count) for queue, count in demands.items()],
        resources=("cpu",))
    return {queue: allocation.pods(queue) for queue in QUEUES}


def _fewest_nodes(pods: int) -> int:
    """The fewest nodes that hold `pods` of the scene's size."""
    return math.ceil(pods / PODS_PER_NODE)


async def _say_growth(session: aiohttp.ClientSession, url: str, alias: str,
                      result: GrowthDemo) -> None:
    """What `lockgate status -o wide` shows of the cluster (queue-store's status, the leader's
    growth)."""
    async with session.get(url) as response:
        body = await response.json()
    growth = {entry.get("cluster"): entry for entry in body.get("growth") or []}.get(alias)
    if growth is None:
        result.failures.append(f"lockgate status shows no growth of {alias}: {body.get('growth')}")
        return
    pools = "; ".join(f"{p['name']}: " + (p["why_none"] if p["why_none"] else
                                          f"{p['headroom_nodes']} nodes more (cpu "
                                          f"{p['headroom'].get('cpu', 0) / 1000:g} left)")
                      for p in growth["node_pools"])
    say(result, f"lockgate status -o wide: {alias}: {growth['nodes']} nodes, cpu "
                f"{growth['capacity'].get('cpu', 0) / 1000:g}; headroom {pools}; "
                f"{growth['released_unbound']} released waiting for a node; "
                f"{growth['stalled'] or growth['waiting'] or 'growth ok'}")


async def _explain(session: aiohttp.ClientSession, lockgate: Lockgate, alias: str,
                   namespace: str, pod: str) -> str:
    """What `lockgate explain` says of the pod (queue-store's API, asking the leader)."""
    return str((await _explained(session, lockgate, alias, namespace, pod)).get("message"))


async def _explained(session: aiohttp.ClientSession, lockgate: Lockgate, alias: str,
                     namespace: str, pod: str) -> dict[str, Any]:
    async with session.get(f"{lockgate.admin_url}/api/v1/explain/{alias}/{namespace}/{pod}"
                           ) as response:
        body: dict[str, Any] = await response.json()
    return body


async def _create(core: client.CoreV1Api, namespace: str, queue: str, indexes: range) -> None:
    for i in indexes:
        await core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{queue}-{i}", "labels": {QUEUE_LABEL: queue}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "registry.invalid/demo:1",
                                     "resources": {"requests": {"cpu": str(POD_CPU),
                                                                "memory": POD_MEMORY}}}]}})


async def _bound(core: client.CoreV1Api, namespace: str, queue: str) -> int:
    pods = (await core.list_namespaced_pod(namespace, label_selector=f"{QUEUE_LABEL}={queue}")
            ).items
    return sum(1 for pod in pods if pod.spec.node_name)


async def _growth_events(core: client.CoreV1Api, namespace: str) -> list[str]:
    events = (await core.list_namespaced_event(namespace)).items
    return [event.message for event in events
            if event.reason == NoticeReason.RELEASED_FOR_GROWTH.value]


async def _count(pool: asyncpg.Pool, query: str) -> int:
    return int(await pool.fetchval(query))


async def _wait(probe: Callable[[], Awaitable[int]], want: int, within: float,
                what: str) -> None:
    got = 0

    async def reached() -> bool:
        nonlocal got
        got = await probe()
        return got >= want

    await karpenter_pools.eventually(reached, within=within,
                                     what=lambda: f"{what} ({got} of {want})")


async def _service_account(core: client.CoreV1Api, namespace: str) -> None:
    async def found() -> bool:
        try:
            await core.read_namespaced_service_account("default", namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            return False
        return True

    await karpenter_pools.eventually(found, within=60, what=f"namespace {namespace}'s "
                                                            "default ServiceAccount")


def main() -> None:
    """`python -m devstack.demo_growth`: the scene alone, on the running stack (cluster-c is
    started if missing)."""
    import sys

    import devstack

    info = devstack.ensure_up(autoscaled=[CLUSTER])
    failures = asyncio.run(run_and_summarise(info))
    print("RESULT:", "PASS" if not failures else "FAIL")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
