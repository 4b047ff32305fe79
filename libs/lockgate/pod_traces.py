"""A pod's journey as spans in time order, from the trace store's answer: the waterfall.

Why in the core: `lockgate trace` prints it and the web UI's pod page shows it; both read the
same trace (the pod's trace id is its uid without dashes, `lockgate_adapters.telemetry`) from
Jaeger's query API and need the same tree: which span is under which, when each began relative
to the first, and which spans of other traces it links to (the admission review, which happens
before the pod has a uid, and the scheduling round that released it). Pure: it takes the
decoded JSON of `GET /api/traces/{id}` and returns rows.

Jaeger's answer: {"data": [{"traceID", "spans": [{"traceID", "spanID", "operationName",
"references": [{"refType": "CHILD_OF" | "FOLLOWS_FROM", "traceID", "spanID"}], "startTime" (µs
since the epoch), "duration" (µs), "tags": [{"key", "type", "value"}], "processID"}],
"processes": {id: {"serviceName", "tags"}}}]}. An OpenTelemetry link arrives as a FOLLOWS_FROM
reference; a parent that was never recorded (the span standing for the pod itself) leaves its
child a root.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class TraceFormatError(ValueError):
    """The trace store's answer is not shaped as Jaeger's query API answers."""


def trace_id_of_uid(uid: str) -> str:
    """The trace id of a pod's journey: its uid without dashes, lower case."""
    return uid.replace("-", "").lower()


@dataclass(frozen=True)
class TraceSpan:
    trace_id: str
    span_id: str
    parent_id: str | None  # None: a root of its trace (or its parent was never recorded)
    service: str
    name: str
    start_us: int
    duration_us: int
    attributes: Mapping[str, str] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id) of spans it links to
    error: bool = False

    @property
    def end_us(self) -> int:
        return self.start_us + self.duration_us


@dataclass(frozen=True)
class WaterfallRow:
    span: TraceSpan
    depth: int  # 0 for a root
    offset_us: int  # from the earliest span shown
    linked: bool  # from another trace, linked from the pod's

    @property
    def synthetic(self) -> bool:
        """Not a recorded span: the wait in line, worked out from the others."""
        return not self.span.span_id


@dataclass(frozen=True)
class Waterfall:
    rows: tuple[WaterfallRow, ...]
    start_us: int
    total_us: int

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(sorted({row.span.service for row in self.rows if not row.synthetic}))

    @property
    def recorded(self) -> int:
        """The spans the services recorded (the wait in line is none of them)."""
        return sum(1 for row in self.rows if not row.synthetic)


def spans_from_jaeger(document: Mapping[str, Any]) -> list[TraceSpan]:
    """Every span of every trace in a Jaeger query answer."""
    data = document.get("data")
    if data is None:
        return []
    if not isinstance(data, list):
        raise TraceFormatError("the answer's 'data' is not a list of traces")
    spans: list[TraceSpan] = []
    for trace in data:
        if not isinstance(trace, Mapping) or not isinstance(trace.get("spans"), list):
            raise TraceFormatError("a trace without a list of 'spans'")
        processes = trace.get("processes") or {}
        for raw in trace["spans"]:
            spans.append(_span(raw, processes))
    return spans


def _span(raw: Any, processes: Mapping[str, Any]) -> TraceSpan:
    try:
        trace_id, span_id = str(raw["traceID"]), str(raw["spanID"])
        parent: str | None = None
        links: list[tuple[str, str]] = []
        for reference in raw.get("references") or []:
            ref_trace, ref_span = str(reference["traceID"]), str(reference["spanID"])
            if reference.get("refType") == "CHILD_OF" and ref_trace == trace_id \
                    and parent is None:
                parent = ref_span
            else:
                links.append((ref_trace, ref_span))
        attributes = {str(tag["key"]): _tag_text(tag.get("value"))
                      for tag in raw.get("tags") or []}
        process = processes.get(raw.get("processID")) or {}
        return TraceSpan(
            trace_id=trace_id, span_id=span_id, parent_id=parent,
            service=str(process.get("serviceName") or "?"),
            name=str(raw.get("operationName") or "?"),
            start_us=int(raw["startTime"]), duration_us=int(raw.get("duration") or 0),
            attributes=attributes, links=tuple(links),
            error=attributes.get("error") == "true"
            or attributes.get("otel.status_code") == "ERROR")
    except (KeyError, TypeError, ValueError) as error:
        raise TraceFormatError(f"a span the trace store sent is malformed: {error!r}") from error


def _tag_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def linked_traces(spans: Iterable[TraceSpan]) -> list[str]:
    """Trace ids the spans link to that are not among them, in the order first linked."""
    spans = list(spans)
    have = {span.trace_id for span in spans}
    wanted: list[str] = []
    for span in sorted(spans, key=lambda s: s.start_us):
        for trace_id, _ in span.links:
            if trace_id not in have and trace_id not in wanted:
                wanted.append(trace_id)
    return wanted


def waterfall(pod_spans: Sequence[TraceSpan], linked: Sequence[TraceSpan] = ()) -> Waterfall:
    """The pod's spans as a tree in time order, and each span of another trace the pod's
    spans link to (only those, and what is under them: a scheduling round's trace holds far
    more than this pod)."""
    own = {span.span_id: span for span in pod_spans}
    wanted_links = {span_id for span in pod_spans for _, span_id in span.links}
    others = _with_descendants([s for s in linked if s.span_id in wanted_links], linked)
    shown = list(own.values()) + [s for s in others if s.span_id not in own]
    if not shown:
        return Waterfall((), 0, 0)
    start = min(s.start_us for s in shown)
    total = max(s.end_us for s in shown) - start
    by_id = {s.span_id: s for s in shown}
    children: dict[str | None, list[TraceSpan]] = {}
    for span in shown:
        parent = span.parent_id if span.parent_id in by_id else None
        children.setdefault(parent, []).append(span)
    linked_ids = {s.span_id for s in others} - set(own)
    rows: list[WaterfallRow] = []

    def visit(span: TraceSpan, depth: int) -> None:
        rows.append(WaterfallRow(span, depth, span.start_us - start,
                                 span.span_id in linked_ids))
        for child in sorted(children.get(span.span_id, []), key=_order):
            visit(child, depth + 1)

    for root in sorted(children.get(None, []), key=_order):
        visit(root, 0)
    _add_wait_in_line(rows, list(own.values()), start)
    return Waterfall(tuple(rows), start, total)


RELEASE_DECIDED = "release decided"  # the leader's span (fair_scheduler.leading)
WAIT_IN_LINE = "waiting in line"


def _add_wait_in_line(rows: list[WaterfallRow], own: Sequence[TraceSpan], start: int) -> None:
    """A row for the time the pod waited in its queue: from the end of its last span before
    the release was decided (stored by queue-store) to that decision. No service records it,
    as nothing runs then, but it is most of a queued pod's journey: without it the chart is
    a gap, and every span a hairline beside it."""
    decided = next((i for i, row in enumerate(rows)
                    if row.span.name == RELEASE_DECIDED and not row.linked), None)
    if decided is None:
        return
    release = rows[decided].span
    before = [s.end_us for s in own if s is not release and s.end_us <= release.start_us]
    if not before or release.start_us - max(before) <= 0:
        return
    begun = max(before)
    wait = TraceSpan(trace_id=release.trace_id, span_id="", parent_id=release.parent_id,
                     service="lockgate", name=WAIT_IN_LINE, start_us=begun,
                     duration_us=release.start_us - begun,
                     attributes={"lockgate.synthetic": "the pod waited in its queue"})
    # In time order among the trees: before the first one that begins after the wait does
    # (the round that released it, linked from another trace, overlaps its end).
    at = next((i for i, row in enumerate(rows) if row.depth == 0 and row.span.start_us >= begun),
              decided)
    rows.insert(at, WaterfallRow(wait, 0, begun - start, False))


def waterfall_json(chart: Waterfall) -> dict[str, Any]:
    """The chart as JSON: what `lockgate trace -o json` prints and the web UI's pod page draws
    (one shape, so the two cannot tell different stories)."""
    return {"total_us": chart.total_us, "services": list(chart.services),
            "spans": [{"service": r.span.service, "name": r.span.name, "depth": r.depth,
                       "offset_us": r.offset_us, "duration_us": r.span.duration_us,
                       "trace_id": r.span.trace_id, "span_id": r.span.span_id,
                       "parent_id": r.span.parent_id, "linked": r.linked,
                       "wait": r.synthetic,
                       "error": r.span.error, "attributes": dict(r.span.attributes)}
                      for r in chart.rows]}


def _order(span: TraceSpan) -> tuple[int, str]:
    return span.start_us, span.span_id


def _with_descendants(roots: Sequence[TraceSpan], spans: Sequence[TraceSpan]
                      ) -> list[TraceSpan]:
    chosen = {span.span_id: span for span in roots}
    grew = True
    while grew:
        grew = False
        for span in spans:
            if span.span_id not in chosen and span.parent_id in chosen:
                chosen[span.span_id] = span
                grew = True
    return list(chosen.values())


def format_micros(micros: int) -> str:
    """850µs, 12.3ms, 1.52s, 2m5s: a span's length as a person reads it."""
    if micros < 1000:
        return f"{micros}µs"
    if micros < 1_000_000:
        milliseconds = micros / 1000
        return f"{milliseconds:.3g}ms" if milliseconds < 100 else f"{milliseconds:.0f}ms"
    seconds = micros / 1_000_000
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60}m"
