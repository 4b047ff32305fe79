"""This cluster's copy of the queues: the Queue objects queue-store keeps here, listed and watched.

Why: admission must need nothing outside its own cluster. The webhook holds no database login;
it decides from the Queue objects (`lockgate.io/v1alpha1`) in the apiserver that sent the review,
kept in memory by a list + watch per cluster (an informer), so answering a review does no I/O
for the queue at all. The copy may lag Postgres (docs/admission.md says by how much and what
happens then); until the first list of a cluster succeeded, its reviews are refused as
unverifiable and the webhook reports not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from lockgate import queue_copies
from lockgate.admission import QueueLookup, QueueStatus, lookup_queue
from lockgate.queues import QueueSpec
from lockgate_adapters.fresh_reads import FreshRead
from lockgate_adapters.health import Readiness
from lockgate_adapters.retrying import Backoff, Stopped, retry
from lockgate_adapters.settings import RetryPolicy

log = logging.getLogger(__name__)

GONE = 410
REFUSING = frozenset({QueueStatus.MISSING, QueueStatus.NOT_ALLOWED})


def readiness_check(cluster: str) -> str:
    return f"queues/{cluster}"


class ClusterQueues:
    """The Queue objects of one source in one cluster, by queue name."""

    def __init__(self, cluster: str, api: client.ApiClient, *, source: str,
                 readiness: Readiness, retry: RetryPolicy, watch_timeout_seconds: int,
                 confirm_timeout_seconds: float = 1.0) -> None:
        self.cluster = cluster
        self._custom = client.CustomObjectsApi(api)
        self._selector = f"{queue_copies.SOURCE_LABEL}={source}"
        self._readiness = readiness
        self._retry = retry
        self._watch_timeout = watch_timeout_seconds
        self._confirm_timeout = confirm_timeout_seconds
        # object name -> queue; None until the first list succeeded.
        self._by_object: dict[str, QueueSpec] | None = None
        self._queues: dict[str, QueueSpec] = {}
        self.fresh = FreshRead(self._fresh_list, name=f"queues {cluster}: confirm")
        readiness.declare(readiness_check(cluster))

    @property
    def queues(self) -> Mapping[str, QueueSpec] | None:
        return None if self._by_object is None else self._queues

    async def run(self, stopping: asyncio.Event) -> None:
        backoff = Backoff(self._retry, stopping=stopping)

        async def list_and_watch() -> None:
            while not stopping.is_set():
                try:
                    version = await self._relist()
                    backoff.reset()
                    while not stopping.is_set():
                        version = await self._watch_from(version)
                except _Expired:
                    continue

        def failed(error: Exception) -> None:
            # The last copy keeps answering: it is only as stale as the outage is long.
            if self._by_object is None:
                self._readiness.set(readiness_check(self.cluster), False, repr(error))

        # Any failure: keep the last copy, list again.
        with contextlib.suppress(Stopped):
            await retry(list_and_watch, backoff=backoff, retryable=lambda error: True,
                        on_failure=failed, what=f"{self.cluster}: queues",
                        dependency=f"apiserver:{self.cluster}")

    async def _fresh_list(self) -> Mapping[str, QueueSpec]:
        """The queues as the apiserver has them now (a consistent list), by queue name. Why:
        the watched copy may trail a change by the watch's latency, and a refusal must not
        come from that lag (`lockgate queue create`, then a pod at once). Only refusals ask,
        through `fresh` (a `FreshRead`: a flood of refusals costs one list at a time)."""
        _, by_object = await self._list(self._confirm_timeout)
        return {spec.name: spec for spec in by_object.values()}

    async def _list(self, timeout_seconds: float | None = None
                    ) -> tuple[dict[str, Any], dict[str, QueueSpec]]:
        listing = await self._custom.list_cluster_custom_object(
            queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL,
            label_selector=self._selector,
            **({} if timeout_seconds is None else {"_request_timeout": timeout_seconds}))
        by_object: dict[str, QueueSpec] = {}
        for obj in listing.get("items") or []:
            spec = self._read(obj)
            if spec is not None:
                by_object[str(obj["metadata"]["name"])] = spec
        return listing, by_object

    async def _relist(self) -> str:
        listing, by_object = await self._list()
        self._replace(by_object)
        self._readiness.set(readiness_check(self.cluster), True, f"{len(by_object)} queues")
        return str((listing.get("metadata") or {}).get("resourceVersion", ""))

    async def _watch_from(self, version: str) -> str:
        watch = Watch(return_type="object")
        try:
            async with watch:
                async for event in watch.stream(
                    self._custom.list_cluster_custom_object,
                    queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL,
                    label_selector=self._selector, resource_version=version,
                    allow_watch_bookmarks=True, timeout_seconds=self._watch_timeout,
                    _request_timeout=self._watch_timeout + 30,
                ):
                    kind, obj = event["type"], event["raw_object"]
                    if kind == "ERROR":
                        if obj.get("code") == GONE:
                            raise _Expired
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    if kind == "BOOKMARK":
                        continue
                    self._apply(kind, obj)
        except ApiException as error:
            if error.status == GONE:
                raise _Expired from error
            raise
        return str(watch.resource_version or version)

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        assert self._by_object is not None
        name = str((obj.get("metadata") or {}).get("name"))
        by_object = dict(self._by_object)
        spec = None if kind == "DELETED" else self._read(obj)
        if spec is None:
            by_object.pop(name, None)
        else:
            by_object[name] = spec
        self._replace(by_object)

    def _replace(self, by_object: dict[str, QueueSpec]) -> None:
        self._by_object = by_object
        self._queues = {spec.name: spec for spec in by_object.values()}

    def _read(self, obj: Mapping[str, Any]) -> QueueSpec | None:
        try:
            return queue_copies.spec_from_object(obj)
        except queue_copies.InvalidQueueCopyError as error:
            # Treated as absent: pods naming it are refused with the queues they may use.
            log.error("%s: ignoring unreadable Queue: %s", self.cluster, error)
            return None


class _Expired(Exception):
    """The watch's resourceVersion is gone (410): list again."""


class QueueCopies:
    """Every cluster's copy; answers lookups from memory."""

    def __init__(self, clusters: Mapping[str, ClusterQueues]) -> None:
        self._clusters = clusters

    def lookup(self, *, cluster: str, queue: str, namespace: str,
               namespace_labels: Mapping[str, str]) -> QueueLookup | None:
        """What this cluster's copy says of `queue` for `namespace`; None before its first list."""
        queues = self._clusters[cluster].queues
        if queues is None:
            return None
        return lookup_queue(queue, queues=queues, cluster=cluster, namespace=namespace,
                            namespace_labels=namespace_labels)

    async def confirmed_lookup(self, *, cluster: str, queue: str, namespace: str,
                               namespace_labels: Mapping[str, str]) -> QueueLookup | None:
        """`lookup`, but a refusal (missing, not allowed) is checked against a fresh list
        first; if that list fails, the copy's answer stands."""
        found = self.lookup(cluster=cluster, queue=queue, namespace=namespace,
                            namespace_labels=namespace_labels)
        if found is None or found.status not in REFUSING:
            return found
        try:
            queues = await self._clusters[cluster].fresh()
        except Exception as error:  # noqa: BLE001 - the copy's refusal stands
            log.warning("%s: cannot confirm queue %r against the apiserver: %r", cluster,
                        queue, error)
            return found
        return lookup_queue(queue, queues=queues, cluster=cluster, namespace=namespace,
                            namespace_labels=namespace_labels)

    def as_json(self) -> dict[str, Any]:
        """Per cluster, the queues admission knows (null before the first list)."""
        return {name: None if c.queues is None else {
                    queue: {"cordoned": spec.cordoned, "namespaces": spec.namespaces_json()}
                    for queue, spec in sorted(c.queues.items())}
                for name, c in self._clusters.items()}

    async def run(self, stopping: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c.run(stopping), name=f"queues {c.cluster}")
                     for c in self._clusters.values()]
            await stopping.wait()
            for task in tasks:
                task.cancel()
