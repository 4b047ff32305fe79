"""Each service's own Postgres role on the local stack, as an operator would set them up.

Why here: roles belong to the whole Postgres server and need a superuser to create, while their
grants belong to each database (migration 003 makes them). Local runs and tests create many
databases on one server, so the roles are created once (idempotently, by whoever gets there
first) and every new database is prepared for them: queue-store's role may create the schema in
it, and a database migrated before the roles existed gets its grants.
"""

from __future__ import annotations

import contextlib
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

from lockgate_adapters.postgres import SERVICE_ROLES, grant_service_roles

_ensured: set[str] = set()


def role_password(role: str) -> str:
    """The local stack's password of a service role (Postgres listens on 127.0.0.1 only)."""
    return f"{role}-local"


def service_dsn(dsn: str, service: str) -> str:
    """`dsn` (any user, same server and database) as `service`'s own role."""
    role = SERVICE_ROLES[service]
    parts = urlsplit(dsn)
    hostport = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(
        netloc=f"{role}:{quote(role_password(role), safe='')}@{hostport}"))


async def ensure_service_roles(superuser_dsn: str) -> None:
    """Create the service roles that are missing on `superuser_dsn`'s server (login, password)."""
    server = superuser_dsn.rpartition("@")[2].partition("/")[0]
    if server in _ensured:
        return
    connection = await asyncpg.connect(superuser_dsn)
    try:
        existing = {row["rolname"] for row in await connection.fetch(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY($1::text[])",
            list(SERVICE_ROLES.values()))}
        for role in SERVICE_ROLES.values():
            if role in existing:
                continue
            # Another test or run may create it meanwhile.
            with contextlib.suppress(asyncpg.exceptions.DuplicateObjectError,
                                     asyncpg.exceptions.UniqueViolationError):
                # Identifiers and the password are ours (no user input): safe to inline.
                await connection.execute(
                    f"CREATE ROLE {role} LOGIN PASSWORD '{role_password(role)}'")
    finally:
        await connection.close()
    _ensured.add(server)


async def prepare_database(superuser_database_dsn: str) -> None:
    """Let the service roles work in this database: queue-store's may create the schema; if it
    is migrated already, the roles get their grants."""
    await ensure_service_roles(superuser_database_dsn)
    connection = await asyncpg.connect(superuser_database_dsn)
    try:
        await connection.execute(
            f"GRANT USAGE, CREATE ON SCHEMA public TO {SERVICE_ROLES['queue-store']}")
        await grant_service_roles(connection)
    finally:
        await connection.close()
