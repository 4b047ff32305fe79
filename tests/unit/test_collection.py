"""The collector's thresholds for a process holding a large scheduler state."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
from test_fleet_sim import small

import devstack.fleet_sim as fleet_sim
from lockgate.scheduler.collection import (
    LARGE_STATE_THRESHOLDS,
    RoundCollector,
    collect_for_large_state,
)


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


def test_after_a_round_what_survived_is_frozen_and_a_full_collection_comes_each_interval(
        ) -> None:
    class Node:
        other: object = None

    clock = [0.0]
    collector = RoundCollector(full_every_seconds=60, clock=lambda: clock[0])
    before = gc.get_freeze_count()
    try:
        kept = [[index] for index in range(1_000)]  # survives the round
        collector.after_round()
        assert gc.get_freeze_count() >= before + len(kept)
        cycle = Node()
        cycle.other = cycle  # freed only by a collection that scans it
        gone = weakref.ref(cycle)
        collector.after_round()  # frozen with it
        del cycle
        collector.after_round()
        gc.collect()  # a full collection does not look at frozen objects
        assert gone() is not None and collector.full_collections == 0
        clock[0] = 61.0
        collector.after_round()  # the interval is over: unfreeze, collect everything, freeze
        assert gone() is None
        assert collector.full_collections == 1 and collector.last_full == 61.0
        clock[0] = 100.0
        collector.after_round()
        assert collector.full_collections == 1
    finally:
        gc.unfreeze()
