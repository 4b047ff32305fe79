"""The scheduler leader's durable record of decayed usage (table `decayed_usage`, migration 036),
and what it rebuilds it from when the record is lost (the jobs' own times).

Why stored: usage that decays is the memory of who held what over days; a leader failover must
not wipe it (the new leader would treat a queue that held the fleet all morning as idle). The
leader writes each leaf's usage periodically and when it steps down, on its own connection (a
leader that lost its session cannot write); a new leader restores it and covers the gap since
with what queues hold when it loads.

How faithful a rebuild is (`runs_since`): each job row keeps when it was released (or, for a
pod that skipped the gate, when it ran) and when it finished, and its requests; a rebuild
integrates every such run's dominant share with decay, exactly as the leader would have. It
differs from what a leader kept in these ways only: shares are taken of the pool as it is at
the rebuild (not as it was then); a job whose finish time was never recorded counts until its
row last changed state; a pod that held room without a row (none should) is missed; and runs
older than `REBUILD_HALF_LIVES` half-lives are left out (together they weigh under 0.1%).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from lockgate.jobs import TERMINAL_STATES

_TERMINAL = [state.value for state in TERMINAL_STATES]

# A run that ended this many half-lives ago weighs at most 2^-10 of what it did: left out.
REBUILD_HALF_LIVES = 10


@dataclass(frozen=True, slots=True)
class StoredUsage:
    """Each leaf's decayed usage as the last leader stored it."""

    leaves: Mapping[str, float]
    half_life_seconds: float
    as_of: datetime
    saved_by: str


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One job's run as its row keeps it: its queue, requests (canonical units), from when it
    held room (released, or running for a pod that skipped the gate) until when (None: still)."""

    queue: str
    requests: Mapping[str, int]
    since: datetime
    until: datetime | None


async def load_usage(connection: asyncpg.Connection) -> StoredUsage | None:
    """The last stored usage, or None when nothing is stored (or the rows disagree on their
    half-life or time, which one save never writes: then rebuilding is safer)."""
    rows = await connection.fetch(
        "SELECT queue, usage, half_life_seconds, as_of, saved_by FROM decayed_usage")
    if not rows:
        return None
    half_lives = {row["half_life_seconds"] for row in rows}
    times = {row["as_of"] for row in rows}
    if len(half_lives) != 1 or len(times) != 1:
        return None
    return StoredUsage(leaves={row["queue"]: float(row["usage"]) for row in rows},
                       half_life_seconds=float(half_lives.pop()), as_of=times.pop(),
                       saved_by=rows[0]["saved_by"])


async def save_usage(connection: asyncpg.Connection, *, leaves: Mapping[str, float],
                     half_life_seconds: float, as_of: datetime, saved_by: str) -> None:
    """Replace the stored usage with `leaves` (one transaction: a reader sees one save)."""
    names = sorted(leaves)
    async with connection.transaction():
        await connection.execute("DELETE FROM decayed_usage")
        if names:
            await connection.execute(
                "INSERT INTO decayed_usage (queue, usage, half_life_seconds, as_of, saved_by)"
                " SELECT queue, usage, $3, $4, $5"
                " FROM unnest($1::text[], $2::float8[]) AS u(queue, usage)",
                names, [leaves[name] for name in names], half_life_seconds, as_of, saved_by)


async def runs_since(connection: asyncpg.Connection, since: datetime) -> list[RunRecord]:
    """Every job that held room at some moment after `since`: what a rebuild integrates."""
    rows = await connection.fetch(
        "SELECT queue, requests, COALESCE(released_at, ungated_at, running_at) AS held_since,"
        " CASE WHEN state = ANY($1::text[]) THEN COALESCE(finished_at, state_changed_at)"
        " END AS held_until"
        " FROM jobs"
        " WHERE COALESCE(released_at, ungated_at, running_at) IS NOT NULL"
        " AND (state <> ALL($1::text[]) OR COALESCE(finished_at, state_changed_at) > $2)",
        _TERMINAL, since)
    return [RunRecord(queue=row["queue"], requests=_requests(row["requests"]),
                      since=row["held_since"], until=row["held_until"]) for row in rows]


def _requests(value: Any) -> dict[str, int]:
    decoded = json.loads(value) if isinstance(value, str) else value
    return {str(name): int(amount) for name, amount in (decoded or {}).items()}

