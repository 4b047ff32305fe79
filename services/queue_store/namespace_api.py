"""The admin API's ephemeral namespaces: create (idempotent), list, describe, new token.

    POST /api/v1/namespaces             {"queue", "jobset", "cluster", "ttl_seconds"?,
                                         "max_queued"?: {"seconds", "action"?: fail|delete}}
                                        -> 201 created, 200 when it existed (a retry):
                                        {"namespace": record, "token", "token_expires_at",
                                         "kubeconfig"}
    GET  /api/v1/namespaces?queue=&jobset=&cluster=&state=&offset=&limit=
                                        {"namespaces": [record, ...], "total": N}
    GET  /api/v1/namespaces/{cluster}/{name}   record + "transitions" + "allowed_kinds"; 404
    POST /api/v1/namespaces/{cluster}/{name}/token   a fresh coordinator token; 409 unless active

Creation order, so nothing is made unrecorded: the cluster is asked first (unreachable: 503,
nothing written); the record is written (state active, transition "created"); then the objects
are made (`namespaces.NamespaceKeeper.ensure`). A failure after the record is a 503 that says
to retry: the retry, or else queue-store's reconciler, finishes the namespace. The answer waits
for the cluster's Queue copy to bind the namespace (`QueueSync.settled`), so the coordinator's
first pod is admitted.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from aiohttp import web
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from lockgate import namespace_access as access
from lockgate.labels import InvalidLabelError, validate_label_value, validate_queue_name
from lockgate.max_queued import JobSetMaxQueued
from lockgate.namespaces import NamespaceRecord, NamespaceState
from lockgate_adapters import job_store, namespace_store
from queue_store.admin_api import ApiError, CopiesSettled, caller_of, json_object, no_copies
from queue_store.namespaces import (
    ClusterUnavailableError,
    CoordinatorCredentials,
    NamespaceKeeper,
    NamespaceTakenError,
    refusal_of,
)

log = logging.getLogger(__name__)

MAX_TTL_SECONDS = 366 * 86400
MAX_NAMESPACES_PAGE = 10_000


class NamespaceApi:
    def __init__(self, *, pool: asyncpg.Pool, keeper: NamespaceKeeper, name_prefix: str,
                 copies_settled: CopiesSettled = no_copies) -> None:
        self.pool, self.keeper, self.prefix = pool, keeper, name_prefix
        self.copies_settled = copies_settled

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/api/v1/namespaces", self.create)
        router.add_get("/api/v1/namespaces", self.list)
        router.add_get("/api/v1/namespaces/{cluster}/{name}", self.describe)
        router.add_post("/api/v1/namespaces/{cluster}/{name}/token", self.token)

    def _cluster(self, cluster: object) -> str:
        if not isinstance(cluster, str) or not cluster:
            raise ApiError(400, "cluster is required")
        if cluster not in self.keeper.apis:
            known = ", ".join(self.keeper.clusters) or (
                "none: queue-store has no namespace-keeper kubeconfigs "
                "(LOCKGATE_QUEUE_STORE_NAMESPACE_CLUSTERS)")
            raise ApiError(404, f"unknown cluster {cluster!r}; ephemeral namespaces can be "
                                f"created in: {known}")
        return cluster

    async def create(self, request: web.Request) -> web.Response:
        body = await json_object(request)
        unknown = set(body) - {"queue", "jobset", "cluster", "ttl_seconds", "max_queued"}
        if unknown:
            raise ApiError(400, f"unknown fields {sorted(unknown)}; give queue, jobset, "
                                "cluster and optionally ttl_seconds and max_queued")
        queue, jobset, ttl = body.get("queue"), body.get("jobset"), body.get("ttl_seconds")
        if not isinstance(queue, str) or not isinstance(jobset, str) or not jobset:
            raise ApiError(400, "queue and jobset are required strings")
        try:
            validate_queue_name(queue)
            validate_label_value("lockgate.io/jobset", jobset)
        except InvalidLabelError as error:
            raise ApiError(400, str(error)) from error
        if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool)
                                or not 0 < ttl <= MAX_TTL_SECONDS):
            raise ApiError(400, f"ttl_seconds must be a whole number of seconds between 1 and "
                                f"{MAX_TTL_SECONDS}")
        max_queued = _max_queued(body.get("max_queued"))
        cluster = self._cluster(body.get("cluster"))
        async with self.pool.acquire() as connection:
            spec = await job_store.get_queue(connection, queue)
        if spec is None:
            raise ApiError(404, f"queue {queue!r} does not exist; create it with "
                                f"'lockgate queue create {queue}'")
        if spec.cordoned:
            raise ApiError(409, f"queue {queue!r} is cordoned and admits no new pods; "
                                f"uncordon it with 'lockgate queue uncordon {queue}'")
        name = access.namespace_name(queue=queue, jobset=jobset, prefix=self.prefix)
        async with self.pool.acquire() as connection:
            existing = await namespace_store.get(connection, cluster, name)
        if existing is not None and existing.state is not NamespaceState.ACTIVE:
            raise ApiError(409, f"job set {jobset!r} of queue {queue!r} already had namespace "
                                f"{name} in cluster {cluster}, now {existing.state}"
                                f"{' (' + existing.trigger + ')' if existing.trigger else ''}; "
                                "ephemeral namespaces are not reused: use a new job set name")
        try:
            if existing is None:
                await self.keeper.check_free(cluster=cluster, name=name, queue=queue,
                                             jobset=jobset)
            async with self.pool.acquire() as connection:
                record, created = await namespace_store.create_or_get(
                    connection, cluster=cluster, name=name, queue=queue, jobset=jobset,
                    service_account=access.COORDINATOR, ttl_seconds=ttl,
                    max_queued=None if max_queued is None else max_queued.model_dump(mode="json"))
            await self.keeper.ensure(record, spec)
            credentials = await self.keeper.credentials(record, record.ttl_seconds)
            # The namespace may use its queue by name once the cluster's Queue copy lists it.
            await self.copies_settled()
        except ClusterUnavailableError as error:
            raise ApiError(503, str(error)) from error
        except NamespaceTakenError as error:
            raise ApiError(409, str(error)) from error
        except ApiException as error:
            raise ApiError(502, f"cluster {cluster} refused to set up namespace {name}: "
                                f"{refusal_of(error)}; check lockgate-namespace-keeper's RBAC "
                                "and policies (k8s/base), then retry") from error
        log.info("ephemeral namespace %s/%s %s for queue %s, job set %s (ttl %s) by %s",
                 cluster, name, "created" if created else "confirmed", queue, jobset,
                 record.ttl_seconds, caller_of(request))
        return web.json_response(_with_credentials(record, credentials),
                                 status=201 if created else 200)

    async def list(self, request: web.Request) -> web.Response:
        query = request.query
        state = query.get("state") or None
        if state is not None and state not in {s.value for s in NamespaceState}:
            raise ApiError(400, f"unknown state {state!r}: use one of "
                                + ", ".join(s.value for s in NamespaceState))
        filters: dict[str, Any] = {
            "queue": query.get("queue") or None, "jobset": query.get("jobset") or None,
            "cluster": query.get("cluster") or None,
            "state": None if state is None else NamespaceState(state)}
        try:
            offset = int(query.get("offset", "0"))
            limit = int(query["limit"]) if query.get("limit") else None
        except ValueError as error:
            raise ApiError(400, "offset and limit must be integers") from error
        if offset < 0 or (limit is not None and not 1 <= limit <= MAX_NAMESPACES_PAGE):
            raise ApiError(400, f"offset must be 0 or more, limit between 1 and "
                                f"{MAX_NAMESPACES_PAGE}")
        async with self.pool.acquire() as connection:
            records = await namespace_store.list_records(connection, **filters, offset=offset,
                                                         limit=limit)
            total = await namespace_store.count_records(connection, **filters)
        return web.json_response({"namespaces": [namespace_store.record_json(r) for r in records],
                                  "total": total})

    async def _record(self, request: web.Request) -> NamespaceRecord:
        cluster, name = request.match_info["cluster"], request.match_info["name"]
        async with self.pool.acquire() as connection:
            record = await namespace_store.get(connection, cluster, name)
        if record is None:
            raise ApiError(404, f"no ephemeral namespace {name} in cluster {cluster}; "
                                "see 'lockgate namespace list'")
        return record

    async def describe(self, request: web.Request) -> web.Response:
        record = await self._record(request)
        async with self.pool.acquire() as connection:
            history = await namespace_store.transitions(connection, record.cluster,
                                                      record.name)
            spec = await job_store.get_queue(connection, record.queue)
        return web.json_response({
            **namespace_store.record_json(record),
            "allowed_kinds": list(spec.effective_allowed_kinds) if spec else None,
            "transitions": [namespace_store.transition_json(t) for t in history],
        })

    async def token(self, request: web.Request) -> web.Response:
        record = await self._record(request)
        if record.state is not NamespaceState.ACTIVE:
            raise ApiError(409, f"namespace {record.name} in cluster {record.cluster} is "
                                f"{record.state}: no new tokens")
        self._cluster(record.cluster)
        try:
            credentials = await self.keeper.credentials(record, record.ttl_seconds)
            # The namespace may use its queue by name once the cluster's Queue copy lists it.
            await self.copies_settled()
        except ClusterUnavailableError as error:
            raise ApiError(503, str(error)) from error
        log.info("coordinator token for %s/%s issued to %s", record.cluster, record.name,
                 caller_of(request))
        return web.json_response(_with_credentials(record, credentials))


def _max_queued(value: object) -> JobSetMaxQueued | None:
    """The job set's maximum time queued, if given; a 400 that says what to send otherwise."""
    if value is None:
        return None
    try:
        return JobSetMaxQueued.model_validate(value)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'max_queued'}: {e['msg']}"
                             for e in error.errors())
        raise ApiError(400, f"max_queued must be {{\"seconds\": 1 to {MAX_TTL_SECONDS}, "
                            f"\"action\": \"fail\" or \"delete\" (optional)}}: {problems}"
                       ) from error


def _with_credentials(record: NamespaceRecord,
                      credentials: CoordinatorCredentials) -> dict[str, Any]:
    return {
        "namespace": namespace_store.record_json(record),
        "token": credentials.token,
        "token_expires_at": (credentials.expires_at.isoformat()
                             if credentials.expires_at else None),
        "kubeconfig": credentials.kubeconfig,
    }
