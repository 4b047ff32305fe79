"""`make run` prints one env file, and it has everything (issue 38, item 7: it printed two, the
stack's and its own, with different variables)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from devstack.config import Settings
from devstack.dev import write_instructions
from devstack.stack import Stack


def test_the_runs_env_file_has_the_stacks_variables_with_the_runs_database(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_STACK_DIR", str(tmp_path))
    settings = dataclasses.replace(Settings.from_env(), stack_dir=tmp_path)
    (tmp_path / "dev").mkdir()
    lockgate = cast(Any, SimpleNamespace(admin_url="http://127.0.0.1:58080"))
    kubeconfigs = {"cluster-a": "/k/a", "cluster-b": "/k/b"}
    stack_env = {"LOCKGATE_KUBECONFIG_CLUSTER_A": "/k/a", "LOCKGATE_KUBECONFIG_CLUSTER_B": "/k/b",
                 "LOCKGATE_KAFKA_BOOTSTRAP": "127.0.0.1:59092",
                 "LOCKGATE_POSTGRES_DSN": "postgresql://u@127.0.0.1:55432/lockgate_dev",
                 "LOCKGATE_STACK_DIR": str(tmp_path)}
    env, _ = write_instructions(lockgate, settings, stack_env, kubeconfigs,
                                tmp_path / "token", "http://127.0.0.1:58686")
    exported = dict(line[len("export "):].split("=", 1)
                    for line in env.read_text().splitlines() if line.startswith("export "))
    assert exported["LOCKGATE_POSTGRES_DSN"] == "postgresql://u@127.0.0.1:55432/lockgate_dev"
    assert exported["LOCKGATE_KAFKA_BOOTSTRAP"] == "127.0.0.1:59092"
    assert exported["LOCKGATE_STACK_DIR"] == str(tmp_path)
    assert exported["LOCKGATE_API"] == "http://127.0.0.1:58080"
    assert exported["KUBECONFIG"] == "/k/a"
    assert exported["LOCKGATE_KUBECONFIG_CLUSTER_B"] == "/k/b"
    names = [line.split("=", 1)[0] for line in env.read_text().splitlines()
             if line.startswith("export ")]
    assert len(names) == len(set(names)), names  # each variable once


def test_under_make_run_the_stacks_summary_names_no_env_file_of_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = dataclasses.replace(Settings.from_env(), stack_dir=tmp_path)
    Stack(settings, announce_env=False)._summary("up")
    assert "source" not in capsys.readouterr().out
    Stack(settings)._summary("up")  # `make stack-up` alone: its env file is the one to source
    assert f"source {tmp_path / 'env.sh'}" in capsys.readouterr().out
