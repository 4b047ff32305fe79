"""The ungater's composition root: one apiserver client per served cluster, a producer for
outcomes, and the release-command consumer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaProducer
from kubernetes_asyncio import client

from lockgate.events import DEAD_LETTERS, RELEASE_COMMANDS, RELEASE_OUTCOMES
from lockgate_adapters.kafka import BatchConsumer, start_producer
from lockgate_adapters.kube import api_clients
from lockgate_adapters.retrying import BackoffIterator, sleep_unless_stopped
from lockgate_adapters.service import Loop, ServiceContext
from ungater.pods import KubeCallError, PodGateClient, probe
from ungater.settings import UngaterSettings
from ungater.ungating import ClusterReleaser, Ungater

log = logging.getLogger(__name__)


async def compose(ctx: ServiceContext) -> list[Loop]:
    settings = ctx.settings
    assert isinstance(settings, UngaterSettings)
    apis = await api_clients(settings.clusters)
    ctx.readiness.declare("kafka", *(f"apiserver:{name}" for name in apis))
    releasers = {
        name: ClusterReleaser(
            cluster=name,
            pods=PodGateClient(api, request_timeout=settings.request_timeout_seconds),
            retry_policy=settings.retry,
            give_up_after=settings.give_up_after_seconds,
            max_in_flight=settings.max_in_flight_per_cluster,
            max_rereads=settings.max_rereads,
            optimistic_first_patch=settings.optimistic_first_patch,
            on_ready=_readiness_setter(ctx, f"apiserver:{name}"),
        )
        for name, api in apis.items()
    }
    log.info("ungater serving %s as consumer group %s", sorted(apis), settings.consumer_group)

    async def consume_commands(stopping: asyncio.Event) -> None:
        producer: AIOKafkaProducer | None = None
        try:
            producer = await start_producer(
                settings.kafka(), client_id=f"{settings.consumer_group}-outcomes",
                topics=(RELEASE_COMMANDS, RELEASE_OUTCOMES, DEAD_LETTERS), policy=settings.retry,
                stopping=stopping,
                on_unreachable=lambda error: ctx.readiness.set("kafka", False, f"kafka: {error}"))
            if producer is None:
                return
            ungater = Ungater(releasers=releasers, producer=producer)
            consumer = BatchConsumer(
                bootstrap=settings.kafka(),
                topic=RELEASE_COMMANDS,
                group_id=settings.consumer_group,
                consumer_name="ungater",
                handle=ungater.handle,
                retry_policy=settings.retry,
                on_ready=_readiness_setter(ctx, "kafka"),
            )
            await consumer.run(stopping)
        finally:
            if producer is not None:
                await producer.stop()
            for api in apis.values():
                await api.close()

    probes: list[Loop] = [
        _prober(ctx, name, api, settings) for name, api in apis.items()
    ]
    return [consume_commands, *probes]


def _readiness_setter(ctx: ServiceContext, name: str) -> Callable[[bool, str], None]:
    def set_ready(ready: bool, detail: str) -> None:
        ctx.readiness.set(name, ready, detail)

    return set_ready


def _prober(ctx: ServiceContext, name: str, api: client.ApiClient,
            settings: UngaterSettings) -> Loop:
    """Until the apiserver first answers, keep readiness false and say why."""

    async def probe_until_reachable(stopping: asyncio.Event) -> None:
        delays = BackoffIterator(settings.retry)
        while not stopping.is_set():
            try:
                await probe(api, request_timeout=settings.request_timeout_seconds)
                ctx.readiness.set(f"apiserver:{name}", True, "apiserver answering")
                return
            except KubeCallError as error:
                delay = next(delays, settings.retry.max_seconds)
                ctx.readiness.set(f"apiserver:{name}", False, str(error))
                await sleep_unless_stopped(stopping, delay)

    return probe_until_reachable
