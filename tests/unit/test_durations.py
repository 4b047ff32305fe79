"""One duration grammar for flags, settings and annotations (lockgate.durations)."""

from __future__ import annotations

import pytest

from lockgate.durations import InvalidDurationError, parse_duration, whole_seconds


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("2.5", 2.5), ("20s", 20), ("5m", 300), ("2h", 7200), ("7d", 604800),
    ("1h30m", 5400), ("1.5m", 90), (" 20S ", 20)])
def test_durations_are_read(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "5x", "m5", "1h30", "2 hours", "-1h", "1w", "h",
                                  "-5", "1e3"])
def test_a_bad_duration_says_how_to_write_one(text: str) -> None:
    with pytest.raises(InvalidDurationError, match=r"^not a duration: .*\(write e\.g\. 20s, 5m, "
                       r"2h, 1d, 1h30m, or bare seconds\)$"):
        parse_duration(text)


def test_zero_only_where_it_is_allowed() -> None:
    assert parse_duration("0", allow_zero=True) == parse_duration("0s", allow_zero=True) == 0
    with pytest.raises(InvalidDurationError, match="must be positive"):
        parse_duration("0s")


def test_whole_seconds_round_and_are_at_least_one() -> None:
    assert whole_seconds("90") == whole_seconds("1.5m") == 90
    assert whole_seconds("2.4") == 2
    with pytest.raises(InvalidDurationError, match="at least 1s"):
        whole_seconds("0.4")
