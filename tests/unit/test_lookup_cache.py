"""The webhook's lookup cache: coalesced loads, and stale values only where they are safe."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import pytest

from admission_webhook.cluster_lookups import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def managed(value: str) -> bool:
    return value == "managed"


def cache(clock: Clock, told: list[tuple[Hashable, float]]) -> TtlCache[str]:
    return TtlCache(2.0, clock, stale_for=30.0, stale_ok=managed,
                    on_stale=lambda key, age, _error: told.append((key, age)))


async def failing() -> str:
    raise TimeoutError


def loading(value: str):  # type: ignore[no-untyped-def]
    async def load() -> str:
        return value
    return load


async def test_a_failed_read_serves_a_value_that_is_safe_and_recent() -> None:
    clock, told = Clock(), []
    values = cache(clock, told)
    assert await values.get("ns", loading("managed")) == "managed"
    clock.now = 12.0  # expired 10 s ago

    assert await values.get("ns", failing) == "managed"
    assert told == [("ns", 12.0)]


async def test_a_failed_read_never_serves_a_value_that_is_not_safe() -> None:
    clock, told = Clock(), []
    values = cache(clock, told)
    assert await values.get("ns", loading("unmanaged")) == "unmanaged"
    clock.now = 3.0

    with pytest.raises(TimeoutError):
        await values.get("ns", failing)
    assert told == []


async def test_a_failed_read_never_serves_a_value_too_old() -> None:
    clock, told = Clock(), []
    values = cache(clock, told)
    await values.get("ns", loading("managed"))
    clock.now = 2.0 + 30.5

    with pytest.raises(TimeoutError):
        await values.get("ns", failing)
    assert told == []


async def test_a_value_read_again_replaces_the_stale_one() -> None:
    clock, told = Clock(), []
    values = cache(clock, told)
    await values.get("ns", loading("managed"))
    clock.now = 5.0
    assert await values.get("ns", loading("unmanaged")) == "unmanaged"
    clock.now = 10.0

    with pytest.raises(TimeoutError):  # the newest read says unmanaged: never used stale
        await values.get("ns", failing)


async def test_concurrent_reads_share_one_load_and_its_stale_answer() -> None:
    clock, told = Clock(), []
    values = cache(clock, told)
    await values.get("ns", loading("managed"))
    clock.now = 4.0
    calls = []

    async def slow_failure() -> str:
        calls.append(1)
        await asyncio.sleep(0.01)
        raise TimeoutError

    answers = await asyncio.gather(*(values.get("ns", slow_failure) for _ in range(5)))

    assert answers == ["managed"] * 5
    assert len(calls) == 1 and len(told) == 1
