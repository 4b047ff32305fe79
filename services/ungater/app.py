"""The ungater's composition root: one apiserver client per served cluster, a producer for
outcomes, the release-command consumer, the pod-notice consumer (Events on pods), and the
job-set command consumer (a cancelled job set's pods are deleted)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaProducer

from lockgate.dead_lettering import LetterLimits
from lockgate.events import (
    DEAD_LETTERS,
    JOBSET_COMMANDS,
    POD_NOTICES,
    RELEASE_COMMANDS,
    RELEASE_OUTCOMES,
)
from lockgate_adapters.kafka import BatchConsumer, start_producer
from lockgate_adapters.kube import api_clients
from lockgate_adapters.service import Loop, ServiceContext
from ungater.cancelling import JobSetCanceller
from ungater.noticing import Noticer
from ungater.pods import PodGateClient
from ungater.settings import UngaterSettings
from ungater.ungating import ClusterReleaser, Ungater

log = logging.getLogger(__name__)


async def compose(ctx: ServiceContext) -> list[Loop]:
    settings = ctx.settings
    assert isinstance(settings, UngaterSettings)
    apis = await api_clients(settings.clusters)
    # `apiserver:<cluster>` is the probe's: it follows the apiserver in and out of an outage
    # (a release that failed says so in its outcome, not in a readiness that sticks).
    ctx.readiness.declare("kafka")
    ctx.dependencies.kafka(settings.kafka())
    for name, api in apis.items():
        ctx.dependencies.apiserver(name, api)
    pods = {name: PodGateClient(api, request_timeout=settings.request_timeout_seconds)
            for name, api in apis.items()}
    releasers = {
        name: ClusterReleaser(
            cluster=name,
            pods=pods[name],
            retry_policy=settings.retry,
            give_up_after=settings.give_up_after_seconds,
            max_in_flight=settings.max_in_flight_per_cluster,
            max_rereads=settings.max_rereads,
            optimistic_first_patch=settings.optimistic_first_patch,
        )
        for name, api in apis.items()
    }
    log.info("ungater serving %s as consumer groups %s and %s", sorted(apis),
             settings.consumer_group, settings.notices_group)
    stopped = 0  # the apiserver clients close when both loops have ended

    async def consume_commands(stopping: asyncio.Event) -> None:
        producer: AIOKafkaProducer | None = None
        try:
            producer = await start_producer(
                settings.kafka(), client_id=f"{settings.consumer_group}-outcomes",
                topics=(RELEASE_COMMANDS, RELEASE_OUTCOMES, POD_NOTICES, JOBSET_COMMANDS,
                        DEAD_LETTERS),
                policy=settings.retry,
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
                letter_limits=LetterLimits(value_bytes=settings.dead_letter_value_bytes),
                instance=settings.instance_id,
            )
            await consumer.run(stopping)
        finally:
            if producer is not None:
                await producer.stop()
            await close_apis()

    async def consume_notices(stopping: asyncio.Event) -> None:
        # Its own group: a backlog of notices never delays release commands, nor they it.
        try:
            consumer = BatchConsumer(
                bootstrap=settings.kafka(),
                topic=POD_NOTICES,
                group_id=settings.notices_group,
                consumer_name="ungater-notices",
                handle=Noticer(pods=pods).handle,
                retry_policy=settings.retry,
                max_records=200,
                letter_limits=LetterLimits(value_bytes=settings.dead_letter_value_bytes),
                instance=settings.instance_id,
            )
            await consumer.run(stopping)
        finally:
            await close_apis()

    async def consume_cancels(stopping: asyncio.Event) -> None:
        # Its own group too: every served cluster's pods of a cancelled job set are deleted.
        try:
            consumer = BatchConsumer(
                bootstrap=settings.kafka(),
                topic=JOBSET_COMMANDS,
                group_id=settings.jobsets_group,
                consumer_name="ungater-jobsets",
                handle=JobSetCanceller(apis=apis,
                                       request_timeout=settings.request_timeout_seconds).handle,
                retry_policy=settings.retry,
                max_records=50,
                letter_limits=LetterLimits(value_bytes=settings.dead_letter_value_bytes),
                instance=settings.instance_id,
            )
            await consumer.run(stopping)
        finally:
            await close_apis()

    async def close_apis() -> None:
        nonlocal stopped
        stopped += 1
        if stopped == 3:
            for api in apis.values():
                await api.close()

    return [consume_commands, consume_notices, consume_cancels]


def _readiness_setter(ctx: ServiceContext, name: str) -> Callable[[bool, str], None]:
    def set_ready(ready: bool, detail: str) -> None:
        ctx.readiness.set(name, ready, detail)

    return set_ready

