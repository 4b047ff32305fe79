"""Keeping a dependency outage from flooding the logs: client chatter rate-limited by template.

Why: while Kafka is down, aiokafka logs every failed connection, metadata refresh and fetch, many
times a second per client (a user counted 10,484 ERROR lines from one service in 35 s), and our own
retry loops log each reconnect. The outage itself is reported by the dependency monitor
(`dependencies`): one line when it starts, a summary while it lasts, one line when it ends. So
repetitive connection-class messages are rate-limited here: per (logger, message template), the
first `burst` records of a window pass and the rest are counted; the first record of the next
window says how many similar ones were suppressed. Once the monitor has reported a dependency
down, the messages about it are only counted, and its summaries report the counts. Anything
that is not connection-class passes untouched, so a real error (a rejected configuration, an
authorisation failure, a bug) is never hidden.

Which records are limited: those our own retry loops mark with `extra=quiet("<dependency>")`,
and those of aiokafka and asyncpg at WARNING or above whose arguments or exception carry a
connection-class error (an `OSError`, a timeout, a Kafka error that aiokafka itself calls
retriable, Postgres refusing connections while it starts or stops), or whose template is one
of aiokafka's known connection messages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka.errors import KafkaError
from asyncpg.exceptions import (
    AdminShutdownError,
    CannotConnectNowError,
    ConnectionDoesNotExistError,
)

# Attribute names set on a record by `quiet()`.
QUIET_ATTRIBUTE = "lockgate_quiet"
DEPENDENCY_ATTRIBUTE = "lockgate_dependency"

KAFKA = "kafka"
POSTGRES = "postgres"
# Client libraries whose connection-class messages are limited, and what they are about.
_CLIENT_LOGGERS = {"aiokafka": KAFKA, "kafka": KAFKA, "asyncpg": POSTGRES}
# aiokafka's connection messages whose arguments do not carry the error itself.
_KAFKA_CONNECTION_TEMPLATES = (
    "Unable connect to",
    "Unable to update metadata",
    "Unable to request metadata",
    "Heartbeat session expired",
    "Heartbeat failed for group",
    "Marking the coordinator dead",
    "Error sending",
    "Failed fetch messages",
    "Failed fetch offsets",
    "Group Coordinator Request failed",
    "FindCoordinator Request failed",
    "Heartbeat send request failed",
    "Heartbeat failed",
    "OffsetCommit failed",
    "Failed to commit on finallization",
    "LeaveGroup request failed",
    "Cannot send",
    "Could not send",
    "Got error produce response",
)


_CONNECTION_ERRORS = (OSError, TimeoutError,
                      # Postgres refusing or dropping connections while it starts or stops.
                      CannotConnectNowError, ConnectionDoesNotExistError, AdminShutdownError)


def quiet(dependency: str | None = None) -> dict[str, object]:
    """`extra=` for a retry loop's log call: rate-limited, and counted against `dependency`."""
    return {QUIET_ATTRIBUTE: True, DEPENDENCY_ATTRIBUTE: dependency}


@dataclass
class _Window:
    started: float
    passed: int = 0
    suppressed: int = 0


@dataclass
class RateLimiter:
    """Per key: the first `burst` events of each `window_seconds` pass, the rest are counted.

    Pure (the clock is passed in), so the policy is unit-tested without logging or sleeping.
    """

    window_seconds: float = 30.0
    burst: int = 1
    _windows: dict[object, _Window] = field(default_factory=dict)
    _suppressed_by_dependency: dict[str, int] = field(default_factory=dict)
    _down: set[str] = field(default_factory=set)

    def dependency_down(self, dependency: str, down: bool) -> None:
        """While a dependency is known down (and reported so), its events are only counted."""
        if down:
            self._down.add(dependency)
        else:
            self._down.discard(dependency)

    def admit(self, key: object, *, now: float, dependency: str | None = None) -> int | None:
        """None to suppress this event; else how many events of `key` the last window hid."""
        if dependency is not None and dependency in self._down:
            self._count(dependency)
            return None
        window = self._windows.get(key)
        if window is None or now - window.started >= self.window_seconds:
            hidden = window.suppressed if window is not None else 0
            self._windows[key] = _Window(started=now, passed=1)
            return hidden
        if window.passed < self.burst:
            window.passed += 1
            return 0
        window.suppressed += 1
        if dependency is not None:
            self._count(dependency)
        return None

    def _count(self, dependency: str) -> None:
        self._suppressed_by_dependency[dependency] = (
            self._suppressed_by_dependency.get(dependency, 0) + 1)

    def take_suppressed(self, dependency: str) -> int:
        """How many events counted against `dependency` were suppressed since the last call."""
        return self._suppressed_by_dependency.pop(dependency, 0)


def is_connection_error(value: object) -> bool:
    """An error that means "cannot reach it (now)", as opposed to "it said no"."""
    if isinstance(value, KafkaError):
        return bool(getattr(value, "retriable", False))
    return isinstance(value, _CONNECTION_ERRORS)


def _args_of(record: logging.LogRecord) -> tuple[object, ...]:
    if isinstance(record.args, tuple):
        return record.args
    if isinstance(record.args, dict):
        return tuple(record.args.values())
    return ()


def classify(record: logging.LogRecord) -> tuple[bool, str | None]:
    """(rate-limit it?, the dependency it is about) for one log record."""
    if getattr(record, QUIET_ATTRIBUTE, False):
        return True, getattr(record, DEPENDENCY_ATTRIBUTE, None)
    if record.levelno < logging.WARNING:
        return False, None
    dependency = _CLIENT_LOGGERS.get(record.name.split(".", 1)[0])
    if dependency is None:
        return False, None
    if dependency == KAFKA and str(record.msg).startswith(_KAFKA_CONNECTION_TEMPLATES):
        return True, dependency
    if any(is_connection_error(arg) for arg in _args_of(record)):
        return True, dependency
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None and is_connection_error(exc):
        return True, dependency
    return False, None


class OutageLogFilter(logging.Filter):
    """A handler filter: connection-class records rate-limited by (logger, template)."""

    def __init__(self, limiter: RateLimiter | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.limiter = limiter or RateLimiter()
        self._clock = clock

    def filter(self, record: logging.LogRecord) -> bool:
        limited, dependency = classify(record)
        if not limited:
            return True
        hidden = self.limiter.admit((record.name, str(record.msg)), now=self._clock(),
                                    dependency=dependency)
        if hidden is None:
            return False
        if hidden:
            window = self.limiter.window_seconds
            record.msg = (f"{record.getMessage()} [{hidden} similar message(s) suppressed in "
                          f"the previous {window:.0f}s]")
            record.args = None
        return True

    def take_suppressed(self, dependency: str) -> int:
        return self.limiter.take_suppressed(dependency)

    def dependency_down(self, dependency: str, down: bool) -> None:
        self.limiter.dependency_down(dependency, down)


# The process' one filter: `telemetry.setup_logging` installs it on the root handler, and the
# dependency monitor reads its counts for its outage summaries.
OUTAGE_LOGS = OutageLogFilter()
