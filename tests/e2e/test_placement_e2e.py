"""Placement end to end: taints, nodeSelector, required node affinity, a GPU pool, and a released
pod kube-scheduler cannot place. Every lockgate service runs as a process; the nodes are kwok
nodes this test adds to cluster-a (tainted and labelled by it), and pods are created through the
API, so kube-scheduler has the last word on every release.

Each test runs lockgate of its own (helpers.runs): a database, cluster-a under a name of its own
(a trigger keeps only this run's rows), its own namespaces, nodes, webhook registration and
consumer groups. Every pod selects this run's nodes by label, so the stack's other nodes never
matter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.services import fairness_report
from helpers.waiting import eventually
from lockgate.labels import SCHEDULING_GATE
from lockgate.noticing import NoticeReason

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

GPU = "nvidia.com/gpu"
GIVE_UP_AFTER = 3  # LOCKGATE_SCHEDULER_UNPLACEABLE_AFTER_SECONDS


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path, name="place", standby_scheduler=False, env={
            "LOCKGATE_SCHEDULER_UNPLACEABLE_AFTER_SECONDS": str(GIVE_UP_AFTER)}) as run:
        await run.create_namespace()
        await run.create_namespace(name=unmanaged(run), managed=False)
        yield run


def unmanaged(run: LockgateRun) -> str:
    """The run's namespace lockgate does not manage."""
    return run.name("unmanaged")


async def add_node(run: LockgateRun, name: str, *, cpu: str, gpu: int = 0,
                   labels: dict[str, str] | None = None,
                   taints: list[dict[str, str]] | None = None) -> None:
    allocatable = {"cpu": cpu, "memory": "32Gi", "pods": "110",
                   **({GPU: str(gpu)} if gpu else {})}
    await run.add_node(name, allocatable=allocatable, labels=labels, taints=taints)


async def create_queue(run: LockgateRun, name: str) -> None:
    await run.create_queue(name, namespaces=[run.namespace])


async def create_pod(run: LockgateRun, manifest: dict[str, Any]) -> str:
    return str((await run.create_pod(manifest)).metadata.uid)


def gpu_taint() -> dict[str, str]:
    return {"key": GPU, "value": "present", "effect": "NoSchedule"}


def a_manifest(name: str, queue: str, *, cpu: str = "1", gpu: int = 0,
               **spec: Any) -> dict[str, Any]:
    pod = (a_pod(name).in_queue(queue).never_restarted().requesting(cpu=cpu, memory="1Gi")
           .with_spec(**spec))
    if gpu:  # extended resources need limits equal to requests
        pod = pod.requesting(**{GPU: str(gpu)}).limited_to(**{GPU: str(gpu)})
    return pod.manifest()


def released(pod: client.V1Pod) -> bool:
    return SCHEDULING_GATE not in {g.name for g in pod.spec.scheduling_gates or ()}


async def test_pods_are_released_only_to_nodes_they_may_land_on(run: LockgateRun) -> None:
    queue = run.name("gpu")
    pool_label = {"pool": run.name("gpu")}
    gpu_nodes = [run.name("gpu") + "-0", run.name("gpu") + "-1"]
    for name in gpu_nodes:
        await add_node(run, name, cpu="16", gpu=4, labels=pool_label, taints=[gpu_taint()])
    await create_queue(run, queue)
    tolerate_gpu = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]

    # Two pods pinned to the second node by required affinity on metadata.name.
    pinned = [f"pinned-{i}" for i in range(2)]
    for name in pinned:
        await create_pod(run, a_manifest(name, queue, gpu=1, tolerations=tolerate_gpu, affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [gpu_nodes[1]]}]}]}}}))
    for name in pinned:
        bound = await eventually(lambda n=name: _bound_node(run, n), within=60,
                                 what=f"{name} bound")
        assert bound == gpu_nodes[1]

    # Pods that may never go anywhere: not tolerating the GPU taint (with a selector for the
    # pool, or asking for a GPU only the pool has), or selecting a label no node carries.
    never = {
        "untolerating-0": a_manifest("untolerating-0", queue, gpu=1, nodeSelector=pool_label),
        "untolerating-1": a_manifest("untolerating-1", queue, gpu=1),
        "unlabelled-0": a_manifest("unlabelled-0", queue, tolerations=tolerate_gpu,
                                   nodeSelector={"pool": run.name("nowhere")}),
    }
    for manifest in never.values():
        await create_pod(run, manifest)
    # Eight GPU pods that tolerate the pool, for the six GPUs left.
    fitting = [f"gpu-{i}" for i in range(8)]
    for name in fitting:
        await create_pod(run, a_manifest(name, queue, gpu=1, tolerations=tolerate_gpu,
                                        nodeSelector=pool_label))

    async def six_bound() -> list[str] | None:
        nodes = [await _bound_node(run, name) for name in fitting]
        placed = [node for node in nodes if node]
        return placed if len(placed) == 6 else None

    placed = await eventually(six_bound, within=90, what="six GPU pods bound")
    assert set(placed) <= set(gpu_nodes)

    async def parked() -> bool:
        report = await fairness_report(run.lockgate.processes["fair-scheduler"].health_port or 0)
        entry = next((q for q in report["queues"] if q["name"] == queue), None)
        return entry is not None and entry["unschedulable"] == len(never) and (
            entry["queued"] == len(never) + 2)

    # The scheduler has judged every pod: three parked for good (no node lets them in), two
    # waiting for a GPU.
    await eventually(parked, within=60, what="three pods parked and two waiting")
    for name in never:
        pod = await run.pod(name)
        assert pod is not None and not released(pod), f"{name} was released"
    waiting = [name for name in fitting if not await _bound_node(run, name)]
    assert len(waiting) == 2
    for name in waiting:
        pod = await run.pod(name)
        assert pod is not None and not released(pod), f"{name} released without room"
    # Nothing released was refused by kube-scheduler.
    refused = await run.pool.fetch(
        "SELECT name FROM jobs WHERE cluster = $1 AND unschedulable_since IS NOT NULL", run.alias())
    assert refused == []


async def _bound_node(run: LockgateRun, name: str) -> str | None:
    pod = await run.pod(name)
    return None if pod is None else pod.spec.node_name


def anti_affinity_to(app: str) -> dict[str, Any]:
    """Required anti-affinity to pods labelled app=<app> anywhere: a filter lockgate does not
    model, so the model may say "fits" where kube-scheduler says Unschedulable."""
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"app": app}}, "namespaceSelector": {},
        "topologyKey": "kubernetes.io/hostname"}]}}


async def test_a_released_pod_kube_scheduler_cannot_place_stops_being_charged(
        run: LockgateRun) -> None:
    stuck_queue, other_queue = run.name("stuck"), run.name("other")
    trap = run.name("trap")
    await add_node(run, trap, cpu="1", labels={"pool": trap})
    for queue in (stuck_queue, other_queue):
        await create_queue(run, queue)
    blocker = run.name("blocker")
    await run.create_pod(a_pod(blocker).labelled(app=blocker).on_node(trap).manifest(),
                         namespace=unmanaged(run))

    # Released (its model says the 1-cpu node is free), refused by kube-scheduler.
    stuck_uid = await create_pod(run, a_manifest(
        "stuck", stuck_queue, nodeSelector={"pool": trap}, affinity=anti_affinity_to(blocker)))
    await eventually(lambda: _released_and_unschedulable(run, "stuck"), within=60,
                     what="the stuck pod released and reported Unschedulable")
    # Another queue's pod for the same node: while the stuck pod is charged, no room.
    other_uid = await create_pod(run, a_manifest("other", other_queue, nodeSelector={"pool": trap}))

    given_up = await eventually(lambda: _given_up(run, stuck_uid), within=60,
                                what="the stuck pod given up on")
    assert given_up["last_reason"].startswith(
        "unplaceable: released, but kube-scheduler reported it Unschedulable for")
    # The other queue is served on the room the stuck pod no longer holds.
    assert await eventually(lambda: _bound_node(run, "other"), within=60,
                            what="the other queue's pod bound") == trap
    other = await run.job(other_uid)
    assert other is not None and other["released_at"] >= given_up["unplaceable_at"]
    # Reported on the pod; a bare pod is left alone.
    event = await eventually(lambda: _event(run, stuck_uid), within=30,
                             what="a LockgateUnplaceable Event on the stuck pod")
    assert "no controller" in event.message
    stuck = await run.pod("stuck")
    assert stuck is not None and stuck.metadata.uid == stuck_uid


async def test_an_unplaceable_pod_with_a_controller_is_replaced_by_a_gated_one(
        run: LockgateRun) -> None:
    queue = run.name("rs")
    trap = run.name("trap2")
    await add_node(run, trap, cpu="1", labels={"pool": trap})
    await create_queue(run, queue)
    blocker = run.name("blocker2")
    await run.create_pod(a_pod(blocker).labelled(app=blocker).on_node(trap).manifest(),
                         namespace=unmanaged(run))
    template = a_manifest("unused", queue, nodeSelector={"pool": trap},
                          affinity=anti_affinity_to(blocker))
    template["spec"]["restartPolicy"] = "Always"
    await run.apps().create_namespaced_replica_set(run.namespace, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rs"}},
                 "template": {"metadata": {"labels": {**template["metadata"]["labels"],
                                                      "app": "rs"}},
                              "spec": template["spec"]}}})

    first = await eventually(lambda: _only_pod_uid(run), within=60, what="the first replica")
    await eventually(lambda: _given_up(run, first), within=90, what="the replica given up on")
    event = await eventually(lambda: _event(run, first), within=30,
                             what="a LockgateUnplaceable Event on the replica")
    assert "controller creates a replacement" in event.message

    async def replaced() -> str | None:
        uid = await _only_pod_uid(run)
        return uid if uid is not None and uid != first else None

    second = await eventually(replaced, within=60, what="a replacement replica")
    # The replacement was gated by the webhook and queued: lockgate decides on it afresh.
    job = await eventually(lambda: run.job(second), within=30, what="the replacement's job")
    assert job["queue"] == queue
    assert await run.job(first) is not None


async def _released_and_unschedulable(run: LockgateRun, name: str) -> bool:
    pod = await run.pod(name)
    if pod is None or not released(pod):
        return False
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable"
               for c in pod.status.conditions or ())


async def _given_up(run: LockgateRun, uid: str) -> asyncpg.Record | None:
    row = await run.job(uid)
    return row if row is not None and row["unplaceable_at"] is not None else None


async def _event(run: LockgateRun, uid: str) -> client.CoreV1Event | None:
    events = await run.core().list_namespaced_event(
        run.namespace, field_selector=f"involvedObject.uid={uid}")
    return next((e for e in events.items if e.reason == NoticeReason.UNPLACEABLE.value), None)


async def _only_pod_uid(run: LockgateRun) -> str | None:
    """The uid of the one pod of the ReplicaSet not being deleted, if exactly one."""
    pods = await run.core().list_namespaced_pod(run.namespace, label_selector="app=rs")
    live = [p for p in pods.items if p.metadata.deletion_timestamp is None]
    return str(live[0].metadata.uid) if len(live) == 1 else None

