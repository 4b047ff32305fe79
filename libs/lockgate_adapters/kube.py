"""Kubernetes: API clients per cluster, and the error classification every caller needs."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException


async def api_client(kubeconfig: str) -> client.ApiClient:
    """An ApiClient for one cluster; the caller closes it."""
    return await config.new_client_from_config(config_file=kubeconfig)


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
