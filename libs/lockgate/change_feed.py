"""Where a reader of the change feed stands: the Postgres snapshot of its last read.

Why not a serial: a cursor of `serial > last seen` is only safe if serials become visible in
commit order, which took one global lock that every writer of jobs, queues and cluster_nodes
waited on (issue 19: writers scale out). Instead, every changed row records its writer's top-level
transaction id (`writer_xid`, migration 032) and the reader keeps the snapshot its last read was
taken in. A row version that read could not see was written by a transaction that snapshot did
not see as committed: one at or above its `xmax`, or one of its `in_progress` transactions. The
next read fetches exactly those (`unseen`), whatever order the writers commit in, with no lock.

Each read is one consistent snapshot, and each row version is delivered once, by the first read
whose snapshot sees it (a row version visible to the previous snapshot is never fetched again).
A long transaction anywhere on the server (other databases included: transaction ids are the
server's) stays in `in_progress` and costs one index probe per read, not a re-read of every row
changed since it began, as a cursor of `xmin` alone would.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FeedCursor:
    """The part of a snapshot (`pg_current_snapshot()`) the next read needs."""

    xmax: int  # every transaction id at or above this was not yet committed
    in_progress: tuple[int, ...] = ()  # below xmax, not yet committed either

    @classmethod
    def from_snapshot(cls, text: str) -> FeedCursor:
        """From a `pg_snapshot`'s text form, 'xmin:xmax:xip,xip,...'."""
        xmin, xmax, xip = text.split(":")
        in_progress = tuple(sorted(int(xid) for xid in xip.split(",") if xid))
        if not int(xmin) <= int(xmax) or any(not int(xmin) <= x < int(xmax)
                                              for x in in_progress):
            raise ValueError(f"not a snapshot: {text!r}")
        return cls(int(xmax), in_progress)

    def unseen(self, writer_xid: int) -> bool:
        """Whether a row version written by `writer_xid` was invisible to this snapshot."""
        return writer_xid >= self.xmax or writer_xid in self.in_progress


# Before any read: every row is unseen.
START = FeedCursor(0)
