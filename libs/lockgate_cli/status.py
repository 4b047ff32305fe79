"""`lockgate status`: every queue's weight, fair / adjusted / actual share, its constrained fair
target (docs/scheduling.md, "Fair targets") and pods by phase.

`-o wide` adds what the queue holds of its target in each cluster (held/target), and from the
scheduler leader's own report (`/api/v1/fairness`, served by the admin API where it can reach
the leader) what only the round knows: the demand share and what was released last round. A
server without that report shows `-` there. It also adds a section of the clusters that grow
(docs/autoscaling.md): each one's nodes and capacity, each NodePool's headroom, the NodeClaims
in flight, the pods released for growth not bound yet, and whether growth stalled or waits.

With usage history on (docs/scheduling.md, "Usage that decays"), `-o wide` also shows each
queue's decayed usage, as the time it amounts to holding the whole pool (share x seconds:
"4m" is four minutes of the whole pool, or eight of half of it, lately), and the weight the
fair targets divide by (EFF-WEIGHT: its weight x 2^(-usage / share) among its siblings); and
every table says, below it, which queues history ranks below a sibling and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import click

from lockgate_cli.client import ApiError
from lockgate_cli.output import (
    Output,
    Table,
    View,
    amounts,
    duration,
    output_option_for,
    share,
    weight,
)
from lockgate_cli.session import Session, runs
from lockgate_cli.watching import show, watch_option


@click.command("status")
@output_option_for("{.queues[*].queue}")
@click.option("--tree", "as_tree", is_flag=True,
              help="the queue tree: every level's weight, guarantee, limit, fair target and "
                   "actual share")
@watch_option
@runs
def command(session: Session, output: Output, as_tree: bool, watch: bool,
            interval: float) -> None:
    """Every queue: weight, shares, pods by phase, oldest wait (-o wide: per cluster too)."""
    api = session.api()

    # Each queue's target and share in every cluster are queues x clusters numbers (100,000
    # at 1,000 queues in 50 clusters), so the server sends them only when asked: for `-o wide`
    # (BY-CLUSTER) and the structured outputs, whose contract carries them.
    per_cluster = output.kind == "wide" or output.structured
    query = {"clusters": "1"} if per_cluster and not as_tree else None

    def fetch() -> View:
        answer = api.request("GET", "/api/v1/status", query=query)
        if as_tree:
            return tree_view(answer)
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
    # The round's own fields come with each queue from a leader; an older server's status
    # needs its /api/v1/fairness beside.
    by_queue = {q.get("name") or q.get("queue"): q for q in (report or {}).get("queues") or []}

    def table() -> Table:
        rows = []
        for q in answer["queues"]:
            fair = by_queue.get(q["queue"]) or q
            rows.append(
                [q["queue"], weight(q["weight"]), share(q["fair_share"]),
                 share(q["adjusted_fair_share"]), share(q["actual_share"]),
                 share(q.get("fair_target")), str(q["queued"]), str(q["released"]),
                 str(q["running"]), duration(q.get("oldest_wait_seconds")), _queue_note(q),
                 by_cluster(q), share(fair.get("demand_share")),
                 str(fair.get("released_last_round", "-")),
                 duration(q.get("decayed_usage")), weight(q.get("effective_weight"))])
        return Table(
            ["QUEUE", "WEIGHT", "FAIR", "ADJUSTED", "ACTUAL", "TARGET", "QUEUED", "RELEASED",
             "RUNNING", "OLDEST-WAIT", "NOTE", "BY-CLUSTER", "DEMAND", "RELEASED-LAST-ROUND",
             "DECAYED-USAGE", "EFF-WEIGHT"],
            rows, wide=5,
            empty="no queues yet: create one with `lockgate queue create NAME --namespace NS`",
            notes=([f"shares unavailable: {answer['reasons_unavailable']}"]
                   if answer.get("reasons_unavailable") else []) + skipped_gate_warnings(answer)
            + ([f"warning: queue tree: {answer['tree_problem']}"]
               if answer.get("tree_problem") else [])
            + history_notes(answer),
            wide_sections=[("CLUSTERS THAT GROW", growth_table(answer.get("growth") or []))]
            if answer.get("growth") else [])

    # Every time the CLI prints is ISO 8601; a server before issue 38 sent this one as epoch
    # seconds.
    data = {**answer, "queues": [_iso_oldest(q) for q in answer["queues"]]}
    if report is not None:
        data["fairness"] = report
    return View(data, table=table, names=lambda: [f"queue/{q['queue']}"
                                                  for q in answer["queues"]])


def tree_view(answer: Mapping[str, Any]) -> View:
    """The queue tree (`status --tree`), parents before children, each indented under its
    parent. -o json: {"tree": [...], "tree_problem", "at", "leader"} as the server sent it."""
    nodes = answer.get("tree")
    unavailable = nodes is None
    nodes = list(nodes or [])

    def table() -> Table:
        rows = [[("  " * int(n.get("depth") or 0)) + str(n["name"]), weight(n["weight"]),
                 share(n.get("weight_among_siblings")), _amounts(n.get("guarantee")),
                 _amounts(n.get("limit")), share(n.get("fair_target")),
                 share(n.get("actual_share")), share(n.get("demand_share")),
                 str(n.get("standing") or "-"),
                 "-" if n.get("decayed_usage") is None else f"{n['decayed_usage']:.4g}",
                 str(n.get("path") or n["name"])]
                for n in _depth_first(nodes)]
        notes = []
        if unavailable:
            notes.append("the tree is the scheduler leader's: "
                         f"{answer.get('reasons_unavailable') or 'no leader answered'}")
        if answer.get("tree_problem"):
            notes.append(f"warning: {answer['tree_problem']}")
        return Table(["QUEUE", "WEIGHT", "OF-SIBLINGS", "GUARANTEE", "LIMIT", "TARGET",
                      "ACTUAL", "DEMAND", "STANDING", "DECAYED-USAGE", "PATH"],
                     rows, wide=1, empty="no queues yet", notes=notes)

    data = {"at": answer.get("at"), "leader": answer.get("leader"), "tree": nodes,
            "tree_problem": answer.get("tree_problem")}
    return View(data, table=table, names=lambda: [f"queue/{n['name']}" for n in nodes])


def _depth_first(nodes: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Each node followed by its subtree (the server sends parents before children)."""
    children: dict[Any, list[Mapping[str, Any]]] = {}
    for node in nodes:
        children.setdefault(node.get("parent"), []).append(node)
    ordered: list[Mapping[str, Any]] = []
    stack = list(reversed(sorted(children.get(None, []), key=lambda n: str(n["name"]))))
    while stack:
        node = stack.pop()
        ordered.append(node)
        stack.extend(reversed(sorted(children.get(node["name"], []),
                                     key=lambda n: str(n["name"]))))
    return ordered


def _amounts(amounts: Mapping[str, Any] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((amounts or {}).items())) or "-"


def growth_table(growth: list[Mapping[str, Any]]) -> Table:
    """Each autoscaled cluster (the leader's `growth_json`): what exists, what may still be
    added, and what its growth is doing."""
    rows = []
    for cluster in growth:
        rows.append([str(cluster.get("cluster")), str(cluster.get("nodes", "-")),
                     amounts(cluster.get("capacity")), pools_headroom(cluster),
                     ",".join(cluster.get("claims_in_flight") or []) or "-",
                     str(cluster.get("released_unbound", 0)), growth_state(cluster)])
    return Table(["CLUSTER", "NODES", "CAPACITY", "HEADROOM", "NODECLAIMS-IN-FLIGHT",
                  "RELEASED-UNBOUND", "GROWTH"], rows)


def pools_headroom(cluster: Mapping[str, Any]) -> str:
    """Per NodePool, what it may still add: "default: 6 nodes (cpu 48)", or why nothing."""
    said = []
    for pool in cluster.get("node_pools") or []:
        if pool.get("why_none"):
            said.append(f"{pool.get('name')}: none ({pool['why_none']})")
        else:
            left = pool.get("headroom") or {}
            said.append(f"{pool.get('name')}: {pool.get('headroom_nodes', 0)} nodes"
                        + (f" ({amounts(left)})" if left else " (no limit)"))
    return "; ".join(said) or "-"


def growth_state(cluster: Mapping[str, Any]) -> str:
    """"growth stalled: ...", the next wave's wait, or "ok"."""
    return str(cluster.get("stalled") or cluster.get("waiting") or "ok")


def by_cluster(q: Mapping[str, Any]) -> str:
    """What the queue holds of its fair target in each cluster: "cluster-a:18.8%/25.0%"."""
    targets = q.get("cluster_targets") or {}
    held = q.get("cluster_shares") or {}
    return ",".join(f"{cluster}:{share(held.get(cluster, 0.0))}/"
                    f"{share(targets.get(cluster, 0.0))}"
                    for cluster in sorted({*targets, *held})) or "-"


def history_notes(answer: Mapping[str, Any]) -> list[str]:
    """One line per queue usage history ranks below a sibling: "history: queue hog is ranked
    below its sibling idle: hog used 2.0x its share over the last half-life (...)"."""
    return [f"history: queue {q['queue']} is {q['history']}"
            for q in answer["queues"] if q.get("history")]


def skipped_gate_warnings(answer: Mapping[str, Any]) -> list[str]:
    """One warning per queue with pods that ran without lockgate's gate (lockgate.observing)."""
    return [f"warning: {q['skipped_gate']} pod(s) of queue {q['queue']} ran without lockgate's "
            "gate (the webhook did not serve their namespace); they count as the queue's "
            f"usage. See `lockgate jobs list --queue {q['queue']} -o json` (skipped_gate) and "
            "`lockgate explain` on one of them"
            for q in answer["queues"] if q.get("skipped_gate")]


def _queue_note(q: Mapping[str, Any]) -> str:
    notes = []
    if q.get("skipped_gate"):
        notes.append(f"{q['skipped_gate']} skipped the gate")
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


def _iso_oldest(q: Mapping[str, Any]) -> Mapping[str, Any]:
    at = q.get("oldest_queued_at")
    if not isinstance(at, int | float) or isinstance(at, bool):
        return q
    return {**q, "oldest_queued_at": datetime.fromtimestamp(at, UTC).isoformat()}
