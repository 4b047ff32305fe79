"""Nobody jumps the queue: an ordinary user's attempts to bypass lockgate, against the real
apiserver with k8s/base applied (issue 8).

Every attempt is made with a REAL non-admin identity: a ServiceAccount bound to the built-in
`edit` ClusterRole in the test's namespace (what a team member typically holds), authenticated
with its own token. The pods are made as lockgate's webhook leaves them (gated, labelled); no
webhook serves these namespaces, so what stops each attempt is the ValidatingAdmissionPolicies
of k8s/base inside the apiserver, which hold whether or not lockgate runs. Each case ends in a
clear refusal (status and message asserted) or in documented behaviour, and afterwards the pod
is checked to be exactly as it was: still gated, same queue.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.manifests import (
    WEBHOOK_CONFIGURATION,
    apply_webhook_configuration,
    delete_webhook_configuration,
    load,
    render_webhook_configuration,
)
from devstack.ports import free_port
from devstack.stack import StackInfo
from helpers.kube import gates_of
from helpers.pods import a_pod
from helpers.waiting import eventually
from lockgate.labels import JOBSET_LABEL, MANAGED_NAMESPACE_LABEL, QUEUE_LABEL, SCHEDULING_GATE

CLUSTER = "cluster-a"
RUN = uuid.uuid4().hex[:6]
# Labels these namespaces carry besides lockgate.io/managed, so no other test's webhook (they
# select their own run label) serves them.
INSTANCE_LABEL = "lockgate.io/enforcement-test"
FOREIGN_GATE = "example.com/quota"
UNGATER = "system:serviceaccount:lockgate-system:lockgate-ungater"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

GATE_DENIED = ("scheduling gate lockgate.io/admission can only be removed by lockgate's "
               f"ungater ({UNGATER})")
QUEUE_FIXED = "label lockgate.io/queue of pod"
JOBSET_FIXED = "label lockgate.io/jobset of pod"
NODE_NAME_DENIED = "cannot be bound to a node when it is created"

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"

Kube = dict[str, client.ApiClient]


# ---------------------------------------------------------------- identities


def token_kubeconfig(admin_kubeconfig: str, token: str) -> dict[str, Any]:
    """The admin kubeconfig's cluster, authenticating only with `token`."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]
    return {
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": "tester", "user": {"token": token}}],
        "contexts": [{"name": "tester", "context": {"cluster": cluster["name"],
                                                    "user": "tester"}}],
        "current-context": "tester",
    }


async def client_with_token(admin_kubeconfig: str, token: str) -> client.ApiClient:
    return await config.new_client_from_config_dict(token_kubeconfig(admin_kubeconfig, token))


async def token_for(core: client.CoreV1Api, namespace: str, account: str) -> str:
    request = await core.create_namespaced_service_account_token(account, namespace, {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}})
    return str(request.status.token)


async def whoami(api: client.ApiClient) -> str:
    review = await client.AuthenticationV1Api(api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(review.status.user_info.username)


@dataclass
class Cluster:
    """One managed namespace and the identities that act in it."""

    namespace: str
    admin: client.CoreV1Api
    user: client.CoreV1Api  # ServiceAccount bound to `edit` in `namespace`
    ungater: client.CoreV1Api
    user_name: str

    def core(self, who: str) -> client.CoreV1Api:
        return {"user": self.user, "admin": self.admin, "ungater": self.ungater}[who]


async def make_namespace_with_editor(admin_api: client.ApiClient, name: str,
                                     labels: Mapping[str, str]) -> None:
    core = client.CoreV1Api(admin_api)
    await core.create_namespace({"metadata": {"name": name, "labels": dict(labels)}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "mallory"}})
    await client.RbacAuthorizationV1Api(admin_api).create_namespaced_role_binding(name, {
        "metadata": {"name": "mallory-edits"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "mallory", "namespace": name}]})

    async def default_account() -> bool | None:
        try:
            await core.read_namespaced_service_account("default", name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return True

    await eventually(default_account, within=30, what=f"ServiceAccount {name}/default")


async def delete_namespace(admin: client.CoreV1Api, name: str) -> None:
    try:
        await admin.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        await admin.delete_namespace(name)
    except ApiException as error:
        if error.status not in (404, 409):
            raise


@pytest.fixture(scope="module")
async def cluster(stack: StackInfo, kube_clients: Kube) -> AsyncIterator[Cluster]:
    admin_api = kube_clients[CLUSTER]
    admin = client.CoreV1Api(admin_api)
    namespace = f"lg-enforce-{RUN}"
    opened: list[client.ApiClient] = []
    try:
        await make_namespace_with_editor(admin_api, namespace, {
            MANAGED_NAMESPACE_LABEL: "true", INSTANCE_LABEL: RUN})
        user_api = await client_with_token(stack.kubeconfigs[CLUSTER],
                                           await token_for(admin, namespace, "mallory"))
        opened.append(user_api)
        ungater_api = await config.new_client_from_config(
            config_file=stack.kubeconfigs_of("ungater")[CLUSTER], persist_config=False)
        opened.append(ungater_api)
        user_name = await whoami(user_api)
        assert user_name == f"system:serviceaccount:{namespace}:mallory"
        assert await whoami(ungater_api) == UNGATER
        yield Cluster(namespace, admin, client.CoreV1Api(user_api),
                      client.CoreV1Api(ungater_api), user_name)
    finally:
        for api in opened:
            await api.close()
        await delete_namespace(admin, namespace)


# ---------------------------------------------------------------- pods as the webhook leaves them


def waiting_pod(name: str, *gates: str, queue: str = "team-a", jobset: str = "js",
                labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    builder = a_pod(name).tolerating_kwok_nodes().requesting(cpu="100m", memory="64Mi")
    if queue:
        builder = builder.in_queue(queue)
    if jobset:
        builder = builder.in_jobset(jobset)
    return builder.labelled(labels or {}).gated(*(gates or (SCHEDULING_GATE,))).manifest()


async def create(cluster: Cluster, manifest: dict[str, Any], who: str = "user") -> client.V1Pod:
    return await cluster.core(who).create_namespaced_pod(cluster.namespace, manifest)


def denial(error: ApiException) -> str:
    """The apiserver's message of a refusal (JSON Status body)."""
    try:
        return str(json.loads(error.body)["message"])
    except (ValueError, KeyError, TypeError):
        return str(error.body)


async def release_as_ungater(cluster: Cluster, name: str) -> None:
    patch = [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": SCHEDULING_GATE},
             {"op": "remove", "path": "/spec/schedulingGates/0"}]
    await cluster.ungater.patch_namespaced_pod(name, cluster.namespace, patch,
                                               _content_type=JSON_PATCH)


async def bound(cluster: Cluster, name: str) -> client.V1Pod:
    async def probe() -> client.V1Pod | None:
        pod = await cluster.admin.read_namespaced_pod(name, cluster.namespace)
        return pod if pod.spec.node_name else None

    return await eventually(probe, within=60, every=0.1, what=f"pod {name} to be bound")


# ---------------------------------------------------------------- the attempts


@dataclass(frozen=True)
class Attempt:
    """One try at a pod: what the pod is, who does what, and what must come of it."""

    id: str
    body: Any
    content_type: str = JSON_PATCH
    gates: tuple[str, ...] = (SCHEDULING_GATE,)
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    queue: str = "team-a"
    released_first: bool = False
    who: str = "user"
    replace_whole_pod: bool = False
    want_status: int | None = 403  # None: allowed
    want_message: str = GATE_DENIED
    want_gates: tuple[str, ...] | None = None  # after the attempt; default: `gates` unchanged


def remove_gate_at(index: int) -> list[dict[str, Any]]:
    return [{"op": "remove", "path": f"/spec/schedulingGates/{index}"}]


def set_label(key: str, value: str | None) -> dict[str, Any]:
    return {"metadata": {"labels": {key: value}}}


def json_label(op: str, key: str, value: str | None = None) -> list[dict[str, Any]]:
    path = "/metadata/labels/" + key.replace("~", "~0").replace("/", "~1")
    return [{"op": op, "path": path, **({"value": value} if value is not None else {})}]


ATTEMPTS = [
    # --- removing lockgate's gate, every way an UPDATE can be written
    Attempt("gate-json-patch-remove", remove_gate_at(0)),
    Attempt("gate-json-patch-test-and-remove-as-the-ungater-does",
            [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": SCHEDULING_GATE},
             *remove_gate_at(0)]),
    Attempt("gate-json-patch-replace-list-with-empty",
            [{"op": "replace", "path": "/spec/schedulingGates", "value": []}]),
    Attempt("gate-json-patch-remove-whole-list",
            [{"op": "remove", "path": "/spec/schedulingGates"}]),
    Attempt("gate-strategic-merge-delete-directive",
            {"spec": {"schedulingGates": [{"$patch": "delete", "name": SCHEDULING_GATE}]}},
            STRATEGIC),
    Attempt("gate-strategic-merge-replace-directive",
            {"spec": {"schedulingGates": [{"$patch": "replace"}]}}, STRATEGIC),
    Attempt("gate-merge-patch-empty-list", {"spec": {"schedulingGates": []}}, MERGE_PATCH),
    Attempt("gate-merge-patch-null", {"spec": {"schedulingGates": None}}, MERGE_PATCH),
    Attempt("gate-put-whole-pod-without-gates", None, replace_whole_pod=True),
    Attempt("gate-removed-by-admin-too", remove_gate_at(0), who="admin"),
    # --- beside another controller's gate
    Attempt("gate-lockgates-removed-foreign-kept", remove_gate_at(0),
            gates=(SCHEDULING_GATE, FOREIGN_GATE)),
    Attempt("gate-list-replaced-by-foreign-only",
            [{"op": "replace", "path": "/spec/schedulingGates",
              "value": [{"name": FOREIGN_GATE}]}],
            gates=(SCHEDULING_GATE, FOREIGN_GATE)),
    Attempt("gate-foreign-removed-lockgates-kept-is-allowed", remove_gate_at(1),
            gates=(SCHEDULING_GATE, FOREIGN_GATE), want_status=None,
            want_gates=(SCHEDULING_GATE,)),
    Attempt("gate-foreign-removed-by-strategic-merge-is-allowed",
            {"spec": {"schedulingGates": [{"$patch": "delete", "name": FOREIGN_GATE}]}},
            STRATEGIC, gates=(FOREIGN_GATE, SCHEDULING_GATE), want_status=None,
            want_gates=(SCHEDULING_GATE,)),
    # --- the queue and jobset labels, while waiting
    Attempt("queue-changed-while-gated", set_label(QUEUE_LABEL, "vip"), MERGE_PATCH,
            want_message=QUEUE_FIXED),
    Attempt("queue-changed-by-json-patch", json_label("replace", QUEUE_LABEL, "vip"),
            want_message=QUEUE_FIXED),
    Attempt("queue-removed-while-gated", json_label("remove", QUEUE_LABEL),
            want_message=QUEUE_FIXED),
    Attempt("queue-added-to-a-pod-without-one", set_label(QUEUE_LABEL, "vip"), STRATEGIC,
            queue="", want_message=QUEUE_FIXED),
    Attempt("jobset-changed-while-gated", set_label(JOBSET_LABEL, "other"), STRATEGIC,
            want_message=JOBSET_FIXED),
    Attempt("jobset-removed-while-gated", set_label(JOBSET_LABEL, None), MERGE_PATCH,
            want_message=JOBSET_FIXED),
    Attempt("queue-changed-by-admin-too", set_label(QUEUE_LABEL, "vip"), MERGE_PATCH,
            who="admin", want_message=QUEUE_FIXED),
    Attempt("queue-changed-by-the-ungater-too", set_label(QUEUE_LABEL, "vip"), MERGE_PATCH,
            who="ungater", want_message=QUEUE_FIXED),
    Attempt("gate-and-queue-at-once-by-the-ungater",
            [*remove_gate_at(0), *json_label("replace", QUEUE_LABEL, "vip")],
            who="ungater", want_message=QUEUE_FIXED),
    # --- ... and after release: usage stays charged to the queue that was released
    Attempt("queue-changed-after-release", set_label(QUEUE_LABEL, "vip"), MERGE_PATCH,
            released_first=True, want_message=QUEUE_FIXED, want_gates=()),
    Attempt("jobset-removed-after-release", json_label("remove", JOBSET_LABEL),
            released_first=True, want_message=JOBSET_FIXED, want_gates=()),
    # --- what stays allowed
    Attempt("other-labels-may-change", set_label("app", "web"), MERGE_PATCH, want_status=None),
]


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=[a.id for a in ATTEMPTS])
async def test_attempt(cluster: Cluster, attempt: Attempt) -> None:
    name = f"{attempt.id[:40]}-{uuid.uuid4().hex[:5]}"
    await create(cluster, waiting_pod(name, *attempt.gates, queue=attempt.queue,
                                      labels=attempt.pod_labels))
    if attempt.released_first:
        await release_as_ungater(cluster, name)
        await bound(cluster, name)
    before = await cluster.admin.read_namespaced_pod(name, cluster.namespace)
    core = cluster.core(attempt.who)

    async def act() -> object:
        if attempt.replace_whole_pod:
            pod = await core.read_namespaced_pod(name, cluster.namespace)
            pod.spec.scheduling_gates = None
            return await core.replace_namespaced_pod(name, cluster.namespace, pod)
        return await core.patch_namespaced_pod(name, cluster.namespace, attempt.body,
                                               _content_type=attempt.content_type)

    if attempt.want_status is None:
        await act()
    else:
        with pytest.raises(ApiException) as refused:
            await act()
        message = denial(refused.value)
        assert refused.value.status == attempt.want_status, message
        assert attempt.want_message in message, message
        if attempt.want_message == GATE_DENIED:
            who = {"user": cluster.user_name, "admin": "lockgate-admin"}[attempt.who]
            assert f"not by {who}" in message and "waits in lockgate queue team-a" in message

    after = await cluster.admin.read_namespaced_pod(name, cluster.namespace)
    want_gates = attempt.gates if attempt.want_gates is None else attempt.want_gates
    assert tuple(gates_of(after)) == want_gates
    for key in (QUEUE_LABEL, JOBSET_LABEL):
        assert (after.metadata.labels or {}).get(key) == (before.metadata.labels or {}).get(key)
    if SCHEDULING_GATE in want_gates:
        assert after.spec.node_name is None


async def test_the_ungater_may_remove_the_gate_the_user_may_not(cluster: Cluster) -> None:
    name = f"ungater-vs-user-{uuid.uuid4().hex[:5]}"
    await create(cluster, waiting_pod(name))
    patch = [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": SCHEDULING_GATE},
             *remove_gate_at(0)]
    with pytest.raises(ApiException) as refused:
        await cluster.user.patch_namespaced_pod(name, cluster.namespace, patch,
                                                _content_type=JSON_PATCH)
    assert refused.value.status == 403 and GATE_DENIED in denial(refused.value)

    await cluster.ungater.patch_namespaced_pod(name, cluster.namespace, patch,
                                               _content_type=JSON_PATCH)
    pod = await bound(cluster, name)
    assert not gates_of(pod) and pod.metadata.labels[QUEUE_LABEL] == "team-a"


async def test_server_side_apply_that_drops_the_gate_is_refused(cluster: Cluster) -> None:
    """`kubectl apply --server-side` of a manifest without the gate, by the manager that applied
    it with the gate: server-side apply removes what that manager no longer declares, an UPDATE
    without lockgate's gate."""
    name = f"applied-{uuid.uuid4().hex[:5]}"
    manifest = waiting_pod(name)
    manifest["metadata"]["namespace"] = cluster.namespace

    async def apply(body: dict[str, Any]) -> object:
        return await cluster.user.patch_namespaced_pod(
            name, cluster.namespace, body, field_manager="mallory-kubectl", force=True,
            _content_type=APPLY)

    await apply(manifest)
    without_gate = {**manifest, "spec": {k: v for k, v in manifest["spec"].items()
                                         if k != "schedulingGates"}}
    with pytest.raises(ApiException) as refused:
        await apply(without_gate)
    assert refused.value.status == 403 and GATE_DENIED in denial(refused.value)
    pod = await cluster.admin.read_namespaced_pod(name, cluster.namespace)
    assert gates_of(pod) == [SCHEDULING_GATE]


# ---------------------------------------------------------------- binding at creation


@pytest.mark.parametrize(("case", "annotations"), [
    ("plain", {}),
    # Anyone can write the mirror annotation: it exempts only pods a node creates.
    ("mirror-annotation-from-a-user", {MIRROR_ANNOTATION: "forged"}),
])
async def test_creating_a_pod_bound_to_a_node_is_refused(
    cluster: Cluster, case: str, annotations: dict[str, str],
) -> None:
    name = f"on-node-{case}-{uuid.uuid4().hex[:5]}"
    pod = a_pod(name).in_queue("team-a").annotated(annotations).on_node(f"{CLUSTER}-node-0")
    with pytest.raises(ApiException) as refused:
        await create(cluster, pod.manifest())
    message = denial(refused.value)
    assert refused.value.status == 403, message
    assert NODE_NAME_DENIED in message and f"spec.nodeName={CLUSTER}-node-0" in message
    assert f"nodeSelector kubernetes.io/hostname={CLUSTER}-node-0" in message
    assert not [p for p in (await cluster.admin.list_namespaced_pod(cluster.namespace)).items
                if p.metadata.name == name]


async def test_a_nodes_mirror_pod_may_name_its_node(stack: StackInfo,
                                                    cluster: Cluster) -> None:
    """The kubelet creates a mirror pod of each static pod, bound to its own node (documented
    in docs/security.md). Acting as node cluster-a-node-0 through admin's impersonation."""
    node = f"{CLUSTER}-node-0"
    as_node = await config.new_client_from_config(config_file=stack.kubeconfigs[CLUSTER],
                                                   persist_config=False)
    as_node.set_default_header("Impersonate-User", f"system:node:{node}")
    as_node.set_default_header("Impersonate-Group", "system:nodes")
    name = f"static-web-{node}-{uuid.uuid4().hex[:4]}"
    try:
        pod = a_pod(name).annotated({MIRROR_ANNOTATION: "hash-of-the-static-pod"}).on_node(node)
        created = await client.CoreV1Api(as_node).create_namespaced_pod(
            cluster.namespace, pod.manifest())
        assert created.spec.node_name == node
    finally:
        await as_node.close()


async def test_a_pod_bound_at_creation_outside_managed_namespaces_is_not_lockgates_business(
    stack: StackInfo, kube_clients: Kube, cluster: Cluster,
) -> None:
    namespace = f"lg-enforce-free-{RUN}"
    await make_namespace_with_editor(kube_clients[CLUSTER], namespace, {INSTANCE_LABEL: RUN})
    user_api = await client_with_token(stack.kubeconfigs[CLUSTER],
                                       await token_for(cluster.admin, namespace, "mallory"))
    try:
        created = await client.CoreV1Api(user_api).create_namespaced_pod(
            namespace, a_pod("pinned").on_node(f"{CLUSTER}-node-1").manifest())
        assert created.spec.node_name == f"{CLUSTER}-node-1"
    finally:
        await user_api.close()
        await delete_namespace(cluster.admin, namespace)


# ---------------------------------------------------------------- pods/binding


async def test_binding_a_gated_pod_is_refused(cluster: Cluster) -> None:
    """kube-scheduler binds through pods/binding. A user holding `edit` may not create
    bindings at all (RBAC); even admin, who may, cannot bind a pod that still has gates: the
    apiserver itself refuses it (see docs/security.md)."""
    name = f"bind-{uuid.uuid4().hex[:5]}"
    await create(cluster, waiting_pod(name))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
               "target": {"apiVersion": "v1", "kind": "Node", "name": f"{CLUSTER}-node-0"}}

    with pytest.raises(ApiException) as by_user:
        await cluster.user.create_namespaced_pod_binding(name, cluster.namespace, binding)
    assert by_user.value.status == 403, denial(by_user.value)
    assert 'cannot create resource "pods/binding"' in denial(by_user.value)

    with pytest.raises(ApiException) as by_admin:
        await cluster.admin.create_namespaced_pod_binding(name, cluster.namespace, binding)
    message = denial(by_admin.value)
    # kube-apiserver's pod registry refuses inside its update, reported as a conflict.
    assert by_admin.value.status == 409, (by_admin.value.status, message)
    assert f"pod {name} has non-empty .spec.schedulingGates" in message, message

    pod = await cluster.admin.read_namespaced_pod(name, cluster.namespace)
    assert gates_of(pod) == [SCHEDULING_GATE] and pod.spec.node_name is None


async def test_binding_through_the_legacy_bindings_resource_is_refused(cluster: Cluster) -> None:
    """POST /namespaces/<ns>/bindings is the older way to bind; `edit` may only read it."""
    name = f"bind-legacy-{uuid.uuid4().hex[:5]}"
    await create(cluster, waiting_pod(name))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
               "target": {"apiVersion": "v1", "kind": "Node", "name": f"{CLUSTER}-node-0"}}
    with pytest.raises(ApiException) as refused:
        await cluster.user.create_namespaced_binding(cluster.namespace, binding)
    assert refused.value.status == 403
    assert 'cannot create resource "bindings"' in denial(refused.value)


async def test_growing_a_released_pod_in_place_is_refused(cluster: Cluster) -> None:
    """After release a pod holds what it asked for when the scheduler decided; resizing it in
    place (pods/resize) would take more than was released. `edit` does not grant pods/resize."""
    name = f"resize-{uuid.uuid4().hex[:5]}"
    await create(cluster, waiting_pod(name))
    await release_as_ungater(cluster, name)
    await bound(cluster, name)
    grow = {"spec": {"containers": [{"name": "main", "resources": {
        "requests": {"cpu": "8"}, "limits": {}}}]}}
    with pytest.raises(ApiException) as refused:
        await cluster.user.patch_namespaced_pod_resize(name, cluster.namespace, grow,
                                                       _content_type=STRATEGIC)
    assert refused.value.status == 403
    assert 'cannot patch resource "pods/resize"' in denial(refused.value)
    pod = await cluster.admin.read_namespaced_pod(name, cluster.namespace)
    assert pod.spec.containers[0].resources.requests["cpu"] == "100m"


# ---------------------------------------------------------------- lockgate's webhook down


@contextlib.asynccontextmanager
async def webhook_down(api: client.ApiClient, stack: StackInfo,
                       namespace: str) -> AsyncIterator[None]:
    """A fail-closed registration for this module's namespaces whose webhook does not run
    (nothing listens on its port): in force when entered, gone again when left.

    The apiserver reads webhook registrations through an informer, so a registration takes
    effect (and a deleted one stops) a moment after the API call; a dry-run pod creation in
    `namespace` is the apiserver's own answer to whether it is in force.
    """
    name = f"lockgate-enforcement-{RUN}"
    ca = Path(stack.stack_dir) / CLUSTER / "pki" / "ca.crt"
    manifest = render_webhook_configuration(
        load(WEBHOOK_CONFIGURATION), name=name, ca_bundle_pem=ca.read_bytes(),
        url=f"https://127.0.0.1:{free_port()}/mutate/{CLUSTER}",
        extra_namespace_labels={INSTANCE_LABEL: RUN})
    core = client.CoreV1Api(api)
    probe = a_pod(f"probe-{uuid.uuid4().hex[:5]}").in_queue("team-a").manifest()

    async def calls_the_down_webhook() -> bool:
        try:
            await core.create_namespaced_pod(namespace, probe, dry_run="All")
        except ApiException as error:
            if error.status == 500 and "failed calling webhook" in denial(error):
                return True
            raise
        return False

    await apply_webhook_configuration(api, manifest)
    try:
        await eventually(calls_the_down_webhook, within=60, every=0.5,
                         what=f"the apiserver calling the down webhook of {name}")
        yield
    finally:
        await delete_webhook_configuration(api, name)

        async def passes_again() -> bool:
            return not await calls_the_down_webhook()

        await eventually(passes_again, within=60, every=0.5,
                         what=f"the apiserver no longer calling the deleted {name}")


async def test_with_the_webhook_down_pods_fail_closed_and_the_gate_still_holds(
    cluster: Cluster, kube_clients: Kube, stack: StackInfo,
) -> None:
    waiting = f"before-outage-{uuid.uuid4().hex[:5]}"
    await create(cluster, waiting_pod(waiting))
    async with webhook_down(kube_clients[CLUSTER], stack, cluster.namespace):
        # Creation: refused, not admitted ungated (docs/admission.md, failurePolicy Fail). The
        # apiserver reports a webhook it cannot call as 500 "failed calling webhook".
        with pytest.raises(ApiException) as refused:
            await create(cluster, a_pod(f"during-outage-{uuid.uuid4().hex[:5]}")
                         .in_queue("team-a").manifest())
        assert refused.value.status == 500
        assert "failed calling webhook" in denial(refused.value)
        # Updates never went to the webhook; the policy is in the apiserver and still denies.
        with pytest.raises(ApiException) as denied:
            await cluster.user.patch_namespaced_pod(waiting, cluster.namespace,
                                                    remove_gate_at(0), _content_type=JSON_PATCH)
        assert denied.value.status == 403 and GATE_DENIED in denial(denied.value)
    pod = await cluster.admin.read_namespaced_pod(waiting, cluster.namespace)
    assert gates_of(pod) == [SCHEDULING_GATE]


# ---------------------------------------------------------------- afterwards


async def test_afterwards_no_pod_of_the_suite_escaped_its_gate(cluster: Cluster) -> None:
    """Runs last in the module: every pod still gated was never bound, and every bound pod was
    released by the ungater (its gate is gone, its queue label unchanged)."""
    pods = (await cluster.admin.list_namespaced_pod(cluster.namespace)).items
    if not pods:
        pytest.fail("run this with the whole module: it checks the pods the other tests left")
    for pod in pods:
        if pod.metadata.annotations and MIRROR_ANNOTATION in pod.metadata.annotations:
            continue
        gates = gates_of(pod)
        if SCHEDULING_GATE in gates:
            assert pod.spec.node_name is None, pod.metadata.name
        labels = pod.metadata.labels or {}
        if labels.get(QUEUE_LABEL):
            assert labels[QUEUE_LABEL] == "team-a", pod.metadata.name

