"""The ingest path end to end: pod → admission webhook → cluster-watcher → Kafka → queue-store.

Everything runs as real processes on the local stack: queue-store on a database of this module
(its admin API creates the queue first, as an operator would), the admission webhook registered
under a name of the run (helpers.runs) for namespaces carrying its label only, and a watcher of
both clusters. Pods are created plain, in managed namespaces of both clusters; the webhook gates
and labels them. The last test SIGKILLs and restarts the watcher and queue-store in the middle of
a stream of pod creations and deletions and then compares Postgres with the apiservers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.launcher import ServiceProcess
from devstack.stack import StackInfo
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.jobs import JobState
from lockgate.labels import QUEUE_LABEL, SCHEDULING_GATE
from lockgate.observing import observed_state

pytestmark = [pytest.mark.timeout(420)]

SHOW_UP_WITHIN_SECONDS = 10.0


# The system under test ------------------------------------------------------------------------

@dataclass
class IngestPath:
    run: LockgateRun
    queue_store: ServiceProcess
    watcher: ServiceProcess
    webhook: ServiceProcess
    db: asyncpg.Pool
    clusters: list[str]  # the run's aliases of cluster-a and cluster-b
    cores: dict[str, client.CoreV1Api]  # by alias
    namespaces: dict[str, str]  # alias → this module's managed namespace there
    queue: str  # the namespaces' queue

    def logs(self) -> str:
        return self.run.logs(15)


@pytest.fixture(scope="module")
async def path(stack: StackInfo,
               tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[IngestPath]:
    """One run for the module (no scheduler: nothing is released); each test makes pods of its
    own."""
    async with lockgate_run(stack, tmp_path_factory.mktemp("runs"), name="ingest",
                            clusters=("cluster-a", "cluster-b"),
                            services=["queue-store", "admission-webhook",
                                      "cluster-watcher"]) as run:
        queue = run.name("q")
        # Its admin API creates the queue first, as an operator would.
        await run.create_queue(queue, namespaces=[run.namespace])
        clusters = [run.alias("cluster-a"), run.alias("cluster-b")]
        for alias in clusters:  # namespaces whose pods default to the queue
            await run.create_namespace(alias, labels={QUEUE_LABEL: queue})
        processes = run.lockgate.processes
        yield IngestPath(run, processes["queue-store"], processes["cluster-watcher"],
                         processes["admission-webhook"], run.pool, clusters,
                         {alias: run.core(alias) for alias in clusters},
                         {alias: run.namespace for alias in clusters}, queue)


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

    The run's database keeps only its own clusters' rows (helpers.runs).
    """
    rows = await path.db.fetch(
        "SELECT cluster, uid, state FROM jobs WHERE namespace = ANY($1) AND cluster = ANY($2)",
        list(path.namespaces.values()), path.clusters)
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
    for cluster in path.clusters:
        for i in range(5):
            pod = await create_pod(path, cluster, f"appear-{i}", jobset="sweep-7")
            assert SCHEDULING_GATE in [g.name for g in pod.spec.scheduling_gates or ()], (
                f"the webhook did not gate the pod:\n{path.logs()}")
            assert pod.metadata.labels[QUEUE_LABEL] == path.queue
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
        " AND cluster = ANY($2)", [uid for _, uid in created], path.clusters)
    assert {r["cluster"] for r in rows} == set(path.clusters)
    assert {(r["queue"], r["jobset"]) for r in rows} == {(path.queue, "sweep-7")}
    # What the pod asks for, in canonical units (other resources the watcher counts, such as a
    # pod's slot, may sit beside them).
    requests = [json.loads(r["requests"]) if isinstance(r["requests"], str) else r["requests"]
                for r in rows]  # the run's pool has no jsonb codec
    assert all({k: asked.get(k) for k in ("cpu", "memory")} == {
        "cpu": 250, "memory": 64 * 2**20} for asked in requests), requests


async def test_deleting_a_gated_pod_marks_its_job_deleted(path: IngestPath) -> None:
    cluster_b = path.clusters[1]
    pod = await create_pod(path, cluster_b, "short-lived")
    key = (cluster_b, pod.metadata.uid)

    async def in_state(state: JobState) -> bool:
        return (await job_states(path)).get(key) == state

    await eventually(lambda: in_state(JobState.QUEUED), within=30, every=0.1,
                     what=lambda: f"the job to be queued\n{path.logs()}")
    await delete_pod(path, cluster_b, "short-lived")
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
            cluster = path.clusters[i % 2]
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
    await path.watcher.wait_ready()
    await path.queue_store.wait_ready()

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
        " AND cluster = ANY($2)", list(path.namespaces.values()), path.clusters)
    assert attempts == 0
    print(f"stream: {len(created)} pods created, {len(deleted)} deleted, "
          f"{sum(1 for s in stream_rows.values() if s == JobState.QUEUED)} queued at the end")
