"""Storing what each cluster's autoscaler may still add (topic lockgate.cluster-growth.v1).

Why apart from `ingesting`: a ClusterGrowth is one cluster's whole picture and touches no job,
node or cluster row, so it needs none of the fold's reads and locks: per batch, the newest
picture of each cluster is written in one statement (lockgate_adapters.growth_store: newest
wins, the leader hears only of real changes) and the leader is notified, before the batch's
offsets are committed. Redelivered or replayed pictures are older than or as old as the stored
ones and change nothing.

A picture that cannot be stored (lockgate.growth_observing.growth_problem, or a value Postgres
refuses) is dead-lettered and the others go on. Pictures of a cluster this installation does
not serve are skipped and counted, as `ingesting` does with pod events.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from lockgate.events import ClusterGrowth
from lockgate.growth_observing import growth_problem
from lockgate.installation import ClusterScope
from lockgate_adapters import growth_store
from lockgate_adapters.kafka import Received
from lockgate_adapters.postgres import notify_changes
from queue_store.ingesting import EVENTS

log = logging.getLogger(__name__)

GROWTH_TABLE = "cluster_growth"  # the change feed's name for it in notifications
_REFUSED_DATA = (asyncpg.exceptions.DataError,
                 asyncpg.exceptions.IntegrityConstraintViolationError)

Reject = Callable[[Received[Any], str], Awaitable[None]]


@dataclass
class GrowthStore:
    """The `BatchConsumer` handler of topic CLUSTER_GROWTH."""

    pool: asyncpg.Pool
    topic_name: str
    on_postgres: Callable[[bool, str], None] = lambda ready, detail: None
    scope: ClusterScope = field(default_factory=ClusterScope)
    # Messages already dead-lettered in the batch being (re)tried, so a retry does not repeat it.
    _rejected: set[tuple[int, int]] = field(default_factory=set)

    async def handle(self, batch: list[Received[Any]], reject: Reject) -> None:
        valid: list[Received[Any]] = []
        for item in batch:
            picture = item.event
            assert isinstance(picture, ClusterGrowth)
            if not self.scope.serves(picture.cluster):
                EVENTS.labels(self.topic_name, "other_cluster").inc()
                continue
            problem = growth_problem(picture)
            if problem is None:
                valid.append(item)
            else:
                await self._reject_once(item, f"invalid ClusterGrowth: {problem}", reject)
        try:
            changed = await self._store(valid, reject)
        except Exception as error:
            self.on_postgres(False, f"{type(error).__name__}: {error}")
            raise
        self.on_postgres(True, "writing")
        self._rejected.clear()
        EVENTS.labels(self.topic_name, "stored").inc(len(valid))
        if changed:
            log.info("stored the growth picture of %s", ", ".join(changed))

    async def _store(self, items: list[Received[Any]], reject: Reject) -> list[str]:
        if not items:
            return []
        try:
            return await store_pictures(self.pool, [item.event for item in items])
        except _REFUSED_DATA as error:
            if len(items) == 1:
                await self._reject_once(items[0], f"postgres refused it: {error}", reject)
                return []
            log.warning("postgres refused a batch of %d growth pictures (%s); storing one by "
                        "one", len(items), error)
        changed: list[str] = []
        for item in items:
            changed += await self._store([item], reject)
        return sorted(set(changed))

    async def _reject_once(self, item: Received[Any], reason: str, reject: Reject) -> None:
        where = (item.record.partition, item.record.offset)
        if where in self._rejected:
            return
        await reject(item, reason)
        self._rejected.add(where)
        EVENTS.labels(self.topic_name, "rejected").inc()


async def store_pictures(pool: asyncpg.Pool, pictures: list[ClusterGrowth]) -> list[str]:
    """Store the pictures in one transaction and notify the leader of those that changed; the
    clusters whose picture changed."""
    async with pool.acquire() as connection, connection.transaction():
        changed = await growth_store.store_growth(connection, pictures)
        if changed:
            await notify_changes(connection, GROWTH_TABLE)
    return changed
