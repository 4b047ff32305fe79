"""`lockgate jobset cancel` and `lockgate namespace delete`: the commands that end things.

    lockgate jobset cancel QUEUE JOBSET [--reason TEXT] [--wait SECONDS] [-o table|json|yaml]
    lockgate namespace delete CLUSTER/NAME [--reason TEXT] [--wait SECONDS] [-o ...]

Both send a command (over Kafka, through the admin API) and return once it is accepted; the
effects follow: a cancelled job set's jobs end `cancelled` with the reason, its pods are deleted
in every cluster and its ephemeral namespaces collected; a deleted namespace is collected.
`--wait` waits until the job set's namespaces (or the namespace) are deleted.

Why a module of its own: other commands of the same nouns (`jobset list|describe`,
`namespace create|list|describe`) live in other modules; `verbs_of` lets each add its verbs to
one noun, whichever registers first.
"""

from __future__ import annotations

import argparse
import time
import urllib.parse
from typing import Any, TextIO

from lockgate_adapters.cli import AdminClient, CliError
from lockgate_adapters.cli_output import dump_structured, print_table, verbs_of

POLL_SECONDS = 0.5


def register(nouns: Any, output_parent: argparse.ArgumentParser) -> None:
    jobset = verbs_of(nouns, "jobset", "job sets: the pods of one job")
    cancel = jobset.add_parser(
        "cancel", parents=[output_parent],
        help="cancel a job set: its pods are deleted in every cluster, its jobs end cancelled "
             "with the reason, its ephemeral namespaces are collected")
    cancel.add_argument("queue")
    cancel.add_argument("jobset")
    cancel.add_argument("--reason", help="why (kept on its jobs and namespace records)")
    cancel.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait up to this long until its namespaces are deleted")
    cancel.set_defaults(run=jobset_cancel)

    namespace = verbs_of(nouns, "namespace", "ephemeral namespaces")
    delete = namespace.add_parser(
        "delete", parents=[output_parent],
        help="collect an ephemeral namespace (deleted in its cluster, its record kept)")
    delete.add_argument("namespace", metavar="CLUSTER/NAME")
    delete.add_argument("--reason")
    delete.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait up to this long until its cluster says it is gone")
    delete.set_defaults(run=namespace_delete)


def jobset_cancel(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    path = (f"/api/v1/jobsets/{urllib.parse.quote(args.queue, safe='')}/"
            f"{urllib.parse.quote(args.jobset, safe='')}/cancel")
    body = {"reason": args.reason} if args.reason else {}
    command = client.request("POST", path, body)
    result: dict[str, Any] = {"cancel": command}
    if args.wait > 0:
        result["namespaces"] = _wait_for_jobset(client, args.queue, args.jobset, args.wait)
    if _structured(result, args, out):
        return
    print(f"job set {args.queue}/{args.jobset} cancelled ({command['reason']}); its pods are "
          "being deleted and its namespaces collected", file=out)
    if "namespaces" in result:
        _print_records(result["namespaces"], out)


def namespace_delete(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    cluster, sep, name = args.namespace.partition("/")
    if not sep or not cluster or not name:
        raise CliError(f"give the namespace as CLUSTER/NAME, not {args.namespace!r}")
    path = _namespace_path(cluster, name)
    body = {"reason": args.reason} if args.reason else None
    record = client.request("DELETE", path, body)
    if args.wait > 0:
        record = _wait_deleted(client, cluster, name, args.wait)["namespace"]
    if _structured(record, args, out):
        return
    print(f"namespace {cluster}/{name}: {record['state']}"
          + (" (collection started)" if record["state"] == "active" else ""), file=out)


def _namespace_path(cluster: str, name: str) -> str:
    return (f"/api/v1/namespaces/{urllib.parse.quote(cluster, safe='')}/"
            f"{urllib.parse.quote(name, safe='')}")


def _wait_deleted(client: AdminClient, cluster: str, name: str,
                  seconds: float) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        answer: dict[str, Any] = client.request(
            "GET", _namespace_path(cluster, name) + "/transitions")
        if answer["namespace"]["state"] == "deleted":
            return answer
        if time.monotonic() > deadline:
            record = answer["namespace"]
            raise CliError(f"namespace {cluster}/{name} is still {record['state']} after "
                           f"{seconds:g}s" + (f" ({record['failure_reason']})"
                                             if record.get("failure_reason") else "")
                           + "; it is retried, look again later")
        time.sleep(POLL_SECONDS)


def _wait_for_jobset(client: AdminClient, queue: str, jobset: str,
                     seconds: float) -> list[dict[str, Any]]:
    """Until the cancel is applied and each namespace it collects is deleted."""
    deadline = time.monotonic() + seconds
    path = (f"/api/v1/jobsets/{urllib.parse.quote(queue, safe='')}/"
            f"{urllib.parse.quote(jobset, safe='')}/cancellation")
    while True:
        try:
            applied = client.request("GET", path)
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


def _print_records(records: list[dict[str, Any]], out: TextIO) -> None:
    if not records:
        print("no ephemeral namespaces", file=out)
        return
    print_table(out, ["CLUSTER", "NAMESPACE", "STATE", "TRIGGER", "DELETED"],
                 [[r["cluster"], r["name"], r["state"], r.get("trigger") or "-",
                   r.get("deleted_at") or "-"] for r in records])


def _structured(value: object, args: argparse.Namespace, out: TextIO) -> bool:
    return dump_structured(out, getattr(args, "output", "table"), value)
