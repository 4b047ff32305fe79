"""Writers scale out (issue 19, item 4): several writers commit concurrently, and a follower of
the change feed still misses nothing.

Two queue-store processes share one consumer group (so each ingests some of the topics'
partitions) and one database; meanwhile a stand-in for the scheduler's leader releases queued
jobs (`scheduler_store.record_releases`, `mark_published`) and the ungaters' outcomes come back
through Kafka, and two followers read the change feed as fast as they can: the scheduler's own
(`load_everything`, then `changes_since`) and a raw one that also checks each row version is
delivered once. Pod events, deletions, capacity reports and snapshots of two clusters all flow.

At the end: each follower's picture equals the tables, no job was released twice, and Postgres
detected no deadlock (the writers lock rows in one global order: job_store's docstring). A second
test stresses that order harder than Kafka's partitioning ever would: six ingest writers on the
same pods at once (it found deadlocks before job keys were locked by bucket first).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata

from devstack.launcher import ServiceProcess
from devstack.ports import free_port
from helpers.kafka import wait_committed_past
from helpers.postgres import fresh_database
from helpers.queue_store import QueueStoreUnderTest, stored_events
from helpers.services import FAST_RETRY
from lockgate.change_feed import START, FeedCursor
from lockgate.events import (
    CLUSTER_CAPACITY,
    CLUSTER_SNAPSHOTS,
    POD_EVENTS,
    RELEASE_OUTCOMES,
    ClusterCapacity,
    ClusterSnapshot,
    Event,
    NodeCapacity,
    PodEvent,
    ReleaseOutcome,
    ReleaseOutcomeKind,
    Topic,
)
from lockgate.jobs import JobState
from lockgate_adapters import scheduler_store
from lockgate_adapters.kafka import make_producer
from lockgate_adapters.postgres import connect_pool

pytestmark = [pytest.mark.timeout(300)]

PODS_PER_CLUSTER = 300
MS = timedelta(milliseconds=1)


@dataclasses.dataclass
class Instances:
    spec: QueueStoreUnderTest
    processes: list[ServiceProcess]
    dsn: str


@pytest.fixture
async def instances(pg_dsn: str, kafka_bootstrap: str) -> AsyncIterator[Instances]:
    """Two queue-store processes in one consumer group, on one fresh database."""
    async with fresh_database(pg_dsn, prefix="writers_it") as dsn:
        spec = QueueStoreUnderTest(postgres_dsn=dsn, kafka_bootstrap=kafka_bootstrap)
        processes = [await spec.start(f"queue-store-writers-{uuid.uuid4().hex[:6]}")]
        try:
            # The second shares the group (and the database), with ports of its own.
            second = dataclasses.replace(spec, admin_port=free_port(), health_port=free_port())
            process = second.process(f"queue-store-writers-{uuid.uuid4().hex[:6]}")
            processes.append(process)
            await process.start()
            await process.wait_ready()
            yield Instances(spec, processes, dsn)
        finally:
            for process in processes:
                code = await process.stop()
                assert code == 0, process.log_tail()


@pytest.fixture
async def producer(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    producer = make_producer(kafka_bootstrap, client_id="writers-it")
    await producer.start()
    yield producer
    await producer.stop()


async def publish(producer: AIOKafkaProducer, topic: Topic[Any],
                  events: list[Event]) -> list[RecordMetadata]:
    futures = [await producer.send(topic.name, topic.encode(e), key=topic.key_bytes(e))
               for e in events]
    return list(await asyncio.gather(*futures))


def pod(cluster: str, uid: str, state: JobState, seen: datetime) -> PodEvent:
    return PodEvent(event_id=uuid.uuid4().hex, cluster=cluster, namespace="team-a",
                    name=f"pod-{uid}", uid=uid, state=state, queue="research",
                    jobset="sweep", requests={"cpu": 100},
                    created_at=seen - timedelta(seconds=60), observed_at=seen)


def capacity(cluster: str, round_: int, at: datetime) -> ClusterCapacity:
    return ClusterCapacity(cluster=cluster, observed_at=at,
                           nodes=[NodeCapacity(name=f"n{i}", allocatable={"cpu": 1000 * round_})
                                  for i in range(round_ % 3 + 1)])


@dataclasses.dataclass
class Follower:
    """The scheduler's reading of the feed, kept as plain pictures of the rows."""

    jobs: dict[str, JobState] = dataclasses.field(default_factory=dict)
    nodes: dict[tuple[str, str], dict[str, int] | None] = dataclasses.field(default_factory=dict)
    reads: int = 0

    def apply(self, changes: scheduler_store.Changes) -> None:
        for job in changes.jobs:
            self.jobs[job.job_id] = job.state
        for node in changes.nodes:
            self.nodes[(node.cluster, node.node)] = (
                None if node.info is None else dict(node.info.allocatable))
        self.reads += 1


async def follow(dsn: str, follower: Follower, stop: asyncio.Event) -> None:
    connection = await scheduler_store.connect(dsn)
    try:
        everything = await scheduler_store.load_everything(connection)
        follower.apply(everything)
        cursor = everything.cursor
        while True:
            changes = await scheduler_store.changes_since(connection, cursor)
            follower.apply(changes)
            cursor = changes.cursor
            if stop.is_set():  # one more read after the writers stopped: this one
                return
            await asyncio.sleep(0.005)
    finally:
        await connection.close()


async def follow_raw(dsn: str, versions: dict[str, list[int]], stop: asyncio.Event) -> None:
    """Every job row version delivered, by serial: each must come once, in order."""
    connection = await asyncpg.connect(dsn)
    cursor = START
    try:
        while True:
            async with connection.transaction(isolation="repeatable_read", readonly=True):
                newest = FeedCursor.from_snapshot(
                    await connection.fetchval("SELECT pg_current_snapshot()::text"))
                rows = await connection.fetch(
                    "SELECT cluster, uid, serial FROM jobs"
                    " WHERE writer_xid >= $1 OR writer_xid = ANY($2::bigint[])",
                    cursor.xmax, list(cursor.in_progress))
            cursor = newest
            for row in rows:
                versions.setdefault(f"{row['cluster']}/{row['uid']}", []).append(row["serial"])
            if stop.is_set():
                return
            await asyncio.sleep(0.003)
    finally:
        await connection.close()


async def lead(dsn: str, clusters: list[str], producer: AIOKafkaProducer, stop: asyncio.Event,
               landed: list[RecordMetadata]) -> int:
    """Release queued jobs as the leader does, publish and record outcomes; returns how many."""
    connection = await scheduler_store.connect(dsn)
    released = 0
    try:
        while not stop.is_set():
            queued = await connection.fetch(
                "SELECT cluster, uid FROM jobs WHERE cluster = ANY($1::text[])"
                " AND state = 'queued' ORDER BY random() LIMIT 40", clusters)
            # Half of them, and some twice: a decision on a job released meanwhile is dropped.
            picked = [(r["cluster"], r["uid"]) for r in queued if random.random() < 0.5]
            picked += picked[: len(picked) // 4]
            recorded = await scheduler_store.record_releases(
                connection, decisions=[(uuid.uuid4().hex, c, u) for c, u in picked],
                decided_at=datetime.now(UTC), decided_by="writers-it")
            released += len(recorded)
            if recorded:
                await scheduler_store.mark_published(
                    connection, [r.decision_id for r in recorded], datetime.now(UTC))
                landed += await publish(producer, RELEASE_OUTCOMES, [
                    ReleaseOutcome(decision_id=r.decision_id, cluster=r.cluster, uid=r.uid,
                                   outcome=ReleaseOutcomeKind.UNGATED, at=datetime.now(UTC))
                    for r in recorded])
            await asyncio.sleep(0.01)
    finally:
        await connection.close()
    return released


async def test_two_queue_stores_and_the_leader_write_concurrently_and_the_feed_misses_nothing(
        instances: Instances, producer: AIOKafkaProducer) -> None:
    clusters = [f"wr-{uuid.uuid4().hex[:8]}-{name}" for name in ("a", "b")]
    pool = await connect_pool(instances.dsn, policy=FAST_RETRY)
    deadlocks_before = await pool.fetchval(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    stop_leading, stop_following = asyncio.Event(), asyncio.Event()
    follower, versions = Follower(), dict[str, list[int]]()
    landed: list[RecordMetadata] = []
    tasks = [asyncio.create_task(follow(instances.dsn, follower, stop_following)),
             asyncio.create_task(follow_raw(instances.dsn, versions, stop_following))]
    leader = asyncio.create_task(lead(instances.dsn, clusters, producer, stop_leading, landed))
    try:
        # Event times before any release: a snapshot lists every pod stored before it, so it
        # changes no job, whatever order it is folded in; its locks are what it exercises.
        base = datetime.now(UTC) - timedelta(seconds=1)
        uids = {cluster: [f"{cluster}-p{i}" for i in range(PODS_PER_CLUSTER)]
                for cluster in clusters}
        for step in range(10):  # in waves, so the leader releases between them
            chunk = slice(step * PODS_PER_CLUSTER // 10, (step + 1) * PODS_PER_CLUSTER // 10)
            events: list[Event] = []
            for cluster in clusters:
                events += [pod(cluster, uid, JobState.QUEUED, base + 10 * step * MS)
                           for uid in uids[cluster][chunk]]
                # Every third pod of the previous wave goes away (queued or released).
                if step:
                    previous = slice((step - 1) * PODS_PER_CLUSTER // 10,
                                     step * PODS_PER_CLUSTER // 10)
                    events += [pod(cluster, uid, JobState.DELETED, base + (10 * step + 5) * MS)
                               for uid in uids[cluster][previous][::3]]
            landed += await publish(producer, POD_EVENTS, events)
            landed += await publish(producer, CLUSTER_CAPACITY,
                                    [capacity(cluster, step + 1, base + 10 * step * MS)
                                     for cluster in clusters])
            landed += await publish(producer, CLUSTER_SNAPSHOTS, [ClusterSnapshot(
                snapshot_id=uuid.uuid4().hex, cluster=cluster,
                listed_at=base + (10 * step + 2) * MS,
                pod_uids=uids[cluster][: (step + 1) * PODS_PER_CLUSTER // 10])
                for cluster in clusters])
            await asyncio.sleep(0.3)
        await asyncio.sleep(1)
        stop_leading.set()
        released = await leader
        await wait_committed_past(instances.spec.kafka_bootstrap, instances.spec.group_id,
                                  landed, within=90)
        stop_following.set()
        await asyncio.gather(*tasks)
    finally:
        stop_leading.set()
        stop_following.set()
        for task in [*tasks, leader]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    try:
        rows = await pool.fetch(
            "SELECT cluster, uid, state, serial, release_attempts FROM jobs"
            " WHERE cluster = ANY($1::text[])", clusters)
        table = {f"{r['cluster']}/{r['uid']}": JobState(r["state"]) for r in rows}
        assert len(table) == 2 * PODS_PER_CLUSTER
        mine = {job_id: state for job_id, state in follower.jobs.items()
                if job_id.split("/")[0] in clusters}
        assert mine == table, "the scheduler's follower ended with another picture"
        nodes = {(r["cluster"], r["node"]): dict(r["allocatable"]) if r["present"] else None
                 for r in await pool.fetch(
                     "SELECT cluster, node, present, allocatable FROM cluster_nodes"
                     " WHERE cluster = ANY($1::text[])", clusters)}
        assert {key: value for key, value in follower.nodes.items()
                if key[0] in clusters} == nodes
        # The raw follower: every row version once, in order, the last one the table's.
        for r in rows:
            seen = versions[f"{r['cluster']}/{r['uid']}"]
            assert seen == sorted(set(seen)), f"{r['uid']}: versions {seen}"
            assert seen[-1] == r["serial"]
        # No double release, and the leader's count is the table's.
        assert max(r["release_attempts"] for r in rows) == 1
        decisions = await pool.fetch(
            "SELECT cluster, uid, count(*) AS n FROM release_decisions"
            " WHERE cluster = ANY($1::text[]) GROUP BY cluster, uid", clusters)
        assert all(d["n"] == 1 for d in decisions)
        assert released == len(decisions) == sum(r["release_attempts"] for r in rows) > 50
        ungated = await pool.fetchval(
            "SELECT count(*) FROM release_decisions WHERE cluster = ANY($1::text[])"
            " AND outcome = 'ungated' AND published_at IS NOT NULL", clusters)
        assert ungated == released
        assert follower.reads > 20
        # Both instances stored batches, and are still up.
        for process in instances.processes:
            assert process.alive(), process.log_tail()
            assert await stored_events(process) > 0, process.log_tail()
        await asyncio.sleep(1)  # statistics are flushed within a second
        deadlocks = await pool.fetchval(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        assert deadlocks == deadlocks_before, "Postgres broke a deadlock between writers"
    finally:
        await pool.close()


async def test_writers_of_the_same_rows_never_deadlock(pg_dsn: str) -> None:
    """Many ingest transactions on overlapping rows (pods in any order, deletions with their
    places, snapshots and capacity reports of the same clusters, outcomes of decisions being
    marked published) and the leader's releases, all at once: none may deadlock (no retry here:
    a `DeadlockDetectedError` fails the test), and the follower ends with the table."""
    from queue_store.ingesting import store_events

    clusters = [f"dl-{uuid.uuid4().hex[:8]}-{name}" for name in ("a", "b")]
    uids = {cluster: [f"{cluster}-p{i}" for i in range(120)] for cluster in clusters}
    decisions: list[scheduler_store.RecordedRelease] = []
    base = datetime.now(UTC) - timedelta(seconds=30)
    stop = asyncio.Event()

    def batch(rng: random.Random) -> list[Any]:
        events: list[Any] = []
        for _ in range(60):
            cluster = rng.choice(clusters)
            state = rng.choice([JobState.QUEUED, JobState.QUEUED, JobState.RUNNING,
                                JobState.DELETED])
            events.append(pod(cluster, rng.choice(uids[cluster]), state,
                              base + rng.randrange(20_000) * MS))
        if rng.random() < 0.3:
            cluster = rng.choice(clusters)
            events.append(ClusterSnapshot(
                snapshot_id=uuid.uuid4().hex, cluster=cluster,
                listed_at=base + rng.randrange(20_000) * MS,
                pod_uids=rng.sample(uids[cluster], 100)))
        if rng.random() < 0.3:
            events.append(capacity(rng.choice(clusters), rng.randrange(1, 50),
                                   base + rng.randrange(20_000) * MS))
        events += [ReleaseOutcome(decision_id=d.decision_id, cluster=d.cluster, uid=d.uid,
                                  outcome=ReleaseOutcomeKind.UNGATED, at=datetime.now(UTC))
                   for d in rng.sample(decisions, min(len(decisions), 20))]
        rng.shuffle(events)
        return events

    async def ingest(pool: asyncpg.Pool, seed: int) -> int:
        rng, batches = random.Random(seed), 0
        while not stop.is_set():
            await store_events(pool, batch(rng))
            batches += 1
        return batches

    async def lead(dsn: str) -> None:
        connection = await scheduler_store.connect(dsn)
        try:
            while not stop.is_set():
                queued = await connection.fetch(
                    "SELECT cluster, uid FROM jobs WHERE state = 'queued'"
                    " ORDER BY random() LIMIT 50")
                recorded = await scheduler_store.record_releases(
                    connection, decisions=[(uuid.uuid4().hex, r["cluster"], r["uid"])
                                           for r in queued],
                    decided_at=datetime.now(UTC), decided_by="deadlock-it")
                await scheduler_store.mark_published(
                    connection, [d.decision_id for d in decisions[-200:]], datetime.now(UTC))
                decisions.extend(recorded)
        finally:
            await connection.close()

    async with fresh_database(pg_dsn, prefix="writers_dl", migrated=True) as dsn:
        pool = await connect_pool(dsn, policy=FAST_RETRY, max_size=8)
        follower = Follower()
        try:
            tasks = [asyncio.create_task(ingest(pool, seed)) for seed in range(6)]
            tasks.append(asyncio.create_task(lead(dsn)))
            reader = asyncio.create_task(follow(dsn, follower, stop))
            await asyncio.sleep(8)
            stop.set()
            results = await asyncio.gather(*tasks, reader, return_exceptions=True)
            errors = [r for r in results if isinstance(r, BaseException)]
            assert not errors, errors
            assert sum(r for r in results[:6] if isinstance(r, int)) > 30
            assert decisions
            table = {f"{r['cluster']}/{r['uid']}": JobState(r["state"]) for r in await pool.fetch(
                "SELECT cluster, uid, state FROM jobs")}
            assert follower.jobs == table
        finally:
            stop.set()
            await pool.close()
