"""The collector's thresholds for a process holding a large scheduler state."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from test_fleet_sim import small

import devstack.fleet_sim as fleet_sim
from lockgate.scheduler.collection import LARGE_STATE_THRESHOLDS, collect_for_large_state


def test_the_first_threshold_is_raised_and_the_old_ones_are_given_back() -> None:
    before = gc.get_threshold()
    try:
        assert collect_for_large_state() == before
        assert gc.get_threshold() == LARGE_STATE_THRESHOLDS
        collect_for_large_state(5_000)
        assert gc.get_threshold() == (5_000, *LARGE_STATE_THRESHOLDS[1:])
    finally:
        gc.set_threshold(*before)


def test_the_simulator_runs_with_the_leaders_thresholds_and_restores_the_callers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, ...]] = []
    real_round = fleet_sim.schedule_round

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_threshold())
        return real_round(*args, **kwargs)

    monkeypatch.setattr(fleet_sim, "schedule_round", watched)
    before = gc.get_threshold()
    fleet_sim.simulate(fleet_sim.Scenario.from_mapping(small()), seed=1)
    assert gc.get_threshold() == before
    assert seen and set(seen) == {LARGE_STATE_THRESHOLDS}
