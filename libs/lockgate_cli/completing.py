"""Completing names from the admin API: what the commands' arguments offer a shell.

Why a leaf module: the nouns (`queue`, `jobs`, `jobset`, `namespace`) complete queue and cluster
names, the `completion` noun prints the scripts, and `root` assembles the nouns into the command
and answers the shell's completion requests. Were the completers in `completion`, which needs the
assembled command, the nouns and the root would import each other in a circle; here they import
only the session and the client.
"""

from __future__ import annotations

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
    session = ctx.find_object(Session) or Session()
    root = ctx.find_root()
    flags = {name: root.params.get(name) for name in ("api", "token_file", "traces", "context")}
    session.flags = {k: v for k, v in flags.items() if v is not None}
    try:
        settings = session.settings()
        api = admin_client(settings.api, settings.token, session.transport,
                           timeout=API_TIMEOUT_SECONDS)
        try:
            items = api.request("GET", path)[key]
        finally:
            api.close()
    except Exception:  # noqa: BLE001 - completion must never fail the shell
        return []
    return [CompletionItem(str(item[field])) for item in items
            if str(item.get(field, "")).startswith(incomplete)]


def complete_queue(ctx: click.Context, param: click.Parameter,
                   incomplete: str) -> list[CompletionItem]:
    """Queue names from the API (nothing if it cannot be reached)."""
    return complete_from_api(ctx, "/api/v1/queues", "queues", "name", incomplete)


def complete_cluster(ctx: click.Context, param: click.Parameter,
                     incomplete: str) -> list[CompletionItem]:
    """Cluster names from the API (nothing if it cannot be reached)."""
    return complete_from_api(ctx, "/api/v1/clusters", "clusters", "name", incomplete)
