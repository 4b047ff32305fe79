"""What `lockgate status` and `lockgate explain` say of pods that ran without lockgate's gate."""

from __future__ import annotations

import io
from typing import Any

import pytest

from lockgate.labels import why_not_served
from lockgate.noticing import skipped_gate_message
from lockgate_cli.explain import explanation_fields
from lockgate_cli.output import Output, render
from lockgate_cli.status import status_view


def a_queue(name: str, **fields: Any) -> dict[str, Any]:
    return {"queue": name, "name": name, "defined": True, "cordoned": False, "weight": 1.0,
            "fair_share": 0.5, "adjusted_fair_share": 0.5, "actual_share": 0.25,
            "fair_target": 0.5, "queued": 0, "released": 0, "running": 1,
            "oldest_wait_seconds": None, **fields}


def test_status_warns_of_each_queue_with_pods_that_skipped_the_gate() -> None:
    answer = {"queues": [a_queue("research", skipped_gate=2), a_queue("bulk", skipped_gate=0)],
              "reasons_unavailable": None}
    out = io.StringIO()

    render(out, Output("table"), status_view(answer))

    lines = out.getvalue().splitlines()
    assert "2 skipped the gate" in next(line for line in lines if line.startswith("research"))
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert len(warnings) == 1
    assert warnings[0].startswith("warning: 2 pod(s) of queue research ran without lockgate's "
                                  "gate")


def test_explain_of_a_pod_that_skipped_the_gate_says_so_and_why() -> None:
    message = skipped_gate_message(queue="research", namespace="jhub") + ". The pod is running."
    answer = {"pod": {"cluster": "cluster-a", "namespace": "jhub", "name": "jupyter-ann",
                      "jobset": "default", "state": "running", "skipped_gate": True},
              "explanation": None, "message": message}

    fields = explanation_fields(answer)

    assert fields["Warning"].startswith("lockgate never gated this pod")
    assert "lockgate.io/run=dev" in fields["Why"]
    assert "did not serve namespace jhub" in fields["Why"]


def test_the_message_names_the_labels_a_namespace_lacks_when_they_are_known() -> None:
    message = skipped_gate_message(queue="research", namespace="jhub",
                                   served_labels={"lockgate.io/run": "dev"})
    assert "does not serve namespace jhub" in message
    assert "lockgate.io/managed=true, lockgate.io/run=dev" in message


@pytest.mark.parametrize(("name", "labels", "says"), [
    ("jhub", {"lockgate.io/managed": "true", "lockgate.io/queue": "research"},
     "lacks lockgate.io/run=dev. Its pods will run without waiting their turn"),
    ("jhub", {"lockgate.io/run": "dev"}, "lacks lockgate.io/managed=true"),
    ("jhub", None, "namespace cluster-a/jhub does not exist yet: create it labelled "
                   "lockgate.io/managed=true lockgate.io/run=dev"),
    ("kube-system", {"lockgate.io/managed": "true", "lockgate.io/run": "dev"}, "never managed"),
])
def test_why_the_webhook_will_not_serve_a_bound_namespace(
        name: str, labels: dict[str, str] | None, says: str) -> None:
    why = why_not_served("cluster-a", name, labels, {"lockgate.io/run": "dev"})
    assert why is not None and says in why


def test_a_namespace_with_every_label_the_webhook_asks_for_is_served() -> None:
    labels = {"lockgate.io/managed": "true", "lockgate.io/run": "dev", "team": "a"}
    assert why_not_served("cluster-a", "jhub", labels, {"lockgate.io/run": "dev"}) is None
    assert why_not_served("cluster-a", "jhub", {"lockgate.io/managed": "true"}) is None
