"""The fair scheduler's composition root: the schema, a producer, and the leader election loop.

Election: one dedicated connection per instance tries `pg_try_advisory_lock(LEADER_LOCK)`; a
standby retries every `standby_retry_seconds` on the same connection. The lock lives as long as
the session, so a leader that crashes, is killed or loses its connection frees it at once and a
standby takes over within about a second. Readiness is true only while leading (a standby is
healthy but not ready).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time

import asyncpg
from aiokafka import AIOKafkaProducer

from fair_scheduler.leading import Leader, LeadershipLostError
from fair_scheduler.reporting import FairnessReport
from fair_scheduler.settings import SchedulerSettings
from lockgate.events import DEAD_LETTERS, POD_NOTICES, RELEASE_COMMANDS
from lockgate.scheduler.collection import collect_for_large_state
from lockgate_adapters import scheduler_store as store
from lockgate_adapters.health import HealthServer
from lockgate_adapters.kafka import start_producer
from lockgate_adapters.postgres import connect_pool, wait_for_schema
from lockgate_adapters.retrying import Backoff, Stopped, retry, sleep_unless_stopped
from lockgate_adapters.service import Loop, ServiceContext

log = logging.getLogger(__name__)

FAIRNESS_PATH = "/api/v1/fairness"
FAIRNESS_PER_CLUSTER_PATH = "/api/v1/fairness/clusters"
EXPLAIN_PATH = "/api/v1/explain"
# What ends a term of leadership (or prevents one): Postgres unreachable or the session lost.
# A client error on the leader connection (e.g. "another operation is in progress" after an
# operation was cut off by a Postgres shutdown) ends the term like any other: step down, retry.
_POSTGRES_TROUBLE = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError,
                     asyncpg.InternalClientError, LeadershipLostError)


async def compose(ctx: ServiceContext) -> list[Loop]:
    settings = ctx.settings
    assert isinstance(settings, SchedulerSettings)
    collect_for_large_state(settings.gc_first_threshold)
    ctx.readiness.declare("postgres", "kafka", "leader")
    ctx.dependencies.postgres(settings.postgres_dsn)
    ctx.dependencies.kafka(settings.kafka())
    report = FairnessReport(instance_id=settings.instance_id)
    serve_views(ctx.health, report)
    # While a round holds the GIL, the health server's thread gets it after the switch
    # interval, once per step of an answer (accept, read, encode, write): 1 ms, not Python's
    # 5, so an answer waits a few milliseconds for a round, not tens. Only while a request is
    # being answered does the round give the GIL up more often.
    sys.setswitchinterval(0.001)

    async def schedule(stopping: asyncio.Event) -> None:
        await _wait_for_schema(settings)
        producer = await start_producer(
            settings.kafka(), client_id=f"fair-scheduler-{settings.instance_id}",
            topics=(RELEASE_COMMANDS, POD_NOTICES, DEAD_LETTERS), policy=settings.retry,
            stopping=stopping,
            on_unreachable=lambda error: ctx.readiness.set(
                "kafka", False, f"{type(error).__name__}: {error}"))
        if producer is None:
            return
        ctx.readiness.set("kafka", True, "producer started")
        try:
            await _lead_when_elected(settings, ctx, producer, report, stopping)
        finally:
            await producer.stop()

    return [schedule]


def serve_views(health: HealthServer, report: FairnessReport) -> None:
    """The leader's picture over HTTP. On the health server's own thread (the settings'
    `health_own_thread`), the fairness answer never waits for the round in progress, nor an
    explanation the last round's picture already gave (reporting.FairnessReport.answered);
    the others are worked out on the loop."""
    health.add_json_view(FAIRNESS_PATH, report.encoded, off_loop=True)
    health.add_json_view(FAIRNESS_PER_CLUSTER_PATH, report.encoded_per_cluster, off_loop=True)
    health.add_json_query(EXPLAIN_PATH, lambda body: report.explain_json(body, now=time.time()),
                          off_loop=report.answered)


async def _lead_when_elected(settings: SchedulerSettings, ctx: ServiceContext,
                             producer: AIOKafkaProducer, report: FairnessReport,
                             stopping: asyncio.Event) -> None:
    backoff = Backoff(settings.retry, stopping=stopping)

    async def lead_once() -> None:
        """Connect, wait for the lock, lead until stopping; raises on Postgres trouble."""
        connection: asyncpg.Connection | None = None
        try:
            connection = await store.connect(settings.postgres_dsn,
                                             liveness=settings.liveness())
            ctx.readiness.set("postgres", True, "connected")
            if not await _wait_for_lock(settings, ctx, connection, stopping):
                return
            backoff.reset()
            log.info("%s is the leader", settings.instance_id)
            report.set_leader(True)
            ctx.readiness.set("leader", True, "leading")
            await Leader(settings=settings, connection=connection, producer=producer,
                         report=report, readiness=ctx.readiness).run(stopping)
        finally:
            if report.leader:
                log.info("%s stepped down", settings.instance_id)
            report.set_leader(False)
            ctx.readiness.set("leader", False, "not leading")
            if connection is not None:
                await _close(connection)

    if stopping.is_set():
        return
    with contextlib.suppress(Stopped):
        await retry(lead_once, backoff=backoff,
                    retryable=lambda error: isinstance(error, _POSTGRES_TROUBLE),
                    on_failure=lambda error: ctx.readiness.set(
                        "postgres", False, f"{type(error).__name__}: {error}"),
                    what=f"{settings.instance_id}: postgres trouble", dependency="postgres")


async def _wait_for_lock(settings: SchedulerSettings, ctx: ServiceContext,
                         connection: asyncpg.Connection, stopping: asyncio.Event) -> bool:
    """Block until this connection holds the leader lock (True) or we are stopping (False)."""
    announced = False
    stuck_after = settings.liveness().stuck_after
    while not stopping.is_set():
        if await store.try_lead(connection):
            return True
        ended = await store.end_stuck_leader(connection, stuck_for_seconds=stuck_after)
        if ended is not None:
            log.warning("%s ended the leader's session (backend pid %s): stuck in one command "
                        "for over %.1fs, its leader has stepped down", settings.instance_id,
                        ended, stuck_after)
            continue  # that session has exited: the lock is free now
        if not announced:
            pid = await store.leader_pid(connection)
            log.info("%s is a standby (leader's backend pid %s)", settings.instance_id, pid)
            ctx.readiness.set("leader", False, "standby")
            announced = True
        await sleep_unless_stopped(stopping, settings.standby_retry_seconds)
    return False


async def _wait_for_schema(settings: SchedulerSettings) -> None:
    """queue-store migrates; the scheduler's role may not, so it waits for the schema."""
    pool = await connect_pool(settings.postgres_dsn, policy=settings.retry, min_size=1,
                              max_size=1, what="postgres (schema)")
    try:
        await wait_for_schema(pool, policy=settings.retry, what="fair-scheduler")
    finally:
        await pool.close()


async def _close(connection: asyncpg.Connection) -> None:
    try:
        await connection.close(timeout=2)
    except Exception:  # noqa: BLE001 - whatever the reason, the session must end
        connection.terminate()
