"""The admission webhook on the real stack: registered in both clusters, queues in Postgres.

The webhook runs as a real `python -m admission_webhook` process. It registers under a unique
configuration name and only for namespaces carrying this module's instance label, so it never
intercepts other tests' pods; queues get unique names in the stack's database and are
tombstoned afterwards. The fixture always removes the registration: a fail-closed webhook left
registered with no server would refuse every pod in the namespaces it selects.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from admission_webhook.registration import (
    apply_webhook_configuration,
    delete_webhook_configuration,
)
from devstack.launcher import free_port
from devstack.stack import StackInfo
from helpers.kube import PodBuilder, a_deployment, a_pod, gates_of
from helpers.postgres import fresh_database
from helpers.services import WebhookProcess, webhook_process
from helpers.waiting import eventually
from lockgate.admission import webhook_configuration
from lockgate.labels import (
    ADMISSION_TRACE_ANNOTATION,
    JOBSET_LABEL,
    LABEL_SOURCE_ANNOTATION,
    MANAGED_NAMESPACE_LABEL,
    QUEUE_LABEL,
    SCHEDULING_GATE,
)
from lockgate_adapters.postgres import hold_change_feed_lock, migrate, notify_changes

pytestmark = [pytest.mark.stack, pytest.mark.timeout(180)]

RUN = uuid.uuid4().hex[:8]
Kube = dict[str, client.ApiClient]
INSTANCE_LABEL = "lockgate-test.io/admission-webhook"
CLUSTERS = ("cluster-a", "cluster-b")
READY_WITHIN_SECONDS = 60.0
CACHE_TTL_SECONDS = 120.0


def unique(prefix: str) -> str:
    return f"{prefix}-{RUN}-{uuid.uuid4().hex[:6]}"


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
async def pg(pg_pool: asyncpg.Pool) -> asyncpg.Pool:
    await migrate(pg_pool)
    return pg_pool


class Queues:
    """Queue rows written the way lockgate's writers do: serial bumped, change notified."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self.created: list[str] = []

    async def create(self, *, cordoned: bool = False) -> str:
        name = unique("lg-adm-q")
        await self._write(
            "INSERT INTO queues (name, cordoned) VALUES ($1, $2)", name, cordoned)
        self.created.append(name)
        return name

    async def cordon(self, name: str) -> None:
        await self._write(
            "UPDATE queues SET cordoned = true, updated_at = now(),"
            " serial = nextval('change_serial') WHERE name = $1", name)

    async def tombstone_all(self) -> None:
        for name in self.created:
            await self._write(
                "UPDATE queues SET deleted = true, updated_at = now(),"
                " serial = nextval('change_serial') WHERE name = $1", name)

    async def _write(self, sql: str, *args: object) -> None:
        async with self._pool.acquire() as connection, connection.transaction():
            await hold_change_feed_lock(connection)
            await connection.execute(sql, *args)
            await notify_changes(connection, "queues")


@pytest.fixture(scope="module")
async def queues(pg: asyncpg.Pool) -> AsyncIterator[Queues]:
    book = Queues(pg)
    yield book
    await book.tombstone_all()


def as_webhook(stack: StackInfo, *clusters: str) -> str:
    """LOCKGATE_WEBHOOK_CLUSTERS with the webhook's own ServiceAccount (k8s/base), not admin."""
    own = stack.kubeconfigs_of("webhook")
    return json.dumps({cluster: own[cluster] for cluster in clusters})


async def let_the_webhook_read(api: client.ApiClient, namespace: str, resource: str) -> None:
    """What an operator does for an owner kind of its own: a `get` rule for the webhook's
    ServiceAccount (here only in `namespace`); returns once the authorizer applies it."""
    rbac = client.RbacAuthorizationV1Api(api)
    name = f"lockgate-webhook-reads-{resource}"
    await rbac.create_namespaced_role(namespace, {
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": [resource], "verbs": ["get"]}]})
    await rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "lockgate-webhook",
                      "namespace": "lockgate-system"}]})
    review = {"spec": {"user": "system:serviceaccount:lockgate-system:lockgate-webhook",
                       "groups": ["system:serviceaccounts",
                                  "system:serviceaccounts:lockgate-system"],
                       "resourceAttributes": {"namespace": namespace, "verb": "get",
                                              "resource": resource}}}
    authorization = client.AuthorizationV1Api(api)

    async def allowed() -> bool | None:
        answer = await authorization.create_subject_access_review(review)
        return True if answer.status.allowed else None

    await eventually(allowed, within=10, every=0.1,
                     what=f"the webhook to be allowed to get {resource}")


async def start_webhook(name: str, env: dict[str, str], directory: Path, *,
                        port: int | None = None) -> WebhookProcess:
    """A webhook process started (not yet ready), its certificates under `directory`."""
    webhook = webhook_process(name, cert_dir=directory / "certs", port=port,
                              env={"LOCKGATE_WEBHOOK_LOG_LEVEL": "DEBUG", **env})
    await webhook.process.start()
    return webhook


@pytest.fixture(scope="module")
async def webhook(
    stack: StackInfo, kube_clients: Kube, queues: Queues,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[WebhookProcess]:
    configuration = f"lockgate-test-{RUN}"
    running = await start_webhook(f"admission-webhook-{RUN}", {
        "LOCKGATE_WEBHOOK_CLUSTERS": as_webhook(stack, *CLUSTERS),
        "LOCKGATE_WEBHOOK_POSTGRES_DSN": stack.postgres_dsn,
        "LOCKGATE_WEBHOOK_CONFIGURATION_NAME": configuration,
        "LOCKGATE_WEBHOOK_EXTRA_NAMESPACE_LABELS": json.dumps({INSTANCE_LABEL: RUN}),
        # Long enough that only LISTEN/NOTIFY can explain a cordon seen within seconds.
        "LOCKGATE_WEBHOOK_QUEUE_CACHE_TTL_SECONDS": str(CACHE_TTL_SECONDS),
    }, tmp_path_factory.mktemp("admission-webhook"))
    try:
        await running.process.wait_ready(READY_WITHIN_SECONDS)
        yield running
    finally:
        await running.process.stop()
        # Always unregister, even if the start failed half-way.
        for api in kube_clients.values():
            await delete_webhook_configuration(api, configuration)


Factory = Callable[..., Awaitable[str]]


@pytest.fixture
def namespaces(make_namespace: Callable[..., Awaitable[str]]) -> Factory:
    """`await namespaces(cluster, managed=True, **labels)`: a namespace this webhook serves."""

    async def make(cluster: str, *, managed: bool = True, **labels: str) -> str:
        all_labels = {INSTANCE_LABEL: RUN, **labels}
        if managed:
            all_labels[MANAGED_NAMESPACE_LABEL] = "true"
        return await make_namespace(cluster, prefix="lg-adm", labels=all_labels)

    return make


# ----------------------------------------------------------------------------------- helpers


def user_pod(name: str) -> PodBuilder:
    """A pod as a user writes it: no gate, lockgate labels only where the test says."""
    return a_pod(name).requesting(cpu="100m")


def review_for(namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """A pod CREATE review as an apiserver sends it, for tests that call the webhook directly."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "operation": "CREATE", "namespace": namespace,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "object": pod}}


def sources_of(pod: client.V1Pod) -> dict[str, Any]:
    annotation: str = (pod.metadata.annotations or {})[LABEL_SOURCE_ANNOTATION]
    loaded: dict[str, Any] = json.loads(annotation)
    return loaded


def rejection_message(error: ApiException) -> str:
    message: str = json.loads(error.body)["message"]
    return message


async def pods_of(api: client.ApiClient, namespace: str, count: int) -> list[client.V1Pod]:
    """The namespace's pods once there are `count` of them (controllers create them)."""
    core = client.CoreV1Api(api)

    async def enough() -> list[client.V1Pod] | None:
        found = (await core.list_namespaced_pod(namespace)).items
        return list(found) if len(found) >= count else None

    return await eventually(enough, within=30, every=0.25,
                            what=f"{count} pods in {namespace}")


# ------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("cluster", CLUSTERS)
async def test_pod_in_managed_namespace_is_gated_and_labelled(
    cluster: str, webhook: WebhookProcess, kube_clients: Kube, queues: Queues,
    namespaces: Factory,
) -> None:
    queue = await queues.create()
    namespace = await namespaces(cluster)
    core = client.CoreV1Api(kube_clients[cluster])

    pod = await core.create_namespaced_pod(
        namespace, user_pod("worker").in_queue(queue).labelled(app="demo").manifest())

    assert gates_of(pod) == [SCHEDULING_GATE]
    assert pod.metadata.labels == {QUEUE_LABEL: queue, JOBSET_LABEL: namespace, "app": "demo"}
    assert sources_of(pod) == {"queue": "pod", "jobset": "default:namespace-name"}
    scheduled = next(c for c in pod.status.conditions or [] if c.type == "PodScheduled")
    assert (scheduled.status, scheduled.reason) == ("False", "SchedulingGated")
    # The review's span, for the pod's trace to link back to (W3C traceparent).
    version, trace_id, span_id, flags = pod.metadata.annotations[
        ADMISSION_TRACE_ANNOTATION].split("-")
    assert (version, len(trace_id), len(span_id)) == ("00", 32, 16)
    assert int(trace_id, 16) and int(span_id, 16) and int(flags, 16) & 1  # sampled


async def test_pod_keeps_other_gates(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    queue = await queues.create()
    namespace = await namespaces("cluster-b")
    manifest = (user_pod("two-gates").in_queue(queue)
                .gated("example.com/other", SCHEDULING_GATE).manifest())

    pod = await client.CoreV1Api(kube_clients["cluster-b"]).create_namespaced_pod(
        namespace, manifest)

    assert gates_of(pod) == ["example.com/other", SCHEDULING_GATE]


async def test_deployment_pods_inherit_from_the_deployment_through_its_replicaset(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    queue = await queues.create()
    namespace = await namespaces("cluster-a")
    await client.AppsV1Api(kube_clients["cluster-a"]).create_namespaced_deployment(
        namespace, a_deployment("web").labelled({QUEUE_LABEL: queue, JOBSET_LABEL: "web-js"})
        .with_replicas(2).of(user_pod("web")).manifest())

    pods = await pods_of(kube_clients["cluster-a"], namespace, 2)

    for pod in pods:
        assert gates_of(pod) == [SCHEDULING_GATE]
        assert (pod.metadata.labels[QUEUE_LABEL], pod.metadata.labels[JOBSET_LABEL]) == (
            queue, "web-js")
        assert sources_of(pod) == {"queue": "Deployment/web", "jobset": "Deployment/web"}
        assert pod.metadata.owner_references[0].kind == "ReplicaSet"


async def test_pod_inherits_from_any_owner_kind(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    """An owner kind lockgate has no special case for is found through API discovery."""
    queue = await queues.create()
    namespace = await namespaces("cluster-b")
    core = client.CoreV1Api(kube_clients["cluster-b"])
    await let_the_webhook_read(kube_clients["cluster-b"], namespace, "configmaps")
    owner = await core.create_namespaced_config_map(namespace, {
        "metadata": {"name": "operator-state", "labels": {QUEUE_LABEL: queue}}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "operator-state",
                 "uid": owner.metadata.uid, "controller": True}

    pod = await core.create_namespaced_pod(
        namespace, user_pod("managed-by-operator").owned_by(reference).manifest())

    assert gates_of(pod) == [SCHEDULING_GATE]
    assert pod.metadata.labels[QUEUE_LABEL] == queue
    assert sources_of(pod)["queue"] == "ConfigMap/operator-state"


async def test_unreadable_owner_falls_back_to_the_namespace_and_says_so(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    queue = await queues.create()
    namespace = await namespaces("cluster-a", **{QUEUE_LABEL: queue})
    ghost = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "ghost",
             "uid": str(uuid.uuid4()), "controller": True}

    pod = await client.CoreV1Api(kube_clients["cluster-a"]).create_namespaced_pod(
        namespace, user_pod("orphan").owned_by(ghost).manifest())

    assert gates_of(pod) == [SCHEDULING_GATE]
    assert pod.metadata.labels[QUEUE_LABEL] == queue
    sources = sources_of(pod)
    assert sources["queue"] == f"namespace/{namespace}"
    assert sources["unreadable"] == ["ReplicaSet/ghost: 404 Not Found"]


async def test_pod_inherits_from_namespace_labels(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    queue = await queues.create()
    namespace = await namespaces("cluster-b", **{QUEUE_LABEL: queue, JOBSET_LABEL: "team-js"})

    pod = await client.CoreV1Api(kube_clients["cluster-b"]).create_namespaced_pod(
        namespace, user_pod("plain").manifest())

    assert gates_of(pod) == [SCHEDULING_GATE]
    assert (pod.metadata.labels[QUEUE_LABEL], pod.metadata.labels[JOBSET_LABEL]) == (
        queue, "team-js")
    assert sources_of(pod) == {"queue": f"namespace/{namespace}",
                               "jobset": f"namespace/{namespace}"}


async def test_pod_labels_win_over_owner_and_namespace(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    namespace_queue, owner_queue, pod_queue = [await queues.create() for _ in range(3)]
    namespace = await namespaces("cluster-a", **{QUEUE_LABEL: namespace_queue,
                                                 JOBSET_LABEL: "ns-js"})
    await client.AppsV1Api(kube_clients["cluster-a"]).create_namespaced_deployment(
        namespace, a_deployment("mixed").labelled({QUEUE_LABEL: owner_queue,
                                                   JOBSET_LABEL: "deploy-js"})
        .of(user_pod("mixed").in_queue(pod_queue)).manifest())

    (pod,) = await pods_of(kube_clients["cluster-a"], namespace, 1)

    assert (pod.metadata.labels[QUEUE_LABEL], pod.metadata.labels[JOBSET_LABEL]) == (
        pod_queue, "deploy-js")
    assert sources_of(pod) == {"queue": "pod", "jobset": "Deployment/mixed"}


@pytest.mark.parametrize("cluster", CLUSTERS)
async def test_unknown_queue_is_rejected_with_what_to_do(
    cluster: str, webhook: WebhookProcess, kube_clients: Kube, queues: Queues,
    namespaces: Factory,
) -> None:
    await queues.create()  # at least one queue to suggest
    namespace = await namespaces(cluster)
    missing = unique("lg-adm-missing")

    with pytest.raises(ApiException) as rejected:
        await client.CoreV1Api(kube_clients[cluster]).create_namespaced_pod(
            namespace, user_pod("lost").in_queue(missing).manifest())

    assert rejected.value.status == 403
    message = rejection_message(rejected.value)
    assert f'queue "{missing}" does not exist; create it with ' \
           f"'lockgate queue create {missing}' or use one of: " in message
    assert queues.created[-1] in message or "more)" in message


async def test_pod_without_any_queue_is_rejected_with_where_to_set_it(
    webhook: WebhookProcess, kube_clients: Kube, namespaces: Factory,
) -> None:
    namespace = await namespaces("cluster-a")

    with pytest.raises(ApiException) as rejected:
        await client.CoreV1Api(kube_clients["cluster-a"]).create_namespaced_pod(
            namespace, user_pod("nowhere").manifest())

    assert rejected.value.status == 403
    assert (f"pod {namespace}/nowhere has no queue: set label {QUEUE_LABEL} on the pod or "
            f"namespace {namespace}") in rejection_message(rejected.value)


async def test_cordoned_queue_is_rejected(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    queue = await queues.create(cordoned=True)
    namespace = await namespaces("cluster-b")

    with pytest.raises(ApiException) as rejected:
        await client.CoreV1Api(kube_clients["cluster-b"]).create_namespaced_pod(
            namespace, user_pod("frozen").in_queue(queue).manifest())

    assert rejected.value.status == 403
    assert f'queue "{queue}" is cordoned and accepts no new pods' in rejection_message(
        rejected.value)


async def test_cordon_applies_within_moments_through_the_change_notification(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    queue = await queues.create()
    namespace = await namespaces("cluster-a")
    core = client.CoreV1Api(kube_clients["cluster-a"])
    await core.create_namespaced_pod(namespace, user_pod("before").in_queue(queue).manifest())

    await queues.cordon(queue)
    started = asyncio.get_running_loop().time()
    for attempt in range(40):
        try:
            await core.create_namespaced_pod(
                namespace, user_pod(f"after-{attempt}").in_queue(queue).manifest())
        except ApiException as error:
            assert f'queue "{queue}" is cordoned' in rejection_message(error)
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("pods were still admitted to the cordoned queue")
    assert asyncio.get_running_loop().time() - started < CACHE_TTL_SECONDS / 10


async def test_unmanaged_namespace_is_untouched(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    queue = await queues.create()
    namespace = await namespaces("cluster-a", managed=False)

    pod = await client.CoreV1Api(kube_clients["cluster-a"]).create_namespaced_pod(
        namespace, user_pod("free").in_queue(queue).manifest())

    assert gates_of(pod) == []
    assert JOBSET_LABEL not in pod.metadata.labels
    assert LABEL_SOURCE_ANNOTATION not in (pod.metadata.annotations or {})


async def test_kube_system_pods_are_untouched(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues,
) -> None:
    queue = await queues.create()
    core = client.CoreV1Api(kube_clients["cluster-b"])
    name = unique("lg-adm-sys")
    pod = await core.create_namespaced_pod(
        "kube-system", user_pod(name).in_queue(queue).manifest())
    try:
        assert gates_of(pod) == []
        assert LABEL_SOURCE_ANNOTATION not in (pod.metadata.annotations or {})
        # Even a review that reaches the webhook for kube-system is answered unchanged.
        review = review_for("kube-system", user_pod(name).in_queue(queue).manifest())
        answer = (await webhook.post_review("cluster-b", review))["response"]
        assert answer == {"uid": review["request"]["uid"], "allowed": True}
    finally:
        await core.delete_namespaced_pod(name, "kube-system", grace_period_seconds=0)


async def test_non_pod_objects_are_created_immediately(
    webhook: WebhookProcess, kube_clients: Kube, namespaces: Factory,
) -> None:
    namespace = await namespaces("cluster-a")

    created = await client.CoreV1Api(kube_clients["cluster-a"]).create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"k": "v"}})

    assert created.data == {"k": "v"}
    assert not created.metadata.labels


async def test_webhook_refuses_and_is_not_ready_when_postgres_is_unreachable(
    stack: StackInfo, kube_clients: Kube, namespaces: Factory,
    tmp_path: Path,
) -> None:
    """Fail-closed: a queue that cannot be checked refuses the pod and asks to retry."""
    namespace = await namespaces("cluster-a")
    unreachable = f"postgresql://lockgate:lockgate@127.0.0.1:{free_port()}/lockgate"
    blind = await start_webhook(f"admission-webhook-blind-{RUN}", {
        "LOCKGATE_WEBHOOK_CLUSTERS": as_webhook(stack, "cluster-a"),
        "LOCKGATE_WEBHOOK_POSTGRES_DSN": unreachable,
        "LOCKGATE_WEBHOOK_REGISTER_IN_CLUSTERS": "false",
        "LOCKGATE_WEBHOOK_QUEUE_CHECK_TIMEOUT_SECONDS": "0.5",
    }, tmp_path)
    try:
        review = review_for(namespace, user_pod("blind").in_queue("any-queue").manifest())
        answer: dict[str, Any] = {}
        for _ in range(100):  # until its certificates are written and its HTTPS server is up
            try:
                answer = (await blind.post_review("cluster-a", review))["response"]
                break
            except (aiohttp.ClientConnectionError, FileNotFoundError):
                assert blind.process.alive(), blind.process.log_tail()
                await asyncio.sleep(0.2)

        assert answer["allowed"] is False, answer
        assert answer["status"]["code"] == 503
        assert 'lockgate cannot verify queue "any-queue" right now, retry' in (
            answer["status"]["message"])
        status, body = await blind.readiness()
        assert status == 503
        assert body["checks"]["queues"]["ready"] is False
    finally:
        await blind.process.stop()


async def test_registration_is_created_then_updated_then_removed(
    kube_clients: Kube,
) -> None:
    api = kube_clients["cluster-a"]
    name = unique("lockgate-test-registration")
    # Selects no namespace (no namespace carries this label), so it can never block a pod.
    manifest = webhook_configuration(
        name=name, url="https://127.0.0.1:9/mutate/cluster-a", ca_bundle_pem=b"ca-1",
        extra_namespace_labels={INSTANCE_LABEL: f"nobody-{RUN}"})
    try:
        assert await apply_webhook_configuration(api, manifest) == "created"
        manifest["webhooks"][0]["clientConfig"]["url"] = "https://127.0.0.1:10/mutate/cluster-a"
        assert await apply_webhook_configuration(api, manifest) == "updated"
        stored = await client.AdmissionregistrationV1Api(
            api).read_mutating_webhook_configuration(name)
        (hook,) = stored.webhooks
        assert hook.client_config.url == "https://127.0.0.1:10/mutate/cluster-a"
        assert (hook.failure_policy, hook.side_effects, hook.timeout_seconds) == (
            "Fail", "None", 5)
    finally:
        assert await delete_webhook_configuration(api, name) is True
    assert await delete_webhook_configuration(api, name) is False


async def test_pods_are_refused_while_the_webhook_is_down_and_gated_after_restart(
    stack: StackInfo, kube_clients: Kube, queues: Queues, make_namespace: Factory,
    tmp_path: Path,
) -> None:
    """Fail-closed: with the webhook registered but not running, no pod escapes ungated."""
    instance = f"restart-{RUN}"
    configuration = f"lockgate-test-{instance}"
    queue = await queues.create()
    namespace = await make_namespace("cluster-b", prefix="lg-adm", labels={
        MANAGED_NAMESPACE_LABEL: "true", INSTANCE_LABEL: instance})
    env = {
        "LOCKGATE_WEBHOOK_CLUSTERS": as_webhook(stack, "cluster-b"),
        "LOCKGATE_WEBHOOK_POSTGRES_DSN": stack.postgres_dsn,
        "LOCKGATE_WEBHOOK_CONFIGURATION_NAME": configuration,
        "LOCKGATE_WEBHOOK_EXTRA_NAMESPACE_LABELS": json.dumps({INSTANCE_LABEL: instance}),
    }
    core = client.CoreV1Api(kube_clients["cluster-b"])
    first = await start_webhook(f"admission-webhook-{instance}", env, tmp_path)
    second: WebhookProcess | None = None
    try:
        await first.process.wait_ready(READY_WITHIN_SECONDS)
        ca_before = (first.cert_dir / "ca.crt").read_bytes()
        await first.process.kill()

        with pytest.raises(ApiException) as refused:
            await core.create_namespaced_pod(
                namespace, user_pod("while-down").in_queue(queue).manifest())
        assert refused.value.status == 500
        assert "failed calling webhook" in rejection_message(refused.value)
        assert not (await core.list_namespaced_pod(namespace)).items

        # Same port and certificate directory, as a restarted service would have.
        second = await start_webhook(f"admission-webhook-{instance}", env, tmp_path,
                                     port=first.port)
        await second.process.wait_ready(READY_WITHIN_SECONDS)
        pod = await core.create_namespaced_pod(
            namespace, user_pod("after-restart").in_queue(queue).manifest())
        assert gates_of(pod) == [SCHEDULING_GATE]
        assert (second.cert_dir / "ca.crt").read_bytes() == ca_before
    finally:
        for running in (first, second):
            if running is not None:
                await running.process.stop()
        await delete_webhook_configuration(kube_clients["cluster-b"], configuration)


@pytest.fixture
async def own_database(pg_dsn: str) -> AsyncIterator[str]:
    """A fresh, migrated database: this test locks its tables, which must block no one else."""
    async with fresh_database(pg_dsn, prefix=f"lg_adm_{RUN}", migrated=True) as dsn:
        yield dsn


async def test_review_is_answered_in_time_when_postgres_is_slow_and_recovers(
    stack: StackInfo, own_database: str, namespaces: Factory, tmp_path: Path,
) -> None:
    namespace = await namespaces("cluster-a")
    check_timeout = 0.5
    webhook = await start_webhook(f"admission-webhook-slow-{RUN}", {
        "LOCKGATE_WEBHOOK_CLUSTERS": as_webhook(stack, "cluster-a"),
        "LOCKGATE_WEBHOOK_POSTGRES_DSN": own_database,
        "LOCKGATE_WEBHOOK_REGISTER_IN_CLUSTERS": "false",
        "LOCKGATE_WEBHOOK_QUEUE_CHECK_TIMEOUT_SECONDS": str(check_timeout),
        "LOCKGATE_WEBHOOK_QUEUE_CACHE_TTL_SECONDS": "1",
    }, tmp_path)
    blocker = await asyncpg.connect(own_database)
    try:
        await webhook.process.wait_ready(READY_WITHIN_SECONDS)
        review = review_for(namespace, user_pod("slow").in_queue("not-cached").manifest())

        # Readers of `queues` now wait for this transaction: Postgres is "slow".
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute("LOCK TABLE queues IN ACCESS EXCLUSIVE MODE")
        started = asyncio.get_running_loop().time()
        answer = (await webhook.post_review("cluster-a", review))["response"]
        elapsed = asyncio.get_running_loop().time() - started

        assert answer["allowed"] is False
        assert answer["status"]["code"] == 503
        assert 'lockgate cannot verify queue "not-cached" right now, retry' in (
            answer["status"]["message"])
        assert elapsed < check_timeout + 1.0  # far inside the apiserver's 5 s
        status, body = await webhook.readiness()
        assert (status, body["checks"]["queues"]["ready"]) == (503, False)

        await transaction.rollback()
        await webhook.process.wait_ready(READY_WITHIN_SECONDS)
        answer = (await webhook.post_review("cluster-a", review))["response"]
        assert answer["status"]["code"] == 403
        assert 'queue "not-cached" does not exist' in answer["status"]["message"]
    finally:
        await blocker.close()
        await webhook.process.stop()
