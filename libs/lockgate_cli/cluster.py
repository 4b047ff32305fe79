"""`lockgate cluster list`: the worker clusters lockgate knows, their capacity and use by queue.

Why a noun: every command that takes a cluster (`--namespace cluster-a/team-a`, `--cluster`,
CLUSTER/NAMESPACE/POD) refuses one lockgate does not know and points here for the names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from lockgate_cli.output import Output, Table, View, amounts, output_option_for
from lockgate_cli.session import Session, runs
from lockgate_cli.watching import show, watch_option


@click.group("cluster")
def group() -> None:
    """Worker clusters: their nodes, capacity and what each queue holds there."""


@group.command("list")
@output_option_for("{.clusters[*].name}")
@watch_option
@runs
def list_clusters(session: Session, output: Output, watch: bool, interval: float) -> None:
    """The clusters lockgate knows (those whose cluster-watcher has reported)."""
    api = session.api()

    def fetch() -> View:
        answer = api.request("GET", "/api/v1/clusters")
        return View(answer, table=lambda: Table(
            ["NAME", "NODES", "SCHEDULABLE", "CAPACITY", "QUEUED", "HELD-BY-QUEUE",
             "UNMANAGED"],
            [_row(c) for c in answer["clusters"]], wide=2,
            empty="lockgate knows no cluster yet: it learns of one when its cluster-watcher "
                  "reports"),
            names=lambda: [f"cluster/{c['name']}" for c in answer["clusters"]])

    show(session.out, output, fetch, watch=watch, interval=interval)


def _row(cluster: Mapping[str, Any]) -> list[str]:
    # The admin API lists them ([{"queue": name, ...}]); an older one keyed them by name.
    listed = cluster.get("queues") or {}
    queues: Mapping[str, Mapping[str, Any]] = (
        {str(q.get("queue")): q for q in listed} if isinstance(listed, list) else listed)
    held = "; ".join(f"{name}: {amounts(q.get('holding'))}" for name, q in sorted(queues.items())
                     if q.get("holding"))
    return [cluster["name"], str(cluster.get("nodes", "-")),
            str(cluster.get("schedulable_nodes", "-")), amounts(cluster.get("capacity")),
            str(sum(int(q.get("queued") or 0) for q in queues.values())), held or "-",
            amounts(cluster.get("unmanaged"))]
