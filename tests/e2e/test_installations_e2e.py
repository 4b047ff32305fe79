"""Two installations of lockgate on one Kafka cluster, as staging and production are (issue 38).

Before: a second installation on the same stack (other ports, another database) read the first
one's topics, so `status`, the web UI and `cluster list` showed the first one's clusters and
queues, and its pool counted every node twice. Now each installation has a topic prefix of its
own (LOCKGATE_TOPIC_PREFIX) and its queue-store stores only the events of the clusters it was
configured for (LOCKGATE_QUEUE_STORE_CLUSTERS); lockgate.installation.

Staging manages cluster-a; production manages cluster-a and cluster-b, each under names of its
own. Neither run keeps other clusters out with the test database's trigger
(`only_own_clusters=False`): only lockgate's own settings keep them apart here.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devstack.stack import StackInfo
from helpers.kube import gates_of
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.events import (
    CLUSTER_CAPACITY,
    POD_EVENTS,
    ClusterCapacity,
    NodeCapacity,
    PodEvent,
    Topic,
)
from lockgate.jobs import JobState
from lockgate.labels import SCHEDULING_GATE
from lockgate_adapters.kafka import make_producer, publish
from lockgate_adapters.settings import KafkaConfig

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

SERVICES = ("queue-store", "admission-webhook", "cluster-watcher")
# Each watcher says every cluster's capacity every second, so a capacity another installation
# would fold shows within seconds.
ENV = {"LOCKGATE_WATCHER_CAPACITY_REFRESH_SECONDS": "1"}
SETTLE_SECONDS = 4.0  # several capacity refreshes, and a pod event's way through both


async def api(run: LockgateRun, path: str) -> Any:
    async with aiohttp.ClientSession(headers=run.lockgate.admin_headers) as session, \
            session.get(f"{run.lockgate.admin_url}{path}") as reply:
        assert reply.status == 200, await reply.text()
        return await reply.json()


async def cluster_names(run: LockgateRun) -> set[str]:
    """The clusters `lockgate cluster list` and the UI show."""
    return {cluster["name"] for cluster in (await api(run, "/api/v1/clusters"))["clusters"]}


async def pool(run: LockgateRun) -> dict[str, int]:
    """Nodes stored per cluster (present ones): the pool the scheduler shares out."""
    rows = await run.pool.fetch(
        "SELECT cluster, count(*) AS nodes FROM cluster_nodes WHERE present GROUP BY cluster")
    return {row["cluster"]: int(row["nodes"]) for row in rows}


async def jobs_of(run: LockgateRun) -> set[tuple[str, str]]:
    rows = await run.pool.fetch("SELECT cluster, queue FROM jobs")
    return {(row["cluster"], row["queue"]) for row in rows}


async def gated_pod_stored(run: LockgateRun, queue: str) -> str:
    """A queue bound to the run's namespace and a pod in it, gated and stored; its uid."""
    await run.create_queue(queue, namespaces=[run.namespace])
    await run.create_namespace()
    created = await run.create_pod(a_pod("p").in_queue(queue).manifest())
    assert gates_of(created) == [SCHEDULING_GATE], "the run's webhook did not gate its pod"
    uid = str(created.metadata.uid)
    await eventually(lambda: run.job(uid), within=60, what=f"{run.id}'s pod stored")
    return uid


async def metric(run: LockgateRun, name: str, labels: dict[str, str]) -> float:
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{run.health_port('queue-store')}/metrics") as reply:
        text = await reply.text()
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return 0.0


async def test_two_installations_on_one_kafka_see_only_their_own_clusters_and_queues(
        stack: StackInfo, tmp_path: Path) -> None:
    async with lockgate_run(stack, tmp_path, name="staging", clusters=("cluster-a",),
                            services=SERVICES, env=ENV, own_topics=True,
                            only_own_clusters=False) as staging, \
            lockgate_run(stack, tmp_path, name="prod", clusters=("cluster-a", "cluster-b"),
                         services=SERVICES, env=ENV, own_topics=True,
                         only_own_clusters=False) as production:
        assert staging.lockgate.topic_prefix != production.lockgate.topic_prefix
        staging_queue, production_queue = staging.name("q"), production.name("q")
        await gated_pod_stored(staging, staging_queue)
        await gated_pod_stored(production, production_queue)
        own = {staging.id: set(staging.clusters), production.id: set(production.clusters)}

        async def each_sees_its_clusters() -> bool:
            return (await cluster_names(staging) == own[staging.id]
                    and await cluster_names(production) == own[production.id])
        await eventually(each_sees_its_clusters, within=60,
                         what="each installation's clusters in its cluster list")
        await asyncio.sleep(SETTLE_SECONDS)

        # Nothing of the other installation: clusters, nodes, jobs, queues.
        assert await cluster_names(staging) == own[staging.id]
        assert await cluster_names(production) == own[production.id]
        assert set(await pool(staging)) == own[staging.id]
        assert set(await pool(production)) == own[production.id]
        # The same real cluster-a, counted once in each installation's pool.
        staging_a, production_a = staging.alias("cluster-a"), production.alias("cluster-a")
        assert (await pool(staging))[staging_a] == (await pool(production))[production_a]
        assert await jobs_of(staging) == {(staging_a, staging_queue)}
        assert await jobs_of(production) == {(production_a, production_queue)}
        status = await api(staging, "/api/v1/status")
        assert {queue["name"] for queue in status["queues"]} == {staging_queue}, status
        # Not even skipped: the other installation's events never reach this one (own topics);
        # LOCKGATE_QUEUE_STORE_CLUSTERS alone would have counted them as another cluster's.
        for run in (staging, production):
            assert await skipped(run, CLUSTER_CAPACITY) == 0
            assert await skipped(run, POD_EVENTS) == 0

        # A watcher of a cluster staging was not configured for, publishing on staging's
        # topics (a copied configuration): its events are counted and skipped, never stored.
        await stray_events_are_skipped(staging)


async def skipped(run: LockgateRun, topic: Topic[Any]) -> float:
    """Events of `topic` the run's queue-store skipped as another cluster's."""
    return await metric(run, "lockgate_queue_store_events_total",
                        {"topic": topic.name, "outcome": "other_cluster"})


async def stray_events_are_skipped(run: LockgateRun) -> None:
    before = await skipped(run, CLUSTER_CAPACITY), await skipped(run, POD_EVENTS)
    now = datetime.now(UTC)
    producer = make_producer(KafkaConfig(run.lockgate.kafka_bootstrap,
                                         topic_prefix=run.lockgate.topic_prefix),
                             client_id="stray-watcher")
    await producer.start()
    try:
        await publish(producer, CLUSTER_CAPACITY, ClusterCapacity(
            cluster="elsewhere", observed_at=now,
            nodes=[NodeCapacity(name="stray", allocatable={"cpu": 64_000})]))
        await publish(producer, POD_EVENTS, PodEvent(
            event_id="stray-1", cluster="elsewhere", namespace=run.namespace, name="stray",
            uid=f"stray-{run.id}", state=JobState.QUEUED, queue="stray", jobset="stray",
            created_at=now, observed_at=now))
    finally:
        await producer.stop()

    async def counted() -> bool:
        return (await skipped(run, CLUSTER_CAPACITY), await skipped(run, POD_EVENTS)) == (
            before[0] + 1, before[1] + 1)
    await eventually(counted, within=30, what="the stray events counted as another cluster's")
    assert "elsewhere" not in await cluster_names(run)
    assert not any(cluster == "elsewhere" for cluster, _ in await jobs_of(run))
