"""Leader views benchmark: `status`, `explain`, a UI queue page and a pod page at fleet scale.

Issue 37 moved every answer about why pods wait to the fair-scheduler leader's picture of its
last round; queue-store asks the leader and adds only what Postgres keeps. This measures those
four calls as a user makes them, at N queued pods against the same calls at the baseline's N
(1,000) in the same run:

- a fresh database on the local stack's Postgres holding the simulator's fleet: 20,000 nodes in
  50 clusters of 400, each filled by one running pod, 1,000 queues, and N queued pods spread
  over the queues and clusters (mixed shapes), written by queue-store's own bulk writer;
- a real fair-scheduler process leading over it (it loads every row, then runs rounds), while a
  writer in this process ends a few running pods every half second, so rounds keep releasing
  and the leader's picture keeps changing under the requests;
- queue-store's admin API in this process, asking that leader, fetched over HTTP with a token.

Each call is made REQUESTS times; p50 and p99 are printed per call and size, one JSON object per
call: {"name": "leader_view_<call>", "queued": N, "p50_ms", "p99_ms", "baseline_*", ratios}.
Target (issue 37): p99 <= 200 ms at 1,000,000 queued, and no call growing with N beyond a page.

The four calls ask about the same pod (and page) again and again, as a page refreshing or
`explain` run again does: the leader answers those from its last round's picture on its HTTP
thread, never waiting for the round in progress (`fair_scheduler.reporting`). A fifth,
`explain_first_ask`, asks about a different pod each time, one nobody asked about before: the
leader answers at once with the round's own reason when the last round passed the pod over
(counted as `first_asks_answered_from_the_rounds_record`), and otherwise works it out on its
loop, after the round in progress, so its figure is about a round's length (reported beside it
as `leader_round_mean_ms`). A probe, `probe_leader_fairness_direct`, asks the leader's fairness
answer directly (no queue-store, no Postgres): the leader's HTTP thread getting the GIL from a
round. Only Postgres and Kafka are started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import orjson

from bench_ui_pages import read_only_admin  # the admin API in this process, read-only
from devstack.launcher import ServiceProcess
from devstack.ports import free_port
from devstack.roles import service_dsn
from devstack.stack import Stack
from lockgate.ingest import JobRow
from lockgate.jobs import JobState
from lockgate_adapters import job_store
from lockgate_adapters.admin_tokens import new_token
from lockgate_adapters.postgres import (
    CHANGES_CHANNEL,
    connect_pool,
    create_database,
    drop_database,
    migrate,
)
from lockgate_adapters.settings import RetryPolicy

CLUSTERS = 50
NODES_PER_CLUSTER = 400
QUEUES = 1_000
REQUESTS = 200
NODE_CPU = 16_000
NODE_MEMORY = 64 * 2**30
# Queued shapes (cpu millicores, memory bytes): small, medium, large, as the simulator's mix.
SHAPES = ((500, 2**30), (2_000, 4 * 2**30), (8_000, 16 * 2**30))
TARGET_P99_MS = 200.0
LOAD_SECONDS = 900.0  # the leader's first load of a million rows, at most


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def cluster_name(run: str, index: int) -> str:
    return f"lv{run}-{index:02d}"


def queued_rows(run: str, queued: int) -> list[JobRow]:
    now = datetime.now(UTC)
    rows = []
    for i in range(queued):
        cpu, memory = SHAPES[i % len(SHAPES)]
        rows.append(JobRow(
            cluster=cluster_name(run, i % CLUSTERS), uid=str(uuid.UUID(int=i + 1)),
            namespace=f"ns-{i % 20}", name=f"pod-{i}", queue=f"q-{i % QUEUES:04d}",
            jobset=f"js-{i % 100}", priority=(i % 11 == 0) * 10,
            requests={"cpu": cpu, "memory": memory}, state=JobState.QUEUED, node_name=None,
            created_at=now - timedelta(seconds=queued - i), state_changed_at=now))
    return rows


def running_rows(run: str) -> list[JobRow]:
    """One running pod filling each node, of every queue in turn."""
    now = datetime.now(UTC)
    rows = []
    for c in range(CLUSTERS):
        for n in range(NODES_PER_CLUSTER):
            i = c * NODES_PER_CLUSTER + n
            rows.append(JobRow(
                cluster=cluster_name(run, c), uid=str(uuid.UUID(int=10**9 + i)),
                namespace="ns-run", name=f"run-{i}", queue=f"q-{i % QUEUES:04d}",
                jobset=f"run-{i % 10}", priority=0,
                requests={"cpu": NODE_CPU, "memory": NODE_MEMORY}, state=JobState.RUNNING,
                node_name=f"node-{n}", created_at=now - timedelta(hours=1),
                state_changed_at=now, running_at=now))
    return rows


async def fill(pool: asyncpg.Pool, run: str, queued: int) -> None:
    async with pool.acquire() as connection:
        # q-0000 is cordoned: its pods wait for good, so the calls about one of them ask about
        # a waiting pod however many the rounds release meanwhile.
        await connection.execute(
            "INSERT INTO queues (name, priority_factor, namespaces, cordoned)"
            " SELECT 'q-' || lpad(i::text, 4, '0'), 1 + (i % 3), '[]'::jsonb, i = 0"
            " FROM generate_series(0, $1 - 1) AS i", QUEUES)
        await connection.execute(
            "INSERT INTO cluster_nodes (cluster, node, allocatable, unmanaged_usage,"
            " schedulable, present, observed_at, labels, taints)"
            " SELECT 'lv' || $1 || '-' || lpad(c::text, 2, '0'), 'node-' || n,"
            " jsonb_build_object('cpu', $2::bigint, 'memory', $3::bigint), '{}'::jsonb, true,"
            " true, now(), '{}'::jsonb, '[]'::jsonb"
            " FROM generate_series(0, $4 - 1) AS c, generate_series(0, $5 - 1) AS n",
            run, NODE_CPU, NODE_MEMORY, CLUSTERS, NODES_PER_CLUSTER)
        rows = running_rows(run) + queued_rows(run, queued)
        for start in range(0, len(rows), 20_000):
            async with connection.transaction():
                await job_store.upsert_jobs(connection, rows[start:start + 20_000])
        # As autovacuum leaves a table that stopped growing (visibility map set, statistics).
        await connection.execute("VACUUM ANALYZE jobs")


async def keep_rounds_going(pool: asyncpg.Pool, run: str, stopping: asyncio.Event) -> int:
    """End a few running pods every half second (as pods finish), so the leader's rounds keep
    releasing queued ones into the room; returns how many ended."""
    ended = 0
    while not stopping.is_set():
        async with pool.acquire() as connection, connection.transaction():
            done = await connection.fetch(
                "UPDATE jobs SET state = 'succeeded', state_changed_at = now(),"
                " finished_at = now(), serial = nextval('change_serial'),"
                " writer_xid = pg_current_xact_id()::text::bigint"
                " WHERE (cluster, uid) IN (SELECT cluster, uid FROM jobs"
                "  WHERE cluster LIKE $1 AND state = 'running' LIMIT 5) RETURNING uid",
                f"lv{run}-%")
            await connection.execute("SELECT pg_notify($1, 'bench')", CHANGES_CHANNEL)
        ended += len(done)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), 0.5)
    return ended


async def leader_round(port: int) -> dict[str, Any] | None:
    try:
        async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{port}/api/v1/fairness",
                timeout=aiohttp.ClientTimeout(total=5)) as response:
            body = await response.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return body.get("last_round") if body.get("leader") else None


async def round_seconds(port: int) -> tuple[float, float]:
    """The leader's rounds so far: (seconds in all, how many), from its histogram."""
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    found = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for kind in found:
            if line.startswith(f"lockgate_scheduler_round_duration_seconds_{kind} "):
                found[kind] = float(line.split()[1])
    return found["sum"], found["count"]


async def timings(fetch: Callable[[int], Awaitable[None]]) -> list[float]:
    await fetch(REQUESTS)  # warm: connections, plans, the round's explainer
    times = []
    for request in range(REQUESTS):
        started = time.perf_counter()
        await fetch(request)
        times.append((time.perf_counter() - started) * 1000)
    return times


def p99(times: list[float]) -> float:
    return statistics.quantiles(times, n=100, method="inclusive")[98]


def calls(run: str, queued: int) -> dict[str, Callable[[int], str]]:
    """The calls, by the request's number: the four, each about a pod in the middle of the line
    of the cordoned queue, asked again and again as a UI page refreshing or `explain` run
    again asks; and `explain` of a pod nobody asked about before, a different one each time
    (anywhere in any queue), which the leader has not explained yet."""
    i = queued // 2 // QUEUES * QUEUES
    cluster, pod = cluster_name(run, i % CLUSTERS), f"pod-{i}"

    def first_ask(request: int) -> str:
        j = (request * 7919 + 1) % queued
        return f"/api/v1/explain/{cluster_name(run, j % CLUSTERS)}/ns-{j % 20}/pod-{j}"

    return {
        "status": lambda _: "/api/v1/status",
        "explain": lambda _: f"/api/v1/explain/{cluster}/ns-{i % 20}/{pod}",
        "ui_queue_page": lambda _: f"/api/v1/queues/q-{i % QUEUES:04d}/waiting?limit=50",
        "ui_pod_page": lambda _: f"/api/v1/pods/{cluster}/ns-{i % 20}/{pod}",
        "explain_first_ask": first_ask,
    }


async def measure(stack: Any, queued: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    run = uuid.uuid4().hex[:6]
    database = f"bench_leader_{run}"
    dsn = await create_database(stack.postgres_dsn, database)
    token = new_token()
    facts: dict[str, Any] = {}
    try:
        pool = await connect_pool(dsn, policy=RetryPolicy(), max_size=6)
        try:
            await migrate(pool)
            started = time.perf_counter()
            await fill(pool, run, queued)
            facts["fill_seconds"] = round(time.perf_counter() - started, 1)
            port = free_port()
            scheduler = ServiceProcess(f"bench-leader-{run}", "fair_scheduler", {
                "LOCKGATE_POSTGRES_DSN": service_dsn(dsn, "fair-scheduler"),
                "LOCKGATE_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
                "LOCKGATE_SCHEDULER_INSTANCE_ID": f"bench-{run}",
                "LOCKGATE_SCHEDULER_HTTP_PORT": str(port),
                # No ungater answers here: uncapped, its releases in flight never pace it, and
                # each pod ended makes room that the next round fills.
                "LOCKGATE_SCHEDULER_MAX_RELEASES_IN_FLIGHT_PER_CLUSTER": "0"},
                health_port=port)
            await scheduler.start()
            try:
                started = time.perf_counter()
                deadline = time.monotonic() + LOAD_SECONDS
                while await leader_round(port) is None:
                    if not scheduler.alive() or time.monotonic() > deadline:
                        raise RuntimeError("the leader did not finish its first round:\n"
                                           + scheduler.log_tail())
                    await asyncio.sleep(1)
                facts["leader_first_round_seconds"] = round(time.perf_counter() - started, 1)
                found = await _timed_calls(pool, dsn, run, queued, token, port, facts)
            finally:
                await scheduler.stop()
            return found, facts
        finally:
            await pool.close()
    finally:
        await drop_database(stack.postgres_dsn, database)


async def _timed_calls(pool: asyncpg.Pool, dsn: str, run: str, queued: int, token: str,
                       port: int, facts: dict[str, Any]) -> dict[str, list[float]]:
    stopping = asyncio.Event()
    writer = asyncio.create_task(keep_rounds_going(pool, run, stopping))
    first = await leader_round(port)
    found: dict[str, list[float]] = {}
    try:
        async with read_only_admin(pool, dsn, token,
                                   scheduler_urls=[f"http://127.0.0.1:{port}"]) as admin_port, \
                aiohttp.ClientSession(f"http://127.0.0.1:{admin_port}",
                                      headers={"Authorization": f"Bearer {token}"}) as session:
            rounds_before = await round_seconds(port)
            partial: set[int] = set()  # first asks answered with the round's reason alone
            for name, path_of in calls(run, queued).items():
                async def get(request: int, path_of: Callable[[int], str] = path_of,
                              name: str = name) -> None:
                    path = path_of(request)
                    async with session.get(path) as response:
                        assert response.status == 200, (path, await response.text())
                        body = orjson.loads(await response.read())
                    if name == "explain":  # an answer from the leader, not "unavailable"
                        assert body["explanation"] is not None, body
                    if name == "explain_first_ask" and body.get("partial"):
                        partial.add(request)  # the round's reason, given off the loop
                found[name] = await timings(get)
            facts["first_asks_answered_from_the_rounds_record"] = len(partial - {REQUESTS})
            # A probe, not a call a user makes: the leader's fairness answer asked directly
            # (encoded once per round, no Postgres, no queue-store): what is left is the
            # leader's HTTP thread getting the GIL from a round, and the box.
            async with aiohttp.ClientSession() as direct:
                async def leader_direct(_: int) -> None:
                    async with direct.get(f"http://127.0.0.1:{port}/api/v1/fairness") as answer:
                        assert answer.status == 200
                        await answer.read()
                found["probe_leader_fairness_direct"] = await timings(leader_direct)
            rounds_after = await round_seconds(port)
            count = rounds_after[1] - rounds_before[1]
            facts["leader_round_mean_ms"] = (
                None if count <= 0 else
                round((rounds_after[0] - rounds_before[0]) / count * 1000, 1))
    finally:
        stopping.set()
        facts["pods_ended_meanwhile"] = await writer
        last = await leader_round(port)
        facts["rounds_meanwhile"] = (0 if first is None or last is None
                                     else last["number"] - first["number"])
    return found


def needed_stack() -> Any:
    """The stack's Postgres and Kafka, started if they are not running (and nothing else: the
    bench needs no Kubernetes control plane, whose apiservers would share the 2 cores)."""
    stack = Stack()
    for component in ("postgres", "kafka"):
        stack.start_component(component)
    return stack.info()


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=int, default=1_000)
    args = parser.parse_args(argv)
    stack = needed_stack()
    base, base_facts = await measure(stack, args.baseline)
    big, big_facts = await measure(stack, args.queued)
    for name, times in big.items():
        emit({"name": f"leader_view_{name}", "queued": args.queued,
              "p50_ms": round(statistics.median(times), 2), "p99_ms": round(p99(times), 2),
              "baseline_queued": args.baseline,
              "baseline_p50_ms": round(statistics.median(base[name]), 2),
              "baseline_p99_ms": round(p99(base[name]), 2),
              "ratio_p99_to_baseline": round(p99(times) / p99(base[name]), 2),
              "target_p99_ms": TARGET_P99_MS, "met": p99(times) <= TARGET_P99_MS})
    emit({"name": "leader_view_setup", "queued": args.queued, **big_facts,
          "baseline_queued": args.baseline,
          **{f"baseline_{k}": v for k, v in base_facts.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
