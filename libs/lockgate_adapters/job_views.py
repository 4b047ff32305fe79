"""Read-only Postgres views for operators: job sets, one pod's job, and the scheduler's picture.

Why a module of its own: `lockgate status`, `lockgate explain` and `lockgate jobset list|describe`
read what the other writers keep, and change nothing. `scheduler_view` loads the same rows the
fair-scheduler leader loads (one snapshot) through the same hold-out feed into a
`SchedulerState`, so `lockgate explain` reasons over the same picture as the Events the leader
sends. It costs one pass over the unfinished
jobs, which is fine for a command a person runs, not for a loop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import asyncpg

from lockgate.ingest import JobRow
from lockgate.jobs import TERMINAL_STATES
from lockgate.scheduler import Feed, FeedPolicy, SchedulerState
from lockgate_adapters import job_store
from lockgate_adapters import scheduler_store as store
from lockgate_adapters.postgres import AnyConnection

_TERMINAL = [state.value for state in TERMINAL_STATES]


async def scheduler_view(connection: AnyConnection, *, fairness_resources: Iterable[str],
                         policy: FeedPolicy) -> Feed:
    """Queues, present nodes and unfinished jobs as the scheduler leader holds them: loaded
    through the same hold-out policy (`lockgate.scheduler.feed`: expired, backing off, given
    up, controller holds) over the same fairness resources, so `lockgate status` and
    `lockgate explain` say what the scheduler does."""
    feed, _ = await load_view(connection, fairness_resources=fairness_resources, policy=policy)
    return feed


async def load_view(connection: AnyConnection, *, fairness_resources: Iterable[str],
                    policy: FeedPolicy) -> tuple[Feed, store.Changes]:
    """`scheduler_view`, and the rows it was loaded from (their `cursor` is what
    `apply_changes` goes on from)."""
    # A pooled connection proxies every method load_everything uses.
    everything = await store.load_everything(cast(asyncpg.Connection, connection))
    now = time.time()
    feed = Feed(SchedulerState(fairness_resources), policy)
    feed.load_backoffs(everything.backoffs, now)
    apply_changes(feed, everything, now=now)
    return feed, everything


def apply_changes(feed: Feed, changes: store.Changes, *, now: float) -> None:
    """Rows loaded or changed (`scheduler_store.changes_since`), through the feed's policy."""
    for queue in changes.queues:
        feed.apply_queue(queue.name, queue.spec)
    for node in changes.nodes:
        feed.apply_node(node.cluster, node.node, node.info)
    feed.apply_jobs(changes.jobs, now=now, returned={
        job_id: (releases, at.timestamp())
        for job_id, (releases, at) in changes.returned.items()})
    feed.end_due(now)
    feed.expire_all_due(now)


async def find_job(connection: AnyConnection, *, cluster: str, namespace: str,
                   name: str) -> JobRow | None:
    """The pod's job: its unfinished one if any, else its newest (a name may be reused)."""
    record = await connection.fetchrow(
        f"SELECT {job_store._JOB_COLUMNS} FROM jobs"  # noqa: S608 - constant columns
        " WHERE cluster = $1 AND namespace = $2 AND name = $3"
        " ORDER BY (state = ANY($4::text[])), created_at DESC LIMIT 1",
        cluster, namespace, name, _TERMINAL)
    return None if record is None else job_store._job_row(record)


async def release_times(connection: AnyConnection, *, queue: str, cluster: str,
                        window_seconds: float) -> list[float]:
    """When (epoch seconds) the queue's pods in the cluster were released within the last
    `window_seconds`, oldest first: the pace a wait estimate is made from
    (lockgate.wait_estimates)."""
    records = await connection.fetch(
        "SELECT extract(epoch FROM released_at)::float8 AS at FROM jobs"
        " WHERE queue = $1 AND cluster = $2"
        " AND released_at > now() - make_interval(secs => $3) ORDER BY released_at",
        queue, cluster, window_seconds)
    return [float(record["at"]) for record in records]


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
