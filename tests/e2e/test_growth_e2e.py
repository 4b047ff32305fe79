"""Clusters that grow, end to end (issue 35's "Done when"): lockgate's services as processes,
real Karpenter (its kwok provider) on the stack's autoscaled cluster-c, which starts with no
node. The issue calls it cluster-b; lockgate knows it under the run's alias.

The NodePool allows 64 cpu of 8-cpu instances (c-8x-amd64-linux: 7900m allocatable once the
provider's 100m overhead is taken), consolidated WhenEmpty after 5 s. Every pod asks for 1975m,
a quarter of a node's allocatable, so the capacity that can exist is exactly 8 nodes x 4 pods
and the fluid fair allocation is also one of whole pods (no packing loss to argue about).

Everything fair is judged by the independent model (devstack.fair_model) over the capacity the
TEST computes from the NodePool's limits and the instance type's allocatable (checked against
the first real node), never from lockgate's report. What Karpenter did is read from the
apiserver: nodes, NodeClaims, and its `Nominated` Events (the pods it provisions for).

- Growth: queue w2 (weight 2) sends a gang of 8, then w2 and w1 (weight 1) send Deployments of
  16 and 24 pods a few seconds apart: 48 pods, 94.8 cpu asked of 63.2 that can exist. The
  cluster grows to at most its limits; each queue ends within one pod of the model; every pod
  Karpenter nominated was released while its queue was below its fair allocation for the demand
  of the time; the gang's nodes come from one batch; once the work is deleted, consolidation
  empties the cluster and lockgate's picture of it follows.
- At the limits: w1 fills the cluster alone; w3 (same weight) arrives and gets its half by
  preemption, no NodeClaim made for it, the limits never exceeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from devstack.fair_model import Cluster, Demand, fair_allocation
from devstack.stack import StackInfo
from helpers.karpenter import (
    AUTOSCALED_CLUSTER,
    KWOK_GROUP,
    apply_node_class,
    apply_node_pool,
    autoscaled_cluster,
    cpu_of,
    list_node_claims,
    list_nodes,
    node_claims_cpu,
    node_pool,
    node_pool_ready,
    nodes_cpu,
)
from helpers.pods import a_deployment, a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.groups import GROUP_LABEL, GROUP_SIZE_KEY
from lockgate.labels import PREEMPTIBLE_LABEL, SCHEDULING_GATE
from lockgate.resources import canonical_amount

# 900 s: the test waits its turn for cluster-c (helpers.karpenter.autoscaled_cluster) inside it.
pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

CPU_LIMIT = 64.0  # the NodePool's limits
INSTANCE_CPU = 8.0  # c-8x-amd64-linux
INSTANCE_MEMORY = "16Gi"
# c-8x-amd64-linux's allocatable is 7900m and 16374Mi: 100m cpu and 10Mi memory kept back.
NODE_OVERHEAD = {"cpu": "100m", "memory": "10Mi"}
# What the test expects of one such node; checked against the first real node (if Karpenter's
# kwok provider changes its overhead, the test says so instead of judging with a wrong model).
INSTANCE_ALLOCATABLE_CPU = 7.9
POD_CPU = "1975m"  # a quarter of 7900m
MEMORY = "64Mi"
GANG_SIZE = 8
# Karpenter's provisioning batch window here (LOCKGATE_KARPENTER_BATCH_MAX).
BATCH_WINDOW_SECONDS = 10.0
# How far lockgate's picture of the cluster may lag the apiserver (watcher, Kafka, queue-store,
# the leader's feed): a release is judged with the other queues' demand as the scheduler could
# have known it (the smaller of now and this long ago), never with pods it could not have seen.
PIPELINE_LAG_SECONDS = 5.0
SAMPLE_SECONDS = 0.3


def pods_per_node() -> int:
    return int(INSTANCE_ALLOCATABLE_CPU * 1000 // canonical_amount("cpu", POD_CPU))


def capacity_that_can_exist(alias: str) -> Cluster:
    """Existing nodes plus headroom, from the pool's limits and the instance's allocatable
    alone: whole instances within the limits, whole pods per instance."""
    instances = int(CPU_LIMIT // INSTANCE_CPU)
    pods = instances * pods_per_node()
    shape = pod_shape()
    return Cluster.of(alias, {"cpu": pods * shape["cpu"], "memory": pods * shape["memory"]})


def pod_shape() -> dict[str, float]:
    return {"cpu": float(canonical_amount("cpu", POD_CPU)),
            "memory": float(canonical_amount("memory", MEMORY))}


def model_pods(alias: str, weights: Mapping[str, float],
               demand: Mapping[str, int]) -> dict[str, float]:
    """The independent model's fair allocation, in pods, of each queue."""
    demands = [Demand(queue, alias, pod_shape(), count)
               for queue, count in demand.items() if count > 0]
    if not demands:
        return dict.fromkeys(weights, 0.0)
    model = fair_allocation(clusters=[capacity_that_can_exist(alias)], weights=dict(weights),
                            demands=demands)
    return {queue: model.pods(queue) if demand.get(queue) else 0.0 for queue in weights}


# ---- what the apiserver shows, sampled ----------------------------------------------------


@dataclass
class PodLife:
    """One pod as the sampler saw it (monotonic seconds)."""

    name: str
    queue: str
    seen: float
    released: float | None = None  # first look without lockgate's gate
    node: str | None = None
    gone: float | None = None  # deleted (or being deleted)


@dataclass
class Samples:
    pods: dict[str, PodLife] = field(default_factory=dict)  # by namespace/name
    peak_nodes: int = 0
    peak_nodes_cpu: float = 0.0
    peak_claims_cpu: float = 0.0
    peak_claims: int = 0
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)  # every one seen, by name
    looks: int = 0

    def demand(self, queue: str, at: float) -> int:
        return sum(1 for p in self.pods.values() if p.queue == queue and p.seen <= at
                   and (p.gone is None or p.gone > at))

    def held(self, queue: str, at: float) -> int:
        """The queue's pods released before `at` and not gone by then."""
        return sum(1 for p in self.pods.values() if p.queue == queue
                   and p.released is not None and p.released < at
                   and (p.gone is None or p.gone > at))


@contextlib.asynccontextmanager
async def sampling(admin: client.ApiClient, pool: str,
                   namespaces: Mapping[str, str]) -> AsyncIterator[Samples]:
    """Every SAMPLE_SECONDS: the queues' pods (namespace -> queue), the pool's nodes and
    NodeClaims; peaks kept for the whole block."""
    samples = Samples()
    core = client.CoreV1Api(admin)

    async def look() -> None:
        now = time.monotonic()
        present: set[str] = set()
        for namespace, queue in namespaces.items():
            for pod in (await core.list_namespaced_pod(namespace)).items:
                key = f"{namespace}/{pod.metadata.name}"
                life = samples.pods.setdefault(key, PodLife(pod.metadata.name, queue, now))
                if pod.metadata.deletion_timestamp is not None:
                    life.gone = life.gone or now
                    continue
                present.add(key)
                gated = any(g.name == SCHEDULING_GATE for g in pod.spec.scheduling_gates or ())
                if not gated and life.released is None:
                    life.released = now
                life.node = pod.spec.node_name or life.node
        for key, life in samples.pods.items():
            if key not in present and life.gone is None:
                life.gone = now
        nodes = await list_nodes(admin, pool)
        claims = await list_node_claims(admin, pool)
        samples.peak_nodes = max(samples.peak_nodes, len(nodes))
        samples.peak_nodes_cpu = max(samples.peak_nodes_cpu, nodes_cpu(nodes))
        samples.peak_claims_cpu = max(samples.peak_claims_cpu, node_claims_cpu(claims))
        samples.peak_claims = max(samples.peak_claims, len(claims))
        for claim in claims:
            samples.claims[claim["metadata"]["name"]] = claim
        samples.looks += 1

    async def loop() -> None:
        while True:
            await look()
            await asyncio.sleep(SAMPLE_SECONDS)

    task = asyncio.create_task(loop(), name="growth-sampler")
    try:
        yield samples
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert samples.looks > 10, f"the cluster was sampled only {samples.looks} times"


def assert_within_limits(samples: Samples) -> None:
    assert samples.peak_nodes_cpu <= CPU_LIMIT, (
        f"the nodes' cpu peaked at {samples.peak_nodes_cpu} (NodePool limit {CPU_LIMIT})")
    assert samples.peak_claims_cpu <= CPU_LIMIT, (
        f"the NodeClaims' cpu peaked at {samples.peak_claims_cpu} (limit {CPU_LIMIT}): "
        f"{sorted(samples.claims)}")
    assert samples.peak_nodes <= CPU_LIMIT // INSTANCE_CPU, samples.peak_nodes


async def nominated(admin: client.ApiClient, namespace: str) -> dict[str, str]:
    """Pod name -> the NodeClaim Karpenter's `Nominated` Event names for it (it provisions for
    the pods it nominates to a NodeClaim; a nomination to an existing node makes no claim)."""
    events = await client.CoreV1Api(admin).list_namespaced_event(
        namespace, field_selector="involvedObject.kind=Pod,reason=Nominated")
    found: dict[str, str] = {}
    for event in events.items:
        source = event.source.component if event.source else ""
        message = event.message or ""
        if (source == "karpenter" or event.reporting_component == "karpenter") and (
                "nodeclaim/" in message):
            found[event.involved_object.name] = message.split("nodeclaim/", 1)[1].split()[0]
    return found


# ---- the run ----------------------------------------------------------------------------


@dataclass
class GrowthRun:
    run: LockgateRun
    admin: client.ApiClient  # the autoscaled cluster, admin
    alias: str
    pool: str
    namespaces: dict[str, str]  # queue -> its namespace in the autoscaled cluster
    weights: dict[str, float]


@contextlib.asynccontextmanager
async def growth_run(stack: StackInfo, tmp_path: Path, name: str,
                     weights: Mapping[str, float]) -> AsyncIterator[GrowthRun]:
    async with autoscaled_cluster(stack) as admin:
        tag = name
        node_class, pool = f"kwok-{tag}", f"pool-{tag}"
        await apply_node_class(admin, node_class)
        manifest = node_pool(pool, node_class=node_class, cpu_limit=f"{CPU_LIMIT:.0f}",
                             consolidation_policy="WhenEmpty", consolidate_after="5s")
        # The instance's size as a requirement on the provider's well-known label, which is
        # what lockgate reads when no node of the pool exists yet (docs/autoscaling.md).
        manifest["spec"]["template"]["spec"]["requirements"] += [
            {"key": f"{KWOK_GROUP}/instance-cpu", "operator": "In",
             "values": [f"{INSTANCE_CPU:.0f}"]},
            {"key": f"{KWOK_GROUP}/instance-memory", "operator": "In",
             "values": [INSTANCE_MEMORY]}]
        await apply_node_pool(admin, manifest)
        await eventually(lambda: node_pool_ready(admin, pool), within=60, every=0.5,
                         what=f"NodePool {pool} Ready")
        async with lockgate_run(stack, tmp_path, name=name, clusters=(AUTOSCALED_CLUSTER,),
                                env={
                                    "LOCKGATE_SCHEDULER_PREEMPTION_ENABLED": "true",
                                    "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1",
                                    # What Karpenter's kwok instances keep back, so that
                                    # lockgate's virtual nodes are the real ones' size
                                    # (checked on the first real node).
                                    "LOCKGATE_SCHEDULER_GROWTH_NODE_OVERHEAD": json.dumps(
                                        NODE_OVERHEAD),
                                }) as run:
            alias = run.alias(AUTOSCALED_CLUSTER)
            namespaces = {run.name(queue): run.name(f"ns-{queue}") for queue in weights}
            for queue, weight in weights.items():
                await run.create_queue(run.name(queue),
                                       namespaces=[namespaces[run.name(queue)]],
                                       priority_factor=1 / weight)
            for namespace in namespaces.values():
                await run.create_namespace(alias, namespace)
            yield GrowthRun(run, admin, alias, pool, namespaces,
                            {run.name(q): w for q, w in weights.items()})


def deployment(name: str, queue: str, replicas: int) -> dict[str, Any]:
    pod = (a_pod(name).in_queue(queue).requesting(cpu=POD_CPU, memory=MEMORY)
           .labelled({PREEMPTIBLE_LABEL: "true"}))
    return a_deployment(name).with_replicas(replicas).of(pod).manifest()


def gang_member(name: str, queue: str, group: str) -> dict[str, Any]:
    return (a_pod(name).in_queue(queue).requesting(cpu=POD_CPU, memory=MEMORY)
            .labelled({GROUP_LABEL: group}).annotated({GROUP_SIZE_KEY: str(GANG_SIZE)})
            .manifest())


async def bound_pods(growth: GrowthRun) -> dict[str, int]:
    """Each queue's pods on a node, not being deleted, as the apiserver shows them."""
    core = client.CoreV1Api(growth.admin)
    counts: dict[str, int] = {}
    for queue, namespace in growth.namespaces.items():
        pods = (await core.list_namespaced_pod(namespace)).items
        counts[queue] = sum(1 for p in pods if p.spec.node_name
                            and p.metadata.deletion_timestamp is None
                            and p.status.phase in ("Pending", "Running"))
    return counts


async def what_lockgate_says(growth: GrowthRun) -> str:
    """lockgate's explanation of one gated pod of each queue, for a failure's message."""
    said: list[str] = []
    core = client.CoreV1Api(growth.admin)
    async with aiohttp.ClientSession(headers=growth.run.lockgate.admin_headers) as session:
        for namespace in growth.namespaces.values():
            gated = [p for p in (await core.list_namespaced_pod(namespace)).items
                     if any(g.name == SCHEDULING_GATE for g in p.spec.scheduling_gates or ())]
            if not gated:
                continue
            url = (f"{growth.run.lockgate.admin_url}/api/v1/pods/{growth.alias}/{namespace}/"
                   f"{gated[0].metadata.name}")
            async with session.get(url) as reply:
                said.append(f"{gated[0].metadata.name}: {reply.status} {await reply.text()}")
    return "\n".join(said) or "no gated pod"


async def first_node_matches_the_instance(growth: GrowthRun) -> None:
    """The model's capacity assumes INSTANCE_ALLOCATABLE_CPU per node: check it on a real one."""
    async def some() -> list[client.V1Node] | None:
        return await list_nodes(growth.admin, growth.pool) or None

    try:
        nodes = await eventually(some, within=90, every=0.5,
                                 what=f"a node of NodePool {growth.pool}")
    except AssertionError as error:
        raise AssertionError(f"{error}; lockgate says:\n{await what_lockgate_says(growth)}"
                             ) from None
    allocatable = cpu_of(str(nodes[0].status.allocatable["cpu"]))
    print(f"first node {nodes[0].metadata.name}: allocatable {nodes[0].status.allocatable}, "
          f"labels {nodes[0].metadata.labels}")
    assert allocatable == INSTANCE_ALLOCATABLE_CPU, (
        f"a c-8x-amd64-linux node has {allocatable} cpu allocatable, the test's model assumes "
        f"{INSTANCE_ALLOCATABLE_CPU}")
    # lockgate's virtual node is the pool's instance size (its requirements) less the overhead
    # setting: never bigger than the node Karpenter makes, or room is promised that is not there.
    for resource, instance in (("cpu", f"{INSTANCE_CPU:.0f}"), ("memory", INSTANCE_MEMORY)):
        virtual = canonical_amount(resource, instance) - canonical_amount(
            resource, NODE_OVERHEAD[resource])
        real = canonical_amount(resource, str(nodes[0].status.allocatable[resource]))
        assert virtual == real, (
            f"lockgate's virtual node has {resource} {virtual}, the real node {real}")


def check_nominations(samples: Samples, growth: GrowthRun,
                      nominations: Mapping[str, Mapping[str, str]]) -> int:
    """Every pod Karpenter provisioned for was released while its queue was below its fair
    allocation (within one pod) for the demand existing then. Returns how many were judged."""
    judged = 0
    problems: list[str] = []
    for queue, namespace in growth.namespaces.items():
        for pod_name, claim in nominations[queue].items():
            life = samples.pods.get(f"{namespace}/{pod_name}")
            assert life is not None and life.released is not None, (
                f"Karpenter nominated pod {pod_name} (NodeClaim {claim}) that the test never "
                "saw released: a gated pod made a NodeClaim")
            at = life.released
            # Pods released in the same look: count them in line before this one, so a round
            # releasing several is judged pod by pod, as it decided them.
            same_look = sorted(p.name for p in samples.pods.values()
                               if p.queue == queue and p.released == at)
            held_before = samples.held(queue, at) + same_look.index(pod_name)
            demand = {other: (samples.demand(other, at) if other == queue else min(
                samples.demand(other, at), samples.demand(other, at - PIPELINE_LAG_SECONDS)))
                for other in growth.weights}
            fair = model_pods(growth.alias, growth.weights, demand)[queue]
            judged += 1
            if held_before >= fair + 1:
                problems.append(f"{pod_name} of {queue}: released holding {held_before}, fair "
                                f"{fair:.2f} for demand {demand}; NodeClaim {claim}")
    assert not problems, "Karpenter provisioned for pods over their share:\n" + "\n".join(
        problems)
    return judged


# ---- 1. growth ---------------------------------------------------------------------------


async def test_the_cluster_grows_fairly_within_its_limits_and_shrinks_when_the_work_ends(
        autoscaled_stack: StackInfo, tmp_path: Path) -> None:
    async with growth_run(autoscaled_stack, tmp_path, "grow",
                          {"w1": 1.0, "w2": 2.0}) as growth:
        run, admin, alias = growth.run, growth.admin, growth.alias
        w1, w2 = run.name("w1"), run.name("w2")
        core, apps = run.core(alias), run.apps(alias)
        assert await list_nodes(admin) == [], "the autoscaled cluster must start with no node"
        by_namespace = {ns: queue for queue, ns in growth.namespaces.items()}
        async with sampling(admin, growth.pool, by_namespace) as samples:
            # A gang of 8 released for growth: two nodes, made in one batch.
            gang = [f"gang-{i}" for i in range(GANG_SIZE)]
            for pod_name in gang:
                await core.create_namespaced_pod(growth.namespaces[w2],
                                                 gang_member(pod_name, w2, "g8"))
            await first_node_matches_the_instance(growth)

            async def gang_bound() -> set[str] | None:
                pods = [await core.read_namespaced_pod(name, growth.namespaces[w2])
                        for name in gang]
                nodes = {p.spec.node_name for p in pods}
                return None if None in nodes else nodes  # type: ignore[return-value]

            gang_nodes = await eventually(gang_bound, within=120, every=0.5,
                                          what="the gang's 8 pods bound")
            gang_claims = [c for c in samples.claims.values()
                           if (c.get("status") or {}).get("nodeName") in gang_nodes]
            gang_claims += [c for c in await list_node_claims(admin, growth.pool)
                            if (c.get("status") or {}).get("nodeName") in gang_nodes
                            and c["metadata"]["name"] not in {
                                g["metadata"]["name"] for g in gang_claims}]
            assert len(gang_claims) == len(gang_nodes) == GANG_SIZE // pods_per_node(), (
                f"the gang's nodes {gang_nodes}, their NodeClaims "
                f"{[c['metadata']['name'] for c in gang_claims]}")
            created = sorted(datetime.fromisoformat(c["metadata"]["creationTimestamp"])
                             for c in gang_claims)
            spread = (created[-1] - created[0]).total_seconds()
            assert spread <= BATCH_WINDOW_SECONDS, (
                f"the gang's NodeClaims were made {spread}s apart: not one batch")

            # The Deployments, a few seconds apart, the scheduler running.
            await apps.create_namespaced_deployment(growth.namespaces[w2],
                                                    deployment(f"{w2}-d", w2, 16))
            await asyncio.sleep(3)
            await apps.create_namespaced_deployment(growth.namespaces[w1],
                                                    deployment(f"{w1}-d", w1, 24))
            want = model_pods(alias, growth.weights, {w1: 24, w2: GANG_SIZE + 16})
            assert round(want[w1] * 3) == 32 and round(want[w2] * 3) == 64, want  # 1 : 2 of 32

            last: dict[str, int] = {}

            async def at_fair_allocation() -> dict[str, int] | None:
                last.update(await bound_pods(growth))
                return dict(last) if all(abs(last[q] - want[q]) <= 1 for q in want) else None

            reached = await eventually(
                at_fair_allocation, within=240, every=1.0,
                what=lambda: f"bound pods within one of the model's {want} (last seen {last})")
            nominations = {queue: await nominated(admin, namespace)
                           for queue, namespace in growth.namespaces.items()}
            assert sum(map(len, nominations.values())) >= GANG_SIZE, (
                f"Karpenter's Nominated Events name too few pods: {nominations}")
            judged = check_nominations(samples, growth, nominations)

            # lockgate's picture has the nodes the apiserver has.
            async def lockgate_nodes() -> int:
                return int(await run.pool.fetchval(
                    "SELECT count(*) FROM cluster_nodes WHERE cluster = $1 AND present",
                    alias))

            real = len(await list_nodes(admin, growth.pool))
            await eventually(lambda: _equals(lockgate_nodes(), real), within=60, every=1.0,
                             what=f"lockgate to record the cluster's {real} nodes")

            # The work ends: consolidation removes the empty nodes, lockgate follows.
            for namespace in growth.namespaces.values():
                await apps.delete_collection_namespaced_deployment(namespace)
                await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
            await eventually(lambda: _no_nodes_nor_claims(admin, growth.pool), within=150,
                             every=1.0, what="consolidation to remove every node")
            await eventually(lambda: _equals(lockgate_nodes(), 0), within=60, every=1.0,
                             what="lockgate's picture of the cluster to lose its nodes")
        assert_within_limits(samples)
        assert samples.peak_nodes == CPU_LIMIT // INSTANCE_CPU, (
            f"the cluster grew to {samples.peak_nodes} nodes, not to its limits")
        print(f"reached {reached} (model {want}); {judged} nominated pods judged; "
              f"{len(samples.claims)} NodeClaims; peaks nodes={samples.peak_nodes} "
              f"cpu={samples.peak_nodes_cpu} claims_cpu={samples.peak_claims_cpu}")


async def _equals(value: Any, expected: int) -> bool:
    return await value == expected


async def _no_nodes_nor_claims(admin: client.ApiClient, pool: str) -> bool:
    return not await list_nodes(admin, pool) and not await list_node_claims(admin, pool)


# ---- 2. at the limits --------------------------------------------------------------------


async def test_a_queue_arriving_at_the_limits_gets_its_share_by_preemption_not_growth(
        autoscaled_stack: StackInfo, tmp_path: Path) -> None:
    async with growth_run(autoscaled_stack, tmp_path, "atlim",
                          {"w1": 1.0, "w3": 1.0}) as growth:
        run, admin, alias = growth.run, growth.admin, growth.alias
        w1, w3 = run.name("w1"), run.name("w3")
        apps = run.apps(alias)
        full = int(CPU_LIMIT // INSTANCE_CPU) * pods_per_node()
        by_namespace = {ns: queue for queue, ns in growth.namespaces.items()}
        async with sampling(admin, growth.pool, by_namespace) as samples:
            await apps.create_namespaced_deployment(growth.namespaces[w1],
                                                    deployment(f"{w1}-d", w1, full))
            await first_node_matches_the_instance(growth)

            async def w1_fills_it() -> bool:
                return (await bound_pods(growth))[w1] == full

            await eventually(w1_fills_it, within=180, every=1.0,
                             what=f"w1's {full} pods bound: the cluster at its limits")
            claims_when_full = set(samples.claims)
            await apps.create_namespaced_deployment(growth.namespaces[w3],
                                                    deployment(f"{w3}-d", w3, full // 2))
            want = model_pods(alias, growth.weights, {w1: full, w3: full // 2})
            assert round(want[w1]) == round(want[w3]) == full // 2, want

            async def shared() -> dict[str, int] | None:
                now = await bound_pods(growth)
                return now if all(abs(now[q] - want[q]) <= 1 for q in want) else None

            reached = await eventually(shared, within=180, every=1.0,
                                       what=lambda: f"bound pods within one of {want}")
            evicted = int(await run.pool.fetchval(
                "SELECT count(*) FROM evictions WHERE kind = 'preempted'"))
            assert evicted >= full // 2 - 1, f"only {evicted} preemptions for w3's share"
            w3_nominated = await nominated(admin, growth.namespaces[w3])
            assert not w3_nominated, (
                f"Karpenter provisioned for w3's pods at the limits: {w3_nominated}")
        assert_within_limits(samples)
        new_claims = set(samples.claims) - claims_when_full
        assert not new_claims, f"NodeClaims made after the cluster was full: {new_claims}"
        print(f"reached {reached} (model {want}) with {evicted} preemptions; peaks "
              f"nodes={samples.peak_nodes} claims_cpu={samples.peak_claims_cpu}")
