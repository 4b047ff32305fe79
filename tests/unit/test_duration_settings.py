"""Every *_seconds setting takes a duration as the CLI's flags do (issue 38: one grammar); bare
numbers keep working."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from admission_webhook.settings import WebhookSettings
from cluster_watcher.settings import WatcherSettings
from fair_scheduler.settings import SchedulerSettings
from lockgate_adapters.admin_tokens import Role, entry_for, new_token
from lockgate_adapters.settings import ServiceSettings, seconds_as_durations
from queue_store.settings import QueueStoreSettings
from ungater.settings import UngaterSettings


def test_durations_and_bare_seconds_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"ROOM_HOLD_SECONDS": "2m", "SAFETY_ROUND_SECONDS": "2.5",
                        "RETRY__MAX_SECONDS": "1m", "WAIT_NOTICE_EARLY_SECONDS": '["15s", 45]',
                        "POSTGRES_KEEPALIVES_IDLE_SECONDS": "1m",
                        "UNPLACEABLE_BACKOFF_INITIAL_SECONDS": "1h30m"}.items():
        monkeypatch.setenv(f"LOCKGATE_SCHEDULER_{name}", value)
    settings = SchedulerSettings()
    assert settings.room_hold_seconds == 120
    assert settings.safety_round_seconds == 2.5
    assert settings.retry.max_seconds == 60
    assert settings.wait_notice_early_seconds == [15, 45]
    assert settings.postgres_keepalives_idle_seconds == 60
    assert isinstance(settings.postgres_keepalives_idle_seconds, int)
    assert settings.unplaceable_backoff_initial_seconds == 5400


def test_nested_groups_take_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_QUEUE_STORE_PLACE_GRACE_SECONDS", "10m")
    monkeypatch.setenv("LOCKGATE_QUEUE_STORE_COLLECTION__INTERVAL_SECONDS", "30s")
    settings = QueueStoreSettings(admin_tokens=[entry_for("ops", Role.ADMIN, new_token()).line()])
    assert settings.place_grace_seconds == 600
    assert settings.collection.interval_seconds == 30


def test_a_bad_duration_names_the_variable_and_says_how_to_write_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_SCHEDULER_RETRY__MAX_SECONDS", "20x")
    with pytest.raises(ValidationError, match=r"LOCKGATE_SCHEDULER_RETRY__MAX_SECONDS: not a "
                       r"duration: '20x' \(write e\.g\. 20s, 5m, 2h, 1d, 1h30m, or bare "
                       r"seconds\)"):
        SchedulerSettings()


def test_bounds_still_hold_for_durations_and_bare_numbers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_WEBHOOK_ANSWER_WITHIN_SECONDS", "1m")  # above the timeout
    with pytest.raises(ValidationError, match="answer_within_seconds must be below"):
        WebhookSettings()
    monkeypatch.setenv("LOCKGATE_WEBHOOK_ANSWER_WITHIN_SECONDS", "-1")
    with pytest.raises(ValidationError, match="greater than 0"):
        WebhookSettings()


def _seconds_fields(model: type[BaseModel]) -> dict[str, Any]:
    """Every *_seconds field of `model` (nested groups as dicts) spelled "1m"."""
    spelled: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            spelled[name] = _seconds_fields(info.annotation)
        elif name.endswith("_seconds"):
            spelled[name] = "1m"
    return spelled


def _values(data: dict[str, Any]) -> list[Any]:
    return [v for value in data.values()
            for v in (_values(value) if isinstance(value, dict) else [value])]


@pytest.mark.parametrize("settings_class", [
    WebhookSettings, WatcherSettings, SchedulerSettings, QueueStoreSettings, UngaterSettings])
def test_every_seconds_setting_of_every_service_reads_a_duration(
        settings_class: type[ServiceSettings]) -> None:
    spelled = _seconds_fields(settings_class)
    read = seconds_as_durations(settings_class, spelled, where="LOCKGATE_")
    assert len(_values(spelled)) >= 3
    assert set(map(str, _values(read))) == {"60.0"}, read
