"""Postgres for what each cluster's autoscaler may still add: one ClusterGrowth row per cluster.

Why its own module: the table (migration 035) has one writer (queue-store, from topic
lockgate.cluster-growth.v1) and one reader (the fair scheduler's leader), and its two rules live
in one statement each:
- newest wins: a picture older than the stored one (a redelivery, a batch replayed) changes
  nothing;
- the change feed (lockgate.change_feed) hears of a change, not of a refresh: serial and
  writer_xid move only when the picture (all but observed_at) changed, so the watcher's refresh
  every 30 s does not wake the leader or make it recompute fair targets.
Rows are written sorted by cluster (job_store's rule of one lock order), and nothing else locks
them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import asyncpg

from lockgate.events import ClusterGrowth
from lockgate_adapters.postgres import AnyConnection

# The row's writer is this transaction only when the picture changed (see the docstring).
_STORE = (
    "INSERT INTO cluster_growth AS g (cluster, observed_at, autoscaled, body)"
    " SELECT c, o, a, b::jsonb FROM unnest($1::text[], $2::timestamptz[], $3::bool[],"
    " $4::text[]) AS t(c, o, a, b) ORDER BY c"
    " ON CONFLICT (cluster) DO UPDATE SET observed_at = EXCLUDED.observed_at,"
    " autoscaled = EXCLUDED.autoscaled, body = EXCLUDED.body,"
    " serial = CASE WHEN g.autoscaled = EXCLUDED.autoscaled"
    " AND g.body - 'observed_at' = EXCLUDED.body - 'observed_at'"
    " THEN g.serial ELSE EXCLUDED.serial END,"
    " writer_xid = CASE WHEN g.autoscaled = EXCLUDED.autoscaled"
    " AND g.body - 'observed_at' = EXCLUDED.body - 'observed_at'"
    " THEN g.writer_xid ELSE EXCLUDED.writer_xid END"
    " WHERE g.observed_at < EXCLUDED.observed_at"
    " RETURNING cluster, writer_xid = pg_current_xact_id()::text::bigint AS changed"
)
GROWTH_COLUMNS = "cluster, body, serial"


def newest_per_cluster(pictures: Iterable[ClusterGrowth]) -> list[ClusterGrowth]:
    """The newest picture of each cluster (the first of equals), sorted by cluster."""
    newest: dict[str, ClusterGrowth] = {}
    for picture in pictures:
        kept = newest.get(picture.cluster)
        if kept is None or picture.observed_at > kept.observed_at:
            newest[picture.cluster] = picture
    return [newest[cluster] for cluster in sorted(newest)]


async def store_growth(connection: AnyConnection, pictures: Sequence[ClusterGrowth]
                       ) -> list[str]:
    """Store each cluster's newest picture unless an as new or newer one is stored; the
    clusters whose picture changed (the caller notifies the change feed for them)."""
    newest = newest_per_cluster(pictures)
    if not newest:
        return []
    rows = await connection.fetch(
        _STORE, [p.cluster for p in newest], [p.observed_at for p in newest],
        [p.autoscaled for p in newest], [p.model_dump_json() for p in newest])
    return sorted(r["cluster"] for r in rows if r["changed"])


def growth_of(record: asyncpg.Record) -> ClusterGrowth:
    """A row's picture (`GROWTH_COLUMNS`)."""
    body: Any = record["body"]
    if isinstance(body, str):  # a connection without the pool's jsonb codec
        return ClusterGrowth.model_validate_json(body)
    return ClusterGrowth.model_validate(body)
