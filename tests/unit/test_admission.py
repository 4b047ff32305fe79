"""Every path of the admission decision, table-driven, and the patch applied to real pod JSON.

Also the webhook service's parts that need no stack: its certificates, caches and settings.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from admission_webhook.certificates import RENEW_BEFORE, ensure_certificates, needs_renewal
from admission_webhook.cluster_lookups import TtlCache
from admission_webhook.settings import WebhookSettings
from helpers.pods import a_pod
from lockgate.admission import (
    AdmissionRequest,
    Decision,
    MalformedReviewError,
    NotPermitted,
    Outcome,
    OwnerLabels,
    QueueLookup,
    QueueStatus,
    admission_response,
    decide,
    exemption,
    lookup_queue,
    needs_owner_labels,
    owner_rbac_hint,
    queue_to_check,
    refused_user,
)
from lockgate.labels import (
    ADMISSION_TRACE_ANNOTATION,
    JOBSET_LABEL,
    LABEL_SOURCE_ANNOTATION,
    QUEUE_LABEL,
    SCHEDULING_GATE,
)
from lockgate.max_queued import MAX_QUEUED_TIME_ANNOTATION, ON_MAX_QUEUED_ANNOTATION
from lockgate.queues import NamespaceBinding, QueueSpec

NS = "team-a"
MANAGED = {"lockgate.io/managed": "true"}
OPEN = QueueLookup(QueueStatus.OPEN)
POD = a_pod("worker-1").in_namespace(NS)  # what a user sends: no gates, labels or annotations


def make_review(
    pod: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    namespace: str = NS,
    kind: str = "Pod",
    resource: str = "pods",
    sub_resource: str | None = None,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": resource},
        "namespace": namespace,
        "operation": operation,
        "object": pod,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def owner(kind: str, name: str, **labels: str) -> OwnerLabels:
    return OwnerLabels(kind=kind, name=name, labels=labels)


def unreadable(kind: str, name: str) -> OwnerLabels:
    """An owner this pod could not be read for (deleted, timed out, refused on its own)."""
    return OwnerLabels(kind=kind, name=name, labels=None, unreadable_reason="403 Forbidden")


WEBHOOK_USER = "system:serviceaccount:lockgate-system:lockgate-webhook"
DASK_WORKER_GROUPS = NotPermitted(group="kubernetes.dask.org", resource="daskworkergroups",
                                  user=WEBHOOK_USER)


def not_permitted(kind: str, name: str) -> OwnerLabels:
    """An owner of a kind the webhook's RBAC does not let it get at all."""
    return OwnerLabels(kind=kind, name=name, labels=None, unreadable_reason="403 Forbidden",
                       not_permitted=DASK_WORKER_GROUPS)


def apply_patch(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add` only, which is all the webhook emits (any other op fails the test)."""
    result = copy.deepcopy(document)
    for operation in patch:
        assert operation["op"] == "add", operation
        *parents, last = [
            token.replace("~1", "/").replace("~0", "~")
            for token in operation["path"].split("/")[1:]
        ]
        target: Any = result
        for token in parents:
            target = target[token]
        if isinstance(target, list):
            assert last == "-", operation
            target.append(operation["value"])
        else:
            target[last] = operation["value"]
    return result


@dataclass
class Case:
    id: str
    pod: dict[str, Any] | None = field(default_factory=POD.manifest)
    namespace_labels: dict[str, str] | None = field(default_factory=lambda: dict(MANAGED))
    owners: list[OwnerLabels] = field(default_factory=list)
    queue: QueueLookup | None = OPEN
    review: dict[str, Any] = field(default_factory=dict)
    namespace: str = NS
    want_outcome: Outcome = Outcome.GATED
    want_queue: str | None = None
    want_jobset: str | None = None
    want_sources: dict[str, Any] | None = None
    want_message: list[str] = field(default_factory=list)


CASES = [
    Case("pod labels", pod=POD.labelled({QUEUE_LABEL: "q1", JOBSET_LABEL: "js"}).manifest(),
         want_queue="q1", want_jobset="js", want_sources={"queue": "pod", "jobset": "pod"}),
    Case("queue from pod, jobset falls back to the namespace name",
         pod=POD.labelled({QUEUE_LABEL: "q1"}).manifest(), want_queue="q1", want_jobset=NS,
         want_sources={"queue": "pod", "jobset": "default:namespace-name"}),
    Case("labels from the Deployment through its ReplicaSet",
         owners=[owner("ReplicaSet", "web-5d9c"),
                 owner("Deployment", "web", **{QUEUE_LABEL: "q2", JOBSET_LABEL: "web"})],
         want_queue="q2", want_jobset="web",
         want_sources={"queue": "Deployment/web", "jobset": "Deployment/web"}),
    Case("the nearest owner wins",
         owners=[owner("Job", "j1", **{QUEUE_LABEL: "near"}),
                 owner("CronJob", "c1", **{QUEUE_LABEL: "far", JOBSET_LABEL: "nightly"})],
         want_queue="near", want_jobset="nightly",
         want_sources={"queue": "Job/j1", "jobset": "CronJob/c1"}),
    Case("labels from the namespace",
         namespace_labels={**MANAGED, QUEUE_LABEL: "nsq", JOBSET_LABEL: "nsjs"},
         want_queue="nsq", want_jobset="nsjs",
         want_sources={"queue": f"namespace/{NS}", "jobset": f"namespace/{NS}"}),
    Case("pod labels win over owners and namespace",
         pod=POD.labelled({QUEUE_LABEL: "podq"}).manifest(),
         owners=[owner("StatefulSet", "db", **{QUEUE_LABEL: "ownerq", JOBSET_LABEL: "db"})],
         namespace_labels={**MANAGED, QUEUE_LABEL: "nsq", JOBSET_LABEL: "nsjs"},
         want_queue="podq", want_jobset="db",
         want_sources={"queue": "pod", "jobset": "StatefulSet/db"}),
    Case("owners win over the namespace",
         owners=[owner("Deployment", "web", **{QUEUE_LABEL: "ownerq"})],
         namespace_labels={**MANAGED, QUEUE_LABEL: "nsq", JOBSET_LABEL: "nsjs"},
         want_queue="ownerq", want_jobset="nsjs",
         want_sources={"queue": "Deployment/web", "jobset": f"namespace/{NS}"}),
    Case("an empty label value counts as unset",
         pod=POD.labelled({QUEUE_LABEL: ""}).manifest(),
         namespace_labels={**MANAGED, QUEUE_LABEL: "nsq"}, want_queue="nsq", want_jobset=NS),
    Case("an unreadable owner is skipped and recorded",
         owners=[unreadable("ReplicaSet", "web-5d9c")],
         namespace_labels={**MANAGED, QUEUE_LABEL: "nsq"}, want_queue="nsq", want_jobset=NS,
         want_sources={"queue": f"namespace/{NS}", "jobset": "default:namespace-name",
                       "unreadable": ["ReplicaSet/web-5d9c: 403 Forbidden"]}),
    Case("an owner of a kind the webhook may not read is not written on every pod it owns",
         owners=[not_permitted("DaskWorkerGroup", "dc-default")],
         namespace_labels={**MANAGED, QUEUE_LABEL: "nsq"}, want_queue="nsq", want_jobset=NS,
         want_sources={"queue": f"namespace/{NS}", "jobset": "default:namespace-name"}),
    Case("no queue anywhere", want_outcome=Outcome.DENIED,
         want_message=[f"pod {NS}/worker-1 has no queue: set label {QUEUE_LABEL} on the pod "
                       f"or namespace {NS}"]),
    Case("a pod named by generateName is described by its prefix",
         pod={**POD.manifest(), "metadata": {"generateName": "web-5d9c-"}},
         want_outcome=Outcome.DENIED, want_message=[f"pod {NS}/web-5d9c-* has no queue"]),
    Case("no queue anywhere, with owners", want_outcome=Outcome.DENIED,
         owners=[owner("ReplicaSet", "web-5d9c"), owner("Deployment", "web")],
         want_message=[f"set label {QUEUE_LABEL} on the pod, its Deployment/web, or namespace "
                       f"{NS}"]),
    Case("no queue, and an owner was unreadable", want_outcome=Outcome.DENIED,
         owners=[unreadable("ReplicaSet", "web-5d9c")],
         want_message=["has no queue", "lockgate could not read ReplicaSet/web-5d9c"]),
    Case("no queue, and an owner's kind may not be read: the refusal says so",
         want_outcome=Outcome.DENIED, owners=[not_permitted("DaskWorkerGroup", "dc-default")],
         want_message=["has no queue", "lockgate could not read DaskWorkerGroup/dc-default"]),
    Case("unknown queue", pod=POD.labelled({QUEUE_LABEL: "nope"}).manifest(),
         queue=QueueLookup(QueueStatus.MISSING, existing=("beta", "alpha"), cluster="c1"),
         want_outcome=Outcome.DENIED,
         want_message=['queue "nope" does not exist. An operator creates it for this namespace '
                       f"with 'lockgate queue create nope --namespace c1/{NS}'; or name a queue "
                       f"namespace {NS} may use: alpha, beta ({QUEUE_LABEL} from the pod)"]),
    Case("unknown queue, none exist: one sentence, not a garbled 'or'",
         queue=QueueLookup(QueueStatus.MISSING, cluster="c1"),
         namespace_labels={**MANAGED, QUEUE_LABEL: "nope"}, want_outcome=Outcome.DENIED,
         want_message=['queue "nope" does not exist. An operator creates it for this namespace '
                       f"with 'lockgate queue create nope --namespace c1/{NS}'; no open queue "
                       f"may be used by namespace {NS} yet ({QUEUE_LABEL} from namespace/{NS})"]),
    Case("queue the namespace may not use, named by an owner",
         owners=[owner("Job", "etl", **{QUEUE_LABEL: "team-b"})],
         queue=QueueLookup(QueueStatus.NOT_ALLOWED, existing=("team-a",), cluster="c1"),
         want_outcome=Outcome.DENIED,
         want_message=[f'namespace {NS} may not use queue "team-b". An operator binds it with '
                       f"'lockgate queue update team-b --namespace c1/{NS}'; or name a queue "
                       f"namespace {NS} may use: team-a ({QUEUE_LABEL} from Job/etl)"]),
    Case("queue the namespace may not use, and none it may",
         pod=POD.labelled({QUEUE_LABEL: "team-b"}).manifest(),
         queue=QueueLookup(QueueStatus.NOT_ALLOWED, cluster="c1"), want_outcome=Outcome.DENIED,
         want_message=[f"'lockgate queue update team-b --namespace c1/{NS}'; no open queue may be "
                       f"used by namespace {NS} yet"]),
    Case("unknown queue, many exist: suggestions are bounded",
         pod=POD.labelled({QUEUE_LABEL: "nope"}).manifest(),
         queue=QueueLookup(QueueStatus.MISSING, existing=tuple(f"q{i:02}" for i in range(25))),
         want_outcome=Outcome.DENIED, want_message=["q00, q01", "q09 (and 15 more)"]),
    Case("cordoned queue", pod=POD.labelled({QUEUE_LABEL: "frozen"}).manifest(),
         queue=QueueLookup(QueueStatus.CORDONED), want_outcome=Outcome.DENIED,
         want_message=['queue "frozen" is cordoned', "lockgate queue update frozen --uncordon"]),
    Case("queue could not be checked", pod=POD.labelled({QUEUE_LABEL: "q1"}).manifest(), queue=None,
         want_outcome=Outcome.UNVERIFIABLE,
         want_message=['lockgate cannot verify queue "q1" right now, retry']),
    Case("namespace could not be read", namespace_labels=None, want_outcome=Outcome.UNVERIFIABLE,
         want_message=[f"lockgate cannot verify the labels of namespace {NS} right now, retry"]),
    Case("invalid queue label value on the pod",
         pod=POD.labelled({QUEUE_LABEL: "-bad-"}).manifest(), want_outcome=Outcome.DENIED,
         want_message=[f"label {QUEUE_LABEL}='-bad-' is not a valid label value",
                       "(on the pod)"]),
    Case("a valid label value that is no valid queue name",
         namespace_labels={**MANAGED, QUEUE_LABEL: "Team_A"}, want_outcome=Outcome.DENIED,
         want_message=["queue name 'Team_A' is invalid", f"(from namespace/{NS})"]),
    Case("invalid jobset label value",
         pod=POD.labelled({QUEUE_LABEL: "q1", JOBSET_LABEL: "x" * 64}).manifest(),
         want_outcome=Outcome.DENIED, want_message=[f"label {JOBSET_LABEL}="]),
    Case("unmanaged namespace", namespace_labels={}, want_outcome=Outcome.UNCHANGED,
         want_message=[f"namespace {NS} is not managed"]),
    Case("managed label not exactly true", namespace_labels={"lockgate.io/managed": "yes"},
         want_outcome=Outcome.UNCHANGED),
    Case("kube-system, even when labelled managed", namespace="kube-system",
         review={"namespace": "kube-system"}, want_outcome=Outcome.UNCHANGED,
         want_message=["namespace kube-system is never managed"]),
    Case("kube-node-lease", review={"namespace": "kube-node-lease"},
         namespace="kube-node-lease", want_outcome=Outcome.UNCHANGED),
    Case("pod already bound to a node", pod=POD.on_node("node-1").manifest(),
         want_outcome=Outcome.UNCHANGED, want_message=["already bound to node node-1"]),
    Case("UPDATE is not mutated", review={"operation": "UPDATE"},
         want_outcome=Outcome.UNCHANGED),
    Case("DELETE carries no object", pod=None, review={"operation": "DELETE"},
         want_outcome=Outcome.UNCHANGED),
    Case("a pod subresource", review={"sub_resource": "binding"},
         want_outcome=Outcome.UNCHANGED, want_message=["pods/binding"]),
    Case("not a pod", review={"kind": "ConfigMap", "resource": "configmaps"},
         want_outcome=Outcome.UNCHANGED),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_decision(case: Case) -> None:
    request = AdmissionRequest.from_review(
        make_review(case.pod, **{"namespace": case.namespace, **case.review})
    )
    decision = decide(request=request, namespace_labels=case.namespace_labels,
                      owners=case.owners, queue=case.queue)

    assert decision.outcome is case.want_outcome, decision.message
    for fragment in case.want_message:
        assert fragment in decision.message
    if case.want_outcome is not Outcome.GATED:
        assert decision.patch == ()
        return
    assert case.pod is not None
    patched = apply_patch(case.pod, list(decision.patch))
    assert patched["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    labels = patched["metadata"]["labels"]
    assert (labels[QUEUE_LABEL], labels[JOBSET_LABEL]) == (case.want_queue, case.want_jobset)
    assert (decision.queue, decision.jobset) == (case.want_queue, case.want_jobset)
    if case.want_sources is not None:
        sources = json.loads(patched["metadata"]["annotations"][LABEL_SOURCE_ANNOTATION])
        assert sources == case.want_sources


def gate(pod: dict[str, Any], namespace_labels: dict[str, str] | None = None) -> Decision:
    request = AdmissionRequest.from_review(make_review(pod))
    return decide(request=request, namespace_labels=namespace_labels or dict(MANAGED),
                  owners=[], queue=OPEN)


def test_other_gates_are_kept_and_ours_appended() -> None:
    pod = POD.labelled({QUEUE_LABEL: "q1"}).with_gates("example.com/other").manifest()
    patched = apply_patch(pod, list(gate(pod).patch))
    assert patched["spec"]["schedulingGates"] == [
        {"name": "example.com/other"}, {"name": SCHEDULING_GATE},
    ]


def test_gate_is_not_added_twice() -> None:
    pod = (POD.labelled({QUEUE_LABEL: "q1"}).with_gates(SCHEDULING_GATE, "example.com/other")
           .manifest())
    patch = gate(pod).patch
    assert not any(op["path"].startswith("/spec") for op in patch)


def test_other_labels_and_annotations_are_kept() -> None:
    pod = POD.labelled({"app": "web", QUEUE_LABEL: "q1"}).annotated({"note": "keep"}).manifest()
    patched = apply_patch(pod, list(gate(pod).patch))
    assert patched["metadata"]["labels"] == {"app": "web", QUEUE_LABEL: "q1", JOBSET_LABEL: NS}
    assert patched["metadata"]["annotations"]["note"] == "keep"


def test_reinvocation_changes_nothing() -> None:
    """A second call (reinvocationPolicy IfNeeded) on our own output patches nothing."""
    pod = POD.labelled({"app": "web"}).manifest()
    namespace_labels = {**MANAGED, QUEUE_LABEL: "nsq"}
    once = apply_patch(pod, list(gate(pod, namespace_labels).patch))
    again = gate(once, namespace_labels)
    assert again.outcome is Outcome.GATED
    assert again.patch == ()
    assert json.loads(once["metadata"]["annotations"][LABEL_SOURCE_ANNOTATION])["queue"] == (
        f"namespace/{NS}"
    )


TRACEPARENT = "00-6f1c2d3e4a5b4c6d8e9f0a1b2c3d4e5f-0123456789abcdef-01"


def test_a_gated_pod_records_the_review_trace_once() -> None:
    pod = POD.labelled({QUEUE_LABEL: "q1"}).manifest()
    request = AdmissionRequest.from_review(make_review(pod))
    decision = decide(request=request, namespace_labels=dict(MANAGED), owners=[], queue=OPEN,
                      trace_parent=TRACEPARENT)
    once = apply_patch(pod, list(decision.patch))
    assert once["metadata"]["annotations"][ADMISSION_TRACE_ANNOTATION] == TRACEPARENT
    # Reinvoked under another span: the first admission's trace stays.
    again = decide(request=AdmissionRequest.from_review(make_review(once)),
                   namespace_labels=dict(MANAGED), owners=[], queue=OPEN,
                   trace_parent=TRACEPARENT.replace("0123", "ffff"))
    assert again.patch == ()
    assert ADMISSION_TRACE_ANNOTATION not in (
        apply_patch(pod, list(gate(pod).patch))["metadata"]["annotations"])


def test_label_key_is_escaped_in_the_patch_path() -> None:
    pod = POD.labelled({"app": "web"}).annotated({}).manifest()
    paths = {op["path"] for op in gate(pod, {**MANAGED, QUEUE_LABEL: "q"}).patch}
    assert "/metadata/labels/lockgate.io~1queue" in paths
    assert "/metadata/annotations/lockgate.io~1labels-from" in paths


@pytest.mark.parametrize(
    ("pod_labels", "namespace_labels", "want"),
    [
        ({}, MANAGED, True),
        ({QUEUE_LABEL: "q"}, MANAGED, True),
        ({QUEUE_LABEL: "q", JOBSET_LABEL: "j"}, MANAGED, False),
        ({}, {}, False),
    ],
)
def test_owner_labels_are_needed_only_when_the_pod_lacks_its_own(
    pod_labels: dict[str, str], namespace_labels: dict[str, str], want: bool
) -> None:
    request = AdmissionRequest.from_review(make_review(POD.labelled(pod_labels).manifest()))
    assert needs_owner_labels(request, namespace_labels) is want


def test_queue_to_check() -> None:
    deployment = [owner("Deployment", "web", **{QUEUE_LABEL: "ownerq"})]
    request = AdmissionRequest.from_review(make_review(POD.manifest()))
    assert queue_to_check(request, MANAGED, deployment) == "ownerq"
    assert queue_to_check(request, MANAGED, []) is None  # no queue: denied without a lookup
    bound = AdmissionRequest.from_review(make_review(POD.on_node("n1").manifest()))
    assert queue_to_check(bound, {**MANAGED, QUEUE_LABEL: "q"}, []) is None
    assert exemption(bound) is not None
    # A bound pod naming a queue itself: that queue must be open to it (it counts as a job).
    labelled = AdmissionRequest.from_review(make_review(
        POD.on_node("n1").labelled({QUEUE_LABEL: "q"}).manifest()))
    assert exemption(labelled) is None
    assert not needs_owner_labels(labelled, MANAGED)
    assert queue_to_check(labelled, {**MANAGED, QUEUE_LABEL: "other"}, deployment) == "q"


@pytest.mark.parametrize(("status", "want"), [
    (QueueStatus.OPEN, Outcome.UNCHANGED), (QueueStatus.NOT_ALLOWED, Outcome.DENIED),
    (QueueStatus.MISSING, Outcome.DENIED), (QueueStatus.CORDONED, Outcome.DENIED)])
def test_a_pod_bound_at_creation_may_name_only_a_queue_open_to_its_namespace(
        status: QueueStatus, want: Outcome) -> None:
    request = AdmissionRequest.from_review(make_review(
        POD.on_node("n1").labelled({QUEUE_LABEL: "q"}).manifest()))
    decision = decide(request=request, namespace_labels=MANAGED, owners=[],
                      queue=QueueLookup(status, existing=("mine",)))
    assert decision.outcome is want
    assert not decision.patch  # never a gate beside nodeName
    if want is Outcome.DENIED:
        assert "(lockgate.io/queue from the pod)" in decision.message


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
         "request": {"uid": "u", "object": "not-an-object"}},
    ],
)
def test_malformed_reviews_are_rejected(body: object) -> None:
    with pytest.raises(MalformedReviewError):
        AdmissionRequest.from_review(body)


def test_response_for_a_gated_pod_carries_a_base64_json_patch() -> None:
    pod = POD.labelled({QUEUE_LABEL: "q1"}).manifest()
    decision = gate(pod)
    response = admission_response("uid-1", decision)["response"]
    assert response["uid"] == "uid-1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == list(decision.patch)


def test_response_for_unchanged_has_no_patch() -> None:
    decision = gate(POD.manifest(), namespace_labels={"other": "x"})
    response = admission_response("uid-2", decision)["response"]
    assert response == {"uid": "uid-2", "allowed": True}


@pytest.mark.parametrize(
    ("queue", "code", "reason"),
    [(QueueLookup(QueueStatus.CORDONED), 403, "Forbidden"), (None, 503, "ServiceUnavailable")],
)
def test_response_for_refusals(queue: QueueLookup | None, code: int, reason: str) -> None:
    request = AdmissionRequest.from_review(make_review(POD.labelled({QUEUE_LABEL: "q"}).manifest()))
    decision = decide(request=request, namespace_labels=MANAGED, owners=[], queue=queue)
    response = admission_response("uid-3", decision)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == code
    assert response["status"]["reason"] == reason
    assert response["status"]["message"] == decision.message
    assert "patch" not in response


def test_response_warns_about_unreadable_owners() -> None:
    request = AdmissionRequest.from_review(make_review(POD.labelled({QUEUE_LABEL: "q"}).manifest()))
    decision = decide(request=request, namespace_labels=MANAGED,
                      owners=[unreadable("ReplicaSet", "rs-1")], queue=OPEN)
    warnings = admission_response("uid-4", decision)["response"]["warnings"]
    assert warnings == ["lockgate could not read owner ReplicaSet/rs-1 (403 Forbidden); "
                        "its labels were not considered"]


def test_no_warning_on_each_pod_for_an_owner_kind_the_webhook_may_not_read() -> None:
    request = AdmissionRequest.from_review(make_review(POD.labelled({QUEUE_LABEL: "q"}).manifest()))
    decision = decide(request=request, namespace_labels=MANAGED,
                      owners=[not_permitted("DaskWorkerGroup", "dc-default")], queue=OPEN)
    assert decision.outcome is Outcome.GATED
    assert "warnings" not in admission_response("uid-5", decision)["response"]


def test_who_was_refused_is_read_from_the_apiservers_message() -> None:
    assert refused_user(
        'daskworkergroups.kubernetes.dask.org "dc-default" is forbidden: User '
        f'"{WEBHOOK_USER}" cannot get resource "daskworkergroups" in API group '
        '"kubernetes.dask.org" in the namespace "ns"') == WEBHOOK_USER
    assert refused_user("forbidden") == ""


def test_the_rbac_hint_names_the_rule_to_add_for_the_refused_identity() -> None:
    hint = owner_rbac_hint(cluster="cluster-a", kind="DaskWorkerGroup",
                           refused=DASK_WORKER_GROUPS)
    assert hint.startswith(
        f"cluster cluster-a: the admission webhook may not read DaskWorkerGroup objects "
        f'({WEBHOOK_USER} cannot get "daskworkergroups" in API group "kubernetes.dask.org")')
    assert ("kubectl create clusterrole "
            "lockgate-webhook-read-daskworkergroups.kubernetes.dask.org --verb=get "
            "--resource=daskworkergroups.kubernetes.dask.org; ") in hint
    assert ("kubectl create clusterrolebinding "
            "lockgate-webhook-read-daskworkergroups.kubernetes.dask.org "
            "--clusterrole=lockgate-webhook-read-daskworkergroups.kubernetes.dask.org "
            "--serviceaccount=lockgate-system:lockgate-webhook ") in hint
    as_user = owner_rbac_hint(cluster="c", kind="ConfigMap", refused=NotPermitted(
        group="", resource="configmaps", user="webhook-client"))
    assert 'cannot get "configmaps" in the core API group' in as_user
    assert "--resource=configmaps; " in as_user and "--user=webhook-client " in as_user
    unnamed = owner_rbac_hint(cluster="c", kind="X", refused=NotPermitted(group="g.io",
                                                                          resource="xs"))
    assert "the webhook's identity cannot get" in unnamed
    assert "--serviceaccount=lockgate-system:lockgate-webhook" in unnamed


# ------------------------------------------------------------- the service's certificates


def test_certificates_are_generated_once_and_serve_tls_for_loopback(tmp_path: Path) -> None:
    certificates = ensure_certificates(tmp_path, hosts=["127.0.0.1", "localhost"])

    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
    ca = x509.load_pem_x509_certificate(certificates.ca_pem)
    serving = x509.load_pem_x509_certificate(certificates.cert_path.read_bytes())
    serving.verify_directly_issued_by(ca)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    again = ensure_certificates(tmp_path, hosts=["127.0.0.1", "localhost"])
    assert again.ca_pem == certificates.ca_pem
    assert again.cert_path.read_bytes() == certificates.cert_path.read_bytes()


async def test_a_client_trusting_only_the_ca_completes_a_handshake(tmp_path: Path) -> None:
    certificates = ensure_certificates(tmp_path, hosts=["127.0.0.1"])

    async def greet(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0,
                                        ssl=certificates.ssl_context())
    port = server.sockets[0].getsockname()[1]
    trust = ssl.create_default_context(cadata=certificates.ca_pem.decode())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=trust)
        assert await reader.read() == b"hello"
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()


def test_expiring_serving_certificate_is_renewed_under_the_same_ca(tmp_path: Path) -> None:
    first = ensure_certificates(tmp_path, hosts=["127.0.0.1"])
    late = first.not_after - RENEW_BEFORE + timedelta(hours=1)
    assert needs_renewal(first, late)

    renewed = ensure_certificates(tmp_path, hosts=["127.0.0.1"], now=late)

    assert renewed.ca_pem == first.ca_pem
    assert renewed.not_after > first.not_after
    assert not needs_renewal(renewed, late)


def test_expiring_ca_is_replaced(tmp_path: Path) -> None:
    first = ensure_certificates(tmp_path, hosts=["127.0.0.1"])
    ca = x509.load_pem_x509_certificate(first.ca_pem)

    replaced = ensure_certificates(tmp_path, hosts=["127.0.0.1"],
                                   now=ca.not_valid_after_utc - timedelta(days=1))

    assert replaced.ca_pem != first.ca_pem


def test_a_new_host_gets_a_new_serving_certificate(tmp_path: Path) -> None:
    first = ensure_certificates(tmp_path, hosts=["127.0.0.1"])
    wider = ensure_certificates(tmp_path, hosts=["127.0.0.1", "webhook.local"])
    assert wider.ca_pem == first.ca_pem
    serving = x509.load_pem_x509_certificate(wider.cert_path.read_bytes())
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["webhook.local"]


# ------------------------------------------------------------------ the service's caches


async def test_cache_coalesces_concurrent_loads_and_expires() -> None:
    now = [0.0]
    cache: TtlCache[int] = TtlCache(ttl=2.0, clock=lambda: now[0])
    calls = 0

    async def load() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return calls

    assert await asyncio.gather(*(cache.get("rs", load) for _ in range(50))) == [1] * 50
    assert await cache.get("rs", load) == 1
    now[0] = 2.5
    assert await cache.get("rs", load) == 2


async def test_cache_does_not_keep_failures() -> None:
    cache: TtlCache[str] = TtlCache(ttl=60.0)

    async def fail() -> str:
        raise LookupError("apiserver down")

    async def succeed() -> str:
        return "labels"

    with pytest.raises(LookupError):
        await cache.get("ns", fail)
    assert await cache.get("ns", succeed) == "labels"


def test_settings_refuse_an_answer_budget_beyond_the_apiserver_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCKGATE_WEBHOOK_CLUSTERS", '{"cluster-a": "/kubeconfig"}')
    monkeypatch.setenv("LOCKGATE_WEBHOOK_ANSWER_WITHIN_SECONDS", "6")
    with pytest.raises(ValueError, match="answer_within_seconds must be below"):
        WebhookSettings()
    monkeypatch.setenv("LOCKGATE_WEBHOOK_ANSWER_WITHIN_SECONDS", "3")
    assert WebhookSettings().clusters == {"cluster-a": "/kubeconfig"}
    monkeypatch.setenv("LOCKGATE_WEBHOOK_CLUSTER", "typo")
    with pytest.raises(ValueError, match="LOCKGATE_WEBHOOK_CLUSTER"):
        WebhookSettings()


def test_settings_refuse_a_database_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_WEBHOOK_CLUSTERS", '{"cluster-a": "/kubeconfig"}')
    monkeypatch.setenv("LOCKGATE_WEBHOOK_POSTGRES_DSN", "postgresql://u:p@db/lockgate")
    with pytest.raises(ValueError, match="the webhook needs no database"):
        WebhookSettings()


# ------------------------------------------------------------------ queues bound to namespaces

def bound(name: str, *bindings: dict[str, Any], cordoned: bool = False) -> QueueSpec:
    return QueueSpec(name=name, cordoned=cordoned,
                     namespaces=tuple(NamespaceBinding.model_validate(b) for b in bindings))


QUEUES = {
    "team-a": bound("team-a", {"cluster": "*", "names": ["team-a"]}),
    "team-b": bound("team-b", {"cluster": "c1", "names": ["team-b"]}),
    "gpu": bound("gpu", {"cluster": "c2", "selector": {"matchLabels": {"tier": "gpu"}}}),
    "batch": bound("batch", {"selector": {"matchExpressions": [
        {"key": "team", "operator": "In", "values": ["a", "b"]},
        {"key": "frozen", "operator": "DoesNotExist"}]}}),
    "frozen": bound("frozen", {"names": ["team-a"]}, cordoned=True),
    "unbound": bound("unbound"),
}


@pytest.mark.parametrize(("queue", "cluster", "namespace", "labels", "want", "want_usable"), [
    ("team-a", "c1", "team-a", {}, QueueStatus.OPEN, ("team-a",)),
    ("team-a", "c2", "team-a", {}, QueueStatus.OPEN, ("team-a",)),
    ("team-b", "c1", "team-a", {}, QueueStatus.NOT_ALLOWED, ("team-a",)),
    ("team-b", "c2", "team-b", {}, QueueStatus.NOT_ALLOWED, ()),  # bound in c1 only
    ("gpu", "c2", "ml", {"tier": "gpu"}, QueueStatus.OPEN, ("gpu",)),
    ("gpu", "c1", "ml", {"tier": "gpu"}, QueueStatus.NOT_ALLOWED, ()),
    ("batch", "c1", "x", {"team": "a"}, QueueStatus.OPEN, ("batch",)),
    ("batch", "c1", "x", {"team": "a", "frozen": ""}, QueueStatus.NOT_ALLOWED, ()),
    ("batch", "c1", "x", {"team": "c"}, QueueStatus.NOT_ALLOWED, ()),
    ("frozen", "c1", "team-a", {}, QueueStatus.CORDONED, ("team-a",)),
    ("unbound", "c1", "team-a", {}, QueueStatus.NOT_ALLOWED, ("team-a",)),
    ("nope", "c1", "team-b", {}, QueueStatus.MISSING, ("team-b",)),
])
def test_a_queue_is_usable_only_from_the_namespaces_bound_to_it(
    queue: str, cluster: str, namespace: str, labels: dict[str, str], want: QueueStatus,
    want_usable: tuple[str, ...],
) -> None:
    found = lookup_queue(queue, queues=QUEUES, cluster=cluster, namespace=namespace,
                         namespace_labels=labels)
    assert (found.status, found.existing) == (want, want_usable)


def test_a_namespace_label_cannot_smuggle_in_another_teams_queue() -> None:
    """The namespace (not only the pod) naming a queue it may not use is refused too."""
    labels = {**MANAGED, QUEUE_LABEL: "team-b"}
    request = AdmissionRequest.from_review(make_review(POD.manifest()))
    lookup = lookup_queue("team-b", queues=QUEUES, cluster="c1", namespace=NS,
                          namespace_labels=labels)
    decision = decide(request=request, namespace_labels=labels, owners=[], queue=lookup)
    assert decision.outcome is Outcome.DENIED
    assert f'namespace {NS} may not use queue "team-b"' in decision.message
    assert "may use: team-a" in decision.message
    assert f"from namespace/{NS}" in decision.message


@pytest.mark.parametrize(("binding", "error"), [
    ({"cluster": "*"}, "needs names, a selector, or both"),
    ({"selector": {}}, "an empty selector would match every namespace"),
    ({"selector": {"matchExpressions": [{"key": "k", "operator": "In"}]}},
     "needs at least one value"),
    ({"selector": {"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]}},
     "takes no values"),
    ({"names": ["a"], "clusters": "*"}, "Extra inputs are not permitted"),
])
def test_invalid_bindings_are_refused_with_why(binding: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        NamespaceBinding.model_validate(binding)


def test_bindings_round_trip_in_kubernetes_spelling() -> None:
    spec = QUEUES["batch"]
    dumped = spec.namespaces_json()
    assert dumped == [{"cluster": "*", "names": [], "selector": {
        "matchLabels": {}, "matchExpressions": [
            {"key": "team", "operator": "In", "values": ["a", "b"]},
            {"key": "frozen", "operator": "DoesNotExist", "values": []}]}}]
    assert QueueSpec(name="batch", namespaces=dumped).namespaces == spec.namespaces  # type: ignore[arg-type]


# ---- a job set's maximum time queued (lockgate.max_queued) ---------------------------------

def gate_in(pod: dict[str, Any], namespace_annotations: dict[str, str]) -> Decision:
    request = AdmissionRequest.from_review(make_review(pod))
    return decide(request=request, namespace_labels=dict(MANAGED), owners=[], queue=OPEN,
                  namespace_annotations=namespace_annotations)


@pytest.mark.parametrize(("pod_annotations", "namespace_annotations", "want_in_message"), [
    ({MAX_QUEUED_TIME_ANNOTATION: "soon"}, {},
     "annotation lockgate.io/max-queued-time='soon' on the pod is not a duration: write it "
     "like 90s, 30m, 2h or 7d"),
    ({MAX_QUEUED_TIME_ANNOTATION: "0s"}, {}, "is not a duration"),
    ({MAX_QUEUED_TIME_ANNOTATION: "400d"}, {}, "longer than the most lockgate allows (366d)"),
    ({MAX_QUEUED_TIME_ANNOTATION: "30m", ON_MAX_QUEUED_ANNOTATION: "evict"}, {},
     "annotation lockgate.io/on-max-queued='evict' on the pod is invalid: write delete or fail"),
    ({ON_MAX_QUEUED_ANNOTATION: "delete"}, {},
     "but no lockgate.io/max-queued-time sets one: add it (e.g. 30m) or remove the action"),
    ({}, {MAX_QUEUED_TIME_ANNOTATION: "half an hour"},
     f"lockgate.io/max-queued-time='half an hour' on namespace {NS} is not a duration"),
])
def test_an_unreadable_max_queued_time_is_refused_saying_what_to_write(
        pod_annotations: dict[str, str], namespace_annotations: dict[str, str],
        want_in_message: str) -> None:
    decision = gate_in(POD.labelled({QUEUE_LABEL: "q1"}).annotated(pod_annotations).manifest(),
                       namespace_annotations)
    assert decision.outcome is Outcome.DENIED
    assert want_in_message in decision.message


def test_the_namespace_stamps_its_max_queued_time_on_its_pods_and_the_shorter_wins() -> None:
    namespace = {MAX_QUEUED_TIME_ANNOTATION: "30m", ON_MAX_QUEUED_ANNOTATION: "delete"}
    in_q1 = POD.labelled({QUEUE_LABEL: "q1"}).manifest()
    plain = apply_patch(in_q1, list(gate_in(in_q1, namespace).patch))
    assert plain["metadata"]["annotations"][MAX_QUEUED_TIME_ANNOTATION] == "1800s"
    assert plain["metadata"]["annotations"][ON_MAX_QUEUED_ANNOTATION] == "delete"
    # The pod's own shorter time and its own action win; the namespace's shorter time wins.
    pod = POD.labelled({QUEUE_LABEL: "q1"}).annotated({
        MAX_QUEUED_TIME_ANNOTATION: "10m", ON_MAX_QUEUED_ANNOTATION: "fail"}).manifest()
    assert gate_in(pod, namespace).patch == gate(pod).patch  # nothing stamped
    longer = (POD.labelled({QUEUE_LABEL: "q1"}).annotated({MAX_QUEUED_TIME_ANNOTATION: "2h"})
              .manifest())
    stamped = apply_patch(longer, list(gate_in(longer, namespace).patch))
    assert stamped["metadata"]["annotations"][MAX_QUEUED_TIME_ANNOTATION] == "1800s"
    # Reinvoked on its own output, nothing more is written.
    assert gate_in(stamped, namespace).patch == ()


def test_a_pod_without_any_max_queued_time_gets_no_such_annotation() -> None:
    pod = POD.labelled({QUEUE_LABEL: "q1"}).manifest()
    patched = apply_patch(pod, list(gate_in(pod, {"other": "x"}).patch))
    assert MAX_QUEUED_TIME_ANNOTATION not in patched["metadata"]["annotations"]
