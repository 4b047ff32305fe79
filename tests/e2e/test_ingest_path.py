"""The ingest path end to end: pod → admission webhook → cluster-watcher → Kafka → queue-store.

Everything runs as real processes on the local stack: queue-store on a database of this module
(its admin API creates the queue first, as an operator would), the admission webhook registered
under a unique name for namespaces carrying this module's label only, and a cluster-watcher of
both clusters. Pods are created plain, in managed namespaces of both clusters; the webhook gates
and labels them. The last test SIGKILLs and restarts the watcher and queue-store in the middle of
a stream of pod creations and deletions and then compares Postgres with the apiservers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.launcher import ServiceProcess
from devstack.manifests import (
    WEBHOOK_CONFIGURATION as STATIC_CONFIGURATION,
)
from devstack.manifests import (
    apply_webhook_configuration,
    delete_queue_copies,
    delete_webhook_configuration,
    ensure_queue_crd,
    load,
    render_webhook_configuration,
)
from devstack.stack import StackInfo
from helpers.kube import Namespaces
from helpers.pods import a_pod
from helpers.postgres import fresh_database
from helpers.services import watcher_process, webhook_process
from helpers.waiting import eventually
from lockgate.jobs import JobState
from lockgate.labels import MANAGED_NAMESPACE_LABEL, QUEUE_LABEL, SCHEDULING_GATE
from lockgate.observing import observed_state
from lockgate_adapters.postgres import connect_pool
from queue_store.testing import FAST_RETRY, QueueStoreUnderTest

pytestmark = [pytest.mark.timeout(420)]

RUN = uuid.uuid4().hex[:8]
INSTANCE_LABEL = "lockgate-test.io/ingest-path"
QUEUE = f"e2e-ingest-{RUN}"
CLUSTERS = ("cluster-a", "cluster-b")
SHOW_UP_WITHIN_SECONDS = 10.0
WEBHOOK_CONFIGURATION = f"lockgate-e2e-ingest-{RUN}"
QUEUE_SOURCE = f"e2e-ingest-{RUN}"


# The system under test ------------------------------------------------------------------------

@dataclass
class IngestPath:
    stack: StackInfo
    store: QueueStoreUnderTest
    queue_store: ServiceProcess
    watcher: ServiceProcess
    webhook: ServiceProcess
    db: asyncpg.Pool
    cores: dict[str, client.CoreV1Api]
    namespaces: dict[str, str]  # cluster → this module's managed namespace there
    processes: list[ServiceProcess] = field(default_factory=list)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log_path})\n{p.log_tail(15)}"
                         for p in self.processes)


@pytest.fixture(scope="module")
async def path(stack: StackInfo, kube_clients: dict[str, client.ApiClient],
               tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[IngestPath]:
    cores = {name: client.CoreV1Api(kube_clients[name]) for name in CLUSTERS}
    # Each service with its own ServiceAccount (k8s/base), as in a worker cluster.
    as_webhook = {c: stack.kubeconfigs_of("webhook")[c] for c in CLUSTERS}
    as_watcher = {c: stack.kubeconfigs_of("cluster-watcher")[c] for c in CLUSTERS}
    as_queue_sync = {c: stack.kubeconfigs_of("queue-sync")[c] for c in CLUSTERS}
    processes: list[ServiceProcess] = []
    made = Namespaces(kube_clients)
    db: asyncpg.Pool | None = None
    async with fresh_database(stack.postgres_dsn, prefix="e2e_ingest") as dsn:
        store = QueueStoreUnderTest(postgres_dsn=dsn, kafka_bootstrap=stack.kafka_bootstrap)
        try:
            for cluster in CLUSTERS:
                await ensure_queue_crd(kube_clients[cluster])
            queue_store = await store.start(f"queue-store-e2e-{RUN}", env={
                # Copies of the queues for the webhook, as this module's own Queue objects.
                "LOCKGATE_QUEUE_STORE_QUEUE_SYNC_CLUSTERS": json.dumps(as_queue_sync),
                "LOCKGATE_QUEUE_STORE_QUEUE_SYNC_SOURCE": QUEUE_SOURCE,
                "LOCKGATE_QUEUE_STORE_QUEUE_SYNC_NAME_PREFIX": f"{QUEUE_SOURCE}-",
            })
            processes.append(queue_store)
            async with aiohttp.ClientSession() as session, session.post(
                    f"{store.admin_url}/api/v1/queues", json={
                        "name": QUEUE, "namespaces": [{"cluster": "*", "selector": {
                            "matchLabels": {INSTANCE_LABEL: RUN}}}]},
                    headers=store.admin_headers) as reply:
                assert reply.status == 201, await reply.text()

            webhook_under_test = webhook_process(
                f"admission-webhook-e2e-{RUN}",
                cert_dir=tmp_path_factory.mktemp("webhook-certs"), env={
                    "LOCKGATE_WEBHOOK_CLUSTERS": json.dumps(as_webhook),
                    "LOCKGATE_WEBHOOK_QUEUE_SOURCE": QUEUE_SOURCE,
                })
            webhook = webhook_under_test.process
            webhook.env.pop("LOCKGATE_POSTGRES_DSN", None)  # it needs no database
            watcher = watcher_process(f"cluster-watcher-e2e-{RUN}", clusters=as_watcher,
                                      kafka_bootstrap=stack.kafka_bootstrap)
            processes += [webhook, watcher]
            for process in (webhook, watcher):
                await process.start()
            for process in (webhook, watcher):
                await process.wait_ready(90)
            for cluster in CLUSTERS:
                await apply_webhook_configuration(
                    kube_clients[cluster], render_webhook_configuration(
                        load(STATIC_CONFIGURATION), name=WEBHOOK_CONFIGURATION,
                        url=f"https://127.0.0.1:{webhook_under_test.port}/mutate/{cluster}",
                        ca_bundle_pem=(webhook_under_test.cert_dir / "ca.crt").read_bytes(),
                        extra_namespace_labels={INSTANCE_LABEL: RUN}))
            await webhook_sees(webhook, QUEUE)
            # Namespaces the webhook manages, whose pods default to QUEUE.
            namespaces = {
                cluster: await made.create(cluster, f"e2e-ingest-{RUN}-{uuid.uuid4().hex[:4]}",
                                           labels={MANAGED_NAMESPACE_LABEL: "true",
                                                   INSTANCE_LABEL: RUN, QUEUE_LABEL: QUEUE})
                for cluster in CLUSTERS}
            db = await connect_pool(dsn, policy=FAST_RETRY)
            yield IngestPath(stack, store, queue_store, watcher, webhook, db, cores, namespaces,
                             processes)
        finally:
            for process in reversed(processes):
                await process.stop()
            for cluster in CLUSTERS:
                await delete_webhook_configuration(kube_clients[cluster], WEBHOOK_CONFIGURATION)
                await delete_queue_copies(kube_clients[cluster], source=QUEUE_SOURCE)
            await made.delete_all()
            if db is not None:
                await db.close()


async def webhook_sees(webhook: ServiceProcess, queue: str) -> None:
    """Until the webhook's copy of the queues (from queue-store's Queue objects) has `queue`."""
    async def seen() -> bool:
        async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{webhook.health_port}/api/v1/queues") as reply:
            copies = await reply.json()
        return all(queue in (copies.get(cluster) or {}) for cluster in CLUSTERS)

    await eventually(seen, within=30, what=f"the webhook to see queue {queue}")


# Pods -----------------------------------------------------------------------------------------

async def create_pod(path: IngestPath, cluster: str, name: str,
                     jobset: str | None = None) -> Any:
    """A pod as a user or operator writes it: no gate, no queue (the webhook adds them)."""
    pod = a_pod(name).requesting(cpu="250m", memory="64Mi")
    if jobset:
        pod = pod.in_jobset(jobset)
    return await path.cores[cluster].create_namespaced_pod(path.namespaces[cluster],
                                                           pod.manifest())


async def delete_pod(path: IngestPath, cluster: str, name: str) -> None:
    with contextlib.suppress(ApiException):
        await path.cores[cluster].delete_namespaced_pod(name, path.namespaces[cluster],
                                                        grace_period_seconds=0)


async def job_states(path: IngestPath) -> dict[tuple[str, str], str]:
    """(cluster, uid) → state of this module's jobs.

    Only the real cluster names count: a watcher of another test may watch the same clusters
    under names of its own, and what it reports lands in this database too.
    """
    rows = await path.db.fetch(
        "SELECT cluster, uid, state FROM jobs WHERE namespace = ANY($1) AND cluster = ANY($2)",
        list(path.namespaces.values()), list(CLUSTERS))
    return {(r["cluster"], r["uid"]): r["state"] for r in rows}


async def apiserver_truth(path: IngestPath) -> dict[tuple[str, str], JobState]:
    """(cluster, uid) → state, for every unfinished pod of this module in both clusters."""
    truth: dict[tuple[str, str], JobState] = {}
    for cluster, core in path.cores.items():
        response = await core.list_namespaced_pod(path.namespaces[cluster],
                                                  _preload_content=False)
        for pod in json.loads(await response.read())["items"]:  # the apiserver's JSON form
            state = observed_state(pod)
            if not state.is_terminal:
                truth[(cluster, pod["metadata"]["uid"])] = state
    return truth


# Tests ----------------------------------------------------------------------------------------

async def test_pods_created_in_both_clusters_show_up_as_queued_jobs_within_seconds(
        path: IngestPath) -> None:
    created: dict[tuple[str, str], float] = {}
    for cluster in CLUSTERS:
        for i in range(5):
            pod = await create_pod(path, cluster, f"appear-{i}", jobset="sweep-7")
            assert SCHEDULING_GATE in [g.name for g in pod.spec.scheduling_gates or ()], (
                f"the webhook did not gate the pod:\n{path.logs()}")
            assert pod.metadata.labels[QUEUE_LABEL] == QUEUE
            created[(cluster, pod.metadata.uid)] = time.monotonic()

    latencies: dict[tuple[str, str], float] = {}

    async def all_queued() -> bool:
        states = await job_states(path)
        for key, since in created.items():
            if key not in latencies and states.get(key) == JobState.QUEUED:
                latencies[key] = time.monotonic() - since
        return len(latencies) == len(created)

    await eventually(all_queued, within=30, every=0.1, what=lambda: (
        f"{len(latencies)}/{len(created)} jobs queued\n{path.logs()}"))
    slowest = max(latencies.values())
    print(f"slowest pod creation → queued job in Postgres: {slowest:.2f}s")
    assert slowest < SHOW_UP_WITHIN_SECONDS

    rows = await path.db.fetch(
        "SELECT cluster, queue, jobset, requests FROM jobs WHERE uid = ANY($1)"
        " AND cluster = ANY($2)", [uid for _, uid in created], list(CLUSTERS))
    assert {r["cluster"] for r in rows} == set(CLUSTERS)
    assert {(r["queue"], r["jobset"]) for r in rows} == {(QUEUE, "sweep-7")}
    assert all(r["requests"] == {"cpu": 250, "memory": 64 * 2**20} for r in rows)


async def test_deleting_a_gated_pod_marks_its_job_deleted(path: IngestPath) -> None:
    pod = await create_pod(path, "cluster-b", "short-lived")
    key = ("cluster-b", pod.metadata.uid)

    async def in_state(state: JobState) -> bool:
        return (await job_states(path)).get(key) == state

    await eventually(lambda: in_state(JobState.QUEUED), within=30, every=0.1,
                     what=lambda: f"the job to be queued\n{path.logs()}")
    await delete_pod(path, "cluster-b", "short-lived")
    await eventually(lambda: in_state(JobState.DELETED), within=30, every=0.1,
                     what=lambda: f"the job to be deleted\n{path.logs()}")


STREAM_PODS = 90
STREAM_SECONDS = 12.0


async def test_killing_watcher_and_queue_store_mid_stream_loses_nothing_and_counts_nothing_twice(
        path: IngestPath) -> None:
    created: list[tuple[str, str, str, float]] = []  # cluster, name, uid, when
    deleted: set[tuple[str, str]] = set()

    async def stream() -> None:
        pause = STREAM_SECONDS / STREAM_PODS
        next_to_delete = 0
        for i in range(STREAM_PODS):
            cluster = CLUSTERS[i % 2]
            pod = await create_pod(path, cluster, f"stream-{i}")
            created.append((cluster, pod.metadata.name, pod.metadata.uid, time.monotonic()))
            # Every third pod is deleted once it is 2s old (older than a snapshot's rounding).
            old_cluster, old_name, old_uid, when = created[next_to_delete]
            if time.monotonic() - when > 2:
                await delete_pod(path, old_cluster, old_name)
                deleted.add((old_cluster, old_uid))
                next_to_delete += 3
            await asyncio.sleep(pause)

    async def crashes() -> None:
        await asyncio.sleep(STREAM_SECONDS * 0.25)
        await path.watcher.kill()
        await path.watcher.start()
        await asyncio.sleep(STREAM_SECONDS * 0.25)
        await path.queue_store.kill()
        await path.queue_store.start()
        await asyncio.sleep(STREAM_SECONDS * 0.2)
        await path.watcher.kill()  # and once more while queue-store is still rejoining
        await path.watcher.start()

    await asyncio.gather(stream(), crashes())
    await path.watcher.wait_ready(90)
    await path.queue_store.wait_ready(90)

    differences: list[str] = []

    async def converged() -> bool:
        truth = await apiserver_truth(path)
        stored = await job_states(path)
        unfinished = {key: JobState(state) for key, state in stored.items()
                      if not JobState(state).is_terminal}
        differences[:] = [f"{key}: apiserver {truth.get(key)}, postgres {stored.get(key)}"
                          for key in sorted(set(truth) | set(unfinished))
                          if truth.get(key) != unfinished.get(key)]
        return not differences

    await eventually(converged, within=120, every=0.1, what=lambda: (
        "Postgres to match the apiservers; differences:\n" + "\n".join(differences[:20])
        + f"\n{path.logs()}"))
    truth = await apiserver_truth(path)
    stored = await job_states(path)
    stream_uids = {(cluster, uid) for cluster, _, uid, _ in created}
    assert stream_uids - set(deleted) <= set(truth), "every pod still there is in the truth"
    wrongly_kept = {key: stored[key] for key in deleted
                    if key in stored and stored[key] != JobState.DELETED}
    assert not wrongly_kept, f"deleted pods not marked deleted: {wrongly_kept}"
    stream_rows = {key: state for key, state in stored.items() if key in stream_uids}
    # A pod created and deleted while no watcher ran was never seen; every other one was stored.
    assert stream_uids - deleted <= set(stream_rows), "every living pod of the stream is stored"
    assert len(stream_rows) >= len(stream_uids) - len(deleted)
    attempts = await path.db.fetchval(
        "SELECT coalesce(sum(release_attempts), 0) FROM jobs WHERE namespace = ANY($1)"
        " AND cluster = ANY($2)", list(path.namespaces.values()), list(CLUSTERS))
    assert attempts == 0
    print(f"stream: {len(created)} pods created, {len(deleted)} deleted, "
          f"{sum(1 for s in stream_rows.values() if s == JobState.QUEUED)} queued at the end")
