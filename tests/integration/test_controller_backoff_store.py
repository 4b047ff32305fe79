"""Back-offs per controller in real Postgres (migration 011), as each service's own role.

The scheduler writes a back-off with the give-up that starts it, a new leader loads it with the
jobs, queue-store's admin views read it (so `lockgate explain` says a pod backs off), and a reset
deletes a record only as it was read.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from devstack.roles import service_dsn
from helpers.postgres import fresh_database
from lockgate.backoff import ControllerBackoff
from lockgate.scheduler import (
    DEFAULT_FAIRNESS_RESOURCES,
    Explainer,
    Feed,
    FeedPolicy,
    SchedulerState,
    WaitReason,
)
from lockgate_adapters import scheduler_store as store

pytestmark = [pytest.mark.stack, pytest.mark.timeout(120)]

CLUSTER = f"bo-{uuid.uuid4().hex[:6]}"
RS = "rs-uid"


@pytest.fixture
async def dsn(pg_dsn: str) -> AsyncIterator[str]:
    async with fresh_database(pg_dsn, prefix="lg_backoff", migrated=True) as database:
        connection = await asyncpg.connect(database)
        try:
            await connection.execute(
                "INSERT INTO queues (name) VALUES ('q');"
                "INSERT INTO cluster_nodes (cluster, node, allocatable, observed_at)"
                f" VALUES ('{CLUSTER}', 'n1', '{{\"cpu\": 4000}}', now())")
            for uid, state in (("given-up", "released"), ("replacement", "queued")):
                await connection.execute(
                    "INSERT INTO jobs (cluster, uid, namespace, name, queue, jobset, requests,"
                    " state, created_at, controlled, controller_uid)"
                    " VALUES ($1, $2, 'ns', $2, 'q', 'js', $3::text::jsonb, $4, now(), true, $5)",
                    CLUSTER, uid, json.dumps({"cpu": 1000}), state, RS)
        finally:
            await connection.close()
        yield database


async def test_a_back_off_is_stored_with_the_give_up_and_read_by_every_service(dsn: str) -> None:
    at = datetime.now(UTC).replace(microsecond=250_000)
    backoff = ControllerBackoff(CLUSTER, RS, attempts=2, given_up_at=at.timestamp(),
                                until=(at + timedelta(minutes=5)).timestamp())
    scheduler = await asyncpg.connect(service_dsn(dsn, "fair-scheduler"))
    try:
        changed = await store.record_unplaceable(
            scheduler, keys=[(CLUSTER, "given-up")], reasons=["unplaceable: ..."], at=at,
            backoffs=[store.BackoffRow(backoff, "ns", "given-up")])
        assert changed == 1
        # A new leader loads it as it was written, and each job's controller.
        loaded = await store.load_everything(scheduler)
        assert loaded.backoffs == [backoff]
        assert {job.job_id: job.controller for job in loaded.jobs} == {
            f"{CLUSTER}/given-up": RS, f"{CLUSTER}/replacement": RS}
        # The leader's feed, loading those rows, holds the controller's queued pod out.
        feed = Feed(SchedulerState(DEFAULT_FAIRNESS_RESOURCES), FeedPolicy())
        feed.load_backoffs(loaded.backoffs, at.timestamp())
        for queue in loaded.queues:
            feed.apply_queue(queue.name, queue.spec)
        feed.apply_jobs(loaded.jobs, now=at.timestamp(), returned={})
        state = feed.state
        explanation = Explainer(state, now=at.timestamp()).explain(f"{CLUSTER}/replacement")
        assert explanation is not None and explanation.reason is WaitReason.BACKING_OFF
        assert explanation.backoff_attempts == 2
        # A reset deletes the record only as it was read: a newer give-up's stays.
        stale = ControllerBackoff(CLUSTER, RS, 1, backoff.given_up_at - 300,
                                  backoff.given_up_at - 180)
        await store.forget_backoffs(scheduler, [stale])
        assert (await store.load_everything(scheduler)).backoffs == [backoff]
        await store.forget_backoffs(scheduler, [backoff])
        assert (await store.load_everything(scheduler)).backoffs == []
    finally:
        await scheduler.close()
