"""Room in one cluster during a round: free room per node, virtual placement, first fit.

Why it exists: a job runs only in the cluster it was created in, and only when one node there has
room for all of it (allocatable, minus what unmanaged pods use, minus what managed jobs hold).
Jobs released earlier but not yet on a node are first placed, virtually, on the node their release
had in mind, else first-fit largest first; if one fits nowhere, the cluster is over-committed and
gets no new releases this round rather than risk it. `ClusterRoom` is built per round (and by
explain) from the state's records; room only shrinks while a round consumes it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from lockgate.placement import PodPlacement, can_land
from lockgate.scheduler.costs import dominant_of
from lockgate.scheduler.groups import GroupKey
from lockgate.scheduler.records import Shape
from lockgate.scheduler.room_caches import ClusterRecord
from lockgate.scheduler.room_index import RoomIndex


class ClusterRoom:
    """One cluster's free room per schedulable node, as the round consumes it.

    A job goes only to a node its placement lets it land on (`lockgate.placement`): per
    placement, which nodes those are is worked out once while the cluster's nodes stay the
    same (`ClusterRecord.eligible_nodes`), and first-fit walks only them.
    """

    __slots__ = (
        "capacity",
        "copied",
        "cursor",
        "eligible_by_id",
        "eligible_sets",
        "fits_cache",
        "free",
        "growth_rejected",
        "held_by",
        "held_on",
        "hold_counts",
        "hold_node",
        "holds_of",
        "holds_on",
        "inverse_total",
        "names",
        "overcommitted",
        "owned",
        "queue_held_on",
        "record",
        "rejected",
        "reserved_for",
        "room_index",
        "sizes",
        "traits",
        "yield_candidates",
    )

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
        self.holds_of: dict[str, int] = {}  # per queue, how many pods it holds room for here
        # The same holds summed, so that a pod looking for room counts a node's holds in
        # O(queues holding there), not O(holds there), and passes over a node at once when
        # even every other queue's holds there would not make room for it: per node, how many
        # holds of each (queue, shape); the sum of all its holds; the sum of each queue's
        # holds on it.
        self.hold_counts: dict[int, dict[tuple[str, Shape], int]] = {}
        self.held_on: dict[int, list[int]] = {}
        self.queue_held_on: dict[tuple[int, str], list[int]] = {}
        # Every node's room counting no hold (`free` plus the holds there): a pod looking for
        # room among holds, or for the node to hold room on, finds it in about O(log nodes),
        # not by looking at each (made when a cluster first has holds; `_room_index`).
        self.room_index: RoomIndex | None = None
        # Per shape turned down beyond the holds: the nodes it may land on whose room counting
        # no hold fits it (`_place_yielded`), in first-fit order. That room only shrinks in a
        # round, so the list only thins: a node leaves for good once it is too small.
        self.yield_candidates: dict[Shape, list[int]] = {}
        cluster.current_caches()
        self.record = cluster
        self.capacity: list[list[int]] = cluster.node_rooms  # never changed
        self.inverse_total = inverse_total
        # A pod group this cluster waits for: nothing else is released here meanwhile.
        self.reserved_for = reserved_for
        self.sizes = list(cluster.node_sizes)
        self.traits = cluster.node_traits
        # Eligible nodes by the state's number for a shape's placement: hashing a pydantic
        # placement for every pod placed was 7% of the leader's CPU on the release benchmark.
        self.eligible_by_id: dict[int, list[int]] = {}
        self.eligible_sets: dict[int, frozenset[int]] = {}
        self.fits_cache: dict[Shape, bool] = {}
        # First-fit resumes per shape where it last succeeded: free room only shrinks during a
        # round, so nodes before that point cannot take that shape again.
        self.cursor: dict[Shape, int] = {}
        # Shapes no node had room for: free room only shrinks, so they stay turned down until
        # the round ends, for every queue.
        self.rejected: set[Shape] = set()
        # The same for the nodes that may exist (`place_growth`, `fits_growth`): their room
        # too only shrinks in a round, and a walk of a few hundred of them per pod turned down
        # was the round's largest cost of growth.
        self.growth_rejected: set[Shape] = set()
        # Each node's room as the state keeps it, copied only when the round first takes from
        # it (`_own`): a round touches a few of a cluster's hundreds of nodes.
        self.free: list[list[int]] = cluster.node_free[:]
        self.owned = bytearray(len(self.free))
        self.copied: list[int] = []  # the nodes owned, in the order they were copied
        self.overcommitted = self._place_held_unbound(cluster, inverse_total)

    def _own(self, node: int) -> list[int]:
        """The node's room, the round's own copy (made the first time it is written)."""
        if not self.owned[node]:
            self.free[node] = self.free[node][:]
            self.owned[node] = 1
            self.copied.append(node)
        return self.free[node]

    def _place_held_unbound(self, cluster: ClusterRecord, inverse_total: list[float]) -> int:
        """Charge released-but-unbound jobs to nodes; returns how many fit nowhere.

        Jobs bound to a Node the cluster does not have yet, which a NodeClaim in flight names,
        are charged to that claim's virtual node first: the leader may hear of the bindings
        before it hears of the Node, and the claim's room looked free meanwhile (pods were
        released for growth beyond the pool's limits)."""
        index = cluster.positions
        for node_name, virtual in cluster.claim_nodes.items():
            used = cluster.used_by_node.get(node_name)
            at = index.get(virtual)
            if used is not None and at is not None:
                room = self._own(at)
                for axis, amount in enumerate(used):
                    room[axis] -= amount
        if not cluster.held_unbound:
            return 0
        without_room: list[Shape] = []
        for shape, hint in cluster.held_unbound.values():
            i = index.get(hint) if hint is not None else None
            if (i is not None and fits(self.free[i], shape)
                    and can_land(shape.placement, self.traits[i])):
                take(self._own(i), shape)
            else:
                without_room.append(shape)
        without_room.sort(key=lambda shape: dominant_of(shape, inverse_total), reverse=True)
        return sum(1 for shape in without_room
                   if self.place(shape) < 0 and self.place_growth(shape) < 0)

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
            candidates = self.candidates_to_hold(shape)
            if not candidates:
                return -1
            node = self._closest(shape, queue, inverse_total or [1.0] * axes, yields,
                                 self._avoided(candidates, shape, avoid))
        take(self._own(node), shape)
        self.holds_on.setdefault(node, []).append((job_id, queue, shape))
        self.hold_node[job_id] = node
        self.holds_of[queue] = self.holds_of.get(queue, 0) + 1
        held = self.held_by.setdefault(queue, [0] * axes)
        for axis, amount in shape.pairs:
            held[axis] += amount
        counts = self.hold_counts.get(node)
        if counts is None:
            counts = self.hold_counts[node] = {}
            self.held_on[node] = [0] * axes
        counts[(queue, shape)] = counts.get((queue, shape), 0) + 1
        on_node = self.held_on[node]
        mine = self.queue_held_on.get((node, queue))
        if mine is None:
            mine = self.queue_held_on[(node, queue)] = [0] * axes
        for axis, amount in shape.pairs:
            on_node[axis] += amount
            mine[axis] += amount
        self._room_index()  # the cluster has holds now: keep the index from here on
        return node

    def _room_index(self) -> RoomIndex:
        index = self.room_index
        if index is None:
            # A copy of the state's index of the nodes' free room, changed on the nodes whose
            # room the round changed so far: a block copy, not a walk over every node's
            # scattered room.
            index = self.room_index = self.record.free_index.copy()
            for node in self.copied:
                self._index(node)
        return index

    def _avoided(self, candidates: list[int], shape: Shape,
                 avoid: frozenset[str] | set[str]) -> frozenset[int]:
        """The candidates to hold room on for `shape` that are not in `avoid` (node names), or
        all of them when every one is: as node indexes."""
        sets = self.record.hold_node_sets
        allowed = sets.get(shape)
        if allowed is None:
            allowed = sets[shape] = frozenset(candidates)
        if not avoid:
            return allowed
        position = self.record.positions
        avoided = {i for name in avoid if (i := position.get(name, -1)) in allowed}
        return allowed - avoided if len(avoided) < len(allowed) else allowed

    def _eligible_set(self, shape: Shape) -> frozenset[int]:
        eligible = self.eligible_sets.get(shape.placement_id)
        if eligible is None:
            eligible = self.eligible_sets[shape.placement_id] = frozenset(
                self.nodes_for_shape(shape))
        return eligible

    def _closest(self, shape: Shape, queue: str, inverse: list[float],
                 yields: Callable[[str, Shape], bool] | None, allowed: frozenset[int]) -> int:
        """The node in `allowed` closest to having room for `shape` (the least missing on its
        dominant resource, then the first), counting what holds that `yields` free there.

        A best-first search of the room index: what a subtree misses at least (its most room
        per axis) orders it, so only nodes that might beat the best are looked at, and a node
        with holds is asked who yields there only when it comes up."""
        index = self._room_index()
        tops = index.tops
        size = index.size
        pairs = shape.pairs
        free = self.free
        counts = self.hold_counts
        nodes = len(free)

        def least(i: int) -> float:
            return max(((amount - tops[axis][i]) * inverse[axis] for axis, amount in pairs),
                       default=0.0)

        # (misses at least, first position under it, tree index; a negative one is a node
        # whose exact miss was worked out).
        frontier: list[tuple[float, int, int]] = [(least(1), 0, 1)]
        while frontier:
            missing, low, i = heapq.heappop(frontier)
            if i < 0:
                return low
            if i >= size:
                node = i - size
                if node not in allowed:
                    continue
                if yields is not None and counts.get(node):
                    room = self._room_yielded(node, queue, yields)
                else:
                    room = free[node]
                exact = max(((amount - room[axis]) * inverse[axis] for axis, amount in pairs),
                            default=0.0)
                if exact <= missing:
                    return node
                heapq.heappush(frontier, (exact, node, -1))
                continue
            span = (size >> (i.bit_length() - 1)) >> 1  # positions under each child
            for child, first in ((2 * i, low), (2 * i + 1, low + span)):
                if first < nodes:
                    heapq.heappush(frontier, (least(child), first, child))
        return -1

    def unhold(self, job_id: str, queue: str, shape: Shape) -> None:
        """The hold ends: its room is anyone's again."""
        node = self.hold_node.pop(job_id)
        self.holds_of[queue] -= 1
        self.holds_on[node] = [h for h in self.holds_on[node] if h[0] != job_id]
        give(self._own(node), shape)
        for axis, amount in shape.pairs:
            self.held_by[queue][axis] -= amount
        counts = self.hold_counts[node]
        left = counts[(queue, shape)] - 1
        if left:
            counts[(queue, shape)] = left
        else:
            del counts[(queue, shape)]
        take(self.held_on[node], shape)
        take(self.queue_held_on[(node, queue)], shape)

    def _room_yielded(self, node: int, queue: str,
                      yields: Callable[[str, Shape], bool]) -> list[int]:
        """The room on `node` beyond every hold, plus what other queues that `yields` to
        `queue` hold there."""
        room = self.free[node][:]
        for (other_queue, other_shape), count in self.hold_counts.get(node, {}).items():
            if other_queue != queue and yields(other_queue, other_shape):
                for axis, amount in other_shape.pairs:
                    room[axis] += amount * count
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
                   yields: Callable[[str, Shape], bool] | None = None, *,
                   elsewhere: bool = True) -> int:
        """Place a pod that room is held for: on its node if `room_for_held` fits it; else
        anywhere there is room beyond the holds, and (`elsewhere`) on other nodes with holds
        counting what `yields` there. Its hold ends when it is placed; -1 (hold kept) when it
        fits nowhere yet. Taking room another queue holds leaves that hold in place (its
        node's `free` goes below zero until more frees there)."""
        node = self.hold_node[job_id]
        room = self.room_for_held(job_id, queue, yields or _never)
        if fits(room, shape):
            self.unhold(job_id, queue, shape)
            take(self._own(node), shape)
            self._index(node)
            return node
        placed = self.place(shape)
        if placed < 0 and yields is not None and elsewhere:
            placed = self._place_yielded(shape, queue, yields)
        if placed >= 0:
            self.unhold(job_id, queue, shape)
        return placed

    def _place_yielded(self, shape: Shape, queue: str,
                       yields: Callable[[str, Shape], bool]) -> int:
        """First fit on the other nodes with holds, counting as room what queues that yield to
        `queue` hold there (nodes without holds were tried by `place`): room freed on a node
        held for a queue that ranks after this one is this one's first, wherever its own hold
        is. -1 when none fits.

        A node where the room beyond the holds plus every other queue's holds would not fit
        `shape` is passed over without asking who yields there: O(axes) per node with holds,
        and O(queues holding there) only where it might fit."""
        candidates = self.yield_candidates.get(shape)
        if candidates is None:
            index = self._room_index()
            eligible = self._eligible_set(shape)
            candidates = []
            node = index.first(shape.pairs, 0)
            while node >= 0:
                if node in eligible:
                    candidates.append(node)
                node = index.first(shape.pairs, node + 1)
            self.yield_candidates[shape] = candidates
        free = self.free
        held_on = self.held_on
        queue_held_on = self.queue_held_on
        counts = self.hold_counts
        pairs = shape.pairs
        gone = 0
        for position, node in enumerate(candidates):
            room = free[node]
            others = held_on[node]
            if any(room[axis] + others[axis] < amount for axis, amount in pairs):
                gone += 1  # too little room there counting no hold: for the rest of the round
                continue
            if gone:
                candidates[position - gone] = node
            if not counts.get(node):
                continue  # no hold left there (a later one puts it back in play)
            mine = queue_held_on.get((node, queue))
            if (mine is None or not any(room[axis] + others[axis] - mine[axis] < amount
                                        for axis, amount in pairs)) and fits(
                    self._room_yielded(node, queue, yields), shape):
                if gone:
                    del candidates[position - gone + 1:position + 1]
                take(self._own(node), shape)
                self._index(node)
                return node
        if gone:
            del candidates[len(candidates) - gone:]
        return -1

    def _index(self, node: int) -> None:
        """The node's room counting no hold changed."""
        if self.room_index is not None and not self.record.virtual_at[node]:
            held = self.held_on.get(node)
            room = self.free[node]
            self.room_index.set(node, room if held is None else [
                a + h for a, h in zip(room, held, strict=True)])

    def candidates_to_hold(self, shape: Shape) -> list[int]:
        """The nodes `shape` may land on and fit when no managed pod runs there."""
        candidates = self.record.hold_nodes.get(shape)
        if candidates is None:
            candidates = self.record.hold_nodes[shape] = [
                i for i in self.nodes_for_shape(shape) if fits(self.capacity[i], shape)]
        return candidates

    def could_use_every_node(self, shape: Shape) -> bool:
        """Whether `shape` may land on every node here and fits each once its managed pods
        end: then room freed on any node here brings it closer to running."""
        return len(self.candidates_to_hold(shape)) == self.record.real_nodes

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
        """Indexes of the real nodes a pod with this placement may land on, in first-fit
        order (nodes that may exist are `place_growth`'s alone)."""
        nodes = self.record.eligible_nodes.get(placement)
        if nodes is None:
            virtual = set(self.record.virtual_order)
            nodes = self.record.eligible_nodes[placement] = [
                i for i, traits in enumerate(self.traits)
                if i not in virtual and can_land(placement, traits)]
        return nodes

    def place_growth(self, shape: Shape) -> int:
        """First fit on the nodes that may exist (lockgate.growth: NodeClaims in flight, then
        each pool's headroom, in that order), filling one before the next so the autoscaler is
        asked for as few nodes as the pods need: the index of the node now holding `shape`, or
        -1. Only after `place` found no room on the real nodes (the round's rule: existing room
        first)."""
        if shape in self.growth_rejected:
            return -1
        placement = shape.placement
        traits = self.traits
        free = self.free
        for node in self.record.virtual_order:
            if fits(free[node], shape) and can_land(placement, traits[node]):
                take(self._own(node), shape)
                self._index(node)
                return node
        self.growth_rejected.add(shape)
        return -1

    def fits_growth(self, shape: Shape) -> bool:
        """Whether some node that may exist has room for `shape` now (`place_growth`,
        without taking it)."""
        if shape in self.growth_rejected:
            return False
        free, traits = self.free, self.traits
        if any(fits(free[node], shape) and can_land(shape.placement, traits[node])
               for node in self.record.virtual_order):
            return True
        self.growth_rejected.add(shape)
        return False

    def is_virtual(self, node: int) -> bool:
        """Whether the node at this index may exist rather than exists (`place_growth`)."""
        return bool(self.record.virtual_at[node])

    def nodes_for_shape(self, shape: Shape) -> list[int]:
        """`nodes_for` its placement, looked up by the placement's number."""
        nodes = self.eligible_by_id.get(shape.placement_id)
        if nodes is None:
            nodes = self.eligible_by_id[shape.placement_id] = self.nodes_for(shape.placement)
        return nodes

    def place(self, shape: Shape) -> int:
        """Best fit among the first `BEST_FIT_WINDOW` nodes that fit, in first-fit order: the
        index of the node now holding `shape`, or -1 when none has room.

        Why not first fit: a small pod put into the first gap that fits it breaks up the room a
        bigger pod needs, when a gap its own size waits further on. In a full cluster gaps open
        where pods finish, and queues of big pods stayed short of their targets while queues of
        small ones rounded up (docs/scheduling.md, "Room per cluster in a round"). The window
        bounds the cost: a perfect fit ends the search at once, and in an empty cluster the
        first node is as good as any."""
        free = self.free
        order = self.nodes_for_shape(shape)
        count = len(order)
        pairs = shape.pairs
        i = self.cursor.get(shape, 0)
        index = self.room_index
        # Every real node is eligible (virtual ones are `place_growth`'s, and not in the index).
        every_node = index is not None and count == self.record.real_nodes
        real_rank = self.record.real_rank
        inverse = self.inverse_total
        best, best_leftover, first, seen = -1, 0.0, -1, 0
        while True:
            if every_node:
                # First-fit order is the index's: the index of room counting no hold, never
                # below the room beyond the holds, skips the nodes that cannot take the shape
                # in O(log nodes) each, instead of looking at every one of a full cluster's
                # nodes. `i` stays an index into `order`, as on the path below.
                assert index is not None
                if i >= count:
                    break
                node = index.first(pairs, order[i])
                if node < 0:
                    break
                i = real_rank[node]
            elif i < count:
                node = order[i]
            else:
                break
            room = free[node]
            # What it would leave there, each axis as a fraction of the pool (as shares are).
            leftover = 0.0
            for axis, amount in pairs:
                if room[axis] < amount:
                    leftover = -1.0
                    break
                leftover += (room[axis] - amount) * inverse[axis]
            if leftover >= 0:
                if first < 0:
                    first = i
                if best < 0 or leftover < best_leftover:
                    best, best_leftover = node, leftover
                seen += 1
                if leftover == 0 or seen >= BEST_FIT_WINDOW:
                    break
            i += 1
        if best < 0:
            self.cursor[shape] = count
            self.rejected.add(shape)
            return -1
        # Nodes before the first that fit still cannot take the shape (room only shrinks in a
        # round); the first may, if the pod went elsewhere.
        self.cursor[shape] = first
        take(self._own(best), shape)
        if index is not None:
            self._index(best)
        return best

    def place_all(self, shapes: list[Shape], inverse_total: list[float], *,
                  growth: bool = False) -> list[int] | None:
        """Place every shape (largest first) or none: the node of each, in the order given;
        with `growth`, on nodes that may exist where the real ones have no room
        (`place_growth`)."""
        saved = ([room[:] for room in self.free], dict(self.cursor), set(self.rejected),
                 set(self.growth_rejected))
        nodes = [-1] * len(shapes)
        order = sorted(range(len(shapes)), reverse=True,
                       key=lambda i: dominant_of(shapes[i], inverse_total))
        for i in order:
            node = self.place(shapes[i])
            if node < 0 and growth:
                node = self.place_growth(shapes[i])
            if node < 0:
                self.free, self.cursor, self.rejected, self.growth_rejected = saved
                self.owned = bytearray(b"\x01") * len(self.free)  # all copies now
                self.copied = list(range(len(self.free)))
                self.yield_candidates = {}
                self.room_index = None  # room came back: built again when next asked
                return None
            nodes[i] = node
        return nodes

    def fits_empty(self, shapes: list[Shape], inverse_total: list[float]) -> bool:
        """Whether the shapes fit together on the nodes with no managed job on any of them."""
        room = [free[:] for free in self.capacity]
        for shape in sorted(shapes, key=lambda s: dominant_of(s, inverse_total),
                            reverse=True):
            for free, traits in zip(room, self.traits, strict=True):
                if fits(free, shape) and can_land(shape.placement, traits):
                    take(free, shape)
                    break
            else:
                return False
        return True


# How many nodes that fit a pod `ClusterRoom.place` compares before taking the tightest.
BEST_FIT_WINDOW = 8


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
