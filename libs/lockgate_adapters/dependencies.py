"""Probing the dependencies a service needs, so readiness and logs tell an outage as it is.

Why: a service's loops notice an outage only when they happen to use the dependency, and then
each in its own words: a consumer blocked in a fetch, a watch stream that stays open while the
apiserver's etcd is down, or a producer with nothing to send may stay "ready" for the whole
outage, while the clients log thousands of lines. Each service therefore declares what it needs
in its composition root (`ctx.dependencies.kafka(...)`, `.postgres(...)`, `.apiserver(...)`);
a probe per dependency asks it a real question every `interval_seconds` with a bounded timeout
(Kafka: a metadata request; Postgres: `SELECT 1`; an apiserver: `GET /readyz`, which fails when
its etcd is down) and flips the readiness condition of the same name (`kafka`, `postgres`,
`apiserver:<cluster>`). Loops may report on the same condition; it holds only while every
reporter says so.

Logs: one ERROR line when a dependency becomes unreachable, one WARNING summary every
`summary_every_seconds` while it stays so (how long, the last error, how many client messages
`quieting` suppressed meanwhile), and one line when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import asyncpg
from aiokafka.admin import AIOKafkaAdminClient
from kubernetes_asyncio import client

from lockgate_adapters.health import Readiness
from lockgate_adapters.kafka import KafkaTarget, client_kwargs
from lockgate_adapters.quieting import OUTAGE_LOGS
from lockgate_adapters.retrying import sleep_unless_stopped
from lockgate_adapters.settings import DependencyChecks

log = logging.getLogger(__name__)

# The readiness source the probes report as (loops report as the default source).
PROBE_SOURCE = "probe"
KAFKA = "kafka"
POSTGRES = "postgres"


def apiserver_check(cluster: str) -> str:
    return f"apiserver:{cluster}"


class DependencyDownError(Exception):
    """A dependency answered, but not "I am fine" (e.g. an apiserver's /readyz failed)."""


# ---------------------------------------------------------------- the pure part


class Change(enum.Enum):
    """What one probe result changed, as far as the logs are concerned."""

    FIRST_UP = "first up"
    DOWN = "down"
    STILL_DOWN = "still down"
    BACK = "back"


@dataclass(frozen=True)
class Notice:
    """A line to log about a dependency; `suppressed` is filled in by whoever logs it."""

    change: Change
    name: str
    target: str
    error: str
    down_for: float = 0.0

    @property
    def level(self) -> int:
        return {Change.FIRST_UP: logging.INFO, Change.DOWN: logging.ERROR,
                Change.STILL_DOWN: logging.WARNING, Change.BACK: logging.WARNING}[self.change]

    def message(self, suppressed: int) -> str:
        hidden = f"; {suppressed} client log message(s) about it suppressed" if suppressed else ""
        if self.change is Change.FIRST_UP:
            return f"{self.name} reachable ({self.target})"
        if self.change is Change.DOWN:
            return f"{self.name} unreachable: {self.error} ({self.target})"
        if self.change is Change.STILL_DOWN:
            return (f"{self.name} still unreachable after {self.down_for:.0f}s: {self.error} "
                    f"({self.target}){hidden}")
        return f"{self.name} reachable again after {self.down_for:.0f}s ({self.target}){hidden}"


@dataclass
class Reachability:
    """One dependency's state from its probe results, with the time passed in (pure).

    Down after `failures_to_unready` consecutive failures (at once before it was ever up);
    up again at the first success. While down, a summary is due every `summary_every` seconds.
    """

    name: str
    target: str
    failures_to_unready: int = 2
    summary_every: float = 30.0
    reachable: bool | None = None  # None until the first verdict
    since: float = 0.0  # when the current verdict began
    failures: int = 0
    last_error: str = ""
    _last_summary: float = 0.0

    def observe(self, *, ok: bool, error: str = "", now: float) -> Notice | None:
        if ok:
            self.failures = 0
            if self.reachable is True:
                return None
            before, down_for = self.reachable, now - self.since
            self.reachable, self.since = True, now
            if before is None:
                return Notice(Change.FIRST_UP, self.name, self.target, "")
            return Notice(Change.BACK, self.name, self.target, self.last_error, down_for)
        self.failures += 1
        self.last_error = error
        if self.reachable is False:
            if now - self._last_summary >= self.summary_every:
                self._last_summary = now
                return Notice(Change.STILL_DOWN, self.name, self.target, error, now - self.since)
            return None
        if self.reachable is True and self.failures < self.failures_to_unready:
            return None
        self.reachable, self.since, self._last_summary = False, now, now
        return Notice(Change.DOWN, self.name, self.target, error)

    @property
    def ready(self) -> bool:
        return self.reachable is True

    def detail(self, now: float) -> str:
        if self.reachable is None:
            return "not probed yet"
        if self.reachable:
            if self.failures:
                return f"reachable ({self.failures} probe(s) just failed: {self.last_error})"
            return f"reachable ({self.target})"
        return f"unreachable for {now - self.since:.0f}s: {self.last_error} ({self.target})"


# ---------------------------------------------------------------- probes


class Probe(Protocol):
    """One real question to a dependency; raises if it is not answered as expected."""

    name: str
    target: str

    async def check(self) -> None: ...

    async def close(self) -> None: ...


class KafkaProbe:
    """A metadata request through an admin client (kept while it works, rebuilt after)."""

    def __init__(self, bootstrap: str, *, name: str = KAFKA, timeout: float,
                 client_options: Mapping[str, Any] | None = None) -> None:
        self.name, self.target = name, bootstrap
        self._timeout_ms = max(1, int(timeout * 1000))
        # Whatever else the service's own clients are given (TLS, SASL), to ask as they do.
        self._client_options = dict(client_options or {})
        self._admin: AIOKafkaAdminClient | None = None

    async def check(self) -> None:
        try:
            if self._admin is None:
                self._admin = AIOKafkaAdminClient(
                    bootstrap_servers=self.target, client_id="lockgate-dependency-probe",
                    request_timeout_ms=self._timeout_ms, **self._client_options)
                await self._admin.start()  # bootstraps: the first metadata request
            cluster = await self._admin.describe_cluster()
        except BaseException:
            await self.close()
            raise
        if not cluster.get("brokers"):
            await self.close()
            raise DependencyDownError("metadata lists no brokers")

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()


class PostgresProbe:
    """`SELECT 1` on a connection of its own (kept while it works, reopened after)."""

    def __init__(self, dsn: str, *, name: str = POSTGRES, timeout: float) -> None:
        parts = urlsplit(dsn)
        # Never the DSN itself in logs: it may carry a password.
        port = f":{parts.port}" if parts.port else ""
        self.name, self.target = name, f"{parts.hostname}{port}{parts.path}"
        self._dsn, self._timeout = dsn, timeout
        self._connection: asyncpg.Connection | None = None

    async def check(self) -> None:
        try:
            if self._connection is None or self._connection.is_closed():
                self._connection = await asyncpg.connect(self._dsn, timeout=self._timeout)
            await self._connection.fetchval("SELECT 1")
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.terminate()  # no goodbye to a server that may not answer


class ApiserverProbe:
    """`GET /readyz` of one apiserver: fails while the apiserver cannot reach its etcd."""

    def __init__(self, cluster: str, api: client.ApiClient, *, timeout: float) -> None:
        self.name, self.target = apiserver_check(cluster), str(api.configuration.host)
        self._api, self._timeout = api, timeout

    async def check(self) -> None:
        response: aiohttp.ClientResponse = await self._api.call_api(
            "/readyz", "GET", query_params=[("verbose", "true")], auth_settings=["BearerToken"],
            _preload_content=False, _return_http_data_only=True,
            _request_timeout=self._timeout)
        async with response:
            body = await response.text()
            if response.status != 200:
                failed = [line.strip() for line in body.splitlines() if line.startswith("[-]")]
                raise DependencyDownError(
                    f"/readyz answered {response.status}: {', '.join(failed) or body[:200]}")

    async def close(self) -> None:
        """The ApiClient belongs to the service, which closes it."""


def describe(error: BaseException, timeout: float) -> str:
    if isinstance(error, TimeoutError) and not str(error):
        return f"no answer within {timeout:g}s"
    text, kind = str(error), type(error).__name__
    return text if text.startswith(kind) else f"{kind}: {text}"  # aiokafka names itself


# ---------------------------------------------------------------- the monitor


class DependencyMonitor:
    """Probes every declared dependency while the service runs; see the module docstring.

    `run_service` starts it before the composition root, so dependencies declared there are
    probed at once, even while the root still waits for one of them.
    """

    def __init__(self, readiness: Readiness, policy: DependencyChecks, *,
                 clock: Callable[[], float] = time.monotonic,
                 suppressed: Callable[[str], int] = OUTAGE_LOGS.take_suppressed,
                 quieten: Callable[[str, bool], None] = OUTAGE_LOGS.dependency_down) -> None:
        self._readiness, self._policy = readiness, policy
        self._clock, self._suppressed, self._quieten = clock, suppressed, quieten
        self._probes: dict[str, Probe] = {}
        self._added = asyncio.Event()

    def kafka(self, kafka: KafkaTarget) -> None:
        """Kafka as the service's own clients reach it (servers, TLS, SASL)."""
        options = client_kwargs(kafka)
        bootstrap = options.pop("bootstrap_servers")
        self.add(KafkaProbe(bootstrap, timeout=self._policy.timeout_seconds,
                            client_options=options))

    def postgres(self, dsn: str) -> None:
        self.add(PostgresProbe(dsn, timeout=self._policy.timeout_seconds))

    def apiserver(self, cluster: str, api: client.ApiClient) -> None:
        self.add(ApiserverProbe(cluster, api, timeout=self._policy.timeout_seconds))

    def add(self, probe: Probe) -> None:
        if probe.name in self._probes:
            raise ValueError(f"dependency {probe.name} declared twice")
        self._probes[probe.name] = probe
        self._readiness.declare(probe.name, source=PROBE_SOURCE)
        self._added.set()

    @property
    def names(self) -> list[str]:
        return list(self._probes)

    async def run(self, stopping: asyncio.Event) -> None:
        """Probe each dependency (also those declared later) until `stopping` is set."""
        watched: set[str] = set()
        async with asyncio.TaskGroup() as group:
            while not stopping.is_set():
                self._added.clear()
                for name, probe in self._probes.items():
                    if name not in watched:
                        watched.add(name)
                        group.create_task(self._watch(probe, stopping), name=f"probe {name}")
                await _first_of(stopping, self._added)

    async def _watch(self, probe: Probe, stopping: asyncio.Event) -> None:
        policy = self._policy
        state = Reachability(probe.name, probe.target,
                             failures_to_unready=policy.failures_to_unready,
                             summary_every=policy.summary_every_seconds)
        suppressed = 0
        try:
            while not stopping.is_set():
                try:
                    async with asyncio.timeout(policy.timeout_seconds):
                        await probe.check()
                    notice = state.observe(ok=True, now=self._clock())
                except Exception as error:  # noqa: BLE001 - whatever fails, it did not answer
                    if stopping.is_set():
                        break  # the service closed the client under the probe
                    notice = state.observe(ok=False, error=describe(error, policy.timeout_seconds),
                                           now=self._clock())
                self._readiness.set(probe.name, state.ready, state.detail(self._clock()),
                                    source=PROBE_SOURCE)
                if notice is not None:
                    # Counted from the outage's first line: what was suppressed before it
                    # (while the first probes failed) goes into the first summary.
                    suppressed += self._suppressed(probe.name)
                    # Reported down: its clients' chatter is only counted until it is back.
                    self._quieten(probe.name, not state.ready)
                    if notice.change is Change.DOWN:
                        log.log(notice.level, "%s", notice.message(0))
                    else:
                        log.log(notice.level, "%s", notice.message(suppressed))
                        suppressed = 0
                await sleep_unless_stopped(stopping, policy.interval_seconds)
        finally:
            self._quieten(probe.name, False)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(probe.close(), policy.timeout_seconds)


async def _first_of(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
