"""The admin HTTP API: queues (create, update, delete, list) and read-only job views.

Why in queue-store: queues must exist before pods are admitted to them, and queue-store already
owns these tables and their change-feed rules. The `lockgate` CLI is the usual client.

    GET    /api/v1/queues              {"queues": [queue, ...]}
    POST   /api/v1/queues              queue spec -> 201 queue; 409 if it exists
    GET    /api/v1/queues/{name}       queue; 404
    PUT    /api/v1/queues/{name}       whole spec (omitted fields take defaults) -> queue; 404
    PATCH  /api/v1/queues/{name}       JSON merge patch (RFC 7386; null removes) -> queue; 404
    DELETE /api/v1/queues/{name}       204; 404
    GET    /api/v1/jobs?queue=&state=&cluster=&all=&limit=   {"jobs", "total", "hints"}
    GET    /api/v1/status, /api/v1/explain/..., /api/v1/jobsets...   see queue_store.admin_views

A queue is {"name", "priority_factor", "weight" (= 1 / priority_factor, read-only), "cordoned",
"resource_limits" (Kubernetes quantities), "namespaces" (who may use it: [{"cluster": name
or "*", "names": [...], "selector": {"matchLabels": {...}, "matchExpressions": [...]}}];
empty: nobody), "max_queued" ({"seconds": N, "action": "fail" | "delete"} or null: how long
its pods may wait gated), "group_timeout_seconds" and "group_timeout_action" (pod groups),
"allowed_kinds" (what its ephemeral namespaces may create, e.g. ["pods", "deployments.apps"];
omitted or null: the default list, and "allowed_kinds_default" says so), "created_at",
"updated_at" (read-only), "parent" (the queue tree: the queue it hangs from; null: a child
of the root), "guarantee" (Kubernetes quantities: what it, or its subtree, gets when it asks;
its limit is "resource_limits")}. Every write is checked against the queue tree's rules
(lockgate.queue_tree.check_queue_definitions): an unknown parent, a cycle, guarantees that do not
fit in the parent's, namespaces bound to a queue with child queues, a child under a queue that
still has pods, or deleting a queue with child queues is a 400 naming the queue and the reason.
A merge patch replaces "namespaces" and "allowed_kinds" whole.
Ephemeral namespaces: see `queue_store.namespace_api`. Errors are
{"error": message, "details": [...]}, with 400 for invalid input.

Every call carries `Authorization: Bearer <token>` (see `lockgate_adapters.admin_tokens`): none
or an unknown token is 401, a read-only token on a call that changes something is 403. Each
change is logged with the name of the token that made it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
from aiohttp import web
from pydantic import ValidationError

from lockgate.ingest import JobRow
from lockgate.jobs import JobState
from lockgate.queue_tree import QueueTreeError, check_queue_definitions
from lockgate.queues import QueueSpec
from lockgate_adapters import job_store
from lockgate_adapters.admin_tokens import TokenEntry, TokenVerifier
from lockgate_adapters.postgres import AnyConnection, is_retryable_postgres_error
from queue_store import admin_views, openapi, web_ui
from queue_store.leader import SchedulerLeader

log = logging.getLogger(__name__)

READ_ONLY_QUEUE_FIELDS = frozenset({"weight", "created_at", "updated_at",
                                    "allowed_kinds_default", "warnings"})
EDITABLE_QUEUE_FIELDS = ("priority_factor", "cordoned", "resource_limits", "namespaces",
                         "max_queued", "group_timeout_seconds", "group_timeout_action",
                         "allowed_kinds", "parent", "guarantee")
MAX_JOBS_LISTED = 10_000

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
READING_METHODS = frozenset({"GET", "HEAD"})
# Who made the call: the token's holder, set by the authentication middleware.
CALLER = web.RequestKey("caller", TokenEntry)
HOW_TO_AUTHENTICATE = ("send 'Authorization: Bearer <token>'; the lockgate CLI reads the token "
                       "from $LOCKGATE_TOKEN, --token-file or $LOCKGATE_TOKEN_FILE")


class ApiError(Exception):
    def __init__(self, status: int, message: str, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.details = status, message, details or []


def queue_json(spec: QueueSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "priority_factor": spec.priority_factor,
        "weight": spec.weight,
        "cordoned": spec.cordoned,
        "resource_limits": dict(spec.resource_limits),
        "parent": spec.parent,
        "guarantee": dict(spec.guarantee),
        "namespaces": spec.namespaces_json(),
        "max_queued": None if spec.max_queued is None else spec.max_queued.model_dump(),
        "group_timeout_seconds": spec.group_timeout_seconds,
        "group_timeout_action": spec.group_timeout_action.value,
        "allowed_kinds": list(spec.effective_allowed_kinds),
        "allowed_kinds_default": spec.allowed_kinds is None,
        "created_at": spec.created_at.isoformat() if spec.created_at else None,
        "updated_at": spec.updated_at.isoformat() if spec.updated_at else None,
    }


def check_tree(queues: list[QueueSpec], queues_with_pods: set[str]) -> None:
    """The queue tree's rules on every queue as a write would leave them (raises
    QueueTreeError, which job_store turns into QueueTreeRefused: a 400). The fleet is not known
    here (nodes come and go, and autoscalers add them): the leader says in status when the
    root's guarantees do not fit in the fleet of the moment."""
    check_queue_definitions(queues, queues_with_pods=queues_with_pods)


def check_delete(name: str, queues: list[QueueSpec], queues_with_pods: set[str]) -> None:
    """`check_tree` for deleting `name` (`queues`: every queue but it): a queue with child
    queues cannot go, as its children would have no parent."""
    children = sorted(queue.name for queue in queues if queue.parent == name)
    if children:
        raise QueueTreeError(f"queue {name!r} has child queues ({', '.join(children)}): "
                             f"delete them, or move them to another parent, first")
    check_tree(queues, queues_with_pods)


def job_json(row: JobRow) -> dict[str, Any]:
    return {
        "cluster": row.cluster, "uid": row.uid, "namespace": row.namespace, "name": row.name,
        "queue": row.queue, "jobset": row.jobset, "priority": row.priority,
        "requests": dict(row.requests), "state": row.state.value, "node_name": row.node_name,
        "created_at": row.created_at.isoformat(),
        "state_changed_at": row.state_changed_at.isoformat(),
        "decision_id": row.decision_id, "release_attempts": row.release_attempts,
        "last_reason": row.last_reason,
        "skipped_gate": row.skipped_gate,  # lockgate never gated it (lockgate.observing)
    }


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, null removes, the rest replaces."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def spec_from_body(name: str, body: dict[str, Any]) -> QueueSpec:
    """A QueueSpec from a request body, refusing a name that contradicts the URL."""
    if body.get("name", name) != name:
        raise ApiError(400, f"the body names queue {body['name']!r} but the URL names {name!r}")
    fields = {k: v for k, v in body.items() if k not in READ_ONLY_QUEUE_FIELDS}
    return _validated(lambda: QueueSpec.model_validate({**fields, "name": name}))


def _validated(build: Callable[[], QueueSpec]) -> QueueSpec:
    try:
        return build()
    except ValidationError as error:
        details = [_describe(e) for e in error.errors()]
        raise ApiError(400, "invalid queue: " + "; ".join(details), details) from error


def _describe(error: Any) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    message = str(error.get("msg", "invalid"))
    message = message.removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


# Warnings for a queue just written: the namespaces it binds that lockgate's webhook will not
# serve (NamespaceKeeper.unserved_namespaces).
UnservedNamespaces = Callable[[QueueSpec], Awaitable[list[str]]]


async def no_check(_: QueueSpec) -> list[str]:
    """No cluster clients to read namespaces with: nothing checked."""
    return []


# Waits until the Queue copies in the clusters hold a change just committed (QueueSync.settled),
# so a pod created right after `lockgate queue create` is judged by the new queue.
CopiesSettled = Callable[[], Awaitable[None]]


async def no_copies() -> None:
    """No copies kept (no queue-sync clusters): nothing to wait for."""


class AdminApi:
    """The aiohttp application over a Postgres pool."""

    def __init__(self, pool: asyncpg.Pool, tokens: TokenVerifier,
                 extensions: Sequence[Callable[[web.Application], None]] = (),
                 leader: SchedulerLeader | None = None,
                 copies_settled: CopiesSettled = no_copies,
                 unserved: UnservedNamespaces = no_check) -> None:
        self.pool, self.tokens = pool, tokens
        self.copies_settled = copies_settled
        self.unserved = unserved
        # Whom `status` and `explain` ask why pods wait (no instance: the reasons are
        # unavailable, and say so).
        self.leader = leader or SchedulerLeader(())
        # Routes of other modules (admin_collection, namespace_api, admin_views), behind the
        # same auth and errors.
        self.extensions = tuple(extensions)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._authenticate, self._errors])
        app.router.add_get("/api/v1/queues", self.list_queues)
        app.router.add_post("/api/v1/queues", self.create_queue)
        app.router.add_get("/api/v1/queues/{name}", self.get_queue)
        app.router.add_put("/api/v1/queues/{name}", self.replace_queue)
        app.router.add_patch("/api/v1/queues/{name}", self.patch_queue)
        app.router.add_delete("/api/v1/queues/{name}", self.delete_queue)
        app.router.add_get("/api/v1/jobs", self.list_jobs)
        for register in self.extensions:
            register(app)
        admin_views.register(app, self.pool, job_json=job_json, leader=self.leader)
        web_ui.register(app)
        app.router.add_get(openapi.PATH, self.openapi_document)
        return app

    async def openapi_document(self, _: web.Request) -> web.Response:
        return web.json_response(openapi.document())

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in READING_METHODS and (web_ui.is_public(request.path)
                                                  or request.path == openapi.PATH):
            return await handler(request)  # no data in them: the UI's files, the API's shape
        response = await self._authenticated(request, handler)
        # Answers carry queue and pod data: no cache keeps them (a shared browser, a proxy).
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    async def _authenticated(self, request: web.Request,
                             handler: Handler) -> web.StreamResponse:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _unauthorized(f"authentication required: {HOW_TO_AUTHENTICATE}",
                                 error_code=None)
        holder = self.tokens.identify(token.strip())
        if holder is None:
            log.warning("admin API: %s %s with an unknown token from %s", request.method,
                        request.path, request.remote)
            return _unauthorized("the token is not valid (unknown, or revoked); "
                                 + HOW_TO_AUTHENTICATE, error_code="invalid_token")
        if request.method not in READING_METHODS and not holder.role.may_write:
            log.warning("admin API: %s %s refused to read-only token %r", request.method,
                        request.path, holder.name)
            return _error(403, f"token {holder.name!r} is {holder.role.value}: "
                               f"{request.method} {request.path} needs an admin token")
        request[CALLER] = holder
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as error:
            return _error(error.status, error.message, error.details)
        except job_store.QueueNotFoundError as error:
            return _error(404, str(error))
        except job_store.QueueExistsError as error:
            return _error(409, str(error))
        except job_store.QueueTreeRefused as error:
            return _error(400, f"invalid queue tree: {error}")
        except web.HTTPException:
            raise
        except Exception as error:
            if is_retryable_postgres_error(error):
                log.warning("admin API: postgres unavailable: %s", error)
                return _error(503, f"postgres is unavailable, retry later ({error})")
            log.exception("admin API: %s %s failed", request.method, request.path)
            return _error(500, f"internal error: {type(error).__name__}")

    async def list_queues(self, _: web.Request) -> web.Response:
        async with self.pool.acquire() as connection:
            queues = await job_store.list_queues(connection)
        return web.json_response({"queues": [queue_json(q) for q in queues]})

    async def get_queue(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with self.pool.acquire() as connection:
            spec = await job_store.get_queue(connection, name)
        if spec is None:
            raise job_store.QueueNotFoundError(name)
        return web.json_response(queue_json(spec))

    async def create_queue(self, request: web.Request) -> web.Response:
        body = await json_object(request)
        if not isinstance(body.get("name"), str):
            raise ApiError(400, "invalid queue: name: a queue name is required")
        spec = spec_from_body(body["name"], body)
        async with self.pool.acquire() as connection:
            created = await job_store.create_queue(connection, spec, check=check_tree)
        await self.copies_settled()
        log.info("queue %s created (priority factor %s) by %s", created.name,
                 created.priority_factor, caller_of(request))
        return web.json_response(await self._with_warnings(created), status=201)

    async def _with_warnings(self, spec: QueueSpec) -> dict[str, Any]:
        """The queue as written, with "warnings": its bound namespaces the webhook will not
        serve, whose pods would skip the queue."""
        return {**queue_json(spec), "warnings": await self.unserved(spec)}

    async def replace_queue(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        replacement = spec_from_body(name, await json_object(request))
        return await self._update(request, name, lambda _: replacement)

    async def patch_queue(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        patch = await json_object(request)
        spec_from_body(name, {})  # a valid name, or 400 before touching the database
        if patch.get("name", name) != name:
            raise ApiError(400, "a queue cannot be renamed")
        unknown = set(patch) - set(EDITABLE_QUEUE_FIELDS) - READ_ONLY_QUEUE_FIELDS - {"name"}
        if unknown:
            raise ApiError(400, f"invalid queue: unknown fields {sorted(unknown)}; "
                                f"editable are {list(EDITABLE_QUEUE_FIELDS)}")
        editable_patch = {k: v for k, v in patch.items() if k in EDITABLE_QUEUE_FIELDS}

        def apply(current: QueueSpec) -> QueueSpec:
            editable = queue_json(current)
            editable = {k: v for k, v in editable.items() if k in EDITABLE_QUEUE_FIELDS}
            if current.allowed_kinds is None:
                editable.pop("allowed_kinds")  # the default stays the default unless patched
            return spec_from_body(name, merge_patch(editable, editable_patch))

        return await self._update(request, name, apply)

    async def _update(self, request: web.Request, name: str,
                      edit: Callable[[QueueSpec], QueueSpec]) -> web.Response:
        async with self.pool.acquire() as connection:
            updated = await job_store.update_queue(connection, name, edit, check=check_tree)
        await self.copies_settled()
        log.info("queue %s updated by %s", name, caller_of(request))
        return web.json_response(await self._with_warnings(updated))

    async def delete_queue(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with self.pool.acquire() as connection:
            await job_store.delete_queue(connection, name,
                                         check=lambda q, b: check_delete(name, q, b))
        await self.copies_settled()
        log.info("queue %s deleted by %s", name, caller_of(request))
        return web.Response(status=204)

    async def list_jobs(self, request: web.Request) -> web.Response:
        """Unfinished jobs, oldest first (`all=true`: ended ones too; a `state` is listed
        whatever it is); "total" counts every match, "reason" is why each waits as the leader
        says (for a job that ended or is unplaceable, its `last_reason`)."""
        query = request.query
        queue, cluster = query.get("queue") or None, query.get("cluster") or None
        try:
            state = JobState(query["state"]) if query.get("state") else None
        except ValueError as error:
            raise ApiError(400, f"unknown state {query['state']!r}; states are "
                                f"{[s.value for s in JobState]}") from error
        try:
            limit = int(query.get("limit", "100"))
        except ValueError as error:
            raise ApiError(400, "limit must be an integer") from error
        if not 1 <= limit <= MAX_JOBS_LISTED:
            raise ApiError(400, f"limit must be between 1 and {MAX_JOBS_LISTED}")
        unfinished = state is None and query.get("all", "").lower() not in ("true", "1")
        async with self.pool.acquire() as connection:
            jobs = await job_store.list_jobs(connection, queue=queue, state=state,
                                             cluster=cluster, unfinished=unfinished, limit=limit)
            total = len(jobs) if len(jobs) < limit else await job_store.count_jobs(
                connection, queue=queue, state=state, cluster=cluster, unfinished=unfinished)
            hints = await self._hints(connection, queue, jobs)
        explained = await admin_views.explain_rows(self.leader, [(j, None) for j in jobs])
        return web.json_response({
            "jobs": [{**job_json(j), "reason": e["reason"] or j.last_reason or None}
                     for j, e in zip(jobs, explained, strict=True)],
            "total": total, "unfinished_only": unfinished, "hints": hints,
            "reasons_unavailable": next((e["reasons_unavailable"] for e in explained
                                         if e["reasons_unavailable"]), None)})

    async def _hints(self, connection: AnyConnection, queue: str | None,
                     jobs: list[JobRow]) -> list[str]:
        """Answers to "why isn't my job scheduled?" that the job rows alone do not give."""
        hints = []
        waiting_queues = sorted({j.queue for j in jobs if j.state is JobState.QUEUED}
                                | ({queue} if queue else set()))
        for name in waiting_queues:
            spec = await job_store.get_queue(connection, name)
            if spec is None:
                hints.append(f"queue {name!r} does not exist: its jobs wait until it is created")
            elif spec.cordoned:
                hints.append(f"queue {name!r} is cordoned: none of its jobs are released")
            elif not spec.namespaces:
                hints.append(f"queue {name!r} is bound to no namespace: no new pod may use it")
        return hints


async def json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except json.JSONDecodeError as error:
        raise ApiError(400, f"the request body is not valid JSON: {error}") from error
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def caller_of(request: web.Request) -> str:
    holder = request.get(CALLER)
    return holder.name if holder is not None else "?"


def _unauthorized(message: str, *, error_code: str | None) -> web.Response:
    """401 with the challenge RFC 6750 asks for, so a client knows to send a bearer token."""
    challenge = 'Bearer realm="lockgate"'
    if error_code:
        challenge += f', error="{error_code}"'
    response = _error(401, message)
    response.headers["WWW-Authenticate"] = challenge
    return response


def _error(status: int, message: str, details: list[str] | None = None) -> web.Response:
    return web.json_response({"error": message, "details": details or []}, status=status)
