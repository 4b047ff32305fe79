"""cluster-watcher against the real stack: two kube-apiservers with kwok nodes, and Kafka.

Pods are created as the admission webhook would have left them (lockgate's gate, queue and
jobset labels), in a namespace of this module's own. Each watcher started here watches the real
clusters under names unique to this module ("cluster-a-<suffix>"), so what it publishes cannot be
mistaken for another test's; assertions read the watcher's output from Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import REGISTRY

from cluster_watcher.app import compose
from cluster_watcher.settings import WatcherSettings
from cluster_watcher.watching import ResourceWatcher, WatchExpired, WatchOptions
from devstack.kube import compact_etcd
from helpers.kafka import TopicTail
from helpers.kube import kubeconfig_through, remove_first_gate, server_port, temporary_namespaces
from helpers.network import TcpRelay
from helpers.pods import KWOK_NODE_ANNOTATION, PodBuilder, a_pod
from helpers.services import FAST_RETRY, service_in_process, watcher_process
from helpers.waiting import until
from lockgate.events import (
    CLUSTER_CAPACITY,
    CLUSTER_SNAPSHOTS,
    POD_EVENTS,
    ClusterCapacity,
    ClusterSnapshot,
    PodEvent,
)
from lockgate.jobs import JobState
from lockgate.labels import JOBSET_LABEL, MANAGED_NAMESPACE_LABEL
from lockgate.resources import Resources
from lockgate_adapters.kube import api_client
from lockgate_adapters.service import ServiceContext

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

SUFFIX = uuid.uuid4().hex[:8]
NAMESPACE = f"lockgate-watcher-{SUFFIX}"
QUEUE = f"watcher-q-{SUFFIX}"
TOPICS = (POD_EVENTS, CLUSTER_SNAPSHOTS, CLUSTER_CAPACITY)


# Reading what the watcher published


def watch_failures(cluster: str, resource: str = "pods") -> float:
    """The in-process watcher's failed lists or watches of `resource` in `cluster` so far."""
    return REGISTRY.get_sample_value("lockgate_watcher_watch_failures_total",
                                     {"cluster": cluster, "resource": resource}) or 0.0


def pending_events() -> float:
    """Events the in-process watcher has seen and Kafka has not acknowledged."""
    return REGISTRY.get_sample_value("lockgate_watcher_pending_events") or 0.0


def pod_events(cluster: str, uid: str) -> Callable[[Any], bool]:
    return lambda e: isinstance(e, PodEvent) and e.cluster == cluster and e.uid == uid


def pod_event_in(cluster: str, uid: str, state: JobState) -> Callable[[Any], bool]:
    return lambda e: pod_events(cluster, uid)(e) and e.state is state


def capacity_of(cluster: str, check: Callable[[ClusterCapacity], bool] = lambda c: True
                ) -> Callable[[Any], bool]:
    return lambda e: isinstance(e, ClusterCapacity) and e.cluster == cluster and check(e)


# Running the watcher in this process


@contextlib.asynccontextmanager
async def running_watcher(clusters: Mapping[str, str], kafka_bootstrap: str,
                          *, wait_ready: bool = True) -> AsyncIterator[ServiceContext]:
    settings = WatcherSettings(
        clusters=dict(clusters), kafka_bootstrap=kafka_bootstrap, http_port=0,
        retry=FAST_RETRY, capacity_min_interval_seconds=0.2, watch_timeout_seconds=30,
        kafka_send_timeout_seconds=5,
    )
    checks = {f"{cluster}/{kind}" for cluster in clusters for kind in ("pods", "nodes")}

    def ready(ctx: ServiceContext) -> bool:
        # Readiness holds trivially until compose declared the watcher's checks.
        return checks <= set(ctx.readiness.report()) and ctx.readiness.ready

    async with service_in_process(settings, compose, name="cluster-watcher-under-test",
                                  ready=ready if wait_ready else None) as ctx:
        yield ctx


# Pods as the webhook leaves them


def a_managed_pod(name: str) -> PodBuilder:
    return a_pod(name).in_namespace(NAMESPACE).tolerating_kwok_nodes()


def gated_pod(name: str, *, jobset: str = "js", cpu: str = "250m",
              memory: str = "64Mi") -> dict[str, Any]:
    return (a_managed_pod(name).in_queue(QUEUE).in_jobset(jobset).gated()
            .requesting(cpu=cpu, memory=memory).manifest())


async def create_pod(core: client.CoreV1Api, manifest: dict[str, Any]) -> str:
    created = await core.create_namespaced_pod(NAMESPACE, manifest)
    return str(created.metadata.uid)


async def delete_pod(core: client.CoreV1Api, name: str) -> None:
    with contextlib.suppress(ApiException):
        await core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


# Fixtures


@pytest.fixture(scope="module")
async def cores(kube_clients: dict[str, client.ApiClient]
                ) -> AsyncIterator[dict[str, client.CoreV1Api]]:
    """A CoreV1Api per real cluster, with this module's namespace in each: managed, since only
    pods of managed namespaces are lockgate's jobs (no webhook selects it: every registration
    on the shared stack also asks for a run or instance label)."""
    if not kube_clients:
        pytest.fail("the stack has no clusters")
    async with temporary_namespaces(kube_clients) as namespaces:
        for cluster in kube_clients:
            await namespaces.create(cluster, NAMESPACE,
                                    labels={MANAGED_NAMESPACE_LABEL: "true"})
        yield {name: client.CoreV1Api(api) for name, api in kube_clients.items()}


def as_watcher(stack: Any, cluster: str) -> str:
    """The kubeconfig of the watcher's own ServiceAccount (k8s/base) for `cluster`."""
    return str(stack.kubeconfigs_of("cluster-watcher")[cluster])


def watched_as(stack: Any, tag: str) -> dict[str, str]:
    """The real clusters under names of this test's own: "cluster-a" → "cluster-a-<tag>"."""
    return {f"{name}-{tag}": as_watcher(stack, name) for name in stack.kubeconfigs}


@pytest.fixture
async def tail(stack: Any) -> AsyncIterator[TopicTail]:
    """Everything published on the watcher's topics from the moment the test started."""
    async with TopicTail(stack.kafka_bootstrap, TOPICS) as tail:
        yield tail


@pytest.fixture
async def watcher(stack: Any, cores: Any, tail: TopicTail) -> AsyncIterator[dict[str, str]]:
    """A watcher of both clusters (started after `tail`, which so sees all it publishes).

    Yields real cluster name → the name the watcher reports it under.
    """
    tag = f"{SUFFIX}-{uuid.uuid4().hex[:4]}"
    async with running_watcher(watched_as(stack, tag), stack.kafka_bootstrap):
        yield {name: f"{name}-{tag}" for name in stack.kubeconfigs}


# Lifecycle


async def test_gated_pods_are_reported_queued_then_released_running_and_deleted_in_each_cluster(
    cores: dict[str, client.CoreV1Api], watcher: dict[str, str], tail: TopicTail,
    ungaters: dict[str, client.CoreV1Api],
) -> None:
    for real_cluster, core in cores.items():
        cluster = watcher[real_cluster]
        name = f"lifecycle-{uuid.uuid4().hex[:6]}"
        uid = await create_pod(core, gated_pod(name, jobset="sweep-1", cpu="1500m",
                                               memory="256Mi"))

        queued: PodEvent = await tail.wait_for(
            pod_event_in(cluster, uid, JobState.QUEUED), what=f"QUEUED for {name}")
        assert (queued.namespace, queued.name, queued.queue, queued.jobset) == (
            NAMESPACE, name, QUEUE, "sweep-1")
        assert queued.requests == {"cpu": 1500, "memory": 256 * 2**20}
        assert queued.gated and queued.node_name is None and queued.snapshot_id is None

        await remove_first_gate(ungaters[real_cluster], NAMESPACE, name)
        await tail.wait_for(pod_event_in(cluster, uid, JobState.UNGATED),
                                   what=f"UNGATED for {name}")
        running: PodEvent = await tail.wait_for(
            pod_event_in(cluster, uid, JobState.RUNNING), what=f"RUNNING for {name}")
        assert running.node_name and not running.gated

        await delete_pod(core, name)
        await tail.wait_for(pod_event_in(cluster, uid, JobState.DELETED),
                                   what=f"DELETED for {name}")

        states = [e.state for e in tail.events(pod_events(cluster, uid))]
        assert states == sorted(states, key=lambda s: s.rank), states
        assert states[0] is JobState.QUEUED and states[-1] is JobState.DELETED
        assert len(states) == len(set(states)), f"unchanged states published twice: {states}"


async def test_a_pods_events_carry_a_trace_whose_id_is_the_pod_uid(
    cores: dict[str, client.CoreV1Api], watcher: dict[str, str], tail: TopicTail
) -> None:
    core = cores["cluster-a"]
    uid = await create_pod(core, gated_pod(f"traced-{uuid.uuid4().hex[:6]}"))
    published = await tail.wait_for_message(
        pod_event_in(watcher["cluster-a"], uid, JobState.QUEUED))
    traceparent = published.headers["traceparent"].decode()
    assert traceparent.split("-")[1] == uid.replace("-", "")


async def test_unmanaged_pods_publish_no_pod_event_but_count_in_their_nodes_usage(
    stack: Any, cores: dict[str, client.CoreV1Api], watcher: dict[str, str],
    tail: TopicTail, make_namespace: Any,
) -> None:
    core = cores["cluster-b"]
    cluster = watcher["cluster-b"]
    node = (await kwok_nodes(core))[0]
    # An extended resource of this test's own makes the usage exactly attributable to it.
    marker = f"lockgate-test.io/w{SUFFIX}"
    name = f"unmanaged-{uuid.uuid4().hex[:6]}"
    # A namespace lockgate does not manage: a pod there may be bound at creation.
    unmanaged = await make_namespace("cluster-b", prefix="unmanaged")
    created = await core.create_namespaced_pod(unmanaged, a_pod(name).tolerating_kwok_nodes()
                                               .requesting(cpu="1237m", **{marker: "3"})
                                               .limited_to(**{marker: "3"}).on_node(node)
                                               .manifest())
    uid = str(created.metadata.uid)

    def uses_marker(amount: int) -> Callable[[ClusterCapacity], bool]:
        def check(capacity: ClusterCapacity) -> bool:
            usage = {n.name: n.unmanaged_usage for n in capacity.nodes}.get(node, {})
            return usage.get(marker, 0) == amount and (amount == 0 or usage["cpu"] >= 1237)
        return check

    with_pod = await tail.wait_for(capacity_of(cluster, uses_marker(3)),
                                          what="capacity with the unmanaged pod's usage")
    await core.delete_namespaced_pod(name, unmanaged, grace_period_seconds=0)
    await tail.wait_for(capacity_of(cluster, uses_marker(0)),
                               after=tail.index_of(with_pod),
                               what="capacity without the deleted pod's usage")
    assert tail.events(lambda e: isinstance(e, PodEvent) and e.uid == uid) == []


async def kwok_nodes(core: client.CoreV1Api) -> list[str]:
    nodes = await core.list_node()
    names = sorted(n.metadata.name for n in nodes.items
                   if (n.metadata.annotations or {}).get(KWOK_NODE_ANNOTATION) == "fake")
    assert names, "the stack's cluster has no kwok nodes"
    return names


async def test_capacity_lists_each_clusters_kwok_nodes_with_their_allocatable(
    stack: Any, cores: dict[str, client.CoreV1Api], watcher: dict[str, str],
    tail: TopicTail,
) -> None:
    for real_cluster, core in cores.items():
        nodes = (await core.list_node()).items
        # The stack's own nodes carry its cluster label; a benchmark may add nodes of its own.
        kwok = {n.metadata.name: n for n in nodes
                if (n.metadata.annotations or {}).get(KWOK_NODE_ANNOTATION) == "fake"
                and (n.metadata.labels or {}).get("lockgate.io/cluster") == real_cluster}
        assert len(kwok) == 4, f"{real_cluster}: expected the stack's 4 kwok nodes, got {kwok}"
        capacity: ClusterCapacity = await tail.wait_for(
            capacity_of(watcher[real_cluster]), what=f"capacity of {real_cluster}")
        published = {n.name: n for n in capacity.nodes}
        assert set(kwok) <= set(published)
        for name, node in kwok.items():
            assert published[name].allocatable == Resources.from_kubernetes(
                node.status.allocatable).as_dict()
            assert published[name].allocatable["cpu"] > 0
            assert published[name].schedulable is not bool(node.spec.unschedulable)


# Restart: snapshots


async def test_a_restarted_watcher_publishes_a_snapshot_of_the_managed_pods(
    stack: Any, cores: dict[str, client.CoreV1Api], tail: TopicTail
) -> None:
    core = cores["cluster-a"]
    clusters = watched_as(stack, f"rs-{SUFFIX}")
    cluster = f"cluster-a-rs-{SUFFIX}"
    kept, vanished = (f"kept-{uuid.uuid4().hex[:6]}", f"vanished-{uuid.uuid4().hex[:6]}")
    async with running_watcher(clusters, stack.kafka_bootstrap):
        kept_uid = await create_pod(core, gated_pod(kept))
        vanished_uid = await create_pod(core, gated_pod(vanished))
        for uid in (kept_uid, vanished_uid):
            await tail.wait_for(pod_event_in(cluster, uid, JobState.QUEUED))
    await delete_pod(core, vanished)  # while no watcher looks

    async with running_watcher(clusters, stack.kafka_bootstrap):
        snapshot: ClusterSnapshot = await tail.wait_for(
            lambda e: isinstance(e, ClusterSnapshot) and e.cluster == cluster
            and kept_uid in e.pod_uids, what="a snapshot listing the kept pod")
        assert vanished_uid not in snapshot.pod_uids
        from_snapshot: PodEvent = await tail.wait_for(
            lambda e: pod_events(cluster, kept_uid)(e) and e.snapshot_id is not None)
        assert from_snapshot.snapshot_id == snapshot.snapshot_id
        assert from_snapshot.state is JobState.QUEUED
    assert not tail.events(lambda e: pod_events(cluster, vanished_uid)(e)
                             and e.snapshot_id is not None)
    await delete_pod(core, kept)


async def test_the_watcher_process_survives_sigkill_and_reports_what_it_missed(
    stack: Any, cores: dict[str, client.CoreV1Api], tail: TopicTail,
    ungaters: dict[str, client.CoreV1Api],
) -> None:
    cluster = f"cluster-b-proc-{SUFFIX}"
    process = watcher_process("cluster-watcher-test", kafka_bootstrap=stack.kafka_bootstrap,
                              clusters={cluster: as_watcher(stack, "cluster-b")})
    core = cores["cluster-b"]
    before, during = f"before-kill-{uuid.uuid4().hex[:6]}", f"while-dead-{uuid.uuid4().hex[:6]}"
    try:
        await process.start()
        await process.wait_ready()
        before_uid = await create_pod(core, gated_pod(before))
        await tail.wait_for(pod_event_in(cluster, before_uid, JobState.QUEUED))

        await process.kill()
        during_uid = await create_pod(core, gated_pod(during))
        await remove_first_gate(ungaters["cluster-b"], NAMESPACE, before)

        await process.start()
        await process.wait_ready()
        snapshot: ClusterSnapshot = await tail.wait_for(
            lambda e: isinstance(e, ClusterSnapshot) and e.cluster == cluster
            and during_uid in e.pod_uids, what="the snapshot after the restart")
        assert before_uid in snapshot.pod_uids
        missed: PodEvent = await tail.wait_for(
            lambda e: pod_events(cluster, during_uid)(e) and e.snapshot_id is not None)
        assert (missed.state, missed.snapshot_id) == (JobState.QUEUED, snapshot.snapshot_id)
        released: PodEvent = await tail.wait_for(
            lambda e: pod_events(cluster, before_uid)(e) and e.snapshot_id is not None)
        assert released.state is not JobState.QUEUED and not released.gated

        assert await process.stop() == 0, process.log_tail()
    finally:
        await process.kill()
        for name in (before, during):
            await delete_pod(core, name)


# Outages


async def test_an_apiserver_outage_makes_the_watcher_unready_then_it_relists_what_it_missed(
    stack: Any, cores: dict[str, client.CoreV1Api], tail: TopicTail, tmp_path: Path
) -> None:
    real = as_watcher(stack, "cluster-a")
    forwarder = TcpRelay("127.0.0.1", server_port(real))
    await forwarder.start()
    cluster = f"cluster-a-out-{SUFFIX}"
    kubeconfig = kubeconfig_through(real, forwarder.port, tmp_path / "kubeconfig")
    core = cores["cluster-a"]
    try:
        async with running_watcher({cluster: kubeconfig}, stack.kafka_bootstrap) as ctx:
            first: ClusterSnapshot = await tail.wait_for(
                lambda e: isinstance(e, ClusterSnapshot) and e.cluster == cluster)
            await forwarder.sever()
            await until(lambda: not ctx.readiness.ready, within=30,
                        what="the watcher to notice the outage")
            assert not ctx.readiness.report()[f"{cluster}/pods"]["ready"]
            failed_before = watch_failures(cluster)
            name = f"during-outage-{uuid.uuid4().hex[:6]}"
            uid = await create_pod(core, gated_pod(name))
            await until(lambda: watch_failures(cluster) >= failed_before + 2, within=30,
                        what="a few failed reconnects of the pods' watch")
            await forwarder.start()
            queued: PodEvent = await tail.wait_for(pod_event_in(cluster, uid, JobState.QUEUED),
                                                   what="the pod created during the outage")
            assert queued.snapshot_id is not None and queued.snapshot_id != first.snapshot_id
            await until(lambda: ctx.readiness.ready, within=30,
                        what=lambda: f"ready again: {ctx.readiness.report()}")
            await delete_pod(core, name)
    finally:
        await forwarder.sever()


async def test_while_kafka_is_unreachable_the_watcher_keeps_what_it_saw_and_sends_it_later(
    stack: Any, cores: dict[str, client.CoreV1Api], tail: TopicTail
) -> None:
    host, port = stack.kafka_bootstrap.rsplit(":", 1)
    # Nothing listens on the forwarder's port until it starts: Kafka is "down". Once it listens,
    # the client bootstraps through it and then talks to the broker it advertises.
    forwarder = TcpRelay(host, int(port))
    cluster = f"cluster-b-kd-{SUFFIX}"
    core = cores["cluster-b"]
    name = f"kafka-down-{uuid.uuid4().hex[:6]}"
    try:
        async with running_watcher({cluster: as_watcher(stack, "cluster-b")},
                                   f"127.0.0.1:{forwarder.port}", wait_ready=False) as ctx:
            await until(lambda: ctx.readiness.report().get(f"{cluster}/pods", {}).get("ready")
                        is True, within=30, what="pods watched")
            pending_before = pending_events()
            uid = await create_pod(core, gated_pod(name))
            await until(lambda: pending_events() > pending_before, within=30,
                        what="the watcher to hold the pod's event, unsent")
            report = ctx.readiness.report()
            assert not ctx.readiness.ready and not report["kafka"]["ready"], report
            assert not tail.events(pod_events(cluster, uid))

            await forwarder.start()
            # The snapshot of the list made before Kafka was reachable, then the watched change.
            await tail.wait_for(lambda e: isinstance(e, ClusterSnapshot) and e.cluster == cluster,
                                what="the snapshot listed while kafka was down")
            queued: PodEvent = await tail.wait_for(pod_event_in(cluster, uid, JobState.QUEUED),
                                                   what="the event seen while kafka was down")
            assert queued.snapshot_id is None
            await until(lambda: ctx.readiness.ready, within=30,
                        what=lambda: f"ready again: {ctx.readiness.report()}")
    finally:
        await forwarder.sever()
        await delete_pod(core, name)


# The inner loop's answer to an expired resourceVersion


async def test_watching_from_an_expired_resource_version_returns_to_relist(
    stack: Any, cores: dict[str, client.CoreV1Api], make_namespace: Any
) -> None:
    # PodTemplates bypass the apiserver's watch cache on the local stack (devstack.kube), so
    # compacting etcd makes any older resourceVersion answer 410 Gone, whatever the stack's age.
    namespace = await make_namespace("cluster-a", prefix="expired")
    core = cores["cluster-a"]
    for i in range(5):
        await core.create_namespaced_pod_template(namespace, {
            "apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"t{i}"},
            "template": {"spec": {"containers": [{"name": "c", "image": "registry.invalid/x"}]}},
        })
    api = await api_client(stack.kubeconfigs["cluster-a"])
    listed: list[int] = []
    seen: list[str] = []

    async def on_list(items: list[Any], _started_at: datetime) -> None:
        listed.append(len(items))

    async def on_event(kind: str, obj: Any) -> None:
        seen.append(kind)

    class StartingFromAnAncientVersion(ResourceWatcher):
        async def relist(self) -> str:
            await super().relist()
            return "1"  # compacted away below: the apiserver answers 410 Gone

    try:
        list_templates = functools.partial(client.CoreV1Api(api).list_namespaced_pod_template,
                                           namespace)
        await asyncio.to_thread(compact_etcd, "cluster-a")
        options = WatchOptions(timeout_seconds=20, page_size=2, retry=FAST_RETRY)
        readiness: list[bool] = []
        watcher = StartingFromAnAncientVersion(
            cluster="cluster-a", resource="podtemplates", list_call=list_templates,
            on_list=on_list, on_event=on_event, set_ready=lambda ok, _: readiness.append(ok),
            options=options)
        with pytest.raises(WatchExpired):
            await watcher.watch_from("1")
        # list_then_watch returns (to be relisted by run) rather than raising or hanging.
        await asyncio.wait_for(watcher.list_then_watch(), 15)
        # Paging: 5 objects in pages of 2 are still listed whole.
        assert listed == [5]
        assert readiness == [True]
    finally:
        await api.close()


# Bursts


async def test_a_burst_of_gated_pods_is_published_promptly_and_so_is_their_snapshot(
    stack: Any, cores: dict[str, client.CoreV1Api], watcher: dict[str, str], tail: TopicTail,
) -> None:
    count, concurrency = 1000, 32
    core = cores["cluster-a"]
    cluster = watcher["cluster-a"]
    jobset = f"burst-{uuid.uuid4().hex[:6]}"
    names = [f"{jobset}-{i}" for i in range(count)]
    gate = asyncio.Semaphore(concurrency)

    async def create(name: str) -> None:
        async with gate:
            await create_pod(core, gated_pod(name, jobset=jobset))

    def burst_events(cluster: str) -> list[PodEvent]:
        return tail.events(lambda e: isinstance(e, PodEvent) and e.cluster == cluster
                             and e.jobset == jobset and e.state is JobState.QUEUED)

    try:
        started = time.monotonic()
        await asyncio.gather(*(create(n) for n in names))
        created = time.monotonic()
        await until(lambda: len({e.name for e in burst_events(cluster)}) == count, within=60,
                    what=lambda: f"{count} QUEUED events, have {len(burst_events(cluster))}")
        lag = time.monotonic() - created
        print(f"\n{count} pods created in {created - started:.2f}s; "
              f"all published {lag:.2f}s after the last creation")
        assert lag < 5.0, f"publishing lagged {lag:.2f}s behind a burst of {count} pods"

        # A watcher starting now lists them all and publishes its snapshot promptly.
        relisted_as = f"cluster-a-relist-{SUFFIX}"
        started = time.monotonic()
        async with running_watcher({relisted_as: as_watcher(stack, "cluster-a")},
                                   stack.kafka_bootstrap):
            snapshot: ClusterSnapshot = await tail.wait_for(
                lambda e: isinstance(e, ClusterSnapshot) and e.cluster == relisted_as,
                what="the snapshot of the burst")
            took = time.monotonic() - started
        print(f"snapshot of {len(snapshot.pod_uids)} pods published {took:.2f}s after start")
        in_snapshot = burst_events(relisted_as)
        assert len(in_snapshot) == count
        assert {e.snapshot_id for e in in_snapshot} == {snapshot.snapshot_id}
        assert {e.uid for e in in_snapshot} <= set(snapshot.pod_uids)
        assert took < 10.0, f"a snapshot of {len(snapshot.pod_uids)} pods took {took:.2f}s"
    finally:
        with contextlib.suppress(ApiException):
            await core.delete_collection_namespaced_pod(
                NAMESPACE, label_selector=f"{JOBSET_LABEL}={jobset}", grace_period_seconds=0)
