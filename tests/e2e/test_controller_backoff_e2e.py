"""Back-off per controller end to end: a ReplicaSet whose pods lockgate's model wrongly thinks fit.

Its pods select a kwok node of this run's that has room for one of them, but carry a required
pod anti-affinity to a bare pod already on that node: a filter lockgate does not model, so
lockgate releases them and kube-scheduler refuses them. The test shows the whole cycle on the
real services: the first give-up deletes the pod; the replacement waits with the back-off reason
(`lockgate explain`, the fairness report), is released only after the delay, is refused again,
and the next delay is twice as long; the next replacement says so in its waiting Event, still
waits after a restart of the scheduler (the back-off is in Postgres), and, the blocker gone,
binds after the delay and resets the back-off.

Isolation as in test_placement_e2e: a database of its own, cluster-a under a name of its own, its
own webhook registration, consumer groups and namespaces. Bounded: each step waits on a condition
with a deadline; the delays are set short (give up after 3 s, back off 15 s, then 30 s).
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
from lockgate.labels import MANAGED_NAMESPACE_LABEL
from lockgate_adapters.kafka import ensure_topics
from lockgate_adapters.kube import api_client

pytestmark = [pytest.mark.stack, pytest.mark.timeout(400)]

GIVE_UP_AFTER = 3  # LOCKGATE_SCHEDULER_UNPLACEABLE_AFTER_SECONDS
BACKOFF = 15  # LOCKGATE_SCHEDULER_UNPLACEABLE_BACKOFF_INITIAL_SECONDS


@dataclass
class Run:
    run: str
    alias: str
    lockgate: Lockgate
    core: client.CoreV1Api
    apps: client.AppsV1Api
    namespace: str
    unmanaged: str
    pool: asyncpg.Pool
    nodes: list[str]

    async def job(self, uid: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(
            "SELECT * FROM jobs WHERE cluster = $1 AND uid = $2", self.alias, uid)

    async def backoff(self) -> asyncpg.Record | None:
        return await self.pool.fetchrow(
            "SELECT * FROM controller_backoffs WHERE cluster = $1", self.alias)

    async def replicas(self) -> list[client.V1Pod]:
        """The ReplicaSet's pods not being deleted."""
        pods = await self.core.list_namespaced_pod(self.namespace, label_selector="app=rs")
        return [p for p in pods.items if p.metadata.deletion_timestamp is None]

    async def explain(self, pod: str) -> dict[str, Any]:
        async with aiohttp.ClientSession(headers=self.lockgate.admin_headers) as session, \
                session.get(f"{self.lockgate.admin_url}/api/v1/explain/{self.alias}/"
                            f"{self.namespace}/{pod}") as response:
            assert response.status == 200, await response.text()
            body: dict[str, Any] = await response.json()
            return body


@pytest.fixture
async def run(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Run]:
    run_id = uuid.uuid4().hex[:6]
    alias = f"backoff-{run_id}-a"
    async with fresh_database(stack.postgres_dsn, prefix=f"lockgate_backoff_{run_id}") as dsn:
        await migrate_database(dsn)
        await keep_only_clusters(dsn, [alias])
        api = await api_client(stack.kubeconfigs["cluster-a"])
        await ensure_topics(stack.kafka_bootstrap)
        lockgate = Lockgate.for_stack(
            stack, clusters={alias: "cluster-a"}, postgres_dsn=dsn, ports=ServicePorts.free(),
            log_dir=tmp_path_factory.mktemp("service-logs"),
            extra_env={
                "LOCKGATE_SCHEDULER_UNPLACEABLE_AFTER_SECONDS": str(GIVE_UP_AFTER),
                "LOCKGATE_SCHEDULER_UNPLACEABLE_BACKOFF_INITIAL_SECONDS": str(BACKOFF),
                "LOCKGATE_SCHEDULER_UNPLACEABLE_BACKOFF_MAX_SECONDS": str(8 * BACKOFF),
                "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1",
                "LOCKGATE_SCHEDULER_WAIT_NOTICE_CHECK_SECONDS": "1",
            },
            run_id=f"backoff-{run_id}", cert_dir=tmp_path_factory.mktemp("webhook-certs"),
            standby_scheduler=False,
        )
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=3)
        namespaces = Namespaces({alias: api})
        core = client.CoreV1Api(api)
        state = Run(run_id, alias, lockgate, core, client.AppsV1Api(api), f"backoff-{run_id}",
                    f"backoff-{run_id}-unmanaged", pool, [])
        try:
            await lockgate.start()
            await namespaces.create(alias, state.namespace, labels={
                MANAGED_NAMESPACE_LABEL: "true", **lockgate.run_namespace_labels})
            await namespaces.create(alias, state.unmanaged)
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


def anti_affinity_to(app: str) -> dict[str, Any]:
    """Required anti-affinity to pods labelled app=<app> on the same node: lockgate does not
    model it, so its model says "fits" where kube-scheduler says Unschedulable."""
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"app": app}}, "namespaceSelector": {},
        "topologyKey": "kubernetes.io/hostname"}]}}


async def test_a_controller_whose_pods_keep_being_refused_backs_off(run: Run) -> None:
    queue, trap, blocker = f"rs-{run.run}", f"trap-{run.run}", f"blocker-{run.run}"
    allocatable = {"cpu": "1", "memory": "8Gi", "pods": "110"}
    await run.core.create_node({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": trap, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                     "labels": {"kubernetes.io/hostname": trap, "pool": trap}},
        "status": {"capacity": allocatable, "allocatable": allocatable}})
    run.nodes.append(trap)
    await eventually(lambda: run.pool.fetchval(
        "SELECT schedulable FROM cluster_nodes WHERE cluster = $1 AND node = $2 AND present",
        run.alias, trap), within=60, what="the trap node Ready as lockgate sees it")
    binding = [{"cluster": "*", "names": [run.namespace]}]
    async with aiohttp.ClientSession(headers=run.lockgate.admin_headers) as session, \
            session.post(f"{run.lockgate.admin_url}/api/v1/queues",
                         json={"name": queue, "namespaces": binding}) as response:
        assert response.status in (200, 201), await response.text()
    await run.lockgate.wait_for_queues({queue: {"cordoned": False, "namespaces": binding}})
    # A bare, unmanaged pod on the node, which the ReplicaSet's pods must not share a node with.
    await run.core.create_namespaced_pod(run.unmanaged, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": blocker, "labels": {"app": blocker}},
        "spec": {"nodeName": trap, "containers": [{"name": "main", "image": "busybox"}]}})
    template = a_pod("unused").in_queue(queue).requesting(cpu="1", memory="1Gi").manifest()
    template["spec"].update(nodeSelector={"pool": trap}, affinity=anti_affinity_to(blocker),
                            restartPolicy="Always")
    created = await run.apps.create_namespaced_replica_set(run.namespace, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rs"}},
                 "template": {"metadata": {"labels": {**template["metadata"]["labels"],
                                                      "app": "rs"}},
                              "spec": template["spec"]}}})
    rs_uid = str(created.metadata.uid)

    async def one_replica_other_than(*uids: str) -> client.V1Pod | None:
        pods = await run.replicas()
        return pods[0] if len(pods) == 1 and pods[0].metadata.uid not in uids else None

    async def given_up(uid: str) -> asyncpg.Record | None:
        row = await run.job(uid)
        return row if row is not None and row["unplaceable_at"] is not None else None

    async def backoff_with(attempts: int) -> asyncpg.Record | None:
        row = await run.backoff()
        return row if row is not None and row["attempts"] == attempts else None

    # 1. The first replica is released, refused by kube-scheduler, given up on and deleted; its
    #    controller backs off for the first delay.
    first = await eventually(one_replica_other_than, within=60, what="the first replica")
    await eventually(lambda: given_up(first.metadata.uid), within=90,
                     what="the first replica given up on")
    one = await eventually(lambda: backoff_with(1), within=30, what="the first back-off")
    assert (one["cluster"], one["controller_uid"]) == (run.alias, rs_uid)
    assert one["pod"] == first.metadata.name
    assert (one["until"] - one["given_up_at"]).total_seconds() == pytest.approx(BACKOFF)
    assert (await run.job(first.metadata.uid))["controller_uid"] == rs_uid

    # 2. Its replacement waits, and says why; it is no head of a blocked line, only counted.
    second = await eventually(lambda: one_replica_other_than(first.metadata.uid), within=60,
                              what="the first replacement")

    async def explained_backing_off() -> dict[str, Any] | None:
        row = await run.job(second.metadata.uid)
        if row is None:
            return None
        assert row["state"] == "queued", (
            f"the replacement was {row['state']} before its back-off could be seen "
            f"(back-off until {one['until']})")
        body = await run.explain(second.metadata.name)
        report = await fairness_report(run.lockgate.ports.scheduler_health)
        counted = [q for q in report["queues"] if q["name"] == queue and q["backing_off"] == 1]
        explanation = body["explanation"]
        return body if explanation["reason"] == "backing_off" and counted else None

    body = await eventually(explained_backing_off, within=BACKOFF,
                            what="explain and the fairness report saying it backs off")
    assert body["explanation"]["backoff_attempts"] == 1
    until_text = one["until"].strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (f"backing off after 1 unplaceable attempt; next try after {until_text}"
            in body["message"])

    # 3. Released only after the delay, refused again: the next delay is twice as long.
    await eventually(lambda: given_up(second.metadata.uid), within=BACKOFF + 90,
                     what="the first replacement released after the back-off and given up on")
    second_row = await run.job(second.metadata.uid)
    assert second_row["released_at"] >= one["until"]
    two = await eventually(lambda: backoff_with(2), within=30, what="the second back-off")
    assert (two["until"] - two["given_up_at"]).total_seconds() == pytest.approx(2 * BACKOFF)

    # 4. The model fits again (the blocker goes); the back-off survives a restart of the
    #    scheduler; the next replacement is released after it, binds, and resets it.
    await run.core.delete_namespaced_pod(blocker, run.unmanaged, grace_period_seconds=0)

    async def blocker_gone() -> bool:
        try:
            await run.core.read_namespaced_pod(blocker, run.unmanaged)
        except ApiException as error:
            if error.status == 404:
                return True
            raise
        return False

    await eventually(blocker_gone, within=30, what="the blocker pod gone")
    scheduler = run.lockgate.processes["fair-scheduler"]
    assert await scheduler.stop() == 0
    await scheduler.start()
    await scheduler.wait_ready()
    third = await eventually(lambda: one_replica_other_than(first.metadata.uid,
                                                            second.metadata.uid),
                             within=60, what="the second replacement")

    async def told_backing_off() -> client.CoreV1Event | None:
        events = await run.core.list_namespaced_event(
            run.namespace, field_selector=f"involvedObject.uid={third.metadata.uid}")
        return next((e for e in events.items
                     if "backing off after 2 unplaceable attempts" in (e.message or "")), None)

    # The waiting Event on the pod says it too (written while it is gated, so before the end).
    await eventually(told_backing_off, within=2 * BACKOFF,
                     what="a waiting Event on the second replacement saying it backs off")

    async def bound() -> str | None:
        pod = await run.core.read_namespaced_pod(third.metadata.name, run.namespace)
        return pod.spec.node_name or None

    assert await eventually(bound, within=2 * BACKOFF + 90,
                            what="the second replacement bound") == trap
    third_row = await run.job(third.metadata.uid)
    assert third_row["released_at"] >= two["until"]
    assert third_row["unplaceable_at"] is None
    await eventually(lambda: _is_none(run.backoff()), within=30,
                     what="the back-off reset by the bind")


async def _is_none(value: Any) -> bool:
    return await value is None
