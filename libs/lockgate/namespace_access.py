"""Ephemeral namespaces: what lockgate writes in a worker cluster so one job's coordinator can
create its pods there, and nothing its queue does not allow.

Why a module of its own: queue-store (creating namespaces, keeping their Roles in step with the
queue) and the admission policy `lockgate-allowed-kinds` (k8s/base) must agree on every name,
label, annotation and rule here, and a wrong rule is a security hole; so the objects are built
without I/O and unit-tested.

A namespace is labelled so its pods inherit the queue and job set (the webhook falls back to the
namespace's labels), marked `lockgate.io/ephemeral=true`, and annotated with the kinds its queue
may create (`lockgate.io/allowed-kinds`, read by the admission policy for its message). It holds
a ServiceAccount for the coordinator, a Role and a RoleBinding. The queue is usable from it
because the Queue object in that cluster lists the namespace by name (`ephemeralNamespaces`),
never because of its labels: a user who labels a namespace like an ephemeral one gains nothing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lockgate.labels import DOMAIN, JOBSET_LABEL, MANAGED_NAMESPACE_LABEL, QUEUE_LABEL

EPHEMERAL_LABEL = f"{DOMAIN}/ephemeral"
ALLOWED_KINDS_ANNOTATION = f"{DOMAIN}/allowed-kinds"
COORDINATOR = "lockgate-coordinator"  # the ServiceAccount, Role and RoleBinding of the job
MANAGED_BY = {"app.kubernetes.io/managed-by": "lockgate"}

# What a queue may create when its definition says nothing: a coordinator's usual needs (Dask,
# Spark in client mode, Ray): its workers, a Service to reach them, their configuration, and the
# three workload controllers that make pods. Secrets are left out on purpose: reading them is
# not needed to run workers, and a namespace's Secrets are its most sensitive objects.
DEFAULT_ALLOWED_KINDS: tuple[str, ...] = (
    "pods", "services", "configmaps", "deployments.apps", "statefulsets.apps", "jobs.batch",
)
# Kinds a Role cannot grant (cluster-scoped) or that would let a coordinator widen its own
# rights or leave its queue's namespace: refused in a queue's allowed kinds.
FORBIDDEN_KINDS = frozenset({
    "namespaces", "nodes", "persistentvolumes", "clusterroles.rbac.authorization.k8s.io",
    "clusterrolebindings.rbac.authorization.k8s.io",
    "customresourcedefinitions.apiextensions.k8s.io",
    "mutatingwebhookconfigurations.admissionregistration.k8s.io",
    "validatingwebhookconfigurations.admissionregistration.k8s.io",
    "validatingadmissionpolicies.admissionregistration.k8s.io",
    "validatingadmissionpolicybindings.admissionregistration.k8s.io",
    "queues.lockgate.io",
})
# Every verb on an allowed kind: the coordinator owns what it makes.
FULL_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
READ_VERBS = ("get", "list", "watch")
# On the `scale` subresource of an allowed kind: what `kubectl scale` and autoscalers use.
SCALE_VERBS = ("get", "update", "patch")
# The API groups Kubernetes serves itself: their kinds are known, and only those below have a
# `scale` subresource. Any other group is a custom resource's (or an aggregated API's).
BUILT_IN_GROUPS = frozenset({
    "", "apps", "batch", "autoscaling", "policy", "admissionregistration.k8s.io",
    "apiextensions.k8s.io", "apiregistration.k8s.io", "authentication.k8s.io",
    "authorization.k8s.io", "certificates.k8s.io", "coordination.k8s.io", "discovery.k8s.io",
    "events.k8s.io", "flowcontrol.apiserver.k8s.io", "internal.apiserver.k8s.io",
    "networking.k8s.io", "node.k8s.io", "rbac.authorization.k8s.io", "resource.k8s.io",
    "scheduling.k8s.io", "storage.k8s.io", "storagemigration.k8s.io",
})
BUILT_IN_SCALABLE_KINDS = frozenset({
    "replicationcontrollers", "deployments.apps", "statefulsets.apps", "replicasets.apps",
})
_RESOURCE = re.compile(r"^[a-z][a-z0-9]{0,62}$")
_GROUP = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
NAME_HASH_CHARS = 8


class InvalidKindError(ValueError):
    """A kind a queue cannot allow, with what to write instead."""


@dataclass(frozen=True, order=True)
class Kind:
    """A resource by its plural name and API group ("" for the core group)."""

    group: str
    resource: str

    @property
    def spelled(self) -> str:
        """As written in a queue's allowed kinds and the namespace annotation."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


def parse_kind(text: str) -> Kind:
    """`pods`, `deployments.apps`, `sparkapplications.sparkoperator.k8s.io` → Kind."""
    spelled = text.strip()
    resource, _, group = spelled.partition(".")
    if not _RESOURCE.match(resource) or (group and not _GROUP.match(group)):
        raise InvalidKindError(
            f"kind {text!r} is not a lower-case plural resource name with its API group, "
            "e.g. pods, services, deployments.apps, jobs.batch (no wildcards, no subresources)")
    kind = Kind(group=group, resource=resource)
    if kind.spelled in FORBIDDEN_KINDS:
        raise InvalidKindError(
            f"kind {kind.spelled!r} cannot be allowed: it is cluster-scoped or lockgate's own, "
            "so a coordinator must never create it")
    return kind


def normalise_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    """Kinds validated, without duplicates, sorted: the form stored and compared."""
    parsed = {parse_kind(kind) for kind in kinds}
    if not parsed:
        raise InvalidKindError("a queue must allow at least one kind (e.g. pods); "
                               "leave allowed_kinds unset for the default list")
    return tuple(kind.spelled for kind in sorted(parsed, key=lambda k: k.spelled))


def has_scale(kind: Kind) -> bool:
    """Whether the coordinator's Role grants `<kind>/scale`: for the built-in kinds that have
    that subresource, and for every custom resource.

    Decided from the kind, without asking the cluster. For a custom resource lockgate cannot
    know, without discovery, whether its CRD declares a scale subresource (the Dask operator's
    `daskworkergroups` does; Spark's `sparkapplications` does not), so it grants it to all of
    them: a rule naming a subresource that does not exist grants nothing, and scaling changes
    only the replica count of an object the coordinator may already update and patch in full
    (every verb on an allowed kind), so it adds no right. Asking discovery instead would make
    the Role depend on whether the CRD was installed (or upgraded) before the namespace was
    made, and put cluster reads into what is now a pure function of the queue's kinds.
    """
    if kind.group in BUILT_IN_GROUPS:
        return kind.spelled in BUILT_IN_SCALABLE_KINDS
    return True


def coordinator_rules(kinds: Sequence[str], *, create_any: bool) -> list[dict[str, Any]]:
    """The coordinator Role's rules for a queue allowing `kinds`.

    Every verb on the allowed kinds, and get/update/patch on the `scale` subresource of those
    that have one (`has_scale`: `kubectl scale`, a Dask cluster's adaptive workers); reading
    pods, their logs and Events (to watch its workers); and, with `create_any`, `create` on
    every other kind too. Why that: the apiserver authorizes before admission, so a creation
    RBAC refuses never reaches the admission policy that names the queue and its allowed kinds;
    with `create_any` RBAC lets creation through to `lockgate-allowed-kinds`, which refuses
    every kind (and subresource) not in the list, while reading, changing and deleting stay
    limited to the allowed kinds by RBAC alone. (Scaling is an update, which that policy does
    not judge: it is RBAC's alone.)
    """
    by_group: dict[str, list[str]] = {}
    scalable: dict[str, list[str]] = {}
    for kind in sorted({parse_kind(k) for k in kinds}):
        by_group.setdefault(kind.group, []).append(kind.resource)
        if has_scale(kind):
            scalable.setdefault(kind.group, []).append(f"{kind.resource}/scale")
    rules: list[dict[str, Any]] = [
        {"apiGroups": [group], "resources": resources, "verbs": list(FULL_VERBS)}
        for group, resources in sorted(by_group.items())
    ]
    rules += [
        {"apiGroups": [group], "resources": resources, "verbs": list(SCALE_VERBS)}
        for group, resources in sorted(scalable.items())
    ]
    rules += [
        {"apiGroups": [""], "resources": ["pods", "pods/log", "events"],
         "verbs": list(READ_VERBS)},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": list(READ_VERBS)},
    ]
    if create_any:
        rules.append({"apiGroups": ["*"], "resources": ["*"], "verbs": ["create"]})
    return rules


def namespace_name(*, queue: str, jobset: str, prefix: str = "") -> str:
    """The namespace of (queue, job set): the same for every retry of one request.

    Readable (prefix, queue, job set squeezed into a DNS label) and exact (a hash of the three,
    so `a-b`/`c` and `a`/`b-c` differ, and job sets with `_` or capitals fit).
    """
    digest = hashlib.sha256(f"{prefix}\0{queue}\0{jobset}".encode()).hexdigest()
    readable = re.sub(r"[^a-z0-9-]+", "-", f"{prefix}{queue}-{jobset}".lower()).strip("-")
    readable = re.sub(r"-+", "-", readable)[:63 - NAME_HASH_CHARS - 1].strip("-")
    return f"{readable}-{digest[:NAME_HASH_CHARS]}" if readable else digest[:NAME_HASH_CHARS]


def namespace_labels(*, queue: str, jobset: str,
                     extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**(extra or {}), **MANAGED_BY, MANAGED_NAMESPACE_LABEL: "true", QUEUE_LABEL: queue,
            JOBSET_LABEL: jobset, EPHEMERAL_LABEL: "true"}


def namespace_object(*, name: str, queue: str, jobset: str, kinds: Sequence[str],
                     extra_labels: Mapping[str, str] | None = None,
                     extra_annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`extra_annotations`: the job set's maximum time queued (lockgate.max_queued), which the
    webhook stamps on the namespace's pods."""
    return {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name,
                     "labels": namespace_labels(queue=queue, jobset=jobset, extra=extra_labels),
                     "annotations": {**(extra_annotations or {}),
                                     ALLOWED_KINDS_ANNOTATION: ",".join(kinds)}},
    }


def service_account_object(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": COORDINATOR, "namespace": namespace, "labels": MANAGED_BY}}


def role_object(namespace: str, kinds: Sequence[str], *, create_any: bool) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": COORDINATOR, "namespace": namespace, "labels": MANAGED_BY},
            "rules": coordinator_rules(kinds, create_any=create_any)}


def role_binding_object(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": COORDINATOR, "namespace": namespace, "labels": MANAGED_BY},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": COORDINATOR},
            "subjects": [{"kind": "ServiceAccount", "name": COORDINATOR,
                          "namespace": namespace}]}


def is_lockgate_namespace(obj: Mapping[str, Any], *, queue: str, jobset: str) -> bool:
    """Whether an existing namespace is the one lockgate made for (queue, job set), rather than
    one somebody else created under the same name first."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return (labels.get(EPHEMERAL_LABEL) == "true" and labels.get(QUEUE_LABEL) == queue
            and labels.get(JOBSET_LABEL) == jobset)


def coordinator_kubeconfig(*, cluster: str, server: str, ca_data: str | None, namespace: str,
                           token: str) -> dict[str, Any]:
    """A kubeconfig holding the coordinator's token, its namespace as the default."""
    entry: dict[str, Any] = {"server": server}
    if ca_data:
        entry["certificate-authority-data"] = ca_data
    user = f"{COORDINATOR}@{namespace}"
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": namespace,
        "clusters": [{"name": cluster, "cluster": entry}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": namespace, "context": {"cluster": cluster, "user": user,
                                                     "namespace": namespace}}],
    }
