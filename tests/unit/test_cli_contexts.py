"""Where the CLI finds the API, the token and the trace store: flags, env, the config file."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from recorded_api import RecordedApi

from lockgate_cli import root
from lockgate_cli.contexts import ConfigError, ConfigFile, resolve


def config_with(tmp_path: Path, text: str) -> ConfigFile:
    path = tmp_path / "config"
    path.write_text(text)
    return ConfigFile.load(path)


TWO_CONTEXTS = """
current-context: dev
contexts:
  - name: dev
    api: http://dev.test:58080
    token: dev-token
    traces: http://dev.test:58686
  - name: prod
    api: https://prod.test
    token-file: {token_file}
"""


@pytest.fixture
def config(tmp_path: Path) -> ConfigFile:
    (tmp_path / "prod-token").write_text("prod-token\n")
    return config_with(tmp_path, TWO_CONTEXTS.format(token_file=tmp_path / "prod-token"))


def test_the_current_context_gives_what_neither_flags_nor_env_give(config: ConfigFile) -> None:
    got = resolve(flags={}, env={}, config=config)
    assert (got.api, got.token, got.traces, got.context) == (
        "http://dev.test:58080", "dev-token", "http://dev.test:58686", "dev")


def test_env_overrides_the_current_context_and_flags_override_env(config: ConfigFile) -> None:
    env = {"LOCKGATE_API": "http://env.test", "LOCKGATE_TOKEN": "env-token",
           "LOCKGATE_TRACES_URL": "http://env-traces.test"}
    got = resolve(flags={}, env=env, config=config)
    assert (got.api, got.token, got.traces) == ("http://env.test", "env-token",
                                                "http://env-traces.test")
    assert got.sources == {"api": "LOCKGATE_API", "token": "LOCKGATE_TOKEN",
                           "traces": "LOCKGATE_TRACES_URL"}
    flagged = resolve(flags={"api": "http://flag.test"}, env=env, config=config)
    assert (flagged.api, flagged.sources["api"]) == ("http://flag.test", "--api")


def test_a_context_named_by_flag_is_as_explicit_as_a_flag(config: ConfigFile) -> None:
    env = {"LOCKGATE_API": "http://env.test", "LOCKGATE_TOKEN": "env-token"}
    got = resolve(flags={"context": "prod"}, env=env, config=config)
    assert (got.api, got.token, got.context) == ("https://prod.test", "prod-token", "prod")
    by_env = resolve(flags={}, env={"LOCKGATE_CONTEXT": "prod"}, config=config)
    assert by_env.api == "https://prod.test"


def test_without_config_the_defaults_and_the_old_token_order_hold(tmp_path: Path) -> None:
    empty = ConfigFile.load(tmp_path / "none")
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert resolve(flags={}, env={}, config=empty).token is None
    assert resolve(flags={}, env={}, config=empty).api == "http://127.0.0.1:58080"
    assert resolve(flags={}, env={"LOCKGATE_TOKEN": " from-env "}, config=empty).token \
        == "from-env"
    assert resolve(flags={}, env={"LOCKGATE_TOKEN": "", "LOCKGATE_TOKEN_FILE": str(token_file)},
                   config=empty).token == "from-file"
    assert resolve(flags={"token_file": str(token_file)}, env={"LOCKGATE_TOKEN": "from-env"},
                   config=empty).token == "from-file"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        resolve(flags={"token_file": str(tmp_path / "empty")}, env={}, config=empty)
    with pytest.raises(ConfigError, match="cannot read the token file"):
        resolve(flags={"token_file": str(tmp_path / "nope")}, env={}, config=empty)


@pytest.mark.parametrize(("text", "error"), [
    ("contexts: [{api: x}]", "every context needs a name"),
    ("contexts: [{name: a, url: x}]", "unknown keys url"),
    ("- just a list", "must be a mapping"),
    ("{{{", "cannot read the config file"),
])
def test_a_broken_config_file_says_what_is_wrong(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        config_with(tmp_path, text)


def test_an_unknown_context_lists_the_known_ones(config: ConfigFile) -> None:
    with pytest.raises(ConfigError, match=r"no context 'stage' .* \(known: dev, prod\)"):
        resolve(flags={"context": "stage"}, env={}, config=config)


def test_config_commands_write_the_file_and_commands_use_it(tmp_path: Path) -> None:
    env = {"LOCKGATE_CONFIG": str(tmp_path / "lockgate" / "config")}
    api = RecordedApi().on("GET", "/api/v1/queues", {"queues": []})
    made = api.run("config", "set-context", "dev", "--api", "http://dev.test",
                   "--token", "t0ken", "--traces", "http://traces.test", env=env)
    assert made.code == 0, made.err
    assert "(current)" in made.out
    written = tmp_path / "lockgate" / "config"
    assert written.stat().st_mode & 0o777 == 0o600
    assert api.run("config", "set-context", "prod", "--api", "https://prod.test",
                   env=env).code == 0
    contexts = api.run("config", "get-contexts", env=env).out.splitlines()
    assert contexts[1].split()[:3] == ["*", "dev", "http://dev.test"]
    assert api.run("config", "use-context", "prod", env=env).code == 0
    assert api.run("config", "current-context", env=env).out == "prod\n"
    out = io.StringIO()
    assert root.main(["config", "view", "-o", "json", "--context", "dev"], out=out,
                     err=io.StringIO(), env=env) == 0
    view = json.loads(out.getvalue())
    assert (view["api"], view["token"], view["context"]) == ("http://dev.test", "(set)", "dev")
    assert "t0ken" not in out.getvalue()
    missing = api.run("config", "use-context", "stage", env=env)
    assert missing.code == 1 and "known: dev, prod" in missing.err
    assert api.run("config", "delete-context", "prod", env=env).code == 0
    assert api.run("config", "current-context", env=env).code == 1
