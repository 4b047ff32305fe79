"""lockgate's Kubernetes clients (lockgate_adapters.kube.api_client) against a real apiserver:
the environment is read once, when the client is made, not on every request.

Why: kubernetes-asyncio's session trusts the environment, so aiohttp parsed ~/.netrc and looked
up a proxy in a worker thread for every request: a third of the ungater's CPU per released pod.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from lockgate_adapters.kube import api_client

pytestmark = [pytest.mark.stack]


async def test_requests_never_read_netrc_and_the_client_still_talks_to_the_apiserver(
        stack: StackInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("default login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    api = await api_client(stack.kubeconfigs["cluster-a"])
    try:
        assert api.rest_client.pool_manager.trust_env is False
        namespaces = (await client.CoreV1Api(api).list_namespace()).items
        assert "default" in {n.metadata.name for n in namespaces}
    finally:
        await api.close()


async def test_a_proxy_the_environment_names_for_the_apiserver_is_kept_unless_bypassed(
        stack: StackInfo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://user:pw@proxy.invalid:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    api = await api_client(stack.kubeconfigs["cluster-a"])
    try:
        assert api.rest_client.proxy == "http://proxy.invalid:3128"
        assert api.rest_client.proxy_headers["Proxy-Authorization"].startswith("Basic ")
    finally:
        await api.close()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    api = await api_client(stack.kubeconfigs["cluster-a"])
    try:
        assert api.rest_client.proxy is None
        assert (await client.VersionApi(api).get_code()).major
    finally:
        await api.close()
