"""`lockgate status`, `lockgate explain` and `lockgate jobset list|describe`: read-only views.

Why: "how do the queues stand?" and "why is my pod still pending?" are the questions users ask
first. The answers come from the admin API (`queue_store.admin_views`), computed with the same
code as the Events on waiting pods.

    lockgate status [-o table|json|yaml]
    lockgate explain CLUSTER/NAMESPACE/POD [-o ...]
    lockgate jobset list [--queue Q] [--all] [-o ...]
    lockgate jobset describe QUEUE JOBSET [-o ...]
"""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Mapping
from typing import Any, Protocol, TextIO

from lockgate_adapters.cli_output import (
    Table,
    age,
    amounts,
    duration,
    render,
    share,
    verbs_of,
)


class _Client(Protocol):
    def request(self, method: str, path: str, body: object = None,
                query: dict[str, str] | None = None) -> Any: ...


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def register(nouns: Any, output_parent: argparse.ArgumentParser) -> None:
    """Add the commands to `lockgate`'s noun subparsers."""
    status = nouns.add_parser("status", parents=[output_parent],
                              help="every queue: shares, pods by phase, oldest wait")
    status.set_defaults(run=show_status)

    explaining = nouns.add_parser(
        "explain", parents=[output_parent],
        help="why a pod is still pending: its queue, position and what it waits for")
    explaining.add_argument("pod", metavar="CLUSTER/NAMESPACE/POD")
    explaining.set_defaults(run=explain)

    jobset = verbs_of(nouns, "jobset", "job sets: list, describe")
    listing = jobset.add_parser("list", parents=[output_parent],
                                help="job sets with unfinished pods, their pods by state")
    listing.add_argument("--queue")
    listing.add_argument("--all", action="store_true",
                         help="also job sets whose pods have all finished")
    listing.add_argument("--limit", type=int, default=1000)
    listing.set_defaults(run=jobset_list)
    describe = jobset.add_parser("describe", parents=[output_parent],
                                 help="one job set: its pods by state, and each pod")
    describe.add_argument("queue")
    describe.add_argument("jobset")
    describe.set_defaults(run=jobset_describe)


def show_status(client: _Client, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.request("GET", "/api/v1/status")

    def table() -> Table:
        return Table(
            ["QUEUE", "WEIGHT", "FAIR", "ADJUSTED", "ACTUAL", "TARGET", "BY-CLUSTER", "QUEUED",
             "RELEASED", "RUNNING", "OLDEST-WAIT", "NOTE"],
            [[q["queue"], f"{q['weight']:.3g}", share(q["fair_share"]),
              share(q["adjusted_fair_share"]), share(q["actual_share"]),
              share(q.get("fair_target", 0.0)), _by_cluster(q), str(q["queued"]),
              str(q["released"]), str(q["running"]), duration(q.get("oldest_wait_seconds")),
              _queue_note(q)] for q in answer["queues"]],
            empty="no queues yet: create one with `lockgate queue create NAME --namespace NS`")

    render(out, args.output, answer, table=table)


def _by_cluster(q: Mapping[str, Any]) -> str:
    """What the queue holds of its fair target in each cluster: "cluster-a 18.8%/18.8%"."""
    targets = q.get("cluster_targets") or {}
    held = q.get("cluster_shares") or {}
    return ", ".join(f"{cluster} {share(held.get(cluster, 0.0))}/{share(targets.get(cluster, 0.0))}"
                     for cluster in sorted({*targets, *held})) or "-"


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


def explain(client: _Client, args: argparse.Namespace, out: TextIO) -> None:
    parts = args.pod.split("/")
    if len(parts) != 3 or not all(parts):
        raise argparse.ArgumentTypeError(
            f"explain takes CLUSTER/NAMESPACE/POD (e.g. cluster-a/team-a/worker-0), not "
            f"{args.pod!r}; `lockgate jobs list --state queued` lists waiting pods")
    answer = client.request("GET", "/api/v1/explain/" + "/".join(_quote(p) for p in parts))
    render(out, args.output, answer, table=lambda: _explanation_fields(answer))


def _explanation_fields(answer: Mapping[str, Any]) -> Mapping[str, str]:
    pod = answer["pod"]
    e = answer.get("explanation")
    fields = {"Pod": f"{pod['cluster']}/{pod['namespace']}/{pod['name']}",
              "Job set": pod["jobset"], "State": pod["state"]}
    if e is None:
        fields["Why"] = answer["message"]
        return fields
    fields.update({
        "Queue": e["queue"] + (" (cordoned)" if e["cordoned"] else "")
        + ("" if e["queue_defined"] else " (not defined)"),
        "Position": f"{e['position']} of {e['queued_in_queue']}" if e["position"] else "-",
        "Waiting for": e["reason"] or "-",
        "Waited": duration(e["waited_seconds"]),
        "Requests": amounts(e["requests"]),
        "Queue weight": f"{e['weight']:.3g}",
        "Fair share": share(e["fair_share"]),
        "Adjusted fair share": share(e["adjusted_fair_share"]),
        "Actual share": share(e["actual_share"]),
        "Fair target": f"{share(e.get('fair_target', 0.0))} of the pool; in {e['cluster']} "
        f"{share(e.get('cluster_target', 0.0))} (holds {share(e.get('cluster_share', 0.0))})",
        "Room held": "-" if not e.get("held_on") else f"on node {e['held_on']}",
        "Queue holds": amounts(e["queue_allocation"]),
        "Queue limits": amounts(e["queue_limits"]),
        "Cluster": f"{e['cluster']} ({e['cluster_nodes']} schedulable nodes)",
        "Cluster room": amounts(e["cluster_free"]),
        "Most room on a node": amounts(e["largest_free_node"]),
        "Largest node": amounts(e["largest_node"]),
        "Queues going first": ", ".join(e["competing_queues"]) or "-",
        "Max time queued": "-" if e["max_queued_seconds"] is None else
        f"{duration(e['max_queued_seconds'])}, then {e['max_queued_action']}"
        f"{' (job set)' if e.get('max_queued_by') == 'jobset' else ''}",
        "Why": e["message"],
    })
    return fields


def jobset_list(client: _Client, args: argparse.Namespace, out: TextIO) -> None:
    query = {"limit": str(args.limit)}
    if args.queue:
        query["queue"] = args.queue
    if args.all:
        query["all"] = "true"
    answer = client.request("GET", "/api/v1/jobsets", query=query)

    def table() -> Table:
        return Table(
            ["QUEUE", "JOBSET", "PODS", "QUEUED", "RUNNING", "FINISHED", "CLUSTERS",
             "OLDEST-WAIT", "AGE"],
            [_jobset_row(s) for s in answer["jobsets"]],
            empty="no job sets with unfinished pods"
                  + (f" in queue {args.queue}" if args.queue else "")
                  + ("" if args.all else " (--all includes finished ones)"))

    render(out, args.output, answer, table=table)


def _jobset_row(s: Mapping[str, Any]) -> list[str]:
    by_state = s["by_state"]
    running = sum(by_state.get(k, 0) for k in ("released", "ungated", "bound", "running"))
    finished = sum(by_state.get(k, 0) for k in ("succeeded", "failed", "deleted"))
    return [s["queue"], s["jobset"], str(s["pods"]), str(by_state.get("queued", 0)),
            str(running), str(finished), ",".join(s["clusters"]), age(s["oldest_queued_at"]),
            age(s["first_created_at"])]


def jobset_describe(client: _Client, args: argparse.Namespace, out: TextIO) -> None:
    answer = client.request(
        "GET", f"/api/v1/jobsets/{_quote(args.queue)}/{_quote(args.jobset)}")

    def table() -> Table:
        header = (f"Job set {answer['jobset']} in queue {answer['queue']}: "
                  f"{answer['pods']} pods ("
                  + ", ".join(f"{n} {state}" for state, n in answer["by_state"].items())
                  + f"), clusters {','.join(answer['clusters'])}, namespaces "
                  f"{','.join(answer['namespaces'])}")
        notes = [header]
        if answer["jobs_shown"] < answer["pods"]:
            notes.append(f"showing the oldest {answer['jobs_shown']} pods (-o json has them)")
        return Table(["CLUSTER", "NAMESPACE", "NAME", "STATE", "REQUESTS", "AGE", "REASON"],
                     [[j["cluster"], j["namespace"], j["name"], j["state"],
                       amounts(j["requests"]), age(j["created_at"]), j["last_reason"] or "-"]
                      for j in answer["jobs"]], notes=notes)

    render(out, args.output, answer, table=table)
