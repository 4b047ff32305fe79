"""Running a real, isolated queue-store in tests: its own database and consumer group.

Why: integration and end-to-end tests need the real service on the real Kafka and Postgres, but
isolated from other tests sharing the stack. Isolation comes from a fresh database (migrated by
the service at start) and a consumer group of its own that starts at the topics' current end, so
it neither steals partitions from another queue-store nor replays every message other tests ever
published. The service runs as a process (`python -m queue_store` with `QueueStoreUnderTest.env`)
so it can be killed like a crashed pod. (kopf's `kopf.testing` is the model.)
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg

from lockgate.events import Topic
from lockgate_adapters.kafka import commit_group_at_end
from lockgate_adapters.settings import RetryPolicy
from queue_store.app import CONSUMED_TOPICS

FAST_RETRY = RetryPolicy(initial_seconds=0.05, max_seconds=0.5)


def with_database(dsn: str, database: str) -> str:
    """`dsn` pointing at another database on the same server."""
    base, _, _ = dsn.rpartition("/")
    return f"{base}/{database}"


async def create_database(dsn: str, *, prefix: str = "lockgate_test") -> str:
    """Create an empty database on `dsn`'s server; returns its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    return with_database(dsn, name)


async def drop_database(dsn: str, database_dsn: str) -> None:
    name = database_dsn.rpartition("/")[2]
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await connection.close()


async def start_group_at_end(bootstrap: str, group_id: str,
                             topics: Sequence[Topic[Any]] = CONSUMED_TOPICS) -> None:
    """Commit `group_id`'s offsets at the current end of the topics queue-store consumes."""
    await commit_group_at_end(bootstrap, group_id, topics)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class QueueStoreUnderTest:
    """How to run one isolated queue-store as a process, and where to reach it."""

    postgres_dsn: str
    kafka_bootstrap: str
    group_id: str = field(default_factory=lambda: f"queue-store-test-{uuid.uuid4().hex[:8]}")
    admin_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of `python -m queue_store` for this instance, with fast retries."""
        prefix = "LOCKGATE_QUEUE_STORE_"
        return {
            "LOCKGATE_POSTGRES_DSN": self.postgres_dsn,  # shared by all services, no prefix
            "LOCKGATE_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            f"{prefix}GROUP_ID": self.group_id,
            f"{prefix}ADMIN_PORT": str(self.admin_port),
            f"{prefix}HTTP_PORT": str(self.health_port),
            f"{prefix}RETRY__INITIAL_SECONDS": str(FAST_RETRY.initial_seconds),
            f"{prefix}RETRY__MAX_SECONDS": str(FAST_RETRY.max_seconds),
            f"{prefix}SHUTDOWN_GRACE_SECONDS": "10",
            **{f"{prefix}{key.upper()}": value for key, value in extra.items()},
        }

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, the checks) from /readyz; (False, {}) while it does not answer."""
        try:
            async with aiohttp.ClientSession() as session, session.get(
                    f"{self.health_url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as reply:
                report = await reply.json()
                return bool(report["ready"]) and bool(report["checks"]), report["checks"]
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False, {}

    async def wait_ready(self, within: float = 60.0, *, ready: bool = True,
                         alive: Callable[[], bool] = lambda: True) -> None:
        """Wait until /readyz says `ready`; fail with its report (or if `alive()` turns false)."""
        deadline = asyncio.get_running_loop().time() + within
        while True:
            state, checks = await self.readiness()
            if state == ready:
                return
            if not alive():
                raise RuntimeError("queue-store exited before becoming ready")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"queue-store not ready={ready} within {within}s: {checks}")
            await asyncio.sleep(0.1)
