"""Retry with exponential backoff and jitter, for errors worth retrying."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from lockgate_adapters.quieting import quiet
from lockgate_adapters.settings import RetryPolicy

T = TypeVar("T")
log = logging.getLogger(__name__)


class BackoffIterator:
    """Yields successive delays; full jitter keeps many retriers from synchronising."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._attempt = 0

    def __iter__(self) -> BackoffIterator:
        return self

    def __next__(self) -> float:
        policy = self._policy
        if policy.max_attempts and self._attempt >= policy.max_attempts:
            raise StopIteration
        ceiling = min(policy.max_seconds, policy.initial_seconds * policy.multiplier**self._attempt)
        self._attempt += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._attempt = 0


async def retry(
    operation: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    retryable: Callable[[BaseException], bool],
    what: str,
    dependency: str | None = None,
) -> T:
    """Run `operation` until it succeeds, retrying errors that `retryable` accepts.

    The warning about each failed attempt is rate-limited (`quieting`), counted against
    `dependency` when the failure is about one.
    """
    delays = BackoffIterator(policy)
    while True:
        try:
            return await operation()
        except Exception as error:
            if not retryable(error):
                raise
            try:
                delay = next(delays)
            except StopIteration:
                raise error from None
            log.warning("%s failed (%s: %s); retrying in %.2fs", what,
                        type(error).__name__, error, delay, extra=quiet(dependency))
            await asyncio.sleep(delay)


async def sleep_unless_stopped(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `stopping` is set meanwhile: a backoff never delays shutdown."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), timeout=seconds)
