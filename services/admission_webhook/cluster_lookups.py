"""Reading, from one cluster's API, the labels a pod inherits: its namespace's and its owners'.

Why: a pod created by a Deployment, a Job or an operator's custom resource rarely carries
lockgate's labels itself; the user sets them on the object they wrote. The webhook walks the
pod's controlling ownerReferences (ReplicaSet → Deployment, Job → CronJob, any kind through API
discovery) a bounded number of steps. Reads are cached briefly and coalesced, because a
Deployment scaled to 500 replicas sends 500 reviews naming the same ReplicaSet at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from lockgate.admission import NotPermitted, OwnerLabels, owner_rbac_hint, refused_user
from lockgate.labels import is_managed_namespace

log = logging.getLogger(__name__)

OWNERS_NOT_PERMITTED = Counter(
    "lockgate_admission_owners_not_permitted",
    "Owners of pods the webhook could not read because its RBAC does not let it get their "
    "kind (pods then inherit from their namespace); the log says, once per kind, what to grant",
    ["cluster", "resource"])

STALE_NAMESPACE_READS = Counter(
    "lockgate_admission_stale_namespace_reads",
    "Reviews answered with a managed namespace's labels read before, because reading them "
    "again failed (the apiserver too busy to answer in time)", ["cluster"])

T = TypeVar("T")
# Beyond this many entries, expired ones are dropped on the next insert.
CACHE_PRUNE_SIZE = 4096


class TtlCache(Generic[T]):
    """Values kept for `ttl` seconds; concurrent loads of one key share a single call.

    When a load fails, the last value loaded is served instead if it expired at most
    `stale_for` seconds ago and `stale_ok` accepts it (`on_stale` is told): an apiserver too
    busy to answer one read in time must not fail every review that waited on it.
    """

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic, *,
                 stale_for: float = 0.0, stale_ok: Callable[[T], bool] = lambda _: False,
                 on_stale: Callable[[Hashable, float, BaseException], None] | None = None,
                 ) -> None:
        self._ttl, self._clock = ttl, clock
        self._stale_for, self._stale_ok, self._on_stale = stale_for, stale_ok, on_stale
        self._values: dict[Hashable, tuple[float, T]] = {}
        self._loading: dict[Hashable, asyncio.Task[T]] = {}

    async def get(self, key: Hashable, load: Callable[[], Awaitable[T]]) -> T:
        cached = self._values.get(key)
        if cached is not None and cached[0] > self._clock():
            return cached[1]
        task = self._loading.get(key)
        if task is None:
            task = asyncio.create_task(self._load(key, load))
            # Retrieve the error even if every waiter gave up, so it is not reported as lost.
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
            self._loading[key] = task
        # shield: one caller giving up (its review timed out) must not cancel the others' load.
        return await asyncio.shield(task)

    async def _load(self, key: Hashable, load: Callable[[], Awaitable[T]]) -> T:
        try:
            value = await load()
        except Exception as error:
            last = self._values.get(key)
            if last is None or not self._stale_ok(last[1]):
                raise
            age = self._clock() - last[0]  # seconds since it expired
            if age > self._stale_for:
                raise
            if self._on_stale is not None:
                self._on_stale(key, age + self._ttl, error)
            return last[1]
        finally:
            self._loading.pop(key, None)
        if len(self._values) >= CACHE_PRUNE_SIZE:
            now = self._clock() - self._stale_for
            self._values = {k: v for k, v in self._values.items() if v[0] > now}
        self._values[key] = (self._clock() + self._ttl, value)
        return value


@dataclass(frozen=True)
class _ApiResource:
    plural: str
    namespaced: bool


class ClusterLookups:
    """Namespace labels and controlling-owner labels from one cluster, with short caches."""

    def __init__(
        self,
        cluster: str,
        api: client.ApiClient,
        *,
        timeout: float,
        namespace_ttl: float,
        owner_ttl: float,
        max_owner_depth: int,
        namespace_stale_seconds: float = 0.0,
    ) -> None:
        self.cluster = cluster
        self._api = api
        self._timeout = timeout
        self._max_depth = max_owner_depth
        # A namespace's labels and annotations, read together. When a read fails, labels read
        # before that say the namespace is managed are used for `namespace_stale_seconds`:
        # its pods are gated either way (fail-closed); labels saying it is not managed are never
        # used stale, so no pod goes ungated on old news.
        self._namespaces: TtlCache[tuple[dict[str, str], dict[str, str]]] = TtlCache(
            namespace_ttl, stale_for=namespace_stale_seconds,
            stale_ok=lambda found: is_managed_namespace("", found[0]),
            on_stale=self._said_stale)
        self._owners: TtlCache[dict[str, Any]] = TtlCache(owner_ttl)
        # API discovery rarely changes while we run; a kind is looked up once per apiVersion.
        self._resources: dict[str, dict[str, _ApiResource]] = {}
        # (API group, kind) of owners the webhook was refused and said so for: said again only
        # after a read of that kind succeeded in between (the rule was granted, then taken away).
        self._said_not_permitted: set[tuple[str, str]] = set()

    def _said_stale(self, namespace: Hashable, age: float, error: BaseException) -> None:
        STALE_NAMESPACE_READS.labels(self.cluster).inc()
        log.warning("%s: cannot read namespace %s (%r); using its labels read %.1f s ago, "
                    "which say it is managed", self.cluster, namespace, error, age)

    async def namespace_labels(self, namespace: str) -> dict[str, str]:
        return (await self._namespace(namespace))[0]

    async def namespace_annotations(self, namespace: str) -> dict[str, str]:
        """Read with the labels (one GET, one cache entry): a job set's maximum time queued."""
        return (await self._namespace(namespace))[1]

    async def _namespace(self, namespace: str) -> tuple[dict[str, str], dict[str, str]]:
        async def load() -> tuple[dict[str, str], dict[str, str]]:
            found = await self._get(f"/api/v1/namespaces/{namespace}")
            metadata = found.get("metadata") or {}
            return (dict(metadata.get("labels") or {}),
                    dict(metadata.get("annotations") or {}))

        return await self._namespaces.get(namespace, load)

    async def controlling_owners(
        self, namespace: str, pod_metadata: Mapping[str, Any]
    ) -> list[OwnerLabels]:
        """The pod's controller, its controller's controller, ... nearest first.

        An owner that cannot be read ends the walk and is returned with `labels=None`, so the
        decision falls back to the namespace and says why.
        """
        owners: list[OwnerLabels] = []
        metadata = pod_metadata
        for _ in range(self._max_depth):
            reference = _controller_reference(metadata)
            if reference is None:
                break
            kind, name = str(reference.get("kind", "")), str(reference.get("name", ""))
            try:
                found = await self._owner(namespace, reference)
            except _NotPermittedError as refused:
                self._say_not_permitted(kind, refused.not_permitted)
                owners.append(OwnerLabels(kind=kind, name=name, labels=None,
                                          unreadable_reason="403 Forbidden",
                                          not_permitted=refused.not_permitted))
                break
            except Exception as error:  # noqa: BLE001 - any failure: fall back, say why
                reason = _describe(error)
                log.warning("%s: cannot read owner %s/%s in %s: %s", self.cluster, kind, name,
                            namespace, reason)
                owners.append(OwnerLabels(kind=kind, name=name, labels=None,
                                          unreadable_reason=reason))
                break
            self._said_not_permitted.discard((str(reference["apiVersion"]).rpartition("/")[0],
                                              kind))
            metadata = found.get("metadata") or {}
            owners.append(OwnerLabels(kind=kind, name=name,
                                      labels=dict(metadata.get("labels") or {})))
        return owners

    async def _owner(self, namespace: str, reference: Mapping[str, Any]) -> dict[str, Any]:
        api_version, kind = str(reference["apiVersion"]), str(reference["kind"])
        name = str(reference["name"])

        async def load() -> dict[str, Any]:
            resource = await self._resource(api_version, kind)
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            scope = f"/namespaces/{namespace}" if resource.namespaced else ""
            try:
                return await self._get(f"{base}{scope}/{resource.plural}/{name}")
            except ApiException as error:
                if error.status != 403:
                    raise
                group = api_version.rpartition("/")[0]
                raise _NotPermittedError(NotPermitted(
                    group=group, resource=resource.plural,
                    user=refused_user(_status_message(error)))) from error

        key = (api_version, kind, namespace, name, reference.get("uid"))
        return await self._owners.get(key, load)

    def _say_not_permitted(self, kind: str, refused: NotPermitted) -> None:
        """Once per owner kind, what to grant; every time, the metric."""
        OWNERS_NOT_PERMITTED.labels(self.cluster, refused.spelled).inc()
        key = (refused.group, kind)
        if key in self._said_not_permitted:
            return
        self._said_not_permitted.add(key)
        log.warning("%s", owner_rbac_hint(cluster=self.cluster, kind=kind, refused=refused))

    async def _resource(self, api_version: str, kind: str) -> _ApiResource:
        kinds = self._resources.get(api_version)
        if kinds is None or kind not in kinds:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            listing = await self._get(path)
            kinds = {
                str(entry["kind"]): _ApiResource(plural=str(entry["name"]),
                                                 namespaced=bool(entry.get("namespaced")))
                for entry in listing.get("resources") or []
                if "/" not in str(entry.get("name", ""))  # skip subresources such as pods/log
            }
            self._resources[api_version] = kinds
        if kind not in kinds:
            raise LookupError(f"the API has no kind {kind} in {api_version}")
        return kinds[kind]

    async def _get(self, path: str) -> dict[str, Any]:
        async with asyncio.timeout(self._timeout):
            found = await self._api.call_api(
                path, "GET",
                header_params={"Accept": "application/json"},
                response_types_map={200: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=self._timeout,
            )
        if not isinstance(found, dict):
            raise LookupError(f"GET {path} returned no object")
        return found


class _NotPermittedError(Exception):
    """The webhook's RBAC does not let it get the owner's kind."""

    def __init__(self, not_permitted: NotPermitted) -> None:
        super().__init__(f"may not get {not_permitted.spelled}")
        self.not_permitted = not_permitted


def _status_message(error: ApiException) -> str:
    """The message of the Status an apiserver answered with, or the raw body."""
    body = error.body.decode(errors="replace") if isinstance(error.body, bytes) else str(
        error.body or "")
    try:
        status = json.loads(body)
    except ValueError:
        return body
    return str(status.get("message", body)) if isinstance(status, dict) else body


def _controller_reference(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for reference in metadata.get("ownerReferences") or []:
        if isinstance(reference, Mapping) and reference.get("controller") is True and all(
            reference.get(field) for field in ("apiVersion", "kind", "name")
        ):
            return reference
    return None


def _describe(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"{error.status} {error.reason}"
    if isinstance(error, TimeoutError):
        return "timed out"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
