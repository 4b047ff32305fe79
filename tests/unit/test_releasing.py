"""The ungate patch and the classification of what the apiserver answered."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from helpers.pods import a_pod
from lockgate.events import ReleaseCommand, ReleaseOutcomeKind
from lockgate.labels import SCHEDULING_GATE
from lockgate.releasing import (
    FailureKind,
    PatchNeeded,
    PodGates,
    Settled,
    classify_failure,
    gate_index,
    outcome_of,
    plan_release,
    ungate_patch,
)

OTHER_GATE = "example.com/other"


class PatchTestFailedError(Exception):
    pass


def apply_json_patch(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The subset of RFC 6902 the ungater uses (test, remove), applied atomically."""
    result = copy.deepcopy(document)
    for operation in patch:
        *parents, last = operation["path"].strip("/").split("/")
        container: Any = result
        try:
            for part in parents:
                container = container[int(part)] if isinstance(container, list) else container[part]
            key: Any = int(last) if isinstance(container, list) else last
            if operation["op"] == "test":
                if container[key] != operation["value"]:
                    raise PatchTestFailedError(operation["path"])
            elif operation["op"] == "remove":
                del container[key]
            else:
                raise AssertionError(f"unexpected op {operation['op']}")
        except (KeyError, IndexError) as missing:
            raise PatchTestFailedError(operation["path"]) from missing
    return result


POD = a_pod("p").at_version("7")  # as the ungater reads it back


def test_pod_gates_read_from_json() -> None:
    deleting = POD.with_uid("u1").with_gates(OTHER_GATE, SCHEDULING_GATE).being_deleted()
    pod = PodGates.from_json(deleting.obj())
    assert pod == PodGates(uid="u1", gates=(OTHER_GATE, SCHEDULING_GATE), being_deleted=True,
                           resource_version="7")
    assert PodGates.from_json({"metadata": {"uid": "u2"}, "spec": {}}).gates == ()


@pytest.mark.parametrize(
    ("gates", "want"),
    [
        ((), None),
        ((SCHEDULING_GATE,), 0),
        ((OTHER_GATE, SCHEDULING_GATE), 1),
        ((OTHER_GATE,), None),
    ],
)
def test_gate_index(gates: tuple[str, ...], want: int | None) -> None:
    assert gate_index(gates) == want


def test_patch_removes_only_lockgates_gate() -> None:
    pod = POD.with_uid("u1").with_gates(OTHER_GATE, SCHEDULING_GATE, "example.com/third").obj()
    plan = plan_release(uid="u1", pod=PodGates.from_json(pod))
    assert isinstance(plan, PatchNeeded)
    patched = apply_json_patch(pod, plan.patch)
    assert patched["spec"]["schedulingGates"] == [{"name": OTHER_GATE},
                                                  {"name": "example.com/third"}]


def test_patch_built_from_a_stale_read_fails_instead_of_removing_another_gate() -> None:
    read = POD.with_uid("u1").with_gates(OTHER_GATE, SCHEDULING_GATE).obj()
    plan = plan_release(uid="u1", pod=PodGates.from_json(read))
    assert isinstance(plan, PatchNeeded)
    # Another controller removed its own gate after our read: ours moved to index 0.
    now = POD.with_uid("u1").with_gates(SCHEDULING_GATE).obj()
    with pytest.raises(PatchTestFailedError):
        apply_json_patch(now, plan.patch)


def test_patch_fails_when_the_pod_was_replaced_under_the_same_name() -> None:
    patch = ungate_patch(uid="old-uid", index=0)
    with pytest.raises(PatchTestFailedError):
        apply_json_patch(POD.with_uid("new-uid").with_gates(SCHEDULING_GATE).obj(), patch)


def test_repeating_the_patch_fails_rather_than_removing_more() -> None:
    pod = POD.with_uid("u1").with_gates(SCHEDULING_GATE, OTHER_GATE).obj()
    patch = ungate_patch(uid="u1", index=0)
    once = apply_json_patch(pod, patch)
    assert once["spec"]["schedulingGates"] == [{"name": OTHER_GATE}]
    with pytest.raises(PatchTestFailedError):
        apply_json_patch(once, patch)


@pytest.mark.parametrize(
    ("pod", "want"),
    [
        (None, ReleaseOutcomeKind.POD_GONE),
        (PodGates(uid="other", gates=(SCHEDULING_GATE,)), ReleaseOutcomeKind.POD_GONE),
        (PodGates(uid="u1", gates=(OTHER_GATE,)), ReleaseOutcomeKind.UNGATED),
        (PodGates(uid="u1", gates=()), ReleaseOutcomeKind.UNGATED),
        (PodGates(uid="u1", gates=(SCHEDULING_GATE,), being_deleted=True),
         ReleaseOutcomeKind.POD_GONE),
    ],
)
def test_settled_without_patching(pod: PodGates | None, want: ReleaseOutcomeKind) -> None:
    plan = plan_release(uid="u1", pod=pod)
    assert isinstance(plan, Settled)
    assert plan.outcome is want
    assert plan.reason


@pytest.mark.parametrize(
    ("status", "reading", "want"),
    [
        (None, False, FailureKind.RETRY),
        (0, False, FailureKind.RETRY),
        (429, False, FailureKind.RETRY),
        (500, True, FailureKind.RETRY),
        (503, False, FailureKind.RETRY),
        (404, False, FailureKind.POD_GONE),
        (404, True, FailureKind.POD_GONE),
        (409, False, FailureKind.REREAD),
        (422, False, FailureKind.REREAD),
        (422, True, FailureKind.PERMANENT),
        (403, False, FailureKind.PERMANENT),
        (400, False, FailureKind.PERMANENT),
    ],
)
def test_classify_failure(status: int | None, reading: bool, want: FailureKind) -> None:
    assert classify_failure(status, reading=reading) is want


def test_outcome_carries_the_decision() -> None:
    at = datetime(2024, 1, 1, tzinfo=UTC)
    command = ReleaseCommand(decision_id="d1", cluster="c", namespace="ns", name="p", uid="u1",
                             queue="q", decided_at=at)
    outcome = outcome_of(command, Settled(ReleaseOutcomeKind.UNGATED, "gate removed"), at=at)
    assert (outcome.decision_id, outcome.cluster, outcome.uid, outcome.outcome) == (
        "d1", "c", "u1", ReleaseOutcomeKind.UNGATED)
