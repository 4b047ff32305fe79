"""Kafka: typed publishing and batch consuming with commit-after-side-effect and dead letters.

Why one module: every service talks through these two helpers, so the rules hold everywhere:
- producers are idempotent with acks=all, and carry the trace context in headers;
- consumers never auto-commit: a batch's offsets are committed only after the handler has made
  its side effects durable, so a crash redelivers rather than loses;
- a message that cannot be decoded, or that the handler rejects as permanently invalid, goes to
  the dead-letter topic with its reason, and the consumer keeps going. The letter is bounded in
  size whatever the message (`lockgate.dead_lettering`); while Kafka cannot take it the consumer
  retries, and if Kafka refuses it for good the message is logged with its reference, counted as
  lost, and skipped: a bad message never holds its partition.
- every client (producer, consumer, admin) is built with `client_kwargs`, so TLS and SASL
  settings reach all of them, and topics are created with the configured replication;
- every topic's and consumer group's name is the installation's (`KafkaConfig.topic_name`,
  `KafkaConfig.group_id`: the topic prefix, lockgate.installation), so installations that share
  a Kafka cluster never read each other's topics. A producer made here knows its installation;
  `publish` refuses any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CommitFailedError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    TopicAlreadyExistsError,
    for_code,
)
from aiokafka.helpers import create_ssl_context
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from prometheus_client import Counter
from pydantic import ValidationError

from lockgate.dead_lettering import LetterLimits, dead_letter
from lockgate.events import ALL_TOPICS, DEAD_LETTERS, Event, Topic
from lockgate_adapters.quieting import KAFKA, quiet
from lockgate_adapters.retrying import Backoff, Stopped, retry
from lockgate_adapters.settings import KafkaConfig, RetryPolicy, default_instance_id
from lockgate_adapters.telemetry import KafkaHeaders, extract_context, inject_headers

log = logging.getLogger(__name__)
E = TypeVar("E", bound=Event)

# The producer's largest request (aiokafka's default, written out): letters must fit under it.
MAX_REQUEST_BYTES = 1024 * 1024

DEAD_LETTERED = Counter(
    "lockgate_dead_letters_total",
    "Messages consumers could not process, by source topic and outcome: published (to the "
    "dead-letter topic) or lost (Kafka refused the letter for good; logged and skipped)",
    ["topic", "outcome"])


class PermanentMessageError(Exception):
    """Raised by a handler for a message that can never be processed: it is dead-lettered."""


def is_retryable_kafka_error(error: BaseException) -> bool:
    return isinstance(error, KafkaConnectionError | KafkaError | OSError | asyncio.TimeoutError)


def is_transient_publish_error(error: BaseException) -> bool:
    """Kafka unreachable or busy: the same send may succeed later. A refusal of the message
    itself (too large, not authorized, invalid topic) is not."""
    if isinstance(error, KafkaConnectionError | KafkaTimeoutError | OSError):
        return True  # OSError includes TimeoutError
    return isinstance(error, KafkaError) and bool(error.retriable)


class TopicCreationError(KafkaError):  # type: ignore[misc]  # aiokafka.errors is untyped
    """Kafka refused to create a topic (e.g. more replicas asked than there are live brokers:
    retried, since brokers may be starting; the log says why)."""


# Where a client came from: a service's KafkaConfig, or a bare bootstrap for the local stack.
KafkaTarget = KafkaConfig | str


def kafka_config(kafka: KafkaTarget) -> KafkaConfig:
    return kafka if isinstance(kafka, KafkaConfig) else KafkaConfig(bootstrap=kafka)


def client_kwargs(kafka: KafkaTarget) -> dict[str, Any]:
    """The connection arguments every aiokafka client takes: servers, TLS, SASL."""
    config = kafka_config(kafka)
    kwargs: dict[str, Any] = {"bootstrap_servers": config.bootstrap,
                              "security_protocol": config.security_protocol}
    if config.security_protocol in ("SSL", "SASL_SSL"):
        kwargs["ssl_context"] = create_ssl_context(
            cafile=config.ssl_cafile, certfile=config.ssl_certfile, keyfile=config.ssl_keyfile)
    if config.security_protocol.startswith("SASL_"):
        kwargs.update(sasl_mechanism=config.sasl_mechanism,
                      sasl_plain_username=config.sasl_username,
                      sasl_plain_password=config.sasl_password)
    return kwargs


def new_topics(kafka: KafkaTarget, topics: Sequence[Topic[Any]], *,
               partitions: int) -> list[NewTopic]:
    config = kafka_config(kafka)
    return [NewTopic(name=config.topic_name(t), num_partitions=partitions,
                     replication_factor=config.replication_factor,
                     topic_configs={"min.insync.replicas": str(config.min_insync_replicas)})
            for t in topics]


async def ensure_topics(
    bootstrap: KafkaTarget, *, partitions: int = 4,
    topics: Sequence[Topic[Any]] = ALL_TOPICS,
) -> None:
    """Create lockgate's topics if missing (idempotent), replicated as configured.

    Topics that exist are left as they are: changing their replication is an operator's
    reassignment, not something a service does at start.
    """
    config = kafka_config(bootstrap)
    admin = AIOKafkaAdminClient(**client_kwargs(bootstrap))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = new_topics(bootstrap, [t for t in topics
                                         if config.topic_name(t) not in existing],
                             partitions=partitions)
        if missing:
            with contextlib.suppress(TopicAlreadyExistsError):
                response = await admin.create_topics(missing)
                _raise_topic_errors(response)
    finally:
        await admin.close()


def _raise_topic_errors(response: Any) -> None:
    refused = []
    for entry in getattr(response, "topic_errors", ()):
        name, code = entry[0], entry[1]
        message = entry[2] if len(entry) > 2 else None
        if code and for_code(code) is not TopicAlreadyExistsError:
            refused.append(f"{name}: {for_code(code).__name__}"
                           + (f" ({message})" if message else ""))
    if refused:
        raise TopicCreationError("kafka refused to create topics: " + "; ".join(refused)
                                 + " (is LOCKGATE_KAFKA_REPLICATION_FACTOR more than the "
                                 "brokers there are?)")


async def commit_group_at_end(
    bootstrap: KafkaTarget, group_id: str, topics: Sequence[Topic[Any]]
) -> None:
    """Commit `group_id`'s offsets at the current end of `topics` (creating them if missing).

    A new consumer group then reads only what is published from now on, not the topics' whole
    history: for a deployment that must skip a backlog, and for runs sharing one Kafka.
    """
    await ensure_topics(bootstrap, topics=topics)
    config = kafka_config(bootstrap)
    admin = AIOKafkaAdminClient(**client_kwargs(bootstrap))
    await admin.start()
    try:
        described = await admin.describe_topics([config.topic_name(topic) for topic in topics])
    finally:
        await admin.close()
    partitions = [TopicPartition(entry["topic"], p["partition"])
                  for entry in described for p in entry["partitions"]]
    consumer = AIOKafkaConsumer(**client_kwargs(bootstrap), group_id=config.group_id(group_id),
                                enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(partitions)
        await consumer.commit(dict(await consumer.end_offsets(partitions)))
    finally:
        await consumer.stop()


class InstallationProducer(AIOKafkaProducer):  # type: ignore[misc]  # aiokafka is untyped
    """A producer that knows its installation, so `publish` sends to the installation's
    topics."""

    def __init__(self, *, kafka: KafkaConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kafka = kafka


def make_producer(bootstrap: KafkaTarget, *, client_id: str) -> AIOKafkaProducer:
    return InstallationProducer(
        kafka=kafka_config(bootstrap),
        **client_kwargs(bootstrap),
        client_id=client_id,
        enable_idempotence=True,
        acks="all",
        # No fixed window: an idle producer sends at once, and under load records batch by
        # themselves while the previous request to their partition is in flight.
        linger_ms=0,
        max_batch_size=256 * 1024,
        max_request_size=MAX_REQUEST_BYTES,
    )


async def start_producer(
    bootstrap: KafkaTarget, *, client_id: str, topics: Sequence[Topic[Any]], policy: RetryPolicy,
    stopping: asyncio.Event, on_unreachable: Callable[[Exception], None],
) -> AIOKafkaProducer | None:
    """A started producer once Kafka answers and `topics` exist; None if stopped first.

    While Kafka is unreachable each failed attempt goes to `on_unreachable` (to report
    readiness) and is retried with backoff; any other error is raised.
    """
    async def start() -> AIOKafkaProducer:
        producer = make_producer(bootstrap, client_id=client_id)
        try:
            await ensure_topics(bootstrap, topics=topics)
            await producer.start()
        except Exception:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        return producer

    if stopping.is_set():
        return None
    try:
        return await retry(start, backoff=Backoff(policy, stopping=stopping),
                           retryable=is_retryable_kafka_error, on_failure=on_unreachable,
                           what=f"{client_id}: starting a producer", dependency=KAFKA)
    except Stopped:
        return None


def destination(producer: AIOKafkaProducer, topic: Topic[Any]) -> str:
    """`topic`'s name in the installation of `producer` (made by `make_producer`, which gives
    it the installation's `kafka`): never the bare name, which may be another installation's."""
    config = getattr(producer, "kafka", None)
    if not isinstance(config, KafkaConfig):
        raise TypeError("publish with a producer from make_producer: it knows the "
                        "installation's topic names")
    return config.topic_name(topic)


async def publish(producer: AIOKafkaProducer, topic: Topic[E], event: E) -> None:
    """Send one event and wait until the broker has it."""
    await producer.send_and_wait(
        destination(producer, topic), topic.encode(event), key=topic.key_bytes(event),
        headers=inject_headers(),
    )


async def publish_many(
    producer: AIOKafkaProducer,
    topic: Topic[E],
    events: Sequence[E],
    *,
    headers_per_event: Sequence[KafkaHeaders] | None = None,
) -> None:
    """Send events pipelined, then wait until the broker has all of them.

    Every event carries the current trace context, unless `headers_per_event` gives each its own
    (one entry per event, e.g. the context of a span about that event).
    """
    shared = inject_headers()
    name = destination(producer, topic)
    futures = [
        await producer.send(
            name, topic.encode(e), key=topic.key_bytes(e),
            headers=list(headers_per_event[i]) if headers_per_event is not None else shared,
        )
        for i, e in enumerate(events)
    ]
    if futures:
        await asyncio.gather(*futures)


@dataclass(frozen=True)
class Received(Generic[E]):
    """One decoded message, with where it came from and the trace context it carried."""

    event: E
    record: ConsumerRecord[bytes, bytes]
    trace_context: Context


@dataclass
class BatchConsumer(Generic[E]):
    """Consume one topic in batches; commit offsets only after `handle` returns.

    `handle` receives the decoded events of a batch (possibly spanning partitions) and must make
    their effects durable before it returns. If it raises a retryable error the same batch is
    retried with backoff (nothing is committed); `PermanentMessageError` is not expected for whole
    batches — a handler reports bad single messages through `reject`.

    Offsets of handled batches are committed together, at most every `commit_interval_seconds`
    while messages keep coming, at once when a poll finds nothing new, before the partitions are
    revoked and when stopping: a commit is a request to the group coordinator and a record in
    `__consumer_offsets`, and committing after every small batch cost Kafka more than the
    messages did. Never before the batch is handled; a crash redelivers at most that interval's
    messages, which handlers take again idempotently.
    """

    bootstrap: KafkaTarget
    topic: Topic[E]
    group_id: str
    consumer_name: str
    handle: Callable[[list[Received[E]], Callable[[Received[E], str], Awaitable[None]]],
                     Awaitable[None]]
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    max_records: int = 2000
    poll_timeout_ms: int = 200
    commit_interval_seconds: float = 0.5
    # After a poll that found something, wait this long once for more before handling it (0:
    # never): fewer and larger batches, each a transaction less. With `linger_when_busy_ms`,
    # only when the previous batch was handled less than that long ago: a stream that keeps
    # coming waits a little, a lone message (one pod created, latency) does not.
    linger_ms: int = 0
    linger_when_busy_ms: int = 0
    on_ready: Callable[[bool, str], None] = lambda ready, detail: None
    letter_limits: LetterLimits = field(default_factory=LetterLimits)
    # Which process this is (the service's instance_id), written on its dead letters.
    instance: str = field(default_factory=default_instance_id)
    _producer: AIOKafkaProducer | None = None
    _consumer: AIOKafkaConsumer | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # Handled, not yet committed: the next offset of each partition.
    _uncommitted: dict[TopicPartition, int] = field(default_factory=dict)
    _last_commit: float = 0.0
    _last_handled: float = 0.0

    def __post_init__(self) -> None:
        if self.letter_limits.max_letter_bytes > MAX_REQUEST_BYTES:
            raise ValueError(f"dead letters of up to {self.letter_limits.max_letter_bytes} "
                             f"bytes would not fit in a request of {MAX_REQUEST_BYTES}")

    @property
    def _group(self) -> str:
        """The consumer group's id in this installation."""
        return kafka_config(self.bootstrap).group_id(self.group_id)

    async def run(self, stopping: asyncio.Event) -> None:
        """Consume until `stopping` is set; (re)connect with backoff while Kafka is down."""
        self._stopping = stopping
        backoff = Backoff(self.retry_policy, stopping=stopping)

        async def session() -> None:
            try:
                await self._start()
                backoff.reset()
                self.on_ready(True, "consuming")
                await self._consume(stopping)
            finally:
                await self._stop()

        if stopping.is_set():
            return
        with contextlib.suppress(Stopped):
            await retry(session, backoff=backoff,
                        retryable=lambda error: isinstance(error, KafkaError | OSError),
                        on_failure=lambda error: self.on_ready(False, f"kafka: {error}"),
                        what=f"consumer {self.consumer_name}", dependency=KAFKA)

    async def _start(self) -> None:
        self._producer = make_producer(self.bootstrap, client_id=f"{self.consumer_name}-dlq")
        self._consumer = AIOKafkaConsumer(
            **client_kwargs(self.bootstrap),
            group_id=self._group,
            client_id=self.consumer_name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.max_records,
            isolation_level="read_committed",
        )
        self._consumer.subscribe([kafka_config(self.bootstrap).topic_name(self.topic)],
                                 listener=_CommitBeforeRevoking(self))
        self._uncommitted = {}
        await self._producer.start()
        await self._consumer.start()

    async def _stop(self) -> None:
        with contextlib.suppress(KafkaError, OSError, TimeoutError):
            await asyncio.wait_for(self._commit_handled(), 5)
        consumer, producer = self._consumer, self._producer
        self._consumer = self._producer = None
        for client in (consumer, producer):
            if client is not None:
                try:
                    await client.stop()
                except (KafkaError, OSError) as error:
                    log.warning("stopping kafka client: %s", error, extra=quiet(KAFKA))

    async def _consume(self, stopping: asyncio.Event) -> None:
        assert self._consumer is not None
        while not stopping.is_set():
            by_partition = await self._consumer.getmany(
                timeout_ms=self.poll_timeout_ms, max_records=self.max_records
            )
            if not by_partition:
                await self._commit_handled()
                continue
            if self.linger_ms and (
                    not self.linger_when_busy_ms
                    or time.monotonic() - self._last_handled < self.linger_when_busy_ms / 1000):
                await self._linger(by_partition)
            received: list[Received[E]] = []
            for records in by_partition.values():
                for record in records:
                    decoded = await self._decode(record)
                    if decoded is not None:
                        received.append(decoded)
            if not await self._handle_with_retry(received, stopping):
                return  # stopping with the batch unhandled: uncommitted, so redelivered
            self._last_handled = time.monotonic()
            self._uncommitted.update(
                (tp, records[-1].offset + 1) for tp, records in by_partition.items())
            if time.monotonic() - self._last_commit >= self.commit_interval_seconds:
                await self._commit_handled()

    async def _linger(self, by_partition: dict[TopicPartition, list[ConsumerRecord[Any, Any]]],
                      ) -> None:
        """Wait `linger_ms` once, then add what came meanwhile (up to `max_records`) to the batch,
        each partition's records kept in order: one transaction for what would have been
        many."""
        assert self._consumer is not None
        room = self.max_records - sum(len(records) for records in by_partition.values())
        if room <= 0:
            return
        await asyncio.sleep(self.linger_ms / 1000)
        more = await self._consumer.getmany(timeout_ms=0, max_records=room)
        for tp, records in more.items():
            by_partition.setdefault(tp, []).extend(records)

    async def _commit_handled(self, partitions: Collection[TopicPartition] | None = None,
                              ) -> None:
        """Commit the handled offsets (of `partitions` only, if given)."""
        if self._consumer is None:
            return
        offsets = {tp: offset for tp, offset in self._uncommitted.items()
                   if partitions is None or tp in partitions}
        if not offsets:
            return
        for tp in offsets:
            del self._uncommitted[tp]
        self._last_commit = time.monotonic()
        try:
            await self._consumer.commit(offsets)
        except CommitFailedError as error:
            # The group rebalanced: another member redelivers; handlers are idempotent.
            log.warning("commit after rebalance failed (%s); messages may be redelivered",
                        error)

    async def _handle_with_retry(self, received: list[Received[E]],
                                 stopping: asyncio.Event) -> bool:
        """Whether the batch was handled; False only when stopping while it still fails (the
        service shuts down cleanly; the batch, never committed, is redelivered)."""
        try:
            # The side effect (a database write) fails as a whole: any failure but a permanent
            # one is retried with the same batch.
            await retry(lambda: self.handle(received, self.reject),
                        backoff=Backoff(self.retry_policy, stopping=stopping),
                        retryable=lambda error: not isinstance(error, PermanentMessageError),
                        on_failure=lambda error: self.on_ready(
                            False, f"handler: {type(error).__name__}: {error}"),
                        what=f"consumer {self.consumer_name}: handling {len(received)} messages")
        except Stopped as stopped:
            log.warning("consumer %s: stopping with %d messages unhandled (%s); they are "
                        "redelivered", self.consumer_name, len(received), stopped.__cause__)
            return False
        self.on_ready(True, "consuming")
        return True

    async def _decode(self, record: ConsumerRecord[bytes, bytes]) -> Received[E] | None:
        try:
            event = self.topic.decode(record.value or b"")
        except ValidationError as error:
            await self._dead_letter(record, f"invalid {self.topic.model.__name__}: {error}")
            return None
        # A header may have no value (other clients allow it); read it as empty.
        headers = [(name, value or b"") for name, value in record.headers or ()]
        return Received(event=event, record=record, trace_context=extract_context(headers))

    async def reject(self, item: Received[E], reason: str) -> None:
        """Dead-letter one message the handler cannot process; the batch goes on."""
        await self._dead_letter(item.record, reason)

    async def _dead_letter(self, record: ConsumerRecord[bytes, bytes], reason: str) -> None:
        """Publish the message's letter; return once it is published, or known lost.

        While Kafka cannot take the letter (down, busy) this retries, holding the partition: the
        message is not committed past before its letter is durable. If Kafka refuses the letter
        itself, the message is logged with its reference and skipped, so it cannot stall its
        partition; `lockgate_dead_letters_total{outcome="lost"}` counts it.
        """
        assert self._producer is not None
        letter = dead_letter(
            source_topic=record.topic, partition=record.partition, offset=record.offset,
            key=record.key, value=record.value, reason=reason, consumer=self.consumer_name,
            group=self._group, instance=self.instance, at=datetime.now(UTC),
            limits=self.letter_limits)
        log.warning("dead-lettering %s (%s): %s", letter.reference(), letter.writer(),
                    letter.reason[:500])
        producer = self._producer
        failures: list[Exception] = []

        def failed(error: Exception) -> None:
            failures.append(error)
            self.on_ready(False, f"dead-letter topic: {type(error).__name__}: {error}")

        try:
            await retry(lambda: publish(producer, DEAD_LETTERS, letter),
                        backoff=Backoff(self.retry_policy, stopping=self._stopping),
                        retryable=lambda error: (isinstance(error, KafkaError | OSError)
                                                 and is_transient_publish_error(error)),
                        on_failure=failed,
                        what=f"publishing the dead letter of {letter.reference()}")
        except (KafkaError, OSError) as error:
            if is_transient_publish_error(error):
                raise  # given up (the policy's max_attempts): the batch is not handled
            DEAD_LETTERED.labels(record.topic, "lost").inc()
            log.error("dead letter LOST, message skipped: %s; Kafka refused the letter "
                      "(%s: %s); the message's reason: %s", letter.reference(),
                      type(error).__name__, error, letter.reason[:500])
            return
        DEAD_LETTERED.labels(record.topic, "published").inc()
        if failures:
            self.on_ready(True, "consuming")


def attach_trace(item: Received[Any]) -> object:
    """Make the message's trace context current; returns a token for `detach_trace`."""
    return otel_context.attach(item.trace_context)


def detach_trace(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]


__all__ = [
    "BatchConsumer",
    "KafkaTarget",
    "PermanentMessageError",
    "Received",
    "TopicCreationError",
    "TopicPartition",
    "client_kwargs",
    "commit_group_at_end",
    "destination",
    "ensure_topics",
    "is_retryable_kafka_error",
    "is_transient_publish_error",
    "make_producer",
    "publish",
    "publish_many",
    "start_producer",
]


class _CommitBeforeRevoking(ConsumerRebalanceListener):  # type: ignore[misc]
    """Commits what was handled of the partitions being taken away, so their next owner does
    not take it again (it would, harmlessly: handlers are idempotent)."""

    def __init__(self, consumer: BatchConsumer[Any]) -> None:
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: Collection[TopicPartition]) -> None:
        try:
            await self._consumer._commit_handled(revoked)
        except (KafkaError, OSError) as error:
            log.warning("commit before revoking %s failed: %s", sorted(revoked), error,
                        extra=quiet(KAFKA))

    async def on_partitions_assigned(self, assigned: Collection[TopicPartition]) -> None:
        pass
