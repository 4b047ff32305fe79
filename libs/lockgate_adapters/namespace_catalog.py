"""Postgres reads and writes of ephemeral namespace records for their creation and use
(migrations 005, 010).

Why its own module: creation (queue-store's admin API) writes the record before anything exists
in the cluster, so whatever is made there is always recorded; the queue copies and the Role
reconciler read the active ones. The garbage collector's transitions live with the collector.
Writers notify the change feed with `TABLE`, which wakes the queue copies (a namespace that may
use its queue, or no longer) and the Role reconciler.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from lockgate_adapters.postgres import AnyConnection, notify_changes

TABLE = "ephemeral_namespaces"
ACTIVE = "active"
CREATED_CAUSE = "created"

_COLUMNS = ("cluster, name, queue, jobset, service_account, state, ttl_seconds, expires_at,"
            " created_at, state_changed_at, trigger, failure_reason, attempts, next_attempt_at,"
            " deleted_at, max_queued")


@dataclass(frozen=True)
class EphemeralNamespace:
    cluster: str
    name: str
    queue: str
    jobset: str
    service_account: str
    state: str
    ttl_seconds: int | None
    expires_at: datetime | None
    created_at: datetime
    state_changed_at: datetime
    trigger: str | None
    failure_reason: str
    attempts: int
    next_attempt_at: datetime | None
    deleted_at: datetime | None
    # The job set's maximum time queued, as lockgate.max_queued.JobSetMaxQueued JSON; written on
    # the namespace as annotations the webhook stamps on its pods (migration 010).
    max_queued: dict[str, Any] | None = None

    def json(self) -> dict[str, Any]:
        values: dict[str, Any] = dict(self.__dict__)
        for key, value in values.items():
            if isinstance(value, datetime):
                values[key] = value.isoformat()
        return values


@dataclass(frozen=True)
class Transition:
    from_state: str | None
    to_state: str
    cause: str
    at: datetime

    def json(self) -> dict[str, Any]:
        return {"from_state": self.from_state, "to_state": self.to_state, "cause": self.cause,
                "at": self.at.isoformat()}


def _record(row: asyncpg.Record) -> EphemeralNamespace:
    values = dict(row.items())
    if isinstance(values.get("max_queued"), str):
        values["max_queued"] = json.loads(values["max_queued"])  # no jsonb codec on it
    return EphemeralNamespace(**values)


async def create_or_get(connection: AnyConnection, *, cluster: str, name: str, queue: str,
                        jobset: str, service_account: str,
                        ttl_seconds: int | None, max_queued: dict[str, Any] | None = None
                        ) -> tuple[EphemeralNamespace, bool]:
    """The record of (cluster, name), created active with its "created" transition unless it
    exists; returns it and whether this call created it (a retry finds the first one)."""
    async with connection.transaction():
        row = await connection.fetchrow(
            "INSERT INTO ephemeral_namespaces (cluster, name, queue, jobset, service_account,"  # noqa: S608
            " state, ttl_seconds, expires_at, max_queued) VALUES ($1, $2, $3, $4, $5, $6,"
            " $7::integer, CASE WHEN $7::integer IS NULL THEN NULL"
            " ELSE now() + make_interval(secs => $7::integer) END, $8::text::jsonb)"
            f" ON CONFLICT (cluster, name) DO NOTHING RETURNING {_COLUMNS}",
            cluster, name, queue, jobset, service_account, ACTIVE, ttl_seconds,
            None if max_queued is None else json.dumps(max_queued))
        if row is None:
            existing = await get(connection, cluster=cluster, name=name)
            assert existing is not None
            return existing, False
        await connection.execute(
            "INSERT INTO ephemeral_namespace_transitions (cluster, name, from_state, to_state,"
            " cause) VALUES ($1, $2, NULL, $3, $4)", cluster, name, ACTIVE, CREATED_CAUSE)
        await notify_changes(connection, TABLE)
    return _record(row), True


async def get(connection: AnyConnection, *, cluster: str,
              name: str) -> EphemeralNamespace | None:
    row = await connection.fetchrow(
        f"SELECT {_COLUMNS} FROM ephemeral_namespaces WHERE cluster = $1 AND name = $2",  # noqa: S608
        cluster, name)
    return None if row is None else _record(row)


async def find(connection: AnyConnection, name: str) -> list[EphemeralNamespace]:
    """Records of namespace `name` in any cluster."""
    rows = await connection.fetch(
        f"SELECT {_COLUMNS} FROM ephemeral_namespaces WHERE name = $1 ORDER BY cluster",  # noqa: S608
        name)
    return [_record(row) for row in rows]


async def list_records(connection: AnyConnection, *, queue: str | None = None,
                       jobset: str | None = None, cluster: str | None = None,
                       state: str | None = None) -> list[EphemeralNamespace]:
    rows = await connection.fetch(
        f"SELECT {_COLUMNS} FROM ephemeral_namespaces"  # noqa: S608
        " WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR jobset = $2)"
        " AND ($3::text IS NULL OR cluster = $3) AND ($4::text IS NULL OR state = $4)"
        " ORDER BY created_at, cluster, name", queue, jobset, cluster, state)
    return [_record(row) for row in rows]


async def transitions(connection: AnyConnection, *, cluster: str,
                      name: str) -> list[Transition]:
    rows = await connection.fetch(
        "SELECT from_state, to_state, cause, at FROM ephemeral_namespace_transitions"
        " WHERE cluster = $1 AND name = $2 ORDER BY id", cluster, name)
    return [Transition(**dict(row.items())) for row in rows]


async def active_names_by_cluster(connection: AnyConnection) -> dict[str, dict[str, list[str]]]:
    """cluster → queue → names of its active ephemeral namespaces there."""
    rows = await connection.fetch(
        "SELECT cluster, queue, name FROM ephemeral_namespaces WHERE state = $1"
        " ORDER BY cluster, queue, name", ACTIVE)
    found: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        found.setdefault(row["cluster"], {}).setdefault(row["queue"], []).append(row["name"])
    return found
