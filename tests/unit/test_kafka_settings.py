"""Kafka TLS, SASL and replication settings → the arguments of every aiokafka client and topic."""

from __future__ import annotations

import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from lockgate.events import POD_EVENTS, RELEASE_COMMANDS
from lockgate_adapters.kafka import client_kwargs, make_producer, new_topics
from lockgate_adapters.settings import KafkaConfig, ServiceSettings
from lockgate_adapters.tls import issue_certificate, new_ca, write_certificate_and_key


class KafkaSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LOCKGATE_KAFKATEST_")
    service_name: ClassVar[str] = "kafka-test"


@pytest.fixture(autouse=True)
def _no_inherited_kafka_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Production defaults here, whatever tests/conftest.py set for the local stack."""
    monkeypatch.delenv("LOCKGATE_KAFKA_REPLICATION_FACTOR", raising=False)
    monkeypatch.delenv("LOCKGATE_KAFKA_MIN_INSYNC_REPLICAS", raising=False)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    now = datetime.now(UTC)
    ca, ca_key = new_ca("kafka-test-ca", now=now, valid_for=timedelta(days=1))
    client, client_key = issue_certificate(ca, ca_key, common_name="queue-store", server=False,
                                           now=now, valid_for=timedelta(days=1))
    paths = {"ca": tmp_path / "ca.crt", "cert": tmp_path / "client.crt",
             "key": tmp_path / "client.key", "ca_key": tmp_path / "ca.key"}
    write_certificate_and_key(paths["ca"], ca, paths["ca_key"], ca_key)
    write_certificate_and_key(paths["cert"], client, paths["key"], client_key)
    return paths


def test_defaults_are_plaintext_with_production_replication() -> None:
    config = KafkaSettings().kafka()
    assert (config.replication_factor, config.min_insync_replicas) == (3, 2)
    assert client_kwargs(config) == {"bootstrap_servers": "127.0.0.1:59092",
                                     "security_protocol": "PLAINTEXT"}
    # A bare bootstrap is the local stack: one broker.
    assert client_kwargs("h:1") == {"bootstrap_servers": "h:1", "security_protocol": "PLAINTEXT"}
    topic = new_topics("h:1", [POD_EVENTS], partitions=4)[0]
    assert (topic.replication_factor, topic.topic_configs) == (1, {"min.insync.replicas": "1"})


def test_replication_settings_reach_the_topics_lockgate_creates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_KAFKA_REPLICATION_FACTOR", "5")
    monkeypatch.setenv("LOCKGATE_KAFKA_MIN_INSYNC_REPLICAS", "3")
    topics = new_topics(KafkaSettings().kafka(), [POD_EVENTS, RELEASE_COMMANDS], partitions=6)
    assert [(t.name, t.num_partitions, t.replication_factor, t.topic_configs) for t in topics] == [
        (POD_EVENTS.name, 6, 5, {"min.insync.replicas": "3"}),
        (RELEASE_COMMANDS.name, 6, 5, {"min.insync.replicas": "3"})]


async def test_sasl_ssl_with_scram_and_mutual_tls(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pki: dict[str, Path]) -> None:
    (tmp_path / "password").write_text("scram-secret\n")
    for name, value in {"BOOTSTRAP": "kafka-1:9093,kafka-2:9093",
                        "SECURITY_PROTOCOL": "SASL_SSL", "SSL_CAFILE": str(pki["ca"]),
                        "SSL_CERTFILE": str(pki["cert"]), "SSL_KEYFILE": str(pki["key"]),
                        "SASL_MECHANISM": "SCRAM-SHA-512", "SASL_USERNAME": "queue-store",
                        "SASL_PASSWORD_FILE": str(tmp_path / "password")}.items():
        monkeypatch.setenv(f"LOCKGATE_KAFKA_{name}", value)
    config = KafkaSettings().kafka()
    assert "scram-secret" not in repr(config)
    kwargs = client_kwargs(config)
    context = kwargs.pop("ssl_context")
    assert kwargs == {"bootstrap_servers": "kafka-1:9093,kafka-2:9093",
                      "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                      "sasl_plain_username": "queue-store", "sasl_plain_password": "scram-secret"}
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [
        ((("commonName", "kafka-test-ca"),),)]

    # Every kind of client gets them (aiokafka keeps them on its inner client).
    producer = make_producer(config, client_id="p")
    consumer = AIOKafkaConsumer(**client_kwargs(config))
    admin = AIOKafkaAdminClient(**client_kwargs(config))
    try:
        clients: list[Any] = [producer.client, consumer._client, admin._client]
        for client in clients:
            assert (client._security_protocol, client._sasl_mechanism,
                    client._sasl_plain_username) == ("SASL_SSL", "SCRAM-SHA-512", "queue-store")
            assert isinstance(client._ssl_context, ssl.SSLContext)
    finally:
        await producer.stop()
        await consumer.stop()
        await admin.close()


def test_tls_alone_and_sasl_plaintext() -> None:
    tls = client_kwargs(KafkaConfig(bootstrap="k:9093", security_protocol="SSL"))
    assert set(tls) == {"bootstrap_servers", "security_protocol", "ssl_context"}
    sasl = client_kwargs(KafkaConfig(bootstrap="k:9092", security_protocol="SASL_PLAINTEXT",
                                     sasl_mechanism="PLAIN", sasl_username="u",
                                     sasl_password="p"))
    assert sasl == {"bootstrap_servers": "k:9092", "security_protocol": "SASL_PLAINTEXT",
                    "sasl_mechanism": "PLAIN", "sasl_plain_username": "u",
                    "sasl_plain_password": "p"}


@pytest.mark.parametrize(("env", "message"), [
    ({"SECURITY_PROTOCOL": "SASL_SSL"}, "needs kafka_sasl_mechanism, kafka_sasl_username"),
    ({"SASL_USERNAME": "u", "SASL_PASSWORD": "p", "SASL_MECHANISM": "PLAIN"},
     "SASL settings are given but kafka_security_protocol is PLAINTEXT"),
    ({"SECURITY_PROTOCOL": "SASL_SSL", "SASL_MECHANISM": "GSSAPI"}, "SCRAM-SHA-512"),
    ({"SECURITY_PROTOCOL": "SSL", "SSL_CAFILE": "/nope/ca.crt"},
     "Kafka TLS files not found: kafka_ssl_cafile"),
    ({"SSL_CAFILE": "/etc/hostname"}, "use SSL or SASL_SSL"),
    ({"REPLICATION_FACTOR": "1"}, "kafka_min_insync_replicas (2) exceeds"),
    ({"SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SASL_MECHANISM": "PLAIN", "SASL_USERNAME": "u",
      "SASL_PASSWORD_FILE": "/nope"}, "cannot read the Kafka SASL password file"),
])
def test_incomplete_or_contradictory_kafka_settings_stop_the_start(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(f"LOCKGATE_KAFKA_{name}", value)
    with pytest.raises(ValidationError) as raised:
        KafkaSettings()
    assert message in str(raised.value)
