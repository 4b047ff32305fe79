"""The one cost model (lockgate.scheduler.costs): its predicates at their edges, and its claim
that nothing else in the scheduler measures a queue against the pool or compares shares."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lockgate.scheduler import costs
from lockgate.scheduler.costs import below_target, cost_below, fraction, owed, within_target

SCHEDULER = Path(costs.__file__).parent
# The modules that may: the model itself; the state, which makes the inverse (1 / the pool);
# the fair-target solver beneath the model (its own numerical tolerances, in its own terms);
# and room, which measures how far a node is from fitting a pod, not a queue.
_EXEMPT = {"costs.py", "state.py", "targets.py", "room.py"}


def test_a_share_a_float_hair_from_its_target_is_at_it_on_either_side() -> None:
    target = 0.3
    hair = target * 1e-12
    assert not below_target(target - hair, target)
    assert within_target(target + hair, target)
    assert below_target(target * (1 - 1e-6), target)
    assert not within_target(target * (1 + 1e-6), target)


def test_nothing_is_below_no_target_and_nothing_held_is_within_one() -> None:
    assert not below_target(0.0, 0.0)
    assert within_target(0.0, 0.0)
    assert not within_target(1e-6, 0.0)


def test_a_queue_is_owed_room_only_below_its_target_there_and_short_of_its_whole_target() -> None:
    assert owed(before=0.1, target=0.2, overall_before=fraction(0.3, 0.5))
    assert not owed(before=0.2, target=0.2, overall_before=fraction(0.3, 0.5))  # met there
    assert not owed(before=0.1, target=0.2, overall_before=fraction(0.5, 0.5))  # met in all
    assert not owed(before=0.0, target=0.2, overall_before=fraction(0.0, 0.0))  # no target


@pytest.mark.parametrize(("value", "other", "below"), [
    (0.5, 1.0, True),
    (1.0 - 1e-13, 1.0, False),  # rounding, not a difference
    (1.0, float("inf"), True),
    (float("inf"), float("inf"), False),
    (0.0, 0.0, False),
])
def test_costs_compare_with_the_same_tolerance_as_shares(
        value: float, other: float, below: bool) -> None:
    assert cost_below(value, other) is below


def test_a_fraction_of_no_target_is_infinite() -> None:
    assert fraction(0.25, 0.5) == 0.5
    assert fraction(0.0, 0.0) == float("inf")


def _trespasses(path: Path) -> list[str]:
    """Where a module compares shares with its own tolerance, or weighs by the pool itself."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Constant) and isinstance(node.value, float)
                and 0 < abs(node.value) < 1e-3):
            found.append(f"{path.name}:{node.lineno}: tolerance {node.value}")
        weighed = []
        if isinstance(node, ast.Subscript):
            weighed = [node.value]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "zip":
            weighed = node.args
        for arg in weighed:
            name = (arg.id if isinstance(arg, ast.Name)
                    else arg.attr if isinstance(arg, ast.Attribute) else "")
            if "inverse" in name:
                found.append(f"{path.name}:{node.lineno}: weighs by {name} itself")
    return found


def test_only_the_cost_model_weighs_queues_by_the_pool_and_holds_tolerances() -> None:
    modules = sorted(path for path in SCHEDULER.glob("*.py") if path.name not in _EXEMPT)
    assert {"round.py", "preemption.py", "explain.py", "waiting.py"} <= {p.name for p in modules}
    assert [found for path in modules for found in _trespasses(path)] == []


def test_the_claim_check_sees_a_trespass() -> None:
    # The check itself, on the kind of code it must refuse (what round.py held before).
    assert _trespasses(SCHEDULER / "costs.py")  # the model does both, by design
