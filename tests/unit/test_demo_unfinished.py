"""When the demo's batch work times out, it says which pods lockgate does not account for, and
how each looked: enough to tell a pod lockgate lost from one it never saw and from a Job that
never made its last pod."""

from __future__ import annotations

from typing import Any

from devstack.demo_unfinished import SeenPod, job_status_line, unaccounted
from lockgate.labels import QUEUE_LABEL, SCHEDULING_GATE


def pod(name: str, uid: str, *, gated: bool = True, queue: str = "etl", phase: str = "Pending",
        node: str = "", deleting: bool = False) -> SeenPod:
    metadata: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid,
                                "creationTimestamp": "2026-12-03T10:49:01Z",
                                "labels": {QUEUE_LABEL: queue} if queue else {"app": "etl"}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-03T10:50:00Z"
    spec: dict[str, Any] = {"schedulingGates": [{"name": SCHEDULING_GATE}] if gated else []}
    if node:
        spec["nodeName"] = node
    return SeenPod.of("cluster-b", {"metadata": metadata, "spec": spec,
                                    "status": {"phase": phase}})


def test_pods_lockgate_holds_as_the_cluster_shows_them_are_not_reported() -> None:
    pods = [pod("etl-a", "u1"), pod("etl-b", "u2", gated=False, phase="Succeeded", node="n1")]
    assert unaccounted(pods, {("cluster-b", "u1"): "queued",
                              ("cluster-b", "u2"): "succeeded"}) == []


def test_a_gated_pod_without_a_row_was_lost_by_lockgate_and_says_which() -> None:
    lines = unaccounted([pod("etl-x", "u9")], {})
    assert lines == [
        "cluster-b/ns/etl-x (uid u9, created 2026-12-03T10:49:01Z, phase Pending, gated, "
        "queue label etl): gated by lockgate's webhook but never stored by lockgate: the "
        "watcher did not report it, or queue-store did not store what it reported"]


def test_a_pod_the_webhook_never_saw_is_told_apart() -> None:
    lines = unaccounted([pod("etl-y", "u8", gated=False, queue="", phase="Succeeded",
                             node="n2")], {})
    assert len(lines) == 1 and lines[0].endswith(
        "never admitted by lockgate's webhook (no gate, no queue label)")
    assert "node n2" in lines[0] and "not gated" in lines[0]


def test_a_gated_pod_lockgate_holds_as_finished_is_reported_unless_it_is_going() -> None:
    rows = {("cluster-b", "u1"): "deleted", ("cluster-b", "u2"): "deleted"}
    lines = unaccounted([pod("etl-a", "u1"), pod("etl-b", "u2", deleting=True)], rows)
    assert len(lines) == 1 and lines[0].endswith("still gated, but lockgate holds it as deleted")


def test_a_jobs_status_line_says_what_it_waits_for() -> None:
    job = {"metadata": {"name": "etl", "namespace": "ns"},
           "status": {"active": 1, "succeeded": 47, "ready": 0,
                      "uncountedTerminatedPods": {"succeeded": ["u3"]}}}
    assert job_status_line("cluster-b", job) == (
        "Job cluster-b/ns/etl: active 1, ready 0, succeeded 47, failed 0, "
        "uncounted {'succeeded': ['u3']}")
