"""The demo's fairness judgement: reached, settled and moved, from what the apiservers showed."""

from __future__ import annotations

from devstack.demo_fairness import Look, SettleJudge

TARGETS = {"a": 10.0, "b": 20.0}


def pods(queue: str, count: int, first: int = 0) -> frozenset[str]:
    return frozenset(f"cluster-a/{queue}/p{i}" for i in range(first, first + count))


def look(at: float, a: int, b: int, *, b_first: int = 0) -> Look:
    return Look(at, {"a": pods("a", a), "b": pods("b", b, b_first)})


def judge(window: float = 10.0) -> SettleJudge:
    return SettleJudge(targets=TARGETS, tolerance=1.0, window=window)


def test_settles_once_within_tolerance_for_the_whole_window() -> None:
    j = judge()
    for at, a, b in ((0, 0, 5), (5, 4, 14), (10, 9, 21), (15, 9, 21), (20, 9, 21)):
        j.see(look(at, a, b))
    assert (j.reached_at, j.settled_at, j.moves, j.verdict()) == (10, 20, [], [])


def test_never_reaching_the_targets_fails_and_says_so() -> None:
    j = judge()
    for at in range(0, 100, 5):
        j.see(look(at, 13, 17))  # a ahead by 3, b behind by 3: a weight ignored
    assert j.reached_at is None and j.settled_at is None
    assert j.off(look(0, 13, 17)) == {"a": 3.0, "b": -3.0}
    assert "never came within 1 pod(s)" in j.verdict()[0]


def test_an_eviction_after_reaching_restarts_the_window_and_is_reported() -> None:
    j = judge()
    j.see(look(0, 10, 20))
    j.see(look(5, 10, 20, b_first=1))  # same counts, but one pod of b replaced: a move
    j.see(look(12, 10, 20, b_first=1))
    assert j.settled_at is None and j.moves == ["t=5s bound pods changed: b"]
    j.see(look(15, 10, 20, b_first=1))
    assert j.settled_at == 15 and j.verdict() == []


def test_leaving_the_targets_after_reaching_them_is_a_thrash_and_fails_the_window() -> None:
    j = judge()
    for at, a, b in ((0, 10, 20), (5, 14, 16), (10, 10, 20), (15, 14, 16)):
        j.see(look(at, a, b))
    assert j.settled_at is None and j.reached_at == 0
    assert j.moves == ["t=5s left the targets: a +4.0 pods, b -4.0 pods",
                       "t=15s left the targets: a +4.0 pods, b -4.0 pods"]
    assert "did not hold it for 10s" in j.verdict()[0]


def test_within_one_pod_of_a_fluid_target_is_reached() -> None:
    j = SettleJudge(targets={"a": 14.67, "b": 20.0}, tolerance=1.0, window=0)
    j.see(look(0, 14, 20))
    j.see(look(1, 14, 20))
    assert j.settled_at == 1
    assert j.off(look(2, 16, 20)) == {"a": 16 - 14.67}


def test_looks_after_settling_change_nothing() -> None:
    j = judge(window=0)
    j.see(look(0, 10, 20))
    j.see(look(1, 10, 20))
    j.see(look(2, 0, 0))
    assert j.settled_at == 1 and j.moves == []
