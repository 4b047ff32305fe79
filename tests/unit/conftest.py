"""Every unit test checks the scheduler state's invariants after every change, every round and
every commit of a round's transaction.

`lockgate.scheduler.invariants.check_invariants` recounts every aggregate `SchedulerState`
keeps from its records (Armada's jobdb `Assert`). This autouse fixture wraps the state's public
operations, and the round and the eviction planner wherever a test module bound them, so a
bookkeeping slip fails the test that caused it, at the operation that caused it. A test that
must not pay for it (a large state built on purpose) is marked `no_state_invariants`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lockgate.scheduler import SchedulerState, plan_evictions, schedule_round
from lockgate.scheduler import preemption as preemption_module
from lockgate.scheduler import round as round_module
from lockgate.scheduler.invariants import check_invariants
from lockgate.scheduler.state import RoundTransaction

# The operations that change a state; each is checked when it returns (the outermost only:
# upsert_jobs and set_cluster call the others).
_MUTATORS = ("upsert_queue", "remove_queue", "set_cluster", "set_node", "upsert_job",
             "upsert_jobs", "remove_job", "hold_controller", "release_controller",
             "set_growth", "set_growth_policy")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "no_state_invariants: do not check the scheduler state after every change")


@pytest.fixture(autouse=True)
def _state_invariants(request: pytest.FixtureRequest,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("no_state_invariants") is not None:
        yield
        return
    depth = [0]

    def checked(operation: Callable[..., Any], state_of: Callable[..., SchedulerState]
                ) -> Callable[..., Any]:
        @functools.wraps(operation)
        def run(*args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            try:
                result = operation(*args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                check_invariants(state_of(*args, **kwargs))
            return result
        return run

    for name in _MUTATORS:
        monkeypatch.setattr(SchedulerState, name,
                            checked(getattr(SchedulerState, name), lambda state, *_, **__: state))
    # A round's transaction, when its caller commits it (what is kept, what is taken back).
    for name in ("commit", "rollback"):
        monkeypatch.setattr(RoundTransaction, name, checked(
            getattr(RoundTransaction, name), lambda transaction, *_, **__: transaction.state))
    wrapped = {
        schedule_round: checked(schedule_round, lambda state, *_, **__: state),
        plan_evictions: checked(plan_evictions, lambda state, *_, **__: state),
    }
    # Test modules bound the functions at import: patch every binding of them.
    for module in [round_module, preemption_module, *_test_modules()]:
        for attribute, value in list(vars(module).items()):
            replacement = wrapped.get(value) if callable(value) else None
            if replacement is not None:
                monkeypatch.setattr(module, attribute, replacement)
    yield


def _test_modules() -> list[Any]:
    return [module for name, module in list(sys.modules.items())
            if module is not None and (name.startswith(("test_", "builders", "helpers", "lockgate",
                                                        "fair_scheduler", "queue_store")))]
