"""Collecting ephemeral namespaces: triggers, commands, and the steps against each cluster.

Why in queue-store: the records live in Postgres, which queue-store owns, and collection is a
sequence of small Postgres transactions around one apiserver call each. Commands arrive over
Kafka (`lockgate.jobset-commands.v1`, `lockgate.namespace-commands.v1`); the time-based
triggers (TTL, finished, queue deleted) are judged from Postgres on every pass.

Crash safety: each step locks one record (`FOR UPDATE SKIP LOCKED`), makes one idempotent
apiserver call (DELETE, or GET to see whether it is gone), and stores the outcome with its
transition before the lock is released. A crash before the commit leaves the record as it was,
and the next pass repeats the call (a repeated DELETE is answered 404 or 409, both understood).
A cluster that does not answer turns the record `failed` with the reason, retried after a capped
exponential backoff: it delays the collection and never drops it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta

import aiohttp
import asyncpg
from kubernetes_asyncio import client
from prometheus_client import Counter

from lockgate import namespaces as ns
from lockgate.events import JobSetCommand, NamespaceCommand
from lockgate_adapters import namespace_store
from lockgate_adapters.kafka import Received
from lockgate_adapters.retrying import sleep_unless_stopped
from queue_store.settings import CollectionSettings

log = logging.getLogger(__name__)

STEPS = Counter("lockgate_namespace_collection_steps", "Collection steps per cluster, by outcome "
                "(deleting, deleted, terminating, failed)", ["cluster", "outcome"])
TRIGGERED = Counter("lockgate_namespace_collection_triggers",
                    "Ephemeral namespaces whose collection started, by trigger", ["trigger"])


class NamespaceCallError(Exception):
    """An apiserver call about a namespace that did not succeed, with why."""


class NamespaceCalls:
    """The two calls collection makes in one cluster (as namespace-keeper)."""

    def __init__(self, api: client.ApiClient, *, request_timeout: float) -> None:
        self._core = client.CoreV1Api(api)
        self._timeout = request_timeout

    async def delete(self, name: str) -> ns.DeleteAnswer:
        status, body = await self._call(self._core.delete_namespace(
            name, _preload_content=False, _request_timeout=self._timeout))
        if status == 404:
            return ns.DeleteAnswer.GONE
        # 409: "the system is ensuring all content is removed": it is being deleted already.
        if status < 300 or status == 409:
            return ns.DeleteAnswer.ACCEPTED
        raise NamespaceCallError(f"delete answered {status}: {_message(body)}"
                                 + _hint(status))

    async def check(self, name: str) -> ns.CheckAnswer:
        status, body = await self._call(self._core.read_namespace(
            name, _preload_content=False, _request_timeout=self._timeout))
        if status == 404:
            return ns.CheckAnswer.GONE
        if status >= 300:
            raise NamespaceCallError(f"get answered {status}: {_message(body)}" + _hint(status))
        metadata = json.loads(body).get("metadata") or {}
        return (ns.CheckAnswer.TERMINATING if metadata.get("deletionTimestamp")
                else ns.CheckAnswer.PRESENT)

    @staticmethod
    async def _call(request: Awaitable[aiohttp.ClientResponse]) -> tuple[int, bytes]:
        try:
            response = await request
            async with response:
                return response.status, await response.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise NamespaceCallError(
                f"cluster unreachable: {type(error).__name__}: {error}") from error


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("message") or body[:300].decode(errors="replace"))
    except (ValueError, AttributeError):
        return body[:300].decode(errors="replace")


def _hint(status: int) -> str:
    if status in (401, 403):
        return (" (namespace-keeper needs get and delete on namespaces: "
                "k8s/base/namespace-keeper-rbac.yaml)")
    return ""


class NamespaceCollector:
    """Fires triggers, takes commands, and steps due records in every cluster."""

    def __init__(self, *, pool: asyncpg.Pool, apis: Mapping[str, client.ApiClient],
                 settings: CollectionSettings,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._pool = pool
        timeout = settings.request_timeout_seconds
        self._calls = {cluster: NamespaceCalls(api, request_timeout=timeout)
                       for cluster, api in apis.items()}
        self._settings = settings
        self._backoff = ns.Backoff(initial_seconds=settings.retry_initial_seconds,
                                   max_seconds=settings.retry_max_seconds)
        self._check_after = timedelta(seconds=settings.check_after_seconds)
        self._grace = timedelta(seconds=settings.finished_grace_seconds)
        self._clock = clock
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self._wake.clear()
            try:
                await self.pass_once()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
                # Postgres unreachable: nothing was changed half-way (each step is one
                # transaction); the next pass goes on from the records as they are.
                log.warning("namespace collection: postgres: %r", error)
            waiters = (asyncio.create_task(self._wake.wait()), asyncio.create_task(
                sleep_unless_stopped(stopping, self._settings.interval_seconds)))
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
                await asyncio.gather(*waiters, return_exceptions=True)

    async def pass_once(self) -> None:
        await self.fire_triggers()
        async with self._pool.acquire() as connection:
            clusters = await namespace_store.clusters_with_due(connection, self._clock())
        await asyncio.gather(*(self._collect_cluster(cluster) for cluster in clusters))

    async def fire_triggers(self) -> None:
        async with self._pool.acquire() as connection:
            candidates = await namespace_store.active_with_facts(connection)
        now = self._clock()
        for record, queue_exists, activity in candidates:
            fired = ns.fired_trigger(record, ns.TriggerFacts(
                queue_exists=queue_exists, activity=activity, finished_grace=self._grace), now)
            if fired is not None:
                await self._expire(record.cluster, record.name, fired[0], fired[1])

    async def _expire(self, cluster: str, name: str, trigger: ns.Trigger, cause: str) -> bool:
        async with self._pool.acquire() as connection, connection.transaction():
            record = await namespace_store.get(connection, cluster, name, lock=True)
            if record is None:
                return False
            change = ns.expire(record, trigger, cause=cause, at=self._clock())
            if change is None:
                return False
            await namespace_store.write_change(connection, change)
        TRIGGERED.labels(trigger.value).inc()
        log.info("namespace %s/%s: collection started (%s: %s)", cluster, name, trigger.value,
                 cause)
        return True

    async def _collect_cluster(self, cluster: str) -> None:
        """Step due records of one cluster, one per transaction, until none is due."""
        while True:
            async with self._pool.acquire() as connection, connection.transaction():
                due = await namespace_store.lock_due(connection, cluster=cluster,
                                                     now=self._clock(), limit=1)
                if not due:
                    return
                change = await self._step(due[0])
                await namespace_store.write_change(connection, change)
            self._log(change)

    async def _step(self, record: ns.NamespaceRecord) -> ns.Change:
        step = ns.next_step(record)
        calls = self._calls.get(record.cluster)
        try:
            if calls is None:
                raise NamespaceCallError(
                    f"no kubeconfig for cluster {record.cluster}: add it to "
                    "LOCKGATE_QUEUE_STORE_NAMESPACE_CLUSTERS")
            if step is ns.Step.DELETE:
                deleted = await calls.delete(record.name)
                return ns.after_delete(record, deleted, at=self._clock(),
                                       check_after=self._check_after)
            checked = await calls.check(record.name)
            return ns.after_check(record, checked, at=self._clock(),
                                  check_after=self._check_after)
        except NamespaceCallError as error:
            return ns.after_failure(record, str(error), at=self._clock(), backoff=self._backoff)

    @staticmethod
    def _log(change: ns.Change) -> None:
        record, transition = change.record, change.transition
        outcome = record.state.value if transition is not None else "terminating"
        STEPS.labels(record.cluster, outcome).inc()
        if transition is None:
            return
        level = logging.WARNING if record.state is ns.NamespaceState.FAILED else logging.INFO
        log.log(level, "namespace %s/%s: %s -> %s (%s)", record.cluster, record.name,
                transition.from_state, transition.to_state, transition.cause)

    # Commands (Kafka) -----------------------------------------------------------------------

    async def handle_jobset_commands(
        self, batch: list[Received[JobSetCommand]],
        reject: Callable[[Received[JobSetCommand], str], Awaitable[None]],
    ) -> None:
        """Cancel: jobs cancelled, the job set's active namespaces start collecting; all in one
        transaction per command, so a redelivery finds it done and changes nothing."""
        del reject  # every well-formed cancel can be applied
        for item in batch:
            command = item.event
            cause = f"job set {command.queue}/{command.jobset} cancelled by " \
                    f"{command.requested_by}: {command.reason}"
            async with self._pool.acquire() as connection, connection.transaction():
                cancelled = await namespace_store.cancel_jobs(connection, command)
                records = await namespace_store.lock_active_of_jobset(
                    connection, command.queue, command.jobset)
                for record in records:
                    change = ns.expire(record, ns.Trigger.CANCELLED, cause=cause,
                                       at=self._clock())
                    if change is not None:
                        await namespace_store.write_change(connection, change)
            log.info("%s: %d job(s) cancelled, %d namespace(s) to collect", cause, cancelled,
                     len(records))
        self.wake()

    async def handle_namespace_commands(
        self, batch: list[Received[NamespaceCommand]],
        reject: Callable[[Received[NamespaceCommand], str], Awaitable[None]],
    ) -> None:
        for item in batch:
            command = item.event
            cause = f"requested by {command.requested_by}: {command.reason}"
            async with self._pool.acquire() as connection:
                exists = await namespace_store.get(connection, command.cluster, command.name)
            if exists is None:
                await reject(item, f"no ephemeral namespace {command.cluster}/{command.name}")
                continue
            await self._expire(command.cluster, command.name, ns.Trigger.REQUESTED, cause)
        self.wake()

