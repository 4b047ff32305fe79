"""The coordinator flow (issue 9), on the real stack with lockgate's real processes.

An operator creates a queue and, with the CLI, an ephemeral namespace for one job set. Using only
the token it printed (the namespace's ServiceAccount, a real non-admin identity), a coordinator
creates 30 worker pods and a Service. The workers inherit the queue and job set, are gated, and
are released fairly against a competing queue of an ordinary namespace: the fair scheduler is
started only once both queues wait, so the released counts while both still wait are the fair
split, not the order of arrival. A kind the queue does not allow is refused with a message naming
the queue and its kinds; allowing it takes effect on the existing namespace. A namespace labelled
like an ephemeral one by somebody else gains no queue. Creation is idempotent and its errors say
what to do.

Isolation as in test_queue_binding: a fresh database, a run id (consumer groups, Queue objects,
webhook registration, namespace labels and names), cluster names of its own.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import urllib.parse
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

from devstack.launcher import Lockgate
from devstack.ports import ServicePorts
from devstack.stack import StackInfo
from helpers.kube import gates_of, worker_group_crd
from helpers.network import TcpRelay
from helpers.pods import a_deployment, a_pod
from helpers.postgres import fresh_database
from helpers.waiting import eventually
from lockgate import namespace_access as access
from lockgate.labels import JOBSET_LABEL, MANAGED_NAMESPACE_LABEL, QUEUE_LABEL, SCHEDULING_GATE
from lockgate.resources import Resources
from lockgate_cli import root as cli

pytestmark = [pytest.mark.stack, pytest.mark.timeout(420)]

RUN = uuid.uuid4().hex[:8]
CLUSTER = "cluster-a"
ALIAS = f"{CLUSTER}-{RUN}"
WORKERS = 30
POD_CPU = 4


@dataclass
class Run:
    lockgate: Lockgate
    db: asyncpg.Pool
    admin_kube: client.ApiClient  # for setting up the competitor and looking; never the coordinator
    keeper_link: ThreadedRelay  # between queue-store's namespace-keeper and the apiserver

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        url = f"{self.lockgate.admin_url}/api/v1{path}"
        async with aiohttp.ClientSession(headers=self.lockgate.admin_headers) as session, \
                session.request(method, url, json=body) as reply:
            return reply.status, (await reply.json() if reply.status != 204 else None)

    async def cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        token_file = self.lockgate.write_token_files()["admin"]
        code = await asyncio.to_thread(
            cli.main, ["--api", self.lockgate.admin_url, "--token-file", str(token_file),
                       *argv], out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    async def counts(self, queue: str) -> dict[str, int]:
        status, answer = await self.call(
            "GET", f"/jobs?queue={queue}&cluster={ALIAS}&limit=1000&all=true")
        assert status == 200, answer
        counts = {"queued": 0, "out": 0}
        for job in answer["jobs"]:
            counts["queued" if job["state"] == "queued" else "out"] += 1
        return counts


@pytest.fixture(scope="module")
async def run(stack: StackInfo, kube_clients: dict[str, client.ApiClient],
              tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Run]:
    if "namespace-keeper" not in stack.identity_kubeconfigs:
        pytest.fail("the stack has no namespace-keeper identity: run `python -m devstack up` "
                    "again to apply k8s/base and write its kubeconfigs")
    async with fresh_database(stack.postgres_dsn, prefix=f"coord_{RUN}") as dsn:
        lockgate = Lockgate.for_stack(
            stack, clusters={ALIAS: CLUSTER}, postgres_dsn=dsn, run_id=f"co-{RUN}",
            ports=ServicePorts.free(), log_dir=tmp_path_factory.mktemp("service-logs"),
            cert_dir=tmp_path_factory.mktemp("webhook-certs"),
            extra_env={"LOCKGATE_QUEUE_STORE_RETRY__MAX_SECONDS": "0.5",
                       "LOCKGATE_WATCHER_RETRY__MAX_SECONDS": "0.5"},
            standby_scheduler=False,
        )
        # queue-store reaches the cluster as namespace-keeper through a relay a test can sever.
        keeper_link, keeper_config = relayed_kubeconfig(
            stack.identity_kubeconfigs["namespace-keeper"][CLUSTER],
            tmp_path_factory.mktemp("keeper") / "kubeconfig")
        await keeper_link.start()
        lockgate.identity_kubeconfigs = {**lockgate.identity_kubeconfigs,
                                         "namespace-keeper": {ALIAS: str(keeper_config)}}
        db: asyncpg.Pool | None = None
        try:
            # No fair scheduler yet: the fairness test starts it once both queues wait.
            await lockgate.start(only=["queue-store", "admission-webhook", "cluster-watcher",
                                       "ungater"])
            db = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
            yield Run(lockgate, db, kube_clients[CLUSTER], keeper_link)
        finally:
            await _delete_namespaces(kube_clients[CLUSTER], f"lockgate.io/run=co-{RUN}")
            await lockgate.stop()
            await keeper_link.close()
            if db is not None:
                await db.close()


class ThreadedRelay:
    """A TcpRelay on an event loop of its own thread: it outlives each test (queue-store keeps
    its connections through it for the whole module), which the per-test check for leaked
    asyncio tasks would otherwise cancel."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="keeper relay")
        self._thread.start()
        self.relay = TcpRelay(target_host, target_port)
        self.port = self.relay.port

    async def _on_its_loop(self, coroutine: Any) -> None:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))

    async def start(self) -> None:
        await self._on_its_loop(self.relay.start())

    async def sever(self) -> None:
        await self._on_its_loop(self.relay.sever())

    async def close(self) -> None:
        await self.sever()
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join, 5)
        self._loop.close()


def relayed_kubeconfig(kubeconfig: str, path: Path) -> tuple[ThreadedRelay, Path]:
    """A copy of `kubeconfig` whose server is a relay (not started yet) to the real one."""
    loaded = yaml.safe_load(Path(kubeconfig).read_text())
    (entry,) = loaded["clusters"]
    server = urllib.parse.urlsplit(entry["cluster"]["server"])
    assert server.hostname and server.port, server
    relay = ThreadedRelay(server.hostname, server.port)
    entry["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    path.write_text(yaml.safe_dump(loaded))
    return relay, path


async def _delete_namespaces(api: client.ApiClient, selector: str) -> None:
    core = client.CoreV1Api(api)
    for namespace in (await core.list_namespace(label_selector=selector)).items:
        try:
            await core.delete_namespace(namespace.metadata.name)
        except ApiException as error:
            if error.status != 404:
                raise


def message_of(error: ApiException) -> str:
    return str(json.loads(error.body)["message"])


async def coordinator_client(kubeconfig: dict[str, Any]) -> client.ApiClient:
    return await config.new_client_from_config_dict(kubeconfig)


def worker(name: str) -> dict[str, Any]:
    return a_pod(name).requesting(cpu=str(POD_CPU), memory="1Gi").manifest()


async def create_queue(run: Run, name: str, *extra: str) -> None:
    code, _, err = await run.cli("queue", "create", name, *extra)
    assert code == 0, err


# ---------------------------------------------------------------------------------- tests


async def test_creation_is_idempotent_and_errors_say_what_to_do(run: Run) -> None:
    queue = f"idem-{RUN}"
    await create_queue(run, queue)
    body = {"queue": queue, "jobset": "etl-1", "cluster": ALIAS, "ttl_seconds": 7200}
    first_status, first = await run.call("POST", "/namespaces", body)
    assert first_status == 201, first
    again_status, again = await run.call("POST", "/namespaces", body)
    assert again_status == 200, again
    assert again["namespace"]["name"] == first["namespace"]["name"]
    assert again["namespace"]["created_at"] == first["namespace"]["created_at"]
    status, listed = await run.call("GET", f"/namespaces?queue={queue}")
    assert [r["name"] for r in listed["namespaces"]] == [first["namespace"]["name"]]
    status, described = await run.call(
        "GET", f"/namespaces/{ALIAS}/{first['namespace']['name']}")
    assert [(t["from_state"], t["to_state"], t["cause"]) for t in described["transitions"]] == [
        (None, "active", "created")]
    assert described["allowed_kinds"] == list(access.DEFAULT_ALLOWED_KINDS)

    status, answer = await run.call("POST", "/namespaces", {**body, "queue": f"nope-{RUN}"})
    assert status == 404 and "lockgate queue create" in answer["error"], answer
    status, answer = await run.call("POST", "/namespaces", {**body, "cluster": "elsewhere"})
    assert status == 404 and ALIAS in answer["error"], answer
    status, answer = await run.call("POST", "/namespaces", {**body, "ttl_seconds": -5})
    assert status == 400, answer


async def test_an_unreachable_cluster_is_a_503_and_leaves_nothing_recorded(run: Run) -> None:
    queue = f"outage-{RUN}"
    await create_queue(run, queue)
    body = {"queue": queue, "jobset": "during-outage", "cluster": ALIAS}
    await run.keeper_link.sever()
    try:
        status, answer = await run.call("POST", "/namespaces", body)
        assert status == 503, answer
        assert f"cluster {ALIAS} is unreachable" in answer["error"], answer
        assert "retry" in answer["error"], answer
        status, listed = await run.call("GET", f"/namespaces?queue={queue}")
        assert (status, listed["namespaces"]) == (200, [])
    finally:
        await run.keeper_link.start()
    status, answer = await run.call("POST", "/namespaces", body)
    assert status == 201, answer
    name = answer["namespace"]["name"]
    made = await client.CoreV1Api(run.admin_kube).read_namespace(name)
    assert made.metadata.labels[access.EPHEMERAL_LABEL] == "true"


async def test_a_namespace_labelled_like_an_ephemeral_one_gains_no_queue(
    run: Run, make_namespace: Any,
) -> None:
    queue = f"forged-{RUN}"
    await create_queue(run, queue)
    forged = await make_namespace(CLUSTER, prefix="lg-co", labels={
        **run.lockgate.run_namespace_labels, MANAGED_NAMESPACE_LABEL: "true",
        QUEUE_LABEL: queue, JOBSET_LABEL: "j", access.EPHEMERAL_LABEL: "true"})
    status, defined = await run.call("GET", f"/queues/{queue}")
    assert status == 200, defined
    await run.lockgate.wait_for_queues({queue: defined})  # refused for the binding, not as unknown
    with pytest.raises(ApiException) as refused:
        await client.CoreV1Api(run.admin_kube).create_namespaced_pod(forged, worker("w"))
    assert refused.value.status == 403
    assert f'may not use queue "{queue}"' in message_of(refused.value)


async def test_the_coordinator_flow(run: Run, make_namespace: Any) -> None:
    queue, rival = f"coord-{RUN}", f"rival-{RUN}"
    jobset = "dask-run-1"
    await create_queue(run, queue)
    rival_namespace = await make_namespace(CLUSTER, prefix="lg-co", labels={
        **run.lockgate.run_namespace_labels, MANAGED_NAMESPACE_LABEL: "true"})
    await create_queue(run, rival, "--namespace", rival_namespace)

    # The operator makes the namespace with the CLI, which prints what the coordinator needs.
    code, out, err = await run.cli("namespace", "create", "--queue", queue, "--jobset", jobset,
                                   "--cluster", ALIAS, "--ttl", "2h", "-o", "json")
    assert code == 0, err
    created = json.loads(out)
    namespace = created["namespace"]["name"]
    assert created["namespace"]["ttl_seconds"] == 7200
    code, table, err = await run.cli("namespace", "list", "--queue", queue)
    assert code == 0 and namespace in table and "active" in table, (table, err)
    code, table, err = await run.cli("namespace", "describe", f"{ALIAS}/{namespace}")
    assert code == 0 and "created" in table and "pods, services" in table, (table, err)
    # No wait for the webhook's copy: the answer to `namespace create` comes once the copies
    # bind the namespace, and pods are created at once, as a coordinator does.
    coordinator = await coordinator_client(created["kubeconfig"])
    try:
        core = client.CoreV1Api(coordinator)
        # Who the token is: the namespace's ServiceAccount, nobody else.
        with pytest.raises(ApiException) as outside:
            await core.list_namespaced_pod(rival_namespace)
        assert outside.value.status == 403
        assert f"system:serviceaccount:{namespace}:{access.COORDINATOR}" in message_of(
            outside.value)

        for index in range(WORKERS):
            await core.create_namespaced_pod(namespace, worker(f"worker-{index}"))
        await core.create_namespaced_service(namespace, {
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "scheduler"},
            "spec": {"selector": {"app": "dask"}, "ports": [{"port": 8786}]}})

        pods = (await core.list_namespaced_pod(namespace)).items
        assert len(pods) == WORKERS
        for pod in pods:
            assert (pod.metadata.labels[QUEUE_LABEL], pod.metadata.labels[JOBSET_LABEL]) == (
                queue, jobset)
            assert SCHEDULING_GATE in gates_of(pod)

        # A disallowed kind: refused, with the queue and its kinds named.
        for kind, attempt in (
            ("secrets", core.create_namespaced_secret(namespace, {
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                "stringData": {"k": "v"}})),
            ("roles.rbac.authorization.k8s.io",
             client.RbacAuthorizationV1Api(coordinator).create_namespaced_role(namespace, {
                 "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                 "metadata": {"name": "more"}, "rules": []})),
        ):
            with pytest.raises(ApiException) as refused:
                await attempt
            message = message_of(refused.value)
            assert refused.value.status == 403, message
            assert f"lockgate queue {queue} may not create {kind}" in message, message
            allowed = ", ".join(access.DEFAULT_ALLOWED_KINDS)
            assert f"it may create only {allowed}." in message, message
        # RBAC still keeps reading other kinds out of reach.
        with pytest.raises(ApiException) as unreadable:
            await core.list_namespaced_secret(namespace)
        assert unreadable.value.status == 403

        # The rival queue's 30 pods wait too; then the fair scheduler starts.
        admin_core = client.CoreV1Api(run.admin_kube)
        for index in range(WORKERS):
            await admin_core.create_namespaced_pod(
                rival_namespace, a_pod(f"rival-{index}").in_queue(rival).requesting(
                    cpu=str(POD_CPU), memory="1Gi").manifest())

        async def both_queued() -> bool:
            return (await run.counts(queue))["queued"] == WORKERS and (
                await run.counts(rival))["queued"] == WORKERS
        await eventually(both_queued, within=60, what="60 queued jobs in Postgres")

        fits = await pods_that_fit(run.admin_kube)
        assert fits < 2 * WORKERS, "the cluster must be too small for both queues"
        await run.lockgate.start(only=["fair-scheduler"])

        async def released() -> tuple[int, int] | None:
            mine, theirs = await run.counts(queue), await run.counts(rival)
            total = mine["out"] + theirs["out"]
            return (mine["out"], theirs["out"]) if total >= fits else None
        mine, theirs = await eventually(released, within=120,
                                        what=f"{fits} pods released (the cluster full)")
        assert (await run.counts(queue))["queued"] > 0 and (
            await run.counts(rival))["queued"] > 0, "both queues still wait"
        assert mine + theirs == fits
        print(f"released with both queues waiting: {queue} {mine}, {rival} {theirs} "
              f"(room for {fits})")
        assert abs(mine - theirs) <= 1, (
            f"equal weights, equal pods: {mine} released for {queue}, {theirs} for {rival}")

        # Allowing a kind takes effect on the existing namespace (Role and policy annotation).
        code, out, err = await run.cli("queue", "update", queue, "--allow-kind", "secrets")
        assert code == 0 and "secrets" in out, err

        async def secrets_allowed() -> bool:
            """The policy lets the Secret be created and the Role lets it be read."""
            try:
                await core.create_namespaced_secret(namespace, {
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"generateName": "creds-"}, "stringData": {"k": "v"}})
                listed = await core.list_namespaced_secret(namespace)
            except ApiException as error:
                if error.status == 403:
                    return False
                raise
            return len(listed.items) >= 1
        await eventually(secrets_allowed, within=30, what="Secrets allowed (policy and Role)")

        # ... and taking it back away refuses it again.
        code, out, err = await run.cli("queue", "update", queue, "--disallow-kind", "secrets")
        assert code == 0, err

        async def secret_refused() -> str | None:
            try:
                await core.create_namespaced_secret(namespace, {
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"generateName": "again-"}, "stringData": {"k": "v"}})
            except ApiException as error:
                return message_of(error) if error.status == 403 else None
            return None
        message = await eventually(secret_refused, within=30, what="the Secret refused again")
        assert f"lockgate queue {queue} may not create secrets" in message
    finally:
        await coordinator.close()


async def test_the_coordinator_scales_the_allowed_kinds_that_have_a_scale_subresource(
    run: Run,
) -> None:
    """`kubectl scale` for the coordinator: a Deployment, and a custom resource like Dask's
    DaskWorkerGroup allowed with `--allow-kind` (which adds it to the default kinds); a kind
    the queue does not allow stays refused."""
    group = f"t{RUN}.lockgate-test.io"
    async with worker_group_crd(run.admin_kube, group) as plural:
        queue = f"scale-{RUN}"
        await create_queue(run, queue, "--allow-kind", f"{plural}.{group}")
        status, defined = await run.call("GET", f"/queues/{queue}")
        assert status == 200 and sorted(defined["allowed_kinds"]) == sorted(
            [*access.DEFAULT_ALLOWED_KINDS, f"{plural}.{group}"]), defined
        status, answer = await run.call("POST", "/namespaces",
                                        {"queue": queue, "jobset": "dask-1", "cluster": ALIAS})
        assert status == 201, answer
        namespace = answer["namespace"]["name"]
        coordinator = await coordinator_client(answer["kubeconfig"])
        try:
            apps, custom = client.AppsV1Api(coordinator), client.CustomObjectsApi(coordinator)
            await apps.create_namespaced_deployment(namespace, a_deployment("workers")
                                                    .with_replicas(0).of(a_pod("w")).manifest())
            await apps.patch_namespaced_deployment_scale(
                "workers", namespace, {"spec": {"replicas": 2}})
            scale = await apps.read_namespaced_deployment_scale("workers", namespace)
            assert scale.spec.replicas == 2

            await custom.create_namespaced_custom_object(group, "v1", namespace, plural, {
                "apiVersion": f"{group}/v1", "kind": "WorkerGroup",
                "metadata": {"name": "dc-default"}, "spec": {"replicas": 1}})
            # As `kubectl scale` sends it: a merge patch of the Scale.
            await custom.patch_namespaced_custom_object_scale(
                group, "v1", namespace, plural, "dc-default", {"spec": {"replicas": 5}},
                _content_type="application/merge-patch+json")
            scaled = await custom.get_namespaced_custom_object(
                group, "v1", namespace, plural, "dc-default")
            assert scaled["spec"]["replicas"] == 5

            # replicasets.apps is not among its kinds: neither it nor its scale is granted.
            with pytest.raises(ApiException) as refused:
                await apps.patch_namespaced_replica_set_scale(
                    "anything", namespace, {"spec": {"replicas": 1}})
            assert refused.value.status == 403
            assert 'cannot patch resource "replicasets/scale"' in message_of(refused.value)
        finally:
            await coordinator.close()


async def pods_that_fit(api: client.ApiClient) -> int:
    """How many worker pods the cluster's schedulable nodes hold, minus what already runs."""
    core = client.CoreV1Api(api)
    total = 0
    for node in (await core.list_node()).items:
        if node.spec.unschedulable:
            continue
        free = Resources.from_kubernetes(node.status.allocatable)["cpu"]
        pods = (await core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node.metadata.name}")).items
        for pod in pods:
            if pod.status.phase in ("Succeeded", "Failed"):
                continue
            for container in pod.spec.containers:
                requests = (container.resources.requests if container.resources else None) or {}
                free -= Resources.from_kubernetes(requests)["cpu"]
        total += int(free // (POD_CPU * 1000))
    return total


async def test_allowed_kinds_changed_just_before_a_crash_reach_the_role_after_a_restart(
    run: Run,
) -> None:
    queue = f"crash-{RUN}"
    await create_queue(run, queue)
    status, answer = await run.call("POST", "/namespaces",
                                    {"queue": queue, "jobset": "j", "cluster": ALIAS})
    assert status == 201, answer
    name = answer["namespace"]["name"]
    store = run.lockgate.processes["queue-store"]
    await store.kill()
    # The change was committed, then queue-store died before touching any Role.
    await run.db.execute("UPDATE queues SET allowed_kinds = $2::text::jsonb WHERE name = $1",
                         queue, json.dumps(["pods", "secrets"]))
    await store.start()
    await store.wait_ready()
    rbac, core = client.RbacAuthorizationV1Api(run.admin_kube), client.CoreV1Api(run.admin_kube)

    async def converged() -> bool:
        role = await rbac.read_namespaced_role(access.COORDINATOR, name)
        namespace = await core.read_namespace(name)
        granted = {resource for rule in role.rules if "create" in rule.verbs
                   and "list" in rule.verbs for resource in rule.resources or []}
        return granted == {"pods", "secrets"} and (namespace.metadata.annotations or {}).get(
            access.ALLOWED_KINDS_ANNOTATION) == "pods,secrets"
    await eventually(converged, within=30, what=f"Role and annotation of {name} converged")
