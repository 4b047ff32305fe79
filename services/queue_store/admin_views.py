"""Admin API views that answer "how do the queues stand?" and "why is my pod still pending?".

Why here, beside the queue endpoints: they are read-only and served to the same tokens by the
same `lockgate` CLI. Why a pod waits, and each queue's shares, are the fair-scheduler leader's
picture of its last round (`lockgate.scheduler.report`), asked of the leader
(`queue_store.leader`), never worked out here. Postgres adds what only it keeps (how long each
queue's oldest pod has waited, a pod's place in line). When no leader answers, the views say so
and give what Postgres alone can say: counts, states and places, with the reasons unavailable.

    GET /api/v1/status                               {"queues": [...], "growth": [...],
                                                      "at": ..., "leader": ...,
                                                      "tree": [node, ...], "tree_problem"}
    GET /api/v1/explain/{cluster}/{namespace}/{pod}  the pod's explanation; 404
    GET /api/v1/jobsets?queue=&all=true&limit=&offset=   {"jobsets": [...]}
    GET /api/v1/jobsets/{queue}/{jobset}             summary + "jobs"; 404
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson
from aiohttp import web

from lockgate.ingest import JobRow
from lockgate.jobs import JobState, job_id
from lockgate.noticing import skipped_gate_message
from lockgate.scheduler import format_duration
from lockgate_adapters import job_store, job_views
from queue_store.leader import SchedulerLeader

MAX_JOBSETS_LISTED = 10_000
JOBS_IN_DESCRIBE = 500


JobJson = Callable[[JobRow], dict[str, Any]]


def register(app: web.Application, pool: asyncpg.Pool, *, job_json: JobJson,
             leader: SchedulerLeader) -> None:
    """Add the views to the admin API's app; `job_json` is its one shape of a job."""
    views = AdminViews(pool, job_json, leader)
    app.router.add_get("/api/v1/status", views.status)
    app.router.add_get("/api/v1/explain/{cluster}/{namespace}/{pod}", views.explain)
    app.router.add_get("/api/v1/jobsets", views.list_jobsets)
    app.router.add_get("/api/v1/jobsets/{queue}/{jobset}", views.describe_jobset)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "details": []}, status=status)


def large_json_response(body: dict[str, Any]) -> web.Response:
    """A JSON answer encoded by orjson: `status` and the UI's overview carry every queue's
    share in every cluster (about 100,000 numbers at 1,000 queues and 50 clusters), which
    json encoded in a fifth of the call's time."""
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def leader_json(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """Who answered and which round its answer is of (None: no leader answered)."""
    if report is None:
        return None
    return {"instance_id": report.get("instance_id"), "round": report.get("last_round")
            or report.get("round")}


def per_cluster_asked(request: web.Request) -> bool:
    """`?clusters=1`: each queue's target and share in every cluster too (`status -o wide`,
    `-o json`, a queue's page). Not by default: at fleet scale (1,000 queues in 50 clusters)
    they were nearly all of the answer and of its time."""
    return request.query.get("clusters", "").lower() in ("1", "true", "yes")


async def queue_standings(pool: asyncpg.Pool, leader: SchedulerLeader, *,
                          per_cluster: bool = False
                          ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Every queue's standing as `status` and the UI's overview show it, and the leader's
    report it came from (None: no leader answered; then the shares are None and the counts
    Postgres's). `per_cluster`: with each queue's target and share in every cluster."""
    report = await leader.fairness(per_cluster=per_cluster)
    async with pool.acquire() as connection:
        if report is not None:
            queues = [dict(q) for q in report.get("queues") or [] if isinstance(q, dict)]
        else:
            queues = [{
                "queue": c.name, "name": c.name, "defined": c.defined, "cordoned": c.cordoned,
                "weight": c.weight, "fair_share": None, "adjusted_fair_share": None,
                "actual_share": None, "fair_target": None, "queued": c.by_phase["queued"],
                "unschedulable": None, "backing_off": None,
                "released": c.by_phase["released"], "running": c.by_phase["running"],
                "max_queued_seconds": c.max_queued_seconds}
                for c in await job_views.queue_counts(connection)]
            if per_cluster:  # no leader: no share anywhere
                for q in queues:
                    q["cluster_targets"], q["cluster_shares"] = {}, {}
        oldest = await job_views.oldest_in_line(connection, [q["queue"] for q in queues])
        skipped = await job_views.skipped_gate_counts(connection)
    now = time.time()
    for q in queues:
        q["skipped_gate"] = skipped.get(q["queue"], 0)  # pods that ran without the gate
        at = oldest.get(q["queue"])
        q["oldest_queued_at"] = None if at is None else at.isoformat()
        q["oldest_wait_seconds"] = None if at is None else max(0.0, now - at.timestamp())
    return queues, report


def growth_of(report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each autoscaled cluster's growth as the leader's last round left it (`growth_json`):
    its nodes, capacity, headroom per NodePool, NodeClaims in flight, and the stall or wait.
    Empty when no cluster grows, or no leader answered (the leader alone knows it)."""
    if report is None:
        return []
    return [entry for entry in report.get("growth") or [] if isinstance(entry, dict)]


class AdminViews:
    def __init__(self, pool: asyncpg.Pool, job_json: JobJson, leader: SchedulerLeader) -> None:
        self.pool = pool
        self.job_json = job_json
        self.leader = leader

    async def status(self, request: web.Request) -> web.Response:
        queues, report = await queue_standings(self.pool, self.leader,
                                               per_cluster=per_cluster_asked(request))
        body: dict[str, Any] = {
            "at": datetime.now(UTC).isoformat(), "leader": leader_json(report),
            "reasons_unavailable": None if report is not None else self.leader.unavailable,
            "queues": queues, "growth": growth_of(report),
            # The queue tree from the leader's picture (`lockgate status --tree`); null when
            # no leader answered: the tree's shares are the leader's alone.
            "tree": None if report is None else report.get("tree") or [],
            "tree_problem": None if report is None else report.get("tree_problem")}
        if report is not None and report.get("history") is not None:
            # Usage history's every node (lockgate.scheduler.history.history_json).
            body["history"] = report["history"]
        return large_json_response(body)

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
                                   "pod carries a lockgate.io/queue label in a managed namespace "
                                   "(one that ran without lockgate's gate is known once its "
                                   "queue binds its namespace)")
            place = (await job_views.queued_place(connection, row)
                     if row.state is JobState.QUEUED else None)
        body: dict[str, Any] = {"pod": {"cluster": row.cluster, "namespace": row.namespace,
                                        "name": row.name, "uid": row.uid, "jobset": row.jobset,
                                        "state": row.state.value,
                                        "last_reason": row.last_reason,
                                        "skipped_gate": row.skipped_gate},
                                "kept_place_of": row.kept_place_of,  # lockgate.places
                                "position": None if place is None else place[0],
                                "queued_in_queue": None if place is None else place[1]}
        body.update(await explain_job(self.leader, row, place))
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


async def explain_job(leader: SchedulerLeader, row: JobRow,
                      place: tuple[int, int] | None) -> dict[str, Any]:
    """Why the pod of `row` waits, as the leader says: "explanation", "message", "estimate",
    "round_skip" and "leader" (None, with "reasons_unavailable", when no leader answers)."""
    return (await explain_rows(leader, [(row, place)]))[0]


async def explain_rows(leader: SchedulerLeader,
                       rows: Sequence[tuple[JobRow, tuple[int, int] | None]]
                       ) -> list[dict[str, Any]]:
    """`explain_job` for many pods, one request to the leader for the queued ones."""
    # A released pod not bound yet may wait for a node its release made the cluster grow for
    # (docs/autoscaling.md): the leader says so too.
    asked = [(job_id(row.cluster, row.uid), place) for row, place in rows
             if row.state is JobState.QUEUED or row.state in _MAY_WAIT_FOR_GROWTH]
    answer = await leader.explain(asked) if asked else None
    explained = {} if answer is None else answer.get("explanations") or {}
    who = leader_json(answer)
    now = time.time()
    found: list[dict[str, Any]] = []
    for row, place in rows:
        entry: dict[str, Any] = {"explanation": None, "reason": None, "summary": None,
                                 "estimate": None,
                                 "round_skip": None, "held_out": None, "leader": who,
                                 "reasons_unavailable": None}
        if row.skipped_gate:
            entry["message"] = (skipped_gate_message(queue=row.queue, namespace=row.namespace)
                                + f". The pod is {row.state.value}.")
        elif row.state is not JobState.QUEUED:
            entry["message"] = f"not waiting: {row.state.of_the_pod}" + (
                f" ({row.last_reason})" if row.last_reason else "")
            said = explained.get(job_id(row.cluster, row.uid))
            explanation = None if not isinstance(said, dict) else said.get("explanation")
            if (isinstance(said, dict) and isinstance(explanation, dict)
                    and explanation.get("growth_standing")):
                entry.update({"explanation": explanation, "summary": said.get("summary"),
                              "message": explanation.get("message")})
        elif answer is None:
            where = "" if place is None else f"{_ordinal(place[0])} of {place[1]} in line; "
            entry["message"] = f"queued, {where}why it waits is unavailable: {leader.unavailable}"
            entry["summary"] = "reason unavailable: no leader"
            entry["reasons_unavailable"] = leader.unavailable
        else:
            said = explained.get(job_id(row.cluster, row.uid))
            explanation = None if not isinstance(said, dict) else said.get("explanation")
            if said is not None and explanation is not None:
                entry.update({"explanation": explanation, "reason": explanation.get("reason"),
                              "summary": said.get("summary"),
                              "message": explanation.get("message"),
                              "estimate": said.get("estimate"),
                              "round_skip": said.get("round_skip")})
            else:
                held_out = None if not isinstance(said, dict) else said.get("held_out")
                entry["held_out"] = held_out
                entry["summary"] = {"expired": "past its maximum time queued",
                                    "backing_off": "release failed: retrying"}.get(
                                        held_out or "", "new: next round")
                entry["message"] = _held_out_message(
                    held_out, None if not isinstance(said, dict) else said.get("retry_due"),
                    now) or ("queued, and new to the scheduler: its next round looks at it "
                             "(Postgres has the pod; the leader has not read it yet)")
        found.append(entry)
    return found


# Released pods whose release may have been for growth: the gate is being removed, or gone and
# the pod not bound yet.
_MAY_WAIT_FOR_GROWTH = frozenset({JobState.RELEASED, JobState.UNGATED})


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _held_out_message(held_out: str | None, retry_due: float | None, now: float) -> str | None:
    """What a pod the scheduler holds out of its queue's line waits for."""
    if held_out == "expired":
        return ("it waited longer than its maximum time queued: lockgate is having it failed "
                "or deleted, and releases it no more")
    if held_out == "backing_off" and retry_due is not None:
        return (f"its release failed; it queues again in {format_duration(retry_due - now)} "
                "(the wait doubles with each failed release)")
    return None
