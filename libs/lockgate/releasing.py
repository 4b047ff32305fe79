"""Releasing a pod: the JSON patch that removes lockgate's gate, and what each answer means.

Why pure: the ungater's correctness rests on three small decisions — which patch to send, what a
pod read from the apiserver says about the release, and which API failures are worth retrying —
and all three must be testable without an apiserver.

The patch removes lockgate's gate by index, guarded by `test` operations on the pod's uid and on
the name at that index. The apiserver applies the operations atomically against the newest
object, so a patch built from a stale read (another controller removed its own gate first, the
pod was replaced under the same name, a duplicate command already removed ours) fails as a whole
instead of removing somebody else's gate. The caller then re-reads and plans again.

A release may also narrow the pod's required node affinity (`ReleaseCommand.node_requirements`:
a release for growth names the size of node its pool is to make). Kubernetes lets a pod that
still has scheduling gates gain node affinity requirements ANDed into each existing term (or
gain required node affinity when it has none; KEP-3838), and it judges that against the pod as
it was, gate on, so the narrowing and the gate's removal go in one patch, guarded by the pod's
resourceVersion too (the affinity read is the one extended). A requirement a term already holds
is not added again, and a pod whose gate is gone is settled before any narrowing: a command
consumed twice adds nothing twice. If the apiserver refuses the narrowing (the pod unchanged,
the same patch refused), the pod is released without it: never left gated for its sake.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from lockgate.events import ReleaseCommand, ReleaseOutcome, ReleaseOutcomeKind
from lockgate.labels import SCHEDULING_GATE
from lockgate.placement import Requirement

JsonPatch = list[dict[str, Any]]


@dataclass(frozen=True)
class PodGates:
    """What the ungater needs of a pod read from the apiserver."""

    uid: str
    gates: tuple[str, ...]
    being_deleted: bool = False
    resource_version: str = ""
    node_name: str = ""  # set once the pod is bound
    # spec.affinity as read (None: absent); only a release that narrows it looks inside.
    affinity: Mapping[str, Any] | None = None

    @classmethod
    def from_json(cls, pod: Mapping[str, Any]) -> PodGates:
        """Read from the apiserver's JSON for a pod (not a client model)."""
        metadata = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        return cls(
            uid=str(metadata.get("uid", "")),
            gates=tuple(str(gate.get("name", "")) for gate in spec.get("schedulingGates") or ()),
            being_deleted=metadata.get("deletionTimestamp") is not None,
            resource_version=str(metadata.get("resourceVersion", "")),
            node_name=str(spec.get("nodeName") or ""),
            affinity=spec.get("affinity") or None,
        )


def gate_index(gates: Sequence[str], gate: str = SCHEDULING_GATE) -> int | None:
    """Where `gate` sits among a pod's scheduling gates, or None when it is not there."""
    for index, name in enumerate(gates):
        if name == gate:
            return index
    return None


def ungate_patch(*, uid: str, index: int, gate: str = SCHEDULING_GATE) -> JsonPatch:
    """Remove the gate at `index`, only if the pod is still `uid` and that gate is still ours."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": gate},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]


def requirement_json(requirement: Requirement) -> dict[str, Any]:
    """A matchExpressions entry as the apiserver writes it."""
    entry: dict[str, Any] = {"key": requirement.key, "operator": requirement.operator}
    if requirement.values:
        entry["values"] = list(requirement.values)
    return entry


def describe_requirements(requirements: Sequence[Requirement]) -> str:
    """"karpenter.kwok.sh/instance-cpu NotIn [4, 8]", for logs and reasons."""
    return "; ".join(f"{r.key} {r.operator} [{', '.join(r.values)}]" for r in requirements)


def _holds(expressions: Sequence[Mapping[str, Any]], requirement: Requirement) -> bool:
    """Whether a term's matchExpressions already hold `requirement` (values in any order)."""
    return any(
        expression.get("key") == requirement.key
        and expression.get("operator") == requirement.operator
        and sorted(str(v) for v in expression.get("values") or ()) == sorted(requirement.values)
        for expression in expressions)


def narrow_affinity_ops(affinity: Mapping[str, Any] | None,
                        requirements: Sequence[Requirement]) -> JsonPatch:
    """JSON patch operations that AND `requirements` into every term of the pod's required node
    affinity (or give it one term of them when it has none); [] when every term holds them."""
    if not requirements:
        return []
    wanted = [requirement_json(requirement) for requirement in requirements]
    if affinity is None:
        return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": wanted}]}}}}]
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": wanted}]}}}]
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = (required or {}).get("nodeSelectorTerms") or []
    base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
    if not terms:
        return [{"op": "add", "path": base,
                 "value": {"nodeSelectorTerms": [{"matchExpressions": wanted}]}}]
    ops: JsonPatch = []
    for index, term in enumerate(terms):
        expressions = term.get("matchExpressions")
        missing = [entry for requirement, entry in zip(requirements, wanted, strict=True)
                   if not _holds(expressions or (), requirement)]
        if not missing:
            continue
        path = f"{base}/nodeSelectorTerms/{index}/matchExpressions"
        if expressions is None:
            ops.append({"op": "add", "path": path, "value": missing})
        else:
            ops.extend({"op": "add", "path": f"{path}/-", "value": entry} for entry in missing)
    return ops


@dataclass(frozen=True)
class Settled:
    """The release needs no (more) patching: this is its outcome."""

    outcome: ReleaseOutcomeKind
    reason: str


@dataclass(frozen=True)
class PatchNeeded:
    """Send this patch; a test failure means the pod changed since it was read."""

    patch: JsonPatch
    # The pod's resourceVersion when the patch narrows its node affinity ("": it does not).
    narrows_at: str = ""


def plan_release(*, uid: str, pod: PodGates | None, gate: str = SCHEDULING_GATE,
                 requirements: Sequence[Requirement] = (), narrowing_refused: bool = False,
                 ) -> Settled | PatchNeeded:
    """What to do for a release command of pod `uid`, given the pod as just read (None: 404).

    `requirements`: node affinity to AND in while the gate is removed; `narrowing_refused`:
    the apiserver refused that narrowing of this very pod, so release it without."""
    if pod is None:
        return Settled(ReleaseOutcomeKind.POD_GONE, "pod not found")
    if pod.uid != uid:
        return Settled(ReleaseOutcomeKind.POD_GONE,
                       f"pod was replaced under the same name (uid {pod.uid})")
    index = gate_index(pod.gates, gate)
    if index is None:
        # A repeated command, or a patch whose response was lost: the work is already done.
        return Settled(ReleaseOutcomeKind.UNGATED, "gate already absent")
    if pod.being_deleted:
        return Settled(ReleaseOutcomeKind.POD_GONE, "pod is being deleted")
    ungate = ungate_patch(uid=uid, index=index, gate=gate)
    narrowing = [] if narrowing_refused else narrow_affinity_ops(pod.affinity, requirements)
    if not narrowing:
        return PatchNeeded(ungate)
    guard = {"op": "test", "path": "/metadata/resourceVersion", "value": pod.resource_version}
    return PatchNeeded([*ungate[:2], guard, *narrowing, ungate[2]],
                       narrows_at=pod.resource_version)


def narrowing_was_refused(planned: PatchNeeded, *, uid: str, pod: PodGates | None) -> bool:
    """After a 409/422 on `planned`: the pod as re-read is the one the patch was planned from
    (same uid and resourceVersion), so its tests held and the apiserver refused the narrowing
    itself (validation), not a change meanwhile."""
    return (bool(planned.narrows_at) and pod is not None and pod.uid == uid
            and pod.resource_version == planned.narrows_at)


class FailureKind(StrEnum):
    """How the ungater reacts to a failed call to the apiserver."""

    POD_GONE = "pod_gone"  # 404: nothing left to release
    REREAD = "reread"  # 409/422: a guarding test failed or the object changed; read and replan
    RETRY = "retry"  # unreachable, throttled or a server error: back off and try again
    PERMANENT = "permanent"  # rejected for good (400, 401, 403, ...): give up with a reason


def classify_failure(status: int | None, *, reading: bool = False) -> FailureKind:
    """Classify an apiserver failure by HTTP status (None: no answer at all).

    `reading` marks a GET: there a 409/422 cannot mean a failed test, so it is not re-read.
    """
    if status is None or status == 0 or status in (408, 429) or status >= 500:
        return FailureKind.RETRY
    if status == 404:
        return FailureKind.POD_GONE
    if status in (409, 422) and not reading:
        return FailureKind.REREAD
    return FailureKind.PERMANENT


def outcome_of(command: ReleaseCommand, settled: Settled, *, at: datetime) -> ReleaseOutcome:
    return ReleaseOutcome(
        decision_id=command.decision_id,
        cluster=command.cluster,
        uid=command.uid,
        outcome=settled.outcome,
        reason=settled.reason,
        at=at,
    )
