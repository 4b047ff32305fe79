"""The ungater against the real stack: two kube-apiservers with kwok nodes, and Kafka.

Pods are created directly with lockgate's gate and labels, in namespaces of their own (not
managed, so no webhook or watcher touches them). The ungater runs in this process and serves the
real clusters under names unique to this module ("ug-<suffix>-a"), so commands other tests
publish for "cluster-a" are skipped by it, and its outcomes cannot be mistaken for theirs. Its
consumer group starts at the end of the commands topic. Commands go through Kafka; outcomes are
read back from Kafka.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from kubernetes_asyncio import client
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devstack.ports import free_port
from helpers.kafka import (
    BAD_INPUTS,
    BadInput,
    TopicTail,
    max_message_bytes,
    produce_raw,
    wait_committed_past,
    wait_consumed,
)
from helpers.kube import gates_of, held_by_its_gates, kubeconfig_through, temporary_namespaces
from helpers.pods import a_pod
from helpers.services import FAST_RETRY, service_in_process
from helpers.waiting import eventually, until
from lockgate.events import (
    DEAD_LETTERS,
    JOBSET_COMMANDS,
    RELEASE_COMMANDS,
    RELEASE_OUTCOMES,
    DeadLetter,
    ReleaseCommand,
    ReleaseOutcome,
    ReleaseOutcomeKind,
)
from lockgate.labels import SCHEDULING_GATE
from lockgate.placement import Requirement
from lockgate_adapters.kafka import commit_group_at_end, ensure_topics, make_producer, publish
from lockgate_adapters.service import ServiceContext
from ungater.app import compose
from ungater.settings import UngaterSettings

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

SUFFIX = uuid.uuid4().hex[:8]
OTHER_GATE = "example.com/other"
GIVE_UP_AFTER = 3.0
# The module's names for the real clusters, and one whose apiserver never answers.
ALIAS = {"cluster-a": f"ug-{SUFFIX}-a", "cluster-b": f"ug-{SUFFIX}-b"}
DEAD_CLUSTER = f"ug-{SUFFIX}-dead"


# ---------------------------------------------------------------- reading outcomes from Kafka


class OutcomeTail(TopicTail):
    """Every release outcome published from the moment the tail started."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap, [RELEASE_OUTCOMES])

    async def outcome_of(self, decision_id: str, *, within: float = 30.0
                         ) -> tuple[ReleaseOutcome, dict[str, bytes]]:
        """The first outcome of the decision, with its message's headers."""
        message = await self.wait_for_message(lambda outcome: outcome.decision_id == decision_id,
                                              within=within,
                                              what=f"outcome for decision {decision_id}")
        return message.event, message.headers

    def decided(self, decision_id: str) -> bool:
        return bool(self.events(lambda outcome: outcome.decision_id == decision_id))


# ---------------------------------------------------------------- fixtures


@dataclass
class RunningUngater:
    ctx: ServiceContext
    producer: AIOKafkaProducer
    tail: OutcomeTail
    group: str  # its consumer group of release commands

    async def command(self, *, cluster: str, namespace: str, name: str, uid: str,
                      decision_id: str | None = None, growth: str = "",
                      node_requirements: tuple[Requirement, ...] = ()) -> ReleaseCommand:
        """Publish one release command for `cluster` (a real cluster's module alias)."""
        command = ReleaseCommand(
            decision_id=decision_id or f"d-{uuid.uuid4().hex}", cluster=cluster,
            namespace=namespace, name=name, uid=uid, queue="q", decided_at=datetime.now(UTC),
            growth=growth, node_requirements=node_requirements)
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
    """The module's aliases of the real clusters, plus one whose apiserver never answers; the
    ungater acts as its own ServiceAccount (k8s/base), as it does in a worker cluster."""
    own = stack.kubeconfigs_of("ungater")
    clusters = {alias: own[real] for real, alias in ALIAS.items()}
    # A loopback port nobody listens on.
    clusters[DEAD_CLUSTER] = kubeconfig_through(
        own["cluster-a"], free_port(),
        tmp_path_factory.mktemp("kube") / "unreachable.kubeconfig")
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
    # Other tests' job-set cancels are not this ungater's business (its dead cluster would
    # hold them, retrying).
    await commit_group_at_end(kafka_bootstrap, settings.jobsets_group, [JOBSET_COMMANDS])
    producer = make_producer(kafka_bootstrap, client_id=f"test-ungater-{SUFFIX}")
    await producer.start()
    try:
        async with OutcomeTail(kafka_bootstrap) as tail, service_in_process(
                settings, compose, name="ungater-under-test",
                ready=lambda ctx: ctx.readiness.report().get("kafka", {}).get("ready") is True
        ) as ctx:
            yield RunningUngater(ctx, producer, tail, settings.consumer_group)
    finally:
        await producer.stop()


# ---------------------------------------------------------------- pods


async def create_pod(api: client.ApiClient, namespace: str, gates: list[str], *,
                     affinity: dict[str, Any] | None = None) -> tuple[str, str]:
    """(name, uid) of a new pod with `gates`, in that order (and `affinity`, when given)."""
    name = f"p-{uuid.uuid4().hex[:8]}"
    manifest = (a_pod(name).in_queue("q").in_jobset("js").gated(*gates)
                .requesting(cpu="10m", memory="16Mi").manifest())
    if affinity is not None:
        manifest["spec"]["affinity"] = affinity
    created = await client.CoreV1Api(api).create_namespaced_pod(namespace, manifest)
    return name, created.metadata.uid


async def gates_now(api: client.ApiClient, namespace: str, name: str) -> list[str]:
    return gates_of(await client.CoreV1Api(api).read_namespaced_pod(name, namespace))


@pytest.fixture(scope="module")
async def namespaces(kube_clients: Mapping[str, client.ApiClient]
                     ) -> AsyncIterator[dict[str, str]]:
    """One namespace per real cluster, unmanaged, deleted after the module."""
    async with temporary_namespaces(kube_clients) as made:
        yield {cluster: await made.create(cluster, f"ungater-{SUFFIX}")
               for cluster in kube_clients}


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
        assert await gates_now(kube_clients[cluster], namespaces[cluster], name) == [OTHER_GATE]


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


async def pod_events(api: client.ApiClient, namespace: str, name: str) -> list[client.CoreV1Event]:
    listed = await client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}")
    return list(listed.items)


async def test_a_release_for_growth_is_said_on_the_pod_once_and_others_are_not(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str]) -> None:
    api, namespace = kube_clients["cluster-a"], namespaces["cluster-a"]
    words = ("released so that cluster-b grows (NodePool default: headroom cpu=48); waiting "
             "for a node (NodeClaim default-x7k2p)")
    grown, grown_uid = await create_pod(api, namespace, [SCHEDULING_GATE])
    plain, plain_uid = await create_pod(api, namespace, [SCHEDULING_GATE])
    for_growth = await ungater.command(cluster=ALIAS["cluster-a"], namespace=namespace,
                                       name=grown, uid=grown_uid, growth=words)
    ordinary = await ungater.command(cluster=ALIAS["cluster-a"], namespace=namespace,
                                     name=plain, uid=plain_uid)
    for command in (for_growth, ordinary):
        outcome, _ = await ungater.tail.outcome_of(command.decision_id)
        assert outcome.outcome is ReleaseOutcomeKind.UNGATED, outcome
    # Redelivered (the same decision): still one Event.
    await publish(ungater.producer, RELEASE_COMMANDS, for_growth)
    await ungater.tail.wait_for_message(
        lambda outcome: outcome.decision_id == for_growth.decision_id
        and outcome.reason == "gate already absent", within=30, what="the repeat's outcome")
    told = [event for event in await pod_events(api, namespace, grown)
            if event.reason == "LockgateReleasedForGrowth"]
    assert [(event.type, event.message, event.count) for event in told] == [
        ("Normal", words, 1)], told
    assert told[0].involved_object.uid == grown_uid
    assert not [event for event in await pod_events(api, namespace, plain)
                if event.reason == "LockgateReleasedForGrowth"]


AVOID = Requirement(key="karpenter.kwok.sh/instance-cpu", operator="NotIn", values=("4", "8"))
AVOID_JSON = {"key": "karpenter.kwok.sh/instance-cpu", "operator": "NotIn", "values": ["4", "8"]}
ZONE_JSON = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1", "z2"]}


async def required_terms(api: client.ApiClient, namespace: str, name: str
                         ) -> list[dict[str, Any]] | None:
    """The pod's required node affinity terms as the apiserver keeps them (None: none)."""
    pod = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    if pod.spec.affinity is None or pod.spec.affinity.node_affinity is None:
        return None
    required = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    if required is None:
        return None
    return [api.sanitize_for_serialization(term) for term in required.node_selector_terms]


async def test_a_release_narrows_the_pods_node_affinity_once_and_removes_the_gate(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str]) -> None:
    api, namespace = kube_clients["cluster-a"], namespaces["cluster-a"]
    bare, bare_uid = await create_pod(api, namespace, [SCHEDULING_GATE])
    two_terms = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [ZONE_JSON]},
                              {"matchFields": [{"key": "metadata.name", "operator": "In",
                                                "values": ["n1"]}]}]}}}
    narrowed, narrowed_uid = await create_pod(api, namespace, [OTHER_GATE, SCHEDULING_GATE],
                                              affinity=two_terms)
    commands = [
        await ungater.command(cluster=ALIAS["cluster-a"], namespace=namespace, name=name,
                              uid=uid, node_requirements=(AVOID,))
        for name, uid in ((bare, bare_uid), (narrowed, narrowed_uid))]
    for command in commands:
        outcome, _ = await ungater.tail.outcome_of(command.decision_id)
        assert (outcome.outcome, outcome.reason) == (
            ReleaseOutcomeKind.UNGATED, "gate removed, node affinity narrowed"), outcome
    assert await gates_now(api, namespace, bare) == []
    assert await required_terms(api, namespace, bare) == [{"matchExpressions": [AVOID_JSON]}]
    assert await gates_now(api, namespace, narrowed) == [OTHER_GATE]
    assert await required_terms(api, namespace, narrowed) == [
        {"matchExpressions": [ZONE_JSON, AVOID_JSON]},
        {"matchExpressions": [AVOID_JSON],
         "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]

    # Consumed again (redelivered): settled from the pod as it is, nothing added twice.
    version = (await client.CoreV1Api(api).read_namespaced_pod(
        narrowed, namespace)).metadata.resource_version
    await publish(ungater.producer, RELEASE_COMMANDS, commands[1])
    await ungater.tail.wait_for_message(
        lambda outcome: outcome.decision_id == commands[1].decision_id
        and outcome.reason == "gate already absent", within=30, what="the repeat's outcome")
    pod = await client.CoreV1Api(api).read_namespaced_pod(narrowed, namespace)
    assert pod.metadata.resource_version == version, "the repeat wrote to the pod"


async def test_a_pod_whose_affinity_cannot_be_narrowed_is_released_as_it_came(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str]) -> None:
    api, namespace = kube_clients["cluster-b"], namespaces["cluster-b"]
    name, uid = await create_pod(api, namespace, [SCHEDULING_GATE], affinity={
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [ZONE_JSON]}]}}})
    # NotIn without values: the apiserver's validation refuses it, whatever the pod.
    invalid = Requirement(key="karpenter.kwok.sh/instance-cpu", operator="NotIn")
    command = await ungater.command(cluster=ALIAS["cluster-b"], namespace=namespace, name=name,
                                    uid=uid, node_requirements=(invalid,))
    outcome, _ = await ungater.tail.outcome_of(command.decision_id)
    assert outcome.outcome is ReleaseOutcomeKind.UNGATED, outcome
    assert outcome.reason.startswith("gate removed; node affinity not narrowed: "), outcome
    assert await gates_now(api, namespace, name) == []
    assert await required_terms(api, namespace, name) == [{"matchExpressions": [ZONE_JSON]}]
    told = [event for event in await pod_events(api, namespace, name)
            if event.reason == "LockgateNodeAffinityNotNarrowed"]
    assert [event.type for event in told] == ["Warning"], told
    assert told[0].message.startswith(
        "released without the node affinity karpenter.kwok.sh/instance-cpu NotIn []: the "
        "apiserver refused it ("), told[0].message


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
    assert await gates_now(api, namespace, name) == [SCHEDULING_GATE]


async def test_an_ungated_pod_binds_and_runs(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str]) -> None:
    for cluster, api in kube_clients.items():
        namespace = namespaces[cluster]
        name, uid = await create_pod(api, namespace, [SCHEDULING_GATE])
        core = client.CoreV1Api(api)
        await eventually(partial(held_by_its_gates, core, namespace, name), within=60,
                         every=0.2, what=f"kube-scheduler to hold pod {name} for its gate")
        pod = await core.read_namespaced_pod(name, namespace)
        assert pod.spec.node_name is None, "a gated pod was bound"
        command = await ungater.command(cluster=ALIAS[cluster], namespace=namespace, name=name,
                                        uid=uid)
        outcome, _ = await ungater.tail.outcome_of(command.decision_id)
        assert outcome.outcome is ReleaseOutcomeKind.UNGATED
        pod = await eventually(partial(running_pod, api, namespace, name), within=60,
                               every=0.2, what=f"pod {name} bound and running")
        assert pod.spec.node_name.startswith(f"{cluster}-"), pod.spec.node_name


async def running_pod(api: client.ApiClient, namespace: str, name: str) -> client.V1Pod | None:
    pod = await client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    return pod if pod.spec.node_name and pod.status.phase == "Running" else None


async def test_commands_for_clusters_not_served_are_left_alone(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str]) -> None:
    api, namespace = kube_clients["cluster-a"], namespaces["cluster-a"]
    name, uid = await create_pod(api, namespace, [SCHEDULING_GATE])
    foreign = await ungater.command(cluster=f"not-served-{SUFFIX}", namespace=namespace,
                                    name=name, uid=uid)
    served = await ungater.command(cluster=ALIAS["cluster-b"], namespace=namespaces["cluster-b"],
                                   name=f"never-{SUFFIX}", uid=str(uuid.uuid4()))
    await ungater.tail.outcome_of(served.decision_id)
    # The ungater has consumed the foreign command (it publishes an outcome before it commits),
    # and the tail has read every outcome published until then: none is the foreign one's.
    await wait_consumed(ungater.tail.bootstrap, RELEASE_COMMANDS, groups=[ungater.group],
                        what="the foreign command")
    await ungater.tail.caught_up()
    assert not ungater.tail.decided(foreign.decision_id)
    assert await gates_now(api, namespace, name) == [SCHEDULING_GATE]


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

    def release_spans() -> list[Any]:
        return [s for s in span_exporter.get_finished_spans()
                if s.name == "ungate" and s.attributes
                and s.attributes.get("lockgate.decision_id") == command.decision_id]

    # The span ends once Kafka has acknowledged the outcome, which may be after it arrived here.
    await until(lambda: bool(release_spans()), within=5, what="the release span to end")
    spans = release_spans()
    assert len(spans) == 1
    span = spans[0]
    assert span.context.trace_id == decided.trace_id
    assert span.parent is not None and span.parent.span_id == decided.span_id
    assert span.attributes is not None and span.attributes["lockgate.outcome"] == "ungated"
    # The outcome message continues the same trace, from the release span.
    traceparent = headers["traceparent"].decode()
    assert traceparent.split("-")[1] == format(decided.trace_id, "032x")
    assert traceparent.split("-")[2] == format(span.context.span_id, "016x")


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[bad.name for bad in BAD_INPUTS])
async def test_a_command_too_large_or_not_text_is_dead_lettered_by_reference_and_passed(
        ungater: RunningUngater, kube_clients: Mapping[str, client.ApiClient],
        namespaces: dict[str, str], kafka_bootstrap: str, bad: BadInput) -> None:
    api, namespace = kube_clients["cluster-a"], namespaces["cluster-a"]
    name, uid = await create_pod(api, namespace, [SCHEDULING_GATE])
    value = bad.value(await max_message_bytes(kafka_bootstrap, RELEASE_COMMANDS.name),
                      uid.encode())
    command = ReleaseCommand(
        decision_id=f"d-{uuid.uuid4().hex}", cluster=ALIAS["cluster-a"], namespace=namespace,
        name=name, uid=uid, queue="q", decided_at=datetime.now(UTC))
    async with TopicTail(kafka_bootstrap, [DEAD_LETTERS]) as letters:
        # The pod's key: the bad message and the command share a partition, in that order.
        dead, after = await produce_raw(kafka_bootstrap, RELEASE_COMMANDS.name, [
            (uid.encode(), value),
            (RELEASE_COMMANDS.key_bytes(command), RELEASE_COMMANDS.encode(command))])
        assert after.partition == dead.partition
        outcome, _ = await ungater.tail.outcome_of(command.decision_id)
        letter: DeadLetter = await letters.wait_for(
            lambda d: (d.source_topic, d.partition, d.offset) == (
                RELEASE_COMMANDS.name, dead.partition, dead.offset),
            what=f"the letter of {bad.name}")
    assert outcome.outcome is ReleaseOutcomeKind.UNGATED, outcome
    assert await gates_now(api, namespace, name) == []
    assert (letter.consumer, letter.source_key) == ("ungater", uid)
    settings = ungater.ctx.settings
    assert isinstance(settings, UngaterSettings)
    assert (letter.group, letter.instance) == (settings.consumer_group, settings.instance_id)
    assert letter.reason.startswith("invalid ReleaseCommand")
    assert letter.value is not None
    assert (letter.value.size, letter.value.sha256) == (len(value),
                                                        hashlib.sha256(value).hexdigest())
    assert value.startswith(letter.value.kept())
    assert letter.value.complete == (len(value) < 1024)
    settings = ungater.ctx.settings
    assert isinstance(settings, UngaterSettings)
    await wait_committed_past(kafka_bootstrap, settings.consumer_group, [dead, after])
    check = ungater.ctx.readiness.report()["kafka"]
    assert check["ready"] is True, check
