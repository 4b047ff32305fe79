"""Placement end to end: taints, nodeSelector, required node affinity, a GPU pool, and a released
pod kube-scheduler cannot place. Every lockgate service runs as a process; the nodes are kwok
nodes this test adds to cluster-a (tainted and labelled by it), and pods are created through the
API, so kube-scheduler has the last word on every release.

Isolation: a database of its own, cluster-a under a name of its own (a trigger keeps only this
run's rows, as in test_fairness_e2e), its own webhook registration and consumer groups. Every pod
selects this run's nodes by label, so the stack's other nodes never matter.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.isolation import keep_only_clusters
from devstack.launcher import Lockgate, ServicePorts
from helpers.kube import Namespaces
from helpers.pods import KWOK_NODE_ANNOTATION, a_pod
from helpers.postgres import fresh_database, migrate_database
from helpers.services import fairness_report
from helpers.waiting import eventually
from lockgate.labels import MANAGED_NAMESPACE_LABEL, SCHEDULING_GATE
from lockgate.noticing import NoticeReason
from lockgate_adapters.kafka import ensure_topics
from lockgate_adapters.kube import api_client

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

GPU = "nvidia.com/gpu"
GIVE_UP_AFTER = 3  # LOCKGATE_SCHEDULER_UNPLACEABLE_AFTER_SECONDS


@dataclass
class Run:
    run: str
    alias: str
    lockgate: Lockgate
    core: client.CoreV1Api
    apps: client.AppsV1Api
    namespace: str
    pool: asyncpg.Pool
    nodes: list[str]

    async def add_node(self, name: str, *, cpu: str, gpu: int = 0,
                       labels: dict[str, str] | None = None,
                       taints: list[dict[str, str]] | None = None) -> None:
        """A kwok node (kwok marks it Ready and runs what binds there)."""
        allocatable = {"cpu": cpu, "memory": "32Gi", "pods": "110",
                       **({GPU: str(gpu)} if gpu else {})}
        await self.core.create_node({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"capacity": allocatable, "allocatable": allocatable},
        })
        self.nodes.append(name)
        await eventually(lambda: self._node_known(name), within=60,
                         what=f"node {name} Ready as lockgate sees it")

    async def _node_known(self, name: str) -> bool:
        return bool(await self.pool.fetchval(
            "SELECT schedulable FROM cluster_nodes WHERE cluster = $1 AND node = $2 AND present",
            self.alias, name))

    async def create_queue(self, name: str) -> None:
        binding = [{"cluster": "*", "names": [self.namespace]}]
        async with aiohttp.ClientSession(headers=self.lockgate.admin_headers) as session, \
                session.post(f"{self.lockgate.admin_url}/api/v1/queues",
                             json={"name": name, "namespaces": binding}) as response:
            assert response.status in (200, 201), await response.text()
        await self.lockgate.wait_for_queues({name: {"cordoned": False, "namespaces": binding}})

    async def create_pod(self, manifest: dict[str, Any]) -> str:
        created = await self.core.create_namespaced_pod(self.namespace, manifest)
        return str(created.metadata.uid)

    async def pod(self, name: str) -> client.V1Pod | None:
        try:
            return await self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def job(self, uid: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(
            "SELECT * FROM jobs WHERE cluster = $1 AND uid = $2", self.alias, uid)


@pytest.fixture
async def run(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Run]:
    run_id = uuid.uuid4().hex[:6]
    alias = f"place-{run_id}-a"
    async with fresh_database(stack.postgres_dsn, prefix=f"lockgate_place_{run_id}") as dsn:
        await migrate_database(dsn)
        await keep_only_clusters(dsn, [alias])
        api = await api_client(stack.kubeconfigs["cluster-a"])
        await ensure_topics(stack.kafka_bootstrap)
        lockgate = Lockgate.for_stack(
            stack, clusters={alias: "cluster-a"}, postgres_dsn=dsn, ports=ServicePorts.free(),
            log_dir=tmp_path_factory.mktemp("service-logs"),
            # Consumer groups of the run's own, starting at the topics' ends (run_id).
            extra_env={"LOCKGATE_SCHEDULER_UNPLACEABLE_AFTER_SECONDS": str(GIVE_UP_AFTER)},
            run_id=f"place-{run_id}", cert_dir=tmp_path_factory.mktemp("webhook-certs"),
            standby_scheduler=False,
        )
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=3)
        namespaces = Namespaces({alias: api})
        core = client.CoreV1Api(api)
        state = Run(run_id, alias, lockgate, core, client.AppsV1Api(api), f"place-{run_id}",
                    pool, [])
        try:
            await lockgate.start()
            await namespaces.create(alias, state.namespace, labels={
                MANAGED_NAMESPACE_LABEL: "true", **lockgate.run_namespace_labels})
            await namespaces.create(alias, f"place-{run_id}-unmanaged")
            yield state
        finally:
            codes = await lockgate.stop()
            await namespaces.delete_all()
            for name in state.nodes:
                try:
                    await core.delete_node(name)
                except ApiException as error:
                    if error.status != 404:
                        raise
            await api.close()
            await pool.close()
    unclean = {name: code for name, code in codes.items() if code not in (0, None)}
    assert not unclean, f"services did not stop gracefully: {unclean}"


def gpu_taint() -> dict[str, str]:
    return {"key": GPU, "value": "present", "effect": "NoSchedule"}


def a_manifest(name: str, queue: str, *, cpu: str = "1", gpu: int = 0,
               **spec: Any) -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": "1Gi", **({GPU: str(gpu)} if gpu else {})}
    manifest = a_pod(name).in_queue(queue).never_restarted().requesting(**requests).manifest()
    if gpu:  # extended resources need limits equal to requests
        manifest["spec"]["containers"][0]["resources"]["limits"] = {GPU: str(gpu)}
    manifest["spec"].update(spec)
    return manifest


def released(pod: client.V1Pod) -> bool:
    return SCHEDULING_GATE not in {g.name for g in pod.spec.scheduling_gates or ()}


async def test_pods_are_released_only_to_nodes_they_may_land_on(run: Run) -> None:
    queue = f"gpu-{run.run}"
    pool_label = {"pool": f"gpu-{run.run}"}
    gpu_nodes = [f"gpu-{run.run}-0", f"gpu-{run.run}-1"]
    for name in gpu_nodes:
        await run.add_node(name, cpu="16", gpu=4, labels=pool_label, taints=[gpu_taint()])
    await run.create_queue(queue)
    tolerate_gpu = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]

    # Two pods pinned to the second node by required affinity on metadata.name.
    pinned = [f"pinned-{i}" for i in range(2)]
    for name in pinned:
        await run.create_pod(a_manifest(name, queue, gpu=1, tolerations=tolerate_gpu, affinity={
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
                                   nodeSelector={"pool": f"nowhere-{run.run}"}),
    }
    for manifest in never.values():
        await run.create_pod(manifest)
    # Eight GPU pods that tolerate the pool, for the six GPUs left.
    fitting = [f"gpu-{i}" for i in range(8)]
    for name in fitting:
        await run.create_pod(a_manifest(name, queue, gpu=1, tolerations=tolerate_gpu,
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
        "SELECT name FROM jobs WHERE cluster = $1 AND unschedulable_since IS NOT NULL", run.alias)
    assert refused == []


async def _bound_node(run: Run, name: str) -> str | None:
    pod = await run.pod(name)
    return None if pod is None else pod.spec.node_name


def anti_affinity_to(app: str) -> dict[str, Any]:
    """Required anti-affinity to pods labelled app=<app> anywhere: a filter lockgate does not
    model, so the model may say "fits" where kube-scheduler says Unschedulable."""
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"app": app}}, "namespaceSelector": {},
        "topologyKey": "kubernetes.io/hostname"}]}}


async def test_a_released_pod_kube_scheduler_cannot_place_stops_being_charged(run: Run) -> None:
    stuck_queue, other_queue = f"stuck-{run.run}", f"other-{run.run}"
    trap = f"trap-{run.run}"
    await run.add_node(trap, cpu="1", labels={"pool": trap})
    for queue in (stuck_queue, other_queue):
        await run.create_queue(queue)
    blocker = f"blocker-{run.run}"
    await run.core.create_namespaced_pod(f"place-{run.run}-unmanaged", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": blocker, "labels": {"app": blocker}},
        "spec": {"nodeName": trap, "containers": [{"name": "main", "image": "busybox"}]}})

    # Released (its model says the 1-cpu node is free), refused by kube-scheduler.
    stuck_uid = await run.create_pod(a_manifest(
        "stuck", stuck_queue, nodeSelector={"pool": trap}, affinity=anti_affinity_to(blocker)))
    await eventually(lambda: _released_and_unschedulable(run, "stuck"), within=60,
                     what="the stuck pod released and reported Unschedulable")
    # Another queue's pod for the same node: while the stuck pod is charged, no room.
    other_uid = await run.create_pod(a_manifest("other", other_queue, nodeSelector={"pool": trap}))

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


async def test_an_unplaceable_pod_with_a_controller_is_replaced_by_a_gated_one(run: Run) -> None:
    queue = f"rs-{run.run}"
    trap = f"trap2-{run.run}"
    await run.add_node(trap, cpu="1", labels={"pool": trap})
    await run.create_queue(queue)
    blocker = f"blocker2-{run.run}"
    await run.core.create_namespaced_pod(f"place-{run.run}-unmanaged", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": blocker, "labels": {"app": blocker}},
        "spec": {"nodeName": trap, "containers": [{"name": "main", "image": "busybox"}]}})
    template = a_manifest("unused", queue, nodeSelector={"pool": trap},
                          affinity=anti_affinity_to(blocker))
    template["spec"]["restartPolicy"] = "Always"
    await run.apps.create_namespaced_replica_set(run.namespace, {
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


async def _released_and_unschedulable(run: Run, name: str) -> bool:
    pod = await run.pod(name)
    if pod is None or not released(pod):
        return False
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable"
               for c in pod.status.conditions or ())


async def _given_up(run: Run, uid: str) -> asyncpg.Record | None:
    row = await run.job(uid)
    return row if row is not None and row["unplaceable_at"] is not None else None


async def _event(run: Run, uid: str) -> client.CoreV1Event | None:
    events = await run.core.list_namespaced_event(
        run.namespace, field_selector=f"involvedObject.uid={uid}")
    return next((e for e in events.items if e.reason == NoticeReason.UNPLACEABLE.value), None)


async def _only_pod_uid(run: Run) -> str | None:
    """The uid of the one pod of the ReplicaSet not being deleted, if exactly one."""
    pods = await run.core.list_namespaced_pod(run.namespace, label_selector="app=rs")
    live = [p for p in pods.items if p.metadata.deletion_timestamp is None]
    return str(live[0].metadata.uid) if len(live) == 1 else None

