"""`lockgate queue create|update|cordon|uncordon|delete|get|list`: the queues and their rules.

A queue may be used only by the namespaces bound to it (`--namespace team-a` in every cluster,
`--namespace cluster-a/team-a` in one, `--namespace-selector [CLUSTER:]KEY=VALUE`); a queue with
no binding may be used by none. Its weight sets its fair share: `--weight 2` gets twice the share
of a queue of weight 1. `--priority-factor` is the same setting as Armada spells it (weight =
1 / priority factor); give one or the other.

Queues form a tree (`--parent research`: the queue is a child of research; none: a child of the
root). The weight divides the parent's share among siblings; `--guarantee cpu=32` is what the
queue (and its subtree) gets when it asks, preempting borrowers if preemption is on; `--limit`
is what it (its subtree) never holds more of. Only a leaf holds pods and binds namespaces.
`queue list` shows each queue's path (research/vision/alice).
"""

from __future__ import annotations

import json
from typing import Any

import click

from lockgate.namespace_access import DEFAULT_ALLOWED_KINDS
from lockgate_cli.client import CliError, quote
from lockgate_cli.completing import complete_queue
from lockgate_cli.output import (
    Output,
    Table,
    View,
    duration,
    output_option,
    output_option_for,
    render,
    weight,
)
from lockgate_cli.params import Duration, Kind, Limit
from lockgate_cli.session import Session, runs
from lockgate_cli.watching import show, watch_option

DEFAULT_KINDS_HELP = ", ".join(DEFAULT_ALLOWED_KINDS)


def path(name: str) -> str:
    return "/api/v1/queues/" + quote(name)


@click.group("queue")
def group() -> None:
    """Manage queues: who may use them, their weight, limits and time limits."""


def _weighting(function: Any) -> Any:
    function = click.option(
        "--priority-factor", type=click.FloatRange(min=0, min_open=True), metavar="F",
        help="Armada's spelling of the weight: weight = 1/F (so 0.5 is weight 2)")(function)
    return click.option(
        "--weight", type=click.FloatRange(min=0, min_open=True), metavar="W",
        help="the queue's share of the pool relative to others (default 1); or "
             "--priority-factor")(function)


def _priority_factor(weight_value: float | None, factor: float | None) -> float | None:
    if weight_value is not None and factor is not None:
        raise click.UsageError("give --weight or --priority-factor, not both "
                               "(weight = 1 / priority factor)")
    return 1.0 / weight_value if weight_value is not None else factor


def _bindings_options(function: Any) -> Any:
    function = click.option(
        "--namespaces-json", metavar="JSON",
        help='bindings as the API takes them: [{"cluster": "*", "names": [...], '
             '"selector": {"matchLabels": {...}}}]')(function)
    function = click.option(
        "--namespace-selector", "namespace_selector", multiple=True,
        metavar="[CLUSTER:]KEY=VALUE[,KEY=VALUE]",
        help="namespaces with these labels may use the queue (repeat)")(function)
    return click.option(
        "--namespace", "namespace", multiple=True, metavar="[CLUSTER/]NS",
        help="a namespace that may use the queue, in every cluster unless CLUSTER/ is given "
             "(repeat)")(function)


def _group_options(function: Any) -> Any:
    function = click.option("--group-timeout-action", type=click.Choice(["delete", "fail"]),
                            help="what becomes of a timed-out group's pods (default delete)"
                            )(function)
    return click.option("--group-timeout", type=Duration(), metavar="DURATION",
                        help="a pod group that has not filled up this long (e.g. 20s, 5m) "
                             "after its first member was created times out")(function)


def _max_queued_options(function: Any) -> Any:
    function = click.option("--on-max-queued", type=click.Choice(["fail", "delete"]),
                            help="what becomes of such a pod (default fail)")(function)
    return click.option("--max-queued-time", type=Duration(), metavar="DURATION",
                        help="a pod waiting longer than this (e.g. 30m, 2h) is failed or "
                             "deleted, see --on-max-queued")(function)


def bindings(session: Session, *, names: tuple[str, ...], selectors: tuple[str, ...],
             raw_json: str | None) -> list[dict[str, Any]]:
    """Namespace bindings from --namespaces-json, --namespace and --namespace-selector; every
    cluster named must be one lockgate knows."""
    found: list[dict[str, Any]] = []
    if raw_json:
        try:
            loaded = json.loads(raw_json)
        except json.JSONDecodeError as error:
            raise click.BadParameter(f"not valid JSON: {error}",
                                     param_hint="--namespaces-json") from error
        if not isinstance(loaded, list):
            raise click.BadParameter("must be a JSON list of bindings",
                                     param_hint="--namespaces-json")
        found.extend(loaded)
    by_cluster: dict[str, list[str]] = {}
    for item in names:
        cluster, _, name = item.rpartition("/")
        if not name or "/" in cluster:
            raise click.BadParameter(f"takes [CLUSTER/]NAMESPACE, not {item!r}",
                                     param_hint="--namespace")
        by_cluster.setdefault(cluster or "*", []).append(name)
    found += [{"cluster": cluster, "names": listed} for cluster, listed in by_cluster.items()]
    for item in selectors:
        # Label keys may hold "/" (lockgate.io/team), so a cluster is given with ":".
        cluster, _, terms = item.partition(":") if ":" in item.split("=", 1)[0] else (
            "", "", item)
        match_labels: dict[str, str] = {}
        for term in filter(None, terms.split(",")):
            key, sep, value = term.partition("=")
            if not sep or not key:
                raise click.BadParameter(f"takes [CLUSTER:]KEY=VALUE[,KEY=VALUE], not {item!r}",
                                         param_hint="--namespace-selector")
            match_labels[key.strip()] = value.strip()
        found.append({"cluster": cluster or "*", "selector": {"matchLabels": match_labels}})
    for binding in found:
        if isinstance(binding, dict):
            session.check_cluster(str(binding.get("cluster") or "*"),
                                  what=f"the binding {_describe_binding(binding)}")
    return found


@group.command("create")
@click.argument("name", shell_complete=complete_queue)
@_weighting
@click.option("--cordon", is_flag=True, help="create it cordoned")
@click.option("--limit", "limits", multiple=True, type=Limit(),
              help="cap on what the queue (a parent: its subtree) holds at once, borrowing "
                   "included, e.g. cpu=100, memory=1Ti (repeat)")
@click.option("--parent", metavar="QUEUE", shell_complete=complete_queue,
              help="the queue it is a child of in the queue tree (default: the root)")
@click.option("--guarantee", "guarantees", multiple=True, type=Limit(),
              help="what it (its subtree) gets when it asks, e.g. cpu=32 (repeat)")
@_bindings_options
@_group_options
@click.option("--allow-kind", "allow_kinds", multiple=True, type=Kind(), metavar="KIND",
              help=f"also allow its ephemeral namespaces to create this kind, besides the "
                   f"default ones ({DEFAULT_KINDS_HELP}); e.g. secrets, "
                   f"daskworkergroups.kubernetes.dask.org (repeat)")
@click.option("--only-kind", "only_kinds", multiple=True, type=Kind(), metavar="KIND",
              help="allow only the kinds given this way, instead of the default ones (repeat)")
@_max_queued_options
@output_option
@runs
def create(session: Session, name: str, weight: float | None,
           priority_factor: float | None, cordon: bool, limits: tuple[tuple[str, str], ...],
           parent: str | None, guarantees: tuple[tuple[str, str], ...],
           namespace: tuple[str, ...], namespace_selector: tuple[str, ...],
           namespaces_json: str | None, group_timeout: float | None,
           group_timeout_action: str | None, allow_kinds: tuple[str, ...],
           only_kinds: tuple[str, ...], max_queued_time: float | None,
           on_max_queued: str | None, output: Output) -> None:
    """Create a queue (bind namespaces to it with --namespace, or nobody may use it).

    Its ephemeral namespaces may create the default kinds; --allow-kind adds to them,
    --only-kind replaces them.
    """
    factor = _priority_factor(weight, priority_factor)
    body: dict[str, Any] = {"name": name, "cordoned": cordon, "resource_limits": dict(limits),
                            "namespaces": bindings(session, names=namespace,
                                                   selectors=namespace_selector,
                                                   raw_json=namespaces_json)}
    if parent is not None:
        body["parent"] = parent
    if guarantees:
        body["guarantee"] = dict(guarantees)
    if factor is not None:
        body["priority_factor"] = factor
    if max_queued_time is not None:
        body["max_queued"] = {"seconds": max_queued_time, "action": on_max_queued or "fail"}
    elif on_max_queued is not None:
        raise click.UsageError("--on-max-queued needs --max-queued-time (e.g. 30m)")
    body.update(_group_timeout(group_timeout, group_timeout_action))
    if only_kinds and allow_kinds:
        raise click.UsageError("give --allow-kind (adds to the default kinds) or --only-kind "
                               "(replaces them), not both")
    kinds = _kinds(DEFAULT_ALLOWED_KINDS, only=only_kinds, allow=allow_kinds)
    if kinds is not None:
        body["allowed_kinds"] = kinds
    queue = session.api().request("POST", "/api/v1/queues", body)
    warn_unserved(session, queue)
    render(session.out, output, queue_view([queue], single=True))


def warn_unserved(session: Session, queue: dict[str, Any]) -> None:
    """The server's warnings (bound namespaces lockgate's webhook will not serve), on stderr,
    so they show whatever -o says."""
    for warning in queue.pop("warnings", None) or ():
        print(f"warning: {warning}", file=session.err)


@group.command("update")
@click.argument("name", shell_complete=complete_queue)
@_weighting
@click.option("--cordon/--uncordon", default=None, help="stop (or resume) admitting and "
              "releasing its pods")
@click.option("--limit", "limits", multiple=True, type=Limit(),
              help="set a limit, e.g. cpu=200 (others are kept; repeat)")
@click.option("--remove-limit", "remove_limits", multiple=True, metavar="RESOURCE")
@click.option("--parent", metavar="QUEUE", shell_complete=complete_queue,
              help="move it under this queue in the queue tree")
@click.option("--root", "to_root", is_flag=True, help="make it a child of the root")
@click.option("--guarantee", "guarantees", multiple=True, type=Limit(),
              help="set a guarantee, e.g. cpu=32 (others are kept; repeat)")
@click.option("--remove-guarantee", "remove_guarantees", multiple=True, metavar="RESOURCE")
@_group_options
@_bindings_options
@click.option("--clear-namespaces", is_flag=True,
              help="drop every namespace binding (before adding those given)")
@click.option("--allow-kind", "allow_kinds", multiple=True, type=Kind(), metavar="KIND",
              help="also allow this kind in its ephemeral namespaces, besides those it allows "
                   "(the default ones if it never changed them; repeat)")
@click.option("--disallow-kind", "disallow_kinds", multiple=True, type=Kind(), metavar="KIND",
              help="no longer allow this kind (repeat)")
@click.option("--only-kind", "only_kinds", multiple=True, type=Kind(), metavar="KIND",
              help="allow only the kinds given this way (repeat); replaces the list")
@click.option("--default-kinds", is_flag=True,
              help=f"back to the default allowed kinds ({DEFAULT_KINDS_HELP}), which then "
                   "follow lockgate's default; with --allow-kind, the default ones and those")
@_max_queued_options
@click.option("--no-max-queued-time", is_flag=True, help="let pods wait as long as it takes")
@output_option
@runs
def update(session: Session, name: str, weight: float | None, priority_factor: float | None,
           cordon: bool | None, limits: tuple[tuple[str, str], ...],
           remove_limits: tuple[str, ...], parent: str | None, to_root: bool,
           guarantees: tuple[tuple[str, str], ...], remove_guarantees: tuple[str, ...],
           group_timeout: float | None,
           group_timeout_action: str | None, namespace: tuple[str, ...],
           namespace_selector: tuple[str, ...], namespaces_json: str | None,
           clear_namespaces: bool, allow_kinds: tuple[str, ...],
           disallow_kinds: tuple[str, ...], only_kinds: tuple[str, ...], default_kinds: bool,
           max_queued_time: float | None, on_max_queued: str | None,
           no_max_queued_time: bool, output: Output) -> None:
    """Change a queue; what is not given stays as it is."""
    api = session.api()
    patch: dict[str, Any] = {}
    factor = _priority_factor(weight, priority_factor)
    if factor is not None:
        patch["priority_factor"] = factor
    if cordon is not None:
        patch["cordoned"] = cordon
    changed_limits: dict[str, str | None] = dict(limits)
    for resource in remove_limits:
        changed_limits[resource] = None  # merge patch: null removes
    if changed_limits:
        patch["resource_limits"] = changed_limits
    if parent is not None and to_root:
        raise click.UsageError("give --parent QUEUE or --root, not both")
    if parent is not None or to_root:
        patch["parent"] = parent  # merge patch: null makes it a child of the root
    changed_guarantees: dict[str, str | None] = dict(guarantees)
    for resource in remove_guarantees:
        changed_guarantees[resource] = None
    if changed_guarantees:
        patch["guarantee"] = changed_guarantees
    if no_max_queued_time:
        if max_queued_time is not None or on_max_queued is not None:
            raise click.UsageError("--no-max-queued-time cannot go with --max-queued-time or "
                                   "--on-max-queued")
        patch["max_queued"] = None
    elif max_queued_time is not None or on_max_queued is not None:
        seconds = max_queued_time
        if seconds is None:
            existing = api.request("GET", path(name)).get("max_queued")
            if not existing:
                raise CliError("--on-max-queued needs --max-queued-time (the queue has none "
                               "yet)")
            seconds = existing["seconds"]
        patch["max_queued"] = {"seconds": seconds, "action": on_max_queued or "fail"}
    patch.update(_group_timeout(group_timeout, group_timeout_action))
    added = bindings(session, names=namespace, selectors=namespace_selector,
                     raw_json=namespaces_json)
    if added or clear_namespaces:
        # The API replaces the list whole: add to what the queue has now, unless cleared.
        current = [] if clear_namespaces else api.request("GET", path(name)).get(
            "namespaces", [])
        patch["namespaces"] = current + [b for b in added if b not in current]
    if only_kinds and (allow_kinds or disallow_kinds or default_kinds):
        raise click.UsageError("--only-kind replaces the list: give it alone, without "
                               "--allow-kind, --disallow-kind or --default-kinds")
    if only_kinds or default_kinds or allow_kinds or disallow_kinds:
        kinds: tuple[str, ...] = DEFAULT_ALLOWED_KINDS
        if not (only_kinds or default_kinds):
            kinds = tuple(api.request("GET", path(name)).get("allowed_kinds", []))
        # merge patch: null restores the default list, which then follows lockgate's default
        patch["allowed_kinds"] = _kinds(kinds, only=only_kinds, allow=allow_kinds,
                                        disallow=disallow_kinds)
    if not patch:
        raise click.UsageError(
            "nothing to update: give --weight (or --priority-factor), --cordon/--uncordon, "
            "--limit, --remove-limit, --parent, --root, --guarantee, --remove-guarantee, "
            "--group-timeout, --group-timeout-action, --namespace, "
            "--namespace-selector, --clear-namespaces, --max-queued-time, --allow-kind, "
            "--disallow-kind, --only-kind or --default-kinds")
    queue = api.request("PATCH", path(name), patch)
    warn_unserved(session, queue)
    render(session.out, output, queue_view([queue], single=True))


def _kinds(current: tuple[str, ...], *, only: tuple[str, ...] = (),
           allow: tuple[str, ...] = (), disallow: tuple[str, ...] = ()) -> list[str] | None:
    """The allowed kinds to send: `only` if given, else `current` without `disallow`, with
    `allow`; None when that is exactly the default list (a queue keeps following the default,
    rather than holding today's copy of it)."""
    if only:
        return list(dict.fromkeys(only))
    kinds = [kind for kind in current if kind not in disallow]
    kinds += [kind for kind in dict.fromkeys(allow) if kind not in kinds]
    return None if sorted(kinds) == sorted(DEFAULT_ALLOWED_KINDS) else kinds


def _group_timeout(seconds: float | None, action: str | None) -> dict[str, Any]:
    """Pod groups (docs/scheduling.md, "Gangs"): how long one may take to fill up, and then."""
    fields: dict[str, Any] = {}
    if seconds is not None:
        fields["group_timeout_seconds"] = seconds
    if action is not None:
        fields["group_timeout_action"] = action
    return fields


def _cordoning(verb: str, cordoned: bool, what: str) -> None:
    @group.command(verb, help=what)
    @click.argument("name", shell_complete=complete_queue)
    @output_option
    @runs
    def command(session: Session, name: str, output: Output) -> None:
        queue = session.api().request("PATCH", path(name), {"cordoned": cordoned})
        render(session.out, output, queue_view([queue], single=True))


_cordoning("cordon", True, "Stop admitting and releasing the queue's pods.")
_cordoning("uncordon", False, "Admit and release the queue's pods again.")


@group.command("delete")
@click.argument("name", shell_complete=complete_queue)
@output_option
@runs
def delete(session: Session, name: str, output: Output) -> None:
    """Delete a queue (its jobs stay, unscheduled)."""
    session.api().request("DELETE", path(name))
    render(session.out, output, View({"deleted": name}, table=lambda: f"queue {name} deleted",
                                     names=lambda: [f"queue/{name}"]))


@group.command("get")
@click.argument("name", shell_complete=complete_queue)
@output_option
@runs
def get(session: Session, name: str, output: Output) -> None:
    """Show one queue."""
    render(session.out, output, queue_view([session.api().request("GET", path(name))],
                                           single=True))


@group.command("list")
@output_option_for("{[*].name}")
@watch_option
@runs
def list_queues(session: Session, output: Output, watch: bool, interval: float) -> None:
    """List queues with their path in the queue tree, weight, guarantee, limits and
    bindings (parents before their children)."""
    api = session.api()
    show(session.out, output,
         lambda: queue_view(api.request("GET", "/api/v1/queues")["queues"]),
         watch=watch, interval=interval)


def queue_paths(queues: list[dict[str, Any]]) -> dict[str, str]:
    """Each queue's path from the root (research/vision/alice), from the parent fields. A
    parent not listed, or a cycle (the API refuses both), ends the path with '?'."""
    parents = {q["name"]: q.get("parent") for q in queues}
    paths: dict[str, str] = {}
    for name in parents:
        chain, at = [name], parents[name]
        while at is not None and len(chain) <= len(parents):
            chain.append(at if at in parents else f"{at}?")
            at = parents.get(at)
        paths[name] = "/".join(reversed(chain))
    return paths


def _resources(amounts: dict[str, Any] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((amounts or {}).items())) or "-"


def queue_view(queues: list[dict[str, Any]], *, single: bool = False) -> View:
    def table() -> Table:
        paths = queue_paths(queues)
        ordered = sorted(queues, key=lambda q: paths[q["name"]])
        return Table(
            ["NAME", "PATH", "WEIGHT", "PRIORITY-FACTOR", "CORDONED", "LIMITS", "GUARANTEE",
             "MAX-QUEUED", "NAMESPACES", "ALLOWED-KINDS", "GROUP-TIMEOUT", "CREATED"],
            [[q["name"], paths[q["name"]], weight(q["weight"]), f"{q['priority_factor']:g}",
              "yes" if q["cordoned"] else "no",
              _resources(q["resource_limits"]), _resources(q.get("guarantee")),
              _describe_max_queued(q.get("max_queued")),
              _describe_bindings(q.get("namespaces") or []),
              # the default list is long and documented: `-o json` spells it out
              "(default)" if q.get("allowed_kinds_default")
              else ",".join(q.get("allowed_kinds") or []),
              _describe_group_timeout(q), (q.get("created_at") or "-")[:19]]
             for q in ordered],
            wide=2,
            empty="no queues: create one with `lockgate queue create NAME --namespace NS`")

    return View(queues[0] if single else queues, table=table,
                names=lambda: [f"queue/{q['name']}" for q in queues])


def _describe_group_timeout(queue: dict[str, Any]) -> str:
    seconds = queue.get("group_timeout_seconds")
    if not seconds:
        return "-"
    return f"{duration(seconds)},{queue.get('group_timeout_action') or 'delete'}"


def _describe_max_queued(max_queued: dict[str, Any] | None) -> str:
    if not max_queued:
        return "-"
    return f"{duration(max_queued['seconds'])},{max_queued['action']}"


def _describe_binding(binding: dict[str, Any]) -> str:
    what = list(binding.get("names") or [])
    selector = binding.get("selector") or {}
    what += [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    what += [f"{e['key']} {e['operator']}" for e in selector.get("matchExpressions") or []]
    return f"{binding.get('cluster', '*')}/{'+'.join(what)}"


def _describe_bindings(found: list[dict[str, Any]]) -> str:
    if not found:
        return "(none: unusable)"
    return ",".join(_describe_binding(binding) for binding in found)
