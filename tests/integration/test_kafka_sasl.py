"""lockgate's Kafka clients authenticate with SASL/SCRAM against a real broker.

The broker is a private one (tests/helpers/kafka_sasl.py) whose client listener requires SCRAM;
the clients are built exactly as the services build them: settings → `KafkaConfig` →
`client_kwargs`. Topics are created with the admin client, a consumer group is positioned,
an event is published and consumed; a wrong password is refused.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from pydantic_settings import SettingsConfigDict

from helpers.kafka_sasl import MECHANISMS, SaslBroker, sasl_broker
from lockgate.dead_lettering import dead_letter
from lockgate.events import DEAD_LETTERS
from lockgate_adapters.kafka import (
    client_kwargs,
    commit_group_at_end,
    ensure_topics,
    make_producer,
    publish,
)
from lockgate_adapters.settings import KafkaConfig, ServiceSettings

pytestmark = [pytest.mark.timeout(180)]


class SaslSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LOCKGATE_SASLTEST_")
    service_name: ClassVar[str] = "sasl-test"


@pytest.fixture(scope="module")
async def broker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SaslBroker]:
    async with sasl_broker(tmp_path_factory.mktemp("sasl-kafka")) as running:
        yield running


def configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, broker: SaslBroker, *,
               mechanism: str, password: str) -> KafkaConfig:
    """The Kafka configuration a service would build from these environment variables."""
    (tmp_path / "kafka-password").write_text(password + "\n")
    for name, value in {"BOOTSTRAP": broker.bootstrap, "SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                        "SASL_MECHANISM": mechanism, "SASL_USERNAME": broker.username,
                        "SASL_PASSWORD_FILE": str(tmp_path / "kafka-password"),
                        "REPLICATION_FACTOR": "1", "MIN_INSYNC_REPLICAS": "1"}.items():
        monkeypatch.setenv(f"LOCKGATE_KAFKA_{name}", value)
    return SaslSettings().kafka()


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_clients_authenticate_with_scram(
        broker: SaslBroker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        mechanism: str) -> None:
    config = configured(monkeypatch, tmp_path, broker, mechanism=mechanism,
                        password=broker.password)
    await ensure_topics(config, topics=[DEAD_LETTERS])
    group = f"sasl-{uuid.uuid4().hex[:8]}"
    await commit_group_at_end(config, group, [DEAD_LETTERS])

    reason = f"sasl {mechanism} {uuid.uuid4().hex}"
    producer = make_producer(config, client_id="sasl-test")
    await producer.start()
    try:
        await publish(producer, DEAD_LETTERS, dead_letter(
            source_topic="t", partition=0, offset=0, key=None, value=b"{}", reason=reason,
            consumer="sasl-test", group=group, instance="sasl-test", at=datetime.now(UTC)))
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(DEAD_LETTERS.name, **client_kwargs(config), group_id=group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        batches = await consumer.getmany(timeout_ms=10_000)
    finally:
        await consumer.stop()
    reasons = [DEAD_LETTERS.decode(record.value or b"").reason
               for records in batches.values() for record in records]
    assert reasons == [reason]  # the group started at the end: only what we published


async def test_a_wrong_password_is_refused(
        broker: SaslBroker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    config = configured(monkeypatch, tmp_path, broker, mechanism="SCRAM-SHA-256",
                        password="not-the-password")
    producer = make_producer(config, client_id="sasl-wrong")
    try:
        # aiokafka logs the broker's refusal and raises that it could not bootstrap.
        with pytest.raises(KafkaError, match="Unable to bootstrap"):
            await producer.start()
    finally:
        await producer.stop()
    assert "SaslAuthenticationFailed" in caplog.text
    assert "invalid credentials with SASL mechanism SCRAM-SHA-256" in caplog.text
