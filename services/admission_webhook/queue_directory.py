"""Which queues exist and which are cordoned, read from Postgres and cached for a few seconds.

Why: every pod creation in a managed namespace waits on this answer, so an open queue is
answered from memory. The cache is a copy of the small `queues` table, reloaded on
`LISTEN lockgate_changes` (so a cordon applies within moments) and at least every half TTL.
Anything the cache does not confirm as open (missing, cordoned, or a cache older than its TTL)
is asked of Postgres directly, so a queue created a moment ago is never refused. When Postgres
cannot answer in time, `lookup` returns None: the webhook refuses the pod (fail-closed) and the
service reports not ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import asyncpg

from lockgate.admission import QueueLookup, QueueStatus
from lockgate_adapters.health import Readiness
from lockgate_adapters.postgres import CHANGES_CHANNEL
from lockgate_adapters.quieting import quiet
from lockgate_adapters.retrying import BackoffIterator, sleep_unless_stopped
from lockgate_adapters.settings import RetryPolicy

log = logging.getLogger(__name__)

READINESS_CHECK = "queues"
# After a notification, wait this long so a burst of changes costs one reload.
NOTIFY_COALESCE_SECONDS = 0.05
ALL_QUEUES = "SELECT name, cordoned FROM queues WHERE NOT deleted"
ONE_QUEUE = "SELECT cordoned FROM queues WHERE name = $1 AND NOT deleted"


class QueueDirectory:
    def __init__(
        self,
        dsn: str,
        *,
        ttl: float,
        check_timeout: float,
        retry: RetryPolicy,
        readiness: Readiness,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dsn = dsn
        self._ttl, self._check_timeout = ttl, check_timeout
        self._connect_timeout = max(5.0, check_timeout)
        self._retry = retry
        self._readiness = readiness
        self._clock = clock
        self._pool: asyncpg.Pool | None = None
        self._cordoned_by_name: dict[str, bool] = {}
        self._loaded_at: float | None = None
        readiness.declare(READINESS_CHECK)

    async def lookup(self, name: str) -> QueueLookup | None:
        """The queue's state, or None if Postgres could not be asked in time."""
        if self._is_fresh() and self._cordoned_by_name.get(name) is False:
            return QueueLookup(QueueStatus.OPEN)
        pool = self._pool
        if pool is None:
            return None
        try:
            async with asyncio.timeout(self._check_timeout):
                row = await pool.fetchrow(ONE_QUEUE, name)
        except Exception as error:  # noqa: BLE001 - any failure means "cannot verify"
            self._readiness.set(READINESS_CHECK, False, f"queue lookup failed: {error!r}")
            log.warning("cannot look up queue %s: %r", name, error)
            return None
        if row is None:
            self._cordoned_by_name.pop(name, None)
            # The refusal lists queues to use instead: make that list current (refusals are rare).
            try:
                await self.reload()
            except Exception as error:  # noqa: BLE001 - the answer stands; suggestions may lag
                log.warning("cannot reload queues for suggestions: %r", error)
            return QueueLookup(QueueStatus.MISSING, existing=self._open_queues())
        self._cordoned_by_name[name] = bool(row["cordoned"])
        return QueueLookup(QueueStatus.CORDONED if row["cordoned"] else QueueStatus.OPEN)

    async def run(self, stopping: asyncio.Event) -> None:
        """Connect, then keep the cache in step with Postgres until `stopping`; never gives up."""
        delays = BackoffIterator(self._retry)
        try:
            while not stopping.is_set():
                try:
                    if self._pool is None:
                        # One attempt per turn of this loop, so a stop is noticed between them.
                        self._pool = await asyncpg.create_pool(
                            self._dsn, min_size=1, max_size=4, timeout=self._connect_timeout
                        )
                    await self._follow_changes(stopping)
                    delays.reset()
                except Exception as error:  # noqa: BLE001 - retried; readiness says why
                    self._readiness.set(READINESS_CHECK, False, repr(error))
                    delay = next(delays, self._retry.max_seconds)
                    log.warning("queue directory: %r; retrying in %.1fs", error, delay,
                                extra=quiet("postgres"))
                    await sleep_unless_stopped(stopping, delay)
        finally:
            if self._pool is not None:
                await self._pool.close()
                self._pool = None

    async def _follow_changes(self, stopping: asyncio.Event) -> None:
        changed = asyncio.Event()
        lost = asyncio.Event()

        def on_termination(_: object) -> None:
            lost.set()
            changed.set()

        def on_notification(_: object, __: int, ___: str, payload: object) -> None:
            # Writers name the tables they changed; job churn must not reload queues each time.
            if not payload or "queues" in str(payload).split(","):
                changed.set()

        listener = await asyncpg.connect(self._dsn, timeout=self._connect_timeout)
        try:
            listener.add_termination_listener(on_termination)
            await listener.add_listener(CHANGES_CHANNEL, on_notification)
            await self.reload()
            while not stopping.is_set():
                await _wait_any((changed, stopping), seconds=self._ttl / 2)
                if lost.is_set():
                    raise ConnectionError("the LISTEN connection to Postgres was lost")
                if changed.is_set():
                    await asyncio.sleep(NOTIFY_COALESCE_SECONDS)
                    changed.clear()
                if not stopping.is_set():
                    await self.reload()
        finally:
            await listener.close(timeout=1)

    async def reload(self) -> None:
        """Replace the cached copy of the queues table."""
        pool = self._pool
        if pool is None:
            raise ConnectionError("not connected to Postgres")
        async with asyncio.timeout(self._check_timeout):
            rows = await pool.fetch(ALL_QUEUES)
        self._cordoned_by_name = {row["name"]: bool(row["cordoned"]) for row in rows}
        self._loaded_at = self._clock()
        self._readiness.set(READINESS_CHECK, True, f"{len(rows)} queues")

    def _is_fresh(self) -> bool:
        return self._loaded_at is not None and self._clock() - self._loaded_at < self._ttl

    def _open_queues(self) -> tuple[str, ...]:
        return tuple(sorted(name for name, cordoned in self._cordoned_by_name.items()
                            if not cordoned))


async def _wait_any(events: tuple[asyncio.Event, ...], *, seconds: float) -> None:
    waiters = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
