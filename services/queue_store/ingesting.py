"""Storing batches of events: validate, fold in one transaction, and only then let offsets go.

Why here: this is queue-store's one hop between Kafka and Postgres. The `BatchConsumer` calls
`BatchStore.handle` per batch and commits the batch's offsets only after it returns, so the
transaction commit below is the point after which a message is durable. A crash before it makes
Kafka redeliver; the fold is idempotent, so redelivery changes nothing twice.

A message Postgres refuses outright (a value no check anticipated) would block every message
behind it if the batch were retried as a whole forever; instead the batch is retried one message
at a time and only the refused ones are dead-lettered.

Events of a cluster this installation was not configured for (`ClusterScope`, from
LOCKGATE_QUEUE_STORE_CLUSTERS) are not folded: they are another installation's, reaching this one
through shared topics or a watcher pointed at the wrong topics. They are not bad messages, so
not dead-lettered (a shared topic would flood the dead-letter topic); each is counted, as outcome
`other_cluster`, and a warning names the cluster, once per cluster every few minutes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Generic, TypeVar

import asyncpg
from opentelemetry import trace
from opentelemetry.trace import Link
from prometheus_client import Counter, Histogram

from lockgate.events import Event
from lockgate.ingest import IngestEvent, IngestResult, fold_batch, invalid_reason, rows_to_read
from lockgate.installation import ClusterScope
from lockgate.places import DEFAULT_GRACE_SECONDS
from lockgate_adapters import job_store
from lockgate_adapters.kafka import Received
from lockgate_adapters.postgres import notify_changes

log = logging.getLogger(__name__)
tracer = trace.get_tracer("queue_store")

EVENTS = Counter("lockgate_queue_store_events_total",
                 "Messages handled by queue-store, by topic and outcome", ["topic", "outcome"])
ROWS = Counter("lockgate_queue_store_rows_written_total",
               "Rows written by queue-store's ingest, by table", ["table"])
BATCH_SECONDS = Histogram("lockgate_queue_store_batch_seconds",
                          "Time to fold and commit one batch, in seconds", ["topic"],
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))

# Postgres refuses these for the data in the statement; retrying the same data cannot help.
_REFUSED_DATA = (asyncpg.exceptions.DataError,
                 asyncpg.exceptions.IntegrityConstraintViolationError)
_MAX_TRACE_LINKS = 64  # a batch span links to the traces of its first messages
_OTHER_CLUSTER_LOG_SECONDS = 300.0  # a warning per cluster not served, at most this often

E = TypeVar("E", bound=Event)


async def store_events(pool: asyncpg.Pool, events: Sequence[IngestEvent], *,
                       place_grace: timedelta = timedelta(seconds=DEFAULT_GRACE_SECONDS),
                       ) -> IngestResult:
    """Fold `events` into Postgres in one transaction (job_store's change-feed and lock-order
    rules included); `place_grace`: how long a deleted queued pod's place is kept
    (lockgate.places)."""
    needed = rows_to_read(events, place_grace=place_grace)
    async with pool.acquire() as connection, connection.transaction():
        # No lock for the change feed: instances in one consumer group commit concurrently,
        # their row locks taken in job_store's global order.
        current = await job_store.lock_current_rows(connection, needed)
        result = fold_batch(current, events, place_grace=place_grace)
        # A cluster row locked FOR SHARE must not be written (an upgrade could deadlock).
        unlocked = {row.name for row in result.clusters} - needed.changed_clusters
        assert not unlocked, f"cluster rows changed without their lock: {sorted(unlocked)}"
        await job_store.write_ingest(connection, result)
        if result.jobs or result.nodes:
            await notify_changes(connection, _changed_tables(result))
        if needed.place_namespaces:
            await job_store.collect_left_places(  # the last statement
                connection, needed.place_grace, result.places)
    return result


def _changed_tables(result: IngestResult) -> str:
    return ",".join(name for name, rows in (("jobs", result.jobs), ("cluster_nodes",
                                                                    result.nodes)) if rows)


@dataclass
class BatchStore(Generic[E]):
    """The `BatchConsumer` handler of one topic."""

    pool: asyncpg.Pool
    topic_name: str
    on_postgres: Callable[[bool, str], None] = lambda ready, detail: None
    place_grace: timedelta = timedelta(seconds=DEFAULT_GRACE_SECONDS)
    scope: ClusterScope = field(default_factory=ClusterScope)
    # Clusters not served: events skipped since the last warning, and when it was (monotonic).
    _skipped: dict[str, tuple[int, float | None]] = field(default_factory=dict)
    # Messages already dead-lettered in the batch being (re)tried, so a retry does not repeat it.
    _rejected: set[tuple[int, int]] = field(default_factory=set)

    async def handle(self, batch: list[Received[E]],
                     reject: Callable[[Received[E], str], Awaitable[None]]) -> None:
        started, started_ns = time.perf_counter(), time.time_ns()
        links = [Link(trace.get_current_span(item.trace_context).get_span_context())
                 for item in batch[:_MAX_TRACE_LINKS]]
        with tracer.start_as_current_span(f"queue-store batch {self.topic_name}",
                                          links=links) as span:
            span.set_attribute("messaging.batch.message_count", len(batch))
            valid: list[Received[E]] = []
            others: list[str] = []  # clusters of events skipped, counted once the batch is done
            for item in batch:
                assert isinstance(item.event, IngestEvent)
                if not self.scope.serves(item.event.cluster):
                    others.append(item.event.cluster)
                    continue
                reason = invalid_reason(item.event)
                if reason is None:
                    valid.append(item)
                else:
                    await self._reject_once(item, reason, reject)
            try:
                result = await self._store(valid, reject)
            except Exception as error:
                self.on_postgres(False, f"{type(error).__name__}: {error}")
                span.record_exception(error)
                raise
            self.on_postgres(True, "writing")
            self._rejected.clear()
            for cluster in others:
                self._skip_other_cluster(cluster)
            span.set_attribute("lockgate.rows.jobs", len(result.jobs))
        self._trace_each(valid, started_ns, span.get_span_context())
        for table, rows in (("jobs", result.jobs), ("cluster_nodes", result.nodes),
                            ("clusters", result.clusters)):
            if rows:
                ROWS.labels(table).inc(len(rows))
        EVENTS.labels(self.topic_name, "stored").inc(len(valid))
        if result.ignored:
            EVENTS.labels(self.topic_name, "ignored").inc(len(result.ignored))
            log.debug("ignored %d events: %s", len(result.ignored),
                      "; ".join(reason for _, reason in result.ignored[:5]))
        BATCH_SECONDS.labels(self.topic_name).observe(time.perf_counter() - started)

    def _trace_each(self, stored: list[Received[E]], started_ns: int,
                    batch: trace.SpanContext) -> None:
        """One span per stored message, in the trace its producer started (from its headers), so
        a pod's journey shows the moment it became durable; linked to the batch's span.

        Only for a message whose trace is sampled: with none, the span would start a stray trace
        of its own per message, and with an unsampled one it would be dropped. (Per message,
        that was a tenth of queue-store's ingest CPU.)"""
        for item in stored:
            parent = trace.get_current_span(item.trace_context).get_span_context()
            if not parent.trace_flags.sampled:
                continue
            tracer.start_span(
                f"queue-store store {self.topic_name}", context=item.trace_context,
                start_time=started_ns, links=[Link(batch)],
                attributes={"messaging.destination.name": self.topic_name,
                            "messaging.kafka.partition": item.record.partition,
                            "messaging.kafka.offset": item.record.offset},
            ).end()

    async def _store(self, items: list[Received[E]],
                     reject: Callable[[Received[E], str], Awaitable[None]]) -> IngestResult:
        events = [self._event(item) for item in items]
        if not events:
            return IngestResult()
        try:
            return await store_events(self.pool, events, place_grace=self.place_grace)
        except _REFUSED_DATA as error:
            if len(items) == 1:
                await self._reject_once(items[0], f"postgres refused it: {error}", reject)
                return IngestResult()
            log.warning("postgres refused a batch of %d (%s); storing one by one",
                        len(items), error)
        merged = IngestResult()
        for item in items:
            single = await self._store([item], reject)
            merged.jobs += single.jobs
            merged.nodes += single.nodes
            merged.clusters += single.clusters
            merged.ignored += single.ignored
        return merged

    def _skip_other_cluster(self, cluster: str) -> None:
        EVENTS.labels(self.topic_name, "other_cluster").inc()
        skipped, warned_at = self._skipped.get(cluster, (0, None))
        now = time.monotonic()
        if warned_at is not None and now - warned_at < _OTHER_CLUSTER_LOG_SECONDS:
            self._skipped[cluster] = (skipped + 1, warned_at)
            return
        log.warning("skipped %d %s event(s) of cluster %r: not one of this installation's "
                    "clusters (LOCKGATE_QUEUE_STORE_CLUSTERS: %s). If it is one, add it there; "
                    "if another installation's watcher publishes to these topics, give each "
                    "installation its own LOCKGATE_TOPIC_PREFIX", skipped + 1, self.topic_name,
                    cluster, self.scope.describe())
        self._skipped[cluster] = (0, now)

    async def _reject_once(self, item: Received[E], reason: str,
                           reject: Callable[[Received[E], str], Awaitable[None]]) -> None:
        where = (item.record.partition, item.record.offset)
        if where in self._rejected:
            return
        await reject(item, reason)
        self._rejected.add(where)
        EVENTS.labels(self.topic_name, "rejected").inc()

    @staticmethod
    def _event(item: Received[E]) -> IngestEvent:
        assert isinstance(item.event, IngestEvent)
        return item.event
