"""cluster-watcher's composition root: one watcher per cluster, one publisher for them all."""

from __future__ import annotations

import asyncio
import logging

from cluster_watcher.growth_watching import GrowthWatcher
from cluster_watcher.publishing import KafkaPublisher, Outbox
from cluster_watcher.settings import WatcherSettings
from cluster_watcher.watching import ClusterWatcher, WatchOptions
from lockgate_adapters.kube import api_clients
from lockgate_adapters.service import Loop, ServiceContext

log = logging.getLogger(__name__)

KAFKA_CHECK = "kafka"


async def compose(ctx: ServiceContext) -> list[Loop]:
    settings = ctx.settings
    assert isinstance(settings, WatcherSettings)
    readiness = ctx.readiness
    outbox = Outbox(max_pending=settings.max_pending_events)
    publisher = KafkaPublisher(
        bootstrap=settings.kafka(),
        outbox=outbox,
        retry_policy=settings.retry,
        set_ready=lambda ok, detail: readiness.set(KAFKA_CHECK, ok, detail),
        batch_size=settings.publish_batch_size,
        send_timeout_seconds=settings.kafka_send_timeout_seconds,
    )
    options = WatchOptions(timeout_seconds=settings.watch_timeout_seconds,
                           page_size=settings.list_page_size, retry=settings.retry,
                           pod_audit_seconds=settings.pod_audit_seconds,
                           skipped_gate_resend_seconds=settings.skipped_gate_resend_seconds)
    apis = await api_clients(settings.clusters)
    ctx.dependencies.kafka(settings.kafka())
    for name, api in apis.items():
        ctx.dependencies.apiserver(name, api)
    watchers = [
        ClusterWatcher(
            cluster=name, api=api, outbox=outbox, set_ready=readiness.set, options=options,
            capacity_min_interval=settings.capacity_min_interval_seconds,
            capacity_refresh=settings.capacity_refresh_seconds,
            managed_namespace_labels=settings.namespace_labels,
        )
        for name, api in apis.items()
    ]
    growth_watchers = [
        GrowthWatcher(
            cluster=name, api=api, outbox=outbox, set_ready=readiness.set, options=options,
            min_interval=settings.growth_min_interval_seconds,
            refresh=settings.growth_refresh_seconds,
            recheck=settings.growth_recheck_seconds,
        )
        for name, api in apis.items()
    ]
    readiness.declare(KAFKA_CHECK, *(check for w in watchers for check in (
        w.namespaces_check, w.pods_check, w.nodes_check)),
        *(w.growth_check for w in growth_watchers))

    async def watch_and_publish(stopping: asyncio.Event) -> None:
        """Watchers stop on `stopping`; the publisher then sends what they left, and stops."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(publisher.run(), name="publish to kafka")
                async with asyncio.TaskGroup() as watching:
                    for watcher in watchers:
                        watching.create_task(watcher.run(stopping),
                                             name=f"watch {watcher.cluster}")
                    for growth in growth_watchers:
                        watching.create_task(growth.run(stopping),
                                             name=f"watch {growth.cluster} growth")
                log.info("watchers stopped; publishing the %d events left", len(outbox))
                outbox.close()
        finally:
            for api in apis.values():
                await api.close()

    return [watch_and_publish]
