"""The `lockgate` command (and `kubectl lockgate`): its global options, nouns and exits.

    lockgate [--api URL] [--token-file FILE] [--traces URL] [--context NAME] NOUN VERB ...

Global options may come anywhere, as kubectl's (`lockgate queue list --context prod`). The API
address, token and trace store come from flags, the environment or the config file
(`lockgate_cli.contexts`). Exit status: 0 on success, 1 when the API refuses or fails, 2 on a
usage error; a closed pipe (`lockgate status -o yaml | head`) ends quietly with 141, as a
program killed by SIGPIPE does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

import click
from click.shell_completion import get_completion_class, shell_complete

if TYPE_CHECKING:
    import httpx

from lockgate_cli import (
    cluster,
    completion,
    config,
    explain,
    jobs,
    jobset,
    namespace,
    queue,
    status,
    token,
    trace,
    webhook_tls,
)
from lockgate_cli.completing import COMPLETE_VAR
from lockgate_cli.session import CommandError, Session

# The options every command takes, by their spelling, and whether they take a value.
GLOBAL_OPTIONS = {"--api": "api", "--token-file": "token_file", "--traces": "traces",
                  "--context": "context"}
EXIT_CLOSED_PIPE = 128 + 13  # SIGPIPE
# Cobra's ShellCompDirectiveNoFileComp: kubectl offers no file names after the candidates.
NO_FILE_COMPLETION = ":4"


@click.group("lockgate", context_settings={"help_option_names": ["-h", "--help"],
                                           "max_content_width": 100})
@click.version_option(None, "--version", package_name="lockgate", prog_name="lockgate",
                      message="%(prog)s %(version)s")
@click.option("--api", metavar="URL", help="admin API URL (env LOCKGATE_API, else the "
              "config file's context; default http://127.0.0.1:58080)")
@click.option("--token-file", metavar="FILE", help="file holding the bearer token (else env "
              "LOCKGATE_TOKEN, LOCKGATE_TOKEN_FILE, or the context's)")
@click.option("--traces", metavar="URL", help="the trace store's query API, Jaeger's (env "
              "LOCKGATE_TRACES_URL, or the context's)")
@click.option("--context", metavar="NAME", shell_complete=config.complete_context,
              help="a context of the config file (~/.config/lockgate/config; env "
                   "LOCKGATE_CONTEXT)")
@click.pass_context
def cli(ctx: click.Context, api: str | None, token_file: str | None, traces: str | None,
        context: str | None) -> None:
    """Manage lockgate's queues and see how pods wait, through queue-store's admin API."""
    session = ctx.ensure_object(Session)
    session.flags.update({k: v for k, v in (("api", api), ("token_file", token_file),
                                            ("traces", traces), ("context", context))
                          if v is not None})


for noun in (queue.group, jobs.group, jobset.group, namespace.group, status.command,
             explain.command, trace.command, cluster.group, token.group, config.group,
             completion.command, webhook_tls.command):
    cli.add_command(noun)


def globals_first(argv: Sequence[str]) -> list[str]:
    """The arguments with the global options moved before the noun, so they may be written
    anywhere (`lockgate queue list --api URL`). Nothing after `--` moves, nor anything of
    `lockgate config set-context`, which takes options of the same names."""
    moved: list[str] = []
    rest: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or rest[-2:] == ["config", "set-context"]:
            rest += args[i:]
            break
        if arg.split("=", 1)[0] in GLOBAL_OPTIONS:
            taken = 1 if "=" in arg else 2
            moved += args[i:i + taken]
            i += taken
            continue
        rest.append(arg)
        i += 1
    return moved + rest


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None,
         err: TextIO | None = None, transport: httpx.BaseTransport | None = None,
         env: Mapping[str, str] | None = None, prog_name: str = "lockgate") -> int:
    """Run one command; returns its exit status (the console scripts exit with it)."""
    out, err = out or sys.stdout, err or sys.stderr
    if argv is None and COMPLETE_VAR in os.environ:
        return shell_complete(cli, {"obj": Session()}, prog_name, COMPLETE_VAR,
                              os.environ[COMPLETE_VAR])
    args = globals_first(sys.argv[1:] if argv is None else argv)
    session = Session(out=out, err=err, transport=transport,
                      env=dict(os.environ) if env is None else dict(env))
    try:
        with cli.make_context(prog_name, args, obj=session) as ctx:
            cli.invoke(ctx)
    except click.exceptions.Exit as done:  # --help, --version
        return done.exit_code
    except click.UsageError as error:
        _usage(error, err)
        return 2
    except CommandError as error:
        print(error.format_message(), file=err)
        return 1
    except click.ClickException as error:
        print(f"{prog_name}: {error.format_message()}", file=err)
        return error.exit_code
    except click.Abort:
        print(f"{prog_name}: aborted", file=err)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_CLOSED_PIPE
    finally:
        session.close()
    return 0


def _usage(error: click.UsageError, err: TextIO) -> None:
    """`lockgate queue create: no such option --wieght`, then the command's usage: the error
    names the command it belongs to."""
    where = error.ctx.command_path if error.ctx is not None else "lockgate"
    if isinstance(error, click.exceptions.NoArgsIsHelpError):  # `lockgate queue`: its help
        print(error.format_message(), file=err)
        return
    print(f"{where}: {error.format_message()}", file=err)
    if error.ctx is not None:
        print(error.ctx.get_usage(), file=err)
        print(f"See '{where} --help'.", file=err)


def _quiet_stdout() -> None:
    """After the reader of stdout went away: point it at /dev/null, so the interpreter's own
    flush at exit does not fail again (and print a traceback)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def run() -> None:
    """The `lockgate` console script."""
    sys.exit(main())


def kubectl_plugin() -> None:
    """The `kubectl-lockgate` console script: `kubectl lockgate ...` runs it."""
    sys.exit(main(prog_name="kubectl lockgate"))


def candidates(args: Sequence[str], *, session: Session | None = None) -> list[str]:
    """What may come after `lockgate ARGS...` (the last one is the word being completed);
    `session`: the tests' recorded API."""
    words = list(args) or [""]
    completion = get_completion_class("bash")
    assert completion is not None
    helper = completion(cli, {"obj": session or Session()}, "lockgate", COMPLETE_VAR)
    return [item.value for item in helper.get_completions(words[:-1], words[-1])]


def kubectl_complete() -> None:
    """The `kubectl_complete-lockgate` console script: kubectl's plugin completion (one
    candidate per line, then the directive)."""
    for value in candidates(sys.argv[1:]):
        print(value)
    print(NO_FILE_COMPLETION)
