"""OpenTelemetry set-up, trace context in Kafka headers, and structured logs with trace ids.

Why: a user follows one pod's journey (admission → watcher → queue-store → scheduler → ungater)
as one trace. Each hop carries W3C trace context in the Kafka message headers it sends.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from lockgate_adapters.quieting import OUTAGE_LOGS

KafkaHeaders = Sequence[tuple[str, bytes]]


def setup_tracing(
    service_name: str,
    *,
    otlp_endpoint: str | None = None,
    console: bool = False,
    exporter: SpanExporter | None = None,
) -> TracerProvider:
    """Install a tracer provider for this process; spans go to OTLP, stderr or `exporter`."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = otlp_endpoint.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    if console:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def pod_trace_parent(uid: str) -> otel_context.Context:
    """A context whose trace id is the pod's uid, so every span about one pod shares a trace.

    A pod uid is a UUID: its 128 bits are exactly a trace id. The parent span id is derived from
    it too; that span is never recorded — it stands for the pod itself. Each service that acts on
    a pod (watcher, scheduler) starts its span under this parent, so a pod's whole journey is one
    trace without any service having to pass the context through Postgres.
    """
    hex_digits = uid.replace("-", "")
    try:
        trace_id = int(hex_digits, 16) if len(hex_digits) == 32 else 0
    except ValueError:
        trace_id = 0
    if trace_id == 0:
        return trace.set_span_in_context(trace.INVALID_SPAN)  # a new trace of its own
    span_id = (trace_id & 0xFFFF_FFFF_FFFF_FFFF) or 1
    parent = SpanContext(trace_id=trace_id, span_id=span_id, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(parent))


def current_traceparent() -> str | None:
    """The active span as a W3C traceparent, or None outside a (sampled) span."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


def link_to_traceparent(traceparent: str | None) -> list[trace.Link]:
    """A span link to the span a traceparent names (none if absent or malformed)."""
    if not traceparent:
        return []
    span = trace.get_current_span(propagate.extract({"traceparent": traceparent}))
    context = span.get_span_context()
    return [trace.Link(context)] if context.is_valid else []


def inject_headers() -> list[tuple[str, bytes]]:
    """The current trace context as Kafka headers."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(key, value.encode()) for key, value in carrier.items()]


def extract_context(headers: KafkaHeaders | None) -> otel_context.Context:
    """The trace context a Kafka message carried, to parent the consumer's span."""
    carrier = {key: value.decode(errors="replace") for key, value in (headers or ())}
    return propagate.extract(carrier)


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, with the active trace and span ids."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            entry["trace_id"] = format(span_context.trace_id, "032x")
            entry["span_id"] = format(span_context.span_id, "016x")
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    # A dependency outage is logged by the dependency monitor, not by every retry of every client.
    handler.addFilter(OUTAGE_LOGS)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiokafka", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
