"""k8s/base read as files: what every worker cluster gets must agree with the code that relies
on it (label and gate names, the ungater's identity, which namespaces are enforced).

The admission policies' behaviour itself is tested in the apiserver
(tests/integration/test_enforcement.py); these checks catch a renamed label or account early.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from lockgate.labels import (
    JOBSET_LABEL,
    MANAGED_NAMESPACE_LABEL,
    NEVER_MANAGED_NAMESPACES,
    QUEUE_LABEL,
    SCHEDULING_GATE,
)

BASE = Path(__file__).resolve().parents[2] / "k8s" / "base"
UNGATER = "system:serviceaccount:lockgate-system:lockgate-ungater"


def base_objects() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    objects = []
    for entry in kustomization["resources"]:
        objects += [doc for doc in yaml.safe_load_all((BASE / entry).read_text()) if doc]
    return objects


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in base_objects() if o["kind"] == kind}


# Applied with the webhook that serves it (k8s/webhook, or per run by the launcher): a
# registration with no webhook behind it would refuse every pod of every managed namespace.
NOT_IN_BASE = {"kustomization.yaml"}


def test_every_file_in_the_folder_is_listed_and_every_listed_file_exists() -> None:
    listed = set(yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in BASE.glob("*.yaml")} - NOT_IN_BASE
    assert listed == present


def test_each_service_account_has_a_cluster_role_bound_to_it() -> None:
    accounts = {name for name, o in of_kind("ServiceAccount").items()
                if o["metadata"]["namespace"] == "lockgate-system"}
    assert accounts == {"lockgate-cluster-watcher", "lockgate-ungater", "lockgate-webhook",
                        "lockgate-queue-sync", "lockgate-namespace-keeper"}
    bound = {(s["name"], b["roleRef"]["name"]) for b in of_kind("ClusterRoleBinding").values()
             for s in b["subjects"]}
    roles = of_kind("ClusterRole")
    for account in accounts:
        assert (account, account) in bound
        assert account in roles


def test_the_ungater_may_only_read_patch_delete_and_fail_pods_and_create_events() -> None:
    # delete: a released pod kube-scheduler cannot place, when a controller replaces it, evictions,
    # timed-out pod groups and pods
    # past their queue's maximum time queued (pods/status patch to fail them instead);
    # list + delete: a cancelled job set's pods (by label) are deleted in every cluster.
    pods, status, events = of_kind("ClusterRole")["lockgate-ungater"]["rules"]
    assert pods == {"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["get", "patch", "list", "delete"]}
    assert status == {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}
    assert events == {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}


def test_the_namespace_keeper_may_get_and_delete_namespaces() -> None:
    (rule,) = [r for r in of_kind("ClusterRole")["lockgate-namespace-keeper"]["rules"]
               if "namespaces" in r["resources"]]
    assert {"get", "delete"} <= set(rule["verbs"])


def test_no_lockgate_identity_may_bind_pods_escalate_or_read_secrets() -> None:
    for name, role in of_kind("ClusterRole").items():
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], name
            assert not {"secrets", "pods/binding", "clusterroles", "clusterrolebindings"} & set(
                rule["resources"]), name
            assert "impersonate" not in rule["verbs"], name
            if {"escalate", "bind"} & set(rule["verbs"]):
                # The one exception (docs/security.md): namespace-keeper writes coordinator Roles
                # granting any allowed kind, confined to ephemeral namespaces by a policy.
                assert name == "lockgate-namespace-keeper", name
                assert rule["resources"] == ["roles"], name


def test_the_namespace_keeper_is_confined_to_ephemeral_namespaces_everywhere() -> None:
    policy = of_kind("ValidatingAdmissionPolicy")["lockgate-namespace-keeper-scope"]["spec"]
    (condition,) = policy["matchConditions"]
    assert "system:serviceaccount:lockgate-system:lockgate-namespace-keeper" in condition[
        "expression"]
    assert policy["failurePolicy"] == "Fail"
    covered = {r for rule in policy["matchConstraints"]["resourceRules"]
               for r in rule["resources"]}
    assert {"roles", "rolebindings", "serviceaccounts", "serviceaccounts/token",
            "namespaces"} <= covered
    binding = of_kind("ValidatingAdmissionPolicyBinding")["lockgate-namespace-keeper-scope"]
    assert "matchResources" not in binding["spec"]  # every namespace, kube-system included
    assert "'lockgate.io/ephemeral'" in yaml.safe_dump(policy)


def test_the_allowed_kinds_policy_reads_what_queue_store_writes() -> None:
    from lockgate.namespace_access import ALLOWED_KINDS_ANNOTATION, EPHEMERAL_LABEL

    policy = yaml.safe_dump(of_kind("ValidatingAdmissionPolicy")["lockgate-allowed-kinds"])
    assert f"'{ALLOWED_KINDS_ANNOTATION}'" in policy and f"'{QUEUE_LABEL}'" in policy
    binding = of_kind("ValidatingAdmissionPolicyBinding")["lockgate-allowed-kinds"]["spec"]
    assert binding["matchResources"]["namespaceSelector"] == {
        "matchLabels": {EPHEMERAL_LABEL: "true"}}


@pytest.mark.parametrize("policy", ["lockgate-admission-gate", "lockgate-queue-labels",
                                    "lockgate-no-node-name"])
def test_each_policy_is_bound_to_managed_namespaces_only_and_denies(policy: str) -> None:
    assert policy in of_kind("ValidatingAdmissionPolicy")
    binding = of_kind("ValidatingAdmissionPolicyBinding")[policy]["spec"]
    assert binding["policyName"] == policy
    assert binding["validationActions"] == ["Deny"]
    selector = binding["matchResources"]["namespaceSelector"]
    assert selector["matchLabels"] == {MANAGED_NAMESPACE_LABEL: "true"}
    (never,) = selector["matchExpressions"]
    assert (never["operator"], set(never["values"])) == ("NotIn", NEVER_MANAGED_NAMESPACES)


def test_the_policies_name_what_the_code_writes() -> None:
    policies = of_kind("ValidatingAdmissionPolicy")
    gate = yaml.safe_dump(policies["lockgate-admission-gate"])
    assert f"'{SCHEDULING_GATE}'" in gate and f"'{UNGATER}'" in gate
    labels = yaml.safe_dump(policies["lockgate-queue-labels"])
    assert f"'{QUEUE_LABEL}'" in labels and f"'{JOBSET_LABEL}'" in labels
