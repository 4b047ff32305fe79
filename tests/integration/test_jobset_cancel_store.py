"""A job set's cancel in Postgres, taken late (queue-store restarted, or behind): it cancels the
jobs created before it was asked for and only those, as the ungaters judge their pods; and the
end of a pod that finished before it, stored after it, is kept.

Real Postgres (the stack's), a database of this module migrated as queue-store migrates it;
the statements are queue-store's own (`namespace_store.cancel_jobs`, `ingesting.store_events`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from helpers.postgres import fresh_database
from helpers.services import FAST_RETRY
from lockgate.events import JobSetCommand, PodEvent
from lockgate.jobs import JobState
from lockgate_adapters import namespace_store
from lockgate_adapters.postgres import connect_pool
from queue_store.ingesting import store_events

pytestmark = [pytest.mark.stack]

CLUSTER = f"cancel-{uuid.uuid4().hex[:6]}"
CANCEL_AT = datetime(2026, 12, 1, 21, 0, 5, 400_000, tzinfo=UTC)


@pytest.fixture(scope="module")
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    async with fresh_database(pg_dsn, prefix="cancel_store_it", migrated=True) as dsn:
        pool = await connect_pool(dsn, policy=FAST_RETRY, min_size=1, max_size=2)
        try:
            yield pool
        finally:
            await pool.close()


def pod(uid: str, jobset: str, state: JobState, *, created: float, seen: float) -> PodEvent:
    return PodEvent(event_id=uuid.uuid4().hex, cluster=CLUSTER, namespace="team",
                    name=f"pod-{uid}", uid=uid, state=state, queue="q", jobset=jobset,
                    created_at=CANCEL_AT.replace(microsecond=0) + timedelta(seconds=created),
                    observed_at=CANCEL_AT + timedelta(seconds=seen))


async def states(pool: asyncpg.Pool, jobset: str) -> dict[str, tuple[str, str]]:
    rows = await pool.fetch("SELECT uid, state, last_reason FROM jobs WHERE jobset = $1",
                            jobset)
    return {r["uid"]: (r["state"], r["last_reason"]) for r in rows}


async def cancel(pool: asyncpg.Pool, jobset: str) -> int:
    command = JobSetCommand(command_id=uuid.uuid4().hex, queue="q", jobset=jobset,
                            reason="abandoned", requested_by="alice", at=CANCEL_AT)
    async with pool.acquire() as connection, connection.transaction():
        return await namespace_store.cancel_jobs(connection, command)


async def test_a_late_cancel_cancels_only_the_jobs_created_before_it(pool: asyncpg.Pool) -> None:
    jobset = f"late-{uuid.uuid4().hex[:6]}"
    # Stored before queue-store took the cancel, which it took late: one pod was created a
    # minute after the cancel was asked for (the ungaters leave it alone).
    await store_events(pool, [
        pod("before", jobset, JobState.RUNNING, created=-60, seen=-30),
        pod("same-second", jobset, JobState.QUEUED, created=0, seen=0.5),
        pod("after", jobset, JobState.QUEUED, created=60, seen=61),
        pod("done", jobset, JobState.SUCCEEDED, created=-60, seen=-10),
    ])
    assert await cancel(pool, jobset) == 2
    assert await states(pool, jobset) == {
        "before": ("cancelled", "cancelled: abandoned"),
        "same-second": ("cancelled", "cancelled: abandoned"),
        "after": ("queued", ""),
        "done": ("succeeded", ""),
    }
    assert await cancel(pool, jobset) == 0  # a repeated cancel changes nothing


async def test_a_pod_that_ended_before_the_cancel_keeps_its_end_stored_after_it(
        pool: asyncpg.Pool) -> None:
    jobset = f"ended-{uuid.uuid4().hex[:6]}"
    await store_events(pool, [pod(uid, jobset, JobState.RUNNING, created=-60, seen=-30)
                              for uid in ("finished-first", "finished-later", "deleted")])
    await cancel(pool, jobset)
    # Their ends come out of a backlog after the cancel was stored.
    await store_events(pool, [
        pod("finished-first", jobset, JobState.SUCCEEDED, created=-60, seen=-5),
        pod("finished-later", jobset, JobState.SUCCEEDED, created=-60, seen=5),
        pod("deleted", jobset, JobState.DELETED, created=-60, seen=2),
    ])
    found = await states(pool, jobset)
    assert found["finished-first"] == (
        "succeeded", "ended before its job set was cancelled (abandoned)")
    assert found["finished-later"] == ("cancelled", "cancelled: abandoned")
    assert found["deleted"] == ("cancelled", "cancelled: abandoned")
    row = await pool.fetchrow("SELECT finished_at FROM jobs WHERE uid = 'finished-first'")
    assert row["finished_at"] == CANCEL_AT - timedelta(seconds=5)
