"""queue-store's view of the scheduler (`lockgate status` / `lockgate explain`) in real Postgres,
as queue-store's own role: it loads the rows through the leader's hold-out feed and weighs
shares over the fair-scheduler's fairness resources, not the defaults.

Until issue 17, `job_views.scheduler_state` built its state with the default fairness resources
and charged every row: a pod the leader had given up on still counted against its queue, and a
pod whose release had just failed was explained as next in line.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from devstack.roles import service_dsn
from helpers.postgres import fresh_database
from lockgate.scheduler import DEFAULT_FAIRNESS_RESOURCES, Feed, FeedPolicy, queue_statuses
from lockgate_adapters import job_views

pytestmark = [pytest.mark.stack, pytest.mark.timeout(120)]

CLUSTER = f"sv-{uuid.uuid4().hex[:6]}"
GIB = 1 << 30


@pytest.fixture
async def dsn(pg_dsn: str) -> AsyncIterator[str]:
    async with fresh_database(pg_dsn, prefix="lg_view", migrated=True) as database:
        connection = await asyncpg.connect(database)
        try:
            await connection.execute(
                "INSERT INTO queues (name) VALUES ('mem'), ('cpu');"
                "INSERT INTO cluster_nodes (cluster, node, allocatable, observed_at)"
                f" VALUES ('{CLUSTER}', 'n1', '{{\"cpu\": 8000, \"memory\": {16 * GIB}}}',"
                " now())")
            rows = [
                # uid, queue, requests, state, node, given up, release attempts
                ("mem-running", "mem", {"cpu": 1000, "memory": 12 * GIB}, "running", "n1",
                 False, 0),
                ("cpu-running", "cpu", {"cpu": 2000, "memory": GIB}, "running", "n1", False, 0),
                ("given-up", "cpu", {"cpu": 4000}, "released", None, True, 0),
                ("returned", "cpu", {"cpu": 1000}, "queued", None, False, 1),
            ]
            for uid, queue, requests, state, node, given_up, attempts in rows:
                await connection.execute(
                    "INSERT INTO jobs (cluster, uid, namespace, name, queue, jobset, requests,"
                    " state, created_at, node_name, unplaceable_at, release_attempts,"
                    " state_changed_at)"
                    " VALUES ($1, $2, 'ns', $2, $3, 'js', $4::text::jsonb, $5, now(), $6,"
                    " CASE WHEN $7 THEN now() END, $8, now())",
                    CLUSTER, uid, queue, json.dumps(requests), state, node, given_up, attempts)
        finally:
            await connection.close()
        yield database


async def _view(dsn: str, resources: tuple[str, ...]) -> Feed:
    connection = await asyncpg.connect(service_dsn(dsn, "queue-store"))
    try:
        return await job_views.scheduler_view(
            connection, fairness_resources=resources,
            policy=FeedPolicy(release_retry_initial_seconds=600.0))
    finally:
        await connection.close()


async def test_the_view_weighs_shares_over_the_schedulers_fairness_resources(dsn: str) -> None:
    by_default = {s.queue: s for s in queue_statuses((await _view(
        dsn, DEFAULT_FAIRNESS_RESOURCES)).state)}
    cpu_only = {s.queue: s for s in queue_statuses((await _view(dsn, ("cpu",))).state)}
    # 12 of 16 GiB memory, 1 of 8 cpu: memory dominates only if fair shares are over it.
    assert by_default["mem"].actual_share == pytest.approx(0.75)
    assert cpu_only["mem"].actual_share == pytest.approx(1 / 8)
    assert cpu_only["cpu"].actual_share == pytest.approx(2 / 8)


async def test_the_view_holds_out_what_the_leader_holds_out(dsn: str) -> None:
    feed = await _view(dsn, DEFAULT_FAIRNESS_RESOURCES)
    given_up, returned = f"{CLUSTER}/given-up", f"{CLUSTER}/returned"
    # Given up on while unbound: not charged to its queue (the leader's state has it not).
    assert feed.state.job(given_up) is None
    status = {s.queue: s for s in queue_statuses(feed.state)}["cpu"]
    assert (status.running, status.released) == (1, 0)
    # Its release failed a moment ago: it waits out of the line, and the view says until when.
    assert feed.held_out(returned) == "backing_off"
    due = feed.retry_due(returned)
    assert due is not None and 0 < due - time.time() <= 600
