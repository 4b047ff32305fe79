"""The names lockgate writes on Kubernetes objects, and validation of their values.

Why: the webhook, the watcher and the ungater must agree on these strings exactly, and a user
who sets an invalid value must get a message that says what to set instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

DOMAIN = "lockgate.io"
SCHEDULING_GATE = f"{DOMAIN}/admission"
MANAGED_NAMESPACE_LABEL = f"{DOMAIN}/managed"
QUEUE_LABEL = f"{DOMAIN}/queue"
JOBSET_LABEL = f"{DOMAIN}/jobset"
PRIORITY_LABEL = f"{DOMAIN}/priority"
# "true": the pod may be evicted to give another queue its fair share
# (lockgate.scheduler.preemption).
PREEMPTIBLE_LABEL = f"{DOMAIN}/preemptible"
# Annotation the webhook leaves so a pod says where its labels came from.
LABEL_SOURCE_ANNOTATION = f"{DOMAIN}/labels-from"
# W3C traceparent of the admission review that gated the pod, so the pod's own trace (whose id is
# its uid, unknown at admission) can link back to the webhook's span.
ADMISSION_TRACE_ANNOTATION = f"{DOMAIN}/admission-trace"
DEFAULT_JOBSET = "default"
NEVER_MANAGED_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUEUE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class InvalidLabelError(ValueError):
    """A lockgate label whose value Kubernetes or lockgate would not accept."""


def validate_label_value(key: str, value: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise InvalidLabelError(
            f"label {key}={value!r} is not a valid label value: use at most 63 characters, "
            "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        )
    return value


def validate_queue_name(name: str) -> str:
    if not _QUEUE_NAME.match(name):
        raise InvalidLabelError(
            f"queue name {name!r} is invalid: use 1-63 lowercase alphanumerics or '-', "
            "starting and ending with an alphanumeric"
        )
    return name


def is_managed_namespace(name: str, namespace_labels: Mapping[str, str],
                         required: Mapping[str, str] | None = None) -> bool:
    """Whether pods of the namespace are lockgate's. `required`: labels it must carry too, so
    installations sharing a cluster (each webhook registered for its own label) never take
    each other's pods."""
    if name in NEVER_MANAGED_NAMESPACES:
        return False
    if namespace_labels.get(MANAGED_NAMESPACE_LABEL) != "true":
        return False
    return all(namespace_labels.get(key) == value for key, value in (required or {}).items())


def why_not_served(cluster: str, name: str, namespace_labels: Mapping[str, str] | None,
                   required: Mapping[str, str] | None = None) -> str | None:
    """Why lockgate's webhook will not gate pods of a namespace bound to a queue (None: it
    will), with what to do. `namespace_labels` None: the namespace does not exist (yet);
    `required`: the labels the webhook registration's namespaceSelector asks for besides
    lockgate.io/managed=true (lockgate.io/run=dev under `make run`)."""
    wanted = {MANAGED_NAMESPACE_LABEL: "true", **(required or {})}
    terms = " ".join(f"{key}={value}" for key, value in wanted.items())
    if name in NEVER_MANAGED_NAMESPACES:
        return (f"namespace {cluster}/{name} is never managed: lockgate's webhook never gates "
                "pods there")
    if namespace_labels is None:
        return (f"namespace {cluster}/{name} does not exist yet: create it labelled {terms}, "
                "or lockgate's webhook will not serve it and its pods will run without waiting "
                "their turn")
    missing = {key: value for key, value in wanted.items()
               if namespace_labels.get(key) != value}
    if not missing:
        return None
    fix = " ".join(f"{key}={value}" for key, value in missing.items())
    return (f"lockgate's webhook does not serve namespace {cluster}/{name}: it serves only "
            f"namespaces labelled {terms}, and this one lacks {fix}. Its pods will run without "
            f"waiting their turn (lockgate reports them as having skipped the gate). Label it: "
            f"kubectl label namespace {name} {fix}")


def resolve_label(
    key: str, sources: Sequence[tuple[str, Mapping[str, str]]]
) -> tuple[str, str] | None:
    """The first value of `key` in `sources` (pod, then owners, then namespace) and its source."""
    for source_name, labels in sources:
        value = labels.get(key)
        if value:
            return validate_label_value(key, value), source_name
    return None
