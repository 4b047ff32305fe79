"""The admin API's read-only views behind the web UI (`queue_store.web_ui`), paged in Postgres.

Why these beside the CLI's views: the UI shows a queue of 100,000 pods a page at a time and
refreshes every few seconds, so every list here is cut in Postgres (`ui_views`, indexes of
migrations 016 and 031), and why each pod on a page waits is asked of the fair-scheduler leader
in one request for the page (`admin_views.explain_rows`): its picture of the last round is the
only one. With no leader answering, the pages say the reasons are unavailable.

    GET /api/v1/whoami                                the caller's token name and role
    GET /api/v1/fairness                              every queue's standing and the queue
                                                      tree: the leader's report, or Postgres's
                                                      counts (and no tree) without it
    GET /api/v1/fairness/history?since=               samples of every queue's shares
    GET /api/v1/clusters                              capacity, and use and waiting by queue;
                                                      growth (the leader's) when autoscaled
    GET /api/v1/queues/{name}/waiting?cluster=&namespace=&offset=&limit=
                                                      queued pods in release order, with their
                                                      position and why each waits
    GET /api/v1/jobsets/{queue}/{jobset}/pods?cluster=&state=&offset=&limit=
                                                      a page of the job set's pods + counts
    GET /api/v1/pods/{cluster}/{namespace}/{pod}      one pod's journey, explanation, eviction
                                                      and trace link
    GET /api/v1/pods/{cluster}/{namespace}/{pod}/trace
                                                      its trace as a waterfall, from the trace
                                                      store (`pod_trace`)
    GET /api/v1/evictions?queue=&cluster=&offset=&limit=   newest first

Every route is GET: a read-only token may call all of them, and none changes anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import asyncpg
from aiohttp import web

from lockgate.ingest import JobRow
from lockgate.jobs import JobState
from lockgate.pod_traces import waterfall_json
from lockgate_adapters import job_views, namespace_store, ui_views
from lockgate_adapters.postgres import AnyConnection
from queue_store.admin_api import CALLER, ApiError
from queue_store.admin_views import (
    explain_job,
    explain_rows,
    growth_of,
    large_json_response,
    leader_json,
    per_cluster_asked,
    queue_standings,
)
from queue_store.leader import SchedulerLeader
from queue_store.pod_trace import TraceStore, TraceStoreError

log = logging.getLogger(__name__)

MAX_PAGE = 500
JobJson = Callable[[JobRow], dict[str, Any]]




class FairnessSampler:
    """Keeps a bounded history of each queue's shares, for the overview's chart: a sample of
    the leader's report every `interval` seconds (none while no leader answers: the chart shows
    a gap, never numbers the leader did not give).

    With a queue tree, each sample also keeps every inner node's fair target and actual share
    (`nodes`), as the leader's tree gives them (the sums of its leaves'), so picking a node on
    the overview shows its children over time, leaves and inner nodes alike."""

    def __init__(self, *, leader: SchedulerLeader, interval_seconds: float, keep: int) -> None:
        self._leader = leader
        self.interval = interval_seconds
        self.history: deque[dict[str, Any]] = deque(maxlen=keep)

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.sample()
            except Exception as error:  # noqa: BLE001 - a missed sample; the next may work
                log.warning("fairness sample failed: %r", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.interval)

    async def sample(self) -> None:
        report = await self._leader.fairness()
        if report is None:
            return
        self.history.append({"at": datetime.now(UTC).isoformat(), "queues": {
            q["name"]: {"fair": q.get("fair_share"),
                        "adjusted_fair": q.get("adjusted_fair_share"),
                        "target": q.get("fair_target"),
                        "actual": q.get("actual_share"), "queued": q.get("queued")}
            for q in report.get("queues", []) if isinstance(q, dict) and "name" in q},
            "nodes": inner_node_samples(report.get("tree"))})


def inner_node_samples(tree: Any) -> dict[str, dict[str, Any]]:
    """The inner nodes of the leader's tree, as a sample keeps them (leaves are in `queues`)."""
    if not isinstance(tree, list):
        return {}
    return {node["name"]: {"target": node.get("fair_target"), "actual": node.get("actual_share"),
                           "decayed_usage": node.get("decayed_usage")}
            for node in tree if isinstance(node, dict) and "name" in node
            and node.get("leaf") is False}


class UiApi:
    def __init__(self, *, pool: asyncpg.Pool, leader: SchedulerLeader,
                 sampler: FairnessSampler, job_json: JobJson, trace_url: str | None,
                 traces: TraceStore | None = None) -> None:
        self.pool, self.leader, self.sampler = pool, leader, sampler
        self.job_json, self.trace_url, self.traces = job_json, trace_url, traces

    def register(self, app: web.Application) -> None:
        router = app.router
        router.add_get("/api/v1/whoami", self.whoami)
        router.add_get("/api/v1/fairness", self.fairness)
        router.add_get("/api/v1/fairness/history", self.fairness_history)
        router.add_get("/api/v1/clusters", self.clusters)
        router.add_get("/api/v1/queues/{name}/waiting", self.waiting)
        router.add_get("/api/v1/jobsets/{queue}/{jobset}/pods", self.jobset_pods)
        router.add_get("/api/v1/pods/{cluster}/{namespace}/{pod}", self.pod)
        router.add_get("/api/v1/pods/{cluster}/{namespace}/{pod}/trace", self.pod_trace)
        router.add_get("/api/v1/evictions", self.evictions)

    async def whoami(self, request: web.Request) -> web.Response:
        holder = request[CALLER]
        return web.json_response({"name": holder.name, "role": holder.role.value,
                                  "may_act": holder.role.may_write})

    async def fairness(self, request: web.Request) -> web.Response:
        """The leader's report, asked now (a sample could be the report of a leader that has
        since stopped); without a leader, Postgres's counts and no shares. `?clusters=1`:
        each queue's figures in every cluster too; `?queue=NAME`: that queue alone (a queue's
        page, its per-cluster figures a page's worth)."""
        queues, report = await queue_standings(self.pool, self.leader,
                                               per_cluster=per_cluster_asked(request))
        only = request.query.get("queue")
        if only:
            queues = [q for q in queues if q.get("queue") == only]
        return large_json_response({
            "source": "leader" if report is not None else "postgres",
            "sampled_at": datetime.now(UTC).isoformat(),
            "leader": leader_json(report),
            "reasons_unavailable": None if report is not None else self.leader.unavailable,
            "report": {"leader": None if report is None else report.get("instance_id"),
                       "last_round": None if report is None else report.get("last_round"),
                       "queues": queues,
                       # The queue tree of the leader's picture, parents before children
                       # (lockgate.scheduler.tree_status, as `lockgate status --tree`): the
                       # overview draws it; none without a leader.
                       "tree": None if report is None else report.get("tree") or [],
                       "tree_problem": None if report is None else report.get("tree_problem")}})

    async def fairness_history(self, request: web.Request) -> web.Response:
        since = request.query.get("since")
        if since:
            try:
                cutoff = datetime.fromisoformat(since)
            except ValueError as error:
                raise ApiError(400, "since must be an ISO 8601 time") from error
            samples = [s for s in self.sampler.history
                       if datetime.fromisoformat(s["at"]) > cutoff]
        else:
            samples = list(self.sampler.history)
        return web.json_response({"interval_seconds": self.sampler.interval,
                                  "samples": samples})

    async def clusters(self, _: web.Request) -> web.Response:
        """Each cluster's nodes and use (Postgres), and an autoscaled cluster's growth (the
        leader's: headroom per NodePool, NodeClaims in flight, the stall or wait)."""
        report = await self.leader.fairness()
        async with self.pool.acquire() as connection:
            found = await ui_views.clusters(connection)
        growth = {entry.get("cluster"): entry for entry in growth_of(report)}
        for cluster in found:
            cluster["growth"] = growth.get(cluster["name"])
        return web.json_response({
            "clusters": found,
            "growth_unavailable": None if report is not None else self.leader.unavailable})

    async def waiting(self, request: web.Request) -> web.Response:
        queue = request.match_info["name"]
        offset, limit = _page(request.query)
        async with self.pool.acquire() as connection:
            page = await ui_views.waiting_pods(
                connection, queue=queue, cluster=request.query.get("cluster") or None,
                namespace=request.query.get("namespace") or None, offset=offset, limit=limit)
        places = [(row, (position, page.queue_total))
                  for row, position in zip(page.rows, page.positions, strict=True)]
        explained = await explain_rows(self.leader, places)
        pods = []
        for (row, (position, _)), said in zip(places, explained, strict=True):
            entry = self.job_json(row)
            entry["position"] = position
            entry["in_line_since"] = row.in_line_since.isoformat()  # a kept place's time
            entry["reason"] = said["reason"]
            entry["summary"] = said["summary"]
            entry["message"] = said["message"]
            entry["round_skip"] = said["round_skip"]
            pods.append(entry)
        who = explained[0]["leader"] if explained else leader_json(
            await self.leader.fairness())
        return web.json_response({
            "queue": queue, "total": page.total, "queued_in_queue": page.queue_total,
            "offset": offset, "limit": limit, "leader": who,
            "reasons_unavailable": None if who is not None else self.leader.unavailable,
            "pods": pods})

    async def jobset_pods(self, request: web.Request) -> web.Response:
        queue, jobset = request.match_info["queue"], request.match_info["jobset"]
        offset, limit = _page(request.query)
        state_text = request.query.get("state") or None
        try:
            state = None if state_text is None else JobState(state_text)
        except ValueError as error:
            raise ApiError(400, f"unknown state {state_text!r}; states are "
                                f"{[s.value for s in JobState]}") from error
        async with self.pool.acquire() as connection:
            counts = await ui_views.jobset_counts(connection, queue=queue, jobset=jobset)
            if not counts:
                raise ApiError(404, f"no job set {jobset!r} in queue {queue!r}")
            page = await ui_views.jobset_pods(
                connection, queue=queue, jobset=jobset,
                cluster=request.query.get("cluster") or None, state=state, offset=offset,
                limit=limit)
            # Whether it was cancelled, with the page: asking the CLI's /cancellation, which
            # answers 404 for a job set never cancelled, left an error in the browser's console.
            cancelled = await namespace_store.cancellation(connection, queue, jobset)
        return web.json_response({"queue": queue, "jobset": jobset, "counts": counts,
                                  "total": page.total, "offset": offset, "limit": limit,
                                  "cancellation": cancelled,
                                  "pods": [self.job_json(row) for row in page.rows]},
                                 dumps=lambda v: json.dumps(v, default=str))

    @staticmethod
    async def _pod_row(connection: AnyConnection, request: web.Request) -> JobRow:
        """The job row of the route's {cluster}/{namespace}/{pod}; 404 if lockgate has none."""
        cluster = request.match_info["cluster"]
        namespace, name = request.match_info["namespace"], request.match_info["pod"]
        row = await job_views.find_job(connection, cluster=cluster, namespace=namespace,
                                       name=name)
        if row is None:
            raise ApiError(404, f"lockgate knows no pod {cluster}/{namespace}/{name}")
        return row

    async def pod(self, request: web.Request) -> web.Response:
        cluster = request.match_info["cluster"]
        async with self.pool.acquire() as connection:
            row = await self._pod_row(connection, request)
            eviction = await ui_views.eviction_of(connection, cluster=cluster, uid=row.uid)
            place = (await job_views.queued_place(connection, row)
                     if row.state is JobState.QUEUED else None)
        body: dict[str, Any] = {"pod": self.job_json(row), "journey": journey(row),
                                "eviction": None if eviction is None else eviction.as_json()}
        body["pod"].update({
            "released_at": _iso(row.released_at), "ungated_at": _iso(row.ungated_at),
            "running_at": _iso(row.running_at), "finished_at": _iso(row.finished_at),
            "unschedulable_message": row.unschedulable_message,
            "priority_class": row.priority_class, "pod_group": row.pod_group})
        said = await explain_job(self.leader, row, place)
        body["position"] = None if place is None else place[0]
        body.update(said)
        trace_id = trace_id_of(row.uid)
        body["trace_id"] = trace_id
        body["trace_url"] = (self.trace_url.replace("{trace_id}", trace_id)
                             if self.trace_url and trace_id else None)
        return web.json_response(body)

    async def pod_trace(self, request: web.Request) -> web.Response:
        async with self.pool.acquire() as connection:
            row = await self._pod_row(connection, request)
        trace_id = trace_id_of(row.uid)
        body: dict[str, Any] = {"trace_id": trace_id, "store": None, "message": None,
                                "total_us": 0, "services": [], "spans": []}
        if self.traces is None:
            body["message"] = ("no trace store is configured: set "
                               "LOCKGATE_QUEUE_STORE_UI__TRACES_URL to Jaeger's query API")
        elif trace_id is None:
            body["message"] = f"the pod's uid {row.uid!r} is no trace id"
        else:
            body["store"] = self.traces.base_url
            try:
                chart = await self.traces.chart(trace_id)
            except TraceStoreError as error:
                raise ApiError(503, str(error)) from error
            body.update(waterfall_json(chart))
            if not chart.rows:
                body["message"] = ("no span of this trace in the trace store yet: spans arrive "
                                   "a few seconds after each step")
        return web.json_response(body)

    async def evictions(self, request: web.Request) -> web.Response:
        offset, limit = _page(request.query)
        async with self.pool.acquire() as connection:
            rows, total = await ui_views.evictions(
                connection, queue=request.query.get("queue") or None,
                cluster=request.query.get("cluster") or None, offset=offset, limit=limit)
        return web.json_response({"total": total, "offset": offset, "limit": limit,
                                  "evictions": [r.as_json() for r in rows]})


def journey(row: JobRow) -> list[dict[str, Any]]:
    """The pod's steps, created → queued → released → bound → ended, each with its time if
    reached (None: not yet, or not recorded) and whether it is the step the pod is at."""
    rank = row.state.rank
    bound_at = row.running_at or (row.state_changed_at if row.state is JobState.BOUND else None)
    ended_at = row.finished_at if row.state.is_terminal else None
    steps: list[tuple[str, datetime | None, bool]] = [
        ("created", row.created_at, True),
        ("queued", row.created_at, True),
        ("released", row.released_at or row.ungated_at,
         rank >= JobState.RELEASED.rank and row.state is not JobState.CANCELLED
         and (row.released_at is not None or row.ungated_at is not None)),
        ("bound", bound_at, rank >= JobState.BOUND.rank and bound_at is not None),
        ("ended", ended_at, row.state.is_terminal),
    ]
    current = {JobState.QUEUED: "queued", JobState.RELEASED: "released",
               JobState.UNGATED: "released", JobState.BOUND: "bound",
               JobState.RUNNING: "bound"}.get(row.state, "ended")
    return [{"step": step, "at": _iso(at) if reached else None, "reached": reached,
             "current": step == current,
             "detail": (row.state.value if step == "ended" and reached else
                        "running" if step == "bound" and row.state is JobState.RUNNING else
                        "ungated" if step == "released" and row.ungated_at else None)}
            for step, at, reached in steps]


def trace_id_of(uid: str) -> str | None:
    """The pod's trace id: its uid's 128 bits (`lockgate_adapters.telemetry.pod_trace_parent`)."""
    digits = uid.replace("-", "").lower()
    if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits) or not int(
            digits, 16):
        return None
    return digits


def _page(query: Mapping[str, str]) -> tuple[int, int]:
    try:
        offset = int(query.get("offset", "0"))
        limit = int(query.get("limit", "50"))
    except ValueError as error:
        raise ApiError(400, "offset and limit must be integers") from error
    if offset < 0:
        raise ApiError(400, "offset must be 0 or more")
    if not 1 <= limit <= MAX_PAGE:
        raise ApiError(400, f"limit must be between 1 and {MAX_PAGE}")
    return offset, limit


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
