"""FreshRead: callers share reads, yet each answer comes from a read begun after it was asked."""

from __future__ import annotations

import asyncio

import pytest

from lockgate_adapters.fresh_reads import FreshRead


class Source:
    """A value written by tests; each read returns the value when it began, after a pause."""

    def __init__(self) -> None:
        self.value = 0
        self.reads = 0
        self.release = asyncio.Event()
        self.fail_next = False

    async def read(self) -> int:
        self.reads += 1
        seen = self.value
        failing, self.fail_next = self.fail_next, False
        await self.release.wait()
        if failing:
            raise ConnectionError("apiserver unreachable")
        return seen


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_callers_while_a_read_runs_share_the_one_after_it_which_sees_their_writes() -> None:
    source = Source()
    fresh = FreshRead(source.read, name="test")
    first = asyncio.create_task(fresh())
    await settle()
    assert source.reads == 1
    source.value = 1  # written after the first read began: only a later read may be trusted
    joined = [asyncio.create_task(fresh()) for _ in range(20)]
    await settle()
    assert source.reads == 1  # the twenty wait behind the running read, as one
    source.release.set()
    assert await first == 0
    assert await asyncio.gather(*joined) == [1] * 20
    assert source.reads == 2


async def test_a_failed_read_fails_its_callers_and_the_next_call_reads_again() -> None:
    source = Source()
    fresh = FreshRead(source.read, name="test")
    source.fail_next = True
    callers = [asyncio.create_task(fresh()) for _ in range(3)]
    await settle()
    source.release.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(result, ConnectionError) for result in results), results
    source.value = 7
    assert await fresh() == 7
    assert source.reads == 2


async def test_a_caller_giving_up_does_not_cancel_the_read_of_the_others() -> None:
    source = Source()
    fresh = FreshRead(source.read, name="test")
    impatient, patient = asyncio.create_task(fresh()), asyncio.create_task(fresh())
    await settle()
    impatient.cancel()
    with pytest.raises(asyncio.CancelledError):
        await impatient
    source.value = 3
    source.release.set()
    assert await patient == 0  # began before the write; it was the only read asked for
    assert source.reads == 1
