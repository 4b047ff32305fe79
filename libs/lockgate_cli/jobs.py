"""`lockgate jobs list`: unfinished jobs (one per pod), oldest first, each with why it waits (the
scheduler's reason) and a hint when their queue cannot release them (unknown, cordoned, bound to
no namespace): "why isn't my job scheduled?". A page cut by `--limit` says how many it shows."""

from __future__ import annotations

from typing import Any

import click

from lockgate_cli.completing import complete_cluster
from lockgate_cli.output import Output, Table, View, age, amounts, output_option_for
from lockgate_cli.session import Session, runs
from lockgate_cli.watching import show, watch_option

STATES = ("queued", "released", "ungated", "bound", "running", "succeeded", "failed",
          "deleted", "cancelled")


@click.group("jobs")
def group() -> None:
    """Look at jobs: one per pod lockgate gates."""


@group.command("list")
@click.option("--queue", help="only this queue's jobs")
@click.option("--state", type=click.Choice(STATES), help="only jobs in this state")
@click.option("--cluster", shell_complete=complete_cluster, help="only this cluster's jobs")
@click.option("--all", "everything", is_flag=True,
              help="also jobs that ended (succeeded, failed, deleted, cancelled)")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="at most this many (the output says when there are more)")
@output_option_for("{.jobs[*].name}")
@watch_option
@runs
def list_jobs(session: Session, queue: str | None, state: str | None, cluster: str | None,
              everything: bool, limit: int, output: Output, watch: bool,
              interval: float) -> None:
    """List unfinished jobs, oldest first, and why each waits (why isn't my job scheduled?)."""
    if cluster is not None:
        session.check_cluster(cluster, what="--cluster")
    query = {name: str(value) for name, value in (
        ("queue", queue), ("state", state), ("cluster", cluster), ("limit", limit))
        if value is not None}
    if everything:
        query["all"] = "true"
    api = session.api()
    show(session.out, output, lambda: jobs_view(api.request("GET", "/api/v1/jobs", query=query),
                                                query),
         watch=watch, interval=interval)


def jobs_view(answer: dict[str, Any], query: dict[str, str]) -> View:
    filters = ", ".join(f"{k}={v}" for k, v in query.items() if k not in ("limit", "all"))
    jobs = answer["jobs"]
    total = answer.get("total", len(jobs))
    cut = [f"showing {len(jobs)} of {total} (--limit for more)"] if total > len(jobs) else []
    if answer.get("reasons_unavailable"):
        cut.append(f"REASON is what Postgres keeps: {answer['reasons_unavailable']}")
    unfinished = "state" not in query and "all" not in query

    def table() -> Table:
        return Table(
            ["CLUSTER", "NAMESPACE", "NAME", "QUEUE", "JOBSET", "STATE", "REQUESTS", "ATTEMPTS",
             "REASON", "NODE", "AGE", "UID"],
            [[j["cluster"], j["namespace"], j["name"], j["queue"], j["jobset"], j["state"],
              amounts(j["requests"]), str(j["release_attempts"]),
              j.get("reason") or j["last_reason"] or "-",
              j.get("node_name") or "-", age(j.get("created_at")), j["uid"]]
             for j in jobs],
            wide=3, notes=[*cut, *answer.get("hints", [])],
            empty=f"no {'unfinished ' if unfinished else ''}jobs"
                  f"{' with ' + filters if filters else ''}"
                  f"{' (--all for those that ended)' if unfinished else ''}")

    return View(answer, table=table, names=lambda: [
        f"pod/{j['cluster']}/{j['namespace']}/{j['name']}" for j in jobs])
