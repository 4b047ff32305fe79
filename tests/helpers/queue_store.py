"""Running a real, isolated queue-store in tests: its own database and consumer group.

Why: integration and end-to-end tests need the real service on the real Kafka and Postgres, but
isolated from other tests sharing the stack. Isolation comes from a fresh database (made with
`lockgate_adapters.postgres.create_database`, migrated by the service at start) and a consumer
group of its own that starts at the topics' current end, so it neither steals partitions from
another queue-store nor replays every message other tests ever published. The service runs as a
process (`python -m queue_store` with `QueueStoreUnderTest.env`) so it can be killed like a
crashed pod. (kopf's `kopf.testing` is the model.)

It is a test helper, so it lives here and not in the service's package, which the images ship;
`make bench` (bench/bench_ingest.py) imports it too, with tests/ on its path as pytest has.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from devstack.launcher import ServiceProcess
from devstack.ports import free_port
from devstack.roles import service_dsn
from helpers.services import FAST_RETRY
from lockgate.events import Topic
from lockgate_adapters.admin_tokens import Role, entry_for, new_token
from lockgate_adapters.kafka import commit_group_at_end
from queue_store.app import CONSUMED_TOPICS


async def stored_events(process: ServiceProcess) -> float:
    """How many events a queue-store process stored, from its /metrics (several instances in
    one consumer group: each has stored some once the group has settled)."""
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{process.health_port}/metrics") as reply:
        text = await reply.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("lockgate_queue_store_events_total{")
               and 'outcome="stored"' in line)


async def start_group_at_end(bootstrap: str, group_id: str,
                             topics: Sequence[Topic[Any]] = CONSUMED_TOPICS) -> None:
    """Commit `group_id`'s offsets at the current end of the topics queue-store consumes."""
    await commit_group_at_end(bootstrap, group_id, topics)


@dataclass(frozen=True)
class QueueStoreUnderTest:
    """How to run one isolated queue-store as a process, and where to reach it."""

    postgres_dsn: str  # a superuser's, for the test; the service connects as its own role
    kafka_bootstrap: str
    group_id: str = field(default_factory=lambda: f"queue-store-test-{uuid.uuid4().hex[:8]}")
    admin_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    # Tokens of this instance alone: one per role.
    admin_token: str = field(default_factory=new_token)
    read_only_token: str = field(default_factory=new_token)

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def admin_headers(self) -> dict[str, str]:
        """Headers of a call with the admin token."""
        return {"Authorization": f"Bearer {self.admin_token}"}

    def token_lines(self) -> list[str]:
        return [entry_for("test-admin", Role.ADMIN, self.admin_token).line(),
                entry_for("test-reader", Role.READ_ONLY, self.read_only_token).line()]

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of `python -m queue_store` for this instance, with fast retries."""
        prefix = "LOCKGATE_QUEUE_STORE_"
        return {
            # shared by all services, no prefix
            "LOCKGATE_POSTGRES_DSN": service_dsn(self.postgres_dsn, "queue-store"),
            "LOCKGATE_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            f"{prefix}GROUP_ID": self.group_id,
            f"{prefix}ADMIN_PORT": str(self.admin_port),
            f"{prefix}HTTP_PORT": str(self.health_port),
            f"{prefix}ADMIN_TOKENS": json.dumps(self.token_lines()),
            f"{prefix}RETRY__INITIAL_SECONDS": str(FAST_RETRY.initial_seconds),
            f"{prefix}RETRY__MAX_SECONDS": str(FAST_RETRY.max_seconds),
            f"{prefix}SHUTDOWN_GRACE_SECONDS": "10",
            **{f"{prefix}{key.upper()}": value for key, value in extra.items()},
        }

    def process(self, name: str, env: Mapping[str, str] | None = None) -> ServiceProcess:
        """The service as a process (not started); `env` adds or overrides variables."""
        return ServiceProcess(name, "queue_store", {**self.env(), **(env or {})},
                              health_port=self.health_port)

    async def start(self, name: str, env: Mapping[str, str] | None = None) -> ServiceProcess:
        """Its consumer group put at the topics' end, then the process started and ready."""
        await start_group_at_end(self.kafka_bootstrap, self.group_id)
        process = self.process(name, env)
        await process.start()
        try:
            await process.wait_ready()  # devstack.launcher.STARTUP_SECONDS
        except BaseException:
            await process.stop()
            raise
        return process

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
