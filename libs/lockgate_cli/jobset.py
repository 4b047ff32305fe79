"""`lockgate jobset list|describe|cancel`: job sets, the pods of one job.

`cancel` sends a command (over Kafka, through the admin API) and returns once it is accepted;
the effects follow: the job set's jobs end `cancelled` with the reason, its pods are deleted in
every cluster and its ephemeral namespaces collected. `--wait` waits for the namespaces.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import click

from lockgate_cli.client import CliError, JsonClient, quote
from lockgate_cli.completing import complete_queue
from lockgate_cli.output import (
    Output,
    Table,
    View,
    age,
    amounts,
    counted,
    dump_structured,
    output_option,
    output_option_for,
    print_table,
    render,
)
from lockgate_cli.params import Duration
from lockgate_cli.session import Session, runs
from lockgate_cli.watching import show, watch_option

POLL_SECONDS = 0.5


@click.group("jobset")
def group() -> None:
    """Job sets: the pods of one job (list, describe, cancel)."""


@group.command("list")
@click.option("--queue", shell_complete=complete_queue, help="only this queue's job sets")
@click.option("--all", "everything", is_flag=True,
              help="also job sets whose pods have all finished")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True)
@output_option_for("{.jobsets[*].jobset}")
@watch_option
@runs
def list_jobsets(session: Session, queue: str | None, everything: bool, limit: int,
                 output: Output, watch: bool, interval: float) -> None:
    """Job sets with unfinished pods, their pods by state."""
    query = {"limit": str(limit)}
    if queue:
        query["queue"] = queue
    if everything:
        query["all"] = "true"
    api = session.api()

    def fetch() -> View:
        answer = api.request("GET", "/api/v1/jobsets", query=query)
        return View(answer, table=lambda: Table(
            ["QUEUE", "JOBSET", "PODS", "QUEUED", "RUNNING", "FINISHED", "CLUSTERS",
             "OLDEST-WAIT", "AGE", "NAMESPACES"],
            [_jobset_row(s) for s in answer["jobsets"]], wide=1,
            empty="no job sets with unfinished pods"
                  + (f" in queue {queue}" if queue else "")
                  + ("" if everything else " (--all includes finished ones)")),
            names=lambda: [f"jobset/{s['queue']}/{s['jobset']}" for s in answer["jobsets"]])

    show(session.out, output, fetch, watch=watch, interval=interval)


def _jobset_row(s: Mapping[str, Any]) -> list[str]:
    by_state = s["by_state"]
    running = sum(by_state.get(k, 0) for k in ("released", "ungated", "bound", "running"))
    finished = sum(by_state.get(k, 0) for k in ("succeeded", "failed", "deleted", "cancelled"))
    return [s["queue"], s["jobset"], str(s["pods"]), str(by_state.get("queued", 0)),
            str(running), str(finished), ",".join(s["clusters"]), age(s["oldest_queued_at"]),
            age(s["first_created_at"]), ",".join(s.get("namespaces") or []) or "-"]


@group.command("describe")
@click.argument("queue", shell_complete=complete_queue)
@click.argument("jobset")
@output_option
@runs
def describe(session: Session, queue: str, jobset: str, output: Output) -> None:
    """One job set: its pods by state, and each pod."""
    answer = session.api().request("GET", f"/api/v1/jobsets/{quote(queue)}/{quote(jobset)}")

    def table() -> Table:
        header = (f"Job set {answer['jobset']} in queue {answer['queue']}: "
                  f"{counted(answer['pods'], 'pod')} ("
                  + ", ".join(f"{n} {state}" for state, n in answer["by_state"].items())
                  + f"), clusters {','.join(answer['clusters'])}, namespaces "
                  f"{','.join(answer['namespaces'])}")
        notes = [header]
        if answer["jobs_shown"] < answer["pods"]:
            notes.append(f"showing the oldest {counted(answer['jobs_shown'], 'pod')} "
                         "(-o json has them)")
        return Table(["CLUSTER", "NAMESPACE", "NAME", "STATE", "REQUESTS", "AGE", "REASON",
                      "NODE"],
                     [[j["cluster"], j["namespace"], j["name"], j["state"],
                       amounts(j["requests"]), age(j["created_at"]), j["last_reason"] or "-",
                       j.get("node_name") or "-"]
                      for j in answer["jobs"]], wide=1, notes=notes)

    render(session.out, output, View(answer, table=table, names=lambda: [
        f"pod/{j['cluster']}/{j['namespace']}/{j['name']}" for j in answer["jobs"]]))


@group.command("cancel")
@click.argument("queue", shell_complete=complete_queue)
@click.argument("jobset")
@click.option("--reason", help="why (kept on its jobs and namespace records)")
@click.option("--wait", type=Duration(allow_zero=True), default=0.0, metavar="DURATION",
              help="wait up to this long (e.g. 30s, 2m) until its namespaces are deleted")
@output_option
@runs
def cancel(session: Session, queue: str, jobset: str, reason: str | None, wait: float,
           output: Output) -> None:
    """Cancel a job set: its pods are deleted in every cluster, its jobs end cancelled with the
    reason, its ephemeral namespaces are collected."""
    api = session.api()
    command = api.request("POST", f"/api/v1/jobsets/{quote(queue)}/{quote(jobset)}/cancel",
                          {"reason": reason} if reason else {})
    result: dict[str, Any] = {"cancel": command}
    if wait > 0:
        result["namespaces"] = _wait_for_jobset(api, queue, jobset, wait)
    if output.kind == "name":
        print(f"jobset/{queue}/{jobset}", file=session.out)
        return
    if dump_structured(session.out, output, result):
        return
    print(f"job set {queue}/{jobset} cancelled ({command['reason']}); its pods are being "
          "deleted and its namespaces collected", file=session.out)
    if "namespaces" in result:
        print_records(result["namespaces"], session)


def _wait_for_jobset(api: JsonClient, queue: str, jobset: str,
                     seconds: float) -> list[dict[str, Any]]:
    """Until the cancel is applied and each namespace it collects is deleted."""
    deadline = time.monotonic() + seconds
    path = f"/api/v1/jobsets/{quote(queue)}/{quote(jobset)}/cancellation"
    while True:
        try:
            applied = api.request("GET", path)
        except CliError:
            applied = None
        if applied is not None:
            records = applied.get("namespaces") or []
            if all(r["state"] == "deleted" for r in records):
                return list(records)
        if time.monotonic() > deadline:
            raise CliError(f"job set {queue}/{jobset}: its namespaces are not all deleted "
                           f"after {seconds:g}s; collection goes on, look again later")
        time.sleep(POLL_SECONDS)


def print_records(records: list[dict[str, Any]], session: Session) -> None:
    if not records:
        print("no ephemeral namespaces", file=session.out)
        return
    print_table(session.out, ["CLUSTER", "NAMESPACE", "STATE", "TRIGGER", "DELETED"],
                [[r["cluster"], r["name"], r["state"], r.get("trigger") or "-",
                  r.get("deleted_at") or "-"] for r in records])
