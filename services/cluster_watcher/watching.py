"""Listing and watching one cluster's pods and nodes, and turning what is seen into events.

Split as kopf splits it. `ResourceWatcher.run` is the infinite part and is trivial: whatever goes
wrong (apiserver down or restarting, throttling, a broken stream), report not ready, back off,
start over. `ResourceWatcher.list_then_watch` is the part worth testing: list (in pages), then
watch from the list's resourceVersion, request after request — each ends after a server-side
timeout and the next resumes from the newest resourceVersion seen, bookmarks included — until the
apiserver answers 410 Gone because that version is no longer kept; then it returns to relist.

`ClusterWatcher` runs a namespace, a pod and a node watcher for one cluster (pods are judged
once namespaces are listed: a pod is lockgate's only in a managed namespace), feeds them into
its `ObservedCluster`, puts the resulting events into the outbox and publishes the cluster's
capacity when it changed, coalesced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch
from prometheus_client import Counter

from cluster_watcher.publishing import (
    Outbox,
    Outgoing,
    capacity_message,
    notice_message,
    pod_event_message,
    snapshot_message,
)
from lockgate.events import PodEvent
from lockgate.observing import KubeObject, ObservedCluster
from lockgate_adapters.kube import is_retryable_kube_error, retry_after_seconds
from lockgate_adapters.quieting import quiet
from lockgate_adapters.retrying import Backoff, retry
from lockgate_adapters.settings import RetryPolicy

log = logging.getLogger(__name__)

RELISTS = Counter("lockgate_watcher_lists_total",
                  "Full lists of a resource (at start, after 410 Gone or an outage)",
                  ["cluster", "resource"])
WATCH_EVENTS = Counter("lockgate_watcher_watch_events_total",
                       "Watch events received", ["cluster", "resource", "type"])
WATCH_FAILURES = Counter("lockgate_watcher_watch_failures_total",
                         "Lists or watches that failed and were retried after a backoff",
                         ["cluster", "resource"])
WATCH_REQUESTS = Counter("lockgate_watcher_watch_requests_total",
                         "Watch requests that ended without error: at their timeout, or early "
                         "(the apiserver closed the stream, e.g. a watcher too slow for it)",
                         ["cluster", "resource", "ended"])
PODS_MISSED = Counter("lockgate_watcher_pods_missed_by_watch_total",
                      "Pods of lockgate's that an audit list found although the watch had "
                      "passed their version without reporting them (reported then)", ["cluster"])

ListCall = Callable[..., Awaitable[Any]]
GONE = 410


class WatchExpired(Exception):
    """The apiserver no longer keeps the resourceVersion a watch started from: relist."""


@dataclass(frozen=True)
class WatchOptions:
    timeout_seconds: int = 300
    page_size: int = 500
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Every this many seconds, list pods and report those the watch missed (0: never).
    pod_audit_seconds: float = 0.0
    # Every this many seconds, publish again the pods that skipped the gate (0: never).
    skipped_gate_resend_seconds: float = 0.0


class ResourceWatcher:
    """Lists then watches one kind of object in one cluster, handing what it sees on."""

    def __init__(
        self,
        *,
        cluster: str,
        resource: str,
        list_call: ListCall,
        on_list: Callable[[list[KubeObject], datetime], Awaitable[None]],
        on_event: Callable[[str, KubeObject], Awaitable[None]],
        set_ready: Callable[[bool, str], None],
        options: WatchOptions,
        gives_up_on: Callable[[Exception], bool] = lambda error: False,
    ) -> None:
        self.cluster, self.resource = cluster, resource
        # Failures `run` raises instead of retrying (e.g. a kind the cluster does not serve).
        self._gives_up_on = gives_up_on
        self._list_call = list_call
        self._on_list, self._on_event = on_list, on_event
        self._set_ready = set_ready
        self._options = options
        self._backoff = Backoff(options.retry)  # cancelled, not stopped: waits need no event

    async def run(self) -> None:
        """List and watch forever (until cancelled), starting over after any failure but those
        it `gives_up_on`, which it raises."""
        async def forever() -> None:
            while True:
                await self.list_then_watch()

        await retry(forever, backoff=self._backoff,
                    retryable=lambda error: not self._gives_up_on(error),
                    on_failure=self._failed, retry_after=retry_after_seconds,
                    what=f"{self.cluster} {self.resource}: listing and watching",
                    dependency=f"apiserver:{self.cluster}")

    def _failed(self, error: Exception) -> None:
        WATCH_FAILURES.labels(self.cluster, self.resource).inc()
        self._set_ready(False, f"{type(error).__name__}: {error}")
        if not is_retryable_kube_error(error):
            log.error("%s %s: unexpected failure; listing again", self.cluster, self.resource,
                      exc_info=error)

    async def list_then_watch(self) -> None:
        """List, then watch from the list's resourceVersion until it expires (410 Gone)."""
        resource_version = await self.relist()
        self._backoff.reset()
        self._set_ready(True, "watching")
        while True:
            try:
                resource_version = await self.watch_from(resource_version)
            except WatchExpired as expired:
                log.info("%s %s: %s; listing again", self.cluster, self.resource, expired)
                return

    async def relist(self) -> str:
        """List every object (in pages), hand them on; the list's resourceVersion."""
        while True:
            started_at = datetime.now(UTC)
            try:
                items, resource_version = await self.list_all()
            except WatchExpired:
                continue  # the continue token expired between pages: start the list over
            RELISTS.labels(self.cluster, self.resource).inc()
            await self._on_list(items, started_at)
            return resource_version

    async def list_all(self) -> tuple[list[KubeObject], str]:
        items: list[KubeObject] = []
        continue_token: str | None = None
        while True:
            page = await self._get_page(continue_token)
            items.extend(page.get("items") or ())
            metadata = page.get("metadata") or {}
            continue_token = metadata.get("continue")
            if not continue_token:
                return items, str(metadata.get("resourceVersion", ""))

    async def _get_page(self, continue_token: str | None) -> dict[str, Any]:
        # The raw JSON, not client models: much faster for thousands of pods, and the pure core
        # reads the apiserver's own field names.
        kwargs: dict[str, Any] = {"limit": self._options.page_size, "_preload_content": False,
                                  "_request_timeout": 60}
        if continue_token:
            kwargs["_continue"] = continue_token
        response = await self._list_call(**kwargs)
        try:
            body = await response.read()
        finally:
            response.release()
        if response.status == GONE and continue_token:
            raise WatchExpired(body.decode(errors="replace")[:300])
        if response.status != 200:
            error = ApiException(status=response.status,
                                 reason=body.decode(errors="replace")[:300])
            error.headers = response.headers  # keeps Retry-After for the backoff
            raise error
        page: dict[str, Any] = orjson.loads(body)
        return page

    async def watch_from(self, resource_version: str) -> str:
        """One watch request; the newest resourceVersion seen when the server ended it."""
        timeout = self._options.timeout_seconds
        # return_type "object" keeps the objects as the apiserver's JSON instead of client models.
        watch = RawWatch()
        started, events = time.monotonic(), 0
        try:
            async with watch:
                stream = watch.stream(
                    self._list_call,
                    resource_version=resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=timeout,
                    # A silent, half-open connection must not hang the watcher forever.
                    _request_timeout=timeout + 30,
                )
                async for event in stream:
                    kind = event["type"]
                    events += 1
                    WATCH_EVENTS.labels(self.cluster, self.resource, kind).inc()
                    if kind != "BOOKMARK":  # a bookmark only moves the resourceVersion on
                        await self._on_event(kind, event["raw_object"])
        except ApiException as error:
            if error.status == GONE:
                raise WatchExpired(str(error.reason)) from error
            raise
        resumed_from = str(watch.resource_version or resource_version)
        lasted = time.monotonic() - started
        early = lasted < timeout - 5
        WATCH_REQUESTS.labels(self.cluster, self.resource, "early" if early else "timeout").inc()
        # Ended early, the apiserver closed it (a slow watcher, a restarting cache): nothing is
        # lost if the next one resumes right; said, so a lost event can be matched to it.
        log.log(logging.INFO if early else logging.DEBUG,
                "%s %s: watch from version %s ended after %.1fs (%d events%s); resuming from "
                "version %s", self.cluster, self.resource, resource_version, lasted, events,
                ", before its timeout" if early else "", resumed_from)
        return resumed_from


class RawWatch(Watch):  # type: ignore[misc]  # (kubernetes-asyncio has no types)
    """kubernetes-asyncio's `Watch`, reading each event's object as the apiserver's JSON, with
    orjson, and making no client of its own.

    Why: with `return_type="object"` the stock `Watch` decodes every event with the stdlib json,
    encodes its object again and decodes that a second time (`ApiClient.deserialize`), and each
    `Watch()` builds an `ApiClient`, so a TLS context, for every watch request: 20% of the
    cluster watcher's CPU on the release benchmark. Events, errors, bookmarks and the
    resourceVersion are handled as `Watch.unmarshal_event` handles them; `event["object"]` and
    `event["raw_object"]` are the same dict.
    """

    def __init__(self) -> None:  # no super().__init__(): it would make the ApiClient
        self._raw_return_type = "object"
        self._stop = False
        self.resource_version = None
        self.resp = None

    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        if not isinstance(event, dict) or "object" not in event or "type" not in event:
            if isinstance(event, dict) and "code" in event:
                raise ApiException(status=event["code"],
                                   reason=f"{event.get('reason')}: {event.get('message')}")
            raise ValueError("Malformed JSON response, the 'object' and/or 'type' field is "
                             f"missing. JSON: {event}")
        obj = event["raw_object"] = event["object"]
        kind = str(event["type"]).lower()
        if kind == "error":
            raise ApiException(status=obj["code"], reason=f"{obj['reason']}: {obj['message']}")
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        if kind == "bookmark":
            if not isinstance(metadata, dict) or "resourceVersion" not in metadata:
                raise ValueError("Malformed JSON response for bookmark event, 'metadata' or "
                                 f"'resourceVersion' field is missing. JSON: {event}")
            self.resource_version = metadata["resourceVersion"]
        elif isinstance(metadata, dict) and "resourceVersion" in metadata:
            self.resource_version = metadata["resourceVersion"]
        return event

    async def close(self) -> None:
        if self.resp is not None:
            self.resp.release()
            self.resp = None


class ClusterWatcher:
    """Watches one cluster's pods and nodes and publishes what lockgate must know of them."""

    def __init__(
        self,
        *,
        cluster: str,
        api: client.ApiClient,
        outbox: Outbox,
        set_ready: Callable[[str, bool, str], None],
        options: WatchOptions,
        capacity_min_interval: float = 0.5,
        capacity_refresh: float = 30.0,
        observed: ObservedCluster | None = None,
        managed_namespace_labels: Mapping[str, str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.observed = observed or ObservedCluster(
            cluster, managed_namespace_labels=managed_namespace_labels)
        self._outbox = outbox
        self._capacity_min_interval = capacity_min_interval
        self._capacity_refresh = capacity_refresh
        self._capacity_changed = asyncio.Event()
        self._capacity_revision_seen = -1
        self._namespaces_listed = asyncio.Event()
        self._pod_audit_seconds = options.pod_audit_seconds
        self._skipped_resend_seconds = options.skipped_gate_resend_seconds
        core = client.CoreV1Api(api)
        self.namespaces = ResourceWatcher(
            cluster=cluster, resource="namespaces", list_call=core.list_namespace,
            on_list=self._namespaces_relisted, on_event=self._namespace_changed,
            set_ready=lambda ok, detail: set_ready(self.namespaces_check, ok, detail),
            options=options,
        )
        self.pods = ResourceWatcher(
            cluster=cluster, resource="pods", list_call=core.list_pod_for_all_namespaces,
            on_list=self._pods_listed, on_event=self._pod_changed,
            set_ready=lambda ok, detail: set_ready(self.pods_check, ok, detail),
            options=options,
        )
        self.nodes = ResourceWatcher(
            cluster=cluster, resource="nodes", list_call=core.list_node,
            on_list=self._nodes_listed, on_event=self._node_changed,
            set_ready=lambda ok, detail: set_ready(self.nodes_check, ok, detail),
            options=options,
        )

    @property
    def pods_check(self) -> str:
        return f"{self.cluster}/pods"

    @property
    def nodes_check(self) -> str:
        return f"{self.cluster}/nodes"

    @property
    def namespaces_check(self) -> str:
        return f"{self.cluster}/namespaces"

    async def run(self, stopping: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self.namespaces.run(), name=f"watch {self.cluster} namespaces"),
                group.create_task(self.pods.run(), name=f"watch {self.cluster} pods"),
                group.create_task(self.nodes.run(), name=f"watch {self.cluster} nodes"),
                group.create_task(self._publish_capacity(), name=f"{self.cluster} capacity"),
            ]
            if self._pod_audit_seconds > 0:
                tasks.append(group.create_task(self._audit_pods(),
                                               name=f"{self.cluster} pod audit"))
            if self._skipped_resend_seconds > 0:
                tasks.append(group.create_task(self._resend_skipped(),
                                               name=f"{self.cluster} skipped-gate resend"))
            await stopping.wait()
            for task in tasks:
                task.cancel()

    # Namespaces

    async def _namespaces_relisted(self, namespaces: list[KubeObject],
                                   _started_at: datetime) -> None:
        events = self.observed.relist_namespaces(namespaces)
        self._namespaces_listed.set()
        await self._publish_pod_events(events)

    async def _namespace_changed(self, kind: str, namespace: KubeObject) -> None:
        events = self.observed.observe_namespace(namespace, deleted=kind == "DELETED")
        await self._publish_pod_events(events)

    async def _publish_pod_events(self, events: list[PodEvent]) -> None:
        if events:
            await self._outbox.put(self._pod_messages(events))
        self._note_capacity()

    def _pod_messages(self, events: list[PodEvent]) -> list[Outgoing]:
        """The events, then the notices due for pods among them that skipped the gate."""
        return ([pod_event_message(e) for e in events]
                + [notice_message(n) for n in self.observed.notices_for(events)])

    # Pods

    async def _pods_listed(self, pods: list[KubeObject], started_at: datetime) -> None:
        # Whether a pod is lockgate's depends on its namespace's labels: know them first.
        await self._namespaces_listed.wait()
        snapshot = self.observed.relist_pods(pods, listed_at=started_at)
        log.info("%s: listed %d pods, %d managed", self.cluster, len(pods),
                 len(snapshot.pod_events))
        for problem in snapshot.unreadable:
            log.error("%s: cannot read pod %s", self.cluster, problem)
        messages = self._pod_messages(snapshot.pod_events)
        # The snapshot goes after its pods' events, but on another topic, which queue-store
        # consumes on its own: it may fold the snapshot first. So the snapshot says itself how
        # each listed pod that had ended ended (lockgate.ingest).
        messages.append(snapshot_message(snapshot.cluster_snapshot))
        await self._outbox.put(messages)
        self._note_capacity()

    async def _pod_changed(self, kind: str, pod: KubeObject) -> None:
        try:
            event = self.observed.observe_pod(pod, deleted=kind == "DELETED")
        except ValueError as error:
            metadata = pod.get("metadata") or {}
            log.error("%s: cannot read pod %s/%s (%s); its change is skipped", self.cluster,
                      metadata.get("namespace"), metadata.get("name"), error)
            return
        if event is not None:
            await self._outbox.put(self._pod_messages([event]))
        self._note_capacity()

    async def _resend_skipped(self) -> None:
        """Every `skipped_gate_resend_seconds`, the pods that skipped the gate again
        (`ObservedCluster.resend_skipped`)."""
        while True:
            await asyncio.sleep(self._skipped_resend_seconds)
            events = self.observed.resend_skipped()
            if events:
                await self._outbox.put([pod_event_message(e) for e in events])

    async def _audit_pods(self) -> None:
        """Every `pod_audit_seconds`, list pods and report the pods of lockgate's that the
        watch never reported (`ObservedCluster.end_pod_audit`), loudly: a watch that skips an
        event would otherwise leave that pod gated forever, with nothing said anywhere."""
        while True:
            await asyncio.sleep(self._pod_audit_seconds)
            if not self.observed.pods_listed:
                continue
            self.observed.begin_pod_audit()
            try:
                pods, _ = await self.pods.list_all()
            except Exception as error:  # noqa: BLE001 - an audit is retried at the next turn
                log.warning("%s: auditing pods: listing failed (%r); next audit in %.0fs",
                            self.cluster, error, self._pod_audit_seconds,
                            extra=quiet(f"apiserver:{self.cluster}"))
                continue
            missed = self.observed.end_pod_audit(pods)
            log.debug("%s: audited %d pods, %d missed by the watch", self.cluster, len(pods),
                      len(missed))
            for pod in missed:
                event = pod.event
                log.warning(
                    "%s: pod %s/%s (uid %s, version %s, %s, queue %s) is lockgate's but its "
                    "watch never reported it, although the watch had passed version %d; "
                    "reporting it now", self.cluster, event.namespace, event.name, event.uid,
                    event.resource_version, event.state.value, event.queue,
                    pod.watched_version)
            if missed:
                PODS_MISSED.labels(self.cluster).inc(len(missed))
                await self._outbox.put(self._pod_messages([p.event for p in missed]))

    # Nodes

    async def _nodes_listed(self, nodes: list[KubeObject], _started_at: datetime) -> None:
        self.observed.relist_nodes(nodes)
        self._note_capacity()

    async def _node_changed(self, kind: str, node: KubeObject) -> None:
        self.observed.observe_node(node, deleted=kind == "DELETED")
        self._note_capacity()

    # Capacity

    def _note_capacity(self) -> None:
        if self.observed.capacity_revision != self._capacity_revision_seen:
            self._capacity_revision_seen = self.observed.capacity_revision
            self._capacity_changed.set()

    async def _publish_capacity(self) -> None:
        """Publish capacity when it changed — at most once per interval — or to refresh it."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._capacity_changed.wait(), self._capacity_refresh)
            self._capacity_changed.clear()
            if not self.observed.capacity_known:
                continue
            self._outbox.put_capacity(capacity_message(self.observed.capacity()))
            await asyncio.sleep(self._capacity_min_interval)
