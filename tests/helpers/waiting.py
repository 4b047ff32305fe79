"""Waiting until something holds, with a deadline and a message saying what was awaited.

Why: tests on the real stack observe asynchronous effects (a row written, a pod bound, a message
consumed); each waits by polling, and a timeout must say what never happened.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
Description = str | Callable[[], str]


def _describe(what: Description) -> str:
    return what if isinstance(what, str) else what()


async def until(condition: Callable[[], bool], *, within: float, what: Description,
                every: float = 0.05) -> None:
    """Until `condition()` is true; AssertionError naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {_describe(what)}")
        await asyncio.sleep(every)


async def eventually(probe: Callable[[], Awaitable[T | None]], *, within: float = 30.0,
                     what: Description, every: float = 0.05) -> T:
    """The first answer of `probe()` that is neither None nor False, polled every `every`s.

    `what` (a string, or a function for a description made at the time of failure) names what
    never came in the AssertionError raised after `within` seconds.
    """
    deadline = time.monotonic() + within
    while True:
        result = await probe()
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {_describe(what)}")
        await asyncio.sleep(every)
