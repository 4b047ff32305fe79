"""queue-store on the real stack: Kafka in, Postgres out, as a real process.

Each test module gets a fresh database and a consumer group of its own that starts at the
topics' end (see `helpers.queue_store`), and each test its own cluster name, so rows never
collide with another test's. Events are published to the real topics with aiokafka; assertions
read Postgres directly. "Processed" is known exactly: queue-store commits a message's offset only
after its transaction, so once the group's committed offset passes a message, its effect is in
Postgres (`wait_processed`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata

from devstack.launcher import ServiceProcess
from helpers.kafka import (
    BAD_INPUTS,
    BadInput,
    TopicTail,
    max_message_bytes,
    produce_raw,
    wait_committed_past,
)
from helpers.network import TcpRelay
from helpers.postgres import fresh_database
from helpers.queue_store import QueueStoreUnderTest
from helpers.services import FAST_RETRY
from helpers.waiting import eventually
from lockgate.events import (
    CLUSTER_CAPACITY,
    CLUSTER_GROWTH,
    CLUSTER_SNAPSHOTS,
    DEAD_LETTERS,
    POD_EVENTS,
    RELEASE_OUTCOMES,
    ClusterCapacity,
    ClusterGrowth,
    ClusterSnapshot,
    DeadLetter,
    Event,
    NodeCapacity,
    NodePoolStatus,
    PodEvent,
    ReleaseOutcome,
    ReleaseOutcomeKind,
    Topic,
)
from lockgate.jobs import JobState
from lockgate_adapters.kafka import make_producer
from lockgate_adapters.postgres import CHANGES_CHANNEL, connect_pool
from queue_store.app import CONSUMED_TOPICS

pytestmark = [pytest.mark.timeout(300)]

NOW = datetime.now(UTC).replace(microsecond=0)


# Fixtures -------------------------------------------------------------------------------------

@dataclass
class RunningQueueStore:
    spec: QueueStoreUnderTest
    process: ServiceProcess


async def start_queue_store(spec: QueueStoreUnderTest, name: str,
                            **env: str) -> RunningQueueStore:
    return RunningQueueStore(spec, await spec.start(name, env))


@pytest.fixture(scope="module")
async def store_dsn(pg_dsn: str) -> AsyncIterator[str]:
    async with fresh_database(pg_dsn, prefix="queue_store_it") as dsn:
        yield dsn


@pytest.fixture
async def own_dsn(pg_dsn: str) -> AsyncIterator[str]:
    """A database for a test's own queue-store, which the module's instance does not write."""
    async with fresh_database(pg_dsn, prefix="queue_store_it") as dsn:
        yield dsn


@pytest.fixture(scope="module")
async def queue_store(store_dsn: str, kafka_bootstrap: str) -> AsyncIterator[RunningQueueStore]:
    name = f"queue-store-it-{uuid.uuid4().hex[:6]}"
    running = await start_queue_store(
        QueueStoreUnderTest(postgres_dsn=store_dsn, kafka_bootstrap=kafka_bootstrap), name,
        LOCKGATE_QUEUE_STORE_INSTANCE_ID=name)
    yield running
    assert await running.process.stop() == 0, running.process.log_tail()


@pytest.fixture(scope="module")
async def db(store_dsn: str, queue_store: RunningQueueStore) -> AsyncIterator[asyncpg.Pool]:
    """The module's database, once queue-store has migrated it."""
    pool = await connect_pool(store_dsn, policy=FAST_RETRY)
    yield pool
    await pool.close()


@pytest.fixture(scope="module")
async def producer(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    producer = make_producer(kafka_bootstrap, client_id="queue-store-it")
    await producer.start()
    yield producer
    await producer.stop()


@pytest.fixture
def cluster() -> str:
    return f"it-{uuid.uuid4().hex[:10]}"


# Builders and helpers --------------------------------------------------------------------------

def pod_event(cluster: str, uid: str, state: JobState = JobState.QUEUED, *,
              seen: float = 0, created: float = -60, **fields: Any) -> PodEvent:
    values: dict[str, Any] = {
        "event_id": uuid.uuid4().hex, "cluster": cluster, "namespace": "team-a",
        "name": f"pod-{uid}", "uid": uid, "state": state, "queue": "research",
        "jobset": "sweep-1", "requests": {"cpu": 1500, "memory": 2 * 2**30},
        "created_at": NOW + timedelta(seconds=created),
        "observed_at": NOW + timedelta(seconds=seen),
    }
    return PodEvent.model_validate({**values, **fields})


async def publish(producer: AIOKafkaProducer, topic: Topic[Any],
                  *events: Event) -> list[RecordMetadata]:
    """Publish in order (events of one key stay in order) and return where each landed."""
    futures = [await producer.send(topic.name, topic.encode(e), key=topic.key_bytes(e))
               for e in events]
    return list(await asyncio.gather(*futures))


async def publish_raw(producer: AIOKafkaProducer, topic: str, key: str,
                      value: bytes) -> RecordMetadata:
    return await producer.send_and_wait(topic, value, key=key.encode())


async def wait_processed(running: RunningQueueStore, landed: list[RecordMetadata],
                         within: float = 30) -> None:
    """Until queue-store's group has committed past every message in `landed`."""
    await wait_committed_past(running.spec.kafka_bootstrap, running.spec.group_id, landed,
                              within=within)


async def job(db: asyncpg.Pool, cluster: str, uid: str) -> asyncpg.Record | None:
    return await db.fetchrow("SELECT * FROM jobs WHERE cluster = $1 AND uid = $2", cluster, uid)


async def job_in_state(db: asyncpg.Pool, cluster: str, uid: str, state: JobState,
                       within: float = 30) -> asyncpg.Record:
    async def probe() -> asyncpg.Record | None:
        row = await job(db, cluster, uid)
        return row if row is not None and row["state"] == state else None

    return await eventually(probe, within=within, what=f"job {uid} {state}")


# Pod events -----------------------------------------------------------------------------------

async def test_pod_events_become_jobs_with_their_queue_jobset_requests_and_state(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    await publish(producer, POD_EVENTS,
                  pod_event(cluster, "u1", priority=7),
                  pod_event(cluster, "u2", queue="other", jobset="js-2",
                            requests={"cpu": 250, "nvidia.com/gpu": 1}))
    first = await job_in_state(db, cluster, "u1", JobState.QUEUED)
    second = await job_in_state(db, cluster, "u2", JobState.QUEUED)
    assert (first["namespace"], first["name"], first["queue"], first["jobset"],
            first["priority"]) == ("team-a", "pod-u1", "research", "sweep-1", 7)
    assert first["requests"] == {"cpu": 1500, "memory": 2 * 2**30}
    assert first["created_at"] == NOW - timedelta(seconds=60)
    assert (second["queue"], second["jobset"]) == ("other", "js-2")
    assert second["requests"] == {"cpu": 250, "nvidia.com/gpu": 1}
    jobsets = await db.fetch("SELECT queue, name FROM jobsets WHERE cluster = $1 ORDER BY 1",
                             cluster)
    assert [tuple(r) for r in jobsets] == [("other", "js-2"), ("research", "sweep-1")]


async def test_a_pod_of_a_queue_that_does_not_exist_is_stored_and_waits(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    await publish(producer, POD_EVENTS, pod_event(cluster, "u1", queue="no-such-queue"))
    row = await job_in_state(db, cluster, "u1", JobState.QUEUED)
    assert row["queue"] == "no-such-queue"
    assert await db.fetchval("SELECT count(*) FROM queues WHERE name = 'no-such-queue'") == 0


async def test_a_jobs_lifecycle_moves_forward_and_stamps_each_milestone_once(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    await publish(producer, POD_EVENTS,
                  pod_event(cluster, "u1", JobState.QUEUED, seen=0),
                  pod_event(cluster, "u1", JobState.UNGATED, seen=1),
                  pod_event(cluster, "u1", JobState.BOUND, seen=2, node_name="kwok-node-1"),
                  pod_event(cluster, "u1", JobState.RUNNING, seen=3, node_name="kwok-node-1"),
                  pod_event(cluster, "u1", JobState.RUNNING, seen=4, node_name="kwok-node-1"),
                  pod_event(cluster, "u1", JobState.SUCCEEDED, seen=9))
    row = await job_in_state(db, cluster, "u1", JobState.SUCCEEDED)
    assert row["node_name"] == "kwok-node-1"
    assert (row["ungated_at"], row["running_at"], row["finished_at"]) == (
        NOW + timedelta(seconds=1), NOW + timedelta(seconds=3), NOW + timedelta(seconds=9))


async def test_duplicate_and_out_of_order_events_never_move_a_job_backwards(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    await publish(producer, POD_EVENTS,
                  pod_event(cluster, "u1", JobState.RUNNING, seen=5, node_name="n1"))
    running = await job_in_state(db, cluster, "u1", JobState.RUNNING)

    stale = await publish(producer, POD_EVENTS,
                          pod_event(cluster, "u1", JobState.QUEUED, seen=1),
                          pod_event(cluster, "u1", JobState.UNGATED, seen=2),
                          pod_event(cluster, "u1", JobState.RUNNING, seen=5, node_name="n1"),
                          pod_event(cluster, "u1", JobState.QUEUED, seen=9))
    await wait_processed(queue_store, stale)

    after = await job(db, cluster, "u1")
    assert after is not None
    assert after["state"] == JobState.RUNNING
    # Nothing changed, so nothing was written: the scheduler is not told about a non-change.
    assert after["serial"] == running["serial"]
    assert after["state_changed_at"] == running["state_changed_at"]


async def test_changes_take_new_serials_and_are_notified(
        queue_store: RunningQueueStore, db: asyncpg.Pool, store_dsn: str,
        producer: AIOKafkaProducer, cluster: str) -> None:
    notified: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(store_dsn)
    try:
        await listener.add_listener(CHANGES_CHANNEL,
                                    lambda *args: notified.put_nowait(str(args[-1])))
        await publish(producer, POD_EVENTS, pod_event(cluster, "u1"))
        queued = await job_in_state(db, cluster, "u1", JobState.QUEUED)
        await publish(producer, POD_EVENTS, pod_event(cluster, "u1", JobState.UNGATED, seen=3))
        ungated = await job_in_state(db, cluster, "u1", JobState.UNGATED)
        assert ungated["serial"] > queued["serial"]
        payload = await asyncio.wait_for(notified.get(), timeout=10)
        assert "jobs" in payload
    finally:
        await listener.close()


async def test_each_stored_message_gets_a_span_in_the_trace_its_headers_carried(
        own_dsn: str, kafka_bootstrap: str, producer: AIOKafkaProducer, cluster: str) -> None:
    spec = QueueStoreUnderTest(postgres_dsn=own_dsn, kafka_bootstrap=kafka_bootstrap)
    running = await start_queue_store(spec, f"queue-store-trace-{cluster}",
                                      LOCKGATE_TRACE_CONSOLE="true")
    pool = await connect_pool(own_dsn, policy=FAST_RETRY)
    try:
        # A message with no trace first: it gets no span (no stray trace of its own).
        await publish_raw(producer, POD_EVENTS.name, "untraced",
                          POD_EVENTS.encode(pod_event(cluster, "untraced")))
        await job_in_state(pool, cluster, "untraced", JobState.QUEUED)
        trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
        event = pod_event(cluster, "traced")
        await producer.send_and_wait(
            POD_EVENTS.name, POD_EVENTS.encode(event), key=POD_EVENTS.key_bytes(event),
            headers=[("traceparent", f"00-{trace_id}-{parent_id}-01".encode())])
        await job_in_state(pool, cluster, "traced", JobState.QUEUED)

        async def span_logged() -> bool:
            text = running.process.log_path.read_text(errors="replace")
            return f'"trace_id": "0x{trace_id}"' in text and f'"parent_id": "0x{parent_id}"' in text

        await eventually(span_logged, within=10, what="the store span in the message's trace")
        text = running.process.log_path.read_text(errors="replace")
        assert text.count(f'"name": "queue-store store {POD_EVENTS.name}"') == 1, text[-3000:]
    finally:
        await pool.close()
        assert await running.process.stop() == 0, running.process.log_tail()


# Malformed messages ---------------------------------------------------------------------------

async def test_malformed_messages_are_dead_lettered_with_a_reason_and_later_ones_stored(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str, kafka_bootstrap: str) -> None:
    bad_json_key = f"{cluster}-bad-json"
    negative = pod_event(cluster, f"{cluster}-negative", requests={"cpu": -500})
    blank_uid = pod_event(cluster, "   ", name="blank")
    async with TopicTail(kafka_bootstrap, [DEAD_LETTERS]) as letters:
        await publish_raw(producer, POD_EVENTS.name, bad_json_key, b'{"v": 1, "uid": ')
        await publish(producer, POD_EVENTS, negative, blank_uid)
        await publish(producer, POD_EVENTS, pod_event(cluster, "good-after"))

        await job_in_state(db, cluster, "good-after", JobState.QUEUED)

        def mine(key: str) -> list[DeadLetter]:
            return letters.events(lambda d: d.source_key == key
                                  and d.consumer.endswith(POD_EVENTS.name))

        async def all_three() -> bool:
            return bool(mine(bad_json_key) and mine(negative.uid) and mine(blank_uid.uid))

        await eventually(all_three, within=30, what="three dead letters")
    (bad_json,) = {d.reason: d for d in mine(bad_json_key)}.values()
    assert bad_json.source_topic == POD_EVENTS.name
    assert "invalid PodEvent" in bad_json.reason
    assert bad_json.value is not None and bad_json.value.text == '{"v": 1, "uid": '
    assert any("cpu is negative" in d.reason for d in mine(negative.uid))
    assert any("uid must not be empty" in d.reason for d in mine(blank_uid.uid))
    assert await job(db, cluster, negative.uid) is None
    assert queue_store.process.alive()


# What each cluster may grow by (issue 35) ------------------------------------------------------

async def test_the_newest_growth_picture_wins_and_an_invalid_one_is_dead_lettered(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str, kafka_bootstrap: str) -> None:
    async def stored() -> ClusterGrowth | None:
        body = await db.fetchval("SELECT body FROM cluster_growth WHERE cluster = $1", cluster)
        return None if body is None else ClusterGrowth.model_validate(body)

    newer, older = a_growth_picture(cluster, seen=10), a_growth_picture(
        cluster, seen=5, cpu_limit=8_000)
    invalid = a_growth_picture(cluster, seen=20, autoscaled=False)  # yet lists a pool
    async with TopicTail(kafka_bootstrap, [DEAD_LETTERS]) as letters:
        landed = await publish(producer, CLUSTER_GROWTH, newer, older, invalid)
        await wait_processed(queue_store, landed)
        letter: DeadLetter = await letters.wait_for(
            lambda d: (d.source_topic, d.partition, d.offset) == (
                CLUSTER_GROWTH.name, landed[2].partition, landed[2].offset),
            what="the invalid picture's dead letter")
    assert "not autoscaled lists NodePools" in letter.reason
    assert await stored() == newer, "an older picture, or an invalid one, replaced the newest"
    serial = await db.fetchval("SELECT serial FROM cluster_growth WHERE cluster = $1", cluster)

    # The same picture observed later (a refresh) moves observed_at, not the change feed.
    refreshed = a_growth_picture(cluster, seen=30)
    await wait_processed(queue_store, await publish(producer, CLUSTER_GROWTH, refreshed))
    assert await stored() == refreshed
    assert await db.fetchval("SELECT serial FROM cluster_growth WHERE cluster = $1",
                             cluster) == serial
    changed = a_growth_picture(cluster, seen=40, cpu_limit=32_000)
    await wait_processed(queue_store, await publish(producer, CLUSTER_GROWTH, changed))
    assert await stored() == changed
    assert await db.fetchval("SELECT serial FROM cluster_growth WHERE cluster = $1",
                             cluster) > serial
    assert queue_store.process.alive()


# Messages a dead letter cannot copy as they are (issue 7) -------------------------------------

@dataclass(frozen=True)
class Follower:
    """A valid message of one topic, with the bad message's key (so, its partition), and how
    to tell that queue-store stored it."""

    key: Callable[[str], str]  # of the test's cluster
    send: Callable[[AIOKafkaProducer, asyncpg.Pool, str, str], Awaitable[list[RecordMetadata]]]
    stored: Callable[[asyncpg.Pool, str, str], Awaitable[object]]


async def send_pod_event(producer: AIOKafkaProducer, db: asyncpg.Pool, cluster: str,
                         uid: str) -> list[RecordMetadata]:
    return await publish(producer, POD_EVENTS, pod_event(cluster, uid))


async def send_snapshot(producer: AIOKafkaProducer, db: asyncpg.Pool, cluster: str,
                        _: str) -> list[RecordMetadata]:
    return await publish(producer, CLUSTER_SNAPSHOTS, ClusterSnapshot(
        snapshot_id=f"snap-{cluster}", cluster=cluster, listed_at=NOW, pod_uids=[]))


async def send_capacity(producer: AIOKafkaProducer, db: asyncpg.Pool, cluster: str,
                        _: str) -> list[RecordMetadata]:
    return await publish(producer, CLUSTER_CAPACITY, capacity(cluster, 0, n1=4000))


async def send_outcome(producer: AIOKafkaProducer, db: asyncpg.Pool, cluster: str,
                       uid: str) -> list[RecordMetadata]:
    await publish(producer, POD_EVENTS, pod_event(cluster, uid))
    await job_in_state(db, cluster, uid, JobState.QUEUED)
    await record_release(db, cluster, uid, f"{cluster}-d1")
    return await publish(producer, RELEASE_OUTCOMES,
                         outcome(cluster, uid, f"{cluster}-d1", ReleaseOutcomeKind.UNGATED))


async def snapshot_recorded(db: asyncpg.Pool, cluster: str, _: str) -> object:
    return await db.fetchval("SELECT last_snapshot_id FROM clusters WHERE name = $1",
                             cluster) == f"snap-{cluster}"


async def node_recorded(db: asyncpg.Pool, cluster: str, _: str) -> object:
    return await db.fetchval("SELECT present FROM cluster_nodes WHERE cluster = $1"
                             " AND node = 'n1'", cluster)


def a_growth_picture(cluster: str, *, seen: float = 0, cpu_limit: int = 64_000,
                     **fields: Any) -> ClusterGrowth:
    values: dict[str, Any] = {
        "cluster": cluster, "observed_at": NOW + timedelta(seconds=seen), "autoscaled": True,
        "node_pools": [NodePoolStatus(name="default", limits={"cpu": cpu_limit})]}
    return ClusterGrowth.model_validate({**values, **fields})


async def send_growth(producer: AIOKafkaProducer, db: asyncpg.Pool, cluster: str,
                      _: str) -> list[RecordMetadata]:
    return await publish(producer, CLUSTER_GROWTH, a_growth_picture(cluster))


async def growth_recorded(db: asyncpg.Pool, cluster: str, _: str) -> object:
    return await db.fetchval("SELECT autoscaled FROM cluster_growth WHERE cluster = $1",
                             cluster)


FOLLOWERS: dict[str, Follower] = {
    POD_EVENTS.name: Follower(
        lambda cluster: f"{cluster}-after", send_pod_event,
        lambda db, cluster, uid: job_in_state(db, cluster, uid, JobState.QUEUED)),
    CLUSTER_SNAPSHOTS.name: Follower(lambda cluster: cluster, send_snapshot, snapshot_recorded),
    CLUSTER_CAPACITY.name: Follower(lambda cluster: cluster, send_capacity, node_recorded),
    CLUSTER_GROWTH.name: Follower(lambda cluster: cluster, send_growth, growth_recorded),
    RELEASE_OUTCOMES.name: Follower(
        lambda cluster: f"{cluster}-released", send_outcome,
        lambda db, cluster, uid: job_in_state(db, cluster, uid, JobState.UNGATED)),
}


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[bad.name for bad in BAD_INPUTS])
@pytest.mark.parametrize("topic", CONSUMED_TOPICS, ids=[topic.name for topic in CONSUMED_TOPICS])
async def test_a_message_too_large_or_not_text_is_dead_lettered_by_reference_and_passed(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str, kafka_bootstrap: str, topic: Topic[Any], bad: BadInput) -> None:
    follower = FOLLOWERS[topic.name]
    key = follower.key(cluster)
    value = bad.value(await max_message_bytes(kafka_bootstrap, topic.name), key.encode())
    async with TopicTail(kafka_bootstrap, [DEAD_LETTERS]) as letters:
        (dead,) = await produce_raw(kafka_bootstrap, topic.name, [(key.encode(), value)])
        after = await follower.send(producer, db, cluster, key)
        assert after[-1].partition == dead.partition  # the bad message is in its way

        letter: DeadLetter = await letters.wait_for(
            lambda d: (d.source_topic, d.partition, d.offset) == (
                topic.name, dead.partition, dead.offset), what=f"the letter of {bad.name}")
    assert letter.consumer == f"queue-store:{topic.name}"
    # Who wrote it, so a letter on a shared Kafka leads to its deployment and process.
    assert (letter.group, letter.instance) == (queue_store.spec.group_id,
                                               queue_store.process.name)
    assert letter.reason.startswith(f"invalid {topic.model.__name__}")
    assert letter.source_key == key
    assert letter.value is not None
    assert (letter.value.size, letter.value.sha256) == (len(value),
                                                        hashlib.sha256(value).hexdigest())
    assert value.startswith(letter.value.kept())
    assert letter.value.complete == (len(value) < 1024)
    await wait_processed(queue_store, [dead, *after])
    assert await eventually(lambda: follower.stored(db, cluster, key),
                            what=f"the {topic.name} message after it stored")
    ready, checks = await queue_store.spec.readiness()
    assert ready, checks
    assert queue_store.process.alive()


# Snapshots ------------------------------------------------------------------------------------

async def test_a_snapshot_marks_jobs_that_vanished_unseen_as_deleted(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    await publish(producer, POD_EVENTS,
                  pod_event(cluster, "kept"), pod_event(cluster, "vanished"),
                  pod_event(cluster, "vanished-running", JobState.RUNNING),
                  pod_event(cluster, "finished", JobState.SUCCEEDED),
                  pod_event(cluster, "created-after-listing", created=+30))
    for uid in ("kept", "vanished", "vanished-running", "finished", "created-after-listing"):
        await eventually(lambda uid=uid: job(db, cluster, uid), what=f"job {uid}")
    other_cluster = f"{cluster}-other"
    await publish(producer, POD_EVENTS, pod_event(other_cluster, "elsewhere"))
    await job_in_state(db, other_cluster, "elsewhere", JobState.QUEUED)

    landed = await publish(producer, CLUSTER_SNAPSHOTS, ClusterSnapshot(
        snapshot_id="snap-1", cluster=cluster, listed_at=NOW + timedelta(seconds=10),
        pod_uids=["kept"]))
    await wait_processed(queue_store, landed)

    states = {r["uid"]: (r["state"], r["last_reason"]) for r in
              await db.fetch("SELECT uid, state, last_reason FROM jobs WHERE cluster = $1",
                             cluster)}
    assert states["kept"][0] == JobState.QUEUED
    assert states["vanished"] == (JobState.DELETED, "vanished: not listed by snapshot snap-1")
    assert states["vanished-running"][0] == JobState.DELETED
    assert states["finished"][0] == JobState.SUCCEEDED
    assert states["created-after-listing"][0] == JobState.QUEUED
    assert (await job(db, other_cluster, "elsewhere") or {})["state"] == JobState.QUEUED
    recorded = await db.fetchrow("SELECT * FROM clusters WHERE name = $1", cluster)
    assert (recorded["last_snapshot_id"], recorded["last_snapshot_at"]) == (
        "snap-1", NOW + timedelta(seconds=10))


async def test_a_pod_event_stored_after_a_newer_snapshot_is_judged_by_that_snapshot(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    # The snapshot (its own topic) is applied before pod events observed earlier than it.
    await wait_processed(queue_store, await publish(producer, CLUSTER_SNAPSHOTS, ClusterSnapshot(
        snapshot_id="snap-late", cluster=cluster, listed_at=NOW + timedelta(seconds=10),
        pod_uids=["listed"])))
    await publish(producer, POD_EVENTS,
                  pod_event(cluster, "listed", seen=5), pod_event(cluster, "gone", seen=5),
                  pod_event(cluster, "seen-after", seen=20))
    gone = await job_in_state(db, cluster, "gone", JobState.DELETED)
    assert gone["last_reason"] == "vanished: not listed by snapshot snap-late"
    await job_in_state(db, cluster, "listed", JobState.QUEUED)
    await job_in_state(db, cluster, "seen-after", JobState.QUEUED)


async def test_a_snapshot_stored_before_its_pods_events_books_how_each_ended(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    """A restarted watcher's relist: its snapshot (own topic) folded before the events that say
    pods finished while it was down; and an event of the dead watcher stored after both."""
    await publish(producer, POD_EVENTS, *(pod_event(cluster, uid, JobState.RUNNING, seen=1)
                                          for uid in ("done", "broke", "gone", "alive")))
    for uid in ("done", "broke", "gone", "alive"):
        await job_in_state(db, cluster, uid, JobState.RUNNING)
    await wait_processed(queue_store, await publish(producer, CLUSTER_SNAPSHOTS, ClusterSnapshot(
        snapshot_id="snap-ended", cluster=cluster, listed_at=NOW + timedelta(seconds=10),
        pod_uids=["alive"], ended={JobState.SUCCEEDED: ["done", "late"],
                                   JobState.FAILED: ["broke"]})))
    states = {r["uid"]: (r["state"], r["last_reason"]) for r in
              await db.fetch("SELECT uid, state, last_reason FROM jobs WHERE cluster = $1",
                             cluster)}
    assert states == {"done": ("succeeded", ""), "broke": ("failed", ""),
                      "gone": ("deleted", "vanished: not listed by snapshot snap-ended"),
                      "alive": ("running", "")}
    listing = {r["uid"]: r["state"] for r in await db.fetch(
        "SELECT uid, state FROM cluster_snapshot_pods WHERE cluster = $1", cluster)}
    assert listing == {"alive": None, "done": "succeeded", "late": "succeeded",
                       "broke": "failed"}
    # The events that follow change nothing; a pod first stored now, from an event of the
    # watcher that died (seen running before the snapshot), takes the outcome it listed.
    await publish(producer, POD_EVENTS, pod_event(cluster, "done", JobState.SUCCEEDED, seen=10),
                  pod_event(cluster, "late", JobState.RUNNING, seen=2))
    late = await job_in_state(db, cluster, "late", JobState.SUCCEEDED)
    assert late["finished_at"] == NOW + timedelta(seconds=10)
    assert (await job(db, cluster, "done") or {})["state"] == JobState.SUCCEEDED


# Capacity -------------------------------------------------------------------------------------

def capacity(cluster: str, seconds: float, **nodes: int) -> ClusterCapacity:
    return ClusterCapacity(
        cluster=cluster, observed_at=NOW + timedelta(seconds=seconds),
        nodes=[NodeCapacity(name=name, allocatable={"cpu": cpu, "memory": 64 * 2**30},
                            unmanaged_usage={"cpu": 100}) for name, cpu in nodes.items()])


async def test_capacity_is_upserted_the_newest_report_wins_and_gone_nodes_are_not_present(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    await wait_processed(queue_store, await publish(
        producer, CLUSTER_CAPACITY, capacity(cluster, 10, n1=16000, n2=16000)))
    await wait_processed(queue_store, await publish(
        producer, CLUSTER_CAPACITY, capacity(cluster, 20, n2=8000, n3=4000),
        capacity(cluster, 15, n1=1, n2=1, n3=1, n4=1)))  # older: ignored

    nodes = {r["node"]: r for r in await db.fetch(
        "SELECT * FROM cluster_nodes WHERE cluster = $1", cluster)}
    assert set(nodes) == {"n1", "n2", "n3"}
    assert nodes["n1"]["present"] is False
    assert nodes["n2"]["allocatable"] == {"cpu": 8000, "memory": 64 * 2**30}
    assert nodes["n2"]["unmanaged_usage"] == {"cpu": 100}
    assert nodes["n3"]["present"] is True and nodes["n3"]["allocatable"]["cpu"] == 4000
    observed = await db.fetchval("SELECT capacity_observed_at FROM clusters WHERE name = $1",
                                 cluster)
    assert observed == NOW + timedelta(seconds=20)


# Release outcomes -----------------------------------------------------------------------------

async def record_release(db: asyncpg.Pool, cluster: str, uid: str, decision_id: str) -> None:
    """What the fair scheduler does when it decides to release a job."""
    async with db.acquire() as connection, connection.transaction():
        await connection.execute(
            "INSERT INTO release_decisions (decision_id, cluster, uid, queue, decided_at,"
            " decided_by) VALUES ($1, $2, $3, 'research', now(), 'test')",
            decision_id, cluster, uid)
        await connection.execute(
            "UPDATE jobs SET state = 'released', decision_id = $3, released_at = now(),"
            " release_attempts = release_attempts + 1,"
            " serial = nextval('change_serial'), writer_xid = pg_current_xact_id()::text::bigint"
            " WHERE cluster = $1 AND uid = $2",
            cluster, uid, decision_id)


def outcome(cluster: str, uid: str, decision_id: str, kind: ReleaseOutcomeKind,
            reason: str = "") -> ReleaseOutcome:
    return ReleaseOutcome(decision_id=decision_id, cluster=cluster, uid=uid, outcome=kind,
                          reason=reason, at=datetime.now(UTC))


async def test_a_failed_release_returns_the_job_to_its_queue_once(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    await publish(producer, POD_EVENTS, pod_event(cluster, "u1"))
    await job_in_state(db, cluster, "u1", JobState.QUEUED)
    await record_release(db, cluster, "u1", "decision-1")

    stale = outcome(cluster, "u1", "decision-0", ReleaseOutcomeKind.FAILED, "old news")
    await wait_processed(queue_store, await publish(producer, RELEASE_OUTCOMES, stale))
    assert (await job(db, cluster, "u1") or {})["state"] == JobState.RELEASED

    failed = outcome(cluster, "u1", "decision-1", ReleaseOutcomeKind.FAILED,
                     "patch refused: 422")
    await publish(producer, RELEASE_OUTCOMES, failed, failed)  # delivered twice
    requeued = await job_in_state(db, cluster, "u1", JobState.QUEUED)
    assert (requeued["decision_id"], requeued["release_attempts"], requeued["last_reason"]) == (
        None, 1, "patch refused: 422")
    decision = await db.fetchrow(
        "SELECT outcome FROM release_decisions WHERE decision_id = 'decision-1'")
    assert decision["outcome"] == "failed"


async def test_ungated_and_pod_gone_outcomes_move_the_job_on(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    await publish(producer, POD_EVENTS, pod_event(cluster, "u1"), pod_event(cluster, "u2"))
    await job_in_state(db, cluster, "u1", JobState.QUEUED)
    await job_in_state(db, cluster, "u2", JobState.QUEUED)
    await record_release(db, cluster, "u1", f"{cluster}-d1")
    await record_release(db, cluster, "u2", f"{cluster}-d2")
    await publish(producer, RELEASE_OUTCOMES,
                  outcome(cluster, "u1", f"{cluster}-d1", ReleaseOutcomeKind.UNGATED),
                  outcome(cluster, "u2", f"{cluster}-d2", ReleaseOutcomeKind.POD_GONE, "404"))
    ungated = await job_in_state(db, cluster, "u1", JobState.UNGATED)
    assert ungated["ungated_at"] is not None
    gone = await job_in_state(db, cluster, "u2", JobState.DELETED)
    assert gone["last_reason"] == "404"


# Throughput and failures ----------------------------------------------------------------------

BURST = 3000


async def test_a_burst_of_thousands_of_pods_is_stored_within_seconds(
        queue_store: RunningQueueStore, db: asyncpg.Pool, producer: AIOKafkaProducer,
        cluster: str) -> None:
    events = [pod_event(cluster, f"burst-{i}", jobset=f"js-{i % 20}") for i in range(BURST)]
    started = time.perf_counter()
    await publish(producer, POD_EVENTS, *events)

    async def all_stored() -> bool:
        count = await db.fetchval("SELECT count(*) FROM jobs WHERE cluster = $1", cluster)
        return bool(count == BURST)

    await eventually(all_stored, within=60, what=f"{BURST} jobs")
    seconds = time.perf_counter() - started
    print(f"{BURST} pod events published and stored in {seconds:.2f}s "
          f"({BURST / seconds:.0f} events/s)")
    # Generous for a shared 2-core machine; bench/bench_ingest.py measures it properly.
    assert BURST / seconds > 300


async def test_queue_store_killed_mid_stream_loses_nothing_and_counts_nothing_twice(
        own_dsn: str, kafka_bootstrap: str, producer: AIOKafkaProducer, cluster: str) -> None:
    spec = QueueStoreUnderTest(postgres_dsn=own_dsn, kafka_bootstrap=kafka_bootstrap)
    running = await start_queue_store(spec, f"queue-store-kill-{cluster}")
    try:
        pool = await connect_pool(own_dsn, policy=FAST_RETRY)
        try:
            total = 2000
            for start in range(0, total, 250):
                await publish(producer, POD_EVENTS, *(
                    pod_event(cluster, f"k-{i}") for i in range(start, start + 250)))
                await publish(producer, POD_EVENTS, *(
                    pod_event(cluster, f"k-{i}", JobState.RUNNING, seen=5)
                    for i in range(start, start + 250, 2)))
                if start == 1000:
                    await running.process.kill()
                    await running.process.start()  # same group: resumes at its last commit
            await running.process.wait_ready()

            async def converged() -> bool:
                rows = await pool.fetch("SELECT state, count(*) AS n FROM jobs"
                                        " WHERE cluster = $1 GROUP BY state", cluster)
                return {r["state"]: r["n"] for r in rows} == {
                    JobState.QUEUED: total // 2, JobState.RUNNING: total // 2}

            await eventually(converged, within=60, what="every job, in its latest state")
        finally:
            await pool.close()
    finally:
        assert await running.process.stop() == 0, running.process.log_tail()


async def test_postgres_outage_makes_it_unready_and_loses_nothing(
        own_dsn: str, kafka_bootstrap: str, producer: AIOKafkaProducer, cluster: str) -> None:
    target = int(own_dsn.rsplit(":", 1)[1].split("/", 1)[0])
    link = TcpRelay("127.0.0.1", target)
    await link.start()
    relayed = own_dsn.replace(f":{target}/", f":{link.port}/")
    spec = QueueStoreUnderTest(postgres_dsn=relayed, kafka_bootstrap=kafka_bootstrap)
    running = await start_queue_store(spec, f"queue-store-outage-{cluster}")
    pool = await connect_pool(own_dsn, policy=FAST_RETRY)
    try:
        await link.sever()
        events = [pod_event(cluster, f"o-{i}") for i in range(300)]
        await publish(producer, POD_EVENTS, *events)

        seen: list[dict[str, Any]] = []

        async def postgres_unready() -> bool:
            ready, checks = await spec.readiness()
            seen.append(checks)
            # Other checks (a consumer) may turn unready first; the postgres one is awaited.
            return not ready and checks.get("postgres", {}).get("ready") is False

        # Two failed probes in a row make it unready; on a busy machine they take a while.
        await eventually(postgres_unready, within=120,
                         what=lambda: f"queue-store to report postgres not ready: {seen[-1:]}")
        async with aiohttp.ClientSession() as session, session.get(
                f"{spec.admin_url}/api/v1/queues", headers=spec.admin_headers) as reply:
            assert reply.status == 503
            assert "postgres is unavailable" in (await reply.json())["error"]
        assert await pool.fetchval("SELECT count(*) FROM jobs WHERE cluster = $1",
                                   cluster) == 0

        await link.start()

        async def all_stored() -> bool:
            count = await pool.fetchval("SELECT count(*) FROM jobs WHERE cluster = $1",
                                        cluster)
            return bool(count == len(events))

        await eventually(all_stored, within=60, what="every event after the outage")
        await spec.wait_ready(30)
    finally:
        await pool.close()
        assert await running.process.stop() == 0, running.process.log_tail()
        await link.sever()
