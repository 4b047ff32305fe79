"""Reading what lockgate publishes: consumers at the topics' end, and tails that collect.

Why: a test on the shared stack must see only what is published after it starts (never the
topics' history, nor other tests' past messages), so its consumer joins a group of its own and
is positioned at the current end before the test acts. A tail collects in the background and
waits for what the test expects, failing with what never came.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import RecordMetadata
from pydantic import ValidationError

from helpers.waiting import eventually, until
from lockgate.events import Topic
from lockgate_adapters.kafka import ensure_topics

Predicate = Callable[[Any], bool]


async def consumer_at_end(bootstrap: str, *topics: str,
                          group_id: str | None = None) -> AIOKafkaConsumer:
    """A started consumer of `topics` in a group of its own (unless `group_id` names one),
    positioned at their current end: it reads what is published from now on."""
    consumer = AIOKafkaConsumer(
        *topics, bootstrap_servers=bootstrap, group_id=group_id or f"test-{uuid.uuid4().hex}",
        enable_auto_commit=False, auto_offset_reset="latest")
    await consumer.start()
    try:
        deadline = time.monotonic() + 30
        while {partition.topic for partition in consumer.assignment()} < set(topics):
            assert time.monotonic() < deadline, "partitions not assigned within 30s"
            await asyncio.sleep(0.05)
        partitions = sorted(consumer.assignment())
        await consumer.seek_to_end(*partitions)
        for partition in partitions:  # resolve the end offsets before anything is produced
            await consumer.position(partition)
    except BaseException:
        await consumer.stop()
        raise
    return consumer


@dataclass(frozen=True)
class Published:
    event: Any
    headers: dict[str, bytes]
    received_at: float  # time.monotonic() when the tail received it


class TopicTail:
    """Every event published on `topics` from the moment it started, decoded, in arrival order.

    Only events `keep` accepts are collected; a subclass may override `accept` to look closer
    (at the moment each message arrives). Use as `async with TopicTail(...) as tail:`, or
    start() and stop().
    """

    def __init__(self, bootstrap: str, topics: Sequence[Topic[Any]], *,
                 keep: Predicate = lambda event: True) -> None:
        self.bootstrap = bootstrap
        self.topics = {topic.name: topic for topic in topics}
        self.keep = keep
        self.messages: list[Published] = []
        # Messages no model here reads: topics are shared with other versions of lockgate (other
        # branches' tests, the demo) running on the same stack, e.g. older dead letters.
        self.undecodable = 0
        self._arrived = asyncio.Event()
        self._read: dict[TopicPartition, int] = {}  # partition -> next offset not yet collected
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await ensure_topics(self.bootstrap, topics=list(self.topics.values()))
        self._consumer = await consumer_at_end(self.bootstrap, *self.topics)
        for partition in self._consumer.assignment():
            self._read[partition] = await self._consumer.position(partition)
        self._task = asyncio.create_task(self._collect(), name="topic-tail")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.stop()

    async def accept(self, message: Published) -> bool:
        return self.keep(message.event)

    async def _collect(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=100)
            for partition, records in batches.items():
                for record in records:
                    try:
                        event = self.topics[record.topic].decode(record.value or b"")
                    except ValidationError:
                        self.undecodable += 1
                        continue
                    message = Published(event, dict(record.headers or ()), time.monotonic())
                    if await self.accept(message):
                        self.messages.append(message)
                if records:
                    self._read[partition] = records[-1].offset + 1
            if batches:
                self._arrived.set()

    async def caught_up(self, *, within: float = 30.0) -> None:
        """Until the tail has collected everything published on its topics before the call: a
        message that is not among `messages` then was not published before it."""
        assert self._consumer is not None, "the tail is not started"
        ends = await self._consumer.end_offsets(list(self._read))

        def read_to_the_end() -> bool:
            self._raise_if_collecting_failed()
            return all(self._read.get(tp, 0) >= end for tp, end in ends.items())

        await until(read_to_the_end, within=within,
                    what=lambda: f"the tail to read {sorted(self.topics)} to the end")

    def events(self, predicate: Predicate = lambda event: True) -> list[Any]:
        return [m.event for m in self.messages if predicate(m.event)]

    def index_of(self, event: object) -> int:
        return next(i for i, m in enumerate(self.messages) if m.event is event)

    async def wait_for_message(self, predicate: Predicate, *, within: float = 30.0,
                               what: str = "an event", after: int = -1) -> Published:
        """The first matching message received after message number `after`."""

        def first() -> Published | None:
            return next((m for m in self.messages[after + 1:] if predicate(m.event)), None)

        return await self._wait(first, within=within, what=lambda: what)

    async def wait_for(self, predicate: Predicate, *, within: float = 30.0,
                       what: str = "an event", after: int = -1) -> Any:
        """The first matching event received after message number `after`."""
        message = await self.wait_for_message(predicate, within=within, what=what, after=after)
        return message.event

    async def wait_for_count(self, count: int, *, within: float = 30.0) -> None:
        """Until `count` events have been collected."""

        def enough() -> Published | None:
            return self.messages[count - 1] if len(self.messages) >= count else None

        await self._wait(enough, within=within,
                         what=lambda: f"{count} events (have {len(self.messages)})")

    async def _wait(self, found: Callable[[], Published | None], *, within: float,
                    what: Callable[[], str]) -> Published:
        deadline = time.monotonic() + within
        while True:
            self._raise_if_collecting_failed()
            self._arrived.clear()  # before looking: what arrives after the look wakes us
            message = found()
            if message is not None:
                return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what()} within {within}s ({len(self.messages)} "
                                     f"collected, {self.undecodable} undecodable skipped)")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), min(remaining, 1.0))

    def _raise_if_collecting_failed(self) -> None:
        if self._task is not None and self._task.done():
            self._task.result()
            raise AssertionError("the tail stopped collecting")


# Messages at the broker's limits -------------------------------------------------------------

async def max_message_bytes(bootstrap: str, topic: str) -> int:
    """The largest record batch the broker accepts on `topic` (its max.message.bytes)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": None})])
    finally:
        await admin.close()
    (resource,) = response.resources
    error_code, error_message, _, _, entries = resource[:5]
    assert error_code == 0, f"describing {topic}'s configuration: {error_message}"
    values = {entry[0]: entry[1] for entry in entries}
    return int(values["max.message.bytes"])


def largest_value(limit: int, key: bytes) -> int:
    """The size of the largest value that, with `key`, makes a batch of at most `limit` bytes
    (by aiokafka's upper-bound estimate, so the broker takes it)."""
    size = limit - DefaultRecordBatchBuilder.estimate_size_in_bytes(key, b"", [])
    while DefaultRecordBatchBuilder.estimate_size_in_bytes(key, bytes(size), []) > limit:
        size -= 1
    return size


async def produce_raw(bootstrap: str, topic: str,
                      messages: Sequence[tuple[bytes | None, bytes]]) -> list[RecordMetadata]:
    """Send (key, value) pairs as they are, in order, with a producer that allows messages as
    large as any broker limit (lockgate's producers stop at 1 MiB); where each landed."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="test-raw", acks="all",
                                max_request_size=16 * 1024 * 1024)
    await producer.start()
    try:
        return [await producer.send_and_wait(topic, value, key=key) for key, value in messages]
    finally:
        await producer.stop()


async def wait_committed_past(bootstrap: str, group_id: str, landed: Sequence[RecordMetadata],
                              *, within: float = 30) -> None:
    """Until `group_id` has committed offsets past every message in `landed`."""
    needed: dict[TopicPartition, int] = {}
    for where in landed:
        partition = TopicPartition(where.topic, where.partition)
        needed[partition] = max(needed.get(partition, 0), where.offset + 1)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        async def caught_up() -> bool:
            committed = await admin.list_consumer_group_offsets(group_id)
            return all(tp in committed and committed[tp].offset >= offset
                       for tp, offset in needed.items())

        await eventually(caught_up, within=within, what=f"group {group_id} to commit past them")
    finally:
        await admin.close()


async def wait_consumed(bootstrap: str, topic: Topic[Any], *, groups: Sequence[str], what: str,
                        within: float = 30) -> None:
    """Until every group in `groups` has committed past everything on `topic` now: whatever was
    published before the call (e.g. a command the admin API took) has been consumed by all."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        # The broker's own answer: a consumer's cached metadata may not list a topic created
        # after it started.
        (described,) = await admin.describe_topics([topic.name])
        partitions = [TopicPartition(topic.name, int(p["partition"]))
                      for p in described.get("partitions") or ()]
        assert partitions, f"topic {topic.name} has no partitions: {described}"
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    try:
        for group in groups:
            async def caught_up(group: str = group) -> bool:
                committed = await admin.list_consumer_group_offsets(group)
                return all(end == 0 or (tp in committed and committed[tp].offset >= end)
                           for tp, end in ends.items())

            await eventually(caught_up, within=within,
                             what=f"group {group} to consume {what} on {topic.name}")
    finally:
        await admin.close()


@dataclass(frozen=True)
class BadInput:
    """A message no lockgate model reads, and one its dead letter cannot copy as it is."""

    name: str
    value: Callable[[int, bytes], bytes]  # (the topic's max.message.bytes, key) -> the value


BAD_INPUTS = [
    BadInput("random bytes at the broker's size limit",
             lambda limit, key: os.urandom(largest_value(limit, key))),
    BadInput("invalid UTF-8", lambda limit, key: b'{"v": 1, "uid": "\xc3\x28\xff\xfe"}'),
]
