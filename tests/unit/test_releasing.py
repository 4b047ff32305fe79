"""The ungate patch and the classification of what the apiserver answered."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from helpers.pods import a_pod
from lockgate.events import ReleaseCommand, ReleaseOutcomeKind
from lockgate.labels import SCHEDULING_GATE
from lockgate.placement import Requirement
from lockgate.releasing import (
    FailureKind,
    PatchNeeded,
    PodGates,
    Settled,
    classify_failure,
    gate_index,
    narrow_affinity_ops,
    narrowing_was_refused,
    outcome_of,
    plan_release,
    ungate_patch,
)

OTHER_GATE = "example.com/other"


class PatchTestFailedError(Exception):
    pass


def apply_json_patch(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The subset of RFC 6902 the ungater uses (test, add, remove), applied atomically."""
    result = copy.deepcopy(document)
    for operation in patch:
        *parents, last = operation["path"].strip("/").split("/")
        container: Any = result
        try:
            for part in parents:
                container = container[int(part)] if isinstance(container, list) else container[part]
            key: Any = (int(last) if isinstance(container, list) and last != "-" else last)
            if operation["op"] == "test":
                if container[key] != operation["value"]:
                    raise PatchTestFailedError(operation["path"])
            elif operation["op"] == "remove":
                del container[key]
            elif operation["op"] == "add":
                value = copy.deepcopy(operation["value"])
                if isinstance(container, list):
                    if last == "-":
                        container.append(value)
                    else:
                        container.insert(int(last), value)
                else:
                    container[key] = value
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


# ---------------------------------------------------------------- narrowing node affinity

AVOID = Requirement(key="karpenter.kwok.sh/instance-cpu", operator="NotIn", values=("4", "8"))
AVOID_JSON = {"key": "karpenter.kwok.sh/instance-cpu", "operator": "NotIn", "values": ["4", "8"]}
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}
HOST = {"key": "metadata.name", "operator": "In", "values": ["n1"]}


def _with_affinity(affinity: dict[str, Any] | None) -> dict[str, Any]:
    pod = POD.with_uid("u1").with_gates(OTHER_GATE, SCHEDULING_GATE).obj()
    if affinity is not None:
        pod["spec"]["affinity"] = affinity
    return pod


def _required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}


def _terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return terms


def _release(pod: dict[str, Any]) -> tuple[PatchNeeded, dict[str, Any]]:
    plan = plan_release(uid="u1", pod=PodGates.from_json(pod), requirements=(AVOID,))
    assert isinstance(plan, PatchNeeded)
    return plan, apply_json_patch(pod, plan.patch)


@pytest.mark.parametrize("affinity", [
    None,  # no affinity at all
    {"podAntiAffinity": {}},  # affinity, but not for nodes
    {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},  # preferred only
], ids=["none", "pods-only", "preferred-only"])
def test_a_pod_without_required_node_affinity_gets_one_term_of_the_requirement(
        affinity: dict[str, Any] | None) -> None:
    plan, patched = _release(_with_affinity(affinity))
    assert _terms(patched) == [{"matchExpressions": [AVOID_JSON]}]
    assert patched["spec"]["schedulingGates"] == [{"name": OTHER_GATE}]
    assert plan.narrows_at == "7"
    if affinity and "nodeAffinity" in affinity:  # what it had is kept
        assert patched["spec"]["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"] == []
    if affinity and "podAntiAffinity" in affinity:
        assert patched["spec"]["affinity"]["podAntiAffinity"] == {}


def test_the_requirement_is_anded_into_every_existing_term() -> None:
    pod = _with_affinity(_required({"matchExpressions": [ZONE]}, {"matchFields": [HOST]}))
    _, patched = _release(pod)
    assert _terms(patched) == [{"matchExpressions": [ZONE, AVOID_JSON]},
                               {"matchFields": [HOST], "matchExpressions": [AVOID_JSON]}]


def test_a_term_already_holding_the_requirement_gets_nothing_more() -> None:
    same_values_other_order = {**AVOID_JSON, "values": ["8", "4"]}
    pod = _with_affinity(_required({"matchExpressions": [same_values_other_order]},
                                   {"matchExpressions": [ZONE]}))
    _, patched = _release(pod)
    assert _terms(patched) == [{"matchExpressions": [same_values_other_order]},
                               {"matchExpressions": [ZONE, AVOID_JSON]}]
    assert narrow_affinity_ops(patched["spec"]["affinity"], (AVOID,)) == []


def test_a_narrowing_release_consumed_twice_adds_nothing_twice() -> None:
    pod = _with_affinity(_required({"matchExpressions": [ZONE]}))
    plan, once = _release(pod)
    # The same patch again fails as a whole (the gate is gone, the version moved on) ...
    once["metadata"]["resourceVersion"] = "8"
    with pytest.raises(PatchTestFailedError):
        apply_json_patch(once, plan.patch)
    # ... and a fresh plan from the pod as it is now settles without patching.
    again = plan_release(uid="u1", pod=PodGates.from_json(once), requirements=(AVOID,))
    assert again == Settled(ReleaseOutcomeKind.UNGATED, "gate already absent")
    assert _terms(once) == [{"matchExpressions": [ZONE, AVOID_JSON]}]


def test_a_narrowing_planned_from_an_older_affinity_fails_instead_of_extending_it() -> None:
    read = _with_affinity(_required({"matchExpressions": [ZONE]}))
    plan, _ = _release(read)
    # Someone else narrowed it meanwhile (the term indices may now mean other terms).
    now = _with_affinity(_required({"matchExpressions": [HOST]}, {"matchExpressions": [ZONE]}))
    now["metadata"]["resourceVersion"] = "9"
    with pytest.raises(PatchTestFailedError):
        apply_json_patch(now, plan.patch)
    assert not narrowing_was_refused(plan, uid="u1", pod=PodGates.from_json(now))


def test_a_refused_narrowing_releases_the_pod_as_it_came() -> None:
    pod = _with_affinity(_required({"matchExpressions": [ZONE]}))
    plan, _ = _release(pod)
    # The apiserver refused it and the pod is unchanged: the narrowing itself was refused.
    assert narrowing_was_refused(plan, uid="u1", pod=PodGates.from_json(pod))
    plain = plan_release(uid="u1", pod=PodGates.from_json(pod), requirements=(AVOID,),
                         narrowing_refused=True)
    assert isinstance(plain, PatchNeeded) and not plain.narrows_at
    released = apply_json_patch(pod, plain.patch)
    assert released["spec"]["schedulingGates"] == [{"name": OTHER_GATE}]
    assert _terms(released) == [{"matchExpressions": [ZONE]}]


def test_a_release_without_requirements_patches_only_the_gate() -> None:
    pod = _with_affinity(None)
    plan = plan_release(uid="u1", pod=PodGates.from_json(pod))
    assert isinstance(plan, PatchNeeded) and not plan.narrows_at
    assert plan.patch == ungate_patch(uid="u1", index=1)


def test_a_command_carries_its_requirements_and_reads_without_them() -> None:
    command = ReleaseCommand(decision_id="d", cluster="c", namespace="n", name="p", uid="u",
                             queue="q", decided_at=datetime(2026, 1, 1, tzinfo=UTC),
                             node_requirements=(AVOID,))
    assert ReleaseCommand.model_validate_json(command.model_dump_json()) == command
    # A command from a fair-scheduler that predates the field.
    older = command.model_dump(mode="json")
    del older["node_requirements"]
    assert ReleaseCommand.model_validate(older).node_requirements == ()
