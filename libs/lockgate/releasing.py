"""Releasing a pod: the JSON patch that removes lockgate's gate, and what each answer means.

Why pure: the ungater's correctness rests on three small decisions — which patch to send, what a
pod read from the apiserver says about the release, and which API failures are worth retrying —
and all three must be testable without an apiserver.

The patch removes lockgate's gate by index, guarded by `test` operations on the pod's uid and on
the name at that index. The apiserver applies the operations atomically against the newest
object, so a patch built from a stale read (another controller removed its own gate first, the
pod was replaced under the same name, a duplicate command already removed ours) fails as a whole
instead of removing somebody else's gate. The caller then re-reads and plans again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from lockgate.events import ReleaseCommand, ReleaseOutcome, ReleaseOutcomeKind
from lockgate.labels import SCHEDULING_GATE

JsonPatch = list[dict[str, Any]]


@dataclass(frozen=True)
class PodGates:
    """What the ungater needs of a pod read from the apiserver."""

    uid: str
    gates: tuple[str, ...]
    being_deleted: bool = False
    resource_version: str = ""
    node_name: str = ""  # set once the pod is bound

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


@dataclass(frozen=True)
class Settled:
    """The release needs no (more) patching: this is its outcome."""

    outcome: ReleaseOutcomeKind
    reason: str


@dataclass(frozen=True)
class PatchNeeded:
    """Send this patch; a test failure means the pod changed since it was read."""

    patch: JsonPatch


def plan_release(*, uid: str, pod: PodGates | None, gate: str = SCHEDULING_GATE
                 ) -> Settled | PatchNeeded:
    """What to do for a release command of pod `uid`, given the pod as just read (None: 404)."""
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
    return PatchNeeded(ungate_patch(uid=uid, index=index, gate=gate))


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
