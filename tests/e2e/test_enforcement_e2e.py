"""Nobody jumps the queue, with lockgate running: a user's bypass attempts change nothing in
lockgate's books.

Every service runs as a process with its own ServiceAccount (Lockgate.for_stack). A user holding
`edit` in a managed namespace creates two pods through the webhook: one that fits (the fair
scheduler releases it and the ungater, the only identity allowed to, removes its gate) and one
too big for any node (it waits). The user then tries to free the waiting pod (remove the gate,
move it to another queue): refused by the apiserver. Postgres must then show the waiting pod
queued without any release decision, and every job that left the queue with the decision that
released it.

Isolation on the shared stack as in test_fairness_e2e: a database of its own that keeps only this
run's cluster name, its own webhook registration and consumer groups (run id), free ports.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.isolation import keep_only_clusters
from devstack.launcher import Lockgate, ServicePorts
from helpers.kube import gates_of
from helpers.pods import a_pod
from helpers.postgres import fresh_database, migrate_database
from helpers.waiting import eventually
from lockgate.labels import MANAGED_NAMESPACE_LABEL, QUEUE_LABEL, SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

RUN = uuid.uuid4().hex[:6]
ALIAS = f"enf-{RUN}"
CLUSTERS = {ALIAS: "cluster-a"}
QUEUE, OTHER_QUEUE = f"team-{RUN}", f"vip-{RUN}"
JSON_PATCH = "application/json-patch+json"


@dataclass
class Running:
    admin: client.CoreV1Api
    user: client.CoreV1Api
    namespace: str
    db: asyncpg.Pool


def as_user(admin_kubeconfig: str, token: str) -> dict[str, Any]:
    cluster = yaml.safe_load(Path(admin_kubeconfig).read_text())["clusters"][0]
    return {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "user", "context": {"cluster": cluster["name"],
                                                      "user": "user"}}],
            "current-context": "user"}


@pytest.fixture
async def running(stack: Any, kube_clients: dict[str, client.ApiClient],
                  tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Running]:
    admin_api = kube_clients["cluster-a"]
    admin = client.CoreV1Api(admin_api)
    namespace = f"enf-e2e-{RUN}"
    async with fresh_database(stack.postgres_dsn, prefix=f"lockgate_enf_{RUN}") as dsn:
        await migrate_database(dsn)
        await keep_only_clusters(dsn, [ALIAS])
        ports = ServicePorts.free()
        lockgate = Lockgate.for_stack(
            stack, clusters=CLUSTERS, postgres_dsn=dsn, ports=ports, run_id=f"enf-{RUN}",
            standby_scheduler=False, log_dir=tmp_path_factory.mktemp("service-logs"),
            cert_dir=tmp_path_factory.mktemp("webhook-certs"))
        db = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        user_api: client.ApiClient | None = None
        try:
            await lockgate.start()
            binding = [{"cluster": "*", "names": [namespace]}]
            async with aiohttp.ClientSession(headers=lockgate.admin_headers) as session:
                for queue in (QUEUE, OTHER_QUEUE):
                    async with session.post(f"{lockgate.admin_url}/api/v1/queues", json={
                            "name": queue, "namespaces": binding}) as response:
                        assert response.status in (200, 201), await response.text()
            await lockgate.wait_for_queues({q: {"cordoned": False, "namespaces": binding}
                                            for q in (QUEUE, OTHER_QUEUE)})
            await admin.create_namespace({"metadata": {"name": namespace, "labels": {
                MANAGED_NAMESPACE_LABEL: "true", QUEUE_LABEL: QUEUE,
                **lockgate.run_namespace_labels}}})
            await admin.create_namespaced_service_account(namespace,
                                                          {"metadata": {"name": "mallory"}})
            await client.RbacAuthorizationV1Api(admin_api).create_namespaced_role_binding(
                namespace, {
                    "metadata": {"name": "mallory-edits"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                "kind": "ClusterRole", "name": "edit"},
                    "subjects": [{"kind": "ServiceAccount", "name": "mallory",
                                  "namespace": namespace}]})
            token = await admin.create_namespaced_service_account_token(
                "mallory", namespace, {"spec": {"expirationSeconds": 3600}})
            user_api = await config.new_client_from_config_dict(
                as_user(stack.kubeconfigs["cluster-a"], token.status.token))

            async def default_account() -> bool | None:
                try:
                    await admin.read_namespaced_service_account("default", namespace)
                except ApiException as error:
                    return None if error.status == 404 else False
                return True

            await eventually(default_account, within=30, what="the default ServiceAccount")
            yield Running(admin, client.CoreV1Api(user_api), namespace, db)
        finally:
            codes = await lockgate.stop()
            if user_api is not None:
                await user_api.close()
            try:
                await admin.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
                await admin.delete_namespace(namespace)
            except ApiException as error:
                if error.status != 404:
                    raise
            await db.close()
    assert all(code in (0, None) for code in codes.values()), codes


async def job(db: asyncpg.Pool, uid: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await db.fetchrow(
        "SELECT state, queue, decision_id FROM jobs WHERE cluster = $1 AND uid = $2", ALIAS, uid)
    return row


async def test_a_waiting_pod_stays_queued_in_lockgates_books_whatever_its_user_tries(
    running: Running,
) -> None:
    ns, user = running.namespace, running.user
    # A user's pods, as the user writes them: the webhook gates and labels them.
    fits = await user.create_namespaced_pod(ns, a_pod("fits").tolerating_kwok_nodes()
                                            .requesting(cpu="1", memory="64Mi").manifest())
    waits = await user.create_namespaced_pod(ns, a_pod("too-big").tolerating_kwok_nodes()
                                             .requesting(cpu="1000", memory="64Mi").manifest())
    assert gates_of(waits) == [SCHEDULING_GATE] and waits.metadata.labels[QUEUE_LABEL] == QUEUE

    # The normal path works with the services' own identities: released, ungated, bound.
    async def released() -> asyncpg.Record | None:
        row = await job(running.db, fits.metadata.uid)
        return row if row is not None and row["state"] == "running" else None

    fits_row = await eventually(released, within=90, every=0.2, what="the fitting pod running")
    assert fits_row["decision_id"]

    async def queued() -> asyncpg.Record | None:
        row = await job(running.db, waits.metadata.uid)
        return row if row is not None and row["state"] == "queued" else None

    await eventually(queued, within=60, every=0.2, what="the big pod queued in Postgres")

    attempts: list[tuple[Any, str]] = [
        ([{"op": "remove", "path": "/spec/schedulingGates/0"}], JSON_PATCH),
        ({"spec": {"schedulingGates": []}}, "application/merge-patch+json"),
        ({"metadata": {"labels": {QUEUE_LABEL: OTHER_QUEUE}}}, "application/merge-patch+json"),
    ]
    for body, content_type in attempts:
        with pytest.raises(ApiException) as refused:
            await user.patch_namespaced_pod("too-big", ns, body, _content_type=content_type)
        assert refused.value.status == 403, refused.value.body
        assert "ValidatingAdmissionPolicy" in json.loads(refused.value.body)["message"]

    # Refused in the apiserver, so there was no change for the watcher to report: the books
    # and the pod must be as they were, not merely "not yet updated".
    pod = await running.admin.read_namespaced_pod("too-big", ns)
    assert gates_of(pod) == [SCHEDULING_GATE] and pod.spec.node_name is None
    assert pod.metadata.labels[QUEUE_LABEL] == QUEUE
    row = await job(running.db, waits.metadata.uid)
    assert row is not None
    assert (row["state"], row["queue"], row["decision_id"]) == ("queued", QUEUE, None)
    unexplained = await running.db.fetch(
        "SELECT uid, state FROM jobs WHERE cluster = $1 AND decision_id IS NULL"
        " AND state IN ('released', 'ungated', 'bound', 'running')", ALIAS)
    assert not unexplained, f"jobs out of the queue without a release decision: {unexplained}"
