"""BatchConsumer's offset commits on the stack's Kafka (issue 19: a commit per small batch cost
Kafka almost a `__consumer_offsets` record per released pod).

Handled batches' offsets are committed together (at most every `commit_interval_seconds` while
messages keep coming), never past a message not yet handled, at once when a poll finds nothing
new, and when the consumer stops; a lingering consumer stores a trickle in fewer batches.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from helpers.waiting import eventually
from lockgate.events import ReleaseOutcome, ReleaseOutcomeKind, Topic
from lockgate_adapters.kafka import BatchConsumer, Received
from lockgate_adapters.settings import RetryPolicy


def private_topic() -> Topic[ReleaseOutcome]:
    return Topic(name=f"lockgate.test-commits-{uuid.uuid4().hex[:8]}.v1", model=ReleaseOutcome,
                 key=lambda e: e.uid, consumers=("test",), why="this test only")


def outcome(i: int) -> ReleaseOutcome:
    return ReleaseOutcome(decision_id=f"d{i}", cluster="cluster-a", uid="u1",
                          outcome=ReleaseOutcomeKind.UNGATED, at=datetime.now(UTC))


async def make_topic(bootstrap: str, topic: Topic[Any]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic.name, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()


async def committed(bootstrap: str, group: str, topic: Topic[Any]) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    found = offsets.get(TopicPartition(topic.name, 0))
    return -1 if found is None else found.offset


class Recorder:
    """A handler noting each batch's offsets, and the group's committed offset at that time."""

    def __init__(self, bootstrap: str, group: str, topic: Topic[Any]) -> None:
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.batches: list[list[int]] = []
        self.committed_while_handling: list[int] = []

    async def handle(self, batch: list[Received[Any]], _reject: Any) -> None:
        self.committed_while_handling.append(
            await committed(self.bootstrap, self.group, self.topic))
        self.batches.append([item.record.offset for item in batch])

    @property
    def handled(self) -> int:
        return sum(len(b) for b in self.batches)

    def has_handled(self, count: int) -> Any:
        async def probe() -> bool:
            return self.handled == count
        return probe


async def run_consumer(bootstrap: str, topic: Topic[Any], recorder: Recorder,
                       **options: Any,
                       ) -> tuple[BatchConsumer[Any], asyncio.Event, asyncio.Task[None]]:
    consumer: BatchConsumer[Any] = BatchConsumer(
        bootstrap=bootstrap, topic=topic, group_id=recorder.group, consumer_name="test",
        handle=recorder.handle, retry_policy=RetryPolicy(initial_seconds=0.1, max_seconds=1),
        poll_timeout_ms=100, **options)
    stopping = asyncio.Event()
    return consumer, stopping, asyncio.create_task(consumer.run(stopping))


async def publish(bootstrap: str, topic: Topic[ReleaseOutcome], count: int, *,
                  every: float = 0.0) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(count):
            await producer.send_and_wait(topic.name, topic.encode(outcome(i)), key=b"u1")
            if every:
                await asyncio.sleep(every)
    finally:
        await producer.stop()


async def test_offsets_are_committed_together_never_before_handling_and_when_idle(
        kafka_bootstrap: str) -> None:
    topic, group = private_topic(), f"test-commits-{uuid.uuid4().hex[:8]}"
    await make_topic(kafka_bootstrap, topic)
    recorder = Recorder(kafka_bootstrap, group, topic)
    # An interval longer than the test: only "idle" and "stopping" commit.
    _, stopping, task = await run_consumer(kafka_bootstrap, topic, recorder,
                                           commit_interval_seconds=3600)
    try:
        await publish(kafka_bootstrap, topic, 30, every=0.01)
        await eventually(recorder.has_handled(30), within=30, what="30 handled")
        # Never committed past what was being handled (the first batch commits at once).
        for batch, seen in zip(recorder.batches, recorder.committed_while_handling,
                               strict=True):
            assert seen <= batch[0], (seen, batch)
        # Idle: the next empty poll commits everything handled.
        async def all_committed() -> bool:
            return await committed(kafka_bootstrap, group, topic) == 30
        await eventually(all_committed, within=10, what="committed once idle")
        await publish(kafka_bootstrap, topic, 5)
        await eventually(recorder.has_handled(35), within=30, what="35 handled")
    finally:
        stopping.set()
        await asyncio.wait_for(task, 30)
    # Stopping commits what was handled (whether or not an idle poll did first).
    assert await committed(kafka_bootstrap, group, topic) == 35


async def test_a_lingering_consumer_takes_a_trickle_in_fewer_batches(
        kafka_bootstrap: str) -> None:
    topic, group = private_topic(), f"test-linger-{uuid.uuid4().hex[:8]}"
    await make_topic(kafka_bootstrap, topic)
    recorder = Recorder(kafka_bootstrap, group, topic)
    _, stopping, task = await run_consumer(kafka_bootstrap, topic, recorder, linger_ms=300)
    try:
        await publish(kafka_bootstrap, topic, 20, every=0.05)  # one every 50 ms, ~1 s in all
        await eventually(recorder.has_handled(20), within=30, what="20 handled")
    finally:
        stopping.set()
        await asyncio.wait_for(task, 30)
    offsets = [offset for batch in recorder.batches for offset in batch]
    assert offsets == list(range(20))  # in order, each once
    assert len(recorder.batches) <= 8, recorder.batches
    assert await committed(kafka_bootstrap, group, topic) == 20
