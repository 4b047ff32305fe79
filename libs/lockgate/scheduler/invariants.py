"""Check that every aggregate the scheduler state keeps agrees with its job and node records.

Why it exists: `SchedulerState` keeps, change by change, per-queue allocations and demand, heaps
of pending jobs, per-node usage, the pool's total, a group index and the controllers' holds, so a
round never recounts anything. A slip in that bookkeeping does not crash: it silently releases
too much or starves a queue. `check_invariants` recounts everything from the records, in
O(jobs + nodes), and raises AssertionError naming each aggregate that disagrees (as Armada's
jobdb `Assert` does). The unit tests run it after every change and every round
(tests/unit/conftest.py); it is far too slow for the leader's hot path and is not called there.

Between changes and rounds, every invariant holds; inside a round (its popped heap entries not
pushed back yet) they need not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import cast

from lockgate.growth import is_virtual
from lockgate.jobs import JobState
from lockgate.scheduler.groups import GroupKey
from lockgate.scheduler.records import HeapEntry, JobRecord, Shape, add_pairs
from lockgate.scheduler.room_caches import ClusterRecord, NodeClass, fits_node_class
from lockgate.scheduler.room_index import NO_NODE, RoomIndex
from lockgate.scheduler.state import SchedulerState

# One cluster's part of the fair targets' structure: its name, its groups, its slots.
_StructurePart = tuple[str, object, tuple[tuple[str, str], ...]]

# At most this many problems are listed in one AssertionError.
_MAX_LISTED = 20


def check_invariants(state: SchedulerState) -> None:
    """Raise AssertionError listing what disagrees, if anything does."""
    problems = _Problems()
    axes = len(state.axis_names)
    problems.check(len(state.axes) == axes, "axis index and axis names differ in length")
    records = state.job_records
    _check_jobs(state, problems)
    _check_queues(state, problems, axes)
    _check_clusters(state, problems, axes)
    _check_shapes(state, problems)
    _check_groups(state, problems)
    _check_controllers(state, problems)
    _check_target_inputs(state, problems, axes)
    _check_growth(state, problems)
    if problems.found:
        listed = "\n  - ".join(problems.found[:_MAX_LISTED])
        more = len(problems.found) - _MAX_LISTED
        raise AssertionError(
            f"scheduler state inconsistent ({len(records)} jobs):\n  - {listed}"
            + (f"\n  ... and {more} more" if more > 0 else ""))


class _Problems:
    def __init__(self) -> None:
        self.found: list[str] = []

    def check(self, holds: bool, what: str) -> None:
        if not holds:
            self.found.append(what)


def _check_jobs(state: SchedulerState, problems: _Problems) -> None:
    for job_id, record in state.job_records.items():
        problems.check(not record.state.is_terminal,
                       f"job {job_id} is kept in terminal state {record.state}")
        problems.check(record.queue in state.queue_records,
                       f"job {job_id}'s queue {record.queue!r} has no record")
        problems.check(record.cluster in state.cluster_records,
                       f"job {job_id}'s cluster {record.cluster!r} has no record")
        queued = record.state is JobState.QUEUED
        problems.check(queued or not (record.parked or record.held),
                       f"job {job_id} holds capacity ({record.state}) yet is parked or held")
        problems.check(not (record.parked and record.held), f"job {job_id} is parked and held")
        if queued and record.node_name is not None:
            problems.check(False, f"queued job {job_id} names node {record.node_name!r}")


def _check_queues(state: SchedulerState, problems: _Problems, axes: int) -> None:
    jobs_of: dict[str, list[tuple[str, JobRecord]]] = {}
    for job_id, record in state.job_records.items():
        jobs_of.setdefault(record.queue, []).append((job_id, record))
    for name, queue in state.queue_records.items():
        mine = jobs_of.get(name, [])
        queued = [(i, r) for i, r in mine if r.state is JobState.QUEUED]
        holding = [(i, r) for i, r in mine if r.state is not JobState.QUEUED]
        live = [(i, r) for i, r in queued if not r.parked and not r.held]
        where = f"queue {name!r}"
        problems.check(queue.name == name, f"{where} is recorded as {queue.name!r}")
        problems.check(queue.queued == len(queued),
                       f"{where} counts {queue.queued} queued jobs, holds {len(queued)}")
        parked = sum(r.parked for _, r in queued)
        held = sum(r.held for _, r in queued)
        problems.check(queue.parked == parked, f"{where} counts {queue.parked} parked, {parked}")
        problems.check(queue.held == held, f"{where} counts {queue.held} held, {held}")
        problems.check(queue.allocated == len(holding),
                       f"{where} counts {queue.allocated} allocated jobs, holds {len(holding)}")
        problems.check(_sum(holding, axes) == queue.allocation,
                       f"{where}'s allocation {queue.allocation} is not the sum of its "
                       f"released and running jobs {_sum(holding, axes)}")
        problems.check(_sum(live, axes) == queue.demand,
                       f"{where}'s demand {queue.demand} is not the sum of its waiting jobs "
                       f"{_sum(live, axes)}")
        spec = queue.spec
        problems.check(queue.priority_factor == (1.0 if spec is None else spec.priority_factor),
                       f"{where}'s priority factor {queue.priority_factor} is not its spec's")
        problems.check(spec is not None or not queue.is_empty(),
                       f"{where} is undefined and empty, yet kept")
        for cluster in {r.cluster for _, r in queued if not r.held}:
            problems.check(cluster in queue.pending,
                           f"{where} has jobs waiting in {cluster!r} but no pending record")
        for cluster, pending in queue.pending.items():
            here = f"{where} in {cluster!r}"
            problems.check(pending.cluster == cluster, f"{here} is recorded as {pending.cluster}")
            mine_live = [(i, r) for i, r in live if r.cluster == cluster]
            mine_parked = [(i, r) for i, r in queued if r.parked and r.cluster == cluster]
            problems.check(pending.live == len(mine_live),
                           f"{here} counts {pending.live} live jobs, holds {len(mine_live)}")
            problems.check(pending.parked == len(mine_parked),
                           f"{here} counts {pending.parked} parked, holds {len(mine_parked)}")
            shapes = Counter(r.shape for _, r in mine_live)
            problems.check(dict(shapes) == pending.shapes,
                           f"{here} counts shapes {_shape_counts(pending.shapes)}, holds "
                           f"{_shape_counts(dict(shapes))}")
            problems.check(_is_heap(pending.entries), f"{here}'s heap is out of heap order")
            in_heap = {entry[2] for entry in pending.entries
                       if _matches(entry, state, name, cluster)}
            missing = [i for i, _ in mine_live if i not in in_heap]
            problems.check(not missing, f"{here}'s heap lacks waiting jobs {missing[:5]}")
            parked_in = {entry[2] for entry in pending.parked_entries
                         if _matches(entry, state, name, cluster)}
            lost = [i for i, _ in mine_parked if i not in parked_in]
            problems.check(not lost, f"{here}'s parked entries lack parked jobs {lost[:5]}")
            head = pending.head
            if head is not None:  # a round takes it as valid without looking (round.py)
                kept = state.job_records.get(head[2])
                problems.check(
                    kept is not None and kept.entry is head and not kept.parked and not kept.held
                    and _matches(head, state, name, cluster) and kept.kind is pending.head_kind,
                    f"{here} keeps {head[2]!r} as its validated head, which has changed")
        for vector, what in ((queue.allocation, "allocation"), (queue.demand, "demand")):
            problems.check(len(vector) == axes, f"{where}'s {what} has {len(vector)} axes")
        # What it holds per cluster (the fair targets' input and the round's rank).
        by_cluster: dict[str, list[tuple[str, JobRecord]]] = {}
        for item in holding:
            by_cluster.setdefault(item[1].cluster, []).append(item)
        problems.check(set(queue.alloc_in) == set(by_cluster) == set(queue.alloc_shapes),
                       f"{where} holds in clusters {sorted(by_cluster)}, records allocation in "
                       f"{sorted(queue.alloc_in)} and shapes in {sorted(queue.alloc_shapes)}")
        for cluster, items in by_cluster.items():
            problems.check(queue.alloc_in.get(cluster) == _sum(items, axes),
                           f"{where}'s allocation in {cluster!r} {queue.alloc_in.get(cluster)} "
                           f"is not the sum of its jobs there {_sum(items, axes)}")
            problems.check(queue.alloc_shapes.get(cluster) == dict(Counter(
                r.shape for _, r in items)), f"{where}'s shapes held in {cluster!r} miscounted")


def _check_target_inputs(state: SchedulerState, problems: _Problems, axes: int) -> None:
    """The fair targets' slots, kept change by change, against a recount from the queues'
    records; and the inputs built from them against `recount_target_inputs`."""
    held: dict[tuple[str, str, int], list[int]] = {}
    queued: dict[tuple[str, str, int], list[int]] = {}
    counts: Counter[tuple[str, str, int, bool]] = Counter()
    ids = state.placement_ids
    for name, queue in state.queue_records.items():
        for cluster, shape_counts in queue.alloc_shapes.items():
            for shape, count in shape_counts.items():
                key = (cluster, name, ids[shape.placement])
                _add_times(held.setdefault(key, [0] * axes), shape.pairs, count)
                counts[(*key, True)] += count
        for cluster, pending in queue.pending.items():
            for shape, count in pending.shapes.items():
                key = (cluster, name, ids[shape.placement])
                _add_times(queued.setdefault(key, [0] * axes), shape.pairs, count)
                counts[(*key, False)] += count
    kept: set[tuple[str, str, int]] = set()
    for cluster, bookkeeping in state.target_clusters.items():
        waiting = {name for name, queue in state.queue_records.items() if cluster in queue.pending}
        problems.check(bookkeeping.pending_queues == waiting,
                       f"fair targets: cluster {cluster!r} records pending entries of "
                       f"{sorted(bookkeeping.pending_queues)}, the queues have {sorted(waiting)}")
        for (name, placement_id), slot in bookkeeping.slots.items():
            key = (cluster, name, placement_id)
            kept.add(key)
            where = f"fair targets: slot {key}"
            problems.check(slot.queue == name and slot.placement_id == placement_id,
                           f"{where} is recorded as {(slot.queue, slot.placement_id)}")
            problems.check(slot.held_jobs + slot.pending_jobs > 0, f"{where} counts no job")
            problems.check(slot.held_jobs == counts[(*key, True)]
                           and slot.pending_jobs == counts[(*key, False)],
                           f"{where} counts {slot.held_jobs} held and {slot.pending_jobs} "
                           f"queued, the queue {counts[(*key, True)]} and "
                           f"{counts[(*key, False)]}")
            problems.check(slot.held == held.get(key, [0] * axes),
                           f"{where} holds {slot.held}, the queue's jobs {held.get(key)}")
            problems.check(slot.pending == queued.get(key, [0] * axes),
                           f"{where} has {slot.pending} queued, the queue's jobs "
                           f"{queued.get(key)}")
    flat = {(name, cluster, placement_id): slot
            for cluster, bookkeeping in state.target_clusters.items()
            for (name, placement_id), slot in bookkeeping.slots.items()}
    problems.check(
        flat.keys() == state.target_slots.keys()
        and all(state.target_slots[key] is slot and slot.home is state.target_clusters[key[1]]
                for key, slot in flat.items()),
        "fair targets: the slots by (queue, cluster, placement) are not those per cluster")
    missing = (set(held) | set(queued)) - kept
    problems.check(not missing, f"fair targets: no slot for {sorted(missing)[:5]}")
    groups, weights, demands, structure, amounts = state.target_inputs()
    (r_groups, r_weights, r_demands, r_structure, r_amounts) = state.recount_target_inputs()
    problems.check(groups == r_groups, "fair targets: node groups differ from the recount")
    problems.check(weights == r_weights,
                   f"fair targets: weights {weights} differ from the recount's {r_weights}")
    problems.check(demands == r_demands,
                   f"fair targets: demands differ from the recount: {demands} != {r_demands}")
    problems.check(_flat_structure(structure) == r_structure,
                   "fair targets: structure differs from the recount's")
    flat_amounts = tuple(v for part in cast("tuple[tuple[object, ...], ...]", amounts)
                         for v in part)
    problems.check(flat_amounts == r_amounts, "fair targets: amounts differ from the recount's")


def _add_times(vector: list[int], pairs: tuple[tuple[int, int], ...], count: int) -> None:
    for axis, amount in pairs:
        vector[axis] += amount * count


def _flat_structure(structure: object) -> object:
    """`SchedulerState.target_inputs`'s structure as `recount_target_inputs` lays it out:
    the weights, then per cluster its groups, then its (cluster, queue, placement) slots."""
    weights, parts = cast("tuple[object, tuple[_StructurePart, ...]]", structure)
    flat: list[object] = [weights]
    for cluster, groups, slots in parts:
        flat.append((cluster, groups))
        flat += [(cluster, queue, placement) for queue, placement in slots]
    return tuple(flat)


def _check_clusters(state: SchedulerState, problems: _Problems, axes: int) -> None:
    pool = [0] * axes
    bound: dict[tuple[str, str], list[tuple[str, JobRecord]]] = {}
    unbound: dict[str, dict[str, JobRecord]] = {}
    releasing: Counter[str] = Counter()
    for job_id, record in state.job_records.items():
        if record.state is JobState.QUEUED:
            continue
        if record.state is JobState.RELEASED:
            releasing[record.cluster] += 1
        if record.node_name is None:
            unbound.setdefault(record.cluster, {})[job_id] = record
        else:
            bound.setdefault((record.cluster, record.node_name), []).append((job_id, record))
    _check_bound_index(state, bound, problems)
    for name, cluster in state.cluster_records.items():
        where = f"cluster {name!r}"
        problems.check(cluster.name == name, f"{where} is recorded as {cluster.name!r}")
        schedulable = sorted(n for n, node in cluster.nodes.items() if node.info.schedulable)
        problems.check(cluster.order == schedulable,
                       f"{where}'s first-fit order {cluster.order} is not its schedulable "
                       f"nodes {schedulable}")
        total = [0] * axes
        sizes: Counter[NodeClass] = Counter()
        for node_name in schedulable:
            node = cluster.nodes[node_name]
            _add_into(total, node.allocatable)
            sizes[(tuple(node.allocatable), node.traits)] += 1
            if node.info.in_pool:
                _add_into(pool, node.allocatable)
        for node_name, node in cluster.nodes.items():
            problems.check(len(node.allocatable) == axes and len(node.unmanaged) == axes,
                           f"{where}'s node {node_name!r} has vectors of the wrong length")
            problems.check(node.traits.name == node_name,
                           f"{where}'s node {node_name!r} carries traits of {node.traits.name!r}")
        problems.check(cluster.total == total,
                       f"{where}'s total {cluster.total} is not its nodes' sum {total}")
        problems.check(dict(sizes) == cluster.node_sizes,
                       f"{where}'s node classes disagree with its schedulable nodes")
        _check_usage(cluster, bound, unbound.get(name, {}), problems, axes)
        problems.check(cluster.releasing == releasing[name],
                       f"{where} counts {cluster.releasing} jobs being released, "
                       f"{releasing[name]} are in state released")
        if cluster.cached_version == cluster.version:  # rounds copy its room index
            rooms = [cluster.nodes[node_name].free for node_name in cluster.order]
            problems.check(
                len(cluster.node_free) == len(rooms)
                and all(kept is room for kept, room in zip(cluster.node_free, rooms, strict=True))
                and cluster.free_index.tops
                == RoomIndex(len(rooms), axes, rows=[  # real nodes only (room_caches)
                    [NO_NODE] * axes if is_virtual(node_name) else room
                    for node_name, room in zip(cluster.order, rooms, strict=True)]).tops,
                f"{where}'s index of its nodes' free room is stale")
        for shape, fits_none in cluster.fits_no_node.items():
            problems.check(fits_none == (not any(fits_node_class(shape, size)
                                                 for size in cluster.node_sizes)),
                           f"{where}'s cached fit of {shape.requests} is stale")
    problems.check(state.pool_vector == pool,
                   f"pool total {state.pool_vector} is not the sum of nodes in the pool {pool}")
    for job_id, record in state.job_records.items():
        if record.parked:
            home = state.cluster_records.get(record.cluster)
            sizes_now = () if home is None else tuple(home.node_sizes)
            problems.check(not any(fits_node_class(record.shape, size) for size in sizes_now),
                           f"job {job_id} is parked though a node class of its cluster fits it")


def _check_bound_index(state: SchedulerState,
                       bound: dict[tuple[str, str], list[tuple[str, JobRecord]]],
                       problems: _Problems) -> None:
    """The state's index of jobs bound to nodes (`SchedulerState.bound_jobs`) holds exactly
    the jobs a recount finds bound there, as the records the state holds (not copies)."""
    recount: dict[str, dict[str, dict[str, int]]] = {}
    for (cluster_name, node), jobs in bound.items():
        recount.setdefault(cluster_name, {})[node] = {job_id: id(record)
                                                      for job_id, record in jobs}
    names = set(recount) | set(state.cluster_records)
    for cluster_name in sorted(names):
        indexed = {node: {job_id: id(record) for job_id, record in on_node.items()}
                   for node, on_node in state.bound_jobs(cluster_name).items()}
        expected = recount.get(cluster_name, {})
        problems.check(indexed == expected,
                       f"cluster {cluster_name!r}'s index of bound jobs has "
                       f"{sum(map(len, indexed.values()))} jobs on nodes {sorted(indexed)[:5]}, "
                       f"a recount finds {sum(map(len, expected.values()))} on "
                       f"{sorted(expected)[:5]}")


def _check_usage(cluster: ClusterRecord, bound: dict[tuple[str, str], list[tuple[str, JobRecord]]],
                 unbound: dict[str, JobRecord], problems: _Problems, axes: int) -> None:
    where = f"cluster {cluster.name!r}"
    nodes = {node for (name, node) in bound if name == cluster.name}
    problems.check(set(cluster.used_by_node) == nodes,
                   f"{where} keeps usage for nodes {sorted(cluster.used_by_node)}, its managed "
                   f"jobs are bound to {sorted(nodes)}")
    problems.check(set(cluster.jobs_on_node) == nodes,
                   f"{where} counts jobs on nodes {sorted(cluster.jobs_on_node)}, its managed "
                   f"jobs are bound to {sorted(nodes)}")
    for node in nodes:
        jobs = bound[(cluster.name, node)]
        used = _sum(jobs, axes)
        problems.check(cluster.used_by_node.get(node) == used,
                       f"{where}'s usage of node {node!r} {cluster.used_by_node.get(node)} is not "
                       f"the sum of the jobs bound to it {used}")
        problems.check(cluster.jobs_on_node.get(node) == len(jobs),
                       f"{where} counts {cluster.jobs_on_node.get(node)} jobs on node {node!r}, "
                       f"{len(jobs)} are bound there")
    for name, node_record in cluster.nodes.items():
        used = cluster.used_by_node.get(name, [0] * axes)
        room = [a - u for a, u in zip(node_record.allocatable, node_record.unmanaged,
                                      strict=True)]
        problems.check(node_record.room == room and node_record.free == [
            r - m for r, m in zip(room, used, strict=True)],
                       f"{where}'s node {name!r} keeps room {node_record.room} and free "
                       f"{node_record.free}, "
                       f"its allocatable less unmanaged is {room} and managed jobs use {used}")
    problems.check(set(cluster.held_unbound) == set(unbound),
                   f"{where} holds unbound jobs {sorted(cluster.held_unbound)[:5]}, its "
                   f"released jobs without a node are {sorted(unbound)[:5]}")
    for job_id, (shape, _hint) in cluster.held_unbound.items():
        record = unbound.get(job_id)
        problems.check(record is None or record.shape is shape,
                       f"{where} holds unbound job {job_id} with another shape")


def _check_growth(state: SchedulerState, problems: _Problems) -> None:
    """The virtual nodes are exactly each cluster's growth plan's, and every pod released for
    growth and kept as such is released, unbound, and charged to the virtual node it was
    released onto, once (lockgate.growth; docs/autoscaling.md, "Guarantees")."""
    for name, cluster in state.cluster_records.items():
        plan = state.growth_plan(name)
        planned = {} if plan is None else {node.name: dict(node.allocatable)
                                           for node in plan.nodes}
        virtual = {node_name: node.info.allocatable.as_dict()
                   for node_name, node in cluster.nodes.items() if is_virtual(node_name)}
        problems.check(virtual == planned,
                       f"cluster {name!r}'s virtual nodes {sorted(virtual)[:5]} are not its "
                       f"growth plan's {sorted(planned)[:5]}")
        for node_name in cluster.used_by_node:
            problems.check(not is_virtual(node_name),
                           f"cluster {name!r}: jobs are bound to virtual node {node_name!r}")
    for job_id, release in state.growth_releases.items():
        record = state.job_records.get(job_id)
        home = state.cluster_records.get(release.cluster)
        held = None if home is None else home.held_unbound.get(job_id)
        problems.check(
            record is not None and record.state is not JobState.QUEUED
            and record.node_name is None and record.cluster == release.cluster
            and held is not None and held[1] == release.node,
            f"job {job_id!r} is kept as released for growth onto {release.node!r} in "
            f"{release.cluster!r}, but it is not held unbound there on that node")


def _check_shapes(state: SchedulerState, problems: _Problems) -> None:
    refs: Counter[int] = Counter(id(record.shape) for record in state.job_records.values())
    for key, shape in state.shapes.items():
        problems.check(shape.key == key, f"shape {shape.requests} is filed under another key")
        problems.check(shape.refs == refs[id(shape)],
                       f"shape {shape.requests} counts {shape.refs} users, has {refs[id(shape)]}")
        problems.check(sorted(shape.pairs) == list(shape.pairs),
                       f"shape {shape.requests}'s pairs are not sorted by axis")
    for job_id, record in state.job_records.items():
        problems.check(state.shapes.get(record.shape.key) is record.shape,
                       f"job {job_id}'s shape is not the interned one")


def _check_groups(state: SchedulerState, problems: _Problems) -> None:
    groups = state.groups()
    queued: dict[GroupKey, set[str]] = {}
    held: Counter[GroupKey] = Counter()
    sizes: dict[GroupKey, int] = {}
    most: dict[GroupKey, int] = {}  # the largest maximum a member names (static: its size)
    for job_id, record in state.job_records.items():
        if record.group is None:
            continue
        key = (record.cluster, record.queue, record.group)
        sizes[key] = max(sizes.get(key, 0), record.group_size)
        most[key] = max(most.get(key, 0), record.group_max_size or record.group_size)
        if record.state is JobState.QUEUED:
            queued.setdefault(key, set()).add(job_id)
        else:
            held[key] += 1
    keys = set(queued) | set(held)
    problems.check(set(groups.keys()) == keys,
                   f"group index holds {sorted(groups.keys())[:5]}, jobs name {sorted(keys)[:5]}")
    for key in keys:
        members = set(groups.queued_members(key))
        problems.check(members == queued.get(key, set()),
                       f"group {key}'s queued members {sorted(members)[:5]} are not its queued "
                       f"jobs {sorted(queued.get(key, set()))[:5]}")
        problems.check(groups.held(key) == held[key],
                       f"group {key} counts {groups.held(key)} holding capacity, {held[key]} do")
        problems.check(groups.declared_size(key) >= sizes[key],
                       f"group {key}'s size {groups.declared_size(key)} is below a member's")
        problems.check(groups.declared_max_size(key) >= most[key],
                       f"group {key}'s maximum {groups.declared_max_size(key)} is below a "
                       f"member's")
        problems.check(groups.started(key) == (held[key] > 0),
                       f"group {key} says started={groups.started(key)}, {held[key]} members "
                       f"hold capacity")
    for cluster, key in groups.reserved.items():
        problems.check(key[0] == cluster, f"cluster {cluster!r} is reserved for {key} elsewhere")
        problems.check(key in keys, f"cluster {cluster!r} is reserved for {key}, which is gone")


def _check_controllers(state: SchedulerState, problems: _Problems) -> None:
    expected: dict[object, set[str]] = {}
    for job_id, record in state.job_records.items():
        controller = record.controller
        if record.state is not JobState.QUEUED or controller is None:
            problems.check(not record.held, f"job {job_id} is held without a queued controller")
            continue
        expected.setdefault(controller, set()).add(job_id)
        problems.check(record.held == (controller in state.holds),
                       f"job {job_id} is {'' if record.held else 'not '}held, yet its controller "
                       f"{'does not back' if record.held else 'backs'} off")
    problems.check(dict(state.queued_by_controller) == expected,
                   "the queued jobs by controller disagree with the queued jobs")


def _sum(jobs: list[tuple[str, JobRecord]], axes: int) -> list[int]:
    total = [0] * axes
    for _, record in jobs:
        add_pairs(total, record.shape.pairs)
    return total


def _add_into(vector: list[int], other: list[int]) -> None:
    for axis, amount in enumerate(other):
        vector[axis] += amount


def _matches(entry: HeapEntry, state: SchedulerState, queue: str, cluster: str) -> bool:
    """Whether a heap entry is current: it names a queued job of this queue and cluster, with
    the priority and creation time the job has now."""
    record = state.job_records.get(entry[2])
    return (record is not None and record.state is JobState.QUEUED and record.queue == queue
            and record.cluster == cluster and record.priority == -entry[0]
            and record.created_at == entry[1])


def _is_heap(heap: Sequence[HeapEntry]) -> bool:
    return all(heap[(i - 1) // 2] <= heap[i] for i in range(1, len(heap)))


def _shape_counts(shapes: dict[Shape, int]) -> dict[str, int]:
    return {str(shape.requests): count for shape, count in shapes.items()}

