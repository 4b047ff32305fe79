"""The one retry primitive (lockgate_adapters.retrying): delays, reset, giving up, Retry-After,
stopping, and what `retry` does with each kind of failure."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from lockgate_adapters.retrying import Backoff, Stopped, retry
from lockgate_adapters.settings import RetryPolicy

FAST = RetryPolicy(initial_seconds=0.001, max_seconds=0.002)


class FakeClock:
    """Time that passes only when the backoff sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Flaky:
    """Fails with `errors` in turn, then answers "up"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "up"


def is_os_error(error: BaseException) -> bool:
    return isinstance(error, OSError)


# Backoff -------------------------------------------------------------------------------------

def test_delays_grow_to_their_ceiling_each_between_half_and_all_of_it() -> None:
    backoff = Backoff(RetryPolicy(initial_seconds=1, max_seconds=4, multiplier=2),
                      rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(6)]
    ceilings = [1, 2, 4, 4, 4, 4]
    assert all(d is not None and c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))


def test_it_gives_up_after_max_attempts_and_never_when_that_is_zero() -> None:
    limited = Backoff(RetryPolicy(initial_seconds=1, max_seconds=4, max_attempts=3))
    assert [limited.next_delay() is not None for _ in range(4)] == [True, True, True, False]
    forever = Backoff(RetryPolicy(initial_seconds=1, max_seconds=4, max_attempts=0))
    assert all(forever.next_delay() is not None for _ in range(1000))


def test_reset_starts_again_from_the_first_delay_with_every_attempt() -> None:
    backoff = Backoff(RetryPolicy(initial_seconds=1, max_seconds=64, max_attempts=3))
    for _ in range(3):
        backoff.next_delay()
    assert backoff.next_delay() is None
    backoff.reset()
    first = backoff.next_delay()
    assert first is not None and 0.5 <= first <= 1


def test_it_gives_up_when_the_wait_would_end_past_its_time() -> None:
    clock = FakeClock()
    backoff = Backoff(RetryPolicy(initial_seconds=4, max_seconds=4), give_up_after=10,
                      clock=clock)
    clock.now = 5.0
    assert backoff.next_delay() is not None  # 2 to 4 s: ends by 9 at the latest
    clock.now = 8.5
    assert backoff.next_delay() is None  # would end at 10.5 at the earliest


def test_a_servers_retry_after_is_taken_and_does_not_grow_the_backoff() -> None:
    backoff = Backoff(RetryPolicy(initial_seconds=1, max_seconds=64, multiplier=2))
    assert backoff.next_delay(retry_after=30) == 30
    assert backoff.next_delay(retry_after=-1) == 0  # a clock skew's negative wait: at once
    first = backoff.next_delay()
    assert first is not None and 0.5 <= first <= 1


async def test_stopping_cuts_a_wait_short() -> None:
    stopping = asyncio.Event()
    backoff = Backoff(RetryPolicy(initial_seconds=60, max_seconds=60), stopping=stopping)
    started = time.monotonic()
    asyncio.get_running_loop().call_later(0.05, stopping.set)
    await asyncio.wait_for(backoff.sleep(60), 5)
    assert time.monotonic() - started < 5
    assert backoff.stopping


# retry ---------------------------------------------------------------------------------------

async def test_retry_retries_retryable_failures_until_the_operation_answers() -> None:
    flaky = Flaky(ConnectionError("down"), TimeoutError("slow"))
    failures: list[BaseException] = []
    assert await retry(flaky, backoff=Backoff(FAST), retryable=is_os_error, what="flaky",
                       on_failure=failures.append) == "up"
    assert flaky.calls == 3
    assert [type(f) for f in failures] == [ConnectionError, TimeoutError]


async def test_retry_raises_any_other_failure_at_once() -> None:
    flaky = Flaky(ValueError("permanent"))
    failures: list[BaseException] = []
    with pytest.raises(ValueError, match="permanent"):
        await retry(flaky, backoff=Backoff(FAST), retryable=is_os_error, what="broken",
                    on_failure=failures.append)
    assert flaky.calls == 1 and failures == []


async def test_retry_gives_up_with_the_last_failure_when_the_backoff_does() -> None:
    flaky = Flaky(*(ConnectionError(f"down {i}") for i in range(10)))
    with pytest.raises(ConnectionError, match="down 2"):
        await retry(flaky, backoff=Backoff(FAST.model_copy(update={"max_attempts": 2})),
                    retryable=is_os_error, what="flaky")
    assert flaky.calls == 3  # the first attempt and two more


async def test_retry_waits_what_the_server_asks() -> None:
    clock = FakeClock()
    flaky = Flaky(ConnectionError("busy"), ConnectionError("busy"))
    assert await retry(flaky, backoff=Backoff(FAST, sleep=clock.sleep), retryable=is_os_error,
                       what="busy", retry_after=lambda error: 7.0) == "up"
    assert clock.slept == [7.0, 7.0]


async def test_retry_gives_up_by_time_with_an_injected_clock() -> None:
    clock = FakeClock()
    flaky = Flaky(*(ConnectionError("down") for _ in range(100)))
    backoff = Backoff(RetryPolicy(initial_seconds=1, max_seconds=1), give_up_after=10,
                      clock=clock, sleep=clock.sleep)
    with pytest.raises(ConnectionError):
        await retry(flaky, backoff=backoff, retryable=is_os_error, what="down")
    assert sum(clock.slept) <= 10 and flaky.calls == len(clock.slept) + 1


async def test_stopping_ends_retrying_promptly_and_attempts_nothing_after_the_wait() -> None:
    stopping = asyncio.Event()
    flaky = Flaky(*(ConnectionError("down") for _ in range(100)))
    backoff = Backoff(RetryPolicy(initial_seconds=60, max_seconds=60), stopping=stopping)
    asyncio.get_running_loop().call_later(0.05, stopping.set)
    with pytest.raises(Stopped) as stopped:
        await asyncio.wait_for(
            retry(flaky, backoff=backoff, retryable=is_os_error, what="down"), 5)
    assert isinstance(stopped.value.__cause__, ConnectionError)
    assert flaky.calls == 1  # the wait was cut short, and nothing was attempted after it


async def test_once_stopping_a_failure_is_not_retried() -> None:
    stopping = asyncio.Event()
    stopping.set()
    flaky = Flaky(ConnectionError("down"))
    failures: list[BaseException] = []
    with pytest.raises(Stopped):
        await retry(flaky, backoff=Backoff(FAST, stopping=stopping), retryable=is_os_error,
                    what="down", on_failure=failures.append)
    assert flaky.calls == 1
    assert len(failures) == 1  # its dependency is still reported down


async def test_a_session_that_got_going_starts_its_next_outage_from_the_first_delay() -> None:
    clock = FakeClock()
    backoff = Backoff(RetryPolicy(initial_seconds=1, max_seconds=64, multiplier=4),
                      sleep=clock.sleep, rng=random.Random(3))
    outcomes = ["fail", "fail", "connect then fail", "fail", "stop"]

    async def session() -> str:
        outcome = outcomes.pop(0)
        if outcome == "stop":
            return "stopped"
        if outcome == "connect then fail":
            backoff.reset()
        raise ConnectionError(outcome)

    assert await retry(session, backoff=backoff, retryable=is_os_error,
                       what="session") == "stopped"
    # Ceilings 1, 4, then (reset) 1, 4: the third delay is a first one again.
    assert [0.5 <= s <= 1 for s in clock.slept] == [True, False, True, False]


async def test_stopped_from_within_the_operation_is_never_retried() -> None:
    async def inner_stopped() -> str:
        raise Stopped("publishing a dead letter")

    with pytest.raises(Stopped, match="dead letter"):
        await retry(inner_stopped, backoff=Backoff(FAST), retryable=lambda error: True,
                    what="handling a batch")
