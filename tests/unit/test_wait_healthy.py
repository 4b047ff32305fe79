"""devstack's wait_healthy: a component is judged exited only when two looks apart say so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devstack import procs as procs_module
from devstack.errors import StackError
from devstack.procs import Component, ProcState, wait_healthy


class _Procs:
    """What the pid file says, look after look."""

    def __init__(self, states: list[ProcState], log: Path) -> None:
        self.states = states
        self.log = log
        self.looks = 0

    def inspect(self, comp: Component) -> ProcState:
        self.looks += 1
        return self.states[min(self.looks - 1, len(self.states) - 1)]

    def log_path(self, comp: Component) -> Path:
        return self.log


def _component(tmp_path: Path, healthy_after: int) -> Component:
    calls = {"n": 0}

    def health() -> str | None:
        calls["n"] += 1
        return None if calls["n"] >= healthy_after else "not yet"

    return Component(name="cluster-b/kube-apiserver", argv=["kube-apiserver"], cwd=tmp_path,
                     ports=[], endpoint="", health=health)


def _wait(procs: _Procs, comp: Component) -> None:
    fake: Any = procs
    wait_healthy([comp], fake, timeout=5, interval=0.01)


def test_a_process_misjudged_once_right_after_its_start_is_waited_for(tmp_path: Path) -> None:
    stale = ProcState("stale", 42, "pid 42 is now another process: python -c")
    procs = _Procs([stale, ProcState("running", 42)], tmp_path / "log")
    _wait(procs, _component(tmp_path, healthy_after=3))
    assert procs.looks >= 3


def test_a_process_that_stays_gone_fails_and_says_what_the_pid_file_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs_module, "_EXITED_SECONDS", 0.05)
    (tmp_path / "log").write_text("bind: address already in use\n")
    procs = _Procs([ProcState("stale", 42, "pid 42 is not running")], tmp_path / "log")
    with pytest.raises(StackError, match=r"(?s)exited during startup \(stale: pid 42 is not "
                                         r"running\).*address already in use"):
        _wait(procs, _component(tmp_path, healthy_after=1000))
