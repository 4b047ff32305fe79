"""Room held for pods in a round (lockgate.scheduler.room): the sums and the index that make a
held pod's search cost O(log nodes) choose exactly the node a plain scan of every hold would."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from builders import a_job, a_node, a_state

from lockgate.scheduler.records import Shape
from lockgate.scheduler.room import BEST_FIT_WINDOW, ClusterRoom, fits, give
from lockgate.scheduler.room_index import RoomIndex
from lockgate.scheduler.state import SchedulerState

Yields = Callable[[str, Shape], bool]


def test_the_index_finds_the_first_node_whose_room_fits_as_a_scan_does() -> None:
    rng = random.Random(7)
    for nodes in (1, 2, 5, 16, 37):
        index = RoomIndex(nodes, 2)
        rooms: list[list[int] | None] = [None] * nodes
        for _ in range(300):
            node = rng.randrange(nodes)
            rooms[node] = None if rng.random() < 0.3 else [rng.randint(-4, 8),
                                                             rng.randint(-4, 8)]
            index.set(node, rooms[node])
            pairs = tuple((axis, rng.randint(0, 6)) for axis in rng.sample([0, 1], 2))
            start = rng.randrange(nodes + 1)
            expected = next((i for i in range(start, nodes) if (room := rooms[i]) is not None
                             and all(room[axis] >= amount for axis, amount in pairs)), -1)
            assert index.first(tuple(sorted(pairs)), start) == expected


def test_an_index_built_from_rows_is_the_one_built_node_by_node() -> None:
    rng = random.Random(11)
    for nodes in (1, 2, 3, 5, 16, 37, 400):
        rows = [[rng.randint(-4, 12), rng.randint(0, 48)] for _ in range(nodes)]
        one_by_one = RoomIndex(nodes, 2)
        for node, row in enumerate(rows):
            one_by_one.set(node, row)
        assert RoomIndex(nodes, 2, rows=rows).tops == one_by_one.tops


def _full_cluster(rng: random.Random, nodes: int) -> SchedulerState:
    """Nodes of 8 cpu full of running 1-cpu pods (no room beyond the holds anywhere, ever: a
    pod placed frees only its own hold), and queued pods of 1, 2 and 4 cpu of four queues to
    hold room for."""
    running = []
    for i in range(1, nodes + 1):
        running += a_job("filler").requesting(cpu="1", memory="1Gi").running_on(
            f"n-{i}").times(8)
    queued = [a_job(f"q{i % 4}").requesting(cpu=str(rng.choice((1, 2, 4))), memory="1Gi")
              .build() for i in range(60)]
    return (a_state().with_queues("filler", "q0", "q1", "q2", "q3")
            .with_cluster("cluster-a", a_node(cpu="8", memory="64Gi").times(nodes, prefix="n"))
            .with_jobs(running, queued).build())


def _yielded_by_scan(room: ClusterRoom, node: int, queue: str, yields: Yields) -> list[int]:
    """The room on `node` beyond every hold, plus each hold there of another queue that
    `yields`, hold by hold."""
    free = room.free[node][:]
    for _, other_queue, other_shape in room.holds_on.get(node, ()):
        if other_queue != queue and yields(other_queue, other_shape):
            give(free, other_shape)
    return free


def _scan(room: ClusterRoom, job_id: str, queue: str, shape: Shape, yields: Yields) -> int:
    """`place_held` as a scan of every hold on every node: its own node's room if it fits
    there, else the first node with holds where what is free plus what the queues that yield
    hold fits it (the cluster is full: no node has room beyond the holds)."""
    node = room.hold_node[job_id]
    if fits(room.room_for_held(job_id, queue, yields), shape):
        return node
    eligible = set(room.nodes_for(shape.placement))
    for other in sorted(room.holds_on):
        if (other in eligible and room.holds_on[other]
                and fits(_yielded_by_scan(room, other, queue, yields), shape)):
            return other
    return -1


@pytest.mark.parametrize("seed", range(20))
def test_a_held_pod_takes_the_node_a_scan_of_every_hold_would(seed: int) -> None:
    rng = random.Random(seed)
    nodes = rng.randint(1, 12)
    state = _full_cluster(rng, nodes)
    cluster = state.cluster_records["cluster-a"]
    room = ClusterRoom(cluster, state.fairness_inverse())
    axes = len(state.fairness_inverse())
    queued = [(job_id, job.queue, job.shape) for job_id, job in state.job_records.items()
              if job.queue != "filler"]
    waiting = list(queued)
    rng.shuffle(waiting)
    held: list[tuple[str, str, Shape]] = []
    for job_id, queue, shape in waiting[:30]:  # holds on random nodes the pod fits when empty
        node = rng.randrange(nodes)
        if fits(room.capacity[node], shape):
            room.hold(job_id, queue, shape, axes, node=node)
            held.append((job_id, queue, shape))
    ranks = {f"q{i}": rng.random() for i in range(4)}
    for job_id, queue, shape in held:
        def yields(other: str, _: Shape, queue: str = queue) -> bool:
            return (ranks[other], other) > (ranks[queue], queue)
        expected = _scan(room, job_id, queue, shape, yields)
        assert room.place_held(job_id, queue, shape, yields) == expected
        ranks[queue] += rng.random() / 4 if expected >= 0 else 0.0
    # New holds go where a scan of every candidate says the pod misses the least room.
    for job_id, queue, shape in waiting[30:]:
        def yields_new(other: str, _: Shape, queue: str = queue) -> bool:
            return (ranks[other], other) > (ranks[queue], queue)
        expected = _closest_by_scan(room, queue, shape, state.fairness_inverse(), yields_new,
                                    set())
        assert room.hold(job_id, queue, shape, axes, inverse_total=state.fairness_inverse(),
                         yields=yields_new) == expected


def _partly_full_cluster(rng: random.Random, nodes: int) -> SchedulerState:
    """Nodes of 8 cpu with 0 to 8 running 1-cpu pods each, and queued pods of 1, 2 and 4 cpu
    of four queues."""
    running = []
    for i in range(1, nodes + 1):
        running += a_job("filler").requesting(cpu="1", memory="1Gi").running_on(
            f"n-{i}").times(rng.randint(0, 8))
    queued = [a_job(f"q{i % 4}").requesting(cpu=str(rng.choice((1, 2, 4))), memory="1Gi")
              .build() for i in range(80)]
    return (a_state().with_queues("filler", "q0", "q1", "q2", "q3")
            .with_cluster("cluster-a", a_node(cpu="8", memory="64Gi").times(nodes, prefix="n"))
            .with_jobs(running, queued).build())


def _expected_place_held(room: ClusterRoom, job_id: str, queue: str, shape: Shape,
                         yields: Yields) -> int:
    """`place_held` worked out by scans: its own node if its held room fits; else `place`
    beyond the holds (`_best_fit_by_scan`); else the first node with holds where what is free
    plus what yielding queues hold fits."""
    if fits(room.room_for_held(job_id, queue, yields), shape):
        return room.hold_node[job_id]
    order = room.nodes_for(shape.placement)
    placed = _best_fit_by_scan(room, shape)
    if placed >= 0:
        return placed
    for node in order:
        if room.holds_on.get(node) and fits(_yielded_by_scan(room, node, queue, yields), shape):
            return node
    return -1


def _best_fit_by_scan(room: ClusterRoom, shape: Shape) -> int:
    """`place` by a scan: of the nodes that fit `shape` from where it last left off, up to the
    first `BEST_FIT_WINDOW` (or the first that it fills exactly), the one it leaves the least
    room on (as fractions of the pool), the first of equals; -1 if none fits."""
    order = room.nodes_for(shape.placement)
    window: list[tuple[float, int]] = []
    for position, node in enumerate(order[room.cursor.get(shape, 0):]):
        if fits(room.free[node], shape):
            leftover = sum((room.free[node][axis] - amount) * room.inverse_total[axis]
                           for axis, amount in shape.pairs)
            window.append((leftover, position))
            if leftover == 0 or len(window) == BEST_FIT_WINDOW:
                break
    if not window:
        return -1
    return order[room.cursor.get(shape, 0) + min(window)[1]]


def _interleave(seed: int) -> dict[str, int]:
    """Random holds, held pods placed and plain first fit, each checked against scans;
    returns how often a held pod went to its own node, by first fit, or to another node's
    yielded room."""
    rng = random.Random(seed)
    nodes = rng.randint(1, 33)
    state = _partly_full_cluster(rng, nodes)
    room = ClusterRoom(state.cluster_records["cluster-a"], state.fairness_inverse())
    inverse = state.fairness_inverse()
    axes = len(inverse)
    waiting = [(job_id, job.queue, job.shape) for job_id, job in state.job_records.items()
               if job.queue != "filler"]
    rng.shuffle(waiting)
    ranks = {f"q{i}": rng.random() for i in range(4)}
    held: list[tuple[str, str, Shape]] = []
    outcomes = {"own node": 0, "first fit": 0, "yielded": 0, "none": 0}
    for job_id, queue, shape in waiting:
        def yields(other: str, _: Shape, queue: str = queue) -> bool:
            return (ranks[other], other) > (ranks[queue], queue)
        roll = rng.random()
        if held and roll < 0.45:
            held_id, held_queue, held_shape = held.pop(rng.randrange(len(held)))

            def held_yields(other: str, _: Shape, queue: str = held_queue) -> bool:
                return (ranks[other], other) > (ranks[queue], queue)
            own = fits(room.room_for_held(held_id, held_queue, held_yields), held_shape)
            first_fit = room.cursor.get(held_shape, 0) < len(room.nodes_for(None)) and any(
                fits(room.free[i], held_shape)
                for i in room.nodes_for(None)[room.cursor.get(held_shape, 0):])
            expected = _expected_place_held(room, held_id, held_queue, held_shape, held_yields)
            assert room.place_held(held_id, held_queue, held_shape, held_yields) == expected
            if expected < 0:
                held.append((held_id, held_queue, held_shape))
                outcomes["none"] += 1
            else:
                outcomes["own node" if own else "first fit" if first_fit else "yielded"] += 1
                ranks[held_queue] += rng.random() / 4
        elif roll < 0.6:
            expected = _best_fit_by_scan(room, shape)
            assert room.place(shape) == expected
        else:
            avoid = {name for name in room.names if rng.random() < 0.3}
            expected = _closest_by_scan(room, queue, shape, inverse, yields, avoid)
            node = room.hold(job_id, queue, shape, axes, inverse_total=inverse, yields=yields,
                             avoid=avoid)
            assert node == expected
            if node >= 0:
                held.append((job_id, queue, shape))
    return outcomes


def _closest_by_scan(room: ClusterRoom, queue: str, shape: Shape, inverse: list[float],
                     yields: Yields, avoid: set[str]) -> int:
    """Where a new hold goes, by a scan: of the nodes the shape fits when empty (those not in
    `avoid`, unless every one is), the one missing the least room, counting what queues that
    yield hold there; the first of equals."""
    candidates = [i for i in room.nodes_for(shape.placement) if fits(room.capacity[i], shape)]
    candidates = [i for i in candidates if room.names[i] not in avoid] or candidates
    if not candidates:
        return -1

    def missing(i: int) -> tuple[float, int]:
        free = _yielded_by_scan(room, i, queue, yields)
        return (max((amount - free[axis]) * inverse[axis] for axis, amount in shape.pairs), i)

    return min(candidates, key=missing)


@pytest.mark.parametrize("seed", range(40))
def test_held_pods_and_new_holds_interleaved_go_where_scans_say(seed: int) -> None:
    """Room held by queues that yield is looked for among a list of nodes kept per shape for
    the round (`yield_candidates`): it must choose what scans of every node would, while holds
    are made on nodes that had none, held pods are placed and plain placement runs between."""
    _interleave(seed)


def test_the_interleaved_runs_take_every_way_a_held_pod_can_go() -> None:
    totals: dict[str, int] = {}
    for seed in range(40):
        for outcome, count in _interleave(seed).items():
            totals[outcome] = totals.get(outcome, 0) + count
    assert all(totals.values()), totals
