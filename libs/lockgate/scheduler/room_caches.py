"""A cluster's nodes as the state keeps them, and the room caches every round copies.

Why a module of its own: at fleet scale a round touches 20,000 nodes, so it cannot work out each
node's room, or which nodes a placement may land on, per round. A `ClusterRecord` keeps each
node's free room as jobs come and go (`NodeRecord.free`, changed in place) and, while its nodes
do not change (`version`), what rounds work out from the nodes alone: the first-fit order, the
rooms and their index (`RoomIndex`), per placement the eligible nodes, per shape the nodes a held
pod may use (`current_caches`, `note_free`). The state changes the records; the round's room
(`lockgate.scheduler.room`) reads and copies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lockgate.growth import is_virtual
from lockgate.placement import NodeTraits, PodPlacement, Taint, can_land, is_control_plane
from lockgate.resources import Resources
from lockgate.scheduler.records import Shape
from lockgate.scheduler.room_index import NO_NODE, RoomIndex

# A node as the parking logic compares them: its allocatable vector and its traits.
NodeClass = tuple[tuple[int, ...], NodeTraits]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What one node offers: allocatable capacity, minus what pods lockgate does not manage use."""

    allocatable: Resources
    unmanaged_usage: Resources = field(default_factory=Resources)
    schedulable: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    @property
    def in_pool(self) -> bool:
        """Whether the node counts towards the pool fair shares are shares of: schedulable,
        and not a tainted control plane (room there is only for pods that tolerate it)."""
        return self.schedulable and not is_control_plane(self.taints)


class NodeRecord:
    __slots__ = ("allocatable", "free", "info", "room", "traits", "unmanaged")

    def __init__(self, info: NodeInfo, allocatable: list[int], unmanaged: list[int],
                 traits: NodeTraits, used: list[int] | None = None) -> None:
        self.info = info
        self.allocatable = allocatable
        self.unmanaged = unmanaged
        self.traits = traits
        # What managed pods may use (allocatable less unmanaged usage), and what of that the
        # managed pods bound here leave free: kept as jobs come and go, so that a round copies
        # each node's room instead of working it out (20,000 nodes a round at fleet scale).
        self.room = [a - u for a, u in zip(allocatable, unmanaged, strict=True)]
        self.free = self.room[:] if used is None else [
            r - m for r, m in zip(self.room, used, strict=True)]


class ClusterRecord:
    __slots__ = (
        "cached_version",
        "claim_nodes",
        "eligible_nodes",
        "fits_no_node",
        "free_index",
        "held_unbound",
        "hold_node_sets",
        "hold_nodes",
        "jobs_on_node",
        "name",
        "node_free",
        "node_list",
        "node_rooms",
        "node_sizes",
        "node_traits",
        "nodes",
        "order",
        "positions",
        "real_nodes",
        "real_rank",
        "releasing",
        "total",
        "used_by_node",
        "version",
        "virtual_at",
        "virtual_order",
    )

    def __init__(self, name: str, axes: int) -> None:
        self.name = name
        self.version = 0  # bumped on every change of its nodes (fair targets' node groups)
        self.nodes: dict[str, NodeRecord] = {}
        self.order: list[str] = []  # schedulable node names, sorted: the first-fit order
        self.total = [0] * axes  # allocatable of schedulable nodes
        # How many schedulable nodes have each distinct (allocatable vector, traits). A job that
        # fits none of them (too big, or kept out by taints and selectors) is parked; a class
        # never seen before may let it fit, so it unparks.
        self.node_sizes: dict[NodeClass, int] = {}
        # Per request shape: fits none of node_sizes (cleared whenever they change).
        self.fits_no_node: dict[Shape, bool] = {}
        # Requests of managed jobs holding capacity on a named node (the node may be unknown).
        self.used_by_node: dict[str, list[int]] = {}
        self.jobs_on_node: dict[str, int] = {}
        # Jobs holding capacity without a node yet (released, ungated): job_id -> (shape, the
        # node the round that released it had in mind, if any).
        self.held_unbound: dict[str, tuple[Shape, str | None]] = {}
        # Per Node a NodeClaim in flight names that the cluster does not have yet, the claim's
        # virtual node (lockgate.growth): pods bound to that Node are charged there.
        self.claim_nodes: dict[str, str] = {}
        # Of those, how many are released and not yet ungated: the ungaters' backlog here,
        # which the round keeps short so a newcomer's release does not queue behind it.
        self.releasing = 0
        # What rounds work out from the nodes alone, kept while `version` is `cached_version`
        # (`current_caches`): the schedulable nodes' records in first-fit order; per
        # placement, the indexes of those it may land on; per request shape, those it may
        # land on and fit when empty. Worked out per round, they cost O(nodes) per cluster
        # touched (20,000 nodes at fleet scale).
        self.cached_version = -1
        self.node_list: list[NodeRecord] = []
        self.node_rooms: list[list[int]] = []
        # Each node's `free` (the lists themselves, which jobs change in place): a round
        # copies this rather than read it from each node's record, 20,000 scattered objects.
        self.node_free: list[list[int]] = []
        # The same in a `RoomIndex`, changed with them (`note_free`): each round copies it.
        self.free_index = RoomIndex(0, axes)
        self.node_traits: list[NodeTraits] = []
        self.eligible_nodes: dict[PodPlacement | None, list[int]] = {}
        self.hold_nodes: dict[Shape, list[int]] = {}
        self.hold_node_sets: dict[Shape, frozenset[int]] = {}  # the same, as sets
        self.positions: dict[str, int] = {}  # node name -> its index in first-fit order
        # Nodes that may exist (lockgate.growth: NodeClaims in flight, then a pool's headroom):
        # their indexes in the order a round fills them, and how many nodes are real.
        self.virtual_order: list[int] = []
        self.real_nodes = 0
        # Per position, whether the node there is virtual (1) or real (0); and each real
        # node's index among the real ones, in first-fit order (-1 for a virtual one): what
        # `ClusterRoom.place` needs to walk the room index when a shape may land on every
        # real node, the virtual ones being `place_growth`'s alone.
        self.virtual_at = bytearray()
        self.real_rank: list[int] = []

    def note_free(self, node: str, free: list[int]) -> None:
        """A node's free room changed (in place): keep the index of it current, if it is."""
        if self.cached_version == self.version:
            position = self.positions.get(node)
            if position is not None and not self.virtual_at[position]:
                self.free_index.set(position, free)

    def current_caches(self) -> None:
        """Drop what was worked out from the nodes if they changed since."""
        if self.cached_version != self.version:
            self.cached_version = self.version
            self.node_list = [self.nodes[name] for name in self.order]
            self.node_rooms = [node.room for node in self.node_list]
            self.node_free = [node.free for node in self.node_list]
            self.node_traits = [node.traits for node in self.node_list]
            self.eligible_nodes = {}
            self.hold_nodes = {}
            self.hold_node_sets = {}
            self.positions = {name: i for i, name in enumerate(self.order)}
            self.virtual_at = bytearray(is_virtual(name) for name in self.order)
            rank = 0
            self.real_rank = [-1] * len(self.order)
            for position, virtual_here in enumerate(self.virtual_at):
                if not virtual_here:
                    self.real_rank[position] = rank
                    rank += 1
            # The index holds the real nodes' room only: no search that uses it may land on a
            # virtual node (those are filled by `place_growth`, in their own order).
            no_room = [NO_NODE] * len(self.total)
            self.free_index = RoomIndex(len(self.node_free), len(self.total), rows=[
                no_room if virtual_here else free
                for free, virtual_here in zip(self.node_free, self.virtual_at, strict=True)])
            virtual = [name for name in self.order if is_virtual(name)]
            # In-flight claims first (they are coming anyway), then each pool's headroom in
            # its own order ("/2" before "/10").
            virtual.sort(key=lambda name: ("/claim/" not in name, len(name), name))
            self.virtual_order = [self.positions[name] for name in virtual]
            self.real_nodes = len(self.order) - len(virtual)


def fits_node_class(shape: Shape, node_class: NodeClass) -> bool:
    """Whether a job of this shape fits an empty node of this class: room and filters."""
    size, traits = node_class
    return all(axis < len(size) and amount <= size[axis] for axis, amount in shape.pairs) and (
        can_land(shape.placement, traits))
