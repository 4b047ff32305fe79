"""The admin API's read-only views behind the web UI (`queue_store.web_ui`), paged in Postgres.

Why these beside the CLI's views: the UI shows a queue of 100,000 pods a page at a time and
refreshes every few seconds, so every list here is cut in Postgres (`ui_views`, indexes of
migration 016) and the one answer that needs the scheduler's whole picture (why a pod waits)
reads it from a picture shared by all callers (`StateCache`), kept fresh in the background
every `ui.state_max_age_seconds` while the UI is in use, so no request waits for it.

    GET /api/v1/whoami                                the caller's token name and role
    GET /api/v1/fairness                              the scheduler leader's newest report
    GET /api/v1/fairness/history?since=               samples of every queue's shares
    GET /api/v1/clusters                              capacity, and use and waiting by queue
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
import bisect
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import aiohttp
import asyncpg
from aiohttp import web

from lockgate.change_feed import START
from lockgate.ingest import JobRow
from lockgate.jobs import JobState
from lockgate.pod_traces import waterfall_json
from lockgate.scheduler import Feed, SchedJob, SchedulerState, queue_statuses
from lockgate_adapters import job_views, ui_views
from lockgate_adapters import scheduler_store as store
from lockgate_adapters.postgres import AnyConnection
from queue_store.admin_api import CALLER, ApiError
from queue_store.admin_views import SchedulerView, explanation_json
from queue_store.pod_trace import TraceStore, TraceStoreError

log = logging.getLogger(__name__)

MAX_PAGE = 500
FAIRNESS_PATH = "/api/v1/fairness"
JobJson = Callable[[JobRow], dict[str, Any]]


class StateCache:
    """The scheduler's picture from Postgres, as the leader keeps it: loaded once through the
    leader's hold-out feed (`job_views.load_view`, as `lockgate status` loads it), then brought
    up to date from the change feed (rows changed since its last read, `job_views.apply_changes`)
    when older than `max_age_seconds`. Concurrent callers share one
    refresh. A full load costs a pass over every unfinished job (seconds at 100,000); a refresh
    costs what changed.

    It also keeps each queue's queued jobs in release order, rebuilt when jobs changed, so a
    pod's position is a bisection instead of a pass over the jobs.

    The UI's requests never wait for a load: they take `current()` (None until the first load
    is done) and so ask `run` to keep the picture fresh; `run` refreshes every
    `max_age_seconds` while it was asked for in the last `IDLE_SECONDS`, and rests otherwise.
    """

    IDLE_SECONDS = 60.0

    def __init__(self, pool: asyncpg.Pool, *, max_age_seconds: float,
                 view: SchedulerView) -> None:
        self._pool, self._max_age, self._view = pool, max_age_seconds, view
        self._lock = asyncio.Lock()
        self._feed: Feed | None = None
        self._state: SchedulerState | None = None
        self._cursor = START
        self._loaded_at = 0.0
        self._queued: dict[str, tuple[str, tuple[int, float, str]]] = {}  # id -> queue, key
        self._order: dict[str, list[tuple[int, float, str]]] | None = None
        self._wanted = asyncio.Event()
        self._wanted_at = 0.0

    @property
    def view(self) -> SchedulerView:
        """How the picture sees the scheduler (and builds its explainers)."""
        return self._view

    def current(self) -> tuple[SchedulerState, float] | None:
        """The picture as it is now, if loaded; asks `run` to keep it fresh."""
        self._wanted_at = time.monotonic()
        self._wanted.set()
        return None if self._state is None else (self._state, self._loaded_at)

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            waiting = asyncio.create_task(self._wanted.wait())
            stop = asyncio.create_task(stopping.wait())
            try:
                await asyncio.wait({waiting, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
                stop.cancel()
            if stopping.is_set():
                return
            try:
                await self.get()
            except Exception as error:  # noqa: BLE001 - the next refresh may work
                log.warning("refreshing the UI's picture of the queues failed: %r", error)
            if time.monotonic() - self._wanted_at > self.IDLE_SECONDS:
                self._wanted.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), max(self._max_age, 0.2))

    async def get(self) -> tuple[SchedulerState, float]:
        """The state and the epoch second it was brought up to date at."""
        async with self._lock:
            if self._feed is None or time.time() - self._loaded_at > self._max_age:
                async with self._pool.acquire() as connection:
                    if self._feed is None:
                        self._feed, changes = await job_views.load_view(
                            connection, fairness_resources=self._view.fairness_resources,
                            policy=self._view.policy)
                        self._state = self._feed.state
                    else:
                        changes = await store.changes_since(
                            cast(asyncpg.Connection, connection), self._cursor)
                        now = time.time()
                        # The leader's record of controllers backing off, as it stands now.
                        self._feed.load_backoffs(
                            await ui_views.controller_backoffs(connection), now)
                        job_views.apply_changes(self._feed, changes, now=now)
                self._cursor = changes.cursor
                self._track(changes.jobs)
                self._loaded_at = time.time()
            assert self._state is not None
            return self._state, self._loaded_at

    def _track(self, jobs: Sequence[SchedJob]) -> None:
        """Keep the release-order keys of queued jobs (for `positions`)."""
        for job in jobs:
            if job.state is JobState.QUEUED:
                self._queued[job.job_id] = (job.queue, (-job.priority, job.created_at,
                                                        job.job_id))
            else:
                self._queued.pop(job.job_id, None)
        if jobs:
            self._order = None

    def positions(self, job_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(place, of how many) of queued jobs in their queue's release order, in the current
        picture (none before the first load)."""
        state = self._state
        if state is None:
            return {}
        if self._order is None:
            order: dict[str, list[tuple[int, float, str]]] = {}
            for queue, key in self._queued.values():
                order.setdefault(queue, []).append(key)
            for keys in order.values():
                keys.sort()
            self._order = order
        found = {}
        for job_id in job_ids:
            job = state.job(job_id)
            if job is None or job.state is not JobState.QUEUED:
                continue
            keys = self._order.get(job.queue, [])
            found[job_id] = (bisect.bisect_left(keys, (-job.priority, job.created_at, job_id))
                             + 1, len(keys))
        return found


FetchReport = Callable[[], Awaitable[tuple[str, dict[str, Any]] | None]]


class FairnessSampler:
    """Keeps the newest fairness report and a bounded history of each queue's shares.

    The report comes from the fair-scheduler leader's `/api/v1/fairness` (the round's own
    numbers, with whatever per-cluster fields the scheduler adds); with no scheduler URL
    configured, or none leading, it is computed from Postgres (`lockgate.scheduler.queue_statuses`
    over the cached picture), so the overview never goes blank.
    """

    def __init__(self, *, scheduler_urls: Sequence[str], state: StateCache,
                 interval_seconds: float, keep: int) -> None:
        self._urls = [url.rstrip("/") for url in scheduler_urls]
        self._state = state
        self.interval = interval_seconds
        self.history: deque[dict[str, Any]] = deque(maxlen=keep)
        self.latest: dict[str, Any] | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=max(1.0, min(5.0, self.interval)))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stopping.is_set():
                try:
                    await self.sample(session)
                except Exception as error:  # noqa: BLE001 - a missed sample; the next may work
                    log.warning("fairness sample failed: %r", error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.interval)

    async def sample(self, session: aiohttp.ClientSession) -> None:
        found = await self._from_scheduler(session)
        source, report = found if found is not None else ("postgres", await self._computed())
        now = datetime.now(UTC)
        self.latest = {"source": source, "sampled_at": now.isoformat(), "report": report}
        self.history.append({"at": now.isoformat(), "queues": {
            q["name"]: {"fair": q.get("fair_share"),
                        "adjusted_fair": q.get("adjusted_fair_share"),
                        # The scheduler's constrained fair target when it reports one.
                        "target": q.get("fair_target", q.get("adjusted_fair_share")),
                        "actual": q.get("actual_share"), "queued": q.get("queued")}
            for q in report.get("queues", []) if isinstance(q, dict) and "name" in q}})

    async def _from_scheduler(self, session: aiohttp.ClientSession
                              ) -> tuple[str, dict[str, Any]] | None:
        for url in self._urls:
            try:
                async with session.get(url + FAIRNESS_PATH) as response:
                    if response.status != 200:
                        continue
                    body = await response.json()
            except (aiohttp.ClientError, TimeoutError, ValueError):
                continue
            if isinstance(body, dict) and body.get("leader"):
                return url, body
        return None

    async def _computed(self) -> dict[str, Any]:
        state, loaded_at = await self._state.get()
        queues = []
        for s in queue_statuses(state):
            queues.append({"name": s.queue, "weight": s.weight, "fair_share": s.fair_share,
                           "adjusted_fair_share": s.adjusted_fair_share,
                           "actual_share": s.actual_share, "queued": s.queued,
                           "unschedulable": s.unschedulable, "backing_off": s.backing_off,
                           "released": s.released, "running": s.running,
                           "cordoned": s.cordoned, "defined": s.defined})
        return {"leader": None, "computed_at": datetime.fromtimestamp(loaded_at, UTC).isoformat(),
                "queues": queues}


class UiApi:
    def __init__(self, *, pool: asyncpg.Pool, state: StateCache, sampler: FairnessSampler,
                 job_json: JobJson, trace_url: str | None,
                 traces: TraceStore | None = None) -> None:
        self.pool, self.state, self.sampler = pool, state, sampler
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

    async def fairness(self, _: web.Request) -> web.Response:
        if self.sampler.latest is None:
            raise ApiError(503, "no fairness sample yet: queue-store takes one every "
                                f"{self.sampler.interval:g} s; retry shortly")
        return web.json_response(self.sampler.latest)

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
        async with self.pool.acquire() as connection:
            found = await ui_views.clusters(connection)
        return web.json_response({"clusters": found})

    async def waiting(self, request: web.Request) -> web.Response:
        queue = request.match_info["name"]
        offset, limit = _page(request.query)
        async with self.pool.acquire() as connection:
            page = await ui_views.waiting_pods(
                connection, queue=queue, cluster=request.query.get("cluster") or None,
                namespace=request.query.get("namespace") or None, offset=offset, limit=limit)
        picture = self.state.current()
        ids = [f"{row.cluster}/{row.uid}" for row in page.rows]
        if page.positions is not None:
            places = {job_id: (position, page.queue_total)
                      for job_id, position in zip(ids, page.positions, strict=True)}
        else:  # filtered: the place in the whole queue, from the picture
            places = self.state.positions(ids)
        explainer = None if picture is None else self.state.view.explainer(picture[0],
                                                                            time.time())
        pods = []
        for row, job_id in zip(page.rows, ids, strict=True):
            entry = self.job_json(row)
            place = places.get(job_id)
            entry["position"] = None if place is None else place[0]
            # A pod newer than the picture is not explained yet (its next refresh will).
            explanation = None if place is None or explainer is None \
                else explainer.explain(job_id, place)
            entry["reason"] = None if explanation is None or explanation.reason is None \
                else explanation.reason.value
            entry["message"] = None if explanation is None else explanation.message
            pods.append(entry)
        return web.json_response({
            "queue": queue, "total": page.total, "queued_in_queue": page.queue_total,
            "offset": offset, "limit": limit,
            "reasons_as_of": None if picture is None
            else datetime.fromtimestamp(picture[1], UTC).isoformat(), "pods": pods})

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
        return web.json_response({"queue": queue, "jobset": jobset, "counts": counts,
                                  "total": page.total, "offset": offset, "limit": limit,
                                  "pods": [self.job_json(row) for row in page.rows]})

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
        body: dict[str, Any] = {"pod": self.job_json(row), "journey": journey(row),
                                "eviction": None if eviction is None else eviction.as_json()}
        body["pod"].update({
            "released_at": _iso(row.released_at), "ungated_at": _iso(row.ungated_at),
            "running_at": _iso(row.running_at), "finished_at": _iso(row.finished_at),
            "unschedulable_message": row.unschedulable_message,
            "priority_class": row.priority_class, "pod_group": row.pod_group})
        explanation = None
        if row.state is JobState.QUEUED:
            picture = self.state.current()
            job_id = f"{row.cluster}/{row.uid}"
            place = self.state.positions([job_id]).get(job_id)
            if picture is not None and place is not None:
                explanation = self.state.view.explainer(picture[0], time.time()).explain(
                    job_id, place)
            message = (explanation.message if explanation is not None else
                       "queued; why it waits is being worked out (queue-store is loading its "
                       "picture of the queues): this page fills it in shortly")
        else:
            message = f"not waiting: the pod is {row.state.value}" + (
                f" ({row.last_reason})" if row.last_reason else "")
        body["explanation"] = None if explanation is None else explanation_json(explanation)
        body["message"] = message
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
