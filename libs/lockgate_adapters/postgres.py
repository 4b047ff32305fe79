"""Postgres: connecting with retry, versioned migrations applied at start, change notification.

Why: every service that touches Postgres needs the same three things, and the schema must be at
the right version before any of them reads or writes. Migrations are plain SQL files named
NNN_name.sql beside this module, applied in order in one transaction each, under an advisory lock
so services starting together do not race.

Change feed (lockgate.change_feed, migration 032): writers stamp every row of jobs, queues and
cluster_nodes they change with their transaction id (`writer_xid`; an INSERT takes it by default,
an UPDATE sets it, with `serial = nextval('change_serial')` for ordering), then
`NOTIFY lockgate_changes`. They take no lock for the feed's sake and commit concurrently. Readers
(the fair scheduler, the web UI) load once and then fetch the rows written by transactions their
previous read's snapshot did not see as committed (`FeedCursor`). Writers that may lock the same
rows lock them in one global order (job_store's module docstring), so they never deadlock.

One service migrates: queue-store (its role owns the schema). The fair scheduler and the webhook
connect with roles of their own that may only read and write the rows they use (migration 003,
docs/security.md), so they wait for the schema (`wait_for_schema`) instead of migrating.

Databases of their own: tests, the demo and benchmarks share one Postgres server, and each runs
in a database it creates (`create_database`) and drops afterwards (`drop_database`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from importlib import resources
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from lockgate_adapters.retrying import Backoff, Stopped, retry
from lockgate_adapters.settings import RetryPolicy

log = logging.getLogger(__name__)

MIGRATIONS_LOCK = 7_310_001
# 7_310_002 was the global change-feed lock, gone with migration 032: do not reuse it while an
# older release may still run against the same database.
LEADER_LOCK = 7_310_003
CHANGES_CHANNEL = "lockgate_changes"
# Each service's own Postgres role, by service name; migration 003 grants each what it uses.
SERVICE_ROLES = {
    "queue-store": "lockgate_queue_store",
    "fair-scheduler": "lockgate_scheduler",
    "admission-webhook": "lockgate_webhook",
}

# A connection of its own or one borrowed from a pool (`async with pool.acquire()`).
AnyConnection = asyncpg.Connection | PoolConnectionProxy


def is_retryable_postgres_error(error: BaseException) -> bool:
    return isinstance(
        error,
        OSError
        | asyncio.TimeoutError
        | asyncpg.exceptions.ConnectionDoesNotExistError
        | asyncpg.exceptions.CannotConnectNowError
        | asyncpg.exceptions.TooManyConnectionsError
        | asyncpg.exceptions.SerializationError
        | asyncpg.exceptions.DeadlockDetectedError
        | asyncpg.exceptions.InterfaceError
        | asyncpg.exceptions.AdminShutdownError,
    )


async def connect_pool(
    dsn: str, *, policy: RetryPolicy, min_size: int = 1, max_size: int = 10,
    what: str = "postgres",
) -> asyncpg.Pool:
    """A pool, retried with backoff while Postgres is unreachable."""
    async def create() -> asyncpg.Pool:
        pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size,
                                         init=_init_connection)
        assert pool is not None
        return pool

    return await retry(create, backoff=Backoff(policy), retryable=is_retryable_postgres_error,
                       what=f"{what}: connecting", dependency="postgres")


async def _init_connection(connection: asyncpg.Connection) -> None:
    import json

    await connection.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads,
                                    schema="pg_catalog")


def _migrations() -> list[tuple[int, str, str]]:
    found = []
    for entry in resources.files("lockgate_adapters.migrations").iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text()))
    return sorted(found)


async def migrate(pool: asyncpg.Pool) -> list[str]:
    """Apply pending migrations; returns the names applied. Safe to call from many services."""
    applied: list[str] = []
    async with pool.acquire() as connection:
        await connection.execute("SELECT pg_advisory_lock($1)", MIGRATIONS_LOCK)
        try:
            await connection.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row["version"] for row in
                    await connection.fetch("SELECT version FROM schema_migrations")}
            for version, name, sql in _migrations():
                if version in done:
                    continue
                async with connection.transaction():
                    await connection.execute(sql)
                    await connection.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                        version, name,
                    )
                applied.append(name)
                log.info("applied migration %s", name)
        finally:
            await connection.execute("SELECT pg_advisory_unlock($1)", MIGRATIONS_LOCK)
    return applied


async def pending_migrations(connection: AnyConnection) -> list[str]:
    """Migrations this code knows that the database has not applied (all, if never migrated)."""
    try:
        done = {row["version"] for row in
                await connection.fetch("SELECT version FROM schema_migrations")}
    except asyncpg.exceptions.UndefinedTableError:
        done = set()
    return [name for version, name, _ in _migrations() if version not in done]


class NotMigratedError(Exception):
    """The database lacks migrations this code knows (queue-store applies them)."""


async def wait_for_schema(pool: asyncpg.Pool, *, policy: RetryPolicy,
                          what: str = "postgres") -> None:
    """Return once every migration is applied (by queue-store), retrying with backoff.

    For services whose role may not change the schema: they start whenever they like and
    begin work once queue-store has migrated.
    """
    async def migrated() -> None:
        async with pool.acquire() as connection:
            pending = await pending_migrations(connection)
        if pending:
            raise NotMigratedError(f"queue-store has yet to apply {', '.join(pending)}")

    await retry(migrated, backoff=Backoff(policy),
                retryable=lambda error: isinstance(error, NotMigratedError),
                what=f"{what}: waiting for the schema")


async def grant_service_roles(connection: AnyConnection) -> bool:
    """Grant the service roles that exist now what they use, in a migrated database (as its
    owner or a superuser; after creating roles). False if the database is not migrated yet:
    the migration then grants them."""
    exists = await connection.fetchval(
        "SELECT to_regprocedure('lockgate_grant_service_roles()') IS NOT NULL")
    if exists:
        await connection.execute("SELECT lockgate_grant_service_roles()")
    return bool(exists)


async def notify_changes(connection: AnyConnection, payload: str = "") -> None:
    await connection.execute("SELECT pg_notify($1, $2)", CHANGES_CHANNEL, payload)


async def watch_changes(dsn: str, tables: frozenset[str], changed: asyncio.Event,
                        stopping: asyncio.Event, *, name: str, retry_seconds: float) -> None:
    """Set `changed` whenever a writer notifies a change to one of `tables` (an empty payload
    counts as any), and once on every (re)connection, so changes made while not listening are
    caught up at once. Reconnects after about `retry_seconds` (whatever failed: periodic passes
    go on meanwhile, and cover the gap); returns when stopping."""
    def on_notification(_: object, __: int, ___: str, payload: object) -> None:
        if not payload or tables & set(str(payload).split(",")):
            changed.set()

    backoff = Backoff(RetryPolicy(initial_seconds=retry_seconds, max_seconds=retry_seconds),
                      stopping=stopping)

    async def listen() -> None:
        connection: asyncpg.Connection | None = None
        try:
            connection = await asyncpg.connect(dsn, timeout=10)
            lost = asyncio.Event()
            connection.add_termination_listener(lambda _, lost=lost: lost.set())
            await connection.add_listener(CHANGES_CHANNEL, on_notification)
            changed.set()
            backoff.reset()
            await lost.wait()
            raise ConnectionError("the listening connection was closed")
        finally:
            if connection is not None:
                await connection.close(timeout=1)

    with contextlib.suppress(Stopped):
        await retry(listen, backoff=backoff, retryable=lambda error: True,
                    what=f"{name}: change feed", dependency="postgres")


def record_to_dict(record: Any) -> dict[str, Any]:
    return dict(record.items())


# ---------------------------------------------------------------- databases of their own


def with_database(dsn: str, database: str) -> str:
    """`dsn` pointing at another database on the same server (user, host and options kept)."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


def database_of(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


async def create_database(dsn: str, database: str, *, template: str | None = None,
                          replace: bool = False) -> str:
    """Create `database` on `dsn`'s server, empty or as a copy of `template`; returns its DSN.

    `replace` drops a database of that name first (its connections are closed).
    """
    connection = await asyncpg.connect(dsn)
    try:
        if replace:
            await connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        copy = f' TEMPLATE "{template}"' if template else ""
        await connection.execute(f'CREATE DATABASE "{database}"{copy}')
    finally:
        await connection.close()
    return with_database(dsn, database)


async def drop_database(dsn: str, database: str) -> None:
    """Drop `database` on `dsn`'s server if it exists, closing its connections."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    finally:
        await connection.close()
