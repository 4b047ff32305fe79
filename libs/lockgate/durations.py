"""The one way lockgate reads a duration a person wrote: `20s`, `5m`, `2h`, `7d`, `1h30m`, or bare
seconds (`90`, `2.5`).

Why one: a user should not have to remember which flag takes seconds and which takes `20s`.
Every CLI flag (`lockgate_cli.params.Duration`), every `*_seconds` setting of a service
(`lockgate_adapters.settings`) and the max-queued-time annotations (`lockgate.max_queued`) read
durations here, so they accept the same spellings and refuse the rest with the same words.
"""

from __future__ import annotations

import re

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
HOW_TO_WRITE = "write e.g. 20s, 5m, 2h, 1d, 1h30m, or bare seconds"

_NUMBER = r"\d+(?:\.\d+)?"
_BARE = re.compile(_NUMBER)
_WITH_UNITS = re.compile(rf"(?:{_NUMBER}[smhd])+")
_PART = re.compile(rf"({_NUMBER})([smhd])")


class InvalidDurationError(ValueError):
    """What was written and how to write a duration instead."""


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """Seconds from `text`; InvalidDurationError unless it is a duration (positive, or zero if
    `allow_zero`)."""
    spelled = text.strip().lower()
    if _BARE.fullmatch(spelled):
        seconds = float(spelled)
    elif _WITH_UNITS.fullmatch(spelled):
        seconds = sum(float(number) * UNITS[unit] for number, unit in _PART.findall(spelled))
    else:
        raise InvalidDurationError(f"not a duration: {text!r} ({HOW_TO_WRITE})")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidDurationError(f"a duration must be positive, not {text!r}")
    return seconds


def whole_seconds(text: str) -> int:
    """Like parse_duration, rounded to whole seconds (at least one)."""
    seconds = round(parse_duration(text))
    if seconds < 1:
        raise InvalidDurationError(f"a duration must be at least 1s, not {text!r}")
    return seconds
