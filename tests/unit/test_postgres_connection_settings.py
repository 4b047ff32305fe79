"""Postgres TLS and credentials settings reach asyncpg: what a service sends when it connects.

A fake server on loopback reads the first message asyncpg sends: an SSLRequest when TLS is asked
for, the plain startup message when it is disabled. No Postgres needed: this is about our
settings reaching the client, not about Postgres.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from lockgate_adapters.settings import ServiceSettings

SSL_REQUEST = 80877103
PROTOCOL_3 = 196608


class PgSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LOCKGATE_PGTEST_")
    service_name: ClassVar[str] = "pg-test"


@contextlib.asynccontextmanager
async def first_message_server() -> AsyncIterator[tuple[int, list[int]]]:
    """A server that records the code of each client's first message and refuses TLS."""
    codes: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            _, code = struct.unpack("!ii", await reader.readexactly(8))
            codes.append(code)
            if code == SSL_REQUEST:
                writer.write(b"N")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], codes
    finally:
        server.close()
        await server.wait_closed()


async def test_sslmode_require_makes_asyncpg_ask_for_tls_and_refuse_plaintext(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with first_message_server() as (port, codes):
        monkeypatch.setenv("LOCKGATE_POSTGRES_DSN", f"postgresql://u:p@127.0.0.1:{port}/db")
        monkeypatch.setenv("LOCKGATE_POSTGRES_SSLMODE", "require")
        settings = PgSettings()
        assert parse_qs(urlsplit(settings.postgres_dsn).query) == {"sslmode": ["require"]}
        with pytest.raises(ConnectionError, match="rejected SSL upgrade"):
            await asyncpg.connect(settings.postgres_dsn, timeout=5)
    assert codes == [SSL_REQUEST]


async def test_sslmode_disable_sends_the_startup_message_in_the_clear(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with first_message_server() as (port, codes):
        monkeypatch.setenv("LOCKGATE_POSTGRES_DSN",
                           f"postgresql://u:p@127.0.0.1:{port}/db?sslmode=require")
        monkeypatch.setenv("LOCKGATE_POSTGRES_SSLMODE", "disable")  # the setting wins
        settings = PgSettings()
        with pytest.raises((ConnectionError, asyncpg.exceptions.ConnectionDoesNotExistError,
                            asyncpg.exceptions.InterfaceError, OSError)):
            await asyncpg.connect(settings.postgres_dsn, timeout=5)
    assert codes == [PROTOCOL_3]


def test_tls_files_and_the_password_file_go_into_the_dsn(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("ca.crt", "client.crt", "client.key"):
        (tmp_path / name).write_text("pem")
    (tmp_path / "password").write_text("s3cret/with:odd@chars\n")
    monkeypatch.setenv("LOCKGATE_POSTGRES_DSN",
                       "postgresql://lockgate_scheduler@db.example:5432/lockgate?application_name=x")
    monkeypatch.setenv("LOCKGATE_POSTGRES_SSLMODE", "verify-full")
    monkeypatch.setenv("LOCKGATE_POSTGRES_SSLROOTCERT", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("LOCKGATE_POSTGRES_SSLCERT", str(tmp_path / "client.crt"))
    monkeypatch.setenv("LOCKGATE_POSTGRES_SSLKEY", str(tmp_path / "client.key"))
    monkeypatch.setenv("LOCKGATE_POSTGRES_PASSWORD_FILE", str(tmp_path / "password"))
    dsn = urlsplit(PgSettings().postgres_dsn)
    assert (dsn.username, dsn.password, dsn.hostname) == (
        "lockgate_scheduler", "s3cret%2Fwith%3Aodd%40chars", "db.example")
    assert parse_qs(dsn.query) == {
        "application_name": ["x"], "sslmode": ["verify-full"],
        "sslrootcert": [str(tmp_path / "ca.crt")], "sslcert": [str(tmp_path / "client.crt")],
        "sslkey": [str(tmp_path / "client.key")]}


def test_missing_tls_files_or_password_file_stop_the_start(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOCKGATE_POSTGRES_SSLMODE", "verify-full")
    monkeypatch.setenv("LOCKGATE_POSTGRES_SSLROOTCERT", str(tmp_path / "nope.crt"))
    with pytest.raises(ValidationError, match="Postgres TLS files not found: sslrootcert"):
        PgSettings()
    monkeypatch.delenv("LOCKGATE_POSTGRES_SSLROOTCERT")
    monkeypatch.setenv("LOCKGATE_POSTGRES_PASSWORD_FILE", str(tmp_path / "nope"))
    with pytest.raises(ValidationError, match="cannot read the Postgres password file"):
        PgSettings()
    monkeypatch.setenv("LOCKGATE_POSTGRES_SSLMODE", "sometimes")
    with pytest.raises(ValidationError, match=r"postgres_sslmode|LOCKGATE_POSTGRES_SSLMODE"):
        PgSettings()
