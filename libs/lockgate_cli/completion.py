"""`lockgate completion bash|zsh|fish`: the shell's completion script, as kubectl prints its own.

    source <(lockgate completion bash)                          # bash, this shell
    lockgate completion zsh > "${fpath[1]}/_lockgate"           # zsh
    lockgate completion fish > ~/.config/fish/completions/lockgate.fish

Why click's completion: the script asks the command itself what may come next
(`_LOCKGATE_COMPLETE=bash_complete lockgate ...`, answered in `root.main`), so nouns, verbs,
options, choices, queue names and cluster names (from the admin API, within a short timeout:
`completing`) complete without a script to keep in step. `kubectl lockgate <TAB>` asks
`kubectl_complete-lockgate` (`root.kubectl_complete`, installed beside `kubectl-lockgate`), which
answers in the format kubectl expects of a plugin.
"""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from lockgate_cli.completing import COMPLETE_VAR
from lockgate_cli.session import Session, runs

SHELLS = ("bash", "zsh", "fish")


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
    completion = get_completion_class(shell)
    if completion is None:  # click ships all three
        raise click.UsageError(f"no completion for {shell}")
    # The script completes the whole command this one is a noun of (the root's, not imported:
    # the root imports this module).
    cli = click.get_current_context().find_root().command
    script = completion(cli, {}, "lockgate", COMPLETE_VAR).source()
    print(script, file=session.out)
