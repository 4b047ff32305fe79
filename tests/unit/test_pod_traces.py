"""A pod's journey is one trace: every service's span about a pod has the pod's uid as trace id."""

from __future__ import annotations

from datetime import UTC, datetime

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fair_scheduler import leading
from lockgate.events import ReleaseCommand

UID = "6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f"


def test_release_commands_continue_the_pods_trace_and_link_the_round() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    original = leading.tracer
    leading.tracer = tracer
    try:
        command = ReleaseCommand(decision_id="d-1", cluster="cluster-a", namespace="ns",
                                 name="p", uid=UID, queue="q",
                                 decided_at=datetime(2026, 11, 29, tzinfo=UTC))
        with tracer.start_as_current_span("schedule-round") as round_span:
            headers = dict(leading._release_span_headers(command))
    finally:
        leading.tracer = original

    traceparent = headers["traceparent"].decode()
    assert traceparent.split("-")[1] == UID.replace("-", "")
    (decided,) = [s for s in exporter.get_finished_spans() if s.name == "release decided"]
    assert decided.context.trace_id == int(UID.replace("-", ""), 16)
    assert decided.attributes is not None and decided.attributes["lockgate.uid"] == UID
    assert [link.context.span_id for link in decided.links] == [
        round_span.get_span_context().span_id]
