"""The `Queue` custom resource: lockgate's queues as copied into every worker cluster.

Why a copy per cluster: the admission webhook must not need a database (or any network beyond
its own cluster's apiserver) to admit a pod, so queue-store writes each queue as a cluster-scoped
`Queue` object (`lockgate.io/v1alpha1`, k8s/base/queue-crd.yaml) and the webhook reads them from
its apiserver. This module converts in both directions and says what must change, without I/O.

Several lockgate installations (a test run beside another) may copy into the same cluster: each
labels its objects with `lockgate.io/queue-source=<instance>`, may prefix their names, and only
ever touches objects carrying its own label.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from lockgate.labels import DOMAIN
from lockgate.queues import ANY_CLUSTER, QueueSpec

GROUP = DOMAIN
VERSION = "v1alpha1"
PLURAL = "queues"
KIND = "Queue"
API_VERSION = f"{GROUP}/{VERSION}"
SOURCE_LABEL = f"{DOMAIN}/queue-source"
DEFAULT_SOURCE = "lockgate"


class InvalidQueueCopyError(ValueError):
    """A Queue object lockgate cannot read back (edited by hand, or a newer schema)."""


def object_name(queue: str, *, prefix: str = "") -> str:
    return f"{prefix}{queue}"


def desired_spec(spec: QueueSpec, *,
                 ephemeral_namespaces: Sequence[str] = ()) -> dict[str, Any]:
    """The `spec` of the Queue object for `spec` in a cluster where `ephemeral_namespaces`
    (active, created by lockgate for this queue: `lockgate.namespace_access`) may use it."""
    return {
        "queueName": spec.name,
        "priorityFactor": spec.priority_factor,
        "weight": spec.weight,
        "cordoned": spec.cordoned,
        "resourceLimits": dict(spec.resource_limits),
        "namespaces": spec.namespaces_json(),
        "ephemeralNamespaces": sorted(ephemeral_namespaces),
        # The queue tree, only when set: a flat queue's copy stays as it was (no rewrite).
        # The webhook reads `parent` so that a copy says what the queue is; an inner node binds
        # no namespace (the admin API refuses it), so the webhook admits no pod to it.
        **({"parent": spec.parent} if spec.parent is not None else {}),
        **({"guarantee": dict(spec.guarantee)} if spec.guarantee else {}),
        # Only when set: absent means the default list (which may change with lockgate).
        **({"allowedKinds": list(spec.allowed_kinds)} if spec.allowed_kinds is not None else {}),
    }


def desired_object(spec: QueueSpec, *, source: str, prefix: str = "",
                   ephemeral_namespaces: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": object_name(spec.name, prefix=prefix),
                     "labels": {SOURCE_LABEL: source,
                                "app.kubernetes.io/managed-by": "lockgate"}},
        "spec": desired_spec(spec, ephemeral_namespaces=ephemeral_namespaces),
    }


SYNC_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def status_of(spec: QueueSpec, *, generation: int, synced_at: datetime) -> dict[str, Any]:
    return {
        "observedGeneration": generation,
        "lastSyncTime": synced_at.strftime(SYNC_TIME_FORMAT),
        "state": "Cordoned" if spec.cordoned else "Open",
        "namespaces": "; ".join(b.describe() for b in spec.namespaces) or "(none)",
    }


def status_is_current(stored: object, wanted: Mapping[str, Any], *, now: datetime,
                      max_age_seconds: float) -> bool:
    """Whether a Queue's stored status says what `wanted` says, synced within the last
    `max_age_seconds`: then a pass need not write it again."""
    if not isinstance(stored, Mapping):
        return False
    if any(stored.get(key) != value for key, value in wanted.items() if key != "lastSyncTime"):
        return False
    try:
        synced = datetime.strptime(str(stored.get("lastSyncTime")), SYNC_TIME_FORMAT)
    except ValueError:
        return False
    return (now - synced.replace(tzinfo=UTC)).total_seconds() < max_age_seconds


def spec_from_object(obj: Mapping[str, Any]) -> QueueSpec:
    """The queue a Queue object describes (what the webhook decides from).

    Its ephemeral namespaces become one more binding by name: the object lives in their cluster
    only, so "*" means this cluster.
    """
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidQueueCopyError("Queue object has no spec")
    bindings = list(spec.get("namespaces") or [])
    ephemeral = spec.get("ephemeralNamespaces") or []
    if ephemeral:
        bindings.append({"cluster": ANY_CLUSTER, "names": ephemeral})
    try:
        return QueueSpec.model_validate({
            "name": spec.get("queueName"),
            "priority_factor": spec.get("priorityFactor", 1.0),
            "cordoned": bool(spec.get("cordoned", False)),
            "resource_limits": spec.get("resourceLimits") or {},
            "parent": spec.get("parent") or None,
            "guarantee": spec.get("guarantee") or {},
            "namespaces": bindings,
            "allowed_kinds": spec.get("allowedKinds") or None,
        })
    except ValidationError as error:
        name = (obj.get("metadata") or {}).get("name")
        raise InvalidQueueCopyError(f"Queue {name}: {error}") from error


@dataclass(frozen=True)
class SyncPlan:
    """What to do in one cluster so its copies match the queues: by object name."""

    create: tuple[dict[str, Any], ...]
    replace: tuple[dict[str, Any], ...]  # carry the current resourceVersion
    delete: tuple[str, ...]
    unchanged: tuple[str, ...]


def plan_sync(queues: Iterable[QueueSpec], existing: Iterable[Mapping[str, Any]], *,
              source: str, prefix: str = "",
              ephemeral: Mapping[str, Sequence[str]] | None = None) -> SyncPlan:
    """Compare `queues` (Postgres, not deleted) with `existing` (this source's objects);
    `ephemeral`: queue → this cluster's active ephemeral namespaces of it."""
    wanted = {object_name(q.name, prefix=prefix): desired_object(
        q, source=source, prefix=prefix, ephemeral_namespaces=(ephemeral or {}).get(q.name, ()))
              for q in queues}
    current = {str((o.get("metadata") or {}).get("name")): o for o in existing
               if ((o.get("metadata") or {}).get("labels") or {}).get(SOURCE_LABEL) == source}
    create, replace, unchanged = [], [], []
    for name, obj in sorted(wanted.items()):
        found = current.get(name)
        if found is None:
            create.append(obj)
        elif found.get("spec") != obj["spec"] or any(
                ((found.get("metadata") or {}).get("labels") or {}).get(k) != v
                for k, v in obj["metadata"]["labels"].items()):
            version = (found.get("metadata") or {}).get("resourceVersion")
            replace.append({**obj, "metadata": {**obj["metadata"], "resourceVersion": version}})
        else:
            unchanged.append(name)
    delete = tuple(sorted(name for name in current if name not in wanted))
    return SyncPlan(tuple(create), tuple(replace), delete, tuple(unchanged))
