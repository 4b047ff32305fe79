"""Where the CLI finds the admin API, its token and the trace store: flags, env, config file.

Why a config file with contexts: a user who works with a local `make run` and a production
lockgate switches between them as with kubeconfig contexts, without exporting variables.

    # ~/.config/lockgate/config ($LOCKGATE_CONFIG, else $XDG_CONFIG_HOME/lockgate/config)
    current-context: dev
    contexts:
      - name: dev
        api: http://127.0.0.1:58080
        token-file: ~/.local/state/lockgate/stack/dev/logs/admin-token
        traces: http://127.0.0.1:58686
      - name: prod
        api: https://lockgate.example.com
        token-file: ~/.config/lockgate/prod-token

Each setting is looked up in order, the first found wins:
1. a flag (`--api`, `--token-file`, `--traces`), and the context `--context NAME` names
   (naming one is as explicit as a flag);
2. the environment: LOCKGATE_API, LOCKGATE_TOKEN, LOCKGATE_TOKEN_FILE, LOCKGATE_TRACES_URL;
3. the config file's current context (LOCKGATE_CONTEXT picks another);
4. the defaults: http://127.0.0.1:58080 and no token, no trace store.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_API = "http://127.0.0.1:58080"
KEYS = ("api", "token", "token-file", "traces")


class ConfigError(Exception):
    """The config file cannot be read, or names a context it does not have."""


def config_path(env: Mapping[str, str]) -> Path:
    if env.get("LOCKGATE_CONFIG"):
        return Path(env["LOCKGATE_CONFIG"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base).expanduser() / "lockgate" / "config"


@dataclass
class ConfigFile:
    """The config file's contents: contexts by name (in file order) and the current one."""

    path: Path
    contexts: dict[str, dict[str, str]] = field(default_factory=dict)
    current: str | None = None

    @classmethod
    def load(cls, path: Path) -> ConfigFile:
        if not path.exists():
            return cls(path)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f"cannot read the config file {path}: {error}") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"the config file {path} must be a mapping with 'contexts'")
        contexts: dict[str, dict[str, str]] = {}
        for entry in loaded.get("contexts") or []:
            if not isinstance(entry, dict) or not entry.get("name"):
                raise ConfigError(f"{path}: every context needs a name, not {entry!r}")
            unknown = sorted(set(entry) - {"name", *KEYS})
            if unknown:
                raise ConfigError(f"{path}: context {entry['name']!r} has unknown keys "
                                  f"{', '.join(unknown)} (known: {', '.join(KEYS)})")
            contexts[str(entry["name"])] = {k: str(v) for k, v in entry.items()
                                            if k != "name" and v is not None}
        current = loaded.get("current-context")
        return cls(path, contexts, str(current) if current else None)

    def save(self) -> None:
        """Written 0600: a context may hold a token."""
        document: dict[str, Any] = {}
        if self.current:
            document["current-context"] = self.current
        document["contexts"] = [{"name": name, **values}
                                for name, values in self.contexts.items()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            yaml.safe_dump(document, handle, sort_keys=False)
        self.path.chmod(0o600)

    def context(self, name: str) -> dict[str, str]:
        if name not in self.contexts:
            known = ", ".join(sorted(self.contexts)) or "none"
            raise ConfigError(f"no context {name!r} in {self.path} (known: {known}); add one "
                              "with 'lockgate config set-context NAME --api URL'")
        return self.contexts[name]


@dataclass(frozen=True)
class Resolved:
    """The settings one command runs with, and where each came from (for `config view`)."""

    api: str
    token: str | None
    traces: str | None
    context: str | None
    sources: Mapping[str, str]


def resolve(*, flags: Mapping[str, str | None], env: Mapping[str, str],
            config: ConfigFile) -> Resolved:
    """Flags (and `--context`), then the environment, then the current context, then defaults.
    `flags` holds api, token_file, traces, context (None when not given)."""
    named = flags.get("context")
    context_name = named or env.get("LOCKGATE_CONTEXT") or config.current
    context = config.context(context_name) if context_name else {}
    explicit = context if named else {}
    fallback = {} if named else context
    sources: dict[str, str] = {}

    def pick(key: str, *candidates: tuple[str, str | None]) -> str | None:
        for source, value in candidates:
            if value is not None and value.strip():
                sources[key] = source
                return value.strip()
        return None

    where = f"context {context_name}" if context_name else "config"
    api = pick("api", ("--api", flags.get("api")), (f"{where}", explicit.get("api")),
               ("LOCKGATE_API", env.get("LOCKGATE_API")), (where, fallback.get("api"))
               ) or DEFAULT_API
    sources.setdefault("api", "default")
    traces = pick("traces", ("--traces", flags.get("traces")), (where, explicit.get("traces")),
                  ("LOCKGATE_TRACES_URL", env.get("LOCKGATE_TRACES_URL")),
                  (where, fallback.get("traces")))
    token = _token(flags.get("token_file"), explicit, env, fallback, where, sources)
    return Resolved(api=api, token=token, traces=traces, context=context_name, sources=sources)


def _token(flag_file: str | None, explicit: Mapping[str, str], env: Mapping[str, str],
           fallback: Mapping[str, str], where: str, sources: dict[str, str]) -> str | None:
    """--token-file, the named context's, $LOCKGATE_TOKEN, $LOCKGATE_TOKEN_FILE, then the
    current context's token or token-file; None lets the request go without one (the API's 401
    then says how to authenticate)."""
    candidates: list[tuple[str, str, str | None]] = [
        ("file", "--token-file", flag_file),
        ("token", where, explicit.get("token")), ("file", where, explicit.get("token-file")),
        ("token", "LOCKGATE_TOKEN", env.get("LOCKGATE_TOKEN")),
        ("file", "LOCKGATE_TOKEN_FILE", env.get("LOCKGATE_TOKEN_FILE")),
        ("token", where, fallback.get("token")), ("file", where, fallback.get("token-file")),
    ]
    for kind, source, value in candidates:
        if value is None or not value.strip():
            continue
        sources["token"] = source
        return value.strip() if kind == "token" else read_token_file(value.strip())
    return None


def read_token_file(path: str) -> str:
    try:
        token = Path(path).expanduser().read_text().strip()
    except OSError as error:
        raise ConfigError(f"cannot read the token file {path}: "
                          f"{error.strerror or error}") from error
    if not token:
        raise ConfigError(f"the token file {path} is empty")
    return token
