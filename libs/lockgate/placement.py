"""Placement as kube-scheduler sees it: may a pod land on a node at all, whatever the room?

Why here: lockgate releases a pod only where kube-scheduler would put it. Room is one half of
that (see `lockgate.scheduler.room`); the other half is the node filters a pod carries: taints and
tolerations, nodeSelector and required node affinity. They are matched here, purely, with
kube-scheduler's semantics (the TaintToleration, NodeAffinity plugins and
`k8s.io/component-helpers/scheduling/corev1`), so the scheduler, the watcher and the tests agree:

- Taints with effect NoSchedule or NoExecute keep out every pod that does not tolerate them;
  PreferNoSchedule only steers scoring and filters nothing.
- A toleration matches a taint when its effect is empty or equal, its key is empty (operator
  Exists only) or equal, and, for operator Equal (the default), its value is equal.
- nodeSelector: every pair must be a label of the node.
- Required node affinity: the terms are ORed, the requirements within a term ANDed; an empty
  term matches nothing. Operators In, NotIn, Exists, DoesNotExist, Gt and Lt (the label parsed as
  a 64-bit integer) on labels, In and NotIn on the field `metadata.name`. An operator this code
  does not know matches nothing: lockgate would rather keep a pod gated than release it where
  kube-scheduler refuses it.

What is not modelled (inter-pod affinity, topology spread, preferred affinity, ports, volumes)
is listed in docs/scheduling.md with what happens to such pods.

The models are the wire format too: `PodPlacement` travels in `lockgate.events.PodEvent`, `Taint`
and node labels in `NodeCapacity`. They are frozen and made of tuples, so the scheduler can intern
them (a million pods typically share a handful of placements).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

# The effects that filter: kube-scheduler never places a pod on a node with such a taint it does
# not tolerate. (NoExecute also evicts running pods; PreferNoSchedule only lowers the score.)
FILTERING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# Taints kubeadm and most installers put on control-plane nodes: such nodes are no capacity for
# the pool's fair shares (only pods that tolerate them may land there).
CONTROL_PLANE_TAINT_KEYS = frozenset(
    {"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"}
)
_INT64 = (-(2**63), 2**63 - 1)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Label(_Model):
    key: str
    value: str = ""


class Taint(_Model):
    key: str
    value: str = ""
    effect: str

    @property
    def filters(self) -> bool:
        return self.effect in FILTERING_EFFECTS


class Toleration(_Model):
    key: str = ""
    operator: str = "Equal"  # "" in the pod spec means Equal too
    value: str = ""
    effect: str = ""  # empty: every effect


class Requirement(_Model):
    """One matchExpressions or matchFields entry of a node selector term."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


class SelectorTerm(_Model):
    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()


class PodPlacement(_Model):
    """What of a pod's spec filters nodes. `required_terms` None: no required node affinity."""

    tolerations: tuple[Toleration, ...] = ()
    node_selector: tuple[Label, ...] = ()
    required_terms: tuple[SelectorTerm, ...] | None = None


class NodeTraits:
    """A node's name, labels and filtering taints, in the form the matching reads fast.

    Hashable by content: the scheduler groups nodes by (size, traits).
    """

    __slots__ = ("_key", "labels", "name", "taints")

    def __init__(self, name: str, labels: Mapping[str, str], taints: Iterable[Taint]) -> None:
        self.name = name
        self.labels = dict(labels)
        self.taints = tuple(t for t in taints if t.filters)
        self._key = (name, frozenset(self.labels.items()), self.taints)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeTraits) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"NodeTraits({self.name!r}, {self.labels!r}, {self.taints!r})"


# ---- matching -------------------------------------------------------------------------------

def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """kube-scheduler's `Toleration.ToleratesTaint`."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in ("", "Equal"):
        return toleration.value == taint.value
    return toleration.operator == "Exists"


def untolerated_taint(placement: PodPlacement | None, taints: Iterable[Taint]) -> Taint | None:
    """The first NoSchedule/NoExecute taint the pod does not tolerate, if any."""
    tolerations = () if placement is None else placement.tolerations
    for taint in taints:
        if taint.filters and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _as_int64(text: str) -> int | None:
    try:
        value = int(text.strip(), 10)
    except ValueError:
        return None
    return value if _INT64[0] <= value <= _INT64[1] else None


def requirement_matches(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    """One label requirement (`nodeaffinity`'s NodeSelectorRequirementsAsSelector semantics)."""
    present = requirement.key in labels
    value = labels.get(requirement.key, "")
    match requirement.operator:
        case "In":
            return present and value in requirement.values
        case "NotIn":
            return not present or value not in requirement.values
        case "Exists":
            return present
        case "DoesNotExist":
            return not present
        case "Gt" | "Lt":
            if not present or len(requirement.values) != 1:
                return False
            have, bound = _as_int64(value), _as_int64(requirement.values[0])
            if have is None or bound is None:
                return False
            return have > bound if requirement.operator == "Gt" else have < bound
    return False


def field_matches(requirement: Requirement, node_name: str) -> bool:
    """A matchFields entry: only `metadata.name` with In or NotIn exists."""
    if requirement.key != "metadata.name":
        return False
    if requirement.operator == "In":
        return node_name in requirement.values
    if requirement.operator == "NotIn":
        return node_name not in requirement.values
    return False


def term_matches(term: SelectorTerm, node: NodeTraits) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False  # an empty term matches no objects
    return all(requirement_matches(r, node.labels) for r in term.match_expressions) and all(
        field_matches(r, node.name) for r in term.match_fields
    )


def why_not(placement: PodPlacement | None, node: NodeTraits) -> str | None:
    """Why kube-scheduler would not place the pod on the node (None: the filters pass)."""
    taint = untolerated_taint(placement, node.taints)
    if taint is not None:
        value = f"={taint.value}" if taint.value else ""
        return f"untolerated taint {taint.key}{value}:{taint.effect}"
    if placement is None:
        return None
    for label in placement.node_selector:
        if node.labels.get(label.key) != label.value:
            return f"nodeSelector {label.key}={label.value} does not match"
    terms = placement.required_terms
    if terms is not None and not any(term_matches(term, node) for term in terms):
        return "required node affinity does not match"
    return None


def can_land(placement: PodPlacement | None, node: NodeTraits) -> bool:
    """Whether the pod passes the node's taint, nodeSelector and required-affinity filters."""
    return why_not(placement, node) is None


def is_control_plane(taints: Iterable[Taint]) -> bool:
    """A node tainted as a control plane (NoSchedule/NoExecute)."""
    return any(t.filters and t.key in CONTROL_PLANE_TAINT_KEYS for t in taints)


# ---- reading Kubernetes objects (their JSON form) -------------------------------------------

def _requirements(items: Any) -> tuple[Requirement, ...]:
    return tuple(
        Requirement(key=str(item.get("key", "")), operator=str(item.get("operator", "")),
                    values=tuple(str(v) for v in item.get("values") or ()))
        for item in items or ()
    )


def placement_of_pod(spec: Mapping[str, Any]) -> PodPlacement | None:
    """The filters a pod spec carries; None when it carries none (no tolerations either)."""
    tolerations = tuple(
        Toleration(key=str(t.get("key") or ""), operator=str(t.get("operator") or "Equal"),
                   value=str(t.get("value") or ""), effect=str(t.get("effect") or ""))
        for t in spec.get("tolerations") or ()
    )
    selector = tuple(
        Label(key=str(k), value=str(v)) for k, v in sorted((spec.get("nodeSelector") or {}).items())
    )
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms: tuple[SelectorTerm, ...] | None = None
    if required is not None:
        terms = tuple(
            SelectorTerm(match_expressions=_requirements(term.get("matchExpressions")),
                         match_fields=_requirements(term.get("matchFields")))
            for term in required.get("nodeSelectorTerms") or ()
        )
    if not tolerations and not selector and terms is None:
        return None
    return PodPlacement(tolerations=tolerations, node_selector=selector, required_terms=terms)


def taints_of_node(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """Every taint of a node (PreferNoSchedule included: it is reported, it just never filters)."""
    return tuple(
        Taint(key=str(t.get("key", "")), value=str(t.get("value") or ""),
              effect=str(t.get("effect", "")))
        for t in (node.get("spec") or {}).get("taints") or ()
    )


def labels_of_node(node: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in ((node.get("metadata") or {}).get("labels") or {}).items()}
