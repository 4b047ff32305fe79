"""The scheduler leader's record of every pod it removes (table `evictions`, migration 009).

Why a record first: a removal cannot be undone, so it is written, on the leader's own connection
(a leader that lost its session cannot write), before the notice that makes the ungater act is
published; a new leader re-publishes what was recorded and not yet carried out. One row per pod
(`UNIQUE (cluster, uid)`): planning the same pod again finds the row and records nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from lockgate.jobs import TERMINAL_STATES

_TERMINAL = [state.value for state in TERMINAL_STATES]


@dataclass(frozen=True, slots=True)
class PlannedRemoval:
    eviction_id: str
    cluster: str
    uid: str
    kind: str  # preempted | group_timeout
    action: str  # delete | fail
    message: str
    for_queue: str | None = None
    for_uid: str | None = None


@dataclass(frozen=True, slots=True)
class RecordedRemoval:
    eviction_id: str
    cluster: str
    uid: str
    namespace: str
    name: str
    queue: str
    kind: str
    action: str
    message: str
    decided_at: datetime


_RETURNED = "eviction_id, cluster, uid, namespace, name, queue, kind, action, message, decided_at"


async def record_removals(connection: asyncpg.Connection, planned: Sequence[PlannedRemoval], *,
                          decided_at: datetime, decided_by: str) -> list[RecordedRemoval]:
    """Record the removals of pods whose jobs are still unfinished and not already recorded;
    returns those recorded now."""
    if not planned:
        return []
    rows = await connection.fetch(
        "INSERT INTO evictions (eviction_id, cluster, uid, namespace, name, queue, kind, action,"  # noqa: S608 - a constant column list
        " for_queue, for_uid, message, decided_at, decided_by)"
        " SELECT p.id, j.cluster, j.uid, j.namespace, j.name, j.queue, p.kind, p.action,"
        " p.for_queue, p.for_uid, p.message, $9, $10"
        " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],"
        " $7::text[], $8::text[]) AS p(id, cluster, uid, kind, action, message, for_queue,"
        " for_uid)"
        " JOIN jobs j ON j.cluster = p.cluster AND j.uid = p.uid"
        " WHERE j.state <> ALL($11::text[])"
        " ON CONFLICT (cluster, uid) DO NOTHING"
        f" RETURNING {_RETURNED}",
        [p.eviction_id for p in planned], [p.cluster for p in planned],
        [p.uid for p in planned], [p.kind for p in planned], [p.action for p in planned],
        [p.message for p in planned], [p.for_queue for p in planned],
        [p.for_uid for p in planned], decided_at, decided_by, _TERMINAL,
    )
    return [RecordedRemoval(**dict(row.items())) for row in rows]


async def mark_removals_published(connection: asyncpg.Connection, ids: Sequence[str],
                                  at: datetime) -> None:
    await connection.execute(
        "UPDATE evictions SET published_at = $2 WHERE eviction_id = ANY($1::text[])",
        list(ids), at)


async def removals_in_flight(connection: asyncpg.Connection) -> list[tuple[RecordedRemoval,
                                                                            datetime | None]]:
    """Recorded removals whose job is not finished yet, with when each was published."""
    rows = await connection.fetch(
        "SELECT e.eviction_id, e.cluster, e.uid, e.namespace, e.name, e.queue, e.kind,"
        " e.action, e.message, e.decided_at, e.published_at"
        " FROM evictions e JOIN jobs j ON j.cluster = e.cluster AND j.uid = e.uid"
        " WHERE j.state <> ALL($1::text[]) ORDER BY e.decided_at",
        _TERMINAL)
    result = []
    for row in rows:
        values = dict(row.items())
        published = values.pop("published_at")
        result.append((RecordedRemoval(**values), published))
    return result


def due_again(published_at: datetime | None, *, now: datetime, after: timedelta) -> bool:
    """Unpublished, or published long ago and the pod is still there: publish again."""
    return published_at is None or now - published_at > after
