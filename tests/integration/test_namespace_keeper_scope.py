"""lockgate-namespace-keeper may escalate Roles, so the policy lockgate-namespace-keeper-scope
must keep it inside namespaces marked lockgate.io/ephemeral=true: each attempt here uses that
identity's own token (devstack's kubeconfig for it) against a real apiserver, and asserts the
refusal and its message, then that the same write in a marked namespace is allowed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.stack import StackInfo
from lockgate import namespace_access as access
from lockgate_adapters.kube import api_client

pytestmark = [pytest.mark.stack, pytest.mark.timeout(120)]

CLUSTER = "cluster-a"
MERGE_PATCH = "application/merge-patch+json"
GREEDY_ROLE = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "greedy"},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}


@pytest.fixture
async def keeper(stack: StackInfo) -> AsyncIterator[client.ApiClient]:
    if "namespace-keeper" not in stack.identity_kubeconfigs:
        pytest.fail("the stack has no namespace-keeper identity: run `python -m devstack up`")
    api = await api_client(stack.identity_kubeconfigs["namespace-keeper"][CLUSTER])
    try:
        yield api
    finally:
        await api.close()


def refusal(error: ApiException) -> str:
    return str(json.loads(error.body)["message"])


async def refused(attempt: Any) -> str:
    with pytest.raises(ApiException) as caught:
        await attempt
    assert caught.value.status == 403, caught.value.body
    return refusal(caught.value)


async def test_the_keeper_cannot_escalate_outside_ephemeral_namespaces(
    keeper: client.ApiClient, kube_clients: dict[str, client.ApiClient], make_namespace: Any,
) -> None:
    rbac, core = client.RbacAuthorizationV1Api(keeper), client.CoreV1Api(keeper)
    ordinary = await make_namespace(CLUSTER, prefix="lg-scope")
    for namespace in (ordinary, "kube-system", "lockgate-system"):
        message = await refused(rbac.create_namespaced_role(namespace, GREEDY_ROLE))
        assert "lockgate-namespace-keeper-scope" in message
        assert "marked lockgate.io/ephemeral=true" in message and namespace in message
        await refused(core.create_namespaced_service_account_token(
            "default", namespace, {"spec": {"expirationSeconds": 600}}))
    # It may not mark an existing namespace (then escalate there), nor make an unmarked one.
    message = await refused(core.patch_namespace(
        ordinary, {"metadata": {"labels": {access.EPHEMERAL_LABEL: "true"}}},
        _content_type=MERGE_PATCH))
    assert "may not mark or unmark" in message
    await refused(core.create_namespace({"metadata": {"name": f"lg-plain-{uuid.uuid4().hex[:6]}"}}))
    await refused(core.delete_namespace(ordinary))


async def test_in_a_namespace_it_made_the_keeper_may_write_any_role_and_not_unmark_it(
    keeper: client.ApiClient, kube_clients: dict[str, client.ApiClient],
) -> None:
    rbac, core = client.RbacAuthorizationV1Api(keeper), client.CoreV1Api(keeper)
    name = f"lg-eph-{uuid.uuid4().hex[:6]}"
    await core.create_namespace(access.namespace_object(name=name, queue="q", jobset="j",
                                                        kinds=("pods",)))
    try:
        await rbac.create_namespaced_role(name, GREEDY_ROLE)  # escalate, inside its own
        message = await refused(core.patch_namespace(
            name, {"metadata": {"labels": {access.EPHEMERAL_LABEL: None}}},
            _content_type=MERGE_PATCH))
        assert "may not mark or unmark" in message
    finally:
        await core.delete_namespace(name)  # a marked namespace: the keeper may delete it
    # ... and nobody else gets its rights: the keeper itself still reads no Secrets anywhere.
    await refused(core.list_namespaced_secret("kube-system"))
