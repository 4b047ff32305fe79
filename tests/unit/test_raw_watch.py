"""cluster-watcher's `RawWatch` reads a watch stream as kubernetes-asyncio's `Watch` does: the
same events, the same resourceVersion, the same errors, with orjson and no ApiClient of its own."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from cluster_watcher.watching import RawWatch


class _Content:
    def __init__(self, lines: list[bytes]) -> None:
        self.lines = list(lines)

    async def readline(self) -> bytes:
        return self.lines.pop(0) if self.lines else b""


class _Response:
    def __init__(self, lines: list[bytes]) -> None:
        self.content = _Content(lines)
        self.released = False

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.released = True


def _lines(*events: dict[str, Any]) -> list[bytes]:
    return [json.dumps(event).encode() + b"\n" for event in events]


def _pod(name: str, version: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns",
                                        "resourceVersion": version, "labels": {"ü": "✓"}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}


async def _read(watch: Watch, lines: list[bytes]) -> tuple[list[tuple[str, Any]], Any, bool]:
    response = _Response(lines)

    async def list_pods(**kwargs: Any) -> _Response:
        assert kwargs["watch"] is True and kwargs["_preload_content"] is False
        return response

    seen: list[tuple[str, Any]] = []
    async with watch:
        async for event in watch.stream(list_pods, resource_version="1", timeout_seconds=5):
            seen.append((event["type"], event["raw_object"]))
    return seen, watch.resource_version, response.released


STREAM = _lines(
    {"type": "ADDED", "object": _pod("a", "5")},
    {"type": "MODIFIED", "object": _pod("a", "6")},
    {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}},
    {"type": "DELETED", "object": _pod("b", "7")},
)


async def test_events_and_resource_version_are_the_stock_watchs() -> None:
    raw = await _read(RawWatch(), STREAM)
    stock = await _read(Watch(return_type="object"), STREAM)
    assert raw == stock
    assert [kind for kind, _ in raw[0]] == ["ADDED", "MODIFIED", "BOOKMARK", "DELETED"]
    assert raw[1] == "7" and raw[2] is True


@pytest.mark.parametrize("line", [
    {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                 "message": "too old resource version"}},
    {"kind": "Status", "code": 500, "reason": "InternalError", "message": "boom"},
])
async def test_errors_are_the_stock_watchs(line: dict[str, Any]) -> None:
    errors: list[tuple[object, object]] = []
    for watch in (RawWatch(), Watch(return_type="object")):
        with pytest.raises(ApiException) as raised:
            await _read(watch, _lines({"type": "ADDED", "object": _pod("a", "5")}, line))
        errors.append((raised.value.status, raised.value.reason))
    assert errors[0] == errors[1]
    assert errors[0][0] == line.get("code", 410)


def test_it_makes_no_client() -> None:
    assert not hasattr(RawWatch(), "_api_client")
