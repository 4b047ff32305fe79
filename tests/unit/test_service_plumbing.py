"""Settings and the service runner: the behaviour every service inherits (retrying:
test_retrying.py)."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from helpers.waiting import until
from lockgate_adapters.service import Loop, ServiceContext, run_service
from lockgate_adapters.settings import ServiceSettings


class ExampleSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LOCKGATE_EXAMPLE_")
    service_name: ClassVar[str] = "example"
    clusters: dict[str, str] = {}


def test_settings_read_shared_and_prefixed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("LOCKGATE_EXAMPLE_HTTP_PORT", "8081")
    monkeypatch.setenv("LOCKGATE_EXAMPLE_CLUSTERS", '{"cluster-a": "/kube/a"}')
    monkeypatch.setenv("LOCKGATE_EXAMPLE_RETRY__MAX_SECONDS", "3")
    settings = ExampleSettings()
    assert settings.kafka_bootstrap == "127.0.0.1:1"
    assert settings.http_port == 8081
    assert settings.clusters == {"cluster-a": "/kube/a"}
    assert settings.retry.max_seconds == 3


def test_unknown_settings_are_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_EXAMPLE_CLUSTER", "typo")
    with pytest.raises(ValidationError, match="LOCKGATE_EXAMPLE_CLUSTER"):
        ExampleSettings()


async def test_service_stops_gracefully_and_cancels_what_hangs() -> None:
    settings = ExampleSettings(shutdown_grace_seconds=0.2)
    ctx = ServiceContext(settings)
    started: list[str] = []
    finished: list[str] = []

    async def polite(stopping: asyncio.Event) -> None:
        started.append("polite")
        await stopping.wait()
        finished.append("polite")

    async def stubborn(stopping: asyncio.Event) -> None:
        started.append("stubborn")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            finished.append("stubborn cancelled")
            raise

    async def compose(_: ServiceContext) -> list[Loop]:
        return [polite, stubborn]

    runner = asyncio.create_task(
        run_service(settings, compose, install_signal_handlers=False, context=ctx)
    )
    await until(lambda: len(started) == 2, within=5, what="both loops to run")
    ctx.stopping.set()
    await asyncio.wait_for(runner, timeout=5)
    assert sorted(finished) == ["polite", "stubborn cancelled"]
