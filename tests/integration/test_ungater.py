"""The ungater against the real stack: two kube-apiservers with kwok nodes, and Kafka.

Pods are created directly with lockgate's gate and labels, in namespaces of their own (not
managed, so no webhook or watcher touches them). The ungater runs in this process and serves the
real clusters under names unique to this module ("ug-<suffix>-a"), so commands other tests
publish for "cluster-a" are skipped by it, and its outcomes cannot be mistaken for theirs. Its
consumer group starts at the end of the commands topic. Commands go through Kafka; outcomes are
read back from Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lockgate.events import (
    RELEASE_COMMANDS,
    RELEASE_OUTCOMES,
    ReleaseCommand,
    ReleaseOutcome,
    ReleaseOutcomeKind,
)
from lockgate.labels import JOBSET_LABEL, QUEUE_LABEL, SCHEDULING_GATE
from lockgate_adapters.kafka import commit_group_at_end, ensure_topics, make_producer, publish
from lockgate_adapters.service import ServiceContext, run_service
from lockgate_adapters.settings import RetryPolicy
from ungater.app import compose
from ungater.settings import UngaterSettings

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

SUFFIX = uuid.uuid4().hex[:8]
OTHER_GATE = "example.com/other"
FAST_RETRY = RetryPolicy(initial_seconds=0.05, max_seconds=0.5)
GIVE_UP_AFTER = 3.0
# The module's names for the real clusters, and one whose apiserver never answers.
ALIAS = {"cluster-a": f"ug-{SUFFIX}-a", "cluster-b": f"ug-{SUFFIX}-b"}
DEAD_CLUSTER = f"ug-{SUFFIX}-dead"


# ---------------------------------------------------------------- reading outcomes from Kafka


@dataclass
class OutcomeTail:
    """Every release outcome published from the moment the tail started, by decision id."""

    bootstrap: str
    outcomes: dict[str, list[tuple[ReleaseOutcome, dict[str, bytes]]]] = field(
        default_factory=dict)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _consumer: AIOKafkaConsumer | None = None
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._consumer = await consumer_at_end(self.bootstrap, RELEASE_OUTCOMES.name,
                                               group_id=f"test-outcomes-{uuid.uuid4().hex}")
        self._task = asyncio.create_task(self._collect(), name="outcome-tail")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()

    async def _collect(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    outcome = RELEASE_OUTCOMES.decode(record.value or b"")
                    self.outcomes.setdefault(outcome.decision_id, []).append(
                        (outcome, dict(record.headers or ())))
            if batches:
                self._arrived.set()

    async def outcome_of(self, decision_id: str, *, within: float = 30.0
                         ) -> tuple[ReleaseOutcome, dict[str, bytes]]:
        deadline = time.monotonic() + within
        while decision_id not in self.outcomes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no outcome for decision {decision_id} within {within}s")
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), min(remaining, 1.0))
        return self.outcomes[decision_id][0]


async def consumer_at_end(bootstrap: str, topic: str, *, group_id: str) -> AIOKafkaConsumer:
    """A started consumer of `topic` in `group_id`, positioned at the topic's current end."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group_id,
                                enable_auto_commit=False, auto_offset_reset="latest")
    await consumer.start()
    try:
        deadline = time.monotonic() + 30
        while not consumer.assignment():
            assert time.monotonic() < deadline, "no partitions assigned within 30s"
            await asyncio.sleep(0.05)
        partitions = sorted(consumer.assignment())
        await consumer.seek_to_end(*partitions)
        for partition in partitions:  # resolve the end offsets before anything is produced
            await consumer.position(partition)
    except BaseException:
        await consumer.stop()
        raise
    return consumer


# ---------------------------------------------------------------- fixtures


def unreachable_kubeconfig(template: str, directory: Path) -> str:
    """A copy of a real kubeconfig whose server is a loopback port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = yaml.safe_load(Path(template).read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path = directory / "unreachable.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@dataclass
class RunningUngater:
    ctx: ServiceContext
    producer: AIOKafkaProducer
    tail: OutcomeTail

    async def command(self, *, cluster: str, namespace: str, name: str, uid: str,
                      decision_id: str | None = None) -> ReleaseCommand:
        """Publish one release command for `cluster` (a real cluster's module alias)."""
        command = ReleaseCommand(
            decision_id=decision_id or f"d-{uuid.uuid4().hex}", cluster=cluster,
            namespace=namespace, name=name, uid=uid, queue="q", decided_at=datetime.now(UTC))
        await publish(self.producer, RELEASE_COMMANDS, command)
        return command


@pytest.fixture(scope="module")
def span_exporter() -> InMemorySpanExporter:
    """Finished spans of this process, whoever installed the tracer provider."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), "another tracer provider is installed"
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture(scope="module")
def served_clusters(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The module's aliases of the real clusters, plus one whose apiserver never answers."""
    clusters = {alias: stack.kubeconfigs[real] for real, alias in ALIAS.items()}
    clusters[DEAD_CLUSTER] = unreachable_kubeconfig(stack.kubeconfigs["cluster-a"],
                                                    tmp_path_factory.mktemp("kube"))
    return clusters


@pytest.fixture
async def ungater(served_clusters: dict[str, str], kafka_bootstrap: str,
                  span_exporter: InMemorySpanExporter) -> AsyncIterator[RunningUngater]:
    """An ungater running in this process for one test (its own consumer group)."""
    settings = UngaterSettings(
        clusters=served_clusters, group_id=f"ungater-test-{uuid.uuid4().hex}",
        kafka_bootstrap=kafka_bootstrap, http_port=0, retry=FAST_RETRY,
        give_up_after_seconds=GIVE_UP_AFTER, request_timeout_seconds=5,
    )
    await ensure_topics(kafka_bootstrap)
    await commit_group_at_end(kafka_bootstrap, settings.consumer_group, [RELEASE_COMMANDS])
    tail = OutcomeTail(kafka_bootstrap)
    await tail.start()
    producer = make_producer(kafka_bootstrap, client_id=f"test-ungater-{SUFFIX}")
    await producer.start()
    ctx = ServiceContext(settings)
    task = asyncio.create_task(
        run_service(settings, compose, install_signal_handlers=False, context=ctx),
        name="ungater-under-test")
    try:
        await until(lambda: ctx.readiness.report().get("kafka", {}).get("ready") is True
                    or task.done(), within=60, what=lambda: f"ready: {ctx.readiness.report()}")
        if task.done():
            task.result()
        yield RunningUngater(ctx, producer, tail)
    finally:
        ctx.stopping.set()
        await asyncio.wait_for(task, 30)
        await producer.stop()
        await tail.stop()


async def until(condition: Callable[[], bool], *, within: float,
                what: Callable[[], str]) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what()}")
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------- pods


def gated_pod(name: str, gates: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: "q", JOBSET_LABEL: "js"}},
        "spec": {
            "schedulingGates": [{"name": gate} for gate in gates],
            "containers": [{"name": "main", "image": "registry.invalid/sleep",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
        },
    }


async def create_pod(api: client.ApiClient, namespace: str, gates: list[str]) -> tuple[str, str]:
    """(name, uid) of a new pod with `gates`."""
    name = f"p-{uuid.uuid4().hex[:8]}"
    created = await client.CoreV1Api(api).create_namespaced_pod(namespace, gated_pod(name, gates))
    return name, created.metadata.uid


async def gates_of(api: client.ApiClient, namespace: str, name: str) -> list[str]:
    pod = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    return [gate.name for gate in pod.spec.scheduling_gates or ()]


@pytest.fixture(scope="module")
async def namespaces(kube_clients: Mapping[str, client.ApiClient]
                     ) -> AsyncIterator[dict[str, str]]:
    """One namespace per real cluster, unmanaged, deleted after the module."""
    created: dict[str, str] = {}
    for cluster, api in kube_clients.items():
        core = client.CoreV1Api(api)
        name = f"ungater-{SUFFIX}"
        await core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                     "metadata": {"name": name}})
        created[cluster] = name
        deadline = time.monotonic() + 30
        while True:  # pods are rejected until the namespace's default ServiceAccount exists
            try:
                await core.read_namespaced_service_account("default", name)
                break
            except ApiException as error:
                if error.status != 404 or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)
    try:
        yield created
    finally:
        for cluster, name in created.items():
            with contextlib.suppress(ApiException):
                await client.CoreV1Api(kube_clients[cluster]).delete_namespace(name)


# ---------------------------------------------------------------- tests


async def test_only_lockgates_gate_is_removed_in_both_clusters(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str]) -> None:
    commands = {}
    for cluster, api in kube_clients.items():
        # Lockgate's gate second: the optimistic first patch (index 0) misses and must re-read.
        for gates in ([OTHER_GATE, SCHEDULING_GATE], [SCHEDULING_GATE, OTHER_GATE]):
            name, uid = await create_pod(api, namespaces[cluster], gates)
            command = await ungater.command(cluster=ALIAS[cluster], namespace=namespaces[cluster],
                                            name=name, uid=uid)
            commands[command.decision_id] = (cluster, name, command)
    for decision_id, (cluster, name, command) in commands.items():
        outcome, _ = await ungater.tail.outcome_of(decision_id)
        assert outcome.outcome is ReleaseOutcomeKind.UNGATED, outcome
        assert (outcome.cluster, outcome.uid) == (command.cluster, command.uid)
        assert await gates_of(kube_clients[cluster], namespaces[cluster], name) == [OTHER_GATE]


async def test_a_repeated_command_is_a_noop_reported_as_ungated(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str]) -> None:
    api, namespace = kube_clients["cluster-b"], namespaces["cluster-b"]
    name, uid = await create_pod(api, namespace, [SCHEDULING_GATE, OTHER_GATE])
    first = await ungater.command(cluster=ALIAS["cluster-b"], namespace=namespace, name=name,
                                  uid=uid)
    outcome, _ = await ungater.tail.outcome_of(first.decision_id)
    assert (outcome.outcome, outcome.reason) == (ReleaseOutcomeKind.UNGATED, "gate removed")
    pod = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    version_after_first = pod.metadata.resource_version

    again = await ungater.command(cluster=ALIAS["cluster-b"], namespace=namespace, name=name,
                                  uid=uid)
    outcome, _ = await ungater.tail.outcome_of(again.decision_id)
    assert (outcome.outcome, outcome.reason) == (ReleaseOutcomeKind.UNGATED,
                                                 "gate already absent")
    pod = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    assert [gate.name for gate in pod.spec.scheduling_gates] == [OTHER_GATE]
    assert pod.metadata.resource_version == version_after_first, "the repeat wrote to the pod"


async def test_missing_or_replaced_pod_is_reported_gone(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str]) -> None:
    api, namespace = kube_clients["cluster-a"], namespaces["cluster-a"]
    missing = await ungater.command(cluster=ALIAS["cluster-a"], namespace=namespace,
                                    name=f"never-{SUFFIX}", uid=str(uuid.uuid4()))
    # Same name, another uid: the pod the decision was about is gone; this one stays gated.
    name, _ = await create_pod(api, namespace, [SCHEDULING_GATE])
    replaced = await ungater.command(cluster=ALIAS["cluster-a"], namespace=namespace, name=name,
                                     uid=str(uuid.uuid4()))
    for command in (missing, replaced):
        outcome, _ = await ungater.tail.outcome_of(command.decision_id)
        assert outcome.outcome is ReleaseOutcomeKind.POD_GONE, outcome
    assert await gates_of(api, namespace, name) == [SCHEDULING_GATE]


async def test_an_ungated_pod_binds_and_runs(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str]) -> None:
    for cluster, api in kube_clients.items():
        namespace = namespaces[cluster]
        name, uid = await create_pod(api, namespace, [SCHEDULING_GATE])
        await asyncio.sleep(1)
        pod = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
        assert pod.spec.node_name is None, "a gated pod was bound"
        command = await ungater.command(cluster=ALIAS[cluster], namespace=namespace, name=name,
                                        uid=uid)
        outcome, _ = await ungater.tail.outcome_of(command.decision_id)
        assert outcome.outcome is ReleaseOutcomeKind.UNGATED
        deadline = time.monotonic() + 60
        while True:
            pod = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
            if pod.spec.node_name and pod.status.phase == "Running":
                break
            assert time.monotonic() < deadline, f"pod not running: {pod.status}"
            await asyncio.sleep(0.2)
        assert pod.spec.node_name.startswith(f"{cluster}-"), pod.spec.node_name


async def test_commands_for_clusters_not_served_are_left_alone(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str]) -> None:
    api, namespace = kube_clients["cluster-a"], namespaces["cluster-a"]
    name, uid = await create_pod(api, namespace, [SCHEDULING_GATE])
    foreign = await ungater.command(cluster=f"not-served-{SUFFIX}", namespace=namespace,
                                    name=name, uid=uid)
    served = await ungater.command(cluster=ALIAS["cluster-b"], namespace=namespaces["cluster-b"],
                                   name=f"never-{SUFFIX}", uid=str(uuid.uuid4()))
    # Commands are handled in order of their batch: once a later one is settled, the foreign
    # one has been seen and skipped.
    await ungater.tail.outcome_of(served.decision_id)
    await asyncio.sleep(0.5)
    assert foreign.decision_id not in ungater.tail.outcomes
    assert await gates_of(api, namespace, name) == [SCHEDULING_GATE]


async def test_an_unreachable_apiserver_ends_in_failed_and_not_ready(
        ungater: RunningUngater) -> None:
    started = time.monotonic()
    command = await ungater.command(cluster=DEAD_CLUSTER, namespace="ns", name="p",
                                    uid=str(uuid.uuid4()))
    outcome, _ = await ungater.tail.outcome_of(command.decision_id, within=GIVE_UP_AFTER + 30)
    assert outcome.outcome is ReleaseOutcomeKind.FAILED, outcome
    assert "gave up" in outcome.reason
    assert time.monotonic() - started >= GIVE_UP_AFTER * 0.5
    check = ungater.ctx.readiness.report()[f"apiserver:{DEAD_CLUSTER}"]
    assert check["ready"] is False, check
    assert ungater.ctx.readiness.ready is False


async def test_the_release_span_continues_the_commands_trace(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str], span_exporter: InMemorySpanExporter) -> None:
    api, namespace = kube_clients["cluster-a"], namespaces["cluster-a"]
    name, uid = await create_pod(api, namespace, [SCHEDULING_GATE])
    with trace.get_tracer("test").start_as_current_span("decide") as decide:
        command = await ungater.command(cluster=ALIAS["cluster-a"], namespace=namespace,
                                        name=name, uid=uid)
    outcome, headers = await ungater.tail.outcome_of(command.decision_id)
    assert outcome.outcome is ReleaseOutcomeKind.UNGATED
    decided = decide.get_span_context()
    spans = [s for s in span_exporter.get_finished_spans()
             if s.name == "ungate" and s.attributes
             and s.attributes.get("lockgate.decision_id") == command.decision_id]
    assert len(spans) == 1
    span = spans[0]
    assert span.context.trace_id == decided.trace_id
    assert span.parent is not None and span.parent.span_id == decided.span_id
    assert span.attributes is not None and span.attributes["lockgate.outcome"] == "ungated"
    # The outcome message continues the same trace, from the release span.
    traceparent = headers["traceparent"].decode()
    assert traceparent.split("-")[1] == format(decided.trace_id, "032x")
    assert traceparent.split("-")[2] == format(span.context.span_id, "016x")
