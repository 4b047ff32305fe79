"""Installations on one Kafka cluster: topic and group names per installation, and an
installation that stores only the events of its own clusters (lockgate.installation)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest
from aiokafka import AIOKafkaProducer, ConsumerRecord
from opentelemetry.context import Context
from prometheus_client import REGISTRY
from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from admission_webhook.settings import WebhookSettings
from cluster_watcher.settings import WatcherSettings
from fair_scheduler.settings import SchedulerSettings
from lockgate.events import (
    ALL_TOPICS,
    CLUSTER_CAPACITY,
    DEAD_LETTERS,
    POD_EVENTS,
    ClusterCapacity,
    NodeCapacity,
)
from lockgate.installation import ClusterScope, installation_name
from lockgate_adapters.kafka import BatchConsumer, Received, destination, make_producer, new_topics
from lockgate_adapters.settings import KafkaConfig, ServiceSettings
from queue_store.ingesting import BatchStore
from queue_store.settings import QueueStoreSettings
from ungater.settings import UngaterSettings

AT = datetime(2026, 12, 7, tzinfo=UTC)


class PrefixSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LOCKGATE_PREFIXTEST_")
    service_name: ClassVar[str] = "prefix-test"


def test_without_a_prefix_the_names_are_the_ones_lockgate_always_had() -> None:
    config = KafkaConfig("h:1")
    assert [config.topic_name(t) for t in (POD_EVENTS, DEAD_LETTERS)] == [
        "lockgate.pod-events.v1", "lockgate.dead-letter.v1"]
    assert config.group_id("queue-store") == "queue-store"


def test_a_prefix_names_every_topic_and_group_of_the_installation() -> None:
    config = KafkaConfig("h:1", topic_prefix="staging.")
    assert {config.topic_name(t) for t in ALL_TOPICS} == {
        "staging." + t.name for t in ALL_TOPICS}
    assert config.group_id("queue-store") == "staging.queue-store"
    assert [t.name for t in new_topics(config, [POD_EVENTS, DEAD_LETTERS], partitions=1)] == [
        "staging.lockgate.pod-events.v1", "staging.lockgate.dead-letter.v1"]


@pytest.mark.parametrize("prefix", ["staging/", "prod ", "é.", "x" * 121])
def test_a_prefix_kafka_could_not_name_a_topic_with_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="topic prefix"):
        installation_name(prefix, POD_EVENTS.name)


def test_a_name_longer_than_kafka_allows_is_refused() -> None:
    with pytest.raises(ValueError, match="249"):
        installation_name("p" * 100, "g" * 150)


@pytest.mark.parametrize("settings_class", [
    PrefixSettings, QueueStoreSettings, SchedulerSettings, WebhookSettings])
def test_every_service_reads_the_one_shared_prefix(
        monkeypatch: pytest.MonkeyPatch, settings_class: type[ServiceSettings]) -> None:
    monkeypatch.setenv("LOCKGATE_TOPIC_PREFIX", "prod-")
    monkeypatch.setenv("LOCKGATE_QUEUE_STORE_ADMIN_TOKENS", '["t admin sha256:' + "0" * 64 + '"]')
    assert settings_class().kafka().topic_prefix == "prod-"


@pytest.mark.parametrize("settings_class", [WatcherSettings, UngaterSettings])
def test_the_cluster_services_read_it_too(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
        settings_class: type[ServiceSettings]) -> None:
    kubeconfig = tmp_path / "a.yaml"
    kubeconfig.write_text("{}")
    monkeypatch.setenv("LOCKGATE_TOPIC_PREFIX", "prod-")
    assert settings_class(clusters={"cluster-a": str(kubeconfig)}).kafka().topic_prefix == "prod-"


def test_a_bad_prefix_stops_the_service_from_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_TOPIC_PREFIX", "staging/")
    with pytest.raises(ValidationError, match="LOCKGATE_TOPIC_PREFIX"):
        PrefixSettings()


async def test_a_producer_publishes_to_its_installations_topics() -> None:
    prefixed = make_producer(KafkaConfig("127.0.0.1:1", topic_prefix="prod."), client_id="p")
    plain = make_producer("127.0.0.1:1", client_id="p")
    try:
        assert destination(prefixed, POD_EVENTS) == "prod.lockgate.pod-events.v1"
        assert destination(plain, POD_EVENTS) == POD_EVENTS.name
    finally:
        await prefixed.stop()
        await plain.stop()


async def test_a_producer_that_does_not_know_its_installation_is_refused() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")
    try:
        with pytest.raises(TypeError, match="make_producer"):
            destination(producer, POD_EVENTS)
    finally:
        await producer.stop()


def test_a_consumer_joins_its_installations_group() -> None:
    consumer = BatchConsumer[Any](
        bootstrap=KafkaConfig("127.0.0.1:1", topic_prefix="prod."), topic=POD_EVENTS,
        group_id="queue-store", consumer_name="unit", handle=lambda *_: None)  # type: ignore
    assert consumer._group == "prod.queue-store"


def test_a_scope_of_no_clusters_serves_every_cluster() -> None:
    scope = ClusterScope.of([])
    assert scope.serves("cluster-a") and scope.serves("anything")
    assert scope.describe() == "every cluster"


def test_a_scope_serves_only_its_clusters() -> None:
    scope = ClusterScope.of(["cluster-b", "cluster-a"])
    assert scope.serves("cluster-a") and scope.serves("cluster-b")
    assert not scope.serves("cluster-c") and not scope.serves("")
    assert scope.describe() == "cluster-a, cluster-b"


def received_capacity(cluster: str, offset: int) -> Received[ClusterCapacity]:
    event = ClusterCapacity(cluster=cluster, observed_at=AT, nodes=[
        NodeCapacity(name="n1", allocatable={"cpu": 4000})])
    record = ConsumerRecord(topic=CLUSTER_CAPACITY.name, partition=0, offset=offset, timestamp=0,
                            timestamp_type=0, key=cluster.encode(), value=b"", checksum=None,
                            serialized_key_size=0, serialized_value_size=0, headers=())
    return Received(event=event, record=record, trace_context=Context())


def skipped_count() -> float:
    return REGISTRY.get_sample_value("lockgate_queue_store_events_total", {
        "topic": CLUSTER_CAPACITY.name, "outcome": "other_cluster"}) or 0.0


async def test_queue_store_skips_and_counts_events_of_clusters_not_its_own(
        caplog: pytest.LogCaptureFixture) -> None:
    """Another installation's capacity would count its nodes in this one's pool: skipped
    (never stored, so Postgres is not even asked), counted, and said once per cluster."""
    rejected: list[str] = []

    async def reject(item: Received[ClusterCapacity], reason: str) -> None:
        rejected.append(reason)

    store = BatchStore[ClusterCapacity](pool=None, topic_name=CLUSTER_CAPACITY.name,  # type: ignore[arg-type]
                                        scope=ClusterScope.of(["cluster-a"]))
    before = skipped_count()
    await store.handle([received_capacity("other-b", 1), received_capacity("other-b", 2)],
                       reject)
    assert skipped_count() == before + 2
    assert rejected == [], "not bad messages: another installation's"
    warnings = [r.getMessage() for r in caplog.records if "other-b" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "LOCKGATE_QUEUE_STORE_CLUSTERS: cluster-a" in warnings[0]
    assert "LOCKGATE_TOPIC_PREFIX" in warnings[0]
