"""The one way lockgate retries: `Backoff` (how long to wait, when to give up, and a wait that
stopping cuts short) and `retry` (an operation attempted again after each retryable failure).

Why one primitive: ten hand-written loops each did the same few things slightly differently:
some waits were cut short by stopping and some delayed shutdown by up to the policy's ceiling;
some gave up after `max_attempts` and some ignored it; Retry-After was honoured in two. Every
retry now goes through `retry` (a call until it succeeds, or a session run again after it
fails: connect, then consume until stopping) or, where the waiting is not about a failure (a
resync sooner after a failed pass), through a `Backoff` of its own. kopf's
`sleep(delays, wakeup=event)` is the model. Why not tenacity: what lockgate needs beside the
delays is a session that resets its backoff once it got going, a wait that a stopping event cuts
short and a distinct end when stopping; each would be an adapter around tenacity's hooks, and
the whole is about as long as this module.

The behaviour every caller gets:
- delays grow exponentially from `initial_seconds` to `max_seconds`, each drawn between half
  its ceiling and the ceiling, so many retriers do not synchronise; a server's Retry-After is
  taken instead when it gives one;
- `reset()` once the thing works again (a session got going): the next outage starts from the
  first delay;
- giving up after the policy's `max_attempts` (0: never) or `give_up_after` seconds of failure:
  `retry` then raises the last failure;
- stopping: a wait ends at once when the stopping event is set, and `retry` then raises
  `Stopped` (its cause the last failure) rather than attempt again. Callers decide what that
  means (an unhandled batch is left uncommitted and redelivered, an unpublished decision stays
  in Postgres for the next leader): nothing is lost by stopping;
- each retried failure goes to `on_failure` (the readiness check of the dependency goes false)
  and is logged as a warning, rate-limited and counted against the dependency (`quieting`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from lockgate_adapters.quieting import quiet
from lockgate_adapters.settings import RetryPolicy

T = TypeVar("T")
log = logging.getLogger(__name__)


class Stopped(Exception):
    """Retrying ended because the service is stopping; its `__cause__` is the last failure."""


class Backoff:
    """Successive delays between attempts at one thing, and the waits themselves."""

    def __init__(self, policy: RetryPolicy, *, stopping: asyncio.Event | None = None,
                 give_up_after: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] | None = None,
                 rng: random.Random | None = None) -> None:
        self.policy = policy
        self._stopping = stopping
        self._give_up_after = give_up_after
        self._clock = clock
        self._sleep = sleep
        self._random = rng or random.Random()
        self._attempts = 0  # failures since the last reset, for max_attempts
        self._exponent = 0  # backoff steps taken (a server's Retry-After takes none)
        self._deadline = self._deadline_from_now()

    @property
    def stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def next_delay(self, retry_after: float | None = None) -> float | None:
        """How long to wait before the next attempt (`retry_after`, the server's, if given);
        None to give up: the policy's attempts are spent, or the wait would end past
        `give_up_after`."""
        policy = self.policy
        if policy.max_attempts and self._attempts >= policy.max_attempts:
            return None
        self._attempts += 1
        if retry_after is not None:
            delay = max(0.0, retry_after)
        else:
            ceiling = min(policy.max_seconds,
                          policy.initial_seconds * policy.multiplier**self._exponent)
            self._exponent += 1
            delay = self._random.uniform(ceiling / 2, ceiling)
        if self._deadline is not None and self._clock() + delay > self._deadline:
            return None
        return delay

    def reset(self) -> None:
        """It works again: the next failure starts from the first delay, with the full time."""
        self._attempts = self._exponent = 0
        self._deadline = self._deadline_from_now()

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less if stopping meanwhile: a backoff never delays shutdown."""
        if self._sleep is not None:
            await self._sleep(seconds)
        elif self._stopping is not None:
            await sleep_unless_stopped(self._stopping, seconds)
        else:
            await asyncio.sleep(seconds)  # a loop that is cancelled rather than stopped

    def _deadline_from_now(self) -> float | None:
        return None if self._give_up_after is None else self._clock() + self._give_up_after


def _no_hint(_: Exception) -> float | None:
    return None


def _nothing(_: Exception) -> None:
    return None


async def retry(
    operation: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    retryable: Callable[[Exception], bool],
    what: str,
    dependency: str | None = None,
    on_failure: Callable[[Exception], None] = _nothing,
    retry_after: Callable[[Exception], float | None] = _no_hint,
) -> T:
    """`operation()`'s result, attempting it again after each failure `retryable` accepts.

    Any other failure is raised at once. A retryable one goes to `on_failure`, then is logged
    (`what`: what was being done) and waited out with `backoff`; when the backoff gives up the
    failure is raised, and when the service is stopping (before or during the wait) `Stopped`
    is, from it. `Stopped` raised inside `operation` passes through untouched. `retry_after`
    reads a server's Retry-After from a failure. An operation that runs a session (connect, then
    work until stopping) calls `backoff.reset()` once it got going, and returns when stopping.
    """
    while True:
        try:
            return await operation()
        except Stopped:
            raise
        except Exception as error:
            if not retryable(error):
                raise
            on_failure(error)
            if backoff.stopping:
                raise Stopped(what) from error
            delay = backoff.next_delay(retry_after(error))
            if delay is None:
                raise
            log.warning("%s: %s: %s; retrying in %.2fs", what, type(error).__name__, error,
                        delay, extra=quiet(dependency))
            failure = error
        await backoff.sleep(delay)
        if backoff.stopping:
            raise Stopped(what) from failure


async def sleep_unless_stopped(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `stopping` is set meanwhile: the one wait of periodic loops
    (a probe, a pass, a certificate check) and of `Backoff`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), timeout=seconds)
