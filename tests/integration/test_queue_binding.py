"""Queues bound to namespaces, end to end on the real stack: queue-store copies the queues into
both clusters as Queue objects, the webhook admits from those copies alone, and the watcher takes
only pods of managed namespaces for lockgate's jobs. A pod admitted from a stale copy for a queue
that no longer exists is told so on the pod (a Warning Event from the scheduler's notice).

lockgate runs as real processes (devstack's launcher: queue-store, admission webhook,
cluster-watcher, fair-scheduler, ungater) on a fresh database, isolated by a run id: its
consumer groups, its Queue
objects (labelled and prefixed with the run id), its webhook registration (namespaces labelled
lockgate.io/run=<run id> only), and cluster names of its own ("cluster-a-<run>"): watchers of
other runs publish to the same topics, and their events carry the clusters' usual names, so
this run's jobs are told apart by cluster. What is checked is documented in docs/admission.md.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.launcher import Lockgate
from devstack.ports import ServicePorts
from devstack.stack import StackInfo
from helpers.kube import gates_of
from helpers.pods import a_pod
from helpers.postgres import fresh_database
from helpers.waiting import eventually
from lockgate import queue_copies
from lockgate.labels import MANAGED_NAMESPACE_LABEL, SCHEDULING_GATE
from lockgate_adapters import job_store

pytestmark = [pytest.mark.stack, pytest.mark.timeout(240)]

RUN = uuid.uuid4().hex[:8]
CLUSTERS = ("cluster-a", "cluster-b")
Kube = dict[str, client.ApiClient]


@dataclass
class Run:
    lockgate: Lockgate
    db: asyncpg.Pool
    apis: Kube

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.lockgate.ports.admin_api}/api/v1"

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with aiohttp.ClientSession(headers=self.lockgate.admin_headers) as session, \
                session.request(method, f"{self.admin}{path}", json=body) as reply:
            return reply.status, (await reply.json() if reply.status != 204 else None)

    async def create_queue(self, name: str, *, names: list[str]) -> dict[str, Any]:
        status, queue = await self.call("POST", "/queues", {
            "name": name, "namespaces": [{"cluster": "*", "names": names}]})
        assert status == 201, queue
        await self.webhook_has(name, queue)
        return queue

    async def webhook_has(self, name: str, queue: dict[str, Any] | None) -> None:
        await self.lockgate.wait_for_queues({name: queue})

    async def jobs(self, queue: str, cluster: str) -> dict[str, Any]:
        """This run's jobs of `queue` in `cluster` (a real name), with the admin API's hints."""
        status, answer = await self.call(
            "GET", f"/jobs?queue={queue}&cluster={alias(cluster)}&limit=1000&all=true")
        assert status == 200, answer
        return answer  # type: ignore[no-any-return]

    async def job_state(self, queue: str, pod_name: str, cluster: str) -> str | None:
        for job in (await self.jobs(queue, cluster))["jobs"]:
            if job["name"] == pod_name:
                return str(job["state"])
        return None

    def queue_object(self, queue: str) -> str:
        return self.lockgate.queue_object_name(queue)

    async def queue_objects(self, cluster: str) -> dict[str, dict[str, Any]]:
        listing = await client.CustomObjectsApi(self.apis[cluster]).list_cluster_custom_object(
            queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL,
            label_selector=f"{queue_copies.SOURCE_LABEL}={self.lockgate.queue_source}")
        return {o["metadata"]["name"]: o for o in listing["items"]}


@pytest.fixture(scope="module")
async def run(stack: StackInfo, kube_clients: Kube,
              tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Run]:
    async with fresh_database(stack.postgres_dsn, prefix=f"qbind_{RUN}") as dsn:
        lockgate = Lockgate.for_stack(
            stack, clusters={alias(c): c for c in CLUSTERS}, postgres_dsn=dsn,
            run_id=f"qb-{RUN}",
            ports=ServicePorts.free(), log_dir=tmp_path_factory.mktemp("service-logs"),
            cert_dir=tmp_path_factory.mktemp("webhook-certs"),
            extra_env={"LOCKGATE_QUEUE_STORE_RETRY__MAX_SECONDS": "0.5",
                       "LOCKGATE_WATCHER_RETRY__MAX_SECONDS": "0.5"},
        )
        db: asyncpg.Pool | None = None
        try:
            # The scheduler and ungater run too: they release jobs of defined queues (so tests
            # here do not expect a job to stay queued, except for a queue that does not exist),
            # and tell a pod whose queue does not exist why it stays gated.
            await lockgate.start(only=["queue-store", "admission-webhook", "cluster-watcher",
                                       "fair-scheduler", "ungater"])
            db = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
            yield Run(lockgate, db, {c: kube_clients[c] for c in CLUSTERS})
        finally:
            await lockgate.stop()  # also deletes the run's Queue objects
            if db is not None:
                await db.close()


Factory = Callable[..., Awaitable[str]]


@pytest.fixture
def namespaces(run: Run, make_namespace: Factory) -> Factory:
    """`await namespaces(cluster, managed=True)`: a namespace of this run."""

    async def make(cluster: str, *, managed: bool = True) -> str:
        labels = dict(run.lockgate.run_namespace_labels)
        if managed:
            labels[MANAGED_NAMESPACE_LABEL] = "true"
        return await make_namespace(cluster, prefix="lg-qb", labels=labels)

    return make


def alias(cluster: str) -> str:
    """The name this run's lockgate knows a real cluster by."""
    return f"{cluster}-{RUN}"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def user_pod(name: str, queue: str) -> dict[str, Any]:
    return a_pod(name).in_queue(queue).requesting(cpu="100m").manifest()


def refusal(error: ApiException) -> str:
    import json
    message: str = json.loads(error.body)["message"]
    return message


# ------------------------------------------------------------------------------------ tests


async def test_queue_objects_follow_create_update_and_delete_in_both_clusters(
    run: Run,
) -> None:
    name = unique("qb")
    await run.create_queue(name, names=["team-a"])
    obj_name = run.queue_object(name)

    async def copies(want: Callable[[dict[str, Any] | None], bool]) -> bool:
        return all([want((await run.queue_objects(c)).get(obj_name)) for c in CLUSTERS])

    def synced(cordoned: bool, weight: float) -> Callable[[dict[str, Any] | None], bool]:
        def check(obj: dict[str, Any] | None) -> bool:
            if obj is None:
                return False
            spec, status = obj["spec"], obj.get("status") or {}
            return (spec["queueName"], spec["cordoned"], spec["weight"]) == (
                name, cordoned, weight) and spec["namespaces"] == [
                {"cluster": "*", "names": ["team-a"]}] and status.get(
                "observedGeneration") == obj["metadata"]["generation"] and bool(
                status.get("lastSyncTime")) and status.get("state") == (
                "Cordoned" if cordoned else "Open") and status.get(
                "namespaces") == "*: team-a"
        return check

    await eventually(lambda: copies(synced(False, 1.0)), within=30,
                     what=f"Queue {obj_name} in both clusters")

    status, _ = await run.call("PATCH", f"/queues/{name}",
                               {"cordoned": True, "priority_factor": 0.5})
    assert status == 200
    await eventually(lambda: copies(synced(True, 2.0)), within=30,
                     what=f"Queue {obj_name} cordoned, weight 2, in both clusters")

    status, _ = await run.call("DELETE", f"/queues/{name}")
    assert status == 204
    await eventually(lambda: copies(lambda obj: obj is None), within=30,
                     what=f"Queue {obj_name} deleted from both clusters")


@pytest.mark.parametrize("cluster", CLUSTERS)
async def test_a_queue_of_another_namespace_is_refused_naming_the_ones_allowed(
    run: Run, namespaces: Factory, cluster: str,
) -> None:
    namespace = await namespaces(cluster)
    ours, theirs = unique("ours"), unique("theirs")
    await run.create_queue(ours, names=[namespace])
    await run.create_queue(theirs, names=["someone-else"])
    core = client.CoreV1Api(run.apis[cluster])

    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(namespace, user_pod("jumper", theirs))

    assert refused.value.status == 403
    assert f'namespace {namespace} may not use queue "{theirs}". An operator binds it with ' \
        in refusal(refused.value)
    assert f"; or name a queue namespace {namespace} may use: {ours}" in refusal(refused.value)
    pod = await core.create_namespaced_pod(namespace, user_pod("fair", ours))
    assert gates_of(pod) == [SCHEDULING_GATE]


async def test_a_pod_created_as_soon_as_its_queue_is_created_or_bound_is_admitted(
    run: Run, namespaces: Factory,
) -> None:
    """What a user does: `lockgate queue create`, then at once a pod. The answer to the
    create comes once the clusters' Queue copies hold it, and the webhook checks a refusal
    against the apiserver before giving it, so the pod is never refused for a queue that
    exists (the copy's lag is the sync's notification, pass and watch: tens of ms at best).
    The same for a namespace newly bound to an existing queue. No wait for the webhook."""
    core = client.CoreV1Api(run.apis["cluster-b"])
    for attempt in range(3):
        namespace, later = await namespaces("cluster-b"), await namespaces("cluster-b")
        queue = unique(f"at-once{attempt}")
        status, created = await run.call("POST", "/queues", {
            "name": queue, "namespaces": [{"cluster": "*", "names": [namespace]}]})
        assert status == 201, created
        pod = await core.create_namespaced_pod(namespace, user_pod("first", queue))
        assert gates_of(pod) == [SCHEDULING_GATE]

        status, bound = await run.call("PATCH", f"/queues/{queue}", {
            "namespaces": [{"cluster": "*", "names": [namespace, later]}]})
        assert status == 200, bound
        pod = await core.create_namespaced_pod(later, user_pod("newly-bound", queue))
        assert gates_of(pod) == [SCHEDULING_GATE]


async def test_queue_labels_outside_managed_namespaces_are_never_jobs(
    run: Run, namespaces: Factory, kube_clients: Kube,
) -> None:
    """A labelled pod in an unmanaged namespace, in kube-system, or bound by nodeName is not a
    job: the watcher's snapshot (taken at its start, after these pods exist) lists none of
    them, and queue-store never stores them, while a managed pod is a job."""
    cluster = "cluster-a"
    core = client.CoreV1Api(kube_clients[cluster])
    managed, unmanaged = await namespaces(cluster), await namespaces(cluster, managed=False)
    victim = unique("victim")
    await run.create_queue(victim, names=[managed])
    node = (await core.list_node()).items[0].metadata.name
    system_pod = unique("lg-qb-sys")
    created = [
        await core.create_namespaced_pod(unmanaged, user_pod("free-rider", victim)),
        await core.create_namespaced_pod(
            unmanaged, a_pod("bound").in_queue(victim).on_node(node).manifest()),
        await core.create_namespaced_pod(
            "kube-system", a_pod(system_pod).in_queue(victim).on_node(node).manifest()),
    ]
    try:
        control = await core.create_namespaced_pod(managed, user_pod("real-job", victim))
        # A watcher (re)start lists every pod: its snapshot names the jobs it found.
        watcher = run.lockgate.processes["cluster-watcher"]
        await watcher.stop()
        await watcher.start()
        await watcher.wait_ready()

        async def snapshot_with_control() -> set[str] | None:
            rows = await run.db.fetch(
                "SELECT uid FROM cluster_snapshot_pods WHERE cluster = $1", alias(cluster))
            uids = {row["uid"] for row in rows}
            return uids if control.metadata.uid in uids else None

        listed = await eventually(snapshot_with_control, within=60,
                                  what="the restarted watcher's snapshot")
        await eventually(lambda: run.job_state(victim, "real-job", cluster), within=30,
                         what="the managed pod's job")
        stored = {row["uid"] for row in await run.db.fetch(
            "SELECT uid FROM jobs WHERE queue = $1 AND cluster = $2", victim, alias(cluster))}
        for pod in created:
            assert pod.metadata.uid not in listed, pod.metadata.name
            assert pod.metadata.uid not in stored, pod.metadata.name
        assert stored == {control.metadata.uid}
    finally:
        await core.delete_namespaced_pod(system_pod, "kube-system", grace_period_seconds=0)


async def test_a_stale_copy_admits_and_the_pod_stays_gated_with_the_reason_shown(
    run: Run, namespaces: Factory,
) -> None:
    """Queue deleted in Postgres while the sync is down: the copy still admits its pods; once
    the sync is back the copy goes, the pod stays gated and queued, and both jobs list and the
    pod itself (a Warning Event, as `kubectl describe pod` shows) say why. A new scheduler
    leader notices the pod again; the Event stays one."""
    namespace = await namespaces("cluster-b")
    core = client.CoreV1Api(run.apis["cluster-b"])
    doomed = unique("doomed")
    await run.create_queue(doomed, names=[namespace])
    queue_store = run.lockgate.processes["queue-store"]
    await queue_store.stop()
    try:
        async with run.db.acquire() as connection:
            await job_store.delete_queue(connection, doomed)
        assert run.queue_object(doomed) in await run.queue_objects("cluster-b")

        pod = await core.create_namespaced_pod(namespace, user_pod("late", doomed))
        assert gates_of(pod) == [SCHEDULING_GATE]  # admitted from the stale copy
    finally:
        await queue_store.start()
        await queue_store.wait_ready()

    await run.webhook_has(doomed, None)
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(namespace, user_pod("later", doomed))
    assert f'queue "{doomed}" does not exist' in refusal(refused.value)
    assert await eventually(lambda: run.job_state(doomed, "late", "cluster-b"), within=30,
                            what="the late pod's job") == "queued"
    assert f"queue {doomed!r} does not exist: its jobs wait until it is created" in (
        await run.jobs(doomed, "cluster-b"))["hints"]

    async def warnings() -> list[Any] | None:
        listing = await core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=late")
        found = [e for e in listing.items if e.reason == "LockgateQueueUnknown"
                 and e.involved_object.uid == pod.metadata.uid]
        return found or None

    (event,) = await eventually(warnings, within=60, what="the Warning Event on the late pod")
    assert (event.type, event.involved_object.kind) == ("Warning", "Pod")
    assert event.message == (
        f'lockgate queue "{doomed}" does not exist (it was deleted, or never created): this pod '
        "stays gated until the queue exists again or the pod is deleted; "
        f"see `lockgate jobs list --queue {doomed}`")
    assert gates_of(await core.read_namespaced_pod("late", namespace)) == [SCHEDULING_GATE]

    # A new leadership term notices the pod again; the Event's name makes that a no-op.
    already_there = await _ungater_notices(run, "already_there")
    scheduler = run.lockgate.processes["fair-scheduler"]
    await scheduler.stop()
    await scheduler.start()
    await scheduler.wait_ready()

    async def noticed_again() -> bool:
        return await _ungater_notices(run, "already_there") > already_there

    await eventually(noticed_again, within=60, what="the new leader's notice, found written")
    assert len(await warnings() or []) == 1
    assert gates_of(await core.read_namespaced_pod("late", namespace)) == [SCHEDULING_GATE]
    assert await run.job_state(doomed, "late", "cluster-b") == "queued"


async def _ungater_notices(run: Run, result: str) -> float:
    """The ungater's count of pod notices of this run's cluster-b that ended in `result`."""
    url = f"http://127.0.0.1:{run.lockgate.ports.ungater_health}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as reply:
        text = await reply.text()
    wanted = (f'lockgate_ungater_pod_notices_total{{cluster="{alias("cluster-b")}",'
              f'result="{result}"}}')
    for line in text.splitlines():
        if line.startswith(wanted):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_rebinding_a_queue_keeps_admitted_jobs_and_refuses_new_pods(
    run: Run, namespaces: Factory,
) -> None:
    first, second = await namespaces("cluster-a"), await namespaces("cluster-a")
    core = client.CoreV1Api(run.apis["cluster-a"])
    queue = unique("moving")
    await run.create_queue(queue, names=[first])
    await core.create_namespaced_pod(first, user_pod("admitted", queue))
    await eventually(lambda: run.job_state(queue, "admitted", "cluster-a"), within=30,
                     what="the admitted pod's job")

    status, moved = await run.call("PATCH", f"/queues/{queue}", {
        "namespaces": [{"cluster": "*", "names": [second]}]})
    assert status == 200
    await run.webhook_has(queue, moved)

    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod(first, user_pod("too-late", queue))
    assert f'namespace {first} may not use queue "{queue}"' in refusal(refused.value)
    assert gates_of(await core.create_namespaced_pod(second, user_pod("new-home", queue))) == [
        SCHEDULING_GATE]
    # The job admitted under the old binding keeps its queue (released or not by now).
    assert await run.job_state(queue, "admitted", "cluster-a") is not None
    await eventually(lambda: run.job_state(queue, "new-home", "cluster-a"), within=30,
                     what="the new pod's job")


async def test_a_namespace_losing_its_managed_label_keeps_its_jobs_until_they_end(
    run: Run, namespaces: Factory,
) -> None:
    namespace = await namespaces("cluster-b")
    core = client.CoreV1Api(run.apis["cluster-b"])
    queue = unique("relabel")
    await run.create_queue(queue, names=[namespace])
    await core.create_namespaced_pod(namespace, user_pod("before", queue))
    await eventually(lambda: run.job_state(queue, "before", "cluster-b"), within=30,
                     what="the job")

    await core.patch_namespace(namespace, {"metadata": {"labels": {
        MANAGED_NAMESPACE_LABEL: None}}})

    async def a_pod_not_sent_to_the_webhook() -> str | None:
        name = unique("after")
        if gates_of(await core.create_namespaced_pod(namespace, user_pod(name, queue))) == []:
            return name
        # The apiserver matched the webhook's namespace selector against its cached namespace,
        # which may lag the patch by a moment: that pod was still gated; try again.
        await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        return None

    after = await eventually(a_pod_not_sent_to_the_webhook, within=30, every=0.5,
                             what="a pod no longer sent to the webhook")

    # The old job is still followed: its deletion is recorded.
    await core.delete_namespaced_pod("before", namespace, grace_period_seconds=0)
    assert await eventually(
        lambda: _state_is(run, queue, "before", "deleted"), within=30,
        what="the old job's deletion") == "deleted"
    assert await run.job_state(queue, after, "cluster-b") is None


async def _state_is(run: Run, queue: str, pod: str, state: str) -> str | None:
    found = await run.job_state(queue, pod, "cluster-b")
    return found if found == state else None
