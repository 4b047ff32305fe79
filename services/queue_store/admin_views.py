"""Admin API views that answer "how do the queues stand?" and "why is my pod still pending?".

Why here, beside the queue endpoints: they are read-only and served to the same tokens by the
same `lockgate` CLI. `status` and `explain` compute over the scheduler's picture loaded from
Postgres (`job_views.scheduler_state`) with the pure `lockgate.scheduler.explain`, which is what the
fair-scheduler leader uses for the Events on waiting pods: both say the same.

    GET /api/v1/status                               {"queues": [...], "at": ...}
    GET /api/v1/explain/{cluster}/{namespace}/{pod}  the pod's explanation; 404
    GET /api/v1/jobsets?queue=&all=true&limit=       {"jobsets": [...]}
    GET /api/v1/jobsets/{queue}/{jobset}             summary + "jobs"; 404
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import asyncpg
from aiohttp import web

from lockgate.ingest import JobRow
from lockgate.scheduler import Explainer, Explanation, queue_statuses
from lockgate_adapters import job_store, job_views

MAX_JOBSETS_LISTED = 10_000
JOBS_IN_DESCRIBE = 500


JobJson = Callable[[JobRow], dict[str, Any]]


def register(app: web.Application, pool: asyncpg.Pool, *, job_json: JobJson) -> None:
    """Add the views to the admin API's app; `job_json` is its one shape of a job."""
    views = AdminViews(pool, job_json)
    app.router.add_get("/api/v1/status", views.status)
    app.router.add_get("/api/v1/explain/{cluster}/{namespace}/{pod}", views.explain)
    app.router.add_get("/api/v1/jobsets", views.list_jobsets)
    app.router.add_get("/api/v1/jobsets/{queue}/{jobset}", views.describe_jobset)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "details": []}, status=status)


def explanation_json(e: Explanation) -> dict[str, Any]:
    body = asdict(e)
    body["reason"] = None if e.reason is None else e.reason.value
    body["competing_queues"] = list(e.competing_queues)
    return body


class AdminViews:
    def __init__(self, pool: asyncpg.Pool, job_json: JobJson) -> None:
        self.pool = pool
        self.job_json = job_json

    async def status(self, _: web.Request) -> web.Response:
        async with self.pool.acquire() as connection:
            state = await job_views.scheduler_state(connection)
        now = time.time()
        queues = []
        for s in queue_statuses(state):
            entry = asdict(s)
            entry["oldest_wait_seconds"] = (None if s.oldest_queued_at is None
                                            else max(0.0, now - s.oldest_queued_at))
            queues.append(entry)
        return web.json_response({"at": datetime.now(UTC).isoformat(), "queues": queues})

    async def explain(self, request: web.Request) -> web.Response:
        cluster = request.match_info["cluster"]
        namespace = request.match_info["namespace"]
        pod = request.match_info["pod"]
        async with self.pool.acquire() as connection:
            row = await job_views.find_job(connection, cluster=cluster, namespace=namespace,
                                           name=pod)
            if row is None:
                return _error(404, f"lockgate knows no pod {cluster}/{namespace}/{pod}: check "
                                   "the names (`kubectl get pod -n NAMESPACE`), and that the "
                                   "pod carries a lockgate.io/queue label in a managed namespace")
            state = await job_views.scheduler_state(connection)
        job_id = f"{row.cluster}/{row.uid}"
        explanation = Explainer(state, now=time.time()).explain(job_id)
        body: dict[str, Any] = {"pod": {"cluster": row.cluster, "namespace": row.namespace,
                                        "name": row.name, "uid": row.uid, "jobset": row.jobset,
                                        "state": row.state.value,
                                        "last_reason": row.last_reason}}
        if explanation is None:
            body["explanation"] = None
            body["message"] = f"not waiting: the pod is {row.state.value}"
        else:
            body["explanation"] = explanation_json(explanation)
            body["message"] = explanation.message
        return web.json_response(body)

    async def list_jobsets(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            limit = int(query.get("limit", "1000"))
        except ValueError:
            return _error(400, "limit must be an integer")
        if not 1 <= limit <= MAX_JOBSETS_LISTED:
            return _error(400, f"limit must be between 1 and {MAX_JOBSETS_LISTED}")
        async with self.pool.acquire() as connection:
            summaries = await job_views.list_jobsets(
                connection, queue=query.get("queue") or None,
                include_finished=query.get("all", "").lower() in ("1", "true", "yes"),
                limit=limit)
        return web.json_response({"jobsets": [s.as_json() for s in summaries]})

    async def describe_jobset(self, request: web.Request) -> web.Response:
        queue, jobset = request.match_info["queue"], request.match_info["jobset"]
        async with self.pool.acquire() as connection:
            summary = await job_views.get_jobset(connection, queue=queue, jobset=jobset)
            if summary is None:
                return _error(404, f"no job set {jobset!r} in queue {queue!r}: see "
                                   f"`lockgate jobset list --queue {queue}`")
            jobs = await connection.fetch(
                f"SELECT {job_store._JOB_COLUMNS} FROM jobs"  # noqa: S608 - constant columns
                " WHERE queue = $1 AND jobset = $2 ORDER BY created_at, cluster, uid LIMIT $3",
                queue, jobset, JOBS_IN_DESCRIBE)
        body = summary.as_json()
        body["jobs"] = [self.job_json(job_store._job_row(record)) for record in jobs]
        body["jobs_shown"] = len(jobs)
        return web.json_response(body)
