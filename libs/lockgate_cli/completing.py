"""Completing names from the admin API: what the commands' arguments offer a shell.

Why a leaf module: the nouns (`queue`, `jobs`, `jobset`, `namespace`) complete queue and cluster
names (and `explain` and `trace` pods), the `completion` noun prints the scripts, and `root`
assembles the nouns into the command and answers the shell's completion requests. Were the
completers in `completion`, which needs the assembled command, the nouns and the root would
import each other in a circle; here they import only the session and the client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from click.shell_completion import CompletionItem

from lockgate_cli.client import admin_client
from lockgate_cli.session import Session

# The environment variable through which a shell asks `lockgate` for completions.
COMPLETE_VAR = "_LOCKGATE_COMPLETE"
# Completion asks the API for queue and cluster names; a shell must not hang on it.
API_TIMEOUT_SECONDS = 2.0


def complete_from_api(ctx: click.Context, path: str, key: str, field: str,
                      incomplete: str) -> list[CompletionItem]:
    """Names listed by the admin API at `path`, for a shell's completion; none on any error."""
    return [CompletionItem(name) for name in _listed(ctx, path, key, lambda item: item[field])
            if name.startswith(incomplete)]


def _listed(ctx: click.Context, path: str, key: str, name: Callable[[Any], object],
            query: dict[str, str] | None = None) -> list[str]:
    """`name` of each item the admin API lists at `path` under `key`; none on any error."""
    session = ctx.find_object(Session) or Session()
    root = ctx.find_root()
    flags = {name: root.params.get(name) for name in ("api", "token_file", "traces", "context")}
    session.flags = {k: v for k, v in flags.items() if v is not None}
    try:
        settings = session.settings()
        api = admin_client(settings.api, settings.token, session.transport,
                           timeout=API_TIMEOUT_SECONDS)
        try:
            return [str(name(item)) for item in api.request("GET", path, query=query)[key]]
        finally:
            api.close()
    except Exception:  # noqa: BLE001 - completion must never fail the shell
        return []


# Pods offered after CLUSTER/NAMESPACE/POD: the unfinished ones (those a person asks about),
# at most this many, of the typed cluster once it is typed.
PODS_COMPLETED = 1000


def complete_pod(ctx: click.Context, param: click.Parameter,
                 incomplete: str) -> list[CompletionItem]:
    """CLUSTER/NAMESPACE/POD of the unfinished pods lockgate knows (`lockgate explain`,
    `lockgate trace`), from the admin API's job list."""
    cluster, slash, _ = incomplete.partition("/")
    query = {"limit": str(PODS_COMPLETED), **({"cluster": cluster} if slash else {})}
    pods = _listed(ctx, "/api/v1/jobs", "jobs",
                   lambda job: f"{job['cluster']}/{job['namespace']}/{job['name']}", query)
    return [CompletionItem(pod) for pod in dict.fromkeys(pods) if pod.startswith(incomplete)]


def complete_queue(ctx: click.Context, param: click.Parameter,
                   incomplete: str) -> list[CompletionItem]:
    """Queue names from the API (nothing if it cannot be reached)."""
    return complete_from_api(ctx, "/api/v1/queues", "queues", "name", incomplete)


def complete_cluster(ctx: click.Context, param: click.Parameter,
                     incomplete: str) -> list[CompletionItem]:
    """Cluster names from the API (nothing if it cannot be reached)."""
    return complete_from_api(ctx, "/api/v1/clusters", "clusters", "name", incomplete)
