"""Web UI page benchmark: what one page of the UI costs with 100,000 queued pods.

Measured in one run, on the local stack's Postgres, each size on a fresh migrated database
filled through queue-store's own bulk writer (`job_store.upsert_jobs`): one queue holding N
queued pods (spread over 2 clusters, 100 job sets, mixed priorities), two smaller queues,
running pods on 8 nodes. The admin API runs in this process on a loopback port with a real pool,
and each page is fetched over HTTP as the UI fetches it, with a token.

For each page: the median of several fetches, at N = 1,000 (the baseline, same run) and at
N = 100,000, and their ratio: a page cut in Postgres costs about the same at both sizes. No
scheduler runs here, so the pages say the reasons are unavailable: the waiting reasons are the
leader's, asked per page, and `bench_leader_views.py` measures them with a leader at fleet scale.

Prints one JSON object per page.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

import devstack
from lockgate.ingest import JobRow
from lockgate.jobs import JobState
from lockgate_adapters import job_store
from lockgate_adapters.admin_tokens import Role, entry_for, new_token
from lockgate_adapters.postgres import connect_pool, create_database, drop_database, migrate
from lockgate_adapters.settings import RetryPolicy
from queue_store.app import admin_api
from queue_store.namespaces import NamespaceKeeper
from queue_store.settings import QueueStoreSettings

BIG = "big"
CLUSTERS = ("bench-a", "bench-b")
REPEATS = 7


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def jobs(queued: int) -> list[JobRow]:
    now = datetime.now(UTC)
    rows = []
    for i in range(queued):
        rows.append(JobRow(
            cluster=CLUSTERS[i % 2], uid=str(uuid.UUID(int=i + 1)), namespace=f"ns-{i % 20}",
            name=f"pod-{i}", queue=BIG, jobset=f"js-{i % 100}", priority=(i % 7 == 0) * 10,
            requests={"cpu": 500, "memory": 2**29}, state=JobState.QUEUED, node_name=None,
            created_at=now - timedelta(seconds=queued - i), state_changed_at=now))
    for i in range(400):  # running pods of three queues, and a few queued in the small ones
        queue = ("small-1", "small-2", BIG)[i % 3]
        state = JobState.RUNNING if i < 320 else JobState.QUEUED
        rows.append(JobRow(
            cluster=CLUSTERS[i % 2], uid=str(uuid.UUID(int=10**9 + i)), namespace="ns-run",
            name=f"run-{i}", queue=queue, jobset=f"run-{i % 10}", priority=0,
            requests={"cpu": 1000, "memory": 2**30}, state=state,
            node_name=f"node-{i % 8}" if state is JobState.RUNNING else None,
            created_at=now - timedelta(hours=1), state_changed_at=now,
            running_at=now if state is JobState.RUNNING else None))
    return rows


async def fill(pool: asyncpg.Pool, queued: int) -> None:
    rows = jobs(queued)
    async with pool.acquire() as connection:
        for name, factor in ((BIG, 1.0), ("small-1", 0.5), ("small-2", 2.0)):
            await connection.execute(
                "INSERT INTO queues (name, priority_factor, namespaces) VALUES ($1, $2,"
                " '[{\"cluster\": \"*\", \"names\": [\"ns-0\"]}]'::jsonb)", name, factor)
        for i in range(8):
            await connection.execute(
                "INSERT INTO cluster_nodes (cluster, node, allocatable, unmanaged_usage,"
                " schedulable, present, observed_at, labels, taints) VALUES ($1, $2,"
                " '{\"cpu\": 64000, \"memory\": 274877906944}'::jsonb, '{}'::jsonb, true,"
                " true, now(), '{}'::jsonb, '[]'::jsonb)", CLUSTERS[i % 2], f"node-{i}")
        for start in range(0, len(rows), 20_000):
            async with connection.transaction():
                await job_store.upsert_jobs(connection, rows[start:start + 20_000])
        # As autovacuum leaves a table that stopped growing (visibility map set, statistics).
        await connection.execute("VACUUM ANALYZE jobs")


async def median_ms(fetch: Callable[[], Awaitable[None]]) -> float:
    await fetch()  # warm: connections, plans
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        await fetch()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


PAGES: dict[str, Callable[[int], str]] = {
    "waiting_first_page": lambda n: f"/api/v1/queues/{BIG}/waiting?limit=50",
    "waiting_last_page": lambda n: f"/api/v1/queues/{BIG}/waiting?limit=50&offset={n - 50}",
    "waiting_filtered_by_cluster": lambda n: (f"/api/v1/queues/{BIG}/waiting?limit=50"
                                              f"&cluster={CLUSTERS[1]}&offset=100"),
    "queue_jobsets": lambda n: f"/api/v1/jobsets?queue={BIG}&limit=21",
    "jobset_pods_page": lambda n: "/api/v1/jobsets/big/js-7/pods?limit=50&offset=50",
    "clusters": lambda n: "/api/v1/clusters",
    "pod_queued": lambda n: f"/api/v1/pods/{CLUSTERS[(n - 1) % 2]}/ns-{(n - 1) % 20}/pod-{n - 1}",
    "queues": lambda n: "/api/v1/queues",
}


@contextlib.asynccontextmanager
async def read_only_admin(pool: asyncpg.Pool, dsn: str, token: str,
                          **settings: Any) -> AsyncIterator[int]:
    """queue-store's admin API in this process over `pool`, for a read-only `token` (and
    `settings` of queue-store's beside), on a free loopback port: the port."""
    config = QueueStoreSettings(
        admin_tokens=[entry_for("bench", Role.READ_ONLY, token).line()], postgres_dsn=dsn,
        kafka_bootstrap="127.0.0.1:1", **settings)
    keeper = NamespaceKeeper(apis={}, extra_labels={}, token_seconds=3600, create_any=True)

    async def no_publish(_: Any, __: Any) -> None:
        raise RuntimeError("the bench reads only")

    admin, _, leader = admin_api(pool, config, publish=no_publish, keeper=keeper)
    runner = web.AppRunner(admin.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await leader.close()
        await runner.cleanup()


async def measure(server_dsn: str, queued: int) -> dict[str, float]:
    database = f"bench_ui_{uuid.uuid4().hex[:12]}"
    dsn = await create_database(server_dsn, database)
    token = new_token()
    try:
        pool = await connect_pool(dsn, policy=RetryPolicy(), max_size=6)
        try:
            await migrate(pool)
            await fill(pool, queued)
            async with read_only_admin(pool, dsn, token) as port, aiohttp.ClientSession(
                    f"http://127.0.0.1:{port}",
                    headers={"Authorization": f"Bearer {token}"}) as session:
                async def get(path: str) -> None:
                    async with session.get(path) as response:
                        assert response.status == 200, (path, await response.text())
                        await response.read()

                found = {}
                for name, page in PAGES.items():
                    path = page(queued)
                    found[name] = await median_ms(functools.partial(get, path))
                return found
        finally:
            await pool.close()
    finally:
        await drop_database(server_dsn, database)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--baseline", type=int, default=1_000)
    args = parser.parse_args(argv)
    stack = devstack.ensure_up()
    base = await measure(stack.postgres_dsn, args.baseline)
    big = await measure(stack.postgres_dsn, args.queued)
    for name in PAGES:
        emit({"name": f"ui_{name}", "queued": args.queued, "median_ms": round(big[name], 2),
              "baseline_queued": args.baseline, "baseline_median_ms": round(base[name], 2),
              "ratio_to_baseline": round(big[name] / base[name], 2)})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
