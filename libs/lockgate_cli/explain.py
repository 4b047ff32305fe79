"""`lockgate explain CLUSTER/NAMESPACE/POD`: why a pod is still pending, with the numbers.

The answer comes from the admin API, computed with the same code as the Events lockgate writes
on waiting pods (`kubectl describe pod`), so both say the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from lockgate_cli.client import ApiError, quote
from lockgate_cli.output import Output, View, amounts, duration, output_option, render, share
from lockgate_cli.params import POD
from lockgate_cli.session import Session, runs


def find_pod(session: Session, pod: tuple[str, ...]) -> dict[str, Any]:
    """The explain answer for a pod; a 404 on an unknown cluster says so, with the known ones."""
    try:
        answer: dict[str, Any] = session.api().request(
            "GET", "/api/v1/explain/" + "/".join(quote(p) for p in pod))
    except ApiError as error:
        if error.status == 404:
            session.check_cluster(pod[0], what="CLUSTER/NAMESPACE/POD")
        raise
    return answer


@click.command("explain")
@click.argument("pod", type=POD, metavar="CLUSTER/NAMESPACE/POD")
@output_option
@runs
def command(session: Session, pod: tuple[str, ...], output: Output) -> None:
    """Why a pod is still pending: its queue, position and what it waits for."""
    answer = find_pod(session, pod)
    render(session.out, output, View(answer, table=lambda: explanation_fields(answer),
                                     names=lambda: [f"pod/{'/'.join(pod)}"]))


def explanation_fields(answer: Mapping[str, Any]) -> Mapping[str, str]:
    pod = answer["pod"]
    e = answer.get("explanation")
    fields = {"Pod": f"{pod['cluster']}/{pod['namespace']}/{pod['name']}",
              "Job set": pod["jobset"], "State": pod["state"]}
    if pod.get("skipped_gate"):
        fields["Warning"] = "lockgate never gated this pod: it ran without waiting its turn"
    if e is None:
        if answer.get("position"):  # Postgres's place in line, when the leader gave no reason
            fields["Position"] = f"{answer['position']} of {answer['queued_in_queue']}"
        fields["Why"] = answer["message"]
        return fields
    fields.update({
        "Queue": e["queue"] + (" (cordoned)" if e["cordoned"] else "")
        + ("" if e["queue_defined"] else " (not defined)"),
        "Position": f"{e['position']} of {e['queued_in_queue']}" if e["position"] else "-",
        "Waiting for": e["reason"] or "-",
        "Waited": duration(e["waited_seconds"])
        + (f" (in all: it kept the place of deleted pod {answer['kept_place_of']})"
           if answer.get("kept_place_of") else ""),
        "Estimated wait": (answer.get("estimate") or {}).get("text", "-"),
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
        "Pod group": e.get("group") or "-",
        # Its cluster's growth, as it concerns the pod (docs/autoscaling.md): released so that
        # the cluster grows, held over its share, waiting for the last wave, or stalled.
        "Growth": e.get("growth") or "-",
        "Why": e["message"],
    })
    return fields
