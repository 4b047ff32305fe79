"""`lockgate namespace create|list|describe`: ephemeral namespaces for one job set each.

    lockgate namespace create --queue Q --jobset J --cluster C [--ttl 2h]
                              [--max-queued-time 30m [--on-max-queued delete|fail]]
                              [--kubeconfig-out FILE] [-o table|json|yaml]
    lockgate namespace list [--queue Q] [--jobset J] [--cluster C] [--state S] [-o ...]
    lockgate namespace describe CLUSTER/NAME [-o ...]
    lockgate namespace token CLUSTER/NAME [--kubeconfig-out FILE] [-o ...]

`create` prints the namespace and what its job's coordinator needs: a kubeconfig holding the
token of the namespace's ServiceAccount (written to --kubeconfig-out with mode 0600, or printed),
valid until the time shown. Running it again for the same queue, job set and cluster returns the
same namespace with a fresh token.
"""

from __future__ import annotations

import argparse
import os
import urllib.parse
from pathlib import Path
from typing import Any, TextIO

import yaml

from lockgate.namespace_access import parse_duration
from lockgate_adapters.cli import AdminClient, CliError
from lockgate_adapters.cli_output import dump_structured, duration, print_table, verbs_of

PATH = "/api/v1/namespaces"


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _dump(value: Any, output: str, out: TextIO) -> bool:
    """Print `value` as JSON or YAML; False for table output (the caller prints)."""
    return dump_structured(out, output, value)


def _ref(text: str) -> tuple[str, str]:
    cluster, sep, name = text.partition("/")
    if not sep or not cluster or not name:
        raise CliError(f"name the namespace as CLUSTER/NAME (see 'lockgate namespace list'), "
                       f"not {text!r}")
    return cluster, name


def _path(cluster: str, name: str) -> str:
    return f"{PATH}/{urllib.parse.quote(cluster, safe='')}/{urllib.parse.quote(name, safe='')}"


def _write_kubeconfig(path: str, kubeconfig: dict[str, Any]) -> None:
    target = Path(path)
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        yaml.safe_dump(kubeconfig, handle, sort_keys=False)
    target.chmod(0o600)


def _print_credentials(answer: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    if args.kubeconfig_out:
        _write_kubeconfig(args.kubeconfig_out, answer["kubeconfig"])
    if _dump(answer, args.output, out):
        return
    record = answer["namespace"]
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
    if args.kubeconfig_out:
        print(f"kubeconfig for the coordinator written to {args.kubeconfig_out}", file=out)
    else:
        print("kubeconfig for the coordinator:", file=out)
        yaml.safe_dump(answer["kubeconfig"], out, sort_keys=False)


def namespace_create(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    body: dict[str, Any] = {"queue": args.queue, "jobset": args.jobset,
                            "cluster": args.cluster}
    if args.ttl is not None:
        body["ttl_seconds"] = args.ttl
    if args.on_max_queued is not None and args.max_queued_time is None:
        raise CliError("--on-max-queued needs --max-queued-time (e.g. --max-queued-time 30m)")
    if args.max_queued_time is not None:
        body["max_queued"] = {"seconds": args.max_queued_time}
        if args.on_max_queued is not None:
            body["max_queued"]["action"] = args.on_max_queued
    _print_credentials(client.request("POST", PATH, body), args, out)


def namespace_token(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    cluster, name = _ref(args.namespace)
    _print_credentials(client.request("POST", _path(cluster, name) + "/token", {}), args, out)


def namespace_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    query = {key: value for key, value in (("queue", args.queue), ("jobset", args.jobset),
                                            ("cluster", args.cluster), ("state", args.state))
             if value}
    records = client.request("GET", PATH, query=query)["namespaces"]
    if _dump(records, args.output, out):
        return
    if not records:
        print("no ephemeral namespaces" + (" with " + ", ".join(
            f"{k}={v}" for k, v in query.items()) if query else ""), file=out)
        return
    print_table(out, ["CLUSTER", "NAME", "QUEUE", "JOBSET", "STATE", "CREATED", "EXPIRES"],
                 [[r["cluster"], r["name"], r["queue"], r["jobset"], r["state"],
                   _time(r["created_at"]), _time(r.get("expires_at"))] for r in records])


def namespace_describe(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    cluster, name = _ref(args.namespace)
    record = client.request("GET", _path(cluster, name))
    if _dump(record, args.output, out):
        return
    rows = [["cluster", record["cluster"]], ["name", record["name"]],
            ["queue", record["queue"]], ["job set", record["jobset"]],
            ["state", record["state"]], ["service account", record["service_account"]],
            ["allowed kinds", ", ".join(record.get("allowed_kinds") or []) or "-"],
            ["max queued", _max_queued(record.get("max_queued"))],
            ["created", _time(record["created_at"])], ["expires", _time(record["expires_at"])],
            ["trigger", record.get("trigger") or "-"],
            ["failure", record.get("failure_reason") or "-"]]
    print_table(out, ["FIELD", "VALUE"], rows)
    print(file=out)
    print_table(out, ["AT", "FROM", "TO", "CAUSE"],
                 [[_time(t["at"]), t["from_state"] or "-", t["to_state"], t["cause"]]
                  for t in record.get("transitions") or []])


def _done(action: str | None) -> str:
    return {"delete": "deleted", "fail": "failed"}.get(action or "",
                                                       "failed or deleted as their queue says")


def _max_queued(max_queued: dict[str, Any] | None) -> str:
    if not max_queued:
        return "-"
    action = max_queued.get("action") or "as its queue says (else fail)"
    return f"{duration(max_queued['seconds'])}, then {action}"


def _time(value: str | None) -> str:
    return value.replace("T", " ")[:19] if value else "-"


def register(nouns: Any, output_parent: argparse.ArgumentParser) -> None:
    """Add `lockgate namespace ...` to the CLI's nouns."""
    output = output_parent
    verbs = verbs_of(nouns, "namespace", "ephemeral namespaces, one per job set")
    create = verbs.add_parser("create", parents=[output],
                              help="make a job set's namespace and print its coordinator's "
                                   "kubeconfig (again: the same namespace, a fresh token)")
    create.add_argument("--queue", required=True)
    create.add_argument("--jobset", required=True)
    create.add_argument("--cluster", required=True)
    create.add_argument("--ttl", type=_duration, metavar="DURATION",
                        help="collect it after this long, e.g. 90m, 2h, 7d")
    create.add_argument("--max-queued-time", type=_duration, metavar="DURATION",
                        help="the job set's maximum time queued: a pod of the namespace "
                             "waiting longer (e.g. 30m) is failed or deleted, even if its "
                             "queue allows longer")
    create.add_argument("--on-max-queued", choices=("fail", "delete"),
                        help="what becomes of such a pod (default: as its queue says, else fail)")
    create.add_argument("--kubeconfig-out", metavar="FILE",
                        help="write the coordinator's kubeconfig here (mode 0600)")
    create.set_defaults(run=namespace_create)

    token = verbs.add_parser("token", parents=[output],
                             help="a fresh coordinator token for CLUSTER/NAME")
    token.add_argument("namespace", metavar="CLUSTER/NAME")
    token.add_argument("--kubeconfig-out", metavar="FILE")
    token.set_defaults(run=namespace_token)

    listing = verbs.add_parser("list", parents=[output], help="list ephemeral namespaces")
    for option in ("--queue", "--jobset", "--cluster"):
        listing.add_argument(option)
    listing.add_argument("--state", help="active, expiring, deleting, deleted, failed")
    listing.set_defaults(run=namespace_list)

    describe = verbs.add_parser("describe", parents=[output],
                                help="one namespace, its allowed kinds and its transitions")
    describe.add_argument("namespace", metavar="CLUSTER/NAME")
    describe.set_defaults(run=namespace_describe)
