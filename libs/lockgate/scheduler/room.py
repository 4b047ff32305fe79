"""Room in one cluster during a round: free room per node, virtual placement, first fit.

Why it exists: a job runs only in the cluster it was created in, and only when one node there has
room for all of it (allocatable, minus what unmanaged pods use, minus what managed jobs hold).
Jobs released earlier but not yet on a node are first placed, virtually, on the node their release
had in mind, else first-fit largest first; if one fits nowhere, the cluster is over-committed and
gets no new releases this round rather than risk it. `ClusterRoom` is built per round (and by
explain) from the state's records; room only shrinks while a round consumes it.
"""

from __future__ import annotations

from collections.abc import Callable

from lockgate.placement import PodPlacement, can_land
from lockgate.scheduler.costs import dominant_of
from lockgate.scheduler.groups import GroupKey
from lockgate.scheduler.state import ClusterRecord, Shape


class ClusterRoom:
    """One cluster's free room per schedulable node, as the round consumes it.

    A job goes only to a node its placement lets it land on (`lockgate.placement`): per
    placement, the round works out once which nodes those are (`eligible`), and first-fit walks
    only them.
    """

    __slots__ = ("capacity", "cursor", "eligible", "empty", "fits_cache", "free", "held_by",
                 "hold_node", "holds_on", "names", "overcommitted", "rejected", "reserved_for",
                 "sizes", "traits")

    def __init__(self, cluster: ClusterRecord, inverse_total: list[float],
                 reserved_for: GroupKey | None = None) -> None:
        self.names = cluster.order
        # Room held for pods below their queue's target (lockgate.scheduler.holds): per node,
        # the holds on it, oldest first (job id, queue, shape); per held job, its node; per
        # queue, the sum of what it holds here. `free` is the room *beyond* the holds: what
        # anyone may use.
        self.holds_on: dict[int, list[tuple[str, str, Shape]]] = {}
        self.hold_node: dict[str, int] = {}
        self.held_by: dict[str, list[int]] = {}
        self.capacity: list[list[int]] = [
            [a - u for a, u in zip(cluster.nodes[name].allocatable, cluster.nodes[name].unmanaged,
                                   strict=True)] for name in cluster.order]
        # A pod group this cluster waits for: nothing else is released here meanwhile.
        self.reserved_for = reserved_for
        # Each node's room with no managed job on it (computed when a group first asks).
        self.empty: list[list[int]] | None = None
        self.sizes = list(cluster.node_sizes)
        self.traits = [cluster.nodes[name].traits for name in self.names]
        self.eligible: dict[PodPlacement | None, list[int]] = {}
        self.fits_cache: dict[Shape, bool] = {}
        # First-fit resumes per shape where it last succeeded: free room only shrinks during a
        # round, so nodes before that point cannot take that shape again.
        self.cursor: dict[Shape, int] = {}
        # Shapes no node had room for: free room only shrinks, so they stay turned down until
        # the round ends, for every queue.
        self.rejected: set[Shape] = set()
        self.free: list[list[int]] = []
        for name in self.names:
            node = cluster.nodes[name]
            used = cluster.used_by_node.get(name)
            if used is None:
                free = [a - u for a, u in zip(node.allocatable, node.unmanaged, strict=True)]
            else:
                free = [
                    a - u - m
                    for a, u, m in zip(node.allocatable, node.unmanaged, used, strict=True)
                ]
            self.free.append(free)
        self.overcommitted = self._place_held_unbound(cluster, inverse_total)

    def _place_held_unbound(self, cluster: ClusterRecord, inverse_total: list[float]) -> int:
        """Charge released-but-unbound jobs to nodes; returns how many fit nowhere."""
        if not cluster.held_unbound:
            return 0
        index = {name: i for i, name in enumerate(self.names)}
        without_room: list[Shape] = []
        for shape, hint in cluster.held_unbound.values():
            i = index.get(hint) if hint is not None else None
            if (i is not None and fits(self.free[i], shape)
                    and can_land(shape.placement, self.traits[i])):
                take(self.free[i], shape)
            else:
                without_room.append(shape)
        without_room.sort(key=lambda shape: dominant_of(shape, inverse_total), reverse=True)
        return sum(1 for shape in without_room if self.place(shape) < 0)

    def hold(self, job_id: str, queue: str, shape: Shape, axes: int, *,
             node: int | None = None, avoid: frozenset[str] | set[str] = frozenset(),
             inverse_total: list[float] | None = None,
             yields: Callable[[str, Shape], bool] | None = None) -> int:
        """Hold room for `job_id` on `node`, or (None) on the node it may land on and fit
        when empty that is closest to having room for it (not in `avoid` unless all are),
        counting as its room what other queues hold there that `yields` to it (see
        `room_for_held`): from now on what frees there is kept for it. Returns the node, or
        -1."""
        if node is None:
            candidates = [i for i in self.nodes_for(shape.placement)
                          if fits(self.capacity[i], shape)]
            fresh = [i for i in candidates if self.names[i] not in avoid]
            candidates = fresh or candidates
            if not candidates:
                return -1
            inverse = inverse_total or [1.0] * axes

            def missing(i: int) -> tuple[float, int]:
                room = self.free[i] if yields is None else self._room_yielded(i, queue, yields)
                return (max((amount - room[axis]) * inverse[axis]
                            for axis, amount in shape.pairs), i)

            node = min(candidates, key=missing)
        take(self.free[node], shape)
        self.holds_on.setdefault(node, []).append((job_id, queue, shape))
        self.hold_node[job_id] = node
        held = self.held_by.setdefault(queue, [0] * axes)
        for axis, amount in shape.pairs:
            held[axis] += amount
        return node

    def unhold(self, job_id: str, queue: str, shape: Shape) -> None:
        """The hold ends: its room is anyone's again."""
        node = self.hold_node.pop(job_id)
        self.holds_on[node] = [h for h in self.holds_on[node] if h[0] != job_id]
        give(self.free[node], shape)
        for axis, amount in shape.pairs:
            self.held_by[queue][axis] -= amount

    def _room_yielded(self, node: int, queue: str,
                      yields: Callable[[str, Shape], bool]) -> list[int]:
        """The room on `node` beyond every hold, plus what other queues that `yields` to
        `queue` hold there."""
        room = self.free[node][:]
        for _, other_queue, other_shape in self.holds_on.get(node, ()):
            if other_queue != queue and yields(other_queue, other_shape):
                give(room, other_shape)
        return room

    def room_for_held(self, job_id: str, queue: str,
                      yields: Callable[[str, Shape], bool]) -> list[int]:
        """What is free for a held pod on its node: the room beyond every hold there, plus its
        own hold's, its own queue's younger holds' (its queue's pods are served in order), and
        what other queues hold there where `yields(queue, shape)`: those that rank after its
        queue in the round's fair order right now, for the pod held. Holds on a node are
        served in the fair order, not in the order they were made, so a queue that came first
        and held room up to its target does not go before a queue further below its own
        (issue 17: the weight-2 queue first)."""
        node = self.hold_node[job_id]
        room = self.free[node][:]
        younger = False
        for other, other_queue, other_shape in self.holds_on[node]:
            if other == job_id:
                younger = True
            if other_queue == queue:
                if younger:
                    give(room, other_shape)
            elif yields(other_queue, other_shape):
                give(room, other_shape)
        return room

    def place_held(self, job_id: str, queue: str, shape: Shape,
                   yields: Callable[[str, Shape], bool] | None = None) -> int:
        """Place a pod that room is held for: on its node if `room_for_held` fits it; else
        anywhere there is room beyond the holds. Its hold ends when it is placed; -1 (hold
        kept) when it fits nowhere yet. Taking room another queue holds leaves that hold in
        place (its node's `free` goes below zero until more frees there)."""
        node = self.hold_node[job_id]
        room = self.room_for_held(job_id, queue, yields or _never)
        if fits(room, shape):
            self.unhold(job_id, queue, shape)
            take(self.free[node], shape)
            return node
        placed = self.place(shape)
        if placed < 0 and yields is not None:
            placed = self._place_yielded(shape, queue, yields)
        if placed >= 0:
            self.unhold(job_id, queue, shape)
        return placed

    def _place_yielded(self, shape: Shape, queue: str,
                       yields: Callable[[str, Shape], bool]) -> int:
        """First fit on the other nodes with holds, counting as room what queues that yield to
        `queue` hold there (nodes without holds were tried by `place`): room freed on a node
        held for a queue that ranks after this one is this one's first, wherever its own hold
        is. -1 when none fits."""
        eligible = set(self.nodes_for(shape.placement))
        for node in sorted(self.holds_on):
            if node in eligible and self.holds_on[node] and fits(
                    self._room_yielded(node, queue, yields), shape):
                take(self.free[node], shape)
                return node
        return -1

    def fits_some_node(self, shape: Shape) -> bool:
        """Whether some schedulable node could hold `shape` when empty."""
        fits = self.fits_cache.get(shape)
        if fits is None:
            pairs = shape.pairs
            placement = shape.placement
            fits = any(all(size[a] >= amount for a, amount in pairs)
                       and can_land(placement, traits) for size, traits in self.sizes)
            self.fits_cache[shape] = fits
        return fits

    def nodes_for(self, placement: PodPlacement | None) -> list[int]:
        """Indexes of the nodes a pod with this placement may land on, in first-fit order."""
        nodes = self.eligible.get(placement)
        if nodes is None:
            nodes = self.eligible[placement] = [
                i for i, traits in enumerate(self.traits) if can_land(placement, traits)]
        return nodes

    def place(self, shape: Shape) -> int:
        """First-fit: the index of the node now holding `shape`, or -1 when none has room."""
        free = self.free
        order = self.nodes_for(shape.placement)
        count = len(order)
        pairs = shape.pairs
        i = self.cursor.get(shape, 0)
        while i < count:
            room = free[order[i]]
            for axis, amount in pairs:
                if room[axis] < amount:
                    break
            else:
                for axis, amount in pairs:
                    room[axis] -= amount
                self.cursor[shape] = i
                return order[i]
            i += 1
        self.cursor[shape] = count
        self.rejected.add(shape)
        return -1

    def place_all(self, shapes: list[Shape], inverse_total: list[float]) -> list[int] | None:
        """Place every shape (largest first) or none: the node of each, in the order given."""
        saved = ([room[:] for room in self.free], dict(self.cursor), set(self.rejected))
        nodes = [-1] * len(shapes)
        order = sorted(range(len(shapes)), reverse=True,
                       key=lambda i: dominant_of(shapes[i], inverse_total))
        for i in order:
            node = self.place(shapes[i])
            if node < 0:
                self.free, self.cursor, self.rejected = saved
                return None
            nodes[i] = node
        return nodes

    def fits_empty(self, shapes: list[Shape], inverse_total: list[float],
                   cluster: ClusterRecord) -> bool:
        """Whether the shapes fit together on the nodes with no managed job on any of them."""
        if self.empty is None:
            self.empty = [
                [a - u for a, u in zip(node.allocatable, node.unmanaged, strict=True)]
                for node in (cluster.nodes[name] for name in self.names)
            ]
        room = [free[:] for free in self.empty]
        for shape in sorted(shapes, key=lambda s: dominant_of(s, inverse_total),
                            reverse=True):
            for free, traits in zip(room, self.traits, strict=True):
                if fits(free, shape) and can_land(shape.placement, traits):
                    take(free, shape)
                    break
            else:
                return False
        return True


def _never(queue: str, shape: Shape) -> bool:
    return False


def fits(room: list[int], shape: Shape) -> bool:
    return all(room[axis] >= amount for axis, amount in shape.pairs)


def give(room: list[int], shape: Shape) -> None:
    for axis, amount in shape.pairs:
        room[axis] += amount


def take(room: list[int], shape: Shape) -> None:
    for axis, amount in shape.pairs:
        room[axis] -= amount


def exceeds_all(allocation: list[int], shapes: list[Shape],
                 limits: tuple[tuple[int, int], ...]) -> bool:
    requested: dict[int, int] = {}
    for shape in shapes:
        for axis, amount in shape.pairs:
            requested[axis] = requested.get(axis, 0) + amount
    return any(allocation[axis] + requested.get(axis, 0) > limit for axis, limit in limits)


def exceeds(allocation: list[int], shape: Shape, limits: tuple[tuple[int, int], ...]) -> bool:
    requested = dict(shape.pairs)
    return any(allocation[axis] + requested.get(axis, 0) > limit for axis, limit in limits)
