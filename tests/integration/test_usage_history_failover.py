"""Usage that decays survives a leader failover (issue 36 item 3), with real Postgres, Kafka and
fair-scheduler processes.

A queue `hog` holds the whole pool while a queue `idle` waits. The decayed usage each leader
reports and stores is checked against a model that lives here: a share of 1 held since the
release the leader recorded (`jobs.released_at`), so usage(t) = (1 - e^(-r (t - t0))) / r with
r = ln 2 / half-life. The history weights are checked against the rule's formula applied to
that model (hog used everything at half the weights: 1 x 2^(-1 / 0.5) = 1/4; idle keeps 1).

- The leader stores the usage when it steps down; the next leader restores it and carries on
  where it stopped (its usage is the model's, not a fresh count since it took over).
- A leader killed without storing anything: the next one rebuilds the usage from the jobs'
  records, and it equals the model too.
- History on without a half-life: the scheduler refuses to start, saying so.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from devstack.launcher import ServiceProcess
from helpers.postgres import fresh_database
from helpers.services import fairness_report, scheduler_process
from helpers.waiting import eventually
from lockgate_adapters.postgres import CHANGES_CHANNEL

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

SUFFIX = uuid.uuid4().hex[:8]
CPU = 1000  # millicores
GIB = 2**30
HALF_LIFE = 120.0
RATE = math.log(2) / HALF_LIFE


def held_all_since(t0: float, t: float) -> float:
    """The model: decayed usage at `t` of a share of 1 held since `t0` (share x seconds)."""
    return (1 - math.exp(-RATE * max(0.0, t - t0))) / RATE


@pytest.fixture(scope="module")
async def template_database(pg_dsn: str) -> AsyncIterator[str]:
    async with fresh_database(pg_dsn, prefix=f"lg_hist_tmpl_{SUFFIX}", migrated=True) as dsn:
        yield dsn


@dataclass
class Rows:
    """Writes queues, a node and jobs as queue-store would; reads what the leader wrote."""

    dsn: str
    pool: asyncpg.Pool
    cluster: str

    async def write(self, statement: str, *args: Any) -> None:
        async with self.pool.acquire() as connection, connection.transaction():
            await connection.execute(statement, *args)
            await connection.execute("SELECT pg_notify($1, 'test')", CHANGES_CHANNEL)

    async def setup(self) -> None:
        """hog and idle, weight 1 each; one node of 4 cpu; hog asks for 4 pods of 1 cpu (the
        whole pool), then idle for 4: hog is released first and holds everything."""
        await self.write("INSERT INTO queues (name, priority_factor) VALUES ('hog', 1), "
                         "('idle', 1)")
        await self.write(
            "INSERT INTO cluster_nodes (cluster, node, allocatable, observed_at)"
            " VALUES ($1, 'n1', $2::text::jsonb, now())",
            self.cluster, json.dumps({"cpu": 4 * CPU, "memory": 16 * GIB}))
        await self.jobs("hog", 4)

    async def jobs(self, queue: str, count: int) -> None:
        uids = [str(uuid.uuid4()) for _ in range(count)]
        await self.write(
            "INSERT INTO jobs (cluster, uid, namespace, name, queue, jobset, requests, state,"
            " created_at)"
            " SELECT $1, u, 'ns', 'pod-' || u, $2, 'js', $3::text::jsonb, 'queued', now()"
            " FROM unnest($4::text[]) AS u",
            self.cluster, queue, json.dumps({"cpu": CPU, "memory": GIB}), uids)

    async def hog_released_at(self) -> float:
        """When the leader released hog's last pod (from then on it held the whole pool)."""
        async def all_released() -> float | None:
            row = await self.pool.fetchrow(
                "SELECT count(*) AS n, max(released_at) AS at FROM jobs"
                " WHERE queue = 'hog' AND state = 'released'")
            return row["at"].timestamp() if row["n"] == 4 else None
        released: float = await eventually(all_released, within=30,
                                           what="hog's 4 pods released")
        return released

    async def stored(self) -> list[asyncpg.Record]:
        return await self.pool.fetch(
            "SELECT queue, usage, half_life_seconds, as_of, saved_by FROM decayed_usage"
            " ORDER BY queue")


@pytest.fixture
async def rows(pg_dsn: str, template_database: str) -> AsyncIterator[Rows]:
    async with fresh_database(pg_dsn, prefix="lg_hist", template=template_database) as dsn:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
        try:
            yield Rows(dsn, pool, f"hist-{SUFFIX}-{uuid.uuid4().hex[:4]}")
        finally:
            await pool.close()


def leader(name: str, rows: Rows, kafka_bootstrap: str, **env: str) -> ServiceProcess:
    return scheduler_process(name, postgres_dsn=rows.dsn, kafka_bootstrap=kafka_bootstrap, env={
        "LOCKGATE_SCHEDULER_HISTORY_ENABLED": "true",
        "LOCKGATE_SCHEDULER_HISTORY_HALF_LIFE_SECONDS": "2m",
        "LOCKGATE_SCHEDULER_HISTORY_RECOMPUTE_SECONDS": "1s",
        "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1s",
        "LOCKGATE_SCHEDULER_STANDBY_RETRY_SECONDS": "0.2",
        **env})


async def history_of(process: ServiceProcess, *, after: float) -> dict[str, Any]:
    """The leader's history report once its usage is brought up to a time after `after`."""
    assert process.health_port is not None
    port = process.health_port

    async def current() -> dict[str, Any] | None:
        report = await fairness_report(port)
        history = report.get("history")
        if not report.get("leader") or history is None or history["usage_at"] <= after:
            return None
        return dict(history)
    found: dict[str, Any] = await eventually(
        current, within=30, what=f"{process.name}'s history report after {after}")
    return found


def assert_the_rule_holds(history: dict[str, Any]) -> None:
    """hog used all the usage at half the weights, idle none: 2^(-1 / 0.5) and 2^0."""
    nodes = history["nodes"]
    assert nodes["hog"]["effective_weight"] == pytest.approx(2 ** (-1 / 0.5))
    assert nodes["idle"]["effective_weight"] == pytest.approx(1.0)
    assert nodes["hog"]["held_back"].startswith("ranked below its sibling idle: hog used 2.0x")


async def test_the_next_leader_restores_the_usage_stored_at_step_down(
        rows: Rows, kafka_bootstrap: str) -> None:
    await rows.setup()
    first = leader("first", rows, kafka_bootstrap)
    second = leader("second", rows, kafka_bootstrap)
    try:
        await first.start()
        await first.wait_ready()
        t0 = await rows.hog_released_at()
        await rows.jobs("idle", 4)  # waits: hog holds the whole pool
        await second.start()  # stands by
        await asyncio.sleep(8)  # hog holds everything for a while
        before = await history_of(first, after=t0 + 5)
        assert before["nodes"]["hog"]["decayed_usage"] == pytest.approx(
            held_all_since(t0, before["usage_at"]), rel=0.02)
        assert_the_rule_holds(before)

        assert await first.stop() == 0  # steps down: stores the usage
        stored = await rows.stored()
        assert [(r["queue"], r["half_life_seconds"], r["saved_by"]) for r in stored] == [
            ("hog", HALF_LIFE, "first")]
        as_of = stored[0]["as_of"].timestamp()
        assert stored[0]["usage"] == pytest.approx(held_all_since(t0, as_of), rel=0.02)

        took_over = time.time()
        await second.wait_ready()
        after = await history_of(second, after=took_over + 2)
        hog = after["nodes"]["hog"]["decayed_usage"]
        # Carried on from the stored usage: the model since t0, far above a fresh count.
        assert hog == pytest.approx(held_all_since(t0, after["usage_at"]), rel=0.03)
        assert hog > 2 * held_all_since(took_over, after["usage_at"])
        assert after["nodes"]["idle"]["decayed_usage"] == 0.0
        assert_the_rule_holds(after)
        assert "restored the decayed usage of 1 queues stored by first" in second.log_tail(400)
    finally:
        await first.kill()
        await second.kill()


async def test_a_lost_record_is_rebuilt_from_the_jobs(rows: Rows, kafka_bootstrap: str) -> None:
    await rows.setup()
    # Never stores on its own: killed, it leaves nothing behind.
    first = leader("first", rows, kafka_bootstrap,
                   LOCKGATE_SCHEDULER_HISTORY_SAVE_SECONDS="1h")
    second = leader("second", rows, kafka_bootstrap)
    try:
        await first.start()
        await first.wait_ready()
        t0 = await rows.hog_released_at()
        await asyncio.sleep(6)
        await first.kill()  # as in a crash: no step-down save
        assert await rows.stored() == []
        started = time.time()
        await second.start()
        await second.wait_ready()
        after = await history_of(second, after=started)
        assert after["nodes"]["hog"]["decayed_usage"] == pytest.approx(
            held_all_since(t0, after["usage_at"]), rel=0.03)
        assert "rebuilt the decayed usage of 1 queues from 4 runs" in second.log_tail(400)
        await rows.jobs("idle", 4)
        assert_the_rule_holds(await history_of(second, after=time.time() + 1))
    finally:
        await first.kill()
        await second.kill()


async def test_history_on_without_a_half_life_refuses_to_start(
        rows: Rows, kafka_bootstrap: str) -> None:
    process = scheduler_process("no-half-life", postgres_dsn=rows.dsn,
                                kafka_bootstrap=kafka_bootstrap,
                                env={"LOCKGATE_SCHEDULER_HISTORY_ENABLED": "true"})
    try:
        await process.start()
        assert process.process is not None
        code = await asyncio.wait_for(process.process.wait(), timeout=60)
        assert code != 0
        assert "usage history is on but has no half-life" in process.log_tail(100)
    finally:
        await process.kill()
