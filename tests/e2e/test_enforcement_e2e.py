"""Nobody jumps the queue, with lockgate running: a user's bypass attempts change nothing in
lockgate's books.

Every service runs as a process with its own ServiceAccount (Lockgate.for_stack). A user holding
`edit` in a managed namespace creates two pods through the webhook: one that fits (the fair
scheduler releases it and the ungater, the only identity allowed to, removes its gate) and one
too big for any node (it waits). The user then tries to free the waiting pod (remove the gate,
move it to another queue): refused by the apiserver. Postgres must then show the waiting pod
queued without any release decision, and every job that left the queue with the decision that
released it.

Isolation on the shared stack as in every end-to-end test (helpers.runs): a database of its own
that keeps only this run's cluster name, its own namespace, queues, webhook registration and
consumer groups, free ports.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.stack import StackInfo
from helpers.kube import gates_of
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.labels import QUEUE_LABEL, SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

JSON_PATCH = "application/json-patch+json"


@dataclass
class Running:
    run: LockgateRun
    user: client.CoreV1Api  # mallory, who holds `edit` in the run's namespace
    queue: str  # the namespace's queue
    other_queue: str


def as_user(admin_kubeconfig: str, token: str) -> dict[str, Any]:
    cluster = yaml.safe_load(Path(admin_kubeconfig).read_text())["clusters"][0]
    return {"apiVersion": "v1", "kind": "Config", "clusters": [cluster],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "user", "context": {"cluster": cluster["name"],
                                                      "user": "user"}}],
            "current-context": "user"}


@pytest.fixture
async def running(stack: StackInfo, tmp_path: Path) -> AsyncIterator[Running]:
    async with lockgate_run(stack, tmp_path, name="enf", standby_scheduler=False) as run:
        queue, other_queue = run.name("team"), run.name("vip")
        await run.create_queues([queue, other_queue], namespaces=[run.namespace])
        namespace = await run.create_namespace(labels={QUEUE_LABEL: queue})
        admin = run.core()
        await admin.create_namespaced_service_account(namespace, {"metadata": {"name": "mallory"}})
        await client.RbacAuthorizationV1Api(run.apis[run.alias()]).create_namespaced_role_binding(
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
        try:
            yield Running(run, client.CoreV1Api(user_api), queue, other_queue)
        finally:
            await user_api.close()


async def job(running: Running, uid: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await running.run.pool.fetchrow(
        "SELECT state, queue, decision_id FROM jobs WHERE cluster = $1 AND uid = $2",
        running.run.alias(), uid)
    return row


async def test_a_waiting_pod_stays_queued_in_lockgates_books_whatever_its_user_tries(
    running: Running,
) -> None:
    ns, user = running.run.namespace, running.user
    # A user's pods, as the user writes them: the webhook gates and labels them.
    fits = await user.create_namespaced_pod(ns, a_pod("fits").tolerating_kwok_nodes()
                                            .requesting(cpu="1", memory="64Mi").manifest())
    waits = await user.create_namespaced_pod(ns, a_pod("too-big").tolerating_kwok_nodes()
                                             .requesting(cpu="1000", memory="64Mi").manifest())
    assert gates_of(waits) == [SCHEDULING_GATE]
    assert waits.metadata.labels[QUEUE_LABEL] == running.queue

    # The normal path works with the services' own identities: released, ungated, bound.
    async def released() -> asyncpg.Record | None:
        row = await job(running, fits.metadata.uid)
        return row if row is not None and row["state"] == "running" else None

    fits_row = await eventually(released, within=90, every=0.2, what="the fitting pod running")
    assert fits_row["decision_id"]

    async def queued() -> asyncpg.Record | None:
        row = await job(running, waits.metadata.uid)
        return row if row is not None and row["state"] == "queued" else None

    await eventually(queued, within=60, every=0.2, what="the big pod queued in Postgres")

    attempts: list[tuple[Any, str]] = [
        ([{"op": "remove", "path": "/spec/schedulingGates/0"}], JSON_PATCH),
        ({"spec": {"schedulingGates": []}}, "application/merge-patch+json"),
        ({"metadata": {"labels": {QUEUE_LABEL: running.other_queue}}},
         "application/merge-patch+json"),
    ]
    for body, content_type in attempts:
        with pytest.raises(ApiException) as refused:
            await user.patch_namespaced_pod("too-big", ns, body, _content_type=content_type)
        assert refused.value.status == 403, refused.value.body
        assert "ValidatingAdmissionPolicy" in json.loads(refused.value.body)["message"]

    # Refused in the apiserver, so there was no change for the watcher to report: the books
    # and the pod must be as they were, not merely "not yet updated".
    pod = await running.run.core().read_namespaced_pod("too-big", ns)
    assert gates_of(pod) == [SCHEDULING_GATE] and pod.spec.node_name is None
    assert pod.metadata.labels[QUEUE_LABEL] == running.queue
    row = await job(running, waits.metadata.uid)
    assert row is not None
    assert (row["state"], row["queue"], row["decision_id"]) == ("queued", running.queue, None)
    unexplained = await running.run.pool.fetch(
        "SELECT uid, state FROM jobs WHERE cluster = $1 AND decision_id IS NULL"
        " AND state IN ('released', 'ungated', 'bound', 'running')", running.run.alias())
    assert not unexplained, f"jobs out of the queue without a release decision: {unexplained}"
