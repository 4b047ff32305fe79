"""Queues: who shares the clusters, with what weight, within which limits, from which namespaces.

Why namespaces are part of a queue: a label names a queue, and anyone who can create a pod can
write any label. Without a binding, team A could run under team B's queue. A queue therefore
says which namespaces (per cluster, by name or label selector) may use it, and a queue with no
binding may be used by no namespace: nothing is open until an operator opens it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lockgate.groups import GroupTimeoutAction
from lockgate.labels import validate_label_value, validate_queue_name
from lockgate.namespace_access import (  # DEFAULT_ALLOWED_KINDS: migration 005 names it here
    DEFAULT_ALLOWED_KINDS as DEFAULT_ALLOWED_KINDS,
)
from lockgate.namespace_access import InvalidKindError, normalise_kinds
from lockgate.resources import InvalidQuantityError, Resources, canonical_amount

ANY_CLUSTER = "*"
_SET_OPERATORS = ("In", "NotIn")


class SelectorRequirement(BaseModel):
    """One `matchExpressions` entry of a Kubernetes label selector."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=1, max_length=317)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> SelectorRequirement:
        if self.operator in _SET_OPERATORS and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator not in _SET_OPERATORS and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        for value in self.values:
            validate_label_value(self.key, value)
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values


class LabelSelector(BaseModel):
    """A Kubernetes label selector; it matches when every term matches."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[SelectorRequirement, ...] = Field(default=(),
                                                               alias="matchExpressions")

    @model_validator(mode="after")
    def _not_everything(self) -> LabelSelector:
        # An empty selector matches every namespace: write that on purpose (Exists on a label
        # every namespace has, kubernetes.io/metadata.name), not by omission.
        if not self.match_labels and not self.match_expressions:
            raise ValueError("an empty selector would match every namespace; "
                             "give matchLabels or matchExpressions")
        for key, value in self.match_labels.items():
            validate_label_value(key, value)
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.match_labels.items()) and all(
            requirement.matches(labels) for requirement in self.match_expressions)


class NamespaceBinding(BaseModel):
    """Namespaces of one cluster (or every cluster, "*") allowed to use a queue."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str = Field(default=ANY_CLUSTER, min_length=1, max_length=253)
    names: tuple[str, ...] = ()
    selector: LabelSelector | None = None

    @model_validator(mode="after")
    def _names_or_selector(self) -> NamespaceBinding:
        if not self.names and self.selector is None:
            raise ValueError("a namespace binding needs names, a selector, or both")
        return self

    def allows(self, *, cluster: str, namespace: str, labels: Mapping[str, str]) -> bool:
        if self.cluster not in (ANY_CLUSTER, cluster):
            return False
        if namespace in self.names:
            return True
        return self.selector is not None and self.selector.matches(labels)

    def describe(self) -> str:
        parts = list(self.names)
        if self.selector is not None:
            terms = [f"{k}={v}" for k, v in sorted(self.selector.match_labels.items())]
            terms += [f"{r.key} {r.operator} ({','.join(r.values)})".replace(" ()", "")
                      for r in self.selector.match_expressions]
            parts.append("selector " + ",".join(terms))
        return f"{self.cluster}: {'; '.join(parts)}"


class MaxQueued(BaseModel):
    """How long a pod of the queue may wait gated, and what becomes of it after that.

    "fail": its status is set to Failed with the reason (a Job counts a failed pod, a
    ReplicaSet replaces it); "delete": it is deleted (its controller creates another one, or
    counts it as failed). Either way its owner sees an outcome, never an eternal Pending.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    seconds: float = Field(gt=0, le=366 * 86400)
    action: Literal["fail", "delete"] = "fail"


class QueueSpec(BaseModel):
    """A queue as an operator defines it.

    `priority_factor` follows Armada: a queue's weight is 1 / priority_factor, so a queue with
    factor 0.5 gets twice the share of a queue with factor 1. `resource_limits` caps what the
    queue may hold across all clusters at once, as Kubernetes quantities.

    The queue tree (lockgate.queue_tree, docs/scheduling.md "Hierarchical fair targets"):
    `parent` names the queue it hangs from (None: a child of the root, as every queue was
    before trees); its weight divides the parent's share among its siblings. `guarantee` is
    what the queue (and its subtree) gets when it asks for it, as Kubernetes quantities. A
    tree node's *limit* is `resource_limits`: one word, one meaning, whether the queue is a
    leaf (what its pods hold) or an inner node (what its subtree's pods hold together,
    borrowing included). Only a leaf holds pods and binds namespaces.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    priority_factor: float = Field(default=1.0, gt=0, le=1_000_000)
    cordoned: bool = False
    resource_limits: dict[str, str] = Field(default_factory=dict)
    # The queue tree: the parent queue (None: a child of the root) and the guarantee.
    parent: str | None = None
    guarantee: dict[str, str] = Field(default_factory=dict)
    # Empty: no namespace may use the queue (secure default; see docs/admission.md).
    namespaces: tuple[NamespaceBinding, ...] = ()
    # None: pods wait as long as it takes.
    max_queued: MaxQueued | None = None
    # Pod groups (lockgate.groups): a group of this queue that has not filled up this long after
    # its first member was created times out, and its members are deleted or failed. None: never.
    group_timeout_seconds: float | None = Field(default=None, gt=0, le=30 * 86400)
    group_timeout_action: GroupTimeoutAction = GroupTimeoutAction.DELETE
    # What a coordinator may create in the queue's ephemeral namespaces (lockgate.namespace_access);
    # None: DEFAULT_ALLOWED_KINDS.
    allowed_kinds: tuple[str, ...] | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return validate_queue_name(name)

    @field_validator("parent")
    @classmethod
    def _valid_parent(cls, parent: str | None) -> str | None:
        return None if parent is None else validate_queue_name(parent)

    @field_validator("guarantee")
    @classmethod
    def _valid_guarantee(cls, guarantee: dict[str, str]) -> dict[str, str]:
        for resource, quantity in guarantee.items():
            try:
                canonical_amount(resource, quantity)
            except InvalidQuantityError as error:
                raise ValueError(f"guarantee {resource}: {error}") from error
        return guarantee

    @model_validator(mode="after")
    def _not_its_own_parent(self) -> QueueSpec:
        if self.parent == self.name:
            raise ValueError(f"queue {self.name!r} cannot be its own parent")
        return self

    @field_validator("allowed_kinds")
    @classmethod
    def _valid_kinds(cls, kinds: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if kinds is None:
            return None
        try:
            return normalise_kinds(kinds)
        except InvalidKindError as error:
            raise ValueError(str(error)) from error

    @property
    def effective_allowed_kinds(self) -> tuple[str, ...]:
        return self.allowed_kinds if self.allowed_kinds is not None else DEFAULT_ALLOWED_KINDS

    @field_validator("resource_limits")
    @classmethod
    def _valid_limits(cls, limits: dict[str, str]) -> dict[str, str]:
        for resource, quantity in limits.items():
            try:
                canonical_amount(resource, quantity)
            except InvalidQuantityError as error:
                raise ValueError(f"resource limit {resource}: {error}") from error
        return limits

    def allows(self, *, cluster: str, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether pods of `namespace` (with `labels`) in `cluster` may name this queue."""
        return any(binding.allows(cluster=cluster, namespace=namespace, labels=labels)
                   for binding in self.namespaces)

    def namespaces_json(self) -> list[dict[str, object]]:
        """The bindings as stored and served: Kubernetes' spelling (matchLabels, ...)."""
        return [binding.model_dump(mode="json", by_alias=True, exclude_none=True)
                for binding in self.namespaces]

    @property
    def weight(self) -> float:
        return 1.0 / self.priority_factor

    @property
    def limits(self) -> Resources:
        return Resources.from_kubernetes(self.resource_limits)

    @property
    def guaranteed(self) -> Resources:
        """The guarantee in canonical units (cpu in millicores)."""
        return Resources.from_kubernetes(self.guarantee)
