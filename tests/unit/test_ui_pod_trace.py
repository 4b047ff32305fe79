"""The web UI's pod trace (queue_store.pod_trace): queue-store reads the pod's trace and the
traces it links to from a trace store that answers as Jaeger's query API does (an aiohttp test
server on loopback serving the recorded answers of tests/fixtures/jaeger-pod-trace.json), and
serves the same rows as `lockgate trace -o json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from lockgate.pod_traces import (
    linked_traces,
    spans_from_jaeger,
    trace_id_of_uid,
    waterfall,
    waterfall_json,
)
from lockgate_cli.trace import trace_json
from queue_store.pod_trace import TraceStore, TraceStoreError

RECORDED = json.loads((Path(__file__).parent.parent / "fixtures" / "jaeger-pod-trace.json")
                      .read_text())
TRACE_ID = trace_id_of_uid(RECORDED["uid"])


def jaeger(answers: dict[str, Any], asked: list[str], status: int = 200) -> web.Application:
    async def trace(request: web.Request) -> web.Response:
        trace_id = request.match_info["trace_id"]
        asked.append(trace_id)
        if status != 200:
            return web.json_response({"errors": ["boom"]}, status=status)
        if trace_id not in answers:
            return web.json_response({"data": None, "errors": [{"code": 404}]}, status=404)
        return web.json_response(answers[trace_id])

    app = web.Application()
    app.router.add_get("/api/traces/{trace_id}", trace)
    return app


async def test_the_pod_page_gets_the_same_waterfall_as_lockgate_trace() -> None:
    asked: list[str] = []
    answers = {TRACE_ID: RECORDED["pod"], **RECORDED["linked"]}
    async with TestServer(jaeger(answers, asked)) as server:
        chart = await TraceStore(str(server.make_url("/"))).chart(TRACE_ID)
    # The pod's trace, then every trace it links to (one of them gone: shown without it).
    assert asked == [TRACE_ID, *linked_traces(spans_from_jaeger(RECORDED["pod"]))]
    assert set(RECORDED["linked"]) < set(asked)
    expected = waterfall(spans_from_jaeger(RECORDED["pod"]),
                         [s for doc in RECORDED["linked"].values() for s in spans_from_jaeger(doc)])
    assert waterfall_json(chart) == waterfall_json(expected)
    rows = waterfall_json(chart)["spans"]
    assert [(r["service"], r["name"], r["linked"]) for r in rows][:2] == [
        ("admission-webhook", "admission review", True), ("cluster-watcher", "pod observed", False)]
    # One shape for both: the CLI's JSON is the chart's, with the pod named.
    cli = trace_json(chart, pod="cluster-a/team-a/p", uid=RECORDED["uid"], trace_id=TRACE_ID)
    assert {k: v for k, v in cli.items() if k not in {"pod", "uid", "trace_id"}} == \
        waterfall_json(chart)


async def test_a_trace_not_yet_stored_is_an_empty_chart() -> None:
    asked: list[str] = []
    async with TestServer(jaeger({}, asked)) as server:
        chart = await TraceStore(str(server.make_url("/"))).chart(TRACE_ID)
    assert chart.rows == () and asked == [TRACE_ID]


async def test_a_failing_or_foreign_store_is_a_clear_error() -> None:
    async with TestServer(jaeger({}, [], status=500)) as server:
        with pytest.raises(TraceStoreError, match="answered HTTP 500"):
            await TraceStore(str(server.make_url("/"))).chart(TRACE_ID)
    async with TestServer(jaeger({TRACE_ID: {"data": "not a list"}}, [])) as server:
        with pytest.raises(TraceStoreError, match="Jaeger's query API"):
            await TraceStore(str(server.make_url("/"))).chart(TRACE_ID)
    with pytest.raises(TraceStoreError, match="did not answer"):
        await TraceStore("http://127.0.0.1:1", timeout_seconds=2).chart(TRACE_ID)
