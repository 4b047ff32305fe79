"""Databases of a test's own on the stack's Postgres server.

Why: tests share one server; rows one test writes must not be seen by another (nor by a service
another test runs), so a module or a test works in a database of its own, dropped afterwards.
Each new database is prepared for the services' own roles (devstack.roles): tests run the
services as those roles, proving the grants suffice.
A module that needs many migrated databases migrates one template and clones it per test
(CREATE DATABASE ... TEMPLATE), which is much faster than migrating each.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from devstack.roles import ensure_service_roles, prepare_database
from helpers.services import FAST_RETRY
from lockgate_adapters.postgres import (
    connect_pool,
    create_database,
    database_of,
    drop_database,
    migrate,
)


@contextlib.asynccontextmanager
async def fresh_database(server_dsn: str, *, prefix: str, template: str | None = None,
                         migrated: bool = False) -> AsyncIterator[str]:
    """A new database on `server_dsn`'s server, dropped afterwards; yields its DSN.

    Empty, or a copy of the database at `template` (a DSN nobody is connected to), and
    `migrated` to lockgate's schema if asked.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await ensure_service_roles(server_dsn)  # before migrating, so the migration grants them
    dsn = await create_database(server_dsn, name,
                                template=database_of(template) if template else None)
    try:
        await prepare_database(dsn)
        if migrated:
            await migrate_database(dsn)
        yield dsn
    finally:
        await drop_database(server_dsn, name)


async def migrate_database(dsn: str) -> None:
    pool = await connect_pool(dsn, policy=FAST_RETRY, min_size=1, max_size=1)
    try:
        await migrate(pool)
    finally:
        await pool.close()
