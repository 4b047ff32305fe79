"""queue-store's composition root: Postgres (migrated), one consumer per topic, the admin API."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import asyncpg
from aiohttp import web
from aiokafka import AIOKafkaProducer

from lockgate.dead_lettering import LetterLimits
from lockgate.events import (
    CLUSTER_CAPACITY,
    CLUSTER_GROWTH,
    CLUSTER_SNAPSHOTS,
    DEAD_LETTERS,
    JOBSET_COMMANDS,
    NAMESPACE_COMMANDS,
    POD_EVENTS,
    RELEASE_OUTCOMES,
    Event,
    Topic,
)
from lockgate.installation import ClusterScope
from lockgate_adapters.admin_tokens import TokenVerifier
from lockgate_adapters.kafka import (
    BatchConsumer,
    ensure_topics,
    is_retryable_kafka_error,
    make_producer,
    publish,
)
from lockgate_adapters.kube import api_clients
from lockgate_adapters.postgres import connect_pool, is_retryable_postgres_error, migrate
from lockgate_adapters.retrying import Backoff, retry
from lockgate_adapters.service import Loop, ServiceContext
from queue_store.admin_api import AdminApi, CopiesSettled, job_json, no_copies
from queue_store.admin_collection import CollectionApi, Publish
from queue_store.collecting import NamespaceCollector
from queue_store.growth_storing import GrowthStore
from queue_store.ingesting import BatchStore
from queue_store.leader import SchedulerLeader
from queue_store.namespace_api import NamespaceApi
from queue_store.namespaces import NamespaceKeeper, RoleReconciler
from queue_store.pod_trace import TraceStore
from queue_store.queue_sync import QueueSync
from queue_store.settings import QueueStoreSettings
from queue_store.ui_api import FairnessSampler, UiApi

log = logging.getLogger(__name__)

CONSUMED_TOPICS: tuple[Topic[Any], ...] = (
    POD_EVENTS, CLUSTER_SNAPSHOTS, CLUSTER_CAPACITY, RELEASE_OUTCOMES, CLUSTER_GROWTH,
)
# Commands that end things; their consumers are the namespace collector's (own group).
COMMAND_TOPICS: tuple[Topic[Any], ...] = (JOBSET_COMMANDS, NAMESPACE_COMMANDS)
POSTGRES_CHECK = "postgres"
ADMIN_CHECK = "admin-api"


async def compose(ctx: ServiceContext) -> list[Loop]:
    settings = ctx.settings
    assert isinstance(settings, QueueStoreSettings)
    readiness = ctx.readiness
    readiness.declare(POSTGRES_CHECK, ADMIN_CHECK,
                      *(f"consume {topic.name}" for topic in (*CONSUMED_TOPICS,
                                                              *COMMAND_TOPICS)))
    ctx.dependencies.postgres(settings.postgres_dsn)
    ctx.dependencies.kafka(settings.kafka())

    pool = await connect_pool(settings.postgres_dsn, policy=settings.retry,
                              max_size=settings.postgres_pool_size, what="queue-store postgres")
    applied = await retry(lambda: migrate(pool), backoff=Backoff(settings.retry),
                          retryable=is_retryable_postgres_error, what="migrating postgres",
                          dependency="postgres")
    if applied:
        log.info("applied migrations: %s", ", ".join(applied))
    readiness.set(POSTGRES_CHECK, True, "migrated")
    await retry(lambda: ensure_topics(settings.kafka(),
                                      topics=(*CONSUMED_TOPICS, *COMMAND_TOPICS, DEAD_LETTERS)),
                backoff=Backoff(settings.retry), retryable=is_retryable_kafka_error,
                what="ensuring kafka topics", dependency="kafka")

    def postgres_ready(ready: bool, detail: str) -> None:
        readiness.set(POSTGRES_CHECK, ready, detail)

    consumers = [
        BatchConsumer(
            bootstrap=settings.kafka(),
            topic=topic,
            group_id=settings.group_id,
            consumer_name=f"{settings.service_name}:{topic.name}",
            handle=(GrowthStore(pool=pool, topic_name=topic.name, on_postgres=postgres_ready,
                                scope=ClusterScope.of(settings.clusters)).handle
                    if topic is CLUSTER_GROWTH else BatchStore[Any](
                        pool=pool, topic_name=topic.name, on_postgres=postgres_ready,
                        place_grace=timedelta(seconds=settings.place_grace_seconds),
                        scope=ClusterScope.of(settings.clusters)).handle),
            retry_policy=settings.retry,
            max_records=settings.max_batch,
            poll_timeout_ms=settings.poll_timeout_ms,
            linger_ms=_linger(settings, topic)[0],
            linger_when_busy_ms=_linger(settings, topic)[1],
            on_ready=_reporter(ctx, f"consume {topic.name}"),
            letter_limits=LetterLimits(value_bytes=settings.dead_letter_value_bytes),
            instance=settings.instance_id,
        )
        for topic in CONSUMED_TOPICS
    ]
    keeper_apis = await api_clients(settings.namespace_clusters)
    collector = NamespaceCollector(pool=pool, apis=keeper_apis, settings=settings.collection)
    consumers += [
        BatchConsumer(
            bootstrap=settings.kafka(), topic=topic, group_id=settings.commands_group,
            consumer_name=f"{settings.service_name}:{topic.name}", handle=handle,
            retry_policy=settings.retry, max_records=100,
            poll_timeout_ms=settings.poll_timeout_ms,
            on_ready=_reporter(ctx, f"consume {topic.name}"),
            letter_limits=LetterLimits(value_bytes=settings.dead_letter_value_bytes),
            instance=settings.instance_id,
        )
        for topic, handle in ((JOBSET_COMMANDS, collector.handle_jobset_commands),
                              (NAMESPACE_COMMANDS, collector.handle_namespace_commands))
    ]
    producer = await _started_producer(settings)

    async def send(topic: Topic[Any], event: Event) -> None:
        await publish(producer, topic, event)

    # One set of namespace-keeper clients: the keeper makes namespaces, the collector deletes.
    keeper = NamespaceKeeper(apis=keeper_apis,
                             extra_labels=settings.namespace_labels,
                             token_seconds=settings.coordinator_token_seconds,
                             create_any=settings.coordinator_create_any)
    reconciler = RoleReconciler(pool=pool, dsn=settings.postgres_dsn, keeper=keeper,
                                resync_seconds=settings.namespace_resync_seconds)
    sync_apis = await api_clients(settings.queue_sync_clusters)
    queue_sync = QueueSync(pool=pool, dsn=settings.postgres_dsn, apis=sync_apis,
                           source=settings.queue_sync_source,
                           prefix=settings.queue_sync_name_prefix,
                           resync_seconds=settings.queue_sync_resync_seconds,
                           retry=settings.retry)

    async def copies_settled() -> None:
        if sync_apis and settings.queue_sync_settle_seconds > 0:
            await queue_sync.settled(settings.queue_sync_settle_seconds)

    admin, sampler, leader = admin_api(pool, settings, publish=send, keeper=keeper,
                                         copies_settled=copies_settled)

    async def serve_admin(stopping: asyncio.Event) -> None:
        runner = web.AppRunner(admin.app(), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, settings.admin_host, settings.admin_port).start()
            log.info("admin API on http://%s:%s", settings.admin_host,
                     runner.addresses[0][1] if runner.addresses else settings.admin_port)
            readiness.set(ADMIN_CHECK, True, "serving")
            await stopping.wait()
        finally:
            await runner.cleanup()

    async def run(stopping: asyncio.Event) -> None:
        """Consumers, the admin API and the queue copies share the pool, closed after all."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(serve_admin(stopping), name="admin API")
                group.create_task(sampler.run(stopping), name="fairness samples")
                if sync_apis:
                    group.create_task(queue_sync.run(stopping), name="queue sync")
                group.create_task(collector.run(stopping), name="namespace collector")
                if keeper.apis:
                    group.create_task(reconciler.run(stopping), name="namespace roles")
                for consumer in consumers:
                    group.create_task(consumer.run(stopping), name=consumer.consumer_name)
        finally:
            await producer.stop()
            await leader.close()
            for api in (*sync_apis.values(), *keeper_apis.values()):
                await api.close()
            await pool.close()

    return [run]


def admin_api(pool: asyncpg.Pool, settings: QueueStoreSettings, *, publish: Publish,
              keeper: NamespaceKeeper, copies_settled: CopiesSettled = no_copies
              ) -> tuple[AdminApi, FairnessSampler, SchedulerLeader]:
    """The admin API with every module's routes (and the web UI), the fairness sampler the
    UI's chart reads (a loop to run) and the scheduler leader's client (to close);
    tests/unit/test_openapi.py builds it too, to check the routes."""
    namespace_api = NamespaceApi(pool=pool, keeper=keeper,
                                 name_prefix=settings.namespace_name_prefix,
                                 copies_settled=copies_settled)
    collection_api = CollectionApi(pool, publish)
    leader = SchedulerLeader(settings.scheduler_urls,
                             timeout_seconds=settings.scheduler_timeout_seconds)
    sampler = FairnessSampler(leader=leader, interval_seconds=settings.ui.sample_seconds,
                              keep=settings.ui.history_samples)
    ui_api = UiApi(pool=pool, leader=leader, sampler=sampler, job_json=job_json,
                   trace_url=settings.ui.trace_url,
                   traces=(TraceStore(settings.ui.traces_url) if settings.ui.traces_url
                           else None))
    admin = AdminApi(pool, TokenVerifier(settings.admin_token_entries()),
                     extensions=[collection_api.register, ui_api.register,
                                 lambda app: namespace_api.add_routes(app.router)],
                     leader=leader, copies_settled=copies_settled,
                     unserved=keeper.unserved_namespaces)
    return admin, sampler, leader


async def _started_producer(settings: QueueStoreSettings) -> AIOKafkaProducer:
    """The producer of the admin API's commands, once Kafka takes a connection."""
    async def start() -> AIOKafkaProducer:
        producer = make_producer(settings.kafka(), client_id=f"{settings.service_name}-commands")
        try:
            await producer.start()
        except Exception:
            await producer.stop()
            raise
        return producer

    return await retry(start, backoff=Backoff(settings.retry), retryable=is_retryable_kafka_error,
                       what="starting the command producer", dependency="kafka")


def _linger(settings: QueueStoreSettings, topic: Topic[Any]) -> tuple[int, int]:
    """How long a consumer of `topic` waits for more after a poll, and within how long of its
    last batch (BatchConsumer.linger_ms, .linger_when_busy_ms; 0: always)."""
    if topic is RELEASE_OUTCOMES:
        return settings.outcomes_linger_ms, 0
    if topic is POD_EVENTS:
        return settings.pod_events_linger_ms, 4 * settings.pod_events_linger_ms
    return 0, 0


def _reporter(ctx: ServiceContext, check: str) -> Callable[[bool, str], None]:
    def report(ready: bool, detail: str) -> None:
        ctx.readiness.set(check, ready, detail)
    return report
