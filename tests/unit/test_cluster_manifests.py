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
                        "lockgate-queue-sync"}
    bound = {(s["name"], b["roleRef"]["name"]) for b in of_kind("ClusterRoleBinding").values()
             for s in b["subjects"]}
    roles = of_kind("ClusterRole")
    for account in accounts:
        assert (account, account) in bound
        assert account in roles


def test_the_ungater_may_only_read_and_patch_pods_and_create_events() -> None:
    pods, events = of_kind("ClusterRole")["lockgate-ungater"]["rules"]
    assert pods == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}
    assert events == {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}


def test_no_lockgate_identity_may_bind_pods_escalate_or_read_secrets() -> None:
    for name, role in of_kind("ClusterRole").items():
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], name
            assert not {"secrets", "pods/binding", "clusterroles", "clusterrolebindings"} & set(
                rule["resources"]), name
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), name


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
