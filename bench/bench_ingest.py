"""Ingest benchmark: how fast pod events get from Kafka into Postgres through queue-store.

Measured in one run, on the local stack, each on a fresh database:
- baselines: a raw `executemany` INSERT of the same job rows, and a raw COPY of them
  (`copy_records_to_table`), no Kafka, no folding;
- store only: queue-store's transaction (lock, read FOR UPDATE, fold, bulk write) called
  directly in batches, no Kafka;
- end to end: a burst of N pod events published to Kafka while queue-store runs as a process;
  timed from the first publish to the last row visible in Postgres. Then the same N pods move
  to RUNNING (updates instead of inserts). With `--instances 1,2`, once per number of
  queue-store processes sharing one consumer group (and one database): each instance ingests
  some of the topic's partitions, and their transactions commit concurrently (no change-feed
  lock since migration 032). On a machine with few cores the ratio between them shows the cost
  of that coordination, not a speed-up.

Prints one JSON object per measurement; rates are events per second, with the ratios to both
baselines measured in the same run (`ratio_to_baseline`: executemany; `ratio_to_copy_baseline`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

import devstack
from devstack.launcher import ServiceProcess
from devstack.ports import free_port
from devstack.roles import prepare_database
from lockgate.events import POD_EVENTS, PodEvent
from lockgate.jobs import JobState
from lockgate_adapters.kafka import make_producer, publish_many
from lockgate_adapters.postgres import connect_pool, create_database, drop_database, migrate
from lockgate_adapters.settings import RetryPolicy
from queue_store.ingesting import store_events

# The isolated queue-store of the integration tests (tests/helpers/queue_store.py), imported as
# pytest imports it: with tests/ on the path. It is a test helper, kept out of the service.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers.queue_store import QueueStoreUnderTest, stored_events

MAX_EVENTS = 200_000


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def pod_events(cluster: str, count: int, state: JobState = JobState.QUEUED) -> list[PodEvent]:
    now = datetime.now(UTC)
    return [PodEvent(event_id=f"{cluster}-{i}-{state}", cluster=cluster, namespace="bench",
                     name=f"pod-{i}", uid=f"{cluster}-{i}", state=state,
                     queue=f"queue-{i % 8}", jobset=f"jobset-{i % 50}",
                     requests={"cpu": 500, "memory": 2**30},
                     created_at=now - timedelta(seconds=1), observed_at=now)
            for i in range(count)]


_BASELINE_COLUMNS = ("cluster", "uid", "namespace", "name", "queue", "jobset", "priority",
                     "requests", "state", "created_at")


def _baseline_rows(events: Sequence[PodEvent]) -> list[tuple[object, ...]]:
    """The job rows both baselines write: what ingest stores for a new pod."""
    return [(e.cluster, e.uid, e.namespace, e.name, e.queue, e.jobset, e.priority,
             json.dumps(e.requests), e.state.value, e.created_at) for e in events]


async def baseline_executemany(dsn: str, events: Sequence[PodEvent]) -> float:
    """Seconds for a plain executemany of the same rows: the floor of any ingest path."""
    connection = await asyncpg.connect(dsn)
    try:
        rows = _baseline_rows(events)
        started = time.perf_counter()
        async with connection.transaction():
            await connection.executemany(
                "INSERT INTO jobs (cluster, uid, namespace, name, queue, jobset, priority,"
                " requests, state, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7,"
                " $8::jsonb, $9, $10)", rows)
        return time.perf_counter() - started
    finally:
        await connection.close()


async def baseline_copy(dsn: str, events: Sequence[PodEvent]) -> float:
    """Seconds for a raw COPY of the same rows: the fastest way in, and the stricter floor."""
    connection = await asyncpg.connect(dsn)
    try:
        rows = _baseline_rows(events)
        started = time.perf_counter()
        async with connection.transaction():
            await connection.copy_records_to_table(
                "jobs", columns=_BASELINE_COLUMNS, records=rows)
        return time.perf_counter() - started
    finally:
        await connection.close()


async def store_only(dsn: str, events: Sequence[PodEvent], batch: int) -> float:
    pool = await connect_pool(dsn, policy=RetryPolicy())
    try:
        started = time.perf_counter()
        for start in range(0, len(events), batch):
            await store_events(pool, events[start:start + batch])
        return time.perf_counter() - started
    finally:
        await pool.close()


async def count_until(pool: asyncpg.Pool, sql: str, args: Sequence[Any], expected: int,
                      started: float, within: float) -> float:
    while True:
        if await pool.fetchval(sql, *args) == expected:
            return time.perf_counter() - started
        if time.perf_counter() - started > within:
            raise TimeoutError(f"not all {expected} rows after {within}s")
        await asyncio.sleep(0.02)


async def start_instances(spec: QueueStoreUnderTest, instances: int,
                          env: dict[str, str]) -> list[ServiceProcess]:
    """`instances` queue-store processes in `spec`'s consumer group, each with ports of its
    own."""
    processes = [await spec.start(f"queue-store-bench-{spec.group_id}", env)]
    try:
        for i in range(1, instances):
            other = dataclasses.replace(spec, admin_port=free_port(), health_port=free_port())
            process = other.process(f"queue-store-bench-{spec.group_id}-{i}", env)
            processes.append(process)
            await process.start()
            await process.wait_ready()
    except BaseException:
        for process in processes:
            await process.stop()
        raise
    return processes


async def warm_up(producer: Any,
                  processes: list[ServiceProcess]) -> None:
    """Until every instance has stored events: the group has settled and each has partitions
    (else the burst would start on one instance and be rebalanced midway)."""
    deadline = time.perf_counter() + 120
    while True:
        await publish_many(producer, POD_EVENTS, pod_events(f"warm-{uuid.uuid4().hex[:8]}", 200))
        await asyncio.sleep(1)
        if all([await stored_events(process) > 0 for process in processes]):
            await asyncio.sleep(1)
            return
        if time.perf_counter() > deadline:
            raise TimeoutError("not every queue-store instance got partitions")


async def end_to_end(stack: devstack.StackInfo, dsn: str, count: int,
                     max_batch: int, instances: int = 1) -> list[tuple[float, float]]:
    """(seconds to publish, seconds to store) for `count` new pods, then for moving them all
    to RUNNING, with `instances` queue-store processes in one consumer group."""
    spec = QueueStoreUnderTest(postgres_dsn=dsn, kafka_bootstrap=stack.kafka_bootstrap)
    processes = await start_instances(spec, instances,
                                      {"LOCKGATE_QUEUE_STORE_MAX_BATCH": str(max_batch),
                                       # The local stack has one broker (production: 3, 2).
                                       "LOCKGATE_KAFKA_REPLICATION_FACTOR": "1",
                                       "LOCKGATE_KAFKA_MIN_INSYNC_REPLICAS": "1"})
    producer = make_producer(stack.kafka_bootstrap, client_id="bench-ingest")
    pool = await connect_pool(dsn, policy=RetryPolicy())
    try:
        await producer.start()
        await warm_up(producer, processes)
        cluster = f"bench-{uuid.uuid4().hex[:8]}"
        timings = []
        for state in (JobState.QUEUED, JobState.RUNNING):
            events = pod_events(cluster, count, state)
            started = time.perf_counter()
            await publish_many(producer, POD_EVENTS, events)
            published = time.perf_counter() - started
            timings.append((published, await count_until(
                pool, "SELECT count(*) FROM jobs WHERE cluster = $1 AND state = $2",
                (cluster, state.value), count, started, within=max(60.0, count / 100))))
        return timings
    finally:
        await producer.stop()
        await pool.close()
        for process in processes:
            await process.stop()


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=2000, help="queue-store's max batch")
    parser.add_argument("--instances", default="1",
                        help="numbers of queue-store processes to run end to end, e.g. 1,2")
    args = parser.parse_args(argv)
    instance_counts = [int(n) for n in args.instances.split(",")]
    count = min(max(args.events, 100), MAX_EVENTS)
    stack = devstack.ensure_up()

    databases: list[str] = []

    async def fresh_database() -> str:
        database = f"bench_ingest_{uuid.uuid4().hex[:12]}"
        dsn = await create_database(stack.postgres_dsn, database)
        databases.append(database)
        pool = await connect_pool(dsn, policy=RetryPolicy())
        try:
            await migrate(pool)
        finally:
            await pool.close()
        await prepare_database(dsn)  # queue-store runs as its own role
        return dsn

    try:
        events = pod_events(f"bench-{uuid.uuid4().hex[:8]}", count)
        baseline = count / await baseline_executemany(await fresh_database(), events)
        emit({"name": "ingest_baseline_executemany", "events": count,
              "events_per_second": round(baseline)})
        copy_baseline = count / await baseline_copy(await fresh_database(), events)
        emit({"name": "ingest_baseline_copy", "events": count,
              "events_per_second": round(copy_baseline)})

        def ratios(rate: float) -> dict[str, float]:
            return {"ratio_to_baseline": round(rate / baseline, 3),
                    "ratio_to_copy_baseline": round(rate / copy_baseline, 3)}

        seconds = await store_only(await fresh_database(), events, args.batch)
        emit({"name": "ingest_store_only", "events": count, "batch": args.batch,
              "seconds": round(seconds, 3), "events_per_second": round(count / seconds),
              **ratios(count / seconds)})

        for instances in instance_counts:
            inserted, updated = await end_to_end(stack, await fresh_database(), count,
                                                 args.batch, instances)
            suffix = "" if instances == 1 else f"_{instances}_instances"
            for name, (publishing, seconds) in (("ingest_end_to_end_new_pods", inserted),
                                                ("ingest_end_to_end_state_changes", updated)):
                emit({"name": name + suffix, "events": count, "batch": args.batch,
                      "instances": instances,
                      "seconds": round(seconds, 3), "events_per_second": round(count / seconds),
                      # The producer in this process is part of the time: its own rate.
                      "publish_events_per_second": round(count / publishing),
                      **ratios(count / seconds),
                      "baselines": ["ingest_baseline_executemany", "ingest_baseline_copy"]})
    finally:
        for database in databases:
            await drop_database(stack.postgres_dsn, database)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
