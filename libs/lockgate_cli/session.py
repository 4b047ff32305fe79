"""What one `lockgate` command runs with: where to print, the resolved settings, the clients.

Why an object of its own: the root command knows the flags, the noun modules need the clients;
the settings are resolved (and the config file read) only when a command first needs them, so
`lockgate token new` or `lockgate completion bash` work with a broken config file.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TextIO, TypeVar

import click

if TYPE_CHECKING:
    import httpx

from lockgate_cli.client import ApiError, CliError, JsonClient, admin_client, traces_client
from lockgate_cli.contexts import ConfigError, ConfigFile, Resolved, config_path, resolve


@dataclass
class Session:
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    transport: httpx.BaseTransport | None = None  # unit tests answer from recordings
    flags: dict[str, str | None] = field(default_factory=dict)
    _resolved: Resolved | None = None
    _api: JsonClient | None = None
    _traces: JsonClient | None = None
    _clusters: list[dict[str, Any]] | None = None

    def config(self) -> ConfigFile:
        return ConfigFile.load(config_path(self.env))

    def settings(self) -> Resolved:
        if self._resolved is None:
            self._resolved = resolve(flags=self.flags, env=self.env, config=self.config())
        return self._resolved

    def api(self) -> JsonClient:
        if self._api is None:
            settings = self.settings()
            self._api = admin_client(settings.api, settings.token, self.transport)
        return self._api

    def traces(self) -> JsonClient:
        if self._traces is None:
            url = self.settings().traces
            if not url:
                raise CliError("no trace store is configured: give --traces URL (Jaeger's "
                               "query API, e.g. http://127.0.0.1:16686), set "
                               "LOCKGATE_TRACES_URL, or 'traces' in a context of the config "
                               "file (`make run` exports it in its env file)")
            self._traces = traces_client(url, self.transport)
        return self._traces

    def known_clusters(self) -> list[dict[str, Any]] | None:
        """The clusters lockgate knows (GET /api/v1/clusters), or None from an API too old to
        say."""
        if self._clusters is None:
            try:
                self._clusters = list(self.api().request("GET", "/api/v1/clusters")["clusters"])
            except ApiError as error:
                if error.status != 404:
                    raise
                return None
        return self._clusters

    def check_cluster(self, cluster: str, *, what: str) -> None:
        """Refuse a cluster lockgate does not know, listing those it does."""
        clusters = self.known_clusters()
        if clusters is None or cluster == "*":
            return
        names = sorted(c["name"] for c in clusters)
        if not names:
            print(f"warning: lockgate knows no cluster yet (no cluster-watcher has reported), "
                  f"so {what} {cluster!r} could not be checked", file=self.err)
            return
        if cluster not in names:
            raise CliError(f"unknown cluster {cluster!r} in {what}; lockgate knows "
                           f"{', '.join(names)} (see 'lockgate cluster list')")

    def close(self) -> None:
        for client in (self._api, self._traces):
            if client is not None:
                client.close()


class CommandError(click.ClickException):
    """A failure of one command, named by its path (`lockgate queue create: ...`)."""

    exit_code = 1

    def __init__(self, command_path: str, message: str) -> None:
        super().__init__(message)
        self.command_path = command_path

    def format_message(self) -> str:
        return f"{self.command_path}: {self.message}"


P = ParamSpec("P")
R = TypeVar("R")


def runs(function: Callable[Concatenate[Session, P], R]) -> Callable[P, R]:
    """A command body that receives the Session first; its failures name the command."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        context = click.get_current_context()
        session = context.find_object(Session)
        if session is None:  # invoked outside `main` (click's own runner): a fresh one
            session = context.ensure_object(Session)
        try:
            return function(session, *args, **kwargs)
        except (CliError, ConfigError) as error:
            raise CommandError(context.command_path, str(error)) from error

    return wrapper
