"""Read-only Postgres views for operators: job sets, one pod's job and place in line, and each
queue's counts when no scheduler leader answers.

Why a module of its own: `lockgate status`, `lockgate explain` and `lockgate jobset list|describe`
read what the other writers keep, and change nothing. Why a pod waits is never worked out here:
only the fair-scheduler leader holds that picture (`lockgate.scheduler.report`), and queue-store
asks it; this module gives what Postgres alone can say (states, places in line, counts).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from lockgate.ingest import JobRow
from lockgate.jobs import TERMINAL_STATES, JobState
from lockgate.scheduler import PHASE_OF_STATE, PHASES
from lockgate_adapters import job_store
from lockgate_adapters.postgres import AnyConnection

_TERMINAL = [state.value for state in TERMINAL_STATES]


# The release order within a queue (lockgate.scheduler.explain): priority, then time in line
# (a kept place's, else the pod's creation: scheduler_store's in_line_since); ties by the key.
# Index jobs_queued_in_line (migration 031) serves it.
RELEASE_ORDER = "priority DESC, COALESCE(queued_since, created_at), cluster, uid"


async def queued_place(connection: AnyConnection, row: JobRow) -> tuple[int, int]:
    """(place, of how many) of a queued pod in its queue's release order.

    One pass over the queue's queued pods in index jobs_queued_in_line (not over every job):
    a pod's place is the count of those ahead of it."""
    in_line = row.in_line_since
    record = await connection.fetchrow(
        "SELECT count(*) FILTER (WHERE priority > $2 OR (priority = $2 AND"
        " (COALESCE(queued_since, created_at), cluster, uid) < ($3, $4, $5))) AS ahead,"
        " count(*) AS total FROM jobs WHERE queue = $1 AND state = 'queued'",
        row.queue, row.priority, in_line, row.cluster, row.uid)
    assert record is not None
    return int(record["ahead"]) + 1, int(record["total"])


async def queued_places(connection: AnyConnection, keys: Sequence[tuple[str, str]]
                        ) -> dict[tuple[str, str], tuple[int, int]]:
    """`queued_place` of many pods at once, by (cluster, uid); pods not queued are missing.

    One walk of each asked queue's line in index jobs_queued_in_line (the release order
    above), whatever the number of pods asked in it: the leader asks it for the pods it tells
    why they wait, at most a notice round's worth, spread over a few queues."""
    if not keys:
        return {}
    rows = await connection.fetch(
        "WITH asked AS (SELECT j.queue, j.cluster, j.uid FROM jobs j"
        "  JOIN unnest($1::text[], $2::text[]) AS k(cluster, uid) USING (cluster, uid)"
        "  WHERE j.state = 'queued'),"
        " line AS (SELECT cluster, uid,"
        # RELEASE_ORDER, written out (the integration test holds the two places equal).
        "  row_number() OVER (PARTITION BY queue ORDER BY priority DESC,"
        "   COALESCE(queued_since, created_at), cluster, uid) AS place,"
        "  count(*) OVER (PARTITION BY queue) AS total"
        "  FROM jobs WHERE state = 'queued' AND queue IN (SELECT queue FROM asked))"
        " SELECT line.cluster, line.uid, line.place, line.total"
        " FROM line JOIN asked USING (cluster, uid)",
        [cluster for cluster, _ in keys], [uid for _, uid in keys])
    return {(r["cluster"], r["uid"]): (int(r["place"]), int(r["total"])) for r in rows}


async def oldest_in_line(connection: AnyConnection, queues: Iterable[str]) -> dict[str, datetime]:
    """When each queue's longest-waiting queued pod joined the line (a kept place's time, else
    its creation): one index probe per queue (jobs_in_line_since, migration 033)."""
    records = await connection.fetch(
        "SELECT q.name, (SELECT min(COALESCE(queued_since, created_at)) FROM jobs"
        "  WHERE queue = q.name AND state = 'queued') AS oldest"
        " FROM unnest($1::text[]) AS q(name)", sorted(set(queues)))
    return {r["name"]: r["oldest"] for r in records if r["oldest"] is not None}


async def skipped_gate_counts(connection: AnyConnection) -> dict[str, int]:
    """Each queue's unfinished pods that lockgate never gated (lockgate.observing), which hold
    its usage: one probe of a small partial index (jobs_skipped_gate_unfinished, migration
    034)."""
    records = await connection.fetch(
        "SELECT queue, count(*) AS n FROM jobs WHERE skipped_gate"
        " AND state NOT IN ('succeeded', 'failed', 'deleted', 'cancelled') GROUP BY queue")
    return {r["queue"]: int(r["n"]) for r in records}


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """A queue as Postgres alone sees it, when no scheduler leader answers."""

    name: str
    defined: bool
    cordoned: bool
    weight: float | None
    max_queued_seconds: float | None
    by_phase: dict[str, int]


async def queue_counts(connection: AnyConnection) -> list[QueueCounts]:
    """Every defined queue, and every queue unfinished pods name, with its pods by phase
    (queued, released, running): a pass over the unfinished jobs, for when the leader (which
    keeps these counts) does not answer."""
    specs = {spec.name: spec for spec in await job_store.list_queues(connection)}
    records = await connection.fetch(
        "SELECT queue, state, count(*) AS n FROM jobs WHERE state <> ALL($1::text[])"
        " GROUP BY queue, state", _TERMINAL)
    phases: dict[str, dict[str, int]] = {}
    for record in records:
        phase = PHASE_OF_STATE.get(JobState(record["state"]))
        if phase is not None:
            counts = phases.setdefault(record["queue"], dict.fromkeys(PHASES, 0))
            counts[phase] += int(record["n"])
    found = []
    for name in sorted({*specs, *phases}):
        spec = specs.get(name)
        found.append(QueueCounts(
            name=name, defined=spec is not None, cordoned=spec is not None and spec.cordoned,
            weight=None if spec is None else 1.0 / spec.priority_factor,
            max_queued_seconds=None if spec is None or spec.max_queued is None
            else spec.max_queued.seconds,
            by_phase=phases.get(name, dict.fromkeys(PHASES, 0))))
    return found


async def find_job(connection: AnyConnection, *, cluster: str, namespace: str,
                   name: str) -> JobRow | None:
    """The pod's job: its unfinished one if any, else its newest (a name may be reused)."""
    record = await connection.fetchrow(
        f"SELECT {job_store._JOB_COLUMNS} FROM jobs"  # noqa: S608 - constant columns
        " WHERE cluster = $1 AND namespace = $2 AND name = $3"
        " ORDER BY (state = ANY($4::text[])), created_at DESC LIMIT 1",
        cluster, namespace, name, _TERMINAL)
    return None if record is None else job_store._job_row(record)


@dataclass(frozen=True, slots=True)
class JobSetSummary:
    queue: str
    jobset: str
    clusters: tuple[str, ...]
    namespaces: tuple[str, ...]
    by_state: dict[str, int]
    oldest_queued_at: datetime | None
    first_created_at: datetime
    last_changed_at: datetime

    def as_json(self) -> dict[str, Any]:
        unfinished = sum(n for s, n in self.by_state.items() if s not in _TERMINAL)
        return {
            "queue": self.queue, "jobset": self.jobset, "clusters": list(self.clusters),
            "namespaces": list(self.namespaces), "pods": sum(self.by_state.values()),
            "unfinished": unfinished, "by_state": self.by_state,
            "oldest_queued_at": None if self.oldest_queued_at is None
            else self.oldest_queued_at.isoformat(),
            "first_created_at": self.first_created_at.isoformat(),
            "last_changed_at": self.last_changed_at.isoformat(),
        }


_JOBSET_SUMMARY = (
    "SELECT queue, jobset, array_agg(DISTINCT cluster ORDER BY cluster) AS clusters,"
    " array_agg(DISTINCT namespace ORDER BY namespace) AS namespaces,"
    " jsonb_object_agg(state, n) AS by_state, min(oldest_queued) AS oldest_queued_at,"
    " min(first_created) AS first_created_at, max(last_changed) AS last_changed_at"
    " FROM (SELECT queue, jobset, state, cluster, namespace, count(*) OVER w AS n,"
    "  min(created_at) FILTER (WHERE state = 'queued') OVER w AS oldest_queued,"
    "  min(created_at) OVER w AS first_created, max(state_changed_at) OVER w AS last_changed"
    "  FROM jobs WHERE {where}"
    "  WINDOW w AS (PARTITION BY queue, jobset, state)) per_state"
    " GROUP BY queue, jobset ORDER BY queue, jobset LIMIT {limit} OFFSET {offset}"
)


async def list_jobsets(connection: AnyConnection, *, queue: str | None,
                       include_finished: bool, limit: int,
                       offset: int = 0) -> list[JobSetSummary]:
    """Job sets with their pods counted by state; by default only those with unfinished pods."""
    if queue is not None:
        names = await _jobset_names(connection, queue=queue, unfinished=not include_finished,
                                    limit=limit, offset=offset)
        if not names:
            return []
        records = await connection.fetch(_JOBSET_SUMMARY.format(
            where="queue = $1 AND jobset = ANY($2::text[])", limit=len(names), offset=0),
            queue, names)
        return [_summary(r) for r in records]
    where = "($1::text IS NULL OR queue = $1)"
    if not include_finished:
        where += (" AND (queue, jobset) IN (SELECT queue, jobset FROM jobs"
                  " WHERE state <> ALL($2::text[]))")
    else:
        where += " AND $2::text[] IS NOT NULL"
    records = await connection.fetch(
        _JOBSET_SUMMARY.format(where=where, limit=int(limit), offset=int(offset)), queue,
        _TERMINAL)
    return [_summary(r) for r in records]


# One job set name after another in index order (a "skip scan": each step is one index probe),
# so a page of a queue's job sets costs its page, not a pass over the queue's pods. Postgres
# evaluates the recursion only as far as the outer LIMIT asks.
_JOBSET_NAMES = (
    "WITH RECURSIVE names AS ("
    " (SELECT jobset FROM jobs WHERE queue = $1{unfinished} ORDER BY jobset LIMIT 1)"
    " UNION ALL"
    " SELECT (SELECT j.jobset FROM jobs j WHERE j.queue = $1{unfinished_j}"
    "  AND j.jobset > names.jobset ORDER BY j.jobset LIMIT 1)"
    " FROM names WHERE names.jobset IS NOT NULL)"
    " SELECT jobset FROM names WHERE jobset IS NOT NULL OFFSET $2 LIMIT $3"
)
# Spelled as jobs_unfinished_jobsets' predicate (migration 016), so the planner uses it.
_UNFINISHED = " AND {alias}state NOT IN ('succeeded', 'failed', 'deleted', 'cancelled')"


async def _jobset_names(connection: AnyConnection, *, queue: str, unfinished: bool,
                        limit: int, offset: int) -> list[str]:
    sql = _JOBSET_NAMES.format(
        unfinished=_UNFINISHED.format(alias="") if unfinished else "",
        unfinished_j=_UNFINISHED.format(alias="j.") if unfinished else "")
    records = await connection.fetch(sql, queue, offset, limit)
    return [r["jobset"] for r in records]


async def get_jobset(connection: AnyConnection, *, queue: str,
                     jobset: str) -> JobSetSummary | None:
    records = await connection.fetch(
        _JOBSET_SUMMARY.format(where="queue = $1 AND jobset = $2", limit=1, offset=0), queue,
        jobset)
    return _summary(records[0]) if records else None


def _summary(record: asyncpg.Record) -> JobSetSummary:
    by_state = record["by_state"]
    if isinstance(by_state, str):  # a connection without the pool's jsonb codec
        by_state = json.loads(by_state)
    return JobSetSummary(
        queue=record["queue"], jobset=record["jobset"], clusters=tuple(record["clusters"]),
        namespaces=tuple(record["namespaces"]),
        by_state={str(k): int(v) for k, v in sorted(by_state.items())},
        oldest_queued_at=record["oldest_queued_at"],
        first_created_at=record["first_created_at"], last_changed_at=record["last_changed_at"])
