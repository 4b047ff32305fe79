"""A pod's trace as a waterfall (lockgate.pod_traces, `lockgate trace`), on recorded span JSON in
the shape Jaeger's query API answers (tests/fixtures/jaeger-pod-trace.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from recorded_api import CLUSTERS, RecordedApi

from lockgate.pod_traces import (
    TraceFormatError,
    format_micros,
    linked_traces,
    spans_from_jaeger,
    trace_id_of_uid,
    waterfall,
)
from lockgate_cli.trace import bar_cells, render_waterfall

RECORDED = json.loads((Path(__file__).parent.parent / "fixtures" / "jaeger-pod-trace.json")
                      .read_text())
UID = RECORDED["uid"]
TRACE_ID = trace_id_of_uid(UID)


def the_chart() -> Any:
    spans = spans_from_jaeger(RECORDED["pod"])
    linked = [s for doc in RECORDED["linked"].values() for s in spans_from_jaeger(doc)]
    return waterfall(spans, linked)


def test_the_pod_trace_is_a_tree_in_time_order_with_the_linked_spans_where_they_happened(
        ) -> None:
    chart = the_chart()
    assert [(r.span.service, r.span.name, r.depth, r.linked) for r in chart.rows] == [
        ("admission-webhook", "admission review", 0, True),
        ("cluster-watcher", "pod observed", 0, False),
        ("queue-store", "queue-store store lockgate.pod-events.v1", 1, False),
        ("lockgate", "waiting in line", 0, False),  # no span: worked out from the others
        ("fair-scheduler", "schedule-round", 0, True),
        ("fair-scheduler", "release decided", 0, False),
        ("ungater", "ungate", 1, False),
        ("cluster-watcher", "pod observed", 0, False),
    ]
    # Offsets from the earliest span shown (the admission review), in microseconds.
    assert [r.offset_us for r in chart.rows][:2] == [0, 120_000]
    assert chart.total_us == 1_210_280
    assert chart.rows[-1].span.error
    assert chart.services == ("admission-webhook", "cluster-watcher", "fair-scheduler",
                              "queue-store", "ungater")  # the wait is no service's span
    assert chart.recorded == 7


def test_the_wait_in_line_is_a_row_from_the_pod_stored_to_its_release_decided() -> None:
    rows = {r.span.name: r for r in the_chart().rows}
    stored = rows["queue-store store lockgate.pod-events.v1"].span
    decided = rows["release decided"].span
    wait = rows["waiting in line"]
    assert (wait.span.start_us, wait.span.end_us) == (stored.end_us, decided.start_us)
    assert wait.span.duration_us > 0 and not wait.span.span_id
    # A trace with no release decided yet (the pod still waits) has no such row.
    spans = [s for s in spans_from_jaeger(RECORDED["pod"]) if s.name != "release decided"]
    assert "waiting in line" not in {r.span.name for r in waterfall(spans).rows}


def test_links_name_the_other_traces_to_fetch_in_the_order_first_linked() -> None:
    spans = spans_from_jaeger(RECORDED["pod"])
    assert linked_traces(spans) == ["a1" * 16, "b2" * 16, "c3" * 16]
    assert trace_id_of_uid("6F1C2D3E-4A5B-4C6D-8E9F-0A1B2C3D4E5F") == TRACE_ID


def test_the_waterfall_lines_put_each_span_where_it_falls_on_one_time_axis() -> None:
    lines = render_waterfall(the_chart(), pod="cluster-a/team-a/sleeper-x", trace_id=TRACE_ID,
                             width=100)
    assert lines[0] == (f"Trace {TRACE_ID} of pod cluster-a/team-a/sleeper-x: 7 spans from 5 "
                        "services over 1.21s")
    header = lines[1].split()
    assert header[:4] == ["SERVICE", "SPAN", "START", "DURATION"]
    assert header[-2:] == ["0s", "1.21s"]
    assert all(len(line) <= 100 for line in lines[1:-1])
    bars = [line[line.index("|"):] for line in lines[2:10]]
    first_marks = [bar.index("#") for bar in bars]
    assert first_marks == sorted(first_marks), "bars move right as time goes on"
    assert bars[0].startswith("|#") and bars[-1].rstrip().endswith("#|")
    rows = {line.split("  ")[0].strip(): line for line in lines[2:10]}
    assert "~admission review" in rows["admission-webhook"]
    assert "  queue-store store lockgate.pod-events…" in lines[4], "shortened to fit"
    # The wait in line has a bar of its own, from the pod stored to its release decided.
    assert "waiting in line" in lines[5] and lines[5].count("#") >= 5
    assert "  ungate" in lines[8] and "38ms" in lines[8]
    assert "pod observed (error)" in lines[9]
    assert lines[-1].startswith("~ a span of another trace")


def test_wide_adds_each_spans_own_attributes_not_the_pods() -> None:
    lines = render_waterfall(the_chart(), pod="p", trace_id=TRACE_ID, width=100, wide=True)
    ungate = next(line for line in lines if "  ungate" in line)
    assert ungate.endswith("lockgate.decision_id=d-17")
    observed = next(line for line in lines if "pod observed" in line)
    assert "lockgate.state=queued" in observed and "lockgate.uid" not in observed


@pytest.mark.parametrize(("offset", "length", "cells"), [
    (0, 5, "#####     "), (5, 5, "     #####"), (9, 0, "         #"), (0, 0, "#         "),
    (3, 1, "   #      ")])
def test_a_bar_marks_at_least_one_cell(offset: int, length: int, cells: str) -> None:
    assert bar_cells(offset, length, 10, 10) == cells


@pytest.mark.parametrize(("micros", "text"), [
    (850, "850µs"), (12_300, "12.3ms"), (150_000, "150ms"), (1_520_000, "1.52s"),
    (125_000_000, "2m5s")])
def test_span_lengths_read_as_a_person_reads_them(micros: int, text: str) -> None:
    assert format_micros(micros) == text


@pytest.mark.parametrize("document", [{"data": "x"}, {"data": [{"spans": None}]},
                                      {"data": [{"spans": [{"spanID": "1"}]}]}])
def test_a_malformed_answer_is_an_error_not_a_crash(document: dict[str, Any]) -> None:
    with pytest.raises(TraceFormatError):
        spans_from_jaeger(document)


def traced_api(**overrides: Any) -> RecordedApi:
    explained = {"pod": {"cluster": "cluster-a", "namespace": "team-a", "name": "sleeper-x",
                         "uid": UID, "jobset": "j", "state": "running", "last_reason": ""},
                 "message": "released", "explanation": None}
    recorded = (RecordedApi()
                .on("GET", "/api/v1/explain/cluster-a/team-a/sleeper-x", explained)
                .on("GET", "/api/v1/clusters", CLUSTERS)
                .on("GET", f"/api/traces/{TRACE_ID}", RECORDED["pod"]))
    for trace_id, document in RECORDED["linked"].items():
        recorded.on("GET", f"/api/traces/{trace_id}", document)
    for key, value in overrides.items():
        recorded.on("GET", key, value)
    return recorded


def test_lockgate_trace_reads_the_uid_from_the_api_and_the_spans_from_the_trace_store() -> None:
    recorded = traced_api()
    ran = recorded.run("trace", "cluster-a/team-a/sleeper-x", "--traces", "http://jaeger.test",
                       "--width", "100")
    assert ran.code == 0, ran.err
    assert ran.out.splitlines()[0].startswith(f"Trace {TRACE_ID} of pod cluster-a/team-a/")
    assert [s.host for s in ran.sent if s.path.startswith("/api/traces/")] == \
        ["jaeger.test"] * 4  # the pod's, then the three it links to (one is missing: 404)
    as_json = json.loads(recorded.run("trace", "cluster-a/team-a/sleeper-x", "--traces",
                                      "http://jaeger.test", "-o", "json").out)
    assert as_json["trace_id"] == TRACE_ID and len(as_json["spans"]) == 8
    assert [s["name"] for s in as_json["spans"] if s["wait"]] == ["waiting in line"]


def test_lockgate_trace_says_what_is_missing() -> None:
    no_store = traced_api().run("trace", "cluster-a/team-a/sleeper-x")
    assert no_store.code == 1 and "no trace store is configured: give --traces" in no_store.err
    no_trace = traced_api(**{f"/api/traces/{TRACE_ID}": (404, {
        "data": None, "errors": [{"code": 404, "msg": "trace not found"}]})}).run(
        "trace", "cluster-a/team-a/sleeper-x", "--traces", "http://jaeger.test")
    assert no_trace.code == 1
    assert f"lockgate trace: no trace {TRACE_ID} of pod cluster-a/team-a/sleeper-x" in no_trace.err
    unknown = traced_api().run("trace", "cluster-z/team-a/p", "--traces", "http://jaeger.test")
    assert unknown.code == 1 and "unknown cluster 'cluster-z'" in unknown.err
