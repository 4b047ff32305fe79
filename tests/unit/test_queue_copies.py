"""The Queue objects copied into each cluster and the per-run webhook registration: everything
about queues bound to namespaces that needs no stack (the CLI's bindings: test_cli_queue)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devstack.manifests import (
    QUEUE_CRD,
    WEBHOOK_CONFIGURATION,
    load,
    render_webhook_configuration,
)
from lockgate import queue_copies
from lockgate.queues import QueueSpec

SOURCE = "run-1"


def spec(name: str, **fields: Any) -> QueueSpec:
    return QueueSpec.model_validate({"name": name, **fields})


def stored(obj: dict[str, Any], version: str = "7") -> dict[str, Any]:
    """`obj` as the apiserver returns it."""
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": version,
                                "generation": 1}}


BOUND = [{"cluster": "*", "names": ["team-a"]}]


def test_a_queue_round_trips_through_its_queue_object() -> None:
    queue = spec("team-a", priority_factor=0.5, cordoned=True, resource_limits={"cpu": "10"},
                 namespaces=[{"cluster": "c1", "selector": {"matchLabels": {"team": "a"}}}])
    obj = queue_copies.desired_object(queue, source=SOURCE, prefix="run-1-")
    assert obj["metadata"]["name"] == "run-1-team-a"
    assert obj["metadata"]["labels"][queue_copies.SOURCE_LABEL] == SOURCE
    assert obj["spec"]["weight"] == 2.0
    assert queue_copies.spec_from_object(obj) == queue
    status = queue_copies.status_of(queue, generation=3,
                                    synced_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert status == {"observedGeneration": 3, "lastSyncTime": "2026-01-02T03:04:05Z",
                      "state": "Cordoned", "namespaces": "c1: selector team=a"}


def test_an_unreadable_queue_object_is_an_error_that_names_it() -> None:
    with pytest.raises(queue_copies.InvalidQueueCopyError, match="Queue broken"):
        queue_copies.spec_from_object({"metadata": {"name": "broken"},
                                       "spec": {"queueName": "Not_Valid"}})


def test_sync_plan_creates_replaces_deletes_and_leaves_others_alone() -> None:
    same, edited, new = spec("same", namespaces=BOUND), spec("edited"), spec("new")
    existing = [
        stored(queue_copies.desired_object(same, source=SOURCE)),
        stored(queue_copies.desired_object(spec("edited", cordoned=True), source=SOURCE), "9"),
        stored(queue_copies.desired_object(spec("deleted"), source=SOURCE)),
        # Another installation's object is never touched, even under a name we want.
        stored(queue_copies.desired_object(spec("foreign"), source="someone-else")),
    ]
    plan = queue_copies.plan_sync([same, edited, new], existing, source=SOURCE)
    assert [o["metadata"]["name"] for o in plan.create] == ["new"]
    (replacement,) = plan.replace
    assert replacement["metadata"]["resourceVersion"] == "9"
    assert replacement["spec"]["cordoned"] is False
    assert plan.delete == ("deleted",)
    assert plan.unchanged == ("same",)
    # Idempotent: once applied, nothing is left to do.
    applied = [stored(queue_copies.desired_object(q, source=SOURCE)) for q in (same, edited, new)]
    again = queue_copies.plan_sync([same, edited, new], applied, source=SOURCE)
    assert (again.create, again.replace, again.delete) == ((), (), ())


def test_the_crd_prints_weight_state_and_namespaces() -> None:
    crd = load(QUEUE_CRD)
    assert (crd["spec"]["group"], crd["spec"]["scope"]) == ("lockgate.io", "Cluster")
    (version,) = crd["spec"]["versions"]
    assert version["name"] == queue_copies.VERSION
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Weight", "State", "Namespaces", "Synced"} <= columns
    assert version["subresources"] == {"status": {}}


def test_the_static_configuration_is_fail_closed_on_pod_creations_in_managed_namespaces() -> None:
    static = load(WEBHOOK_CONFIGURATION)
    (hook,) = static["webhooks"]
    assert (hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"]) == (
        "Fail", "None", 5)
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""],
                              "apiVersions": ["v1"], "resources": ["pods"],
                              "scope": "Namespaced"}]
    assert hook["namespaceSelector"]["matchLabels"] == {"lockgate.io/managed": "true"}
    (expression,) = hook["namespaceSelector"]["matchExpressions"]
    assert expression["operator"] == "NotIn"
    assert {"kube-system", "kube-public", "kube-node-lease"} <= set(expression["values"])
    assert hook["clientConfig"]["service"]["name"] == "lockgate-webhook"


def test_a_run_renders_the_static_configuration_with_its_url_ca_and_namespaces() -> None:
    static = load(WEBHOOK_CONFIGURATION)
    rendered = render_webhook_configuration(
        static, name="lockgate-run-1", url="https://127.0.0.1:9443/mutate/cluster-a",
        ca_bundle_pem=b"-----BEGIN CERTIFICATE-----\n",
        extra_namespace_labels={"lockgate.io/run": "run-1"})
    (hook,) = rendered["webhooks"]
    assert rendered["metadata"]["name"] == "lockgate-run-1"
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate/cluster-a"
    assert "service" not in hook["clientConfig"]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]).startswith(b"-----BEGIN")
    assert hook["namespaceSelector"]["matchLabels"] == {"lockgate.io/managed": "true",
                                                       "lockgate.io/run": "run-1"}
    # Everything else is the static configuration's, and the static one is left unchanged.
    assert hook["failurePolicy"] == "Fail" and hook["rules"] == static["webhooks"][0]["rules"]
    assert "service" in static["webhooks"][0]["clientConfig"]


def test_a_status_is_written_again_only_when_it_changed_or_grew_old() -> None:
    spec = QueueSpec.model_validate({"name": "team-a", "namespaces": [
        {"cluster": "*", "names": ["team-a"]}]})
    synced = datetime(2026, 12, 2, 18, 0, 0, tzinfo=UTC)
    stored = queue_copies.status_of(spec, generation=3, synced_at=synced)

    def current(wanted: dict[str, object], seconds_later: float) -> bool:
        return queue_copies.status_is_current(
            stored, wanted, now=synced + timedelta(seconds=seconds_later), max_age_seconds=15)

    later = synced + timedelta(seconds=10)
    assert current(queue_copies.status_of(spec, generation=3, synced_at=later), 10)
    assert not current(queue_copies.status_of(spec, generation=3, synced_at=later), 15)
    assert not current(queue_copies.status_of(spec, generation=4, synced_at=later), 1)
    cordoned = spec.model_copy(update={"cordoned": True})
    assert not current(queue_copies.status_of(cordoned, generation=3, synced_at=later), 1)
    assert not queue_copies.status_is_current(None, stored, now=synced, max_age_seconds=15)
    assert not queue_copies.status_is_current({**stored, "lastSyncTime": "yesterday"}, stored,
                                              now=synced, max_age_seconds=15)


def test_a_tree_queues_copy_carries_parent_and_guarantee_and_a_flat_ones_is_unchanged() -> None:
    from lockgate.queue_copies import desired_spec, spec_from_object
    from lockgate.queues import QueueSpec

    flat = QueueSpec(name="flat")
    assert "parent" not in desired_spec(flat) and "guarantee" not in desired_spec(flat)
    child = QueueSpec(name="alice", parent="vision", guarantee={"cpu": "4"})
    copied = desired_spec(child)
    assert copied["parent"] == "vision" and copied["guarantee"] == {"cpu": "4"}
    back = spec_from_object({"metadata": {"name": "alice"}, "spec": copied})
    assert (back.parent, back.guarantee) == ("vision", {"cpu": "4"})
    crd = load(QUEUE_CRD)
    served = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert {"parent", "guarantee"} <= set(served["properties"])  # not pruned by the apiserver
