"""Ephemeral namespaces without I/O: naming, allowed kinds, the coordinator's Role, the objects
queue-store writes, durations, and the queue's allowed kinds."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from lockgate import namespace_access as access
from lockgate.labels import JOBSET_LABEL, MANAGED_NAMESPACE_LABEL, QUEUE_LABEL
from lockgate.queue_copies import desired_object, spec_from_object
from lockgate.queues import DEFAULT_ALLOWED_KINDS, QueueSpec

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@pytest.mark.parametrize(("queue", "jobset", "prefix"), [
    ("team-a", "etl-42", ""),
    ("team-a", "Spark_Run.7", "run1-"),
    ("q", "x" * 63, ""),
    ("a" * 63, "b" * 63, "abcdefghijklmnopqrstu-"),
    ("q", "___", ""),
])
def test_a_namespace_name_is_a_dns_label_and_the_same_on_every_retry(
        queue: str, jobset: str, prefix: str) -> None:
    name = access.namespace_name(queue=queue, jobset=jobset, prefix=prefix)
    assert DNS_LABEL.match(name), name
    assert name == access.namespace_name(queue=queue, jobset=jobset, prefix=prefix)


def test_names_that_squeeze_alike_still_differ() -> None:
    assert access.namespace_name(queue="a-b", jobset="c") != access.namespace_name(
        queue="a", jobset="b-c")
    assert access.namespace_name(queue="q", jobset="Run") != access.namespace_name(
        queue="q", jobset="run")
    assert access.namespace_name(queue="q", jobset="j", prefix="r1-") != access.namespace_name(
        queue="q", jobset="j", prefix="r2-")
    assert access.namespace_name(queue="team-a", jobset="etl").startswith("team-a-etl-")


@pytest.mark.parametrize(("text", "group", "resource"), [
    ("pods", "", "pods"),
    ("deployments.apps", "apps", "deployments"),
    ("sparkapplications.sparkoperator.k8s.io", "sparkoperator.k8s.io", "sparkapplications"),
    (" services ", "", "services"),
])
def test_kinds_are_plural_resources_with_their_group(text: str, group: str,
                                                     resource: str) -> None:
    assert access.parse_kind(text) == access.Kind(group=group, resource=resource)


@pytest.mark.parametrize(("text", "says"), [
    ("*", "no wildcards"),
    ("Pods", "lower-case"),
    ("pods/exec", "no subresources"),
    ("deployments.apps.", "lower-case"),
    ("", "lower-case"),
    ("namespaces", "cluster-scoped"),
    ("clusterroles.rbac.authorization.k8s.io", "cluster-scoped"),
    ("queues.lockgate.io", "lockgate's own"),
])
def test_kinds_a_queue_cannot_allow_are_refused_with_the_reason(text: str, says: str) -> None:
    with pytest.raises(access.InvalidKindError, match=says):
        access.parse_kind(text)


def test_kinds_are_stored_sorted_without_duplicates_and_never_empty() -> None:
    assert access.normalise_kinds(["services", "pods", "pods", "jobs.batch"]) == (
        "jobs.batch", "pods", "services")
    with pytest.raises(access.InvalidKindError, match="at least one"):
        access.normalise_kinds([])


def test_the_role_gives_every_verb_on_allowed_kinds_grouped_by_api_group() -> None:
    rules = access.coordinator_rules(["pods", "services", "deployments.apps"], create_any=False)
    assert rules[0] == {"apiGroups": [""], "resources": ["pods", "services"],
                        "verbs": list(access.FULL_VERBS)}
    assert rules[1] == {"apiGroups": ["apps"], "resources": ["deployments"],
                        "verbs": list(access.FULL_VERBS)}
    # watching its workers: pods, their logs and Events, read only
    assert {"apiGroups": [""], "resources": ["pods", "pods/log", "events"],
            "verbs": ["get", "list", "watch"]} in rules
    assert not any("*" in rule["resources"] for rule in rules)
    assert not any("secrets" in rule["resources"] for rule in rules)


def test_the_role_lets_the_coordinator_scale_allowed_kinds_with_a_scale_subresource() -> None:
    rules = access.coordinator_rules(
        ["pods", "services", "jobs.batch", "deployments.apps", "statefulsets.apps",
         "replicasets.apps", "daskworkergroups.kubernetes.dask.org",
         "daskclusters.kubernetes.dask.org"], create_any=False)
    scale = [rule for rule in rules if any("/scale" in r for r in rule["resources"])]
    assert scale == [
        {"apiGroups": ["apps"],
         "resources": ["deployments/scale", "replicasets/scale", "statefulsets/scale"],
         "verbs": ["get", "update", "patch"]},
        {"apiGroups": ["kubernetes.dask.org"],
         "resources": ["daskclusters/scale", "daskworkergroups/scale"],
         "verbs": ["get", "update", "patch"]},
    ]


@pytest.mark.parametrize(("kind", "scalable"), [
    ("deployments.apps", True), ("statefulsets.apps", True), ("replicasets.apps", True),
    ("replicationcontrollers", True), ("pods", False), ("services", False),
    ("jobs.batch", False), ("cronjobs.batch", False), ("daemonsets.apps", False),
    ("ingresses.networking.k8s.io", False),
    # Custom resources: whether their CRD has one is not known without asking the cluster,
    # and a rule for a subresource that does not exist grants nothing.
    ("daskworkergroups.kubernetes.dask.org", True),
    ("sparkapplications.sparkoperator.k8s.io", True), ("rayclusters.ray.io", True),
])
def test_which_kinds_get_their_scale_subresource(kind: str, scalable: bool) -> None:
    assert access.has_scale(access.parse_kind(kind)) is scalable


def test_with_create_any_only_creation_reaches_the_admission_policy() -> None:
    strict = access.coordinator_rules(["configmaps"], create_any=False)
    open_to_policy = access.coordinator_rules(["configmaps"], create_any=True)
    extra = [rule for rule in open_to_policy if rule not in strict]
    assert extra == [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["create"]}]


def test_the_namespace_is_labelled_for_inheritance_marked_and_annotated() -> None:
    obj = access.namespace_object(name="ns1", queue="team-a", jobset="etl",
                                  kinds=("configmaps", "pods"),
                                  extra_labels={"lockgate.io/run": "r1",
                                                QUEUE_LABEL: "forged"})
    labels = obj["metadata"]["labels"]
    assert labels[MANAGED_NAMESPACE_LABEL] == "true"
    assert (labels[QUEUE_LABEL], labels[JOBSET_LABEL]) == ("team-a", "etl")  # extras never win
    assert labels[access.EPHEMERAL_LABEL] == "true"
    assert labels["lockgate.io/run"] == "r1"
    assert obj["metadata"]["annotations"] == {access.ALLOWED_KINDS_ANNOTATION: "configmaps,pods"}
    assert access.is_lockgate_namespace(obj, queue="team-a", jobset="etl")
    assert not access.is_lockgate_namespace(obj, queue="team-b", jobset="etl")
    assert not access.is_lockgate_namespace({"metadata": {"labels": {
        QUEUE_LABEL: "team-a", JOBSET_LABEL: "etl"}}}, queue="team-a", jobset="etl")


def test_the_binding_gives_the_role_to_the_coordinator_of_that_namespace_only() -> None:
    binding = access.role_binding_object("ns1")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": access.COORDINATOR}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": access.COORDINATOR,
                                    "namespace": "ns1"}]


def test_the_kubeconfig_defaults_to_the_namespace() -> None:
    config = access.coordinator_kubeconfig(cluster="c1", server="https://x:6443",
                                           ca_data="Q0E=", namespace="ns1", token="t0k")
    (context,) = config["contexts"]
    assert config["current-context"] == context["name"]
    assert context["context"]["namespace"] == "ns1"
    assert config["users"][0]["user"] == {"token": "t0k"}
    assert config["clusters"][0]["cluster"]["certificate-authority-data"] == "Q0E="


def test_a_queue_without_allowed_kinds_has_the_default() -> None:
    queue = QueueSpec(name="q")
    assert queue.allowed_kinds is None
    assert queue.effective_allowed_kinds == DEFAULT_ALLOWED_KINDS
    assert "secrets" not in DEFAULT_ALLOWED_KINDS
    assert all(access.parse_kind(kind) for kind in DEFAULT_ALLOWED_KINDS)


def test_a_queue_stores_its_kinds_normalised_and_refuses_bad_ones() -> None:
    queue = QueueSpec(name="q", allowed_kinds=("services", "pods", "pods"))
    assert queue.effective_allowed_kinds == ("pods", "services")
    with pytest.raises(ValidationError, match="no wildcards"):
        QueueSpec(name="q", allowed_kinds=("*",))


def test_the_queue_copy_binds_its_ephemeral_namespaces_by_name_in_its_cluster_only() -> None:
    queue = QueueSpec(name="q", allowed_kinds=("pods",))
    obj = desired_object(queue, source="s", ephemeral_namespaces=["ns2", "ns1"])
    assert obj["spec"]["ephemeralNamespaces"] == ["ns1", "ns2"]
    copy = spec_from_object(obj)
    assert copy.allows(cluster="anywhere", namespace="ns1", labels={})
    assert not copy.allows(cluster="anywhere", namespace="ns3", labels={
        access.EPHEMERAL_LABEL: "true", QUEUE_LABEL: "q", MANAGED_NAMESPACE_LABEL: "true"})
    assert copy.allowed_kinds == ("pods",)
    assert spec_from_object(desired_object(queue, source="s")) == queue
