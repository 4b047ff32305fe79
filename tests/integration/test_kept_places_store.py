"""Places kept for replacements, in Postgres: a place left by a deleted queued pod is stored
(it survives a restart of queue-store: every batch reads it back), taken once by a replacement
stored later, carried to the scheduler as the job's time in line, and collected after the grace
period.

Real Postgres (the stack's), a database of this module migrated as queue-store migrates it; the
statements are queue-store's and the scheduler's own (`ingesting.store_events`,
`scheduler_store.load_everything`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from helpers.postgres import fresh_database
from helpers.services import FAST_RETRY
from lockgate import jobs
from lockgate.events import PodEvent
from lockgate.jobs import JobState
from lockgate_adapters import scheduler_store
from lockgate_adapters.postgres import connect_pool
from queue_store.ingesting import store_events

pytestmark = [pytest.mark.stack]

CLUSTER = f"places-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    async with fresh_database(pg_dsn, prefix="places_it", migrated=True) as dsn:
        pool = await connect_pool(dsn, policy=FAST_RETRY, min_size=1, max_size=2)
        try:
            yield pool
        finally:
            await pool.close()


def pod(uid: str, state: JobState, *, namespace: str, created: datetime, seen: datetime,
        cpu: int = 1000) -> PodEvent:
    return PodEvent(event_id=uuid.uuid4().hex, cluster=CLUSTER, namespace=namespace,
                    name="jupyter-alice", uid=f"{namespace}-{uid}", state=state, queue="q",
                    jobset="notebooks", requests={"cpu": cpu}, created_at=created,
                    observed_at=seen)


async def test_a_replacement_takes_the_stored_place_once(pool: asyncpg.Pool) -> None:
    namespace, start = f"ns-{uuid.uuid4().hex[:6]}", datetime.now(UTC) - timedelta(minutes=3)
    await store_events(pool, [pod("old", JobState.QUEUED, namespace=namespace, created=start,
                                  seen=start)])
    # Separate batches, as after a restart: the place is read back from Postgres.
    await store_events(pool, [pod("old", JobState.DELETED, namespace=namespace, created=start,
                                  seen=start + timedelta(seconds=60))])
    later = start + timedelta(seconds=70)
    await store_events(pool, [pod("new", JobState.QUEUED, namespace=namespace, created=later,
                                  seen=later)])
    await store_events(pool, [pod("bigger", JobState.QUEUED, namespace=namespace, created=later,
                                  seen=later, cpu=500),  # smaller, but the place is taken
                              pod("new", JobState.QUEUED, namespace=namespace, created=later,
                                  seen=later)])  # redelivered
    rows = {r["uid"]: r for r in await pool.fetch(
        "SELECT uid, queued_since, kept_place_of FROM jobs WHERE namespace = $1", namespace)}
    rows = {uid.removeprefix(f"{namespace}-"): row for uid, row in rows.items()}
    assert rows["new"]["queued_since"] == start
    assert rows["new"]["kept_place_of"] == "jupyter-alice"
    assert rows["bigger"]["queued_since"] is None
    assert await pool.fetchval("SELECT inherited_by FROM left_places WHERE uid = $1",
                               f"{namespace}-old") == f"{namespace}-new"

    async with pool.acquire() as connection:
        loaded = await scheduler_store.load_everything(connection)
    in_line = {job.job_id: job.created_at for job in loaded.jobs}
    assert in_line[jobs.job_id(CLUSTER, f"{namespace}-new")] == start.timestamp()
    assert in_line[jobs.job_id(CLUSTER, f"{namespace}-bigger")] == later.timestamp()


async def test_places_older_than_the_grace_period_are_collected(pool: asyncpg.Pool) -> None:
    namespace, start = f"ns-{uuid.uuid4().hex[:6]}", datetime.now(UTC) - timedelta(minutes=30)
    await store_events(pool, [
        pod("gone", JobState.QUEUED, namespace=namespace, created=start, seen=start),
        pod("gone", JobState.DELETED, namespace=namespace, created=start,
            seen=start + timedelta(seconds=5))])
    assert await pool.fetchval("SELECT count(*) FROM left_places WHERE namespace = $1",
                               namespace) == 1
    now = datetime.now(UTC)
    await store_events(pool, [pod("late", JobState.QUEUED, namespace=namespace, created=now,
                                  seen=now)], place_grace=timedelta(minutes=10))
    assert await pool.fetchval("SELECT count(*) FROM left_places WHERE namespace = $1",
                               namespace) == 0
    assert await pool.fetchval("SELECT queued_since FROM jobs WHERE uid = $1",
                               f"{namespace}-late") is None


async def test_a_replacement_stored_before_the_deletion_takes_the_place(
        pool: asyncpg.Pool) -> None:
    namespace, start = f"ns-{uuid.uuid4().hex[:6]}", datetime.now(UTC) - timedelta(minutes=3)
    later = start + timedelta(seconds=70)
    await store_events(pool, [pod("old", JobState.QUEUED, namespace=namespace, created=start,
                                  seen=start)])
    await store_events(pool, [pod("new", JobState.QUEUED, namespace=namespace, created=later,
                                  seen=later)])
    await store_events(pool, [pod("old", JobState.DELETED, namespace=namespace, created=start,
                                  seen=start + timedelta(seconds=60))])
    row = await pool.fetchrow("SELECT queued_since, kept_place_of FROM jobs WHERE uid = $1",
                              f"{namespace}-new")
    assert row is not None
    assert (row["queued_since"], row["kept_place_of"]) == (start, "jupyter-alice")
