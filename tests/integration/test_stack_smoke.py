"""Smoke tests of the local stack itself: the real components, no mocks.

Names carry a random suffix, so the tests can run again and again against a reused stack.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from helpers.kube import remove_first_gate
from helpers.pods import a_deployment, a_pod
from helpers.waiting import eventually

pytestmark = [pytest.mark.timeout(240)]

CLUSTERS = ["cluster-a", "cluster-b"]
GATE = "lockgate.io/smoke-test"
# Pods of a run-to-completion workload (the deployment's replicas restart as they must).
SMOKE_POD = a_pod("smoke").requesting(cpu="100m", memory="64Mi").never_restarted()


# ---------------------------------------------------------------- Kubernetes


@pytest.mark.parametrize("cluster", CLUSTERS)
async def test_gated_pod_waits_until_the_gate_is_removed_then_binds_and_runs(
    cluster: str, kube_clients: dict[str, ApiClient], make_namespace: Any
) -> None:
    core = client.CoreV1Api(kube_clients[cluster])
    ns = await make_namespace(cluster, "smoke-gate")
    await core.create_namespaced_pod(ns, SMOKE_POD.named("gated").gated(GATE).manifest())

    async def gated_condition() -> client.V1PodCondition | None:
        pod = await core.read_namespaced_pod("gated", ns)
        for cond in pod.status.conditions or []:
            if cond.type == "PodScheduled":
                return cond
        return None

    cond = await eventually(gated_condition, within=60, every=0.1,
                            what="the PodScheduled condition")
    # kube-scheduler has judged the pod: it holds it for its gate, instead of binding it.
    assert (cond.status, cond.reason) == ("False", "SchedulingGated")
    pod = await core.read_namespaced_pod("gated", ns)
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"

    await remove_first_gate(core, ns, "gated", GATE)

    async def running() -> client.V1Pod | None:
        pod = await core.read_namespaced_pod("gated", ns)
        return pod if pod.spec.node_name and pod.status.phase == "Running" else None

    pod = await eventually(running, within=60, every=0.1,
                           what="the ungated pod to be bound and Running")
    assert pod.spec.node_name.startswith(f"{cluster}-")  # one of its kwok nodes
    assert not pod.spec.scheduling_gates


@pytest.mark.parametrize("cluster", CLUSTERS)
async def test_deployment_creates_pods_and_namespace_deletion_completes(
    cluster: str, kube_clients: dict[str, ApiClient], make_namespace: Any
) -> None:
    api = kube_clients[cluster]
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns = await make_namespace(cluster, "smoke-deploy")
    await apps.create_namespaced_deployment(
        ns, a_deployment("web").with_replicas(3).of(
            a_pod("web").requesting(cpu="100m", memory="64Mi")).manifest())

    async def ready() -> int | None:
        dep = await apps.read_namespaced_deployment("web", ns)
        return dep.status.ready_replicas if dep.status.ready_replicas == 3 else None

    await eventually(ready, within=60, every=0.1, what="3 ready replicas")
    pods = (await core.list_namespaced_pod(ns, label_selector="app=web")).items
    assert len(pods) == 3
    for pod in pods:
        assert [ref.kind for ref in pod.metadata.owner_references] == ["ReplicaSet"]
        assert pod.spec.node_name.startswith(f"{cluster}-")  # one of its kwok nodes
        assert pod.status.phase == "Running"

    await core.delete_namespace(ns)

    async def gone() -> bool | None:
        try:
            await core.read_namespace(ns)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return None

    await eventually(gone, within=90, every=0.1, what=f"namespace {ns} to be deleted")


@pytest.mark.parametrize("cluster", CLUSTERS)
async def test_pods_with_the_complete_annotation_finish(
    cluster: str, kube_clients: dict[str, ApiClient], make_namespace: Any
) -> None:
    core = client.CoreV1Api(kube_clients[cluster])
    ns = await make_namespace(cluster, "smoke-complete")
    await core.create_namespaced_pod(ns, SMOKE_POD.named("ok").completing_after("1s").manifest())
    await core.create_namespaced_pod(
        ns, SMOKE_POD.named("broken").completing_after("500ms", failing=True).manifest())
    await core.create_namespaced_pod(ns, SMOKE_POD.named("forever").manifest())

    async def phase_of(name: str, want: str) -> client.V1Pod | None:
        pod = await core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase == want else None

    ok = await eventually(lambda: phase_of("ok", "Succeeded"), within=60, every=0.1,
                          what="pod ok to succeed")
    assert ok.status.container_statuses[0].state.terminated.exit_code == 0
    broken = await eventually(lambda: phase_of("broken", "Failed"), within=60, every=0.1,
                              what="pod broken to fail")
    assert broken.status.container_statuses[0].state.terminated.exit_code == 1
    forever = await core.read_namespaced_pod("forever", ns)
    assert forever.status.phase == "Running"


# ---------------------------------------------------------------- Kafka


async def _consume(bootstrap: str, topic: str, group: str, count: int) -> list[bytes]:
    """Reads `count` messages as a member of `group`, commits, and leaves."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        got: list[bytes] = []
        async with asyncio.timeout(60):
            while len(got) < count:
                batch = await consumer.getmany(timeout_ms=500, max_records=count - len(got))
                for messages in batch.values():
                    got += [m.value for m in messages if m.value is not None]
        if count == 0:
            batch = await consumer.getmany(timeout_ms=2000)
            got += [m.value for messages in batch.values() for m in messages if m.value]
        await consumer.commit()
        return got
    finally:
        await consumer.stop()


async def test_kafka_produces_consumes_and_a_group_resumes_from_its_commit(
    kafka_bootstrap: str,
) -> None:
    run = uuid.uuid4().hex[:8]
    topic, group = f"smoke-{run}", f"smoke-group-{run}"
    sent = [f"message-{i}".encode() for i in range(10)]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        async with asyncio.timeout(60):
            for value in sent:
                await producer.send_and_wait(topic, value)  # the topic is auto-created
    finally:
        await producer.stop()

    first = await _consume(kafka_bootstrap, topic, group, 4)
    second = await _consume(kafka_bootstrap, topic, group, 6)  # a new member, same group
    rest = await _consume(kafka_bootstrap, topic, group, 0)
    assert len(first) == 4
    assert len(second) == 6
    assert not set(first) & set(second), "the restarted consumer re-read committed messages"
    assert sorted(first + second) == sorted(sent)
    assert rest == []


# ---------------------------------------------------------------- PostgreSQL


async def test_postgres_commits_are_visible_and_rollbacks_are_not(pg_pool: asyncpg.Pool) -> None:
    table = f"smoke_{uuid.uuid4().hex[:8]}"
    async with pg_pool.acquire() as conn:
        assert int(await conn.fetchval("show max_connections")) >= 200
        await conn.execute(f"create table {table} (id int primary key, note text not null)")
        try:
            async with conn.transaction():
                await conn.execute(f"insert into {table} values (1, 'kept')")
            with pytest.raises(RuntimeError, match="roll back"):
                async with conn.transaction():
                    await conn.execute(f"insert into {table} values (2, 'dropped')")
                    raise RuntimeError("roll back")
            async with pg_pool.acquire() as other:
                rows = await other.fetch(f"select id, note from {table} order by id")
            assert [(r["id"], r["note"]) for r in rows] == [(1, "kept")]
        finally:
            await conn.execute(f"drop table {table}")


# ---------------------------------------------------------------- the devstack CLI


def test_devstack_status_and_env_describe_the_running_stack() -> None:
    status = subprocess.run(
        [sys.executable, "-m", "devstack", "status"], capture_output=True, text=True, check=False
    )
    assert status.returncode == 0, status.stdout + status.stderr
    for name in ("postgres", "kafka", "cluster-a/kube-apiserver", "cluster-b/kwok"):
        assert f"{name} " in status.stdout
    env = subprocess.run(
        [sys.executable, "-m", "devstack", "env"], capture_output=True, text=True, check=True
    )
    for var in (
        "LOCKGATE_KUBECONFIG_CLUSTER_A",
        "LOCKGATE_KUBECONFIG_CLUSTER_B",
        "LOCKGATE_KAFKA_BOOTSTRAP",
        "LOCKGATE_POSTGRES_DSN",
        "LOCKGATE_STACK_DIR",
    ):
        assert f"export {var}=" in env.stdout
