"""`lockgate status`: every queue's weight, fair / adjusted / actual share and pods by phase.

Why it reads two answers with `-o wide`: `/api/v1/status` is computed from Postgres with the
same code as the Events on waiting pods; the scheduler leader's own report (`/api/v1/fairness`,
served by the admin API where it can reach the leader) adds what only the round knows: the
demand share, its constrained fair target, what was released last round and, where the
scheduler computes them, each cluster's target and actual share (`"clusters": {name:
{"target", "actual"}}`). A server without that report shows `-` there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from lockgate_cli.client import ApiError
from lockgate_cli.output import Output, Table, View, duration, output_option, share, weight
from lockgate_cli.session import Session, runs
from lockgate_cli.watching import show, watch_option


@click.command("status")
@output_option
@watch_option
@runs
def command(session: Session, output: Output, watch: bool, interval: float) -> None:
    """Every queue: weight, shares, pods by phase, oldest wait (-o wide: per cluster too)."""
    api = session.api()

    def fetch() -> View:
        answer = api.request("GET", "/api/v1/status")
        report = _fairness(session) if output.kind == "wide" else None
        return status_view(answer, report)

    show(session.out, output, fetch, watch=watch, interval=interval)


def _fairness(session: Session) -> dict[str, Any] | None:
    try:
        report: dict[str, Any] = session.api().request("GET", "/api/v1/fairness")
    except ApiError as error:
        if error.status in (404, 503):
            return None  # an older server, or no scheduler leader to ask
        raise
    return report


def status_view(answer: dict[str, Any], report: Mapping[str, Any] | None = None) -> View:
    by_queue = {q.get("name") or q.get("queue"): q for q in (report or {}).get("queues") or []}
    clusters = sorted({c for q in by_queue.values() for c in _per_cluster(q)})

    def table() -> Table:
        header = ["QUEUE", "WEIGHT", "FAIR", "ADJUSTED", "ACTUAL", "QUEUED", "RELEASED",
                  "RUNNING", "OLDEST-WAIT", "NOTE", "DEMAND", "TARGET", "RELEASED-LAST-ROUND"]
        header += [f"{c.upper()}:TARGET/ACTUAL" for c in clusters]
        rows = []
        for q in answer["queues"]:
            fair = by_queue.get(q["queue"]) or {}
            per_cluster = _per_cluster(fair)
            rows.append(
                [q["queue"], weight(q["weight"]), share(q["fair_share"]),
                 share(q["adjusted_fair_share"]), share(q["actual_share"]), str(q["queued"]),
                 str(q["released"]), str(q["running"]), duration(q.get("oldest_wait_seconds")),
                 _queue_note(q), share(fair.get("demand_share")),
                 share(fair.get("fair_target")), str(fair.get("released_last_round", "-"))]
                + [_cluster_shares(per_cluster.get(c)) for c in clusters])
        return Table(header, rows, wide=3 + len(clusters),
                     empty="no queues yet: create one with "
                           "`lockgate queue create NAME --namespace NS`")

    data = dict(answer)
    if report is not None:
        data["fairness"] = report
    return View(data, table=table, names=lambda: [f"queue/{q['queue']}"
                                                  for q in answer["queues"]])


def _per_cluster(queue: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """A queue's per-cluster figures in the scheduler's report, by cluster, if it has any
    (a mapping or a list of {"cluster": ...})."""
    found = queue.get("clusters") or queue.get("per_cluster") or {}
    if isinstance(found, list):
        return {str(entry.get("cluster") or entry.get("name")): entry for entry in found
                if isinstance(entry, Mapping)}
    if isinstance(found, Mapping):
        return {str(k): v for k, v in found.items() if isinstance(v, Mapping)}
    return {}


def _cluster_shares(entry: Mapping[str, Any] | None) -> str:
    if not entry:
        return "-"
    fair = entry.get("target", entry.get("fair_target", entry.get("fair_share")))
    actual = entry.get("actual", entry.get("actual_share"))
    return f"{share(fair)}/{share(actual)}"


def _queue_note(q: Mapping[str, Any]) -> str:
    notes = []
    if not q["defined"]:
        notes.append("undefined")
    if q["cordoned"]:
        notes.append("cordoned")
    if q.get("unschedulable"):
        notes.append(f"{q['unschedulable']} fit no node")
    if q.get("backing_off"):
        notes.append(f"{q['backing_off']} backing off")
    if q.get("max_queued_seconds"):
        notes.append(f"max queued {duration(q['max_queued_seconds'])}")
    return ", ".join(notes) or "-"
