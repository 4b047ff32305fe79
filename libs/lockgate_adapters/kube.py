"""Kubernetes: API clients per cluster, and the error classification every caller needs."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from yarl import URL


async def api_client(kubeconfig: str) -> client.ApiClient:
    """An ApiClient for one cluster; the caller closes it."""
    api = await config.new_client_from_config(config_file=kubeconfig)
    await read_the_environment_once(api)
    return api


async def read_the_environment_once(api: client.ApiClient) -> None:
    """Give the client a session that reads the proxy settings once, here, not per request.

    Why: kubernetes-asyncio's aiohttp session trusts the environment, so aiohttp looks up a
    proxy and a .netrc entry for every request, each in a worker thread, parsing ~/.netrc each
    time: about a third of the ungater's CPU on the release benchmark (one PATCH per pod). A
    proxy the environment names for the apiserver (HTTPS_PROXY, NO_PROXY) is kept; .netrc
    credentials are not sent (the apiserver is reached with the kubeconfig's token or cert).
    """
    rest = api.rest_client
    settings = api.configuration
    if rest.proxy is None:
        with contextlib.suppress(LookupError):
            proxy, proxy_auth = get_env_proxy_for_url(URL(settings.host))
            rest.proxy = str(proxy)
            if proxy_auth is not None:
                rest.proxy_headers = {"Proxy-Authorization": proxy_auth.encode()}
    # The same TLS settings as kubernetes-asyncio's own session (client/rest.py).
    context = ssl.create_default_context(cafile=settings.ssl_ca_cert)
    if settings.cert_file:
        context.load_cert_chain(settings.cert_file, keyfile=settings.key_file)
    if not settings.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if settings.disable_strict_ssl_verification:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    await rest.pool_manager.close()  # unused yet: nothing is lost
    rest.pool_manager = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=settings.connection_pool_maxsize, ssl=context),
        trust_env=False, read_bufsize=2**21)


async def api_clients(kubeconfigs: Mapping[str, str]) -> dict[str, client.ApiClient]:
    return {name: await api_client(path) for name, path in kubeconfigs.items()}


def status_of(error: BaseException) -> int | None:
    return error.status if isinstance(error, ApiException) else None


def is_retryable_kube_error(error: BaseException) -> bool:
    """Outages, throttling and server errors are retried; 4xx other than 409/429 are not."""
    if isinstance(error, ApiException):
        return error.status in (0, 408, 409, 429) or error.status >= 500
    return isinstance(error, aiohttp.ClientError | OSError | asyncio.TimeoutError)


def retry_after_seconds(error: BaseException) -> float | None:
    """The server's Retry-After, when it sent one."""
    if isinstance(error, ApiException) and error.headers:
        value = error.headers.get("Retry-After")
        if value is not None:
            try:
                return float(value)
            except ValueError:
                return None
    return None
