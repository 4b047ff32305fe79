"""lockgate chooses the instance size, end to end (issue 35): real Karpenter (its kwok provider)
on the stack's autoscaled cluster-c, a NodePool of 4, 8 and 16-cpu types, and a queue owed
room that sends small pods a few at a time.

Karpenter, left to itself, launches the cheapest type that holds a batch: a 1-cpu pod makes a
4-cpu node, the next pods another, and so on. lockgate counts its headroom in the pool's
biggest type (16 cpu) and releases each pod onto it with `NotIn [4, 8]` on the instance-cpu
label (docs/autoscaling.md, "Sizing the nodes"); the ungater writes that into the pod's required
node affinity as it removes the gate. What is judged is read from the apiserver alone: the pods'
affinity, the NodeClaims Karpenter made and their instance type, and where the pods bound.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.karpenter import (
    AUTOSCALED_CLUSTER,
    INSTANCE_TYPE_LABEL,
    KWOK_GROUP,
    apply_node_class,
    apply_node_pool,
    autoscaled_cluster,
    list_node_claims,
    list_nodes,
    node_pool,
    node_pool_ready,
)
from helpers.pods import a_pod
from helpers.runs import lockgate_run
from helpers.waiting import eventually
from lockgate.labels import SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

CPU_KEY = f"{KWOK_GROUP}/instance-cpu"
# The kwok provider's c family: 2Gi of memory per cpu (c-8x-amd64-linux: 16Gi).
SIZES = {"4": ("c-4x-amd64-linux", "8Gi"), "8": ("c-8x-amd64-linux", "16Gi"),
         "16": ("c-16x-amd64-linux", "32Gi")}
BIGGEST = "16"
NODE_OVERHEAD = {"cpu": "100m", "memory": "10Mi"}  # what the provider keeps back of each node
POD_CPU = "1"  # a quarter of the smallest type: any type holds a batch of one
PODS = 4
SECONDS_APART = 3.0


def required_expressions(pod: client.V1Pod) -> list[list[dict[str, Any]]]:
    """Each required node affinity term's matchExpressions, as plain dicts."""
    affinity = pod.spec.affinity
    if affinity is None or affinity.node_affinity is None:
        return []
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution
    if required is None:
        return []
    return [[{"key": e.key, "operator": e.operator, "values": sorted(e.values or ())}
             for e in term.match_expressions or ()] for term in required.node_selector_terms]


async def test_karpenter_makes_the_size_lockgate_counted_not_the_cheapest_for_a_small_batch(
        autoscaled_stack: StackInfo, tmp_path: Path) -> None:
    async with autoscaled_cluster(autoscaled_stack) as admin:
        node_class, pool = "kwok-sized", "pool-sized"
        await apply_node_class(admin, node_class)
        manifest = node_pool(pool, node_class=node_class, cpu_limit="64",
                             instance_types=[name for name, _ in SIZES.values()],
                             consolidation_policy="WhenEmpty", consolidate_after="5s")
        # The sizes as requirements on the provider's well-known labels: what lockgate reads to
        # know the pool's types before it has a node (docs/autoscaling.md).
        manifest["spec"]["template"]["spec"]["requirements"] += [
            {"key": CPU_KEY, "operator": "In", "values": list(SIZES)},
            {"key": f"{KWOK_GROUP}/instance-memory", "operator": "In",
             "values": [memory for _, memory in SIZES.values()]}]
        await apply_node_pool(admin, manifest)
        await eventually(lambda: node_pool_ready(admin, pool), within=60, every=0.5,
                         what=f"NodePool {pool} Ready")
        async with lockgate_run(autoscaled_stack, tmp_path, name="sized",
                                clusters=(AUTOSCALED_CLUSTER,), env={
                                    "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1",
                                    "LOCKGATE_SCHEDULER_GROWTH_NODE_OVERHEAD": json.dumps(
                                        NODE_OVERHEAD),
                                    # Gathering at its default (12 s): a release onto a size
                                    # Karpenter will make is not held for it, so each pod
                                    # owed room goes at once, the trickle that made small
                                    # nodes before lockgate named the size.
                                }) as run:
            alias = run.alias(AUTOSCALED_CLUSTER)
            queue, namespace = run.name("small"), run.name("ns-small")
            await run.create_queue(queue, namespaces=[namespace], priority_factor=1.0)
            await run.create_namespace(alias, namespace)
            core = run.core(alias)
            assert await list_nodes(admin) == [], "the autoscaled cluster must start with no node"

            names = [f"small-{i}" for i in range(PODS)]
            first_gates: list[str] = []
            for index, name in enumerate(names):
                await core.create_namespaced_pod(namespace, a_pod(name).in_queue(queue)
                                                 .requesting(cpu=POD_CPU, memory="64Mi")
                                                 .manifest())
                await asyncio.sleep(SECONDS_APART)
                if index == PODS - 2:
                    # 9 s after the first pod: gathered, it would still be gated (held until
                    # a node's worth, 16 cpu, is owed or 12 s pass; 3 cpu are owed).
                    first = await core.read_namespaced_pod(names[0], namespace)
                    first_gates = [g.name for g in first.spec.scheduling_gates or ()]
            assert SCHEDULING_GATE not in first_gates, (
                f"{names[0]} still gated {PODS - 1} pods later: held to gather a node's worth "
                "although Karpenter makes the size lockgate named")

            async def all_bound() -> list[client.V1Pod] | None:
                pods = [await core.read_namespaced_pod(name, namespace) for name in names]
                return pods if all(p.spec.node_name for p in pods) else None

            last_claims: list[dict[str, Any]] = []

            async def claims_now() -> str:
                last_claims[:] = await list_node_claims(admin, pool)
                return str([(c["metadata"]["name"], c["metadata"].get("labels", {}).get(
                    INSTANCE_TYPE_LABEL)) for c in last_claims])

            try:
                pods = await eventually(all_bound, within=180, every=1.0,
                                        what=f"the {PODS} small pods bound")
            except AssertionError as error:
                raise AssertionError(f"{error}; NodeClaims: {await claims_now()}") from None

            claims = await list_node_claims(admin, pool)
            made = {c["metadata"]["name"]: c["metadata"].get("labels", {}).get(
                INSTANCE_TYPE_LABEL) for c in claims}
            # The pods (4 cpu in all) fit one node of the biggest type: one claim, of that type.
            # Left to choose, Karpenter makes c-4x for the first pod (the cheapest holding it).
            assert list(made.values()) == [SIZES[BIGGEST][0]], (
                f"NodeClaims {made}: wanted one {SIZES[BIGGEST][0]}")
            nodes = {node.metadata.name: node.metadata.labels.get(INSTANCE_TYPE_LABEL)
                     for node in await list_nodes(admin, pool)}
            assert {pod.spec.node_name for pod in pods} <= set(nodes), (pods, nodes)
            assert set(nodes.values()) == {SIZES[BIGGEST][0]}, nodes

            avoid = {"key": CPU_KEY, "operator": "NotIn",
                     "values": sorted(v for v in SIZES if v != BIGGEST)}
            for pod in pods:
                assert not any(g.name == SCHEDULING_GATE
                               for g in pod.spec.scheduling_gates or ()), pod.metadata.name
                print(f"{pod.metadata.name}: on {pod.spec.node_name}, required node affinity "
                      f"{required_expressions(pod)}")
            # The first pod went onto headroom (no node yet): it carries the requirement. Those
            # after it go onto the claim in flight (carrying it too) or, once it is a node, onto
            # that node (a real node's room: nothing to add).
            first = required_expressions(pods[0])
            assert first and all(avoid in term for term in first), (
                f"{names[0]}: required node affinity {first}, wanted {avoid} in each term")
            for pod in pods[1:]:
                terms = required_expressions(pod)
                assert not terms or all(avoid in term for term in terms), (
                    pod.metadata.name, terms)
