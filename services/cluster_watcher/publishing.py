"""Publishing what the watcher saw: an ordered outbox, drained to Kafka in batches.

Why an outbox between watching and Kafka: watching must not stop for a Kafka blip, and nothing
seen may be lost. Watchers append events in the order they saw them; one publisher sends them in
that order, batch after batch, and drops them only once the broker acknowledged them. While
Kafka is down the publisher retries with backoff and reports not ready; the outbox keeps growing
up to a bound, beyond which watchers wait (and the apiserver's watch buffers for them).

Capacity and growth are coalesced rather than queued: only the newest unsent ClusterCapacity and
ClusterGrowth of a cluster are kept, since each replaces every earlier one.

Every message carries its own trace context. A pod's events are all in one trace whose id is the
pod's uid, so its journey through lockgate can be found from the uid alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from opentelemetry import trace
from opentelemetry.trace import (
    Span,
    Status,
    StatusCode,
)
from prometheus_client import Counter, Gauge, Histogram

from lockgate.events import (
    CLUSTER_CAPACITY,
    CLUSTER_GROWTH,
    CLUSTER_SNAPSHOTS,
    POD_EVENTS,
    POD_NOTICES,
    ClusterCapacity,
    ClusterGrowth,
    ClusterSnapshot,
    Event,
    PodEvent,
    PodNotice,
    Topic,
)
from lockgate_adapters.kafka import (
    KafkaTarget,
    ensure_topics,
    is_retryable_kafka_error,
    make_producer,
    publish_many,
)
from lockgate_adapters.quieting import KAFKA, quiet
from lockgate_adapters.retrying import Backoff, retry
from lockgate_adapters.settings import RetryPolicy
from lockgate_adapters.telemetry import inject_headers, link_to_traceparent, pod_trace_parent

log = logging.getLogger(__name__)
tracer = trace.get_tracer("cluster_watcher")

PUBLISHED = Counter("lockgate_watcher_published_events_total",
                    "Events the watcher published and Kafka acknowledged", ["topic"])
PENDING = Gauge("lockgate_watcher_pending_events",
                "Events seen but not yet acknowledged by Kafka")
OBSERVED_TO_ACKED = Histogram(
    "lockgate_watcher_publish_latency_seconds",
    "Seconds from seeing a change to Kafka acknowledging its event",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


@dataclass
class Outgoing:
    """One event on its way to Kafka, with the span that follows it until acknowledged."""

    topic: Topic[Any]
    event: Event
    span: Span
    headers: list[tuple[str, bytes]]
    observed_monotonic: float = field(default_factory=time.monotonic)

    def acknowledged(self) -> None:
        self.span.set_status(Status(StatusCode.OK))
        self.span.end()
        OBSERVED_TO_ACKED.observe(time.monotonic() - self.observed_monotonic)

    def superseded(self) -> None:
        self.span.set_attribute("lockgate.superseded", True)
        self.span.end()


def _traced(topic: Topic[Any], event: Event, span: Span) -> Outgoing:
    with trace.use_span(span, end_on_exit=False):
        headers = inject_headers()
    return Outgoing(topic=topic, event=event, span=span, headers=headers)


def pod_event_message(event: PodEvent) -> Outgoing:
    """The "pod observed" span starts the pod's journey through lockgate at each change."""
    span = tracer.start_span(
        "pod observed",
        context=pod_trace_parent(event.uid),
        links=link_to_traceparent(event.admission_trace),
        attributes={
            "lockgate.cluster": event.cluster,
            "lockgate.namespace": event.namespace,
            "lockgate.name": event.name,
            "lockgate.uid": event.uid,
            "lockgate.state": event.state.value,
            "lockgate.queue": event.queue,
            "lockgate.snapshot": event.snapshot_id or "",
        },
    )
    return _traced(POD_EVENTS, event, span)


def notice_message(notice: PodNotice) -> Outgoing:
    """A notice the watcher sends itself (a pod that skipped the gate), in the pod's trace."""
    span = tracer.start_span("pod noticed", context=pod_trace_parent(notice.uid), attributes={
        "lockgate.cluster": notice.cluster,
        "lockgate.namespace": notice.namespace,
        "lockgate.name": notice.name,
        "lockgate.uid": notice.uid,
        "lockgate.reason": notice.reason,
    })
    return _traced(POD_NOTICES, notice, span)


def snapshot_message(snapshot: ClusterSnapshot) -> Outgoing:
    span = tracer.start_span("cluster listed", attributes={
        "lockgate.cluster": snapshot.cluster,
        "lockgate.snapshot": snapshot.snapshot_id,
        "lockgate.managed_unfinished_pods": len(snapshot.pod_uids),
        "lockgate.managed_ended_pods": sum(len(uids) for uids in snapshot.ended.values()),
    })
    return _traced(CLUSTER_SNAPSHOTS, snapshot, span)


def capacity_message(capacity: ClusterCapacity) -> Outgoing:
    span = tracer.start_span("cluster capacity observed", attributes={
        "lockgate.cluster": capacity.cluster,
        "lockgate.nodes": len(capacity.nodes),
    })
    return _traced(CLUSTER_CAPACITY, capacity, span)


def growth_message(growth: ClusterGrowth) -> Outgoing:
    span = tracer.start_span("cluster growth observed", attributes={
        "lockgate.cluster": growth.cluster,
        "lockgate.autoscaled": growth.autoscaled,
        "lockgate.node_pools": len(growth.node_pools),
        "lockgate.node_claims": len(growth.node_claims),
    })
    return _traced(CLUSTER_GROWTH, growth, span)


# Events of which only the newest unsent one per cluster matters.
_Coalesced = ClusterCapacity | ClusterGrowth


class Outbox:
    """Events seen and not yet acknowledged by Kafka, in the order they were seen."""

    def __init__(self, *, max_pending: int) -> None:
        self._max_pending = max_pending
        self._pending: deque[Outgoing] = deque()
        # The newest unsent ClusterCapacity and ClusterGrowth per cluster, by (topic, cluster).
        self._latest: dict[tuple[str, str], Outgoing] = {}
        self._not_empty = asyncio.Event()
        self._has_room = asyncio.Event()
        self._has_room.set()
        self.closed = False

    def __len__(self) -> int:
        return len(self._pending) + len(self._latest)

    async def put(self, messages: Sequence[Outgoing]) -> None:
        """Append in order; waits while the outbox is full. All-or-nothing once it has room."""
        while len(self._pending) >= self._max_pending:
            self._has_room.clear()
            await self._has_room.wait()
        self._pending.extend(messages)
        self._changed()

    def put_capacity(self, message: Outgoing) -> None:
        """Replace the cluster's unsent capacity, if any: only the newest matters."""
        assert isinstance(message.event, ClusterCapacity)
        self._put_latest(message)

    def put_growth(self, message: Outgoing) -> None:
        """Replace the cluster's unsent growth picture, if any: only the newest matters."""
        assert isinstance(message.event, ClusterGrowth)
        self._put_latest(message)

    def _put_latest(self, message: Outgoing) -> None:
        assert isinstance(message.event, _Coalesced)
        key = (message.topic.name, message.event.cluster)
        replaced = self._latest.pop(key, None)
        if replaced is not None:
            replaced.superseded()
        self._latest[key] = message
        self._changed()

    def close(self) -> None:
        """No more messages will come: the publisher stops once the outbox is empty."""
        self.closed = True
        self._not_empty.set()

    def peek(self, limit: int) -> list[Outgoing]:
        """The oldest messages, in order, followed by the pending capacities and growths."""
        head = [self._pending[i] for i in range(min(limit, len(self._pending)))]
        return head + list(self._latest.values())

    def acknowledge(self, sent: Sequence[Outgoing]) -> None:
        """Drop messages Kafka acknowledged; they are the head of what `peek` returned."""
        for message in sent:
            if isinstance(message.event, _Coalesced):
                key = (message.topic.name, message.event.cluster)
                if self._latest.get(key) is message:
                    del self._latest[key]
            else:
                assert self._pending[0] is message, "acknowledged out of order"
                self._pending.popleft()
            message.acknowledged()
        if len(self._pending) < self._max_pending:
            self._has_room.set()
        if not self:
            self._not_empty.clear()
        PENDING.set(len(self))

    async def wait_for_messages(self) -> None:
        await self._not_empty.wait()

    def _changed(self) -> None:
        self._not_empty.set()
        PENDING.set(len(self))


def runs_by_topic(messages: Sequence[Outgoing]) -> list[list[Outgoing]]:
    """Consecutive messages of one topic, so each run is one pipelined send, order kept."""
    runs: list[list[Outgoing]] = []
    for message in messages:
        if runs and runs[-1][0].topic is message.topic:
            runs[-1].append(message)
        else:
            runs.append([message])
    return runs


@dataclass
class KafkaPublisher:
    """Drains the outbox to Kafka; reconnects with backoff while Kafka is down."""

    bootstrap: KafkaTarget
    outbox: Outbox
    retry_policy: RetryPolicy
    set_ready: Callable[[bool, str], None]
    batch_size: int = 5000
    send_timeout_seconds: float = 15.0
    client_id: str = "cluster-watcher"
    _producer: AIOKafkaProducer | None = None
    _topics_ensured: bool = False

    async def run(self) -> None:
        """Publish until the outbox is closed and empty; a batch leaves the outbox only once
        Kafka has it, so nothing is lost while Kafka is down (the outbox holds it)."""
        backoff = Backoff(self.retry_policy)  # cancelled, not stopped: waits need no event

        async def publish_all() -> None:
            while not (self.outbox.closed and not self.outbox):
                if self._producer is None:
                    await self._connect()
                    self.set_ready(True, "connected")
                batch = self.outbox.peek(self.batch_size)
                if not batch:
                    await self.outbox.wait_for_messages()
                    continue
                try:
                    await asyncio.wait_for(self._send(batch), self.send_timeout_seconds)
                except Exception:
                    await self._disconnect()
                    raise
                self.outbox.acknowledge(batch)
                backoff.reset()
                self.set_ready(True, "publishing")

        def failed(error: Exception) -> None:
            self.set_ready(False, f"kafka: {type(error).__name__}: {error} "
                                  f"({len(self.outbox)} events waiting)")

        try:
            await retry(publish_all, backoff=backoff,
                        retryable=lambda error: (is_retryable_kafka_error(error)
                                                 or isinstance(error, TimeoutError)),
                        on_failure=failed, what="publishing to kafka", dependency=KAFKA)
        finally:
            await self._disconnect()

    async def _connect(self) -> None:
        if not self._topics_ensured:
            await ensure_topics(self.bootstrap)
            self._topics_ensured = True
        producer = make_producer(self.bootstrap, client_id=self.client_id)
        try:
            await producer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        self._producer = producer

    async def _disconnect(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                # Stopping flushes; with the broker gone that could wait for the request timeout.
                await asyncio.wait_for(producer.stop(), 5)
            except Exception as error:  # noqa: BLE001 - the producer is dropped either way
                log.warning("stopping the kafka producer: %r", error, extra=quiet(KAFKA))

    async def _send(self, batch: Sequence[Outgoing]) -> None:
        assert self._producer is not None
        for run in runs_by_topic(batch):
            await publish_many(self._producer, run[0].topic, [m.event for m in run],
                               headers_per_event=[m.headers for m in run])
            PUBLISHED.labels(run[0].topic.name).inc(len(run))
