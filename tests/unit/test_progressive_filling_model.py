"""The end-to-end fairness test's own model (tests/helpers/progressive_filling), on cases worked
out by hand, so that a disagreement with the scheduler can be blamed on the scheduler."""

from __future__ import annotations

import pytest

from helpers.progressive_filling import Node, Pod, progressive_filling

GI = 2**30


def node(name: str, cluster: str = "a", *, cpu: int, memory: int = 64 * GI,
         used_cpu: int = 0) -> Node:
    return Node(name, cluster, {"cpu": cpu * 1000, "memory": memory},
                {"cpu": used_cpu * 1000} if used_cpu else {})


def pods(queue: str, count: int, *, cpu: int = 1, memory: int = GI, cluster: str = "a",
         shape: str = "small", first: int = 0) -> list[Pod]:
    return [Pod(f"{queue}-{shape}-{cluster}-{i}", queue, cluster,
                {"cpu": cpu * 1000, "memory": memory}, shape)
            for i in range(first, first + count)]


def counts(filling_released: object) -> dict[str, dict[str, int]]:
    assert isinstance(filling_released, dict)
    return {queue: dict(shapes) for queue, shapes in filling_released.items()}


def test_equal_weights_split_one_node_evenly() -> None:
    filling = progressive_filling(weights={"x": 1, "y": 1}, nodes=[node("n", cpu=4)],
                                  pods=pods("x", 10) + pods("y", 10))
    assert counts(filling.released) == {"x": {"small": 2}, "y": {"small": 2}}
    # Equal costs go to the queue whose name sorts first: x, y, x, y.
    assert [name.split("-")[0] for name in filling.placed] == ["x", "y", "x", "y"]


def test_weights_one_to_three() -> None:
    filling = progressive_filling(weights={"x": 1, "y": 3}, nodes=[node("n", cpu=8)],
                                  pods=pods("x", 10) + pods("y", 10))
    assert counts(filling.released) == {"x": {"small": 2}, "y": {"small": 6}}
    assert filling.shares["y"] == pytest.approx(3 * filling.shares["x"])


def test_dominant_resource_fairness_textbook_case() -> None:
    """Ghodsi et al.'s example: 9 cpu, 18 GiB; x's tasks <1 cpu, 4 GiB> are memory-heavy, y's
    <3 cpu, 1 GiB> cpu-heavy. DRF gives x three tasks and y two (both dominant shares 2/3):
    x (2/9), y (1/3), x (4/9), x and y tie at 2/3 after one more each: x by name, then y."""
    filling = progressive_filling(
        weights={"x": 1, "y": 1}, nodes=[node("n", cpu=9, memory=18 * GI)],
        pods=pods("x", 5, cpu=1, memory=4 * GI) + pods("y", 5, cpu=3, memory=GI))
    assert counts(filling.released) == {"x": {"small": 3}, "y": {"small": 2}}
    assert filling.shares == {"x": pytest.approx(2 / 3), "y": pytest.approx(2 / 3)}


def test_pods_stay_in_their_own_cluster() -> None:
    """x only has pods in cluster a, which holds 2; y takes what is left in a and all of b,
    although x's share stays lowest: capacity in b cannot serve x."""
    nodes = [node("a-0", "a", cpu=4), node("b-0", "b", cpu=4)]
    filling = progressive_filling(weights={"x": 1, "y": 1}, nodes=nodes,
                                  pods=pods("x", 10, cluster="a") + pods("y", 3, cluster="a")
                                  + pods("y", 10, cluster="b"))
    assert counts(filling.released) == {"x": {"small": 2}, "y": {"small": 6}}
    assert sum(1 for n in filling.placed.values() if n == "b-0") == 4


def test_a_pod_must_fit_on_one_node() -> None:
    """Two nodes of 3 cpu hold 6 cpu in all, but only two 2-cpu pods: one per node."""
    filling = progressive_filling(weights={"x": 1}, nodes=[node("a-0", cpu=3),
                                                          node("a-1", cpu=3)],
                                  pods=pods("x", 5, cpu=2))
    assert counts(filling.released) == {"x": {"small": 2}}
    assert sorted(filling.placed.values()) == ["a-0", "a-1"]


def test_first_fit_in_node_name_order_and_unmanaged_usage_takes_room_not_share() -> None:
    """b-node is listed first but sorts second; a-node has 2 of its 4 cpu taken by a pod lockgate
    does not manage. That room is gone, but the pool total (shares) still counts it."""
    nodes = [node("n2", cpu=4), node("n1", cpu=4, used_cpu=2)]
    filling = progressive_filling(weights={"x": 1}, nodes=nodes, pods=pods("x", 10))
    assert list(filling.placed.values()) == ["n1", "n1", "n2", "n2", "n2", "n2"]
    assert filling.shares["x"] == pytest.approx(6 / 8)
    assert filling.free["n1"]["cpu"] == 0


def test_a_pod_that_fits_nowhere_is_passed_over_with_its_kind_and_the_queue_goes_on() -> None:
    """x's order: small, big, big, small. The first big no longer fits once the small took a cpu;
    the second big (same kind) is passed over without being tried, and the small goes."""
    x = [*pods("x", 1), *pods("x", 2, cpu=4, shape="big"), *pods("x", 1, first=1)]
    filling = progressive_filling(weights={"x": 1}, nodes=[node("n", cpu=4)], pods=x)
    assert counts(filling.released) == {"x": {"small": 2}}
    assert filling.passed_over == ("x-big-a-0",)


def test_a_queue_is_ranked_by_its_next_pod_even_if_it_no_longer_fits() -> None:
    """One node of 4 cpu; x has weight 1, y weight 4; shares are cpu / 4, y's cost share / 4.
    1. x small: 1/4; y small: 1/16 -> y (y=1).   2. y 2/16 -> y (y=2).   3. y 3/16 -> y (y=3).
    4. y 4/16 = x 1/4: a tie, x by name -> x small (x=1); 4 cpu used: full.
    Then x's big is tried and fits nowhere, y's small too: done."""
    x = [*pods("x", 1), *pods("x", 1, cpu=4, shape="big")]
    filling = progressive_filling(weights={"x": 1, "y": 4}, nodes=[node("n", cpu=4)],
                                  pods=x + pods("y", 10))
    assert counts(filling.released) == {"x": {"small": 1}, "y": {"small": 3}}

    # Ranked by its big pod (cost 2/4 after one small), x waits while y, with a small pod it
    # could still place, goes first; when x's big is tried it fits nowhere and x's small is next.
    x = [*pods("x", 1), *pods("x", 1, cpu=4, shape="big"), *pods("x", 1, first=1)]
    filling = progressive_filling(weights={"x": 1, "y": 1}, nodes=[node("n", cpu=6)],
                                  pods=x + pods("y", 10))
    # 1. x 1/6 vs y 1/6: x. 2. x (big) 5/6 vs y 1/6: y. 3. y 2/6: y. 4. y 3/6: y (4 used).
    # 5. y 4/6 vs x 5/6: y (5 used). 6. x 5/6 vs y 5/6: x by name: big tried, no room: passed
    # over. 7. x small 2/6 vs y 5/6: x (6 used). 8. y's next is tried: no room; nothing left.
    assert counts(filling.released) == {"x": {"small": 2}, "y": {"small": 4}}
    assert filling.passed_over == ("x-big-a-0", "y-small-a-4")


def test_a_queue_with_no_pods_left_drops_out() -> None:
    filling = progressive_filling(weights={"x": 1, "y": 1}, nodes=[node("n", cpu=8)],
                                  pods=pods("x", 2) + pods("y", 10))
    assert counts(filling.released) == {"x": {"small": 2}, "y": {"small": 6}}


def test_bad_input_is_an_error() -> None:
    with pytest.raises(ValueError, match="without a weight"):
        progressive_filling(weights={"x": 1}, nodes=[node("n", cpu=1)], pods=pods("y", 1))
    with pytest.raises(ValueError, match="positive"):
        progressive_filling(weights={"x": 0}, nodes=[node("n", cpu=1)], pods=pods("x", 1))
