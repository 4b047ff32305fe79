"""A read that must see every write finished before it was asked, shared by concurrent callers.

Why: the admission webhook confirms a refusal against the apiserver (its watched copy may lag),
and a flood of refused pods must not become a flood of lists. Joining a read already running
would not do: it may have started before the caller's write finished. So at most one read runs
and at most one waits behind it; every caller that arrives while one runs joins the waiting
one, which starts after the running one ends and therefore sees every write its callers saw
finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class FreshRead(Generic[T]):
    def __init__(self, read: Callable[[], Awaitable[T]], *, name: str) -> None:
        self._read, self._name = read, name
        self._running: asyncio.Task[T] | None = None
        self._waiting: asyncio.Task[T] | None = None

    async def __call__(self) -> T:
        if self._waiting is None:
            self._waiting = asyncio.create_task(self._after(self._running), name=self._name)
        # Shielded: one caller giving up (its review timed out) does not cancel the others'.
        return await asyncio.shield(self._waiting)

    async def _after(self, running: asyncio.Task[T] | None) -> T:
        if running is not None:
            await asyncio.wait([running])
        # This task now runs; callers from here on queue behind it.
        self._running, self._waiting = self._waiting, None
        return await self._read()
