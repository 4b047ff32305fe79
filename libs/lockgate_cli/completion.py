"""`lockgate completion bash|zsh|fish`: the shell's completion script, as kubectl prints its own.

    source <(lockgate completion bash)                          # bash, this shell
    lockgate completion zsh > "${fpath[1]}/_lockgate"           # zsh
    lockgate completion fish > ~/.config/fish/completions/lockgate.fish

Why click's completion: the script asks the command itself what may come next
(`_LOCKGATE_COMPLETE=bash_complete lockgate ...`), so nouns, verbs, options, choices, queue
names and cluster names (from the admin API, within a short timeout) complete without a script
to keep in step. `kubectl lockgate <TAB>` asks `kubectl_complete-lockgate` (installed beside
`kubectl-lockgate`), which answers in the format kubectl expects of a plugin.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click
from click.shell_completion import CompletionItem, get_completion_class

from lockgate_cli.session import Session, runs

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_LOCKGATE_COMPLETE"
# Completion asks the API for queue and cluster names; a shell must not hang on it.
API_TIMEOUT_SECONDS = 2.0
# Cobra's ShellCompDirectiveNoFileComp: kubectl offers no file names after the candidates.
NO_FILE_COMPLETION = ":4"


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
@runs
def command(session: Session, shell: str) -> None:
    """Print the completion script for bash, zsh or fish (see `lockgate completion --help`).

    \b
    bash:  source <(lockgate completion bash)   (or write it to
           /etc/bash_completion.d/lockgate)
    zsh:   lockgate completion zsh > "${fpath[1]}/_lockgate"
    fish:  lockgate completion fish > ~/.config/fish/completions/lockgate.fish
    """
    from lockgate_cli.root import cli

    completion = get_completion_class(shell)
    if completion is None:  # click ships all three
        raise click.UsageError(f"no completion for {shell}")
    script = completion(cli, {}, "lockgate", COMPLETE_VAR).source()
    print(script, file=session.out)


def complete_from_api(ctx: click.Context, path: str, key: str, field: str,
                      incomplete: str) -> list[CompletionItem]:
    """Names listed by the admin API at `path`, for a shell's completion; none on any error."""
    from lockgate_cli.client import admin_client

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


def candidates(args: Sequence[str]) -> list[str]:
    """What may come after `lockgate ARGS...` (the last one is the word being completed)."""
    from lockgate_cli.root import cli

    words = list(args) or [""]
    completion = get_completion_class("bash")
    assert completion is not None
    helper = completion(cli, {"obj": Session()}, "lockgate", COMPLETE_VAR)
    return [item.value for item in helper.get_completions(words[:-1], words[-1])]


def kubectl_complete() -> None:
    """`kubectl_complete-lockgate ARGS...`: kubectl's plugin completion (one per line, then
    the directive)."""
    for value in candidates(sys.argv[1:]):
        print(value)
    print(NO_FILE_COMPLETION)
