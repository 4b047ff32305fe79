"""Ingest's job writes through COPY and a staging table: every row lands once, and idempotence
holds as it did with the single INSERT (`job_store.upsert_jobs`).

Why: the rows go COPY → session-private staging table → one INSERT ... SELECT ... ON CONFLICT.
A staging table whose rows outlived their call (the next call, in the same transaction or a
later one on the same connection, would merge them again), that lost them before the merge, or
that merged a key twice would drop, duplicate or resurrect rows, or give unchanged rows new
serials (the change feed would replay them).

Real Postgres (the stack's), a database of this module migrated as queue-store migrates it,
written as queue-store's own role (which must be allowed its temporary table); the statements
are queue-store's own (`ingesting.store_events`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from devstack.roles import service_dsn
from helpers.postgres import fresh_database
from helpers.services import FAST_RETRY
from lockgate.events import PodEvent
from lockgate.ingest import JobRow
from lockgate.jobs import JobState
from lockgate_adapters import job_store
from lockgate_adapters.postgres import connect_pool
from queue_store.ingesting import _REFUSED_DATA, store_events

pytestmark = [pytest.mark.stack]

START = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)


@pytest.fixture(scope="module")
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    async with fresh_database(pg_dsn, prefix="ingest_copy_it", migrated=True) as dsn:
        # One connection, so every batch reuses the same session's staging table.
        pool = await connect_pool(service_dsn(dsn, "queue-store"), policy=FAST_RETRY,
                                  min_size=1, max_size=1)
        try:
            yield pool
        finally:
            await pool.close()


@pytest.fixture
def cluster() -> str:
    return f"copy-{uuid.uuid4().hex[:8]}"


def pod(cluster: str, uid: str, state: JobState = JobState.QUEUED, *,
        seen: float = 0) -> PodEvent:
    return PodEvent(event_id=f"{uid}-{state}-{seen}", cluster=cluster, namespace="team-a",
                    name=f"pod-{uid}", uid=uid, state=state, queue="research", jobset="sweep",
                    requests={"cpu": 500}, created_at=START,
                    observed_at=START + timedelta(seconds=seen))


async def stored(pool: asyncpg.Pool, cluster: str) -> dict[str, tuple[str, int]]:
    """uid → (state, serial); fails if any key is stored twice."""
    records = await pool.fetch("SELECT uid, state, serial FROM jobs WHERE cluster = $1",
                               cluster)
    rows = {r["uid"]: (r["state"], r["serial"]) for r in records}
    assert len(rows) == len(records)
    return rows


async def test_duplicates_replays_and_existing_pods_in_a_batch_are_stored_once(
        pool: asyncpg.Pool, cluster: str) -> None:
    # New pods, one of them delivered twice in the batch.
    first = [pod(cluster, "a"), pod(cluster, "b"), pod(cluster, "b"), pod(cluster, "c")]
    result = await store_events(pool, first)
    assert len(result.jobs) == 3
    after_first = await stored(pool, cluster)
    assert {uid: state for uid, (state, _) in after_first.items()} == {
        "a": "queued", "b": "queued", "c": "queued"}
    assert len({serial for _, serial in after_first.values()}) == 3

    # The same batch redelivered: nothing written, no serial moves.
    assert (await store_events(pool, first)).jobs == []
    assert await stored(pool, cluster) == after_first

    # An existing pod moving on, in one batch with new ones (one twice) and a stale event.
    second = [pod(cluster, "a", JobState.RUNNING, seen=10), pod(cluster, "d"),
              pod(cluster, "e"), pod(cluster, "d"), pod(cluster, "a", seen=5)]
    await store_events(pool, second)
    after_second = await stored(pool, cluster)
    assert {uid: state for uid, (state, _) in after_second.items()} == {
        "a": "running", "b": "queued", "c": "queued", "d": "queued", "e": "queued"}
    assert after_second["b"] == after_first["b"] and after_second["c"] == after_first["c"]
    newest = max(serial for _, serial in after_first.values())
    assert all(after_second[uid][1] > newest for uid in ("a", "d", "e"))

    # Replayed out of order: the older batch after the newer one changes nothing.
    assert (await store_events(pool, first)).jobs == []
    assert (await store_events(pool, second)).jobs == []
    assert await stored(pool, cluster) == after_second


async def job_rows(pool: asyncpg.Pool, cluster: str) -> list[JobRow]:
    async with pool.acquire() as connection:
        return await job_store.list_jobs(connection, cluster=cluster)


async def test_a_call_merges_only_its_own_rows_in_or_out_of_a_transaction(
        pool: asyncpg.Pool, cluster: str) -> None:
    await store_events(pool, [pod(cluster, "x"), pod(cluster, "y")])
    x, y = sorted(await job_rows(pool, cluster), key=lambda row: row.uid)
    async with pool.acquire() as connection:
        # Two calls in one transaction: the second must not merge the first's rows again
        # (here the first's stale `x` would overwrite the second's).
        async with connection.transaction():
            await job_store.upsert_jobs(connection, [dataclasses.replace(x, node_name="n1")])
            await job_store.upsert_jobs(connection, [dataclasses.replace(x, node_name="n2"),
                                                     dataclasses.replace(y, node_name="n2")])
        # Outside a transaction (autocommit): the rows still land.
        await job_store.upsert_jobs(connection, [dataclasses.replace(y, node_name="n3")])
    nodes = {row.uid: row.node_name for row in await job_rows(pool, cluster)}
    assert nodes == {"x": "n2", "y": "n3"}


async def test_a_row_postgres_refuses_raises_what_the_dead_letter_path_catches(
        pool: asyncpg.Pool, cluster: str) -> None:
    """`BatchStore` retries a refused batch one message at a time and dead-letters the refused
    ones only for these errors; the COPY and the merge must raise them as the INSERT did."""
    await store_events(pool, [pod(cluster, "ok")])
    (row,) = await job_rows(pool, cluster)
    for refused in (dataclasses.replace(row, uid="nul", name="bad\x00name"),  # in the COPY
                    dataclasses.replace(row, uid="big", pod_group_size=20_000)):  # the merge
        async with pool.acquire() as connection:
            with pytest.raises(_REFUSED_DATA):
                async with connection.transaction():
                    await job_store.upsert_jobs(connection, [refused])
    # The failed transactions left nothing staged: the next batch writes only its own rows.
    await store_events(pool, [pod(cluster, "next")])
    assert set(await stored(pool, cluster)) == {"ok", "next"}
