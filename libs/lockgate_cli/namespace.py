"""`lockgate namespace create|list|describe|token|delete`: ephemeral namespaces, one per job set.

`create` prints the namespace and what its job's coordinator needs: a kubeconfig holding the
token of the namespace's ServiceAccount (written to --kubeconfig-out with mode 0600, or printed),
valid until the time shown. Running it again for the same queue, job set and cluster returns the
same namespace with a fresh token. `delete` collects one (deleted in its cluster, its record
kept); `--wait` waits until its cluster says it is gone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import click
import yaml

from lockgate_cli.client import CliError, JsonClient, quote
from lockgate_cli.completing import complete_cluster, complete_queue
from lockgate_cli.output import (
    Output,
    Table,
    View,
    dump_structured,
    duration,
    output_option,
    output_option_for,
    print_table,
    render,
    timestamp,
)
from lockgate_cli.params import NAMESPACE_REF, Duration
from lockgate_cli.session import Session, runs
from lockgate_cli.watching import show, watch_option

PATH = "/api/v1/namespaces"
POLL_SECONDS = 0.5
STATES = ("active", "expiring", "deleting", "deleted", "failed")


def _path(cluster: str, name: str) -> str:
    return f"{PATH}/{quote(cluster)}/{quote(name)}"


@click.group("namespace")
def group() -> None:
    """Ephemeral namespaces, one per job set (for Dask, Spark or Ray coordinators)."""


def _write_kubeconfig(path: str, kubeconfig: dict[str, Any]) -> None:
    target = Path(path)
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        yaml.safe_dump(kubeconfig, handle, sort_keys=False)
    target.chmod(0o600)


def _print_credentials(session: Session, answer: dict[str, Any], output: Output,
                       kubeconfig_out: str | None) -> None:
    out = session.out
    if kubeconfig_out:
        _write_kubeconfig(kubeconfig_out, answer["kubeconfig"])
    record = answer["namespace"]
    if output.kind == "name":
        print(f"namespace/{record['cluster']}/{record['name']}", file=out)
        return
    if dump_structured(out, output, answer):
        return
    print(f"namespace {record['cluster']}/{record['name']} ({record['state']}) for queue "
          f"{record['queue']}, job set {record['jobset']}", file=out)
    print(f"service account {record['service_account']}; token valid until "
          f"{answer.get('token_expires_at') or '?'}", file=out)
    if record.get("expires_at"):
        print(f"collected after {record['expires_at']} (ttl {record['ttl_seconds']}s)", file=out)
    if record.get("max_queued"):
        limit = record["max_queued"]
        print(f"its pods wait at most {duration(limit['seconds'])} queued, then are "
              f"{_done(limit.get('action'))}", file=out)
    if kubeconfig_out:
        print(f"kubeconfig for the coordinator written to {kubeconfig_out}", file=out)
    else:
        print("kubeconfig for the coordinator:", file=out)
        yaml.safe_dump(answer["kubeconfig"], out, sort_keys=False)


@group.command("create")
@click.option("--queue", required=True, shell_complete=complete_queue)
@click.option("--jobset", required=True)
@click.option("--cluster", required=True, shell_complete=complete_cluster)
@click.option("--ttl", type=Duration(whole=True), metavar="DURATION",
              help="collect it after this long, e.g. 90m, 2h, 7d")
@click.option("--max-queued-time", type=Duration(whole=True), metavar="DURATION",
              help="the job set's maximum time queued: a pod of the namespace waiting longer "
                   "(e.g. 30m) is failed or deleted, even if its queue allows longer")
@click.option("--on-max-queued", type=click.Choice(["fail", "delete"]),
              help="what becomes of such a pod (default: as its queue says, else fail)")
@click.option("--kubeconfig-out", metavar="FILE",
              help="write the coordinator's kubeconfig here (mode 0600)")
@output_option
@runs
def create(session: Session, queue: str, jobset: str, cluster: str, ttl: int | None,
           max_queued_time: int | None, on_max_queued: str | None,
           kubeconfig_out: str | None, output: Output) -> None:
    """Make a job set's namespace and print its coordinator's kubeconfig (again: the same
    namespace, a fresh token)."""
    if on_max_queued is not None and max_queued_time is None:
        raise click.UsageError("--on-max-queued needs --max-queued-time "
                               "(e.g. --max-queued-time 30m)")
    session.check_cluster(cluster, what="--cluster")
    body: dict[str, Any] = {"queue": queue, "jobset": jobset, "cluster": cluster}
    if ttl is not None:
        body["ttl_seconds"] = ttl
    if max_queued_time is not None:
        body["max_queued"] = {"seconds": max_queued_time}
        if on_max_queued is not None:
            body["max_queued"]["action"] = on_max_queued
    _print_credentials(session, session.api().request("POST", PATH, body), output,
                       kubeconfig_out)


@group.command("token")
@click.argument("namespace", type=NAMESPACE_REF, metavar="CLUSTER/NAME")
@click.option("--kubeconfig-out", metavar="FILE")
@output_option
@runs
def token(session: Session, namespace: tuple[str, str], kubeconfig_out: str | None,
          output: Output) -> None:
    """A fresh coordinator token (and kubeconfig) for CLUSTER/NAME."""
    _print_credentials(session, session.api().request("POST", _path(*namespace) + "/token", {}),
                       output, kubeconfig_out)


@group.command("list")
@click.option("--queue", shell_complete=complete_queue)
@click.option("--jobset")
@click.option("--cluster", shell_complete=complete_cluster)
@click.option("--state", type=click.Choice(STATES))
@output_option_for("{[*].name}")
@watch_option
@runs
def list_namespaces(session: Session, queue: str | None, jobset: str | None,
                    cluster: str | None, state: str | None, output: Output, watch: bool,
                    interval: float) -> None:
    """List ephemeral namespaces."""
    if cluster:
        session.check_cluster(cluster, what="--cluster")
    query = {key: value for key, value in (("queue", queue), ("jobset", jobset),
                                            ("cluster", cluster), ("state", state)) if value}
    api = session.api()

    def fetch() -> View:
        records = api.request("GET", PATH, query=query)["namespaces"]
        return View(records, table=lambda: Table(
            ["CLUSTER", "NAME", "QUEUE", "JOBSET", "STATE", "CREATED", "EXPIRES", "TRIGGER"],
            [[r["cluster"], r["name"], r["queue"], r["jobset"], r["state"],
              timestamp(r["created_at"]), timestamp(r.get("expires_at")),
              r.get("trigger") or "-"] for r in records], wide=1,
            empty="no ephemeral namespaces" + (" with " + ", ".join(
                f"{k}={v}" for k, v in query.items()) if query else "")),
            names=lambda: [f"namespace/{r['cluster']}/{r['name']}" for r in records])

    show(session.out, output, fetch, watch=watch, interval=interval)


@group.command("describe")
@click.argument("namespace", type=NAMESPACE_REF, metavar="CLUSTER/NAME")
@output_option
@runs
def describe(session: Session, namespace: tuple[str, str], output: Output) -> None:
    """One namespace, its allowed kinds and its transitions."""
    record = session.api().request("GET", _path(*namespace))
    if output.kind == "name":
        print(f"namespace/{record['cluster']}/{record['name']}", file=session.out)
        return
    if dump_structured(session.out, output, record):
        return
    rows = [["cluster", record["cluster"]], ["name", record["name"]],
            ["queue", record["queue"]], ["job set", record["jobset"]],
            ["state", record["state"]], ["service account", record["service_account"]],
            ["allowed kinds", ", ".join(record.get("allowed_kinds") or []) or "-"],
            ["max queued", _max_queued(record.get("max_queued"))],
            ["created", timestamp(record["created_at"])],
            ["expires", timestamp(record["expires_at"])],
            ["trigger", record.get("trigger") or "-"],
            ["failure", record.get("failure_reason") or "-"]]
    print_table(session.out, ["FIELD", "VALUE"], rows)
    print(file=session.out)
    print_table(session.out, ["AT", "FROM", "TO", "CAUSE"],
                [[timestamp(t["at"]), t["from_state"] or "-", t["to_state"], t["cause"]]
                 for t in record.get("transitions") or []])


@group.command("delete")
@click.argument("namespace", type=NAMESPACE_REF, metavar="CLUSTER/NAME")
@click.option("--reason")
@click.option("--wait", type=Duration(allow_zero=True), default=0.0, metavar="DURATION",
              help="wait up to this long (e.g. 30s, 2m) until its cluster says it is gone")
@output_option
@runs
def delete(session: Session, namespace: tuple[str, str], reason: str | None, wait: float,
           output: Output) -> None:
    """Collect an ephemeral namespace (deleted in its cluster, its record kept)."""
    cluster, name = namespace
    api = session.api()
    record = api.request("DELETE", _path(cluster, name), {"reason": reason} if reason else None)
    if wait > 0:
        record = _wait_deleted(api, cluster, name, wait)["namespace"]
    render(session.out, output, View(
        record, table=lambda: f"namespace {cluster}/{name}: {record['state']}"
        + (" (collection started)" if record["state"] == "active" else ""),
        names=lambda: [f"namespace/{cluster}/{name}"]))


def _wait_deleted(api: JsonClient, cluster: str, name: str, seconds: float) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        answer: dict[str, Any] = api.request("GET", _path(cluster, name) + "/transitions")
        if answer["namespace"]["state"] == "deleted":
            return answer
        if time.monotonic() > deadline:
            record = answer["namespace"]
            raise CliError(f"namespace {cluster}/{name} is still {record['state']} after "
                           f"{seconds:g}s" + (f" ({record['failure_reason']})"
                                             if record.get("failure_reason") else "")
                           + "; it is retried, look again later")
        time.sleep(POLL_SECONDS)


def _done(action: str | None) -> str:
    return {"delete": "deleted", "fail": "failed"}.get(action or "",
                                                       "failed or deleted as their queue says")


def _max_queued(max_queued: dict[str, Any] | None) -> str:
    if not max_queued:
        return "-"
    action = max_queued.get("action") or "as its queue says (else fail)"
    return f"{duration(max_queued['seconds'])}, then {action}"
