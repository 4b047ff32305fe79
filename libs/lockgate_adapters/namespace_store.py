"""Postgres reads and writes of ephemeral namespace records: their creation, their collection
(migrations 005, 010) and job-set cancels.

Creation (queue-store's admin API) writes the record before anything exists in the cluster, so
whatever is made there is always recorded; the queue copies and the Role reconciler read the
active ones, woken through the change feed (`TABLE`).

A record and its history change together or not at all (the row and its transition in one
statement pair, inside the caller's transaction), and every collection writer locks the row
first, so several queue-store replicas never step on one record at once (`SKIP LOCKED` hands each
due record to one of them). A collected record's `serial` takes a new value like every other
changed row (no reader follows these rows through the change feed). Cancelling a job set changes
jobs: it stamps them for the change feed (`writer_xid`) and locks them sorted by key before its
cancellation row (job_store's global lock order).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from lockgate.events import JobSetCommand
from lockgate.jobs import TERMINAL_STATES, JobState
from lockgate.namespaces import (
    Change,
    JobSetActivity,
    NamespaceRecord,
    NamespaceState,
    Transition,
    Trigger,
)
from lockgate_adapters.postgres import AnyConnection, notify_changes

TABLE = "ephemeral_namespaces"
CREATED_CAUSE = "created"

_TERMINAL = [state.value for state in TERMINAL_STATES]
_RECORD_COLUMNS = ("cluster, name, queue, jobset, state, created_at, state_changed_at,"
                   " expires_at, trigger, failure_reason, attempts, next_attempt_at, deleted_at,"
                   " service_account, ttl_seconds, max_queued")
_COLLECTING = [NamespaceState.EXPIRING.value, NamespaceState.DELETING.value,
               NamespaceState.FAILED.value]


def _record(row: asyncpg.Record) -> NamespaceRecord:
    values: dict[str, Any] = {key: row[key] for key in
                              (c.strip() for c in _RECORD_COLUMNS.split(","))}
    values["state"] = NamespaceState(values["state"])
    values["trigger"] = Trigger(values["trigger"]) if values["trigger"] else None
    if isinstance(values["max_queued"], str):
        values["max_queued"] = json.loads(values["max_queued"])  # no jsonb codec on it
    return NamespaceRecord(**values)


async def create_or_get(connection: AnyConnection, *, cluster: str, name: str, queue: str,
                        jobset: str, service_account: str, ttl_seconds: int | None,
                        max_queued: dict[str, Any] | None = None
                        ) -> tuple[NamespaceRecord, bool]:
    """The record of (cluster, name), created active with its "created" transition unless it
    exists; returns it and whether this call created it (a retry finds the first one)."""
    async with connection.transaction():
        row = await connection.fetchrow(
            "INSERT INTO ephemeral_namespaces (cluster, name, queue, jobset, service_account,"  # noqa: S608
            " state, ttl_seconds, expires_at, max_queued) VALUES ($1, $2, $3, $4, $5, $6,"
            " $7::integer, CASE WHEN $7::integer IS NULL THEN NULL"
            " ELSE now() + make_interval(secs => $7::integer) END, $8::text::jsonb)"
            f" ON CONFLICT (cluster, name) DO NOTHING RETURNING {_RECORD_COLUMNS}",
            cluster, name, queue, jobset, service_account, NamespaceState.ACTIVE.value,
            ttl_seconds, None if max_queued is None else json.dumps(max_queued))
        if row is None:
            existing = await get(connection, cluster, name)
            assert existing is not None
            return existing, False
        await connection.execute(
            "INSERT INTO ephemeral_namespace_transitions (cluster, name, from_state, to_state,"
            " cause, at) VALUES ($1, $2, NULL, $3, $4, $5)",
            cluster, name, NamespaceState.ACTIVE.value, CREATED_CAUSE, row["created_at"])
        await notify_changes(connection, TABLE)
    return _record(row), True


async def get(connection: AnyConnection, cluster: str, name: str, *,
              lock: bool = False) -> NamespaceRecord | None:
    row = await connection.fetchrow(
        f"SELECT {_RECORD_COLUMNS} FROM ephemeral_namespaces"  # noqa: S608
        " WHERE cluster = $1 AND name = $2" + (" FOR UPDATE" if lock else ""), cluster, name)
    return None if row is None else _record(row)


async def list_records(connection: AnyConnection, *, queue: str | None = None,
                       jobset: str | None = None, cluster: str | None = None,
                       state: NamespaceState | None = None, offset: int = 0,
                       limit: int | None = None) -> list[NamespaceRecord]:
    """Oldest first; `offset` and `limit` cut a page (None: all)."""
    rows = await connection.fetch(
        f"SELECT {_RECORD_COLUMNS} FROM ephemeral_namespaces"  # noqa: S608
        " WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR jobset = $2)"
        " AND ($3::text IS NULL OR cluster = $3) AND ($4::text IS NULL OR state = $4)"
        " ORDER BY created_at, cluster, name OFFSET $5 LIMIT $6", queue, jobset, cluster,
        None if state is None else state.value, offset, limit)
    return [_record(row) for row in rows]


async def count_records(connection: AnyConnection, *, queue: str | None = None,
                        jobset: str | None = None, cluster: str | None = None,
                        state: NamespaceState | None = None) -> int:
    return int(await connection.fetchval(
        "SELECT count(*) FROM ephemeral_namespaces"
        " WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR jobset = $2)"
        " AND ($3::text IS NULL OR cluster = $3) AND ($4::text IS NULL OR state = $4)",
        queue, jobset, cluster, None if state is None else state.value))


async def active_names_by_cluster(connection: AnyConnection) -> dict[str, dict[str, list[str]]]:
    """cluster → queue → names of its active ephemeral namespaces there."""
    rows = await connection.fetch(
        "SELECT cluster, queue, name FROM ephemeral_namespaces WHERE state = $1"
        " ORDER BY cluster, queue, name", NamespaceState.ACTIVE.value)
    found: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        found.setdefault(row["cluster"], {}).setdefault(row["queue"], []).append(row["name"])
    return found


async def transitions(connection: AnyConnection, cluster: str,
                      name: str) -> list[Transition]:
    rows = await connection.fetch(
        "SELECT cluster, name, from_state, to_state, cause, at"
        " FROM ephemeral_namespace_transitions WHERE cluster = $1 AND name = $2 ORDER BY id",
        cluster, name)
    return [Transition(r["cluster"], r["name"],
                       NamespaceState(r["from_state"]) if r["from_state"] else None,
                       NamespaceState(r["to_state"]), r["cause"], r["at"]) for r in rows]


async def write_change(connection: AnyConnection, change: Change) -> None:
    """Store a record after a step, and its transition if it has one (inside a transaction
    that locked the row)."""
    record = change.record
    await connection.execute(
        "UPDATE ephemeral_namespaces SET state = $3, state_changed_at = $4, trigger = $5,"
        " failure_reason = $6, attempts = $7, next_attempt_at = $8, deleted_at = $9,"
        " serial = nextval('change_serial') WHERE cluster = $1 AND name = $2",
        record.cluster, record.name, record.state.value, record.state_changed_at,
        record.trigger.value if record.trigger else None, record.failure_reason,
        record.attempts, record.next_attempt_at, record.deleted_at)
    if change.transition is not None:
        t = change.transition
        await connection.execute(
            "INSERT INTO ephemeral_namespace_transitions (cluster, name, from_state, to_state,"
            " cause, at) VALUES ($1, $2, $3, $4, $5, $6)",
            t.cluster, t.name, t.from_state.value if t.from_state else None, t.to_state.value,
            t.cause, t.at)


async def lock_due(connection: AnyConnection, *, cluster: str, now: datetime,
                   limit: int) -> list[NamespaceRecord]:
    """Records of `cluster` the collector should step now, locked; records another replica
    holds are skipped (it steps them)."""
    rows = await connection.fetch(
        f"SELECT {_RECORD_COLUMNS} FROM ephemeral_namespaces"  # noqa: S608
        " WHERE cluster = $1 AND state = ANY($2::text[])"
        " AND (next_attempt_at IS NULL OR next_attempt_at <= $3)"
        " ORDER BY next_attempt_at NULLS FIRST, name LIMIT $4 FOR UPDATE SKIP LOCKED",
        cluster, _COLLECTING, now, limit)
    return [_record(r) for r in rows]


async def clusters_with_due(connection: AnyConnection, now: datetime) -> list[str]:
    rows = await connection.fetch(
        "SELECT DISTINCT cluster FROM ephemeral_namespaces WHERE state = ANY($1::text[])"
        " AND (next_attempt_at IS NULL OR next_attempt_at <= $2) ORDER BY cluster",
        _COLLECTING, now)
    return [r["cluster"] for r in rows]


async def active_with_facts(
    connection: AnyConnection,
) -> list[tuple[NamespaceRecord, bool, JobSetActivity]]:
    """Every active record with what its triggers are judged by: whether its queue exists, and
    its job set's jobs (all clusters)."""
    rows = await connection.fetch(
        f"SELECT {', '.join('n.' + c.strip() for c in _RECORD_COLUMNS.split(','))},"  # noqa: S608
        " (q.name IS NOT NULL AND NOT q.deleted) AS queue_exists,"
        " COALESCE(j.jobs, 0) AS jobs, COALESCE(j.unfinished, 0) AS unfinished,"
        " j.last_finished_at"
        " FROM ephemeral_namespaces n"
        " LEFT JOIN queues q ON q.name = n.queue"
        " LEFT JOIN LATERAL (SELECT count(*) AS jobs,"
        "   count(*) FILTER (WHERE state <> ALL($1::text[])) AS unfinished,"
        "   max(COALESCE(finished_at, state_changed_at)) AS last_finished_at"
        "   FROM jobs WHERE jobs.queue = n.queue AND jobs.jobset = n.jobset) j ON true"
        " WHERE n.state = 'active' ORDER BY n.cluster, n.name",
        _TERMINAL)
    return [(_record(r), bool(r["queue_exists"]),
             JobSetActivity(jobs=int(r["jobs"]), unfinished=int(r["unfinished"]),
                            last_finished_at=r["last_finished_at"])) for r in rows]


async def of_jobset(connection: AnyConnection, queue: str,
                    jobset: str) -> list[NamespaceRecord]:
    rows = await connection.fetch(
        f"SELECT {_RECORD_COLUMNS} FROM ephemeral_namespaces"  # noqa: S608
        " WHERE queue = $1 AND jobset = $2 ORDER BY cluster, name", queue, jobset)
    return [_record(r) for r in rows]


async def lock_active_of_jobset(connection: AnyConnection, queue: str,
                                jobset: str) -> list[NamespaceRecord]:
    rows = await connection.fetch(
        f"SELECT {_RECORD_COLUMNS} FROM ephemeral_namespaces"  # noqa: S608
        " WHERE queue = $1 AND jobset = $2 AND state = 'active' ORDER BY cluster, name"
        " FOR UPDATE", queue, jobset)
    return [_record(r) for r in rows]


async def cancel_jobs(connection: AnyConnection, command: JobSetCommand) -> int:
    """Record the cancel (the first one of a job set wins) and set its unfinished jobs created
    before it (`JobSetCommand.covers`, as the ungaters judge their pods) to cancelled with the
    reason, as of the cancel's time; returns how many jobs this call cancelled (0 when repeated).

    A job whose pod finished before the cancel but whose event is stored after it (queue-store
    restarted, or behind) takes that outcome then (lockgate.ingest): the cancel's time, on the
    row, tells the two apart."""
    # The jobs first, sorted (job_store's global lock order); the statement below changes them.
    await connection.execute(
        "SELECT 1 FROM jobs WHERE queue = $1 AND jobset = $2 AND created_at < $3"
        " ORDER BY cluster, uid FOR UPDATE",
        command.queue, command.jobset, command.covers_created_before)
    await connection.execute(
        "INSERT INTO jobset_cancellations (queue, jobset, command_id, reason, requested_by,"
        " requested_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (queue, jobset) DO NOTHING",
        command.queue, command.jobset, command.command_id, command.reason,
        command.requested_by, command.at)
    # Jobs whose pods were deleted after the cancel was asked for were deleted by it: the
    # ungaters act on the same command, and their pods' deletion may be stored first.
    status = await connection.execute(
        "UPDATE jobs SET state = $3, last_reason = $4, state_changed_at = $7,"
        " finished_at = COALESCE(finished_at, $7), serial = nextval('change_serial'),"
        " writer_xid = pg_current_xact_id()::text::bigint"
        " WHERE queue = $1 AND jobset = $2 AND created_at < $8 AND (state <> ALL($5::text[])"
        " OR (state = $6 AND state_changed_at >= $7))",
        command.queue, command.jobset, JobState.CANCELLED.value,
        f"cancelled: {command.reason}", _TERMINAL, JobState.DELETED.value, command.at,
        command.covers_created_before)
    cancelled = int(status.split()[-1])
    if cancelled:
        await connection.execute(
            "UPDATE jobset_cancellations SET jobs_cancelled = jobs_cancelled + $3"
            " WHERE queue = $1 AND jobset = $2", command.queue, command.jobset, cancelled)
        await notify_changes(connection, "jobs")
    return cancelled


async def cancellation(connection: AnyConnection, queue: str,
                       jobset: str) -> dict[str, Any] | None:
    row = await connection.fetchrow(
        "SELECT queue, jobset, command_id, reason, requested_by, requested_at, applied_at,"
        " jobs_cancelled FROM jobset_cancellations WHERE queue = $1 AND jobset = $2",
        queue, jobset)
    return None if row is None else dict(row.items())


def transition_json(t: Transition) -> dict[str, Any]:
    return {"from_state": t.from_state.value if t.from_state else None,
            "to_state": t.to_state.value, "cause": t.cause, "at": t.at.isoformat()}


def record_json(r: NamespaceRecord) -> dict[str, Any]:
    """A record as every admin API answer gives it."""
    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {"cluster": r.cluster, "name": r.name, "queue": r.queue, "jobset": r.jobset,
            "service_account": r.service_account, "state": r.state.value,
            "ttl_seconds": r.ttl_seconds, "expires_at": iso(r.expires_at),
            "created_at": iso(r.created_at), "state_changed_at": iso(r.state_changed_at),
            "trigger": r.trigger.value if r.trigger else None,
            "failure_reason": r.failure_reason, "attempts": r.attempts,
            "next_attempt_at": iso(r.next_attempt_at), "deleted_at": iso(r.deleted_at),
            "max_queued": None if r.max_queued is None else dict(r.max_queued)}


__all__: Sequence[str] = (
    "TABLE",
    "active_names_by_cluster",
    "active_with_facts",
    "cancel_jobs",
    "cancellation",
    "clusters_with_due",
    "count_records",
    "create_or_get",
    "get",
    "list_records",
    "lock_active_of_jobset",
    "lock_due",
    "of_jobset",
    "record_json",
    "transition_json",
    "transitions",
    "write_change",
)
