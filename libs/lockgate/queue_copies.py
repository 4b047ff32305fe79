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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from lockgate.labels import DOMAIN
from lockgate.queues import QueueSpec

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


def desired_spec(spec: QueueSpec) -> dict[str, Any]:
    """The `spec` of the Queue object for `spec`."""
    return {
        "queueName": spec.name,
        "priorityFactor": spec.priority_factor,
        "weight": spec.weight,
        "cordoned": spec.cordoned,
        "resourceLimits": dict(spec.resource_limits),
        "namespaces": spec.namespaces_json(),
    }


def desired_object(spec: QueueSpec, *, source: str, prefix: str = "") -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": object_name(spec.name, prefix=prefix),
                     "labels": {SOURCE_LABEL: source,
                                "app.kubernetes.io/managed-by": "lockgate"}},
        "spec": desired_spec(spec),
    }


def status_of(spec: QueueSpec, *, generation: int, synced_at: datetime) -> dict[str, Any]:
    return {
        "observedGeneration": generation,
        "lastSyncTime": synced_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "state": "Cordoned" if spec.cordoned else "Open",
        "namespaces": "; ".join(b.describe() for b in spec.namespaces) or "(none)",
    }


def spec_from_object(obj: Mapping[str, Any]) -> QueueSpec:
    """The queue a Queue object describes (what the webhook decides from)."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidQueueCopyError("Queue object has no spec")
    try:
        return QueueSpec.model_validate({
            "name": spec.get("queueName"),
            "priority_factor": spec.get("priorityFactor", 1.0),
            "cordoned": bool(spec.get("cordoned", False)),
            "resource_limits": spec.get("resourceLimits") or {},
            "namespaces": spec.get("namespaces") or [],
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
              source: str, prefix: str = "") -> SyncPlan:
    """Compare `queues` (Postgres, not deleted) with `existing` (this source's objects)."""
    wanted = {object_name(q.name, prefix=prefix): desired_object(q, source=source, prefix=prefix)
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
