"""Admin API routes that end things: cancel a job set, delete an ephemeral namespace.

Why commands over Kafka rather than direct writes: a cancel has effects in several services
(queue-store's jobs and namespace records, every ungater's pods), and a command on a topic
reaches each of them durably, even one that is down right now. The call returns 202 once Kafka
holds the command; the effects follow.

    POST   /api/v1/jobsets/{queue}/{jobset}/cancel      {"reason": "..."} -> 202 command
    GET    /api/v1/jobsets/{queue}/{jobset}/cancellation  the recorded cancel with the job set's
                                                        namespace records; 404 if none
    DELETE /api/v1/namespaces/{cluster}/{name}          {"reason": "..."} (optional) -> 202
    GET    /api/v1/namespaces/{cluster}/{name}/transitions  {"namespace": record,
                                                             "transitions": [...]}
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
from aiohttp import web

from lockgate.events import (
    JOBSET_COMMANDS,
    NAMESPACE_COMMANDS,
    JobSetCommand,
    NamespaceCommand,
)
from lockgate.labels import InvalidLabelError, validate_label_value, validate_queue_name
from lockgate.namespaces import NamespaceState
from lockgate_adapters import namespace_store
from queue_store.admin_api import ApiError, caller_of

log = logging.getLogger(__name__)

MAX_REASON = 1024
# Sends one command and waits until Kafka has it (raises when it cannot).
Publish = Callable[[Any, Any], Awaitable[None]]


class CollectionApi:
    def __init__(self, pool: asyncpg.Pool, publish: Publish) -> None:
        self._pool, self._publish = pool, publish

    def register(self, app: web.Application) -> None:
        app.router.add_post("/api/v1/jobsets/{queue}/{jobset}/cancel", self.cancel_jobset)
        app.router.add_get("/api/v1/jobsets/{queue}/{jobset}/cancellation", self.cancellation)
        app.router.add_delete("/api/v1/namespaces/{cluster}/{name}", self.delete_namespace)
        app.router.add_get("/api/v1/namespaces/{cluster}/{name}/transitions", self.transitions)

    async def cancel_jobset(self, request: web.Request) -> web.Response:
        queue, jobset = _jobset(request)
        reason = _reason(await _optional_json(request), default="cancelled by an operator")
        async with self._pool.acquire() as connection:
            known = await connection.fetchval(
                "SELECT EXISTS (SELECT FROM jobs WHERE queue = $1 AND jobset = $2)"
                " OR EXISTS (SELECT FROM ephemeral_namespaces WHERE queue = $1 AND jobset = $2)",
                queue, jobset)
        if not known:
            raise ApiError(404, f"job set {queue}/{jobset} is unknown: lockgate has no job and "
                                "no ephemeral namespace of it (check the names with "
                                "`lockgate jobs list --queue " + queue + "`)")
        command = JobSetCommand(command_id=str(uuid.uuid4()), queue=queue, jobset=jobset,
                                reason=reason, requested_by=_caller(request),
                                at=datetime.now(UTC))
        await self._send(JOBSET_COMMANDS, command)
        log.info("job set %s/%s: cancel requested by %s (%s)", queue, jobset,
                 command.requested_by, reason)
        return web.json_response(command.model_dump(mode="json"), status=202)

    async def cancellation(self, request: web.Request) -> web.Response:
        queue, jobset = _jobset(request)
        async with self._pool.acquire() as connection:
            found = await namespace_store.cancellation(connection, queue, jobset)
            records = await namespace_store.of_jobset(connection, queue, jobset)
        if found is None:
            raise ApiError(404, f"job set {queue}/{jobset} has not been cancelled (or the "
                                "cancel is not applied yet)")
        found["namespaces"] = [namespace_store.record_json(r) for r in records]
        return web.json_response(found, dumps=lambda v: json.dumps(v, default=str))

    async def delete_namespace(self, request: web.Request) -> web.Response:
        cluster, name = request.match_info["cluster"], request.match_info["name"]
        reason = _reason(await _optional_json(request), default="deleted by an operator")
        async with self._pool.acquire() as connection:
            record = await namespace_store.get(connection, cluster, name)
        if record is None:
            raise ApiError(404, f"no ephemeral namespace {cluster}/{name} (lockgate deletes "
                                "only the namespaces it created; see `lockgate namespace list`)")
        if record.state is not NamespaceState.ACTIVE:
            # Collection started already: one more command would change nothing.
            return web.json_response(namespace_store.record_json(record))
        command = NamespaceCommand(command_id=str(uuid.uuid4()), cluster=cluster, name=name,
                                   reason=reason, requested_by=_caller(request),
                                   at=datetime.now(UTC))
        await self._send(NAMESPACE_COMMANDS, command)
        log.info("namespace %s/%s: deletion requested by %s", cluster, name,
                 command.requested_by)
        return web.json_response({**namespace_store.record_json(record),
                                  "command_id": command.command_id}, status=202)

    async def transitions(self, request: web.Request) -> web.Response:
        cluster, name = request.match_info["cluster"], request.match_info["name"]
        async with self._pool.acquire() as connection:
            record = await namespace_store.get(connection, cluster, name)
            history = await namespace_store.transitions(connection, cluster, name)
        if record is None:
            raise ApiError(404, f"no ephemeral namespace {cluster}/{name}")
        return web.json_response({"namespace": namespace_store.record_json(record),
                                  "transitions": [namespace_store.transition_json(t)
                                                  for t in history]})

    async def _send(self, topic: Any, command: Any) -> None:
        try:
            await self._publish(topic, command)
        except Exception as error:  # any Kafka failure: nothing was sent
            log.warning("publishing %s failed: %r", topic.name, error)
            raise ApiError(503, f"kafka did not take the command ({type(error).__name__}); "
                                "nothing was done, retry") from error


def _jobset(request: web.Request) -> tuple[str, str]:
    queue, jobset = request.match_info["queue"], request.match_info["jobset"]
    try:
        validate_queue_name(queue)
        validate_label_value("lockgate.io/jobset", jobset)
    except InvalidLabelError as error:
        raise ApiError(400, str(error)) from error
    return queue, jobset


def _reason(body: dict[str, Any], *, default: str) -> str:
    reason = body.get("reason", default)
    if not isinstance(reason, str) or not reason.strip():
        raise ApiError(400, "reason must be a non-empty string")
    if len(reason) > MAX_REASON:
        raise ApiError(400, f"reason is longer than {MAX_REASON} characters")
    return reason.strip()


async def _optional_json(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except json.JSONDecodeError as error:
        raise ApiError(400, f"the request body is not valid JSON: {error}") from error
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _caller(request: web.Request) -> str:
    return caller_of(request)
