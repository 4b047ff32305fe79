"""What the admission webhook decides for a pod, and the JSON patch that carries the decision.

Why: a pod created in a managed namespace must carry lockgate's scheduling gate and say which
queue and jobset it belongs to before it exists, because gates can be added only at creation.
Operators of Dask, Ray or Spark create pods we never see in advance, so the labels are inherited:
labels on the pod win, then the nearest controlling owner that has them (ReplicaSet, then its
Deployment, ...), then the namespace. A pod that cannot be placed in an open queue its
namespace may use is refused with a message that says what to set, rather than left gated
forever: whoever names the queue (the pod, an owner, the namespace), the queue must be bound to
the pod's namespace, or one team could run under another's queue.

The webhook service gathers the inputs (namespace labels, owner labels, its cluster's copy of
the queues) and asks this module, in stages, so it reads only what the decision needs:
`exemption` → `needs_owner_labels` → `queue_to_check` → `lookup_queue` → `decide` →
`admission_response`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from lockgate.groups import InvalidPodGroupError, pod_group
from lockgate.labels import (
    ADMISSION_TRACE_ANNOTATION,
    JOBSET_LABEL,
    LABEL_SOURCE_ANNOTATION,
    MANAGED_NAMESPACE_LABEL,
    NEVER_MANAGED_NAMESPACES,
    QUEUE_LABEL,
    SCHEDULING_GATE,
    InvalidLabelError,
    is_managed_namespace,
    validate_label_value,
    validate_queue_name,
)
from lockgate.max_queued import (
    InvalidMaxQueuedError,
    JobSetMaxQueued,
    jobset_max_queued,
    stamped_annotations,
)
from lockgate.queues import QueueSpec

JsonObject = Mapping[str, Any]
PatchOperation = dict[str, Any]

# How many existing queues a "no such queue" denial suggests; the rest are counted.
SUGGESTED_QUEUES = 10
# Source name recorded when no object sets the jobset and the namespace's name is used.
NAMESPACE_NAME_SOURCE = "default:namespace-name"


class MalformedReviewError(ValueError):
    """The body is not an AdmissionReview v1 request lockgate can read."""


@dataclass(frozen=True)
class AdmissionRequest:
    """The parts of an AdmissionReview v1 request the decision depends on."""

    uid: str
    operation: str
    group: str
    kind: str
    resource: str
    sub_resource: str
    namespace: str
    pod: JsonObject

    @classmethod
    def from_review(cls, review: object) -> AdmissionRequest:
        if not isinstance(review, Mapping):
            raise MalformedReviewError("body is not a JSON object")
        if review.get("apiVersion") != "admission.k8s.io/v1" or review.get("kind") != (
            "AdmissionReview"
        ):
            raise MalformedReviewError("body is not an admission.k8s.io/v1 AdmissionReview")
        request = review.get("request")
        if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
            raise MalformedReviewError("AdmissionReview has no request with a uid")
        kind = request.get("kind") or {}
        resource = request.get("resource") or {}
        pod = request.get("object") or {}
        if not isinstance(kind, Mapping) or not isinstance(resource, Mapping) or not isinstance(
            pod, Mapping
        ):
            raise MalformedReviewError("AdmissionReview request has a malformed kind or object")
        return cls(
            uid=request["uid"],
            operation=str(request.get("operation", "")),
            group=str(kind.get("group", "")),
            kind=str(kind.get("kind", "")),
            resource=str(resource.get("resource", "")),
            sub_resource=str(request.get("subResource", "") or ""),
            namespace=str(request.get("namespace", "") or ""),
            pod=pod,
        )

    @property
    def pod_labels(self) -> Mapping[str, str]:
        return _string_map(_metadata(self.pod).get("labels"))

    @property
    def pod_description(self) -> str:
        metadata = _metadata(self.pod)
        name = metadata.get("name") or f"{metadata.get('generateName') or ''}*"
        return f"pod {self.namespace}/{name}"


@dataclass(frozen=True)
class NotPermitted:
    """The webhook's identity may not `get` an owner's kind: its RBAC, not the owner, is why
    the owner was not read. The same for every pod that kind owns, so it is said once (to the
    operator, `owner_rbac_hint`) rather than on each pod."""

    group: str  # "" for the core group
    resource: str  # plural, e.g. daskworkergroups
    user: str = ""  # who the apiserver refused, from its message; "" if it did not say

    @property
    def spelled(self) -> str:
        """As kubectl's `--resource` takes it: `daskworkergroups.kubernetes.dask.org`."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


@dataclass(frozen=True)
class OwnerLabels:
    """One controlling owner of the pod (nearest first); `labels` is None if it was unreadable,
    and `not_permitted` says so when the webhook may not read its kind at all."""

    kind: str
    name: str
    labels: Mapping[str, str] | None
    unreadable_reason: str = ""
    not_permitted: NotPermitted | None = None

    @property
    def reference(self) -> str:
        return f"{self.kind}/{self.name}"


_REFUSED_USER = re.compile(r'User "([^"]+)" cannot')
_SERVICE_ACCOUNT = "system:serviceaccount:"


def refused_user(message: str) -> str:
    """Who an apiserver's 403 message says was refused (`User "..." cannot get ...`), or ""."""
    match = _REFUSED_USER.search(message)
    return match.group(1) if match else ""


def owner_rbac_hint(*, cluster: str, kind: str, refused: NotPermitted) -> str:
    """What the webhook tells the operator, once per owner kind, when RBAC keeps it from
    reading owners of `kind`: what that changes, and the rule to add (get on the kind)."""
    role = f"lockgate-webhook-read-{refused.spelled}"[:253]
    who = refused.user or "the webhook's identity"
    if refused.user.startswith(_SERVICE_ACCOUNT):
        subject = "--serviceaccount=" + refused.user.removeprefix(_SERVICE_ACCOUNT)
    elif refused.user:
        subject = f"--user={refused.user}"
    else:
        subject = "--serviceaccount=lockgate-system:lockgate-webhook"
    group = f'in API group "{refused.group}"' if refused.group else "in the core API group"
    return (f"cluster {cluster}: the admission webhook may not read {kind} objects ({who} "
            f'cannot get "{refused.resource}" {group}), so pods a {kind} owns inherit '
            f"{QUEUE_LABEL} and {JOBSET_LABEL} from the pod itself or its namespace, never "
            f"from the {kind}. To let them inherit from it, grant get on {refused.spelled}: "
            f"kubectl create clusterrole {role} --verb=get --resource={refused.spelled}; "
            f"kubectl create clusterrolebinding {role} --clusterrole={role} {subject} "
            "(docs/admission.md, \"Owners of custom kinds\"). Said once per kind while the "
            "webhook runs; pods are not marked")


class QueueStatus(StrEnum):
    OPEN = "open"
    CORDONED = "cordoned"
    MISSING = "missing"  # no such queue, or deleted
    NOT_ALLOWED = "not-allowed"  # exists, but not bound to the pod's namespace


@dataclass(frozen=True)
class QueueLookup:
    """What the queues say about the one a pod resolved to.

    `existing` (suggestions) lists only the open queues the pod's namespace may use, so a
    refusal never shows a team the queues of others.
    """

    status: QueueStatus
    existing: tuple[str, ...] = ()
    cluster: str = ""


def usable_queues(queues: Mapping[str, QueueSpec], *, cluster: str, namespace: str,
                  namespace_labels: Mapping[str, str]) -> tuple[str, ...]:
    """The open queues pods of `namespace` in `cluster` may name, sorted."""
    return tuple(sorted(
        name for name, spec in queues.items()
        if not spec.cordoned
        and spec.allows(cluster=cluster, namespace=namespace, labels=namespace_labels)))


def lookup_queue(name: str, *, queues: Mapping[str, QueueSpec], cluster: str, namespace: str,
                 namespace_labels: Mapping[str, str]) -> QueueLookup:
    """What `queues` (by name) say about queue `name` for a pod of `namespace` in `cluster`."""
    usable = usable_queues(queues, cluster=cluster, namespace=namespace,
                           namespace_labels=namespace_labels)
    spec = queues.get(name)
    if spec is None:
        return QueueLookup(QueueStatus.MISSING, existing=usable, cluster=cluster)
    if not spec.allows(cluster=cluster, namespace=namespace, labels=namespace_labels):
        return QueueLookup(QueueStatus.NOT_ALLOWED, existing=usable, cluster=cluster)
    if spec.cordoned:
        return QueueLookup(QueueStatus.CORDONED, existing=usable, cluster=cluster)
    return QueueLookup(QueueStatus.OPEN, existing=usable, cluster=cluster)


class Outcome(StrEnum):
    GATED = "gated"  # patched: gate and labels added (or already present)
    UNCHANGED = "unchanged"  # out of lockgate's scope, allowed as sent
    DENIED = "denied"  # the user must change something
    UNVERIFIABLE = "unverifiable"  # lockgate could not check; refused so the pod cannot bypass


@dataclass(frozen=True)
class Decision:
    """The answer for one request: allowed (with a patch, maybe empty) or refused with a message.

    `message` explains a refusal to the user, or for allowed requests says why (for logs).
    """

    outcome: Outcome
    message: str = ""
    patch: tuple[PatchOperation, ...] = ()
    warnings: tuple[str, ...] = ()
    queue: str | None = None
    jobset: str | None = None

    @property
    def allowed(self) -> bool:
        return self.outcome in (Outcome.GATED, Outcome.UNCHANGED)

    @property
    def status_code(self) -> int:
        # 503 tells clients and controllers that retrying later may succeed.
        return {Outcome.DENIED: 403, Outcome.UNVERIFIABLE: 503}.get(self.outcome, 200)


@dataclass(frozen=True)
class _LabelPlan:
    queue: str
    queue_source: str
    jobset: str
    jobset_source: str
    unreadable_owners: tuple[OwnerLabels, ...] = field(default_factory=tuple)


def unchanged(reason: str) -> Decision:
    return Decision(Outcome.UNCHANGED, message=reason)


def unverifiable(what: str) -> Decision:
    return Decision(
        Outcome.UNVERIFIABLE,
        message=f"lockgate cannot verify {what} right now, retry: pods in namespaces managed "
        "by lockgate are refused rather than admitted unqueued",
    )


def exemption(request: AdmissionRequest) -> str | None:
    """Why the request is allowed unchanged without looking anything up, or None."""
    if request.group != "" or request.kind != "Pod" or request.resource != "pods":
        return f"not a pod ({request.group or 'core'}/{request.kind})"
    if request.sub_resource:
        return f"pods/{request.sub_resource} is not a pod creation"
    if request.operation != "CREATE":
        return f"{request.operation} is not a creation"
    if request.namespace in NEVER_MANAGED_NAMESPACES:
        return f"namespace {request.namespace} is never managed"
    node_name = _bound_node(request)
    if node_name and not request.pod_labels.get(QUEUE_LABEL):
        # Gates and spec.nodeName together are invalid; such pods (static/mirror) bypass queues.
        return f"already bound to node {node_name}"
    return None


def _bound_node(request: AdmissionRequest) -> str:
    return str((request.pod.get("spec") or {}).get("nodeName") or "")


def needs_owner_labels(request: AdmissionRequest, namespace_labels: Mapping[str, str]) -> bool:
    """Whether the decision depends on the labels of the pod's controlling owners."""
    if not is_managed_namespace(request.namespace, namespace_labels) or _bound_node(request):
        return False
    labels = request.pod_labels
    return not (labels.get(QUEUE_LABEL) and labels.get(JOBSET_LABEL))


def queue_to_check(
    request: AdmissionRequest,
    namespace_labels: Mapping[str, str],
    owners: Sequence[OwnerLabels],
) -> str | None:
    """The queue whose state the decision needs, or None when it needs none."""
    if exemption(request) is not None:
        return None
    if _bound_node(request):
        plan = _plan_labels(request, {}, [])  # only its own label counts (it is not gated)
    else:
        plan = _plan_labels(request, namespace_labels, owners)
    return plan.queue if isinstance(plan, _LabelPlan) else None


def decide(
    *,
    request: AdmissionRequest,
    namespace_labels: Mapping[str, str] | None,
    owners: Sequence[OwnerLabels],
    queue: QueueLookup | None,
    trace_parent: str | None = None,
    namespace_annotations: Mapping[str, str] | None = None,
) -> Decision:
    """The decision for one request.

    `trace_parent`, the W3C traceparent of the review's span, is recorded on a gated pod so its
    journey's trace can link back to its admission. `namespace_annotations` may give the job
    set's maximum time queued (lockgate.max_queued), which a gated pod is stamped with.

    `namespace_labels` None means the namespace could not be read, `queue` None that the queue
    could not be checked: both refuse a pod that would otherwise be gated (fail-closed).
    """
    reason = exemption(request)
    if reason is not None:
        return unchanged(reason)
    if namespace_labels is None:
        return unverifiable(f"the labels of namespace {request.namespace}")
    if not is_managed_namespace(request.namespace, namespace_labels):
        return unchanged(
            f"namespace {request.namespace} is not managed ({MANAGED_NAMESPACE_LABEL} != true)"
        )
    node_name = _bound_node(request)
    # A pod bound at creation cannot be gated, but the watcher counts it as a job of the queue
    # its label names (its namespace is managed): it may name only a queue open to it.
    plan = _plan_labels(request, {} if node_name else namespace_labels,
                        [] if node_name else owners)
    if isinstance(plan, Decision):
        return plan
    if queue is None:
        return unverifiable(f'queue "{plan.queue}"')
    where = f"{queue.cluster}/{request.namespace}" if queue.cluster else request.namespace
    if queue.status is QueueStatus.MISSING:
        return _denied(plan, f'queue "{plan.queue}" does not exist. An operator creates it '
                       f"for this namespace with 'lockgate queue create {plan.queue} "
                       f"--namespace {where}'"
                       + _instead(queue.existing, request.namespace))
    if queue.status is QueueStatus.NOT_ALLOWED:
        return _denied(plan, f'namespace {request.namespace} may not use queue "{plan.queue}". '
                       f"An operator binds it with 'lockgate queue update {plan.queue} "
                       f"--namespace {where}'" + _instead(queue.existing, request.namespace))
    if queue.status is QueueStatus.CORDONED:
        return _denied(plan, f'queue "{plan.queue}" is cordoned and accepts no new pods; '
                       f"uncordon it with 'lockgate queue update {plan.queue} --uncordon' or "
                       "use another queue")
    if node_name:
        return unchanged(f"already bound to node {node_name}; runs in queue {plan.queue}")
    try:
        pod_group(request.pod_labels, _string_map(_metadata(request.pod).get("annotations")))
    except InvalidPodGroupError as error:
        return Decision(Outcome.DENIED, message=str(error), queue=plan.queue, jobset=plan.jobset)
    pod_annotations = _string_map(_metadata(request.pod).get("annotations"))
    try:
        own = jobset_max_queued(pod_annotations)
        max_queued = jobset_max_queued(pod_annotations, namespace_annotations,
                                       namespace=request.namespace)
    except InvalidMaxQueuedError as error:
        return Decision(Outcome.DENIED, message=str(error), queue=plan.queue, jobset=plan.jobset)
    return Decision(
        Outcome.GATED,
        message=f"gated in queue {plan.queue}, jobset {plan.jobset}",
        # Stamped only when the namespace changes what the pod says itself.
        patch=tuple(_patch(request.pod, plan, trace_parent,
                           None if max_queued == own else max_queued)),
        warnings=tuple(
            f"lockgate could not read owner {owner.reference} ({owner.unreadable_reason}); "
            "its labels were not considered"
            for owner in plan.unreadable_owners
        ),
        queue=plan.queue,
        jobset=plan.jobset,
    )


def admission_response(uid: str, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview v1 answer the apiserver expects."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if decision.allowed:
        if decision.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(
                json.dumps(list(decision.patch), separators=(",", ":")).encode()
            ).decode()
    else:
        response["status"] = {
            "code": decision.status_code,
            "reason": "Forbidden" if decision.status_code == 403 else "ServiceUnavailable",
            "message": decision.message,
        }
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _plan_labels(
    request: AdmissionRequest,
    namespace_labels: Mapping[str, str],
    owners: Sequence[OwnerLabels],
) -> _LabelPlan | Decision:
    sources: list[tuple[str, Mapping[str, str]]] = [("pod", request.pod_labels)]
    sources += [(owner.reference, owner.labels) for owner in owners if owner.labels is not None]
    sources.append((f"namespace/{request.namespace}", namespace_labels))
    try:
        queue = _resolve(QUEUE_LABEL, sources)
        jobset = _resolve(JOBSET_LABEL, sources)
    except _InvalidSourceError as error:
        return Decision(Outcome.DENIED, message=str(error))
    if queue is None:
        return Decision(Outcome.DENIED, message=_no_queue_message(request, owners))
    if jobset is None:
        # A namespace name is a valid label value, and a sensible grouping by default.
        jobset = (request.namespace, NAMESPACE_NAME_SOURCE)
    # An owner whose kind the webhook may not read is said once to the operator (the webhook's
    # log), not on every pod it owns: what the pod records is what went wrong for this pod.
    unreadable = tuple(owner for owner in owners
                       if owner.labels is None and owner.not_permitted is None)
    return _LabelPlan(queue=queue[0], queue_source=queue[1], jobset=jobset[0],
                      jobset_source=jobset[1], unreadable_owners=unreadable)


class _InvalidSourceError(ValueError):
    pass


def _resolve(key: str, sources: Sequence[tuple[str, Mapping[str, str]]]) -> tuple[str, str] | None:
    """The first non-empty value of `key` among `sources`, validated, with its source's name."""
    for source, labels in sources:
        value = labels.get(key)
        if not value:
            continue
        where = "on the pod" if source == "pod" else f"from {source}"
        try:
            validate_label_value(key, value)
            if key == QUEUE_LABEL:
                validate_queue_name(value)
        except InvalidLabelError as error:
            raise _InvalidSourceError(f"{error} ({where})") from error
        return value, source
    return None


def _no_queue_message(request: AdmissionRequest, owners: Sequence[OwnerLabels]) -> str:
    # The outermost owner is the object the user wrote (a Deployment, not its ReplicaSet).
    places = ["the pod"]
    if owners:
        places.append(f"its {owners[-1].reference}")
    places.append(f"namespace {request.namespace}")
    where = ", ".join(places[:-1]) + f"{',' if len(places) > 2 else ''} or {places[-1]}"
    unread = [owner.reference for owner in owners if owner.labels is None]
    suffix = f" (lockgate could not read {', '.join(unread)})" if unread else ""
    return f"{request.pod_description} has no queue: set label {QUEUE_LABEL} on {where}{suffix}"


def _instead(existing: Sequence[str], namespace: str) -> str:
    """What the pod could name instead: the open queues its namespace may use, or that there
    are none yet."""
    if not existing:
        return f"; no open queue may be used by namespace {namespace} yet"
    names = sorted(existing)
    shown = ", ".join(names[:SUGGESTED_QUEUES])
    more = f" (and {len(names) - SUGGESTED_QUEUES} more)" if len(names) > SUGGESTED_QUEUES else ""
    return f"; or name a queue namespace {namespace} may use: {shown}{more}"


def _denied(plan: _LabelPlan, message: str) -> Decision:
    where = "the pod" if plan.queue_source == "pod" else plan.queue_source
    return Decision(Outcome.DENIED, message=f"{message} ({QUEUE_LABEL} from {where})",
                    queue=plan.queue, jobset=plan.jobset)


def _patch(pod: JsonObject, plan: _LabelPlan, trace_parent: str | None = None,
           max_queued: JobSetMaxQueued | None = None) -> list[PatchOperation]:
    operations = _gate_operations(pod)
    metadata = _metadata(pod)
    label_operations = _map_operations(
        "/metadata/labels",
        _string_map(metadata.get("labels")),
        {QUEUE_LABEL: plan.queue, JOBSET_LABEL: plan.jobset},
        exists=isinstance(metadata.get("labels"), Mapping),
    )
    operations += label_operations
    annotations = _string_map(metadata.get("annotations"))
    wanted: dict[str, str] = {}
    # On reinvocation our own labels look like the pod's; keep the first answer's annotation.
    if label_operations or LABEL_SOURCE_ANNOTATION not in annotations:
        wanted[LABEL_SOURCE_ANNOTATION] = _source_annotation(plan)
        if trace_parent and ADMISSION_TRACE_ANNOTATION not in annotations:
            wanted[ADMISSION_TRACE_ANNOTATION] = trace_parent
    wanted.update(stamped_annotations(max_queued))
    if wanted:
        operations += _map_operations(
            "/metadata/annotations",
            annotations,
            wanted,
            exists=isinstance(metadata.get("annotations"), Mapping),
        )
    return operations


def _source_annotation(plan: _LabelPlan) -> str:
    sources: dict[str, Any] = {"queue": plan.queue_source, "jobset": plan.jobset_source}
    if plan.unreadable_owners:
        sources["unreadable"] = [
            f"{owner.reference}: {owner.unreadable_reason}" for owner in plan.unreadable_owners
        ]
    return json.dumps(sources, separators=(",", ":"))


def _gate_operations(pod: JsonObject) -> list[PatchOperation]:
    spec = pod.get("spec") or {}
    gates = spec.get("schedulingGates")
    gate = {"name": SCHEDULING_GATE}
    if not isinstance(gates, list) or not gates:
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]
    if any(isinstance(g, Mapping) and g.get("name") == SCHEDULING_GATE for g in gates):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]


def _map_operations(
    path: str, current: Mapping[str, str], wanted: Mapping[str, str], *, exists: bool
) -> list[PatchOperation]:
    if not exists:
        return [{"op": "add", "path": path, "value": dict(wanted)}]
    # JSON patch "add" on an existing member replaces it.
    return [
        {"op": "add", "path": f"{path}/{_escape_pointer(key)}", "value": value}
        for key, value in wanted.items()
        if current.get(key) != value
    ]


def _escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _metadata(obj: JsonObject) -> JsonObject:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _string_map(value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(key): str(item) for key, item in value.items() if item is not None}
