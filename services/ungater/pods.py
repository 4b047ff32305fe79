"""The apiserver calls the ungater makes: read a pod's gates, patch one away, and tell a pod why
it stays gated (an Event).

Why raw responses: the ungater's throughput is measured against a tight client patching pods on
the same apiserver, and turning every response into kubernetes-asyncio's models costs more CPU
than the request itself. Responses are read as bytes; only a GET's body is parsed, as plain JSON.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from lockgate.releasing import JsonPatch, PodGates


class KubeCallError(Exception):
    """An apiserver call that did not succeed; `status` is None when no answer came at all."""

    def __init__(self, *, status: int | None, detail: str, retry_after: float | None = None,
                 reading: bool = False) -> None:
        super().__init__(f"{status or 'no answer'}: {detail}")
        self.status = status
        self.detail = detail
        self.retry_after = retry_after
        self.reading = reading


class PodGateClient:
    """Reads and patches pods in one cluster."""

    def __init__(self, api: client.ApiClient, *, request_timeout: float) -> None:
        self._core = client.CoreV1Api(api)
        self._timeout = request_timeout

    async def read(self, *, namespace: str, name: str) -> PodGates | None:
        """The pod's gates, or None when there is no such pod."""
        status, body, retry_after = await self._call(
            self._core.read_namespaced_pod(name, namespace, _preload_content=False,
                                           _request_timeout=self._timeout),
            reading=True,
        )
        if status == 404:
            return None
        if status >= 300:
            raise KubeCallError(status=status, detail=_message(body), retry_after=retry_after,
                                reading=True)
        return PodGates.from_json(json.loads(body))

    async def patch(self, *, namespace: str, name: str, patch: JsonPatch) -> None:
        """Apply a JSON patch (a list body makes kubernetes-asyncio send json-patch+json)."""
        status, body, retry_after = await self._call(
            self._core.patch_namespaced_pod(name, namespace, patch, _preload_content=False,
                                            _request_timeout=self._timeout),
            reading=False,
        )
        if status >= 300:
            raise KubeCallError(status=status, detail=_message(body), retry_after=retry_after)

    async def create_event(self, *, namespace: str, body: dict[str, Any]) -> int:
        """Create a core/v1 Event; returns the status: 2xx, 409 (it exists already) or 404 (its
        namespace is gone). Any other answer, or none, raises KubeCallError."""
        status, payload, retry_after = await self._call(
            self._core.create_namespaced_event(namespace, body, _preload_content=False,
                                               _request_timeout=self._timeout),
            reading=False,
        )
        if status < 300 or status in (404, 409):
            return status
        raise KubeCallError(status=status, detail=_message(payload), retry_after=retry_after)

    async def delete(self, *, namespace: str, name: str, uid: str) -> int:
        """Delete the pod if it is still the one with `uid` (a precondition, so a pod created
        again under the same name is never hit); returns 2xx, 404 (gone) or 409 (replaced).
        Any other answer, or none, raises KubeCallError."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        status, payload, retry_after = await self._call(
            self._core.delete_namespaced_pod(name, namespace, body=body, _preload_content=False,
                                             _request_timeout=self._timeout),
            reading=False,
        )
        if status < 300 or status in (404, 409):
            return status
        raise KubeCallError(status=status, detail=_message(payload), retry_after=retry_after)

    async def fail(self, *, namespace: str, name: str, uid: str, reason: str,
                   message: str) -> int:
        """Mark the pod Failed through its status (a Job counts it as a failed pod). The uid is
        tested in the patch, so a pod created again under the name is left alone (422)."""
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/status/phase", "value": "Failed"},
            {"op": "add", "path": "/status/reason", "value": reason},
            {"op": "add", "path": "/status/message", "value": message},
        ]
        status, payload, retry_after = await self._call(
            self._core.patch_namespaced_pod_status(name, namespace, patch,
                                                   _preload_content=False,
                                                   _request_timeout=self._timeout),
            reading=False,
        )
        if status < 300 or status in (404, 409, 422):
            return status
        raise KubeCallError(status=status, detail=_message(payload), retry_after=retry_after)

    @staticmethod
    async def _call(request: Any, *, reading: bool) -> tuple[int, bytes, float | None]:
        try:
            response: aiohttp.ClientResponse = await request
            async with response:
                body = await response.read()
                return response.status, body, _retry_after(response.headers.get("Retry-After"))
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise KubeCallError(status=None, detail=f"{type(error).__name__}: {error}",
                                reading=reading) from error


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _message(body: bytes) -> str:
    """The apiserver's Status message, or the start of whatever it sent."""
    try:
        status = json.loads(body)
    except ValueError:
        return body[:300].decode(errors="replace")
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return body[:300].decode(errors="replace")
