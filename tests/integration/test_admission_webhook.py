"""The admission webhook on the real stack: registered in both clusters, queues as Queue objects.

The webhook runs as a real `python -m admission_webhook` process with no database settings at
all: it reads the Queue objects of its cluster. This module writes those objects itself, as
queue-store's sync would, under a source label and name prefix of its own (queue-store's side is
tested in test_queue_binding.py). The registration is a rendering of the static configuration
in k8s/base under a unique name that selects only namespaces carrying this module's instance
label, so it never intercepts other tests' pods; the fixture always removes it, since a
fail-closed webhook left registered with no server would refuse every pod it selects.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.launcher import STARTUP_SECONDS
from devstack.manifests import (
    WEBHOOK_CONFIGURATION,
    apply_webhook_configuration,
    delete_queue_copies,
    delete_webhook_configuration,
    ensure_queue_crd,
    load,
    render_webhook_configuration,
)
from devstack.ports import free_port
from devstack.stack import StackInfo
from helpers.kube import gates_of, worker_group_crd
from helpers.pods import PodBuilder, a_deployment, a_pod
from helpers.services import WebhookProcess, webhook_process
from helpers.waiting import eventually
from lockgate import queue_copies
from lockgate.labels import (
    ADMISSION_TRACE_ANNOTATION,
    JOBSET_LABEL,
    LABEL_SOURCE_ANNOTATION,
    MANAGED_NAMESPACE_LABEL,
    QUEUE_LABEL,
    SCHEDULING_GATE,
)
from lockgate.queues import QueueSpec

pytestmark = [pytest.mark.stack, pytest.mark.timeout(180)]

RUN = uuid.uuid4().hex[:8]
SOURCE = f"test-adm-{RUN}"
Kube = dict[str, client.ApiClient]
INSTANCE_LABEL = "lockgate-test.io/admission-webhook"
CLUSTERS = ("cluster-a", "cluster-b")
READY_WITHIN_SECONDS = STARTUP_SECONDS
# Every namespace of this module carries the instance label: queues are bound to them by it.
THIS_MODULES_NAMESPACES = {"cluster": "*", "selector": {"matchLabels": {INSTANCE_LABEL: RUN}}}


def unique(prefix: str) -> str:
    return f"{prefix}-{RUN}-{uuid.uuid4().hex[:6]}"


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
async def queue_crd(kube_clients: Kube) -> None:
    """The Queue CRD from k8s/base in both clusters (devstack applies k8s/base on `up` too)."""
    for cluster in CLUSTERS:
        await ensure_queue_crd(kube_clients[cluster])


class Queues:
    """Queue objects written in both clusters the way queue-store's sync writes them."""

    def __init__(self, apis: Kube, webhook: WebhookProcess | None = None) -> None:
        self._apis = apis
        self.webhook = webhook
        self.created: list[str] = []

    async def create(self, *, cordoned: bool = False,
                     namespaces: list[dict[str, Any]] | None = None) -> str:
        """A queue bound to this module's namespaces (unless told otherwise), once the webhook
        sees it in both clusters."""
        name = unique("lg-adm-q")
        await self.write(QueueSpec.model_validate({
            "name": name, "cordoned": cordoned,
            "namespaces": [THIS_MODULES_NAMESPACES] if namespaces is None else namespaces}))
        self.created.append(name)
        return name

    async def write(self, spec: QueueSpec) -> None:
        for api in self._apis.values():
            custom = client.CustomObjectsApi(api)
            obj = queue_copies.desired_object(spec, source=SOURCE, prefix=f"{RUN}-")
            name = obj["metadata"]["name"]
            try:
                await custom.create_cluster_custom_object(
                    queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL, obj)
            except ApiException as error:
                if error.status != 409:
                    raise
                current = await custom.get_cluster_custom_object(
                    queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL, name)
                obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                await custom.replace_cluster_custom_object(
                    queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL, name, obj)
        if self.webhook is not None:
            await self.webhook_sees(spec.name, cordoned=spec.cordoned)

    async def cordon(self, name: str) -> None:
        await self.write(QueueSpec.model_validate({
            "name": name, "cordoned": True, "namespaces": [THIS_MODULES_NAMESPACES]}))

    async def webhook_sees(self, name: str, *, cordoned: bool) -> None:
        assert self.webhook is not None
        webhook = self.webhook

        async def seen() -> bool:
            async with aiohttp.ClientSession() as session, session.get(
                    f"http://127.0.0.1:{webhook.process.health_port}/api/v1/queues") as reply:
                copies = await reply.json()
            return all((copies.get(c) or {}).get(name, {}).get("cordoned") == cordoned
                       for c in CLUSTERS)

        await eventually(seen, within=30, what=f"the webhook to see queue {name}")

    async def delete_all(self) -> None:
        for api in self._apis.values():
            await delete_queue_copies(api, source=SOURCE)


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
                              env={"LOCKGATE_WEBHOOK_LOG_LEVEL": "DEBUG",
                                   "LOCKGATE_WEBHOOK_QUEUE_SOURCE": SOURCE, **env})
    # No database, not even one inherited from the test's environment.
    webhook.process.env.pop("LOCKGATE_POSTGRES_DSN", None)
    await webhook.process.start()
    return webhook


async def register(kube_clients: Kube, webhook: WebhookProcess, *, name: str,
                   instance: str, clusters: tuple[str, ...] = CLUSTERS) -> None:
    """What the launcher does: this run's rendering of the static configuration."""
    for cluster in clusters:
        await apply_webhook_configuration(kube_clients[cluster], render_webhook_configuration(
            load(WEBHOOK_CONFIGURATION), name=name,
            url=f"https://127.0.0.1:{webhook.port}/mutate/{cluster}",
            ca_bundle_pem=(webhook.cert_dir / "ca.crt").read_bytes(),
            extra_namespace_labels={INSTANCE_LABEL: instance}))


@pytest.fixture(scope="module")
async def queues(kube_clients: Kube, queue_crd: None) -> AsyncIterator[Queues]:
    book = Queues({c: kube_clients[c] for c in CLUSTERS})
    try:
        yield book
    finally:
        await book.delete_all()


@pytest.fixture(scope="module")
async def webhook(
    stack: StackInfo, kube_clients: Kube, queues: Queues,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[WebhookProcess]:
    configuration = f"lockgate-test-{RUN}"
    running = await start_webhook(f"admission-webhook-{RUN}", {
        "LOCKGATE_WEBHOOK_CLUSTERS": as_webhook(stack, *CLUSTERS),
    }, tmp_path_factory.mktemp("admission-webhook"))
    try:
        await running.process.wait_ready(READY_WITHIN_SECONDS)
        await register(kube_clients, running, name=configuration, instance=RUN)
        queues.webhook = running
        yield running
    finally:
        queues.webhook = None
        await running.process.stop()
        # Always unregister, even if the start failed half-way.
        for cluster in CLUSTERS:
            await delete_webhook_configuration(kube_clients[cluster], configuration)


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


def webhook_log_messages(webhook: WebhookProcess, containing: str) -> list[str]:
    """The webhook's log lines (one JSON object each) whose message contains `containing`."""
    found = []
    for line in webhook.process.log_path.read_text(errors="replace").splitlines():
        try:
            message = str(json.loads(line).get("msg", ""))
        except ValueError:
            continue
        if containing in message:
            found.append(message)
    return found


async def owners_not_permitted(webhook: WebhookProcess, cluster: str, resource: str) -> float:
    """The webhook's metric of owners it was refused, for one cluster and resource."""
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{webhook.process.health_port}/metrics") as reply:
        text = await reply.text()
    wanted = (f'lockgate_admission_owners_not_permitted_total{{cluster="{cluster}",'
              f'resource="{resource}"}} ')
    return sum(float(line.removeprefix(wanted)) for line in text.splitlines()
               if line.startswith(wanted))


async def test_an_owner_kind_the_webhook_may_not_read_is_said_once_with_the_rule_to_add(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    """The Dask operator's case: worker pods owned by a custom resource (its DaskWorkerGroup)
    whose kind the webhook's ClusterRole does not cover. Every pod is gated with its namespace's
    queue and carries no 403; the webhook's log says once what to grant, and the metric counts
    each refusal. Granting exactly that makes the next pods inherit from the owner."""
    queue, owners_queue = await queues.create(), await queues.create()
    namespace = await namespaces("cluster-a", **{QUEUE_LABEL: queue})
    api = kube_clients["cluster-a"]
    group = f"t{RUN}.lockgate-test.io"
    async with worker_group_crd(api, group) as plural:
        resource = f"{plural}.{group}"
        owner = await client.CustomObjectsApi(api).create_namespaced_custom_object(
            group, "v1", namespace, plural, {
                "apiVersion": f"{group}/v1", "kind": "WorkerGroup",
                "metadata": {"name": "dc-default", "labels": {QUEUE_LABEL: owners_queue}},
                "spec": {"replicas": 3}})
        reference = {"apiVersion": f"{group}/v1", "kind": "WorkerGroup", "name": "dc-default",
                     "uid": owner["metadata"]["uid"], "controller": True}
        core = client.CoreV1Api(api)
        hint = "the admission webhook may not read WorkerGroup objects"

        for index in range(3):
            pod = await core.create_namespaced_pod(
                namespace, user_pod(f"dask-worker-{index}").owned_by(reference).manifest())
            assert gates_of(pod) == [SCHEDULING_GATE]
            assert pod.metadata.labels[QUEUE_LABEL] == queue
            assert sources_of(pod) == {"queue": f"namespace/{namespace}",
                                       "jobset": "default:namespace-name"}

        async def logged() -> list[str] | None:
            return webhook_log_messages(webhook, hint) or None

        said = await eventually(logged, within=10, what="the webhook's log saying what to grant")
        assert len(said) == 1, said
        assert said[0].startswith(f"cluster cluster-a: {hint} (system:serviceaccount:"
                                  "lockgate-system:lockgate-webhook cannot get "
                                  f'"{plural}" in API group "{group}")'), said[0]
        role = f"lockgate-webhook-read-{resource}"
        assert (f"kubectl create clusterrole {role} --verb=get --resource={resource}; "
                f"kubectl create clusterrolebinding {role} --clusterrole={role} "
                "--serviceaccount=lockgate-system:lockgate-webhook ") in said[0], said[0]
        assert await owners_not_permitted(webhook, "cluster-a", resource) == 3

        # What the hint says to run, through the API.
        rbac = client.RbacAuthorizationV1Api(api)
        await rbac.create_cluster_role({"metadata": {"name": role}, "rules": [
            {"apiGroups": [group], "resources": [plural], "verbs": ["get"]}]})
        try:
            await rbac.create_cluster_role_binding({
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "lockgate-webhook",
                              "namespace": "lockgate-system"}]})
            created = iter(range(100))

            async def inherits_from_the_owner() -> client.V1Pod | None:
                pod = await core.create_namespaced_pod(namespace, user_pod(
                    f"dask-worker-granted-{next(created)}").owned_by(reference).manifest())
                return pod if pod.metadata.labels[QUEUE_LABEL] == owners_queue else None

            pod = await eventually(inherits_from_the_owner, within=30, every=0.5,
                                   what="a pod inheriting its queue from its WorkerGroup")
            assert sources_of(pod) == {"queue": "WorkerGroup/dc-default",
                                       "jobset": "default:namespace-name"}
        finally:
            await rbac.delete_cluster_role(role)
            with contextlib.suppress(ApiException):
                await rbac.delete_cluster_role_binding(role)


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
    assert f'queue "{missing}" does not exist. An operator creates it for this namespace ' \
           f"with 'lockgate queue create {missing} --namespace " in message
    assert f"; or name a queue namespace {namespace} may use: " in message
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


async def test_cordon_applies_as_soon_as_the_queue_object_changes(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    queue = await queues.create()
    namespace = await namespaces("cluster-a")
    core = client.CoreV1Api(kube_clients["cluster-a"])
    await core.create_namespaced_pod(namespace, user_pod("before").in_queue(queue).manifest())

    await queues.cordon(queue)  # returns once the webhook's watch delivered it

    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(namespace, user_pod("after").in_queue(queue).manifest())
    assert f'queue "{queue}" is cordoned' in rejection_message(refused.value)


@pytest.mark.parametrize("cluster", CLUSTERS)
async def test_a_queue_the_namespace_may_not_use_is_refused_with_the_queues_it_may_use(
    cluster: str, webhook: WebhookProcess, kube_clients: Kube, queues: Queues,
    namespaces: Factory,
) -> None:
    """Team A cannot run under team B's queue, whether the pod or an owner names it."""
    ours = await queues.create()
    theirs = await queues.create(namespaces=[{"cluster": "*", "names": ["team-b-only"]}])
    namespace = await namespaces(cluster)
    core = client.CoreV1Api(kube_clients[cluster])
    job = await client.BatchV1Api(kube_clients[cluster]).create_namespaced_job(namespace, {
        "metadata": {"name": "etl", "labels": {QUEUE_LABEL: theirs}},
        "spec": {"suspend": True, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}})
    by_job = {"apiVersion": "batch/v1", "kind": "Job", "name": "etl",
              "uid": job.metadata.uid, "controller": True}

    for pod, source in ((user_pod("on-pod").in_queue(theirs), "the pod"),
                        (user_pod("by-owner").owned_by(by_job), "Job/etl")):
        with pytest.raises(ApiException) as refused:
            await core.create_namespaced_pod(namespace, pod.manifest())
        assert refused.value.status == 403
        message = rejection_message(refused.value)
        assert f'namespace {namespace} may not use queue "{theirs}"' in message
        suggested = message.split(f"namespace {namespace} may use: ")[1]
        # Every queue this module created is bound to its namespaces; at most 10 are listed.
        assert ours in suggested or "more)" in suggested
        assert theirs not in suggested.split(", or ask")[0]
        assert f"({QUEUE_LABEL} from {source})" in message
    assert not (await core.list_namespaced_pod(namespace)).items


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


async def test_a_pod_bound_at_creation_may_name_only_a_queue_open_to_its_namespace(
    webhook: WebhookProcess, kube_clients: Kube, queues: Queues, namespaces: Factory,
) -> None:
    """A pod with spec.nodeName cannot be gated, but it would count as a job of the queue its
    label names: the webhook refuses a queue of other namespaces and lets its own through
    unchanged, for the admission policy to refuse (only mirror pods may name their node)."""
    ours = await queues.create()
    theirs = await queues.create(namespaces=[{"cluster": "*", "names": ["team-b-only"]}])
    namespace = await namespaces("cluster-b")
    core = client.CoreV1Api(kube_clients["cluster-b"])

    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(
            namespace, user_pod("bound-jumper").in_queue(theirs).on_node("n-x").manifest())
    assert f'namespace {namespace} may not use queue "{theirs}"' in rejection_message(
        refused.value)

    # Its own queue: the webhook lets it through unchanged (a gate beside nodeName is invalid)...
    manifest = user_pod("bound-own").in_queue(ours).on_node("n-x").manifest()
    answer = (await webhook.post_review("cluster-b", review_for(namespace, manifest)))["response"]
    assert answer["allowed"] is True and "patch" not in answer, answer
    # ...and the apiserver's own policy refuses it: only a node's mirror pods may be bound at
    # creation in a managed namespace (k8s/base/policy-no-node-name.yaml).
    with pytest.raises(ApiException) as bound:
        await core.create_namespaced_pod(namespace, manifest)
    assert bound.value.status == 403
    assert "lockgate-no-node-name" in rejection_message(bound.value)


async def test_the_webhook_needs_no_database_and_is_ready_once_it_has_the_queues(
    stack: StackInfo, kube_clients: Kube, queues: Queues, namespaces: Factory, tmp_path: Path,
) -> None:
    """Started with an unreachable Postgres in its environment (nothing shared is stopped), the
    webhook never dials it: it is ready and gates pods from its cluster's Queue objects."""
    queue = await queues.create()
    namespace = await namespaces("cluster-a")
    unreachable = f"postgresql://lockgate:lockgate@127.0.0.1:{free_port()}/lockgate"
    alone = await start_webhook(f"admission-webhook-no-db-{RUN}", {
        "LOCKGATE_WEBHOOK_CLUSTERS": as_webhook(stack, "cluster-a"),
    }, tmp_path)
    alone.process.env["LOCKGATE_POSTGRES_DSN"] = unreachable  # for a restart below
    try:
        await alone.process.wait_ready(READY_WITHIN_SECONDS)
        status, body = await alone.readiness()
        assert status == 200 and body["checks"]["queues/cluster-a"]["ready"] is True
        review = review_for(namespace, user_pod("no-db").in_queue(queue).manifest())
        answer = (await alone.post_review("cluster-a", review))["response"]
        assert answer["allowed"] is True and answer["patchType"] == "JSONPatch", answer
        await alone.process.stop()

        # Even told of a database it cannot reach, it answers the same (it never asks it).
        await alone.process.start()
        await alone.process.wait_ready(READY_WITHIN_SECONDS)
        answer = (await alone.post_review("cluster-a", review))["response"]
        assert answer["allowed"] is True and answer["patchType"] == "JSONPatch", answer
    finally:
        await alone.process.stop()


async def test_deleting_the_configuration_switches_the_webhook_off(
    stack: StackInfo, kube_clients: Kube, queues: Queues, make_namespace: Factory,
    tmp_path: Path,
) -> None:
    """The webhook does not register itself, so removing its configuration is the off-switch:
    with the webhook still running, new pods are no longer sent to it."""
    instance = f"off-{RUN}"
    configuration = f"lockgate-test-{instance}"
    queue = await queues.create(namespaces=[{"cluster": "*", "selector": {
        "matchLabels": {INSTANCE_LABEL: instance}}}])
    namespace = await make_namespace("cluster-a", prefix="lg-adm", labels={
        MANAGED_NAMESPACE_LABEL: "true", INSTANCE_LABEL: instance})
    core = client.CoreV1Api(kube_clients["cluster-a"])
    running = await start_webhook(f"admission-webhook-{instance}", {
        "LOCKGATE_WEBHOOK_CLUSTERS": as_webhook(stack, "cluster-a"),
    }, tmp_path)
    try:
        await running.process.wait_ready(READY_WITHIN_SECONDS)
        await register(kube_clients, running, name=configuration, instance=instance,
                       clusters=("cluster-a",))
        gated = await core.create_namespaced_pod(
            namespace, user_pod("while-on").in_queue(queue).manifest())
        assert gated_of(gated)

        assert await delete_webhook_configuration(kube_clients["cluster-a"], configuration)
        # The apiserver learns of the deletion from its own watch, a moment later (a pod made
        # at once on a busy machine still went to the webhook): new pods go ungated from then.
        made: list[str] = []

        async def created_ungated() -> bool:
            name = f"switched-off-{len(made)}"
            made.append(name)
            free = await core.create_namespaced_pod(
                namespace, user_pod(name).in_queue(queue).manifest())
            return gates_of(free) == []

        await eventually(created_ungated, within=30, every=0.5,
                         what="a pod created after the deletion to be left ungated")
        assert running.process.alive()
        with pytest.raises(ApiException) as absent:
            await client.AdmissionregistrationV1Api(
                kube_clients["cluster-a"]).read_mutating_webhook_configuration(configuration)
        assert absent.value.status == 404
    finally:
        await running.process.stop()
        await delete_webhook_configuration(kube_clients["cluster-a"], configuration)


def gated_of(pod: client.V1Pod) -> bool:
    return gates_of(pod) == [SCHEDULING_GATE]


async def test_registration_is_created_then_updated_then_removed(
    kube_clients: Kube,
) -> None:
    api = kube_clients["cluster-a"]
    name = unique("lockgate-test-registration")
    # Selects no namespace (no namespace carries this label), so it can never block a pod.
    manifest = render_webhook_configuration(
        load(WEBHOOK_CONFIGURATION), name=name, url="https://127.0.0.1:9/mutate/cluster-a",
        ca_bundle_pem=b"ca-1", extra_namespace_labels={INSTANCE_LABEL: f"nobody-{RUN}"})
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
    queue = await queues.create(namespaces=[{"cluster": "*", "selector": {
        "matchLabels": {INSTANCE_LABEL: instance}}}])
    namespace = await make_namespace("cluster-b", prefix="lg-adm", labels={
        MANAGED_NAMESPACE_LABEL: "true", INSTANCE_LABEL: instance})
    env = {
        "LOCKGATE_WEBHOOK_CLUSTERS": as_webhook(stack, "cluster-b"),
    }
    core = client.CoreV1Api(kube_clients["cluster-b"])
    first = await start_webhook(f"admission-webhook-{instance}", env, tmp_path)
    second: WebhookProcess | None = None
    try:
        await first.process.wait_ready(READY_WITHIN_SECONDS)
        await register(kube_clients, first, name=configuration, instance=instance,
                       clusters=("cluster-b",))
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
