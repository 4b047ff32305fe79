"""The fair scheduler's usage history settings (LOCKGATE_SCHEDULER_HISTORY_*): off by default,
durations as every *_seconds setting, and on without a half-life refused at start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fair_scheduler.settings import SchedulerSettings
from lockgate.decayed_usage import HistoryPolicy


def test_history_is_off_by_default() -> None:
    settings = SchedulerSettings()
    assert settings.history_policy() == HistoryPolicy(enabled=False, half_life_seconds=None)
    assert settings.history_recompute_seconds == 60.0
    assert settings.history_weight_tolerance == 0.05


def test_history_settings_take_durations(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_SCHEDULER_HISTORY_ENABLED", "true")
    monkeypatch.setenv("LOCKGATE_SCHEDULER_HISTORY_HALF_LIFE_SECONDS", "7d")
    monkeypatch.setenv("LOCKGATE_SCHEDULER_HISTORY_RECOMPUTE_SECONDS", "2m")
    monkeypatch.setenv("LOCKGATE_SCHEDULER_HISTORY_SAVE_SECONDS", "15s")
    settings = SchedulerSettings()
    assert settings.history_policy() == HistoryPolicy(enabled=True, half_life_seconds=7 * 86400)
    assert (settings.history_recompute_seconds, settings.history_save_seconds) == (120, 15)


def test_history_on_without_a_half_life_stops_the_scheduler_with_its_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_SCHEDULER_HISTORY_ENABLED", "true")
    with pytest.raises(ValidationError, match=r"no half-life.*HISTORY_HALF_LIFE_SECONDS"):
        SchedulerSettings()


@pytest.mark.parametrize(("name", "value", "words"), [
    ("HISTORY_HALF_LIFE_SECONDS", "0", "greater than 0"),
    ("HISTORY_HALF_LIFE_SECONDS", "soon", "not a duration"),
    ("HISTORY_RECOMPUTE_SECONDS", "0", "greater than 0"),
    ("HISTORY_WEIGHT_TOLERANCE", "1", "less than 1"),
])
def test_a_wrong_history_setting_is_refused(monkeypatch: pytest.MonkeyPatch, name: str,
                                             value: str, words: str) -> None:
    monkeypatch.setenv("LOCKGATE_SCHEDULER_HISTORY_ENABLED", "true")
    monkeypatch.setenv("LOCKGATE_SCHEDULER_HISTORY_HALF_LIFE_SECONDS", "1h")
    monkeypatch.setenv(f"LOCKGATE_SCHEDULER_{name}", value)
    with pytest.raises(ValidationError, match=words):
        SchedulerSettings()
