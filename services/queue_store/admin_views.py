"""Admin API views that answer "how do the queues stand?" and "why is my pod still pending?".

Why here, beside the queue endpoints: they are read-only and served to the same tokens by the
same `lockgate` CLI. `status` and `explain` compute over the scheduler's picture loaded from
Postgres through the leader's hold-out feed (`job_views.scheduler_view`, with the fair-scheduler's
fairness resources and retry policy: `SchedulerViewSettings`) with the pure
`lockgate.scheduler.explain`, which is what the leader uses for the Events on waiting pods: both
say the same.

    GET /api/v1/status                               {"queues": [...], "at": ...}
    GET /api/v1/explain/{cluster}/{namespace}/{pod}  the pod's explanation; 404
    GET /api/v1/jobsets?queue=&all=true&limit=&offset=   {"jobsets": [...]}
    GET /api/v1/jobsets/{queue}/{jobset}             summary + "jobs"; 404
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
from aiohttp import web

from lockgate.ingest import JobRow
from lockgate.scheduler import (
    Explainer,
    Explanation,
    Feed,
    FeedPolicy,
    SchedulerState,
    format_duration,
    queue_statuses,
)
from lockgate.scheduler.state import DEFAULT_FAIRNESS_RESOURCES
from lockgate.wait_estimates import WINDOW_SECONDS, ReleaseRates
from lockgate_adapters import job_store, job_views
from lockgate_adapters.postgres import AnyConnection

MAX_JOBSETS_LISTED = 10_000
JOBS_IN_DESCRIBE = 500


JobJson = Callable[[JobRow], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class SchedulerView:
    """What the views must share with the fair-scheduler to see its state as it does."""

    fairness_resources: tuple[str, ...] = DEFAULT_FAIRNESS_RESOURCES
    policy: FeedPolicy = field(default_factory=FeedPolicy)
    group_reserve_after_seconds: float | None = 60.0  # the leader's group ageing

    def explainer(self, state: SchedulerState, now: float) -> Explainer:
        """An explainer for a state no round ran on: the leader's reservations are not in it,
        so an aged group is told it probably reserves."""
        return Explainer(state, now=now, group_reserve_after=self.group_reserve_after_seconds,
                         reservations_known=False)


def register(app: web.Application, pool: asyncpg.Pool, *, job_json: JobJson,
             view: SchedulerView) -> None:
    """Add the views to the admin API's app; `job_json` is its one shape of a job."""
    views = AdminViews(pool, job_json, view)
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
    def __init__(self, pool: asyncpg.Pool, job_json: JobJson, view: SchedulerView) -> None:
        self.pool = pool
        self.job_json = job_json
        self.view = view

    async def _feed(self, connection: AnyConnection) -> Feed:
        return await job_views.scheduler_view(
            connection, fairness_resources=self.view.fairness_resources,
            policy=self.view.policy)

    async def status(self, _: web.Request) -> web.Response:
        async with self.pool.acquire() as connection:
            state = (await self._feed(connection)).state
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
            feed = await self._feed(connection)
            released = await job_views.release_times(
                connection, queue=row.queue, cluster=row.cluster, window_seconds=WINDOW_SECONDS)
        job_id = f"{row.cluster}/{row.uid}"
        now = time.time()
        explanation = self.view.explainer(feed.state, now).explain(job_id)
        body: dict[str, Any] = {"pod": {"cluster": row.cluster, "namespace": row.namespace,
                                        "name": row.name, "uid": row.uid, "jobset": row.jobset,
                                        "state": row.state.value,
                                        "last_reason": row.last_reason}}
        held_out = feed.held_out(job_id)
        if explanation is None:
            body["explanation"] = None
            body["held_out"] = held_out
            body["message"] = _held_out_message(held_out, feed.retry_due(job_id), now) or (
                f"not waiting: the pod is {row.state.value}")
        else:
            body["explanation"] = explanation_json(explanation)
            body["message"] = explanation.message
            rates = ReleaseRates()
            for at in released:
                rates.released(row.queue, row.cluster, at)
            estimate = rates.estimate_for(explanation, now=now)
            body["estimate"] = {"seconds": estimate.seconds, "text": estimate.text()}
            body["kept_place_of"] = row.kept_place_of  # lockgate.places
        return web.json_response(body)

    async def list_jobsets(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            limit = int(query.get("limit", "1000"))
            offset = int(query.get("offset", "0"))
        except ValueError:
            return _error(400, "limit and offset must be integers")
        if not 1 <= limit <= MAX_JOBSETS_LISTED or offset < 0:
            return _error(400, f"limit must be between 1 and {MAX_JOBSETS_LISTED}, offset 0 "
                               "or more")
        async with self.pool.acquire() as connection:
            summaries = await job_views.list_jobsets(
                connection, queue=query.get("queue") or None,
                include_finished=query.get("all", "").lower() in ("1", "true", "yes"),
                limit=limit, offset=offset)
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


def _held_out_message(held_out: str | None, retry_due: float | None, now: float) -> str | None:
    """What a pod the scheduler holds out of its queue's line waits for."""
    if held_out == "expired":
        return ("it waited longer than its maximum time queued: lockgate is having it failed "
                "or deleted, and releases it no more")
    if held_out == "backing_off" and retry_due is not None:
        return (f"its release failed; it queues again in {format_duration(retry_due - now)} "
                "(the wait doubles with each failed release)")
    return None
