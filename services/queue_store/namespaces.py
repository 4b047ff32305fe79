"""Ephemeral namespaces in the worker clusters: making them, and keeping their Roles in step
with their queue's allowed kinds.

Why in queue-store: it owns the queues and the namespace records, so a change of a queue's
allowed kinds and the Roles that enforce them are decided in one place. It acts in each cluster
as the least-privilege identity `lockgate-namespace-keeper` (k8s/base/namespace-keeper-rbac.yaml,
docs/security.md), never as admin.

`ensure` is idempotent: it creates what is missing and corrects what differs (namespace labels
and the allowed-kinds annotation, the coordinator's ServiceAccount, Role and RoleBinding). The
reconciler runs it for every active namespace at start, moments after any change to queues or
namespace records (LISTEN on the change feed) and every `resync_seconds`, so a crash half-way
through a creation or a Role update converges once queue-store runs again.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from lockgate import namespace_access as access
from lockgate.labels import why_not_served
from lockgate.max_queued import JobSetMaxQueued, stamped_annotations
from lockgate.namespaces import NamespaceRecord, NamespaceState
from lockgate.queues import QueueSpec
from lockgate_adapters import job_store, namespace_store
from lockgate_adapters.postgres import watch_changes

log = logging.getLogger(__name__)

RECONCILED = Counter("lockgate_namespace_reconciles", "Ephemeral namespace reconciliations, by "
                     "cluster and outcome", ["cluster", "outcome"])
REQUEST_TIMEOUT_SECONDS = 10.0
UNSERVED_CHECK_SECONDS = 3.0  # a queue's creation waits this long at most for the check
MERGE_PATCH = "application/merge-patch+json"


class ClusterUnavailableError(Exception):
    """The cluster's apiserver cannot be reached or answers with a server error (retry)."""


def refusal_of(error: ApiException) -> str:
    """The apiserver's own words for a refusal (its Status message), shortened."""
    try:
        message = json.loads(error.body or "{}").get("message") or error.reason
    except (ValueError, AttributeError):
        message = error.reason
    return f"{error.status} {message}"[:500]


class NamespaceTakenError(Exception):
    """A namespace of that name exists and lockgate did not make it for this job set."""


@dataclass(frozen=True)
class CoordinatorCredentials:
    token: str
    expires_at: datetime | None
    kubeconfig: dict[str, Any]


def _unavailable(cluster: str, error: BaseException) -> ClusterUnavailableError:
    if isinstance(error, ApiException):
        detail = f"{error.status} {error.reason}"
    else:
        detail = f"{type(error).__name__}: {error}".rstrip(": ")
    return ClusterUnavailableError(f"cluster {cluster} is unreachable or failing ({detail}); "
                                   "retry the same request once it is back")


def _is_outage(error: BaseException) -> bool:
    if isinstance(error, ApiException):
        return error.status == 0 or error.status >= 500 or error.status == 429
    return isinstance(error, aiohttp.ClientError | OSError | asyncio.TimeoutError)


class NamespaceKeeper:
    """Kubernetes side of ephemeral namespaces, one API client per cluster."""

    def __init__(self, *, apis: Mapping[str, client.ApiClient], extra_labels: Mapping[str, str],
                 token_seconds: int, create_any: bool) -> None:
        self.apis = apis
        self._extra_labels = dict(extra_labels)
        self._token_seconds = token_seconds
        self._create_any = create_any

    @property
    def clusters(self) -> list[str]:
        return sorted(self.apis)

    async def check_free(self, *, cluster: str, name: str, queue: str, jobset: str) -> None:
        """Before recording: the cluster answers, and `name` is free or already ours."""
        core = client.CoreV1Api(self.apis[cluster])
        try:
            found = await core.read_namespace(name, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except ApiException as error:
            if error.status == 404:
                return
            if _is_outage(error):
                raise _unavailable(cluster, error) from error
            raise
        except Exception as error:
            if _is_outage(error):
                raise _unavailable(cluster, error) from error
            raise
        obj = self.apis[cluster].sanitize_for_serialization(found)
        if not access.is_lockgate_namespace(obj, queue=queue, jobset=jobset):
            raise NamespaceTakenError(
                f"namespace {name} already exists in cluster {cluster} and was not made by "
                f"lockgate for queue {queue}, job set {jobset}; delete it or use another job set")

    async def unserved_namespaces(self, spec: QueueSpec) -> list[str]:
        """Warnings for the namespaces `spec` binds by name that lockgate's webhook will not
        serve (`lockgate.labels.why_not_served`), so pods there would skip the queue.

        The check: the namespace's labels, read as namespace-keeper in each cluster it has a
        client for (a binding to "*" means all of them; other clusters are not checked),
        against lockgate.io/managed=true and `extra_labels`
        (LOCKGATE_QUEUE_STORE_NAMESPACE_LABELS), which are what the webhook registration's
        namespaceSelector asks for (ephemeral namespaces rely on that already). Selector
        bindings are not checked. A cluster that does not answer in time gives a warning that
        says so, never an error: the queue is made anyway.
        """
        checks = [(cluster, name) for binding in spec.namespaces for name in binding.names
                  for cluster in (self.clusters if binding.cluster == "*"
                                  else [binding.cluster] if binding.cluster in self.apis else [])]
        found = await asyncio.gather(*(self._labels_of(cluster, name)
                                       for cluster, name in checks), return_exceptions=True)
        warnings = []
        for (cluster, name), labels in zip(checks, found, strict=True):
            if isinstance(labels, BaseException):
                warnings.append(f"could not check whether lockgate's webhook serves namespace "
                                f"{cluster}/{name} ({type(labels).__name__}: {labels})")
                continue
            why = why_not_served(cluster, name, labels, self._extra_labels)
            if why is not None:
                warnings.append(why)
        return warnings

    async def _labels_of(self, cluster: str, name: str) -> dict[str, str] | None:
        core = client.CoreV1Api(self.apis[cluster])
        try:
            found = await core.read_namespace(name, _request_timeout=UNSERVED_CHECK_SECONDS)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return dict(found.metadata.labels or {})

    async def ensure(self, record: NamespaceRecord, spec: QueueSpec) -> None:
        """Create what is missing and correct what differs; raises ClusterUnavailableError."""
        try:
            await self._ensure(record, spec)
        except ClusterUnavailableError:
            raise
        except Exception as error:
            if _is_outage(error):
                raise _unavailable(record.cluster, error) from error
            raise

    async def _ensure(self, record: NamespaceRecord, spec: QueueSpec) -> None:
        api = self.apis[record.cluster]
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        name, kinds = record.name, spec.effective_allowed_kinds
        wanted_ns = access.namespace_object(
            name=name, queue=record.queue, jobset=record.jobset, kinds=kinds,
            extra_labels=self._extra_labels,
            extra_annotations=stamped_annotations(
                None if record.max_queued is None
                else JobSetMaxQueued.model_validate(record.max_queued)))
        timeout = {"_request_timeout": REQUEST_TIMEOUT_SECONDS}
        try:
            current = api.sanitize_for_serialization(
                await core.read_namespace(name, **timeout))
        except ApiException as error:
            if error.status != 404:
                raise
            try:
                await core.create_namespace(wanted_ns, **timeout)
            except ApiException as conflict:
                if conflict.status != 409:
                    raise
                # A concurrent retry made it first: the next pass checks it is ours.
            log.info("namespace %s/%s created for queue %s, job set %s", record.cluster, name,
                     record.queue, record.jobset)
        else:
            if not access.is_lockgate_namespace(current, queue=record.queue,
                                                jobset=record.jobset):
                raise NamespaceTakenError(f"namespace {name} in cluster {record.cluster} is not "
                                          "lockgate's (its labels changed or it was replaced)")
            meta = current.get("metadata") or {}
            if (current.get("status") or {}).get("phase") == "Terminating":
                return  # being collected: nothing to correct
            wanted_meta = wanted_ns["metadata"]
            if any((meta.get(part) or {}).get(k) != v for part in ("labels", "annotations")
                   for k, v in wanted_meta[part].items()):
                await core.patch_namespace(
                    name, {"metadata": {"labels": wanted_meta["labels"],
                                        "annotations": wanted_meta["annotations"]}},
                    _content_type=MERGE_PATCH, **timeout)
                log.info("namespace %s/%s: labels and allowed kinds updated (%s)",
                         record.cluster, name, ",".join(kinds))
        # The coordinator's account, and `default` too: pods are refused until their namespace
        # has it, and kube-controller-manager may not have made it yet when the token is handed.
        for account in (access.service_account_object(name),
                        {"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": "default", "namespace": name}}):
            try:
                await core.create_namespaced_service_account(name, account, **timeout)
            except ApiException as error:
                if error.status != 409:
                    raise
        wanted_role = access.role_object(name, kinds, create_any=self._create_any)
        try:
            role = api.sanitize_for_serialization(
                await rbac.read_namespaced_role(access.COORDINATOR, name, **timeout))
        except ApiException as error:
            if error.status != 404:
                raise
            try:
                await rbac.create_namespaced_role(name, wanted_role, **timeout)
            except ApiException as conflict:
                if conflict.status != 409:
                    raise
                await rbac.patch_namespaced_role(access.COORDINATOR, name,
                                                 {"rules": wanted_role["rules"]},
                                                 _content_type=MERGE_PATCH, **timeout)
        else:
            if role.get("rules") != wanted_role["rules"]:
                await rbac.patch_namespaced_role(access.COORDINATOR, name,
                                                 {"rules": wanted_role["rules"]},
                                                 _content_type=MERGE_PATCH, **timeout)
                log.info("namespace %s/%s: Role %s now allows %s", record.cluster, name,
                         access.COORDINATOR, ",".join(kinds))
        try:
            await rbac.create_namespaced_role_binding(
                name, access.role_binding_object(name), **timeout)
        except ApiException as error:
            if error.status != 409:
                raise

    async def credentials(self, record: NamespaceRecord,
                          ttl_seconds: int | None) -> CoordinatorCredentials:
        """A fresh token of the coordinator's ServiceAccount (TokenRequest), bounded by the
        configured lifetime and by the namespace's TTL, and a kubeconfig holding it."""
        api = self.apis[record.cluster]
        seconds = max(600, min(self._token_seconds, ttl_seconds or self._token_seconds))
        try:
            answer = await client.CoreV1Api(api).create_namespaced_service_account_token(
                access.COORDINATOR, record.name,
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                 "spec": {"expirationSeconds": seconds}},
                _request_timeout=REQUEST_TIMEOUT_SECONDS)
        except Exception as error:
            if _is_outage(error):
                raise _unavailable(record.cluster, error) from error
            raise
        token = answer.status.token
        kubeconfig = access.coordinator_kubeconfig(
            cluster=record.cluster, server=api.configuration.host, ca_data=_ca_data(api),
            namespace=record.name, token=token)
        return CoordinatorCredentials(token=token,
                                      expires_at=answer.status.expiration_timestamp,
                                      kubeconfig=kubeconfig)

    async def close(self) -> None:
        for api in self.apis.values():
            await api.close()


def _ca_data(api: client.ApiClient) -> str | None:
    path = api.configuration.ssl_ca_cert
    if not path:
        return None
    return base64.b64encode(Path(path).read_bytes()).decode()


class RoleReconciler:
    """Keeps every active ephemeral namespace as `NamespaceKeeper.ensure` wants it."""

    def __init__(self, *, pool: asyncpg.Pool, dsn: str, keeper: NamespaceKeeper,
                 resync_seconds: float) -> None:
        self._pool, self._dsn, self._keeper = pool, dsn, keeper
        self._resync = resync_seconds
        self._changed = asyncio.Event()

    async def run(self, stopping: asyncio.Event) -> None:
        listener = asyncio.create_task(self._listen(stopping), name="namespaces: listen")
        try:
            while not stopping.is_set():
                self._changed.clear()
                failed = await self.reconcile_once()
                wait = min(self._resync, 2.0) if failed else self._resync
                waiter = asyncio.create_task(self._changed.wait())
                stopper = asyncio.create_task(stopping.wait())
                try:
                    await asyncio.wait((waiter, stopper), timeout=wait,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (waiter, stopper):
                        task.cancel()
                await asyncio.sleep(0.05)  # a burst of changes costs one pass
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def reconcile_once(self) -> int:
        """One pass; returns how many namespaces failed (retried soon)."""
        try:
            async with self._pool.acquire() as connection:
                records = await namespace_store.list_records(connection,
                                                           state=NamespaceState.ACTIVE)
                queues = {q.name: q for q in await job_store.list_queues(connection)}
        except Exception as error:  # noqa: BLE001 - Postgres down: retried at the next pass
            log.warning("namespaces: cannot read records: %r", error)
            return 1
        failed = 0
        for record in records:
            spec = queues.get(record.queue)
            if spec is None or record.cluster not in self._keeper.apis:
                continue  # queue deleted: the collector's business; cluster not ours
            try:
                await self._keeper.ensure(record, spec)
            except Exception as error:  # noqa: BLE001 - one namespace never holds up the others
                failed += 1
                RECONCILED.labels(record.cluster, "failed").inc()
                log.warning("namespaces: %s/%s: %s", record.cluster, record.name, error)
                continue
            RECONCILED.labels(record.cluster, "ok").inc()
        return failed

    async def _listen(self, stopping: asyncio.Event) -> None:
        """Wake the loop on a change to `queues` or `ephemeral_namespaces`."""
        await watch_changes(self._dsn, frozenset({"queues", namespace_store.TABLE}),
                            self._changed, stopping, name="namespaces",
                            retry_seconds=min(self._resync, 5.0))
