"""An index of room per node: the first node, in first-fit order, whose room may fit a shape.

Why it exists: a full cluster has hundreds of nodes and a round asks, for each shape it tries
there, which nodes have room. The state keeps one index per cluster of its nodes' free room,
changed as jobs come and go (O(axes x log nodes) per change), and each round takes a copy of it
(`copy`, a memory copy: the tree is kept in machine-integer arrays, so copying touches no
Python object per node), instead of building one per cluster from 20,000 scattered node
records every round (issue 17).
"""

from __future__ import annotations

from array import array

# Below any room a node can have: a position with no node.
NO_NODE = -(1 << 62)


class RoomIndex:
    """Per node, a room vector (or none), to find the first node whose room may fit a shape
    in O(log nodes): a tree of per-axis maxima over node positions (first-fit order)."""

    __slots__ = ("size", "tops")

    def __init__(self, nodes: int, axes: int, *, rows: list[list[int]] | None = None) -> None:
        size = 1
        while size < nodes:
            size *= 2
        self.size = size
        self.tops = [array("q", [NO_NODE]) * (2 * size) for _ in range(axes)]
        if rows:
            for axis, top in enumerate(self.tops):
                top[size:size + len(rows)] = array("q", [row[axis] for row in rows])
                for i in range(size - 1, 0, -1):
                    left, right = top[2 * i], top[2 * i + 1]
                    top[i] = left if left > right else right

    def copy(self) -> RoomIndex:
        """An index of the same rooms that changes apart from this one."""
        twin = RoomIndex.__new__(RoomIndex)
        twin.size = self.size
        twin.tops = [top[:] for top in self.tops]
        return twin

    def set(self, node: int, room: list[int] | None) -> None:
        for axis, top in enumerate(self.tops):
            i = node + self.size
            top[i] = NO_NODE if room is None else room[axis]
            i >>= 1
            while i:
                left, right = top[2 * i], top[2 * i + 1]
                top[i] = left if left > right else right
                i >>= 1

    def first(self, pairs: tuple[tuple[int, int], ...], start: int) -> int:
        """The first node at or after `start` whose room is at least `pairs` on every axis
        asked; -1 if none."""
        return self._first(1, 0, self.size, pairs, start)

    def _first(self, i: int, low: int, high: int, pairs: tuple[tuple[int, int], ...],
               start: int) -> int:
        if high <= start:
            return -1
        tops = self.tops
        for axis, amount in pairs:
            if tops[axis][i] < amount:
                return -1
        if high - low == 1:
            return low
        middle = (low + high) // 2
        found = self._first(2 * i, low, middle, pairs, start)
        return found if found >= 0 else self._first(2 * i + 1, middle, high, pairs, start)
