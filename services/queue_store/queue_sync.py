"""Keeping a `Queue` object per queue in every worker cluster, in step with Postgres.

Why here: queue-store owns the `queues` table, and the admission webhook in each cluster must
decide from that cluster's API alone (no database login, no cross-network call on the pod
creation path). Each pass reads the queues, lists this installation's Queue objects in each
cluster and creates, replaces or deletes what differs (`lockgate.queue_copies.plan_sync`), then
writes each object's status (observedGeneration, lastSyncTime). Passes run at start, moments
after a change to `queues` (LISTEN on the change feed) and every `resync_seconds` anyway, so a
missed notification, a hand edit or a cluster that was down is repaired. A pass is idempotent;
a cluster that fails is retried at the next pass and never holds up the others.

Each cluster's copy also lists that cluster's active ephemeral namespaces of the queue
(`ephemeralNamespaces`), so they may use it by name (`lockgate.namespace_access`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import asyncpg
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter, Gauge

from lockgate import queue_copies
from lockgate.queues import QueueSpec
from lockgate_adapters import job_store, namespace_store
from lockgate_adapters.postgres import watch_changes
from lockgate_adapters.retrying import Backoff
from lockgate_adapters.settings import RetryPolicy

log = logging.getLogger(__name__)

PASSES = Counter("lockgate_queue_sync_passes", "Queue copy passes per cluster, by outcome",
                 ["cluster", "outcome"])
LAST_SYNC = Gauge("lockgate_queue_sync_last_success_timestamp_seconds",
                  "When the Queue objects of a cluster last matched Postgres (unix time)",
                  ["cluster"], unit="seconds")
# After a notification, wait this long so a burst of changes costs one pass.
COALESCE_SECONDS = 0.05


class QueueSync:
    """Copies Postgres' queues into each cluster as Queue objects of one `source`."""

    def __init__(self, *, pool: asyncpg.Pool, dsn: str, apis: Mapping[str, client.ApiClient],
                 source: str, prefix: str, resync_seconds: float, retry: RetryPolicy) -> None:
        self._pool, self._dsn = pool, dsn
        self._apis = apis
        self._source, self._prefix = source, prefix
        self._resync = resync_seconds
        self._changed = asyncio.Event()
        # Not a retry of one call: after a failed pass the next comes sooner than the resync.
        self._backoff = Backoff(retry)
        # Passes begun and finished, so a writer can wait for one that read its commit.
        self._begun = self._finished = 0
        self._pass_finished = asyncio.Condition()

    async def run(self, stopping: asyncio.Event) -> None:
        listener = asyncio.create_task(self._listen(stopping), name="queue sync: listen")
        try:
            while not stopping.is_set():
                self._changed.clear()
                self._begun += 1
                outcomes = await self.sync_once()
                async with self._pass_finished:
                    self._finished = self._begun
                    self._pass_finished.notify_all()
                wait = self._resync
                if any(outcome != "ok" for outcome in outcomes.values()):
                    # A cluster or Postgres failed: try again soon, not at the next resync.
                    wait = min(wait, self._backoff.next_delay() or self._backoff.policy.max_seconds)
                else:
                    self._backoff.reset()
                waiter = asyncio.create_task(self._changed.wait())
                stopper = asyncio.create_task(stopping.wait())
                try:
                    await asyncio.wait((waiter, stopper), timeout=wait,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (waiter, stopper):
                        task.cancel()
                await asyncio.sleep(COALESCE_SECONDS)
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def settled(self, timeout_seconds: float) -> bool:
        """Wait until a pass that began after this call has finished: then the copies hold
        what the caller committed before calling (unless a cluster failed; its next pass
        repairs it). Why: `lockgate queue create` or `namespace create` followed at once by a
        pod must not be refused because the webhook's copy had not caught up yet. False when
        no pass finished in `timeout_seconds`."""
        wanted = self._begun + 1
        self._changed.set()
        try:
            async with asyncio.timeout(timeout_seconds), self._pass_finished:
                await self._pass_finished.wait_for(lambda: self._finished >= wanted)
        except TimeoutError:
            log.warning("queue sync: no pass finished within %.1fs of a change; the copies "
                        "follow at the next pass", timeout_seconds)
            return False
        return True

    async def sync_once(self) -> dict[str, str]:
        """One pass over every cluster; returns each cluster's outcome ("ok" or the error)."""
        try:
            async with self._pool.acquire() as connection:
                queues = await job_store.list_queues(connection)
                ephemeral = await namespace_store.active_names_by_cluster(connection)
        except Exception as error:  # noqa: BLE001 - Postgres down: the copies stay as they are
            log.warning("queue sync: cannot read queues: %r", error)
            return dict.fromkeys(self._apis, f"postgres: {error!r}")
        outcomes: dict[str, str] = {}
        for cluster, api in self._apis.items():
            try:
                await self._sync_cluster(cluster, api, queues, ephemeral.get(cluster, {}))
            except Exception as error:  # noqa: BLE001 - retried at the next pass
                PASSES.labels(cluster, "failed").inc()
                described = _describe(error)
                log.warning("queue sync: %s: %s", cluster, described)
                outcomes[cluster] = described
                continue
            PASSES.labels(cluster, "ok").inc()
            LAST_SYNC.labels(cluster).set(datetime.now(UTC).timestamp())
            outcomes[cluster] = "ok"
        return outcomes

    async def _sync_cluster(self, cluster: str, api: client.ApiClient,
                            queues: list[QueueSpec],
                            ephemeral: Mapping[str, list[str]]) -> None:
        custom = client.CustomObjectsApi(api)
        listing = await custom.list_cluster_custom_object(
            queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL,
            label_selector=f"{queue_copies.SOURCE_LABEL}={self._source}")
        plan = queue_copies.plan_sync(queues, listing.get("items") or [], source=self._source,
                                      prefix=self._prefix, ephemeral=ephemeral)
        by_name = {queue_copies.object_name(q.name, prefix=self._prefix): q for q in queues}
        written: dict[str, Mapping[str, Any]] = {}
        for obj in plan.create:
            name = obj["metadata"]["name"]
            try:
                written[name] = await custom.create_cluster_custom_object(
                    queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL, obj)
            except ApiException as error:
                if error.status != 409:  # created meanwhile: the next pass replaces it
                    raise
            log.info("queue sync: %s: created Queue %s", cluster, name)
        for obj in plan.replace:
            name = obj["metadata"]["name"]
            written[name] = await custom.replace_cluster_custom_object(
                queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL, name, obj)
            log.info("queue sync: %s: updated Queue %s", cluster, name)
        for name in plan.delete:
            try:
                await custom.delete_cluster_custom_object(
                    queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL, name)
            except ApiException as error:
                if error.status != 404:
                    raise
            log.info("queue sync: %s: deleted Queue %s", cluster, name)
        # Status where the object changed, or its lastSyncTime (how fresh this cluster's copy
        # is) is older than half a resync period: a pass after one queue's change writes one
        # status, not one per queue (creating N queues one by one would cost N²/2 writes).
        now = datetime.now(UTC)
        current = {str(o["metadata"]["name"]): o for o in listing.get("items") or []}
        for name, spec in by_name.items():
            stored = written.get(name) or current.get(name)
            if stored is None:
                continue
            generation = int((stored.get("metadata") or {}).get("generation") or 1)
            status = queue_copies.status_of(spec, generation=generation, synced_at=now)
            if name not in written and queue_copies.status_is_current(
                    stored.get("status"), status, now=now,
                    max_age_seconds=self._resync / 2):
                continue
            await custom.patch_cluster_custom_object_status(
                queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL, name,
                {"status": status}, _content_type="application/merge-patch+json")

    async def _listen(self, stopping: asyncio.Event) -> None:
        """Wake the loop on a change to `queues` or `ephemeral_namespaces`."""
        await watch_changes(self._dsn, frozenset({"queues", namespace_store.TABLE}),
                            self._changed, stopping, name="queue sync",
                            retry_seconds=min(self._resync, 5.0))


def _describe(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"{error.status} {error.reason}: {str(error.body or '')[:300]}"
    return repr(error)
