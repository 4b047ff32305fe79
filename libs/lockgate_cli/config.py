"""`lockgate config view|get-contexts|current-context|use-context|set-context|delete-context`.

The config file (`lockgate_cli.contexts`) holds contexts, each an admin API URL, a token or
token file, and a trace store URL, as kubeconfig does for clusters. `view` shows what a command
would run with and where each setting came from (flag, environment, context or default).
"""

from __future__ import annotations

import click

from lockgate_cli.client import CliError
from lockgate_cli.contexts import ConfigFile
from lockgate_cli.output import Output, Table, View, output_option, render
from lockgate_cli.session import Session, runs


@click.group("config")
def group() -> None:
    """The config file's contexts: where the admin API, its token and the traces are."""


def complete_context(ctx: click.Context, param: click.Parameter,
                     incomplete: str) -> list[click.shell_completion.CompletionItem]:
    session = ctx.find_object(Session) or Session()
    try:
        names = list(session.config().contexts)
    except Exception:  # noqa: BLE001 - completion must never fail the shell
        return []
    return [click.shell_completion.CompletionItem(n) for n in names if n.startswith(incomplete)]


@group.command("view")
@output_option
@runs
def view(session: Session, output: Output) -> None:
    """What a command runs with now, and where each setting comes from."""
    config = session.config()
    settings = session.settings()
    data = {"config_file": str(config.path), "config_file_exists": config.path.exists(),
            "context": settings.context, "api": settings.api,
            "token": "(set)" if settings.token else None, "traces": settings.traces,
            "sources": dict(settings.sources)}
    render(session.out, output, View(data, table=lambda: {
        "Config file": f"{config.path}{'' if config.path.exists() else ' (none yet)'}",
        "Context": settings.context or "-",
        "API": f"{settings.api} (from {settings.sources.get('api', 'default')})",
        "Token": (f"set (from {settings.sources['token']})" if settings.token
                  else "none: give --token-file, LOCKGATE_TOKEN or a context's token-file"),
        "Traces": (f"{settings.traces} (from {settings.sources['traces']})" if settings.traces
                   else "none: give --traces, LOCKGATE_TRACES_URL or a context's traces"),
    }))


@group.command("get-contexts")
@output_option
@runs
def get_contexts(session: Session, output: Output) -> None:
    """The contexts of the config file; the current one is starred."""
    config = session.config()
    data = {"current-context": config.current,
            "contexts": [{"name": name, **values} for name, values in config.contexts.items()]}
    render(session.out, output, View(data, table=lambda: Table(
        ["CURRENT", "NAME", "API", "TOKEN", "TRACES"],
        [["*" if name == config.current else "", name, values.get("api", "-"),
          values.get("token-file") or ("(inline)" if values.get("token") else "-"),
          values.get("traces", "-")] for name, values in config.contexts.items()],
        empty=f"no contexts in {config.path}: add one with "
              "'lockgate config set-context NAME --api URL --token-file FILE'"),
        names=lambda: [f"context/{name}" for name in config.contexts]))


@group.command("current-context")
@runs
def current_context(session: Session) -> None:
    """The current context's name."""
    config = session.config()
    if not config.current:
        raise CliError(f"no current context in {config.path}")
    print(config.current, file=session.out)


@group.command("use-context")
@click.argument("name", shell_complete=complete_context)
@runs
def use_context(session: Session, name: str) -> None:
    """Make NAME the current context."""
    config = session.config()
    config.context(name)  # says which exist
    config.current = name
    config.save()
    print(f"switched to context {name}", file=session.out)


@group.command("set-context")
@click.argument("name", shell_complete=complete_context)
@click.option("--api", help="the admin API URL")
@click.option("--token-file", type=click.Path(dir_okay=False), help="file holding the token")
@click.option("--token", help="the token itself (the file is written 0600)")
@click.option("--traces", help="the trace store's query URL (Jaeger)")
@click.option("--current/--not-current", "make_current", default=None,
              help="also make it the current context (default: if there is none)")
@runs
def set_context(session: Session, name: str, api: str | None, token_file: str | None,
                token: str | None, traces: str | None, make_current: bool | None) -> None:
    """Add a context, or change the settings given of an existing one."""
    if token and token_file:
        raise click.UsageError("give --token or --token-file, not both")
    config: ConfigFile = session.config()
    values = config.contexts.setdefault(name, {})
    for key, value in (("api", api), ("traces", traces)):
        if value is not None:
            values[key] = value
    if token_file is not None:
        values.pop("token", None)
        values["token-file"] = token_file
    if token is not None:
        values.pop("token-file", None)
        values["token"] = token
    if make_current or (make_current is None and not config.current):
        config.current = name
    config.save()
    print(f"context {name} set in {config.path}"
          + (" (current)" if config.current == name else ""), file=session.out)


@group.command("delete-context")
@click.argument("name", shell_complete=complete_context)
@runs
def delete_context(session: Session, name: str) -> None:
    """Remove a context from the config file."""
    config = session.config()
    config.context(name)
    del config.contexts[name]
    if config.current == name:
        config.current = None
    config.save()
    print(f"context {name} deleted from {config.path}", file=session.out)
