"""`lockgate trace CLUSTER/NAMESPACE/POD`: the pod's journey as a waterfall in the terminal.

The pod's uid comes from the admin API; its trace (trace id = the uid without dashes) from the
trace store's query API (Jaeger's `GET /api/traces/{id}`; the URL from --traces,
LOCKGATE_TRACES_URL or the context's `traces`). Spans of other traces that the pod's spans link
to (its admission review, the scheduling round that released it) are fetched too and shown,
marked `~`, where they happened. `-o wide` adds each span's attributes; `-o json|yaml` gives
the rows.

    Trace 6f1c2d3e... of pod cluster-a/team-a/sleeper-x: 6 spans from 5 services over 1.21s
    SERVICE            SPAN                  START  DURATION  0s                     1.21s
    admission-webhook  ~admission review        0s     3.1ms  |#                        |
    cluster-watcher    pod observed          101ms     0.2ms  |  #                      |
    ...
"""

from __future__ import annotations

import shutil
from typing import Any, TextIO

import click

from lockgate.pod_traces import (
    TraceFormatError,
    TraceSpan,
    Waterfall,
    format_micros,
    linked_traces,
    spans_from_jaeger,
    trace_id_of_uid,
    waterfall,
    waterfall_json,
)
from lockgate_cli.client import ApiError, CliError, JsonClient, quote
from lockgate_cli.explain import find_pod
from lockgate_cli.output import Output, dump_structured, output_option
from lockgate_cli.params import POD
from lockgate_cli.session import Session, runs

MAX_LINKED_TRACES = 8
MIN_BAR = 20
MIN_NAME = 16
# Attributes every span of the journey carries: noise in the wide view.
COMMON_ATTRIBUTES = frozenset({"lockgate.cluster", "lockgate.namespace", "lockgate.pod",
                               "lockgate.name", "lockgate.uid", "otel.scope.name",
                               "otel.scope.version", "span.kind", "internal.span.format"})


@click.command("trace")
@click.argument("pod", type=POD, metavar="CLUSTER/NAMESPACE/POD")
@click.option("--width", type=click.IntRange(min=40), metavar="COLUMNS",
              help="the waterfall's width (default: the terminal's, or 100 in a pipe)")
@output_option
@runs
def command(session: Session, pod: tuple[str, ...], width: int | None, output: Output) -> None:
    """The pod's spans as a waterfall: admission, observed, stored, decided, released (the
    trace store: --traces URL, LOCKGATE_TRACES_URL or the context's traces)."""
    found = find_pod(session, pod)
    uid = str(found["pod"]["uid"])
    trace_id = trace_id_of_uid(uid)
    store = session.traces()
    spans = fetch_trace(store, trace_id)
    if not spans:
        raise CliError(f"no trace {trace_id} of pod {'/'.join(pod)} (uid {uid}) in the trace "
                       f"store at {store.base_url} yet: spans arrive a few seconds after each "
                       "step; are the services sending to it (LOCKGATE_OTLP_ENDPOINT)?")
    linked: list[TraceSpan] = []
    for other in linked_traces(spans)[:MAX_LINKED_TRACES]:
        linked += fetch_trace(store, other)  # missing (sampled out, expired): shown without
    chart = waterfall(spans, linked)
    data = trace_json(chart, pod="/".join(pod), uid=uid, trace_id=trace_id)
    if output.kind == "name":
        for row in chart.rows:
            print(f"span/{row.span.trace_id}/{row.span.span_id}", file=session.out)
        return
    if dump_structured(session.out, output, data):
        return
    columns = width or _terminal_width(session.out)
    for line in render_waterfall(chart, pod="/".join(pod), trace_id=trace_id, width=columns,
                                 wide=output.kind == "wide"):
        print(line, file=session.out)


def fetch_trace(store: JsonClient, trace_id: str) -> list[TraceSpan]:
    try:
        answer = store.request("GET", f"/api/traces/{quote(trace_id)}")
    except ApiError as error:
        if error.status == 404:
            return []
        raise
    try:
        return spans_from_jaeger(answer or {})
    except TraceFormatError as error:
        raise CliError(f"{error} (is {store.base_url} Jaeger's query API?)") from error


def _terminal_width(out: TextIO) -> int:
    if out.isatty():
        return shutil.get_terminal_size((100, 24)).columns
    return 100


def trace_json(chart: Waterfall, *, pod: str, uid: str, trace_id: str) -> dict[str, Any]:
    return {"pod": pod, "uid": uid, "trace_id": trace_id, **waterfall_json(chart)}


def render_waterfall(chart: Waterfall, *, pod: str, trace_id: str, width: int = 100,
                     wide: bool = False, bar_char: str = "#") -> list[str]:
    """The chart as lines of at most `width` columns (the attributes may run past it)."""
    rows = chart.rows
    services = chart.services
    lines = [f"Trace {trace_id} of pod {pod}: {chart.recorded} spans from {len(services)} "
             f"service{'s' if len(services) != 1 else ''} over {format_micros(chart.total_us)}"]
    names = [("  " * r.depth) + ("~" if r.linked else "") + r.span.name
             + (" (error)" if r.span.error else "") for r in rows]
    starts = [format_micros(r.offset_us) if r.offset_us else "0s" for r in rows]
    lengths = [format_micros(r.span.duration_us) for r in rows]
    service_width = max([len("SERVICE"), *(len(r.span.service) for r in rows)])
    name_width = max([len("SPAN"), *(len(n) for n in names)])
    start_width = max([len("START"), *(len(s) for s in starts)])
    length_width = max([len("DURATION"), *(len(d) for d in lengths)])
    fixed = service_width + name_width + start_width + length_width + 4 * 2 + 2
    if fixed + MIN_BAR > width:  # a narrow terminal: shorten the span names, not the bars
        name_width = max(MIN_NAME, name_width - (fixed + MIN_BAR - width))
        names = [_shortened(n, name_width) for n in names]
        fixed = service_width + name_width + start_width + length_width + 4 * 2 + 2
    bar = max(MIN_BAR, width - fixed)
    scale = format_micros(chart.total_us)
    ruler = "0s".ljust(bar + 2 - len(scale)) + scale
    lines.append("  ".join(["SERVICE".ljust(service_width), "SPAN".ljust(name_width),
                            "START".rjust(start_width), "DURATION".rjust(length_width),
                            ruler]))
    for row, name, start, length in zip(rows, names, starts, lengths, strict=True):
        line = "  ".join([row.span.service.ljust(service_width), name.ljust(name_width),
                          start.rjust(start_width), length.rjust(length_width),
                          "|" + bar_cells(row.offset_us, row.span.duration_us,
                                          chart.total_us, bar, bar_char) + "|"])
        if wide:
            extra = {k: v for k, v in sorted(row.span.attributes.items())
                     if k not in COMMON_ATTRIBUTES}
            if extra:
                line += "  " + " ".join(f"{k}={v}" for k, v in extra.items())
        lines.append(line)
    if any(r.linked for r in rows):
        lines.append("~ a span of another trace the pod's spans link to (its admission "
                     "review, the round that released it)")
    return lines


def _shortened(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def bar_cells(offset_us: int, duration_us: int, total_us: int, width: int,
              char: str = "#") -> str:
    """`width` cells with the span's extent marked (at least one cell, so an instant shows)."""
    if total_us <= 0:
        return char + " " * (width - 1)
    first = min(width - 1, int(offset_us * width / total_us))
    last = min(width, max(first + 1, round((offset_us + duration_us) * width / total_us)))
    return " " * first + char * (last - first) + " " * (width - last)
