"""Why is my pod still pending: Events on waiting pods, `lockgate explain`, max time queued.

Every service runs as a process with its own identity (Lockgate.for_stack), on real Kafka,
Postgres and a real kube-apiserver with kwok nodes (4 nodes of 16 cpu in cluster-a).

- Four waiting situations, each built for real: a queue holding the whole cluster waits for
  room; once another queue waits too, it waits for its fair share; a pod bigger than every node
  fits nowhere; a queue cordoned after admitting its pod. `lockgate explain` (the CLI, through
  the admin API) names each reason, and each pod gets Events saying the same, read back with
  the Kubernetes API: the first when it is queued, more while it waits, never more often per pod
  than the interval, and never faster per cluster than the token bucket allows.
- Max time queued, both ways: a Job's pod in a queue that fails pods after 3 s ends Failed with
  the reason (the Job counts it failed); in a queue that deletes them it is deleted, and its Job
  counts it failed too. Each pod carries the Event that says why.
- A job set's own max time queued: a pod in an ephemeral namespace made with
  `lockgate namespace create --max-queued-time 3s` is stamped with it by the webhook and failed
  with the reason and an Event, although its queue has no maximum.

Isolation as in every end-to-end test (helpers.runs): a database of its own keeping only this
run's cluster name, its own namespace, webhook registration and consumer groups.
"""

from __future__ import annotations

import io
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.launcher import Lockgate
from devstack.stack import StackInfo
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.labels import QUEUE_LABEL
from lockgate.max_queued import MAX_QUEUED_TIME_ANNOTATION
from lockgate_cli import root as cli

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

RUN = uuid.uuid4().hex[:6]  # queues of this module's run; each test has queues of its own
FILL, LATE, BIG, CORDON = (f"{name}-{RUN}" for name in ("fill", "late", "big", "cordon"))
FAILS, DELETES = f"fails-{RUN}", f"deletes-{RUN}"
PATIENT = f"patient-{RUN}"  # no maximum of its own: a job set's applies
QUEUES = (FILL, LATE, BIG, CORDON, FAILS, DELETES, PATIENT)
MAX_QUEUED = {FAILS: {"seconds": 3, "action": "fail"},
              DELETES: {"seconds": 3, "action": "delete"}}
# Notices: every 4 s per pod at most; per cluster 0.5/s with a burst of 3, so with five pods
# waiting the cluster's bucket, not the pods' interval, is what bounds the rate.
POD_INTERVAL, CLUSTER_RATE, CLUSTER_BURST = 4.0, 0.5, 3.0
NODE_CPU = "16"  # every kwok node of cluster-a


@dataclass
class Running:
    run: LockgateRun
    lockgate: Lockgate
    core: client.CoreV1Api
    batch: client.BatchV1Api
    namespace: str
    alias: str
    db: asyncpg.Pool
    token_file: str


@pytest.fixture(scope="module")
async def running(stack: StackInfo,
                  tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Running]:
    """One run for the module: each test uses queues and pods of its own in its namespace."""
    async with lockgate_run(stack, tmp_path_factory.mktemp("runs"), name="pend",
                            needs_empty_nodes=True, standby_scheduler=False, env={
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "0.5",
            "LOCKGATE_SCHEDULER_WAIT_NOTICE_CHECK_SECONDS": "0.5",
            "LOCKGATE_SCHEDULER_WAIT_NOTICE_INTERVAL_SECONDS": str(POD_INTERVAL),
            "LOCKGATE_SCHEDULER_WAIT_NOTICES_PER_CLUSTER_PER_SECOND": str(CLUSTER_RATE),
            "LOCKGATE_SCHEDULER_WAIT_NOTICE_BURST_PER_CLUSTER": str(CLUSTER_BURST)}) as run:
        await run.create_queues({queue: {"max_queued": MAX_QUEUED[queue]}
                                 if queue in MAX_QUEUED else {} for queue in QUEUES},
                                namespaces=[run.namespace])
        await run.create_namespace()
        token_file = str(run.lockgate.write_token_files()["admin"])
        yield Running(run, run.lockgate, run.core(), run.batch(), run.namespace, run.alias(),
                      run.pool, token_file)


def lockgate_cli(running: Running, *argv: str) -> str:
    """Run the `lockgate` command in-process against this run's admin API; its stdout."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--api", running.lockgate.admin_url, "--token-file", running.token_file,
                     *argv], out=out, err=err)
    assert code == 0, f"lockgate {' '.join(argv)} exited {code}: {err.getvalue()}"
    return out.getvalue()


def explain(running: Running, pod: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(lockgate_cli(
        running, "explain", f"{running.alias}/{running.namespace}/{pod}", "-o", "json"))
    return answer


async def state_of(running: Running, name: str) -> str | None:
    row = await running.db.fetchrow(
        "SELECT state FROM jobs WHERE cluster = $1 AND namespace = $2 AND name = $3"
        " ORDER BY created_at DESC LIMIT 1", running.alias, running.namespace, name)
    return None if row is None else str(row["state"])


async def create(running: Running, name: str, queue: str, cpu: str) -> client.V1Pod:
    pod: client.V1Pod = await running.core.create_namespaced_pod(
        running.namespace, a_pod(name).in_queue(queue).tolerating_kwok_nodes()
        .requesting(cpu=cpu, memory="64Mi").manifest())
    return pod


async def until_state(running: Running, name: str, state: str, within: float = 60) -> None:
    async def reached() -> bool:
        return await state_of(running, name) == state

    await eventually(reached, within=within, every=0.2, what=f"pod {name} {state} in Postgres")


async def until_reason(running: Running, name: str, reason: str,
                       within: float = 30) -> dict[str, Any]:
    async def explained() -> dict[str, Any] | None:
        answer = explain(running, name)
        found = answer.get("explanation") or {}
        return answer if found.get("reason") == reason else None

    return await eventually(explained, within=within, every=0.5,
                            what=lambda: f"explain {name}: {reason}, last "
                                         f"{explain(running, name)['message']}")


async def lockgate_events(running: Running, uid: str | None = None) -> list[Any]:
    selector = "source=lockgate-ungater"
    if uid is not None:
        selector += f",involvedObject.uid={uid}"
    events = await running.core.list_namespaced_event(running.namespace, field_selector=selector)
    return list(events.items)


async def until_event(running: Running, pod: client.V1Pod, reason: str,
                      within: float = 60) -> Any:
    async def found() -> Any:
        for event in await lockgate_events(running, pod.metadata.uid):
            if event.reason == reason:
                return event
        return None

    return await eventually(found, within=within, every=0.5,
                            what=f"an Event {reason} on pod {pod.metadata.name}")


async def test_explain_and_events_name_what_each_waiting_pod_waits_for(running: Running) -> None:
    # One queue takes the whole cluster (a node each), and one pod more: it waits for room.
    for i in range(4):
        await create(running, f"fill-{i}", FILL, NODE_CPU)
    for i in range(4):
        await until_state(running, f"fill-{i}", "running", within=90)
    extra = await create(running, "fill-extra", FILL, NODE_CPU)
    await until_state(running, "fill-extra", "queued")
    room = await until_reason(running, "fill-extra", "cluster_room")
    assert room["explanation"]["position"] == 1
    assert room["explanation"]["cluster_free"].get("cpu", 0) < 16_000

    # Another queue waits too: now the full queue waits for its fair share, the other for room.
    late = await create(running, "late-0", LATE, NODE_CPU)
    await until_state(running, "late-0", "queued")
    fair = await until_reason(running, "fill-extra", "fair_share")
    assert fair["explanation"]["competing_queues"] == [LATE]
    assert fair["explanation"]["actual_share"] == pytest.approx(1.0)
    # Equal weights: half each, and what the late queue cannot use (it asks a quarter) back to
    # the full one.
    assert fair["explanation"]["adjusted_fair_share"] == pytest.approx(0.75, abs=0.01)
    await until_reason(running, "late-0", "cluster_room")

    # Bigger than every node: it fits nowhere.
    big = await create(running, "big-0", BIG, "1000")
    await until_state(running, "big-0", "queued")
    fits = await until_reason(running, "big-0", "node_fit")
    assert fits["explanation"]["largest_node"]["cpu"] == 16_000

    # Admitted, then its queue cordoned (a cordoned queue admits no new pods).
    cordoned = await create(running, "cordon-0", CORDON, NODE_CPU)
    await until_state(running, "cordon-0", "queued")
    lockgate_cli(running, "queue", "cordon", CORDON)
    await until_reason(running, "cordon-0", "queue_cordoned")

    # The table output says it for a person, with the numbers.
    text = lockgate_cli(running, "explain", f"{running.alias}/{running.namespace}/fill-extra")
    assert "Waiting for:" in text and "fair_share" in text and "Adjusted fair share:" in text
    assert f"queue \"{FILL}\", position 1 of 1" in text

    # Every waiting pod is told on the pod, with the Kubernetes API: queued first, then why.
    for pod, reason in ((extra, "LockgateWaitingForFairShare"),
                        (late, "LockgateWaitingForRoom"), (big, "LockgateFitsNoNode"),
                        (cordoned, "LockgateQueueCordoned")):
        queued = await until_event(running, pod, "LockgateQueued")
        assert f'queue "{pod.metadata.labels[QUEUE_LABEL]}", position' in queued.message
        later = await until_event(running, pod, reason, within=90)
        assert later.type == ("Warning" if reason in ("LockgateFitsNoNode",
                                                      "LockgateQueueCordoned") else "Normal")

    # ... at a bounded rate: per pod never closer than the interval (timestamps are whole
    # seconds), per cluster never more than the bucket lets through in any window.
    events = [e for e in await lockgate_events(running)
              if e.reason != "LockgateMaxQueuedTimeExceeded"]
    times_per_pod: dict[str, list[datetime]] = {}
    for event in events:
        times_per_pod.setdefault(event.involved_object.uid, []).append(event.first_timestamp)
    for uid, times in times_per_pod.items():
        times.sort()
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        assert all(gap >= POD_INTERVAL - 1 for gap in gaps), (uid, gaps)
    every = sorted(e.first_timestamp for e in events)
    for i, start in enumerate(every):
        for j in range(i, len(every)):
            window = (every[j] - start).total_seconds()
            allowed = CLUSTER_BURST + CLUSTER_RATE * (window + 1)
            assert j - i + 1 <= allowed, f"{j - i + 1} Events within {window:.0f}s"

    # `lockgate status` shows each queue's standing in every format.
    status = json.loads(lockgate_cli(running, "status", "-o", "json"))
    fill = next(q for q in status["queues"] if q["queue"] == FILL)
    assert (fill["running"], fill["queued"]) == (4, 1)
    assert fill["oldest_wait_seconds"] > 0
    assert yaml.safe_load(lockgate_cli(running, "status", "-o", "yaml"))["queues"]
    table = lockgate_cli(running, "status")
    assert table.splitlines()[0].split()[:6] == ["QUEUE", "WEIGHT", "FAIR", "ADJUSTED",
                                                 "ACTUAL", "TARGET"]


def a_job(name: str, queue: str) -> dict[str, Any]:
    pod = a_pod(name).in_queue(queue).tolerating_kwok_nodes().never_restarted() \
        .requesting(cpu="1000", memory="64Mi")  # fits no node: it waits until it expires
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": pod.template()}}


async def the_pod_of(running: Running, job: str) -> client.V1Pod:
    async def found() -> client.V1Pod | None:
        pods = await running.core.list_namespaced_pod(
            running.namespace, label_selector=f"job-name={job}")
        return pods.items[0] if pods.items else None

    return await eventually(found, within=30, every=0.2, what=f"the pod of Job {job}")


async def until_job_failed(running: Running, name: str) -> Any:
    async def failed() -> Any:
        job = await running.batch.read_namespaced_job(name, running.namespace)
        conditions = job.status.conditions or []
        return job if any(c.type == "Failed" and c.status == "True" for c in conditions) \
            else None

    return await eventually(failed, within=60, every=0.5, what=f"Job {name} failed")


async def test_a_pod_past_its_queues_max_time_queued_is_failed_with_the_reason(
    running: Running,
) -> None:
    await running.batch.create_namespaced_job(running.namespace, a_job("expires", FAILS))
    pod = await the_pod_of(running, "expires")

    async def failed() -> client.V1Pod | None:
        current = await running.core.read_namespaced_pod(pod.metadata.name, running.namespace)
        return current if current.status.phase == "Failed" else None

    current = await eventually(failed, within=60, every=0.5, what="the pod Failed")
    assert current.status.reason == "LockgateMaxQueuedTimeExceeded"
    assert f'longer than queue "{FAILS}" allows (3s)' in current.status.message
    event = await until_event(running, pod, "LockgateMaxQueuedTimeExceeded")
    assert event.type == "Warning" and "lockgate failed this pod" in event.message
    job = await until_job_failed(running, "expires")
    assert job.status.failed == 1
    await until_state(running, pod.metadata.name, "failed")


async def test_a_pod_past_its_queues_max_time_queued_is_deleted_with_the_reason(
    running: Running,
) -> None:
    await running.batch.create_namespaced_job(running.namespace, a_job("vanishes", DELETES))
    pod = await the_pod_of(running, "vanishes")

    async def gone() -> bool:
        try:
            current = await running.core.read_namespaced_pod(pod.metadata.name,
                                                             running.namespace)
        except ApiException as error:
            return error.status == 404
        return current.metadata.uid != pod.metadata.uid

    await eventually(gone, within=60, every=0.5, what="the pod deleted")
    event = await until_event(running, pod, "LockgateMaxQueuedTimeExceeded")
    assert "lockgate deleted this pod" in event.message
    assert f'queue "{DELETES}"' in event.message
    job = await until_job_failed(running, "vanishes")
    assert job.status.failed >= 1
    await until_state(running, pod.metadata.name, "deleted")


async def test_a_pod_past_its_job_sets_max_time_queued_is_failed_although_its_queue_allows_it(
    running: Running, tmp_path: Any,
) -> None:
    queue = json.loads(lockgate_cli(running, "queue", "get", PATIENT, "-o", "json"))
    assert queue["max_queued"] is None
    created = json.loads(lockgate_cli(
        running, "namespace", "create", "--queue", PATIENT, "--jobset", "impatient",
        "--cluster", running.alias, "--max-queued-time", "3s", "--kubeconfig-out",
        str(tmp_path / "coordinator.kubeconfig"), "-o", "json"))
    record = created["namespace"]
    assert record["max_queued"] == {"seconds": 3.0, "action": None}
    namespace = record["name"]
    try:
        found = await running.core.read_namespace(namespace)
        assert found.metadata.annotations[MAX_QUEUED_TIME_ANNOTATION] == "3s"
        pod = await running.core.create_namespaced_pod(
            namespace, a_pod("waits-too-long").tolerating_kwok_nodes().never_restarted()
            .requesting(cpu="1000", memory="64Mi").manifest())  # fits no node: it waits
        # Stamped from the namespace by the webhook (no lockgate label or annotation sent).
        assert pod.metadata.annotations[MAX_QUEUED_TIME_ANNOTATION] == "3s"
        assert pod.metadata.labels[QUEUE_LABEL] == PATIENT

        async def failed() -> client.V1Pod | None:
            current = await running.core.read_namespaced_pod(pod.metadata.name, namespace)
            return current if current.status.phase == "Failed" else None

        current = await eventually(failed, within=60, every=0.5, what="the pod Failed")
        assert current.status.reason == "LockgateMaxQueuedTimeExceeded"
        assert "longer than its job set allows (3s)" in current.status.message

        async def event() -> Any:
            listed = await running.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.uid={pod.metadata.uid}")
            return next((e for e in listed.items
                         if e.reason == "LockgateMaxQueuedTimeExceeded"), None)

        written = await eventually(event, within=60, every=0.5,
                                   what="an Event LockgateMaxQueuedTimeExceeded on the pod")
        assert written.type == "Warning" and "lockgate failed this pod" in written.message
        row = await running.db.fetchrow(
            "SELECT max_queued, state FROM jobs WHERE cluster = $1 AND uid = $2", running.alias,
            pod.metadata.uid)
        assert row is not None
        max_queued = row["max_queued"]
        assert (json.loads(max_queued) if isinstance(max_queued, str) else max_queued) == {
            "seconds": 3.0, "action": None}
    finally:
        await running.core.delete_namespace(namespace, propagation_policy="Background")
