"""The `lockgate` command: manage queues and look at jobs through queue-store's admin API.

Why a CLI over HTTP rather than over Postgres: the API validates every change and applies the
change-feed rules in one place; the CLI only turns arguments into requests and answers into text.

    lockgate queue create NAME [--priority-factor F] [--cordon] [--limit cpu=100 ...]
                               [--namespace [CLUSTER/]NS ...] [--namespace-selector
                               [CLUSTER:]KEY=VALUE[,KEY=VALUE] ...] [--namespaces-json JSON]
    lockgate queue update NAME [--priority-factor F] [--cordon|--uncordon]
                               [--limit memory=1Ti ...] [--remove-limit cpu ...]
                               [--clear-namespaces] [--namespace ...] [--namespace-selector ...]

A queue may be used only by the namespaces bound to it (--namespace team-a for every cluster,
--namespace cluster-a/team-a for one); a queue with no binding may be used by none.
    lockgate queue cordon NAME / lockgate queue uncordon NAME
    lockgate queue delete NAME
    lockgate queue get NAME
    lockgate queue list
    lockgate queue create|update NAME --allow-kind KIND ...   (update: --disallow-kind KIND,
                               --default-kinds): what the queue's ephemeral namespaces may create
    lockgate namespace create|list|describe|token|delete ...   (cli_namespaces, cli_jobsets)
    lockgate jobs list [--queue Q] [--state S] [--cluster C] [--limit N]
    lockgate token new NAME [--role read-only|admin]
    lockgate status / explain CLUSTER/NAMESPACE/POD / jobset list|describe  (cli_views)

A queue may also set a maximum time queued: --max-queued-time 30m [--on-max-queued fail|delete]
(update: --no-max-queued-time removes it). Every command takes -o table|json|yaml.

The API address comes from --api, else $LOCKGATE_API, else http://127.0.0.1:58080. The bearer
token comes from --token-file, else $LOCKGATE_TOKEN, else the file $LOCKGATE_TOKEN_FILE
(`lockgate token new` mints one and prints the line queue-store's tokens file takes).
Exit status: 0 on success, 1 when the API refuses or fails, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from lockgate_adapters import cli_deploy, cli_views
from lockgate_adapters.admin_tokens import Role, entry_for, new_token
from lockgate_adapters.cli_output import (
    Table,
    amounts,
    duration,
    output_parent,
    parse_duration,
    render,
)

DEFAULT_API = "http://127.0.0.1:58080"
TIMEOUT_SECONDS = 30.0


class CliError(Exception):
    """A failure to report on stderr with exit status 1."""


class AdminClient:
    """A small JSON-over-HTTP client for the admin API (stdlib only, so the CLI starts fast)."""

    def __init__(self, base_url: str, token: str | None = None) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise CliError(f"--api must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.token = token

    def request(self, method: str, path: str, body: object = None,
                query: dict[str, str] | None = None) -> Any:
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, method=method,  # noqa: S310
                                         headers=headers)
        try:
            # The scheme was checked to be http(s) in __init__ (S310 guards against file:).
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310
                payload = response.read()
        except urllib.error.HTTPError as error:
            raise CliError(_error_message(error)) from error
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise CliError(f"cannot reach the lockgate API at {self.base_url}: {reason} "
                           "(is queue-store running? set --api or LOCKGATE_API)") from error
        return json.loads(payload) if payload else None


def _error_message(error: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(error.read() or b"{}")
        message = body.get("error") or error.reason
    except (ValueError, AttributeError):
        message = error.reason
    return f"{message} (HTTP {error.code})"


def read_token(token_file: str | None, env: Mapping[str, str]) -> str | None:
    """The bearer token: --token-file, else $LOCKGATE_TOKEN, else $LOCKGATE_TOKEN_FILE; or None.

    None lets the request go without one: the API's 401 then says how to authenticate.
    """
    if token_file is None and env.get("LOCKGATE_TOKEN", "").strip():
        return env["LOCKGATE_TOKEN"].strip()
    path = token_file or env.get("LOCKGATE_TOKEN_FILE")
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as error:
        raise CliError(f"cannot read the token file {path}: {error.strerror or error}") from error
    if not token:
        raise CliError(f"the token file {path} is empty")
    return token


def _limits(pairs: Sequence[str]) -> dict[str, str]:
    limits: dict[str, str] = {}
    for pair in pairs:
        resource, sep, quantity = pair.partition("=")
        if not sep or not resource or not quantity:
            raise argparse.ArgumentTypeError(
                f"--limit takes RESOURCE=QUANTITY (e.g. cpu=100 or memory=1Ti), not {pair!r}")
        limits[resource.strip()] = quantity.strip()
    return limits


def _queue_path(name: str) -> str:
    return "/api/v1/queues/" + urllib.parse.quote(name, safe="")


# Commands ---------------------------------------------------------------------------------

def _bindings(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Namespace bindings from --namespaces-json, --namespace and --namespace-selector."""
    bindings: list[dict[str, Any]] = []
    if getattr(args, "namespaces_json", None):
        try:
            loaded = json.loads(args.namespaces_json)
        except json.JSONDecodeError as error:
            raise CliError(f"--namespaces-json is not valid JSON: {error}") from error
        if not isinstance(loaded, list):
            raise CliError("--namespaces-json must be a JSON list of bindings")
        bindings.extend(loaded)
    names_by_cluster: dict[str, list[str]] = {}
    for item in args.namespace:
        cluster, _, name = item.rpartition("/")
        names_by_cluster.setdefault(cluster or "*", []).append(name)
    bindings += [{"cluster": cluster, "names": names}
                 for cluster, names in names_by_cluster.items()]
    for item in args.namespace_selector:
        # Label keys may hold "/" (lockgate.io/team), so a cluster is given with ":".
        cluster, _, terms = item.partition(":") if ":" in item.split("=", 1)[0] else (
            "", "", item)
        match_labels: dict[str, str] = {}
        for term in filter(None, terms.split(",")):
            key, sep, value = term.partition("=")
            if not sep or not key:
                raise CliError(f"--namespace-selector takes [CLUSTER:]KEY=VALUE[,KEY=VALUE], "
                               f"not {item!r}")
            match_labels[key.strip()] = value.strip()
        bindings.append({"cluster": cluster or "*", "selector": {"matchLabels": match_labels}})
    return bindings


def _group_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group-timeout", type=_number, metavar="SECONDS",
                        help="a pod group that has not filled up this long after its first "
                             "member was created times out")
    parser.add_argument("--group-timeout-action", choices=("delete", "fail"),
                        help="what becomes of a timed-out group's pods (default delete)")


def queue_create(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    body: dict[str, Any] = {"name": args.name, "cordoned": args.cordon,
                            "resource_limits": _limits(args.limit),
                            "namespaces": _bindings(args)}
    if args.priority_factor is not None:
        body["priority_factor"] = args.priority_factor
    max_queued = _max_queued(args, current=None)
    if max_queued is not None:
        body["max_queued"] = max_queued
    body.update(_group_timeout(args))
    if args.allow_kind:
        body["allowed_kinds"] = args.allow_kind
    queue = client.request("POST", "/api/v1/queues", body)
    _print_queues([queue], args.output, out, single=True)


def queue_update(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    patch: dict[str, Any] = {}
    if args.priority_factor is not None:
        patch["priority_factor"] = args.priority_factor
    if args.cordon is not None:
        patch["cordoned"] = args.cordon
    limits: dict[str, str | None] = dict(_limits(args.limit))
    for resource in args.remove_limit:
        limits[resource] = None  # merge patch: null removes
    if limits:
        patch["resource_limits"] = limits
    if args.no_max_queued_time:
        if args.max_queued_time is not None or args.on_max_queued is not None:
            raise CliError("--no-max-queued-time cannot go with --max-queued-time or "
                           "--on-max-queued")
        patch["max_queued"] = None
    elif args.max_queued_time is not None or args.on_max_queued is not None:
        patch["max_queued"] = _max_queued(args, current=client)
    patch.update(_group_timeout(args))
    added = _bindings(args)
    if added or args.clear_namespaces:
        # The API replaces the list whole: add to what the queue has now, unless cleared.
        current = [] if args.clear_namespaces else client.request(
            "GET", _queue_path(args.name)).get("namespaces", [])
        patch["namespaces"] = current + [b for b in added if b not in current]
    if args.default_kinds:
        patch["allowed_kinds"] = None  # merge patch: null restores the default list
    elif args.allow_kind or args.disallow_kind:
        current_kinds = client.request("GET", _queue_path(args.name)).get("allowed_kinds", [])
        kinds = [k for k in current_kinds if k not in args.disallow_kind]
        patch["allowed_kinds"] = kinds + [k for k in args.allow_kind if k not in kinds]
    if not patch:
        raise CliError("nothing to update: give --priority-factor, --cordon/--uncordon, "
                       "--limit, --remove-limit, --group-timeout, --group-timeout-action, "
                       "--namespace, --namespace-selector, --clear-namespaces, --max-queued-time, "
                       "--allow-kind, --disallow-kind or --default-kinds")
    queue = client.request("PATCH", _queue_path(args.name), patch)
    _print_queues([queue], args.output, out, single=True)


def _max_queued(args: argparse.Namespace, *, current: AdminClient | None
                ) -> dict[str, Any] | None:
    """The max_queued the flags ask for; for an update, the action alone needs the queue's
    current time (read through `current`)."""
    if args.max_queued_time is None and args.on_max_queued is None:
        return None
    seconds = args.max_queued_time
    if seconds is None:
        existing = None if current is None else current.request(
            "GET", _queue_path(args.name)).get("max_queued")
        if not existing:
            raise CliError("--on-max-queued needs --max-queued-time (the queue has none yet)")
        seconds = existing["seconds"]
    return {"seconds": seconds, "action": args.on_max_queued or "fail"}


def _group_timeout(args: argparse.Namespace) -> dict[str, Any]:
    """Pod groups (docs/scheduling.md, "Gangs"): how long one may take to fill up, and then."""
    fields: dict[str, Any] = {}
    if args.group_timeout is not None:
        fields["group_timeout_seconds"] = args.group_timeout
    if args.group_timeout_action is not None:
        fields["group_timeout_action"] = args.group_timeout_action
    return fields


def queue_cordon(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    queue = client.request("PATCH", _queue_path(args.name), {"cordoned": args.cordon})
    _print_queues([queue], args.output, out, single=True)


def queue_delete(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    client.request("DELETE", _queue_path(args.name))
    render(out, args.output, {"deleted": args.name},
           table=lambda: f"queue {args.name} deleted")


def queue_get(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    _print_queues([client.request("GET", _queue_path(args.name))], args.output, out,
                  single=True)


def queue_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    _print_queues(client.request("GET", "/api/v1/queues")["queues"], args.output, out)


def jobs_list(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    query = {name: str(value) for name, value in (
        ("queue", args.queue), ("state", args.state), ("cluster", args.cluster),
        ("limit", args.limit)) if value is not None}
    answer = client.request("GET", "/api/v1/jobs", query=query)
    filters = ", ".join(f"{k}={v}" for k, v in query.items() if k != "limit")
    render(out, args.output, answer, table=lambda: Table(
        ["CLUSTER", "NAMESPACE", "NAME", "QUEUE", "JOBSET", "STATE", "REQUESTS", "ATTEMPTS",
         "REASON"],
        [[j["cluster"], j["namespace"], j["name"], j["queue"], j["jobset"], j["state"],
          amounts(j["requests"]), str(j["release_attempts"]), j["last_reason"] or "-"]
         for j in answer["jobs"]],
        notes=list(answer.get("hints", [])),
        empty=f"no jobs{' with ' + filters if filters else ''}"))


def token_new(args: argparse.Namespace, out: TextIO) -> None:
    token = new_token()
    line = entry_for(args.name, Role(args.role), token).line()
    render(out, args.output, {"name": args.name, "role": args.role, "token": token,
                              "tokens_file_line": line},
           table=lambda: (f"token (give it to {args.name}; it is not stored anywhere): {token}\n"
                          f"line for queue-store's tokens file: {line}"))


def _print_queues(queues: list[dict[str, Any]], output: str, out: TextIO,
                  *, single: bool = False) -> None:
    render(out, output, queues[0] if single else queues, table=lambda: Table(
        ["NAME", "PRIORITY-FACTOR", "WEIGHT", "CORDONED", "LIMITS", "MAX-QUEUED", "NAMESPACES",
         "ALLOWED-KINDS"],
        [[q["name"], f"{q['priority_factor']:g}", f"{q['weight']:.3g}",
          "yes" if q["cordoned"] else "no",
          ",".join(f"{k}={v}" for k, v in sorted(q["resource_limits"].items())) or "-",
          _describe_max_queued(q.get("max_queued")),
          _describe_bindings(q.get("namespaces") or []),
          # the default list is long and documented: `-o json` spells it out
          "(default)" if q.get("allowed_kinds_default")
          else ",".join(q.get("allowed_kinds") or [])]
         for q in queues],
        empty="no queues: create one with `lockgate queue create NAME --namespace NS`"))


def _describe_max_queued(max_queued: dict[str, Any] | None) -> str:
    if not max_queued:
        return "-"
    return f"{duration(max_queued['seconds'])},{max_queued['action']}"


def _describe_bindings(bindings: list[dict[str, Any]]) -> str:
    if not bindings:
        return "(none: unusable)"
    parts = []
    for binding in bindings:
        what = list(binding.get("names") or [])
        selector = binding.get("selector") or {}
        what += [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
        what += [f"{e['key']} {e['operator']}" for e in selector.get("matchExpressions") or []]
        parts.append(f"{binding.get('cluster', '*')}/{'+'.join(what)}")
    return ",".join(parts)


# Arguments --------------------------------------------------------------------------------

def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from error
    return value  # the API checks the range and says why


def _binding_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", action="append", default=[], metavar="[CLUSTER/]NS",
                        help="a namespace that may use the queue (in every cluster unless "
                             "CLUSTER/ is given)")
    parser.add_argument("--namespace-selector", action="append", default=[],
                        metavar="[CLUSTER:]KEY=VALUE[,KEY=VALUE]",
                        help="namespaces with these labels may use the queue")
    parser.add_argument("--namespaces-json", metavar="JSON",
                        help='bindings as the API takes them: [{"cluster": "*", "names": [...], '
                             '"selector": {"matchLabels": {...}}}]')


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lockgate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", default=os.environ.get("LOCKGATE_API", DEFAULT_API),
                        help="admin API URL (env LOCKGATE_API; default %(default)s)")
    parser.add_argument("--token-file", help="file holding the bearer token "
                                             "(else env LOCKGATE_TOKEN, else LOCKGATE_TOKEN_FILE)")
    nouns = parser.add_subparsers(dest="noun", required=True)

    output = output_parent()

    queue = nouns.add_parser("queue", help="manage queues").add_subparsers(dest="verb",
                                                                          required=True)
    create = queue.add_parser("create", parents=[output], help="create a queue")
    create.add_argument("name")
    create.add_argument("--priority-factor", type=_number,
                        help="weight is 1/priority-factor; default 1")
    create.add_argument("--cordon", action="store_true", help="create it cordoned")
    create.add_argument("--limit", action="append", default=[], metavar="RESOURCE=QUANTITY",
                        help="cap on what the queue holds at once, e.g. cpu=100, memory=1Ti")
    _binding_arguments(create)
    _group_arguments(create)
    create.add_argument("--allow-kind", action="append", default=[], metavar="KIND",
                        help="what its ephemeral namespaces may create, e.g. pods, "
                             "deployments.apps (repeat; default: pods, services, configmaps, "
                             "deployments.apps, statefulsets.apps, jobs.batch)")
    create.set_defaults(run=queue_create)

    update = queue.add_parser("update", parents=[output], help="change a queue")
    update.add_argument("name")
    update.add_argument("--priority-factor", type=_number)
    cordoning = update.add_mutually_exclusive_group()
    cordoning.add_argument("--cordon", dest="cordon", action="store_const", const=True)
    cordoning.add_argument("--uncordon", dest="cordon", action="store_const", const=False)
    update.add_argument("--limit", action="append", default=[], metavar="RESOURCE=QUANTITY",
                        help="set a limit (others are kept)")
    update.add_argument("--remove-limit", action="append", default=[], metavar="RESOURCE")
    _group_arguments(update)
    _binding_arguments(update)
    update.add_argument("--clear-namespaces", action="store_true",
                        help="drop every namespace binding (before adding those given)")
    update.add_argument("--allow-kind", action="append", default=[], metavar="KIND",
                        help="also allow this kind in its ephemeral namespaces")
    update.add_argument("--disallow-kind", action="append", default=[], metavar="KIND")
    update.add_argument("--default-kinds", action="store_true",
                        help="back to the default allowed kinds")
    update.set_defaults(run=queue_update)

    for verb, cordon, what in (("cordon", True, "stop admitting and releasing its pods"),
                               ("uncordon", False, "admit and release its pods again")):
        cordoning_verb = queue.add_parser(verb, parents=[output], help=what)
        cordoning_verb.add_argument("name")
        cordoning_verb.set_defaults(run=queue_cordon, cordon=cordon)

    delete = queue.add_parser("delete", parents=[output],
                              help="delete a queue (its jobs stay, unscheduled)")
    delete.add_argument("name")
    delete.set_defaults(run=queue_delete)

    get = queue.add_parser("get", parents=[output], help="show one queue")
    get.add_argument("name")
    get.set_defaults(run=queue_get)

    listing = queue.add_parser("list", parents=[output], help="list queues")
    listing.set_defaults(run=queue_list)
    for command in (create, update):
        command.add_argument("--max-queued-time", type=parse_duration, metavar="DURATION",
                             help="a pod waiting longer than this (e.g. 30m, 2h) is failed or "
                                  "deleted, see --on-max-queued")
        command.add_argument("--on-max-queued", choices=("fail", "delete"),
                             help="what becomes of such a pod (default fail)")
    update.add_argument("--no-max-queued-time", action="store_true",
                        help="let pods wait as long as it takes")

    from lockgate_adapters import cli_namespaces  # it builds on this module's client

    cli_namespaces.register(nouns, output)

    jobs = nouns.add_parser("jobs", help="look at jobs").add_subparsers(dest="verb",
                                                                        required=True)
    jobs_listing = jobs.add_parser("list", parents=[output],
                                   help="list jobs, oldest first (why isn't my job scheduled?)")
    jobs_listing.add_argument("--queue")
    jobs_listing.add_argument("--state", help="queued, released, ungated, bound, running, ...")
    jobs_listing.add_argument("--cluster")
    jobs_listing.add_argument("--limit", type=int, default=100)
    jobs_listing.set_defaults(run=jobs_list)

    from lockgate_adapters import cli_jobsets  # imports this module: only once it is loaded
    cli_jobsets.register(nouns, output)

    token = nouns.add_parser("token", help="admin API tokens").add_subparsers(dest="verb",
                                                                          required=True)
    minting = token.add_parser("new", parents=[output],
                               help="mint a token; prints it and its tokens-file line")
    minting.add_argument("name", help="who holds it (shown in queue-store's log)")
    minting.add_argument("--role", choices=[r.value for r in Role], default=Role.READ_ONLY.value)
    minting.set_defaults(offline=token_new)
    cli_views.register(nouns, output)
    cli_deploy.register(nouns, output)
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "offline", None) is not None:
            args.offline(args, out)
            return 0
        client = AdminClient(args.api, read_token(args.token_file, os.environ))
        args.run(client, args, out)
    except argparse.ArgumentTypeError as error:
        print(f"lockgate: {error}", file=err)
        return 2
    except CliError as error:
        print(f"lockgate: {error}", file=err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
