"""A pod that skips the queue is found and shown (issue 38, item 1).

As docs/integrations/jupyterhub.md used to leave it under `make run`: a namespace labelled
`lockgate.io/managed=true` and `lockgate.io/queue=<queue>`, bound to the queue, but without the
run's own label (`lockgate.io/run=<run id>`, `lockgate.io/run=dev` under `make run`), so the
run's webhook does not serve it. A user who may edit that namespace (a ServiceAccount holding
`edit` there, not an admin) creates a pod naming no queue itself: no webhook gates it, and it
runs at once. lockgate must then know: its job is recorded as having skipped the gate, it counts
as the queue's usage in the scheduler leader's picture, it gets a Warning Event that says why,
and `status` and `explain` say so. `queue create --namespace` warned about it beforehand.
A pod already running when its namespace gets bound is counted from then on, not at its end.

Every service runs as a process on the real stack; isolation as in every end-to-end test
(helpers.runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from kubernetes_asyncio import client, config

from devstack.stack import StackInfo
from helpers.kube import gates_of
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run, token_kubeconfig
from helpers.waiting import eventually
from lockgate.labels import MANAGED_NAMESPACE_LABEL, QUEUE_LABEL
from lockgate.noticing import NoticeReason

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

RESEND = 2.0  # the watcher publishes pods that skipped the gate again this often


async def admin_get(run: LockgateRun, path: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(headers=run.lockgate.admin_headers) as session, \
            session.get(f"{run.lockgate.admin_url}{path}") as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body


async def user_in(run: LockgateRun, namespace: str, tmp_path: Path) -> client.ApiClient:
    """A client of a ServiceAccount that holds `edit` in `namespace`, and nothing else."""
    admin = run.core()
    await admin.create_namespaced_service_account(namespace, {"metadata": {"name": "ann"}})
    await client.RbacAuthorizationV1Api(run.apis[run.alias()]).create_namespaced_role_binding(
        namespace, {"metadata": {"name": "ann-edits"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "edit"},
                    "subjects": [{"kind": "ServiceAccount", "name": "ann",
                                  "namespace": namespace}]})
    token = await admin.create_namespaced_service_account_token(
        "ann", namespace, {"spec": {"expirationSeconds": 3600}})
    path = token_kubeconfig(run.lockgate.kubeconfigs[run.alias()], "ann", token.status.token,
                            namespace, tmp_path / "ann.kubeconfig")
    return await config.new_client_from_config(path)


async def test_a_pod_in_a_bound_namespace_the_webhook_does_not_serve_is_found_and_shown(
        stack: StackInfo, tmp_path: Path) -> None:
    async with lockgate_run(stack, tmp_path, name="skip", env={
            "LOCKGATE_WATCHER_SKIPPED_GATE_RESEND_SECONDS": str(RESEND)}) as run:
        queue = run.name("research")
        # Managed and naming its queue, as the recipe says; but not the run's namespace label.
        jhub = await run.create_namespace(name=run.name("jhub"), managed=False, labels={
            MANAGED_NAMESPACE_LABEL: "true", QUEUE_LABEL: queue})
        (created,) = await run.create_queues([queue], namespaces=[jhub])
        (run_label, run_value), = run.lockgate.run_namespace_labels.items()
        assert any(f"{run_label}={run_value}" in warning and jhub in warning
                   for warning in created.get("warnings") or []), created

        user_api = await user_in(run, jhub, tmp_path)
        try:
            pod = await client.CoreV1Api(user_api).create_namespaced_pod(
                jhub, a_pod("jupyter-ann").tolerating_kwok_nodes()
                .requesting(cpu="1", memory="64Mi").manifest())
        finally:
            await user_api.close()
        assert gates_of(pod) == [] and QUEUE_LABEL not in (pod.metadata.labels or {})
        uid = pod.metadata.uid

        # Recorded as a job of the queue that skipped the gate, and followed to Running.
        async def running() -> asyncpg.Record | None:
            row = await run.job(uid)
            return row if row is not None and row["state"] == "running" else None

        row = await eventually(running, within=90, every=0.3,
                               what="the ungated pod recorded running")
        assert (row["queue"], row["jobset"], row["skipped_gate"]) == (queue, jhub, True)
        assert row["decision_id"] is None  # lockgate never released it

        # The leader charges it to the queue: its usage, in status, with a warning.
        async def charged() -> dict[str, Any] | None:
            status = await admin_get(run, "/api/v1/status")
            entry = next((q for q in status["queues"] if q["queue"] == queue), None)
            return entry if entry is not None and entry["running"] == 1 and (
                entry["actual_share"] or 0) > 0 else None

        standing = await eventually(charged, within=60, every=0.5,
                                    what="the pod counted as the queue's usage by the leader")
        assert standing["skipped_gate"] == 1

        # A Warning Event on the pod, which says why.
        async def warned() -> Any:
            events = await run.core().list_namespaced_event(
                jhub, field_selector=f"involvedObject.uid={uid}")
            return next((e for e in events.items
                         if e.reason == NoticeReason.SKIPPED_GATE.value), None)

        event = await eventually(warned, within=60, every=0.5, what="the pod's Warning Event")
        assert event.type == "Warning"
        assert f"{QUEUE_LABEL}={queue}" in event.message
        assert f"does not serve namespace {jhub}" in event.message
        assert f"{run_label}={run_value}" in event.message

        # explain says it ran without lockgate's gate, and why that can happen; the job's JSON
        # is marked.
        explained = await admin_get(run, f"/api/v1/explain/{run.alias()}/{jhub}/jupyter-ann")
        assert explained["pod"]["skipped_gate"] is True
        assert explained["message"].startswith("lockgate never gated this pod")
        assert "lockgate.io/run=dev" in explained["message"]
        jobs = await admin_get(run, f"/api/v1/jobs?queue={queue}")
        assert [(j["name"], j["skipped_gate"]) for j in jobs["jobs"]] == [("jupyter-ann", True)]

        # A pod that was running before the queue bound its namespace: counted once it does.
        later = await run.create_namespace(name=run.name("late"), managed=False, labels={
            MANAGED_NAMESPACE_LABEL: "true", QUEUE_LABEL: queue})
        early = await run.create_pod(a_pod("jupyter-bob").tolerating_kwok_nodes()
                                     .requesting(cpu="1", memory="64Mi").manifest(),
                                     namespace=later)

        async def started() -> bool:
            found = await run.pod("jupyter-bob", namespace=later)
            return found is not None and found.status.phase == "Running"

        await eventually(started, within=60, every=0.3, what="the early pod running")
        assert await run.job(early.metadata.uid) is None  # its queue does not bind it yet
        async with aiohttp.ClientSession(headers=run.lockgate.admin_headers) as session, \
                session.patch(f"{run.lockgate.admin_url}/api/v1/queues/{queue}", json={
                    "namespaces": [{"cluster": "*", "names": [jhub, later]}]}) as reply:
            assert reply.status == 200, await reply.text()
            assert any(later in warning for warning in (await reply.json())["warnings"])

        async def counted() -> asyncpg.Record | None:
            row = await run.job(early.metadata.uid)
            return row if row is not None and row["state"] == "running" else None

        late_row = await eventually(counted, within=10 * RESEND + 30, every=0.3,
                                    what="the early pod counted once its namespace is bound")
        assert (late_row["queue"], late_row["skipped_gate"]) == (queue, True)
