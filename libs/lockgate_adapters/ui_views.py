"""Read-only Postgres views for the web UI: pages of waiting pods, a job set's pods, clusters'
capacity and use by queue, evictions.

Why separate from `job_views`: every answer here is one page, cut in Postgres (LIMIT/OFFSET over
an index, migration 016), so a page costs the same with a hundred queued pods or a hundred
thousand. `job_views` answers a person's one-off command and may pass over every job.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import asyncpg

from lockgate.backoff import ControllerBackoff
from lockgate.ingest import JobRow
from lockgate.jobs import CAPACITY_HOLDING_STATES, JobState
from lockgate_adapters import job_store
from lockgate_adapters.job_views import RELEASE_ORDER
from lockgate_adapters.postgres import AnyConnection

_HOLDING = sorted(state.value for state in CAPACITY_HOLDING_STATES)
_RELEASE_ORDER = RELEASE_ORDER


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[JobRow]
    total: int  # rows matching the filters
    # 1-based release positions of `rows` in their whole queue (waiting pages).
    positions: list[int] = field(default_factory=list)
    queue_total: int = 0  # the queue's queued pods, filters aside (waiting pages)


async def waiting_pods(connection: AnyConnection, *, queue: str, cluster: str | None,
                       namespace: str | None, offset: int, limit: int) -> Page:
    """A page of the queue's queued pods in release order, each with its position in the whole
    queue. Unfiltered, an index range scan of jobs_queued_in_line, OFFSET then LIMIT (the
    positions follow from OFFSET); filtered by cluster or namespace, one pass over the queue's
    queued pods in that index, numbering them, to give each its place in the whole queue."""
    counted = await connection.fetchrow(
        "SELECT count(*) AS queue_total, count(*) FILTER (WHERE ($2::text IS NULL"
        " OR cluster = $2) AND ($3::text IS NULL OR namespace = $3)) AS total"
        " FROM jobs WHERE queue = $1 AND state = 'queued'", queue, cluster, namespace)
    assert counted is not None
    if cluster is None and namespace is None:
        records = await connection.fetch(
            f"SELECT {job_store._JOB_COLUMNS} FROM jobs"  # noqa: S608 - constant columns
            f" WHERE queue = $1 AND state = 'queued' ORDER BY {_RELEASE_ORDER}"
            " OFFSET $2 LIMIT $3", queue, offset, limit)
        positions = list(range(offset + 1, offset + 1 + len(records)))
        rows = [job_store._job_row(r) for r in records]
    else:
        records = await connection.fetch(
            f"SELECT * FROM (SELECT {job_store._JOB_COLUMNS},"  # noqa: S608 - constant columns
            f" row_number() OVER (ORDER BY {_RELEASE_ORDER}) AS position FROM jobs"
            " WHERE queue = $1 AND state = 'queued') in_line"
            " WHERE ($2::text IS NULL OR cluster = $2) AND ($3::text IS NULL OR namespace = $3)"
            " ORDER BY position OFFSET $4 LIMIT $5", queue, cluster, namespace, offset, limit)
        positions = [int(r["position"]) for r in records]
        rows = [job_store._job_row(cast(asyncpg.Record, {
            k: v for k, v in r.items() if k != "position"})) for r in records]
    return Page(rows=rows, total=int(counted["total"]),
                positions=positions, queue_total=int(counted["queue_total"]))


async def jobset_pods(connection: AnyConnection, *, queue: str, jobset: str,
                      cluster: str | None, state: JobState | None, offset: int,
                      limit: int) -> Page:
    """A page of one job set's pods (oldest first), filtered by cluster and state."""
    where = ("queue = $1 AND jobset = $2 AND ($3::text IS NULL OR cluster = $3)"
             " AND ($4::text IS NULL OR state = $4)")
    state_value = None if state is None else state.value
    total = await connection.fetchval(
        f"SELECT count(*) FROM jobs WHERE {where}",  # noqa: S608 - constant text
        queue, jobset, cluster, state_value)
    records = await connection.fetch(
        f"SELECT {job_store._JOB_COLUMNS} FROM jobs WHERE {where}"  # noqa: S608
        " ORDER BY created_at, cluster, uid OFFSET $5 LIMIT $6",
        queue, jobset, cluster, state_value, offset, limit)
    return Page(rows=[job_store._job_row(r) for r in records], total=int(total))


async def jobset_counts(connection: AnyConnection, *, queue: str,
                        jobset: str) -> dict[str, dict[str, int]]:
    """cluster → state → pods of the job set."""
    records = await connection.fetch(
        "SELECT cluster, state, count(*) AS n FROM jobs WHERE queue = $1 AND jobset = $2"
        " GROUP BY cluster, state ORDER BY cluster, state", queue, jobset)
    counts: dict[str, dict[str, int]] = {}
    for record in records:
        counts.setdefault(record["cluster"], {})[record["state"]] = int(record["n"])
    return counts


async def clusters(connection: AnyConnection) -> list[dict[str, Any]]:
    """Each cluster's capacity (its present, schedulable nodes), what pods lockgate does not
    manage use, what each queue's pods hold there, and how many wait."""
    nodes = await connection.fetch(
        "SELECT cluster, allocatable, unmanaged_usage, schedulable FROM cluster_nodes"
        " WHERE present ORDER BY cluster, node")
    held = await connection.fetch(
        "SELECT cluster, queue, r.key AS resource, sum(r.value::numeric) AS amount,"
        " count(DISTINCT uid) AS pods"
        " FROM jobs, jsonb_each_text(requests) AS r(key, value)"
        " WHERE state = ANY($1::text[]) GROUP BY cluster, queue, r.key", _HOLDING)
    pods_held = await connection.fetch(
        "SELECT cluster, queue, count(*) AS n FROM jobs WHERE state = ANY($1::text[])"
        " GROUP BY cluster, queue", _HOLDING)
    queued = await connection.fetch(
        "SELECT cluster, queue, count(*) AS n FROM jobs WHERE state = 'queued'"
        " GROUP BY cluster, queue")
    names = await connection.fetch("SELECT name FROM clusters ORDER BY name")
    found: dict[str, dict[str, Any]] = {}

    def entry(cluster: str) -> dict[str, Any]:
        return found.setdefault(cluster, {
            "name": cluster, "nodes": 0, "schedulable_nodes": 0,
            "capacity": defaultdict(int), "unmanaged": defaultdict(int), "queues": {}})

    def queue_entry(cluster: str, queue: str) -> dict[str, Any]:
        queues: dict[str, dict[str, Any]] = entry(cluster)["queues"]
        return queues.setdefault(queue, {"holding": defaultdict(int), "pods": 0, "queued": 0})

    for record in names:
        entry(record["name"])
    for node in nodes:
        cluster = entry(node["cluster"])
        cluster["nodes"] += 1
        if not node["schedulable"]:
            continue
        cluster["schedulable_nodes"] += 1
        for resource, amount in _json(node["allocatable"]).items():
            cluster["capacity"][resource] += int(amount)
        for resource, amount in _json(node["unmanaged_usage"]).items():
            cluster["unmanaged"][resource] += int(amount)
    for record in held:
        queue_entry(record["cluster"], record["queue"])["holding"][record["resource"]] += int(
            record["amount"])
    for record in pods_held:
        queue_entry(record["cluster"], record["queue"])["pods"] = int(record["n"])
    for record in queued:
        queue_entry(record["cluster"], record["queue"])["queued"] = int(record["n"])
    answer = []
    for cluster in sorted(found.values(), key=lambda c: c["name"]):
        answer.append({
            **cluster, "capacity": dict(cluster["capacity"]),
            "unmanaged": dict(cluster["unmanaged"]),
            "queues": [{"queue": name, "pods": q["pods"], "queued": q["queued"],
                        "holding": dict(q["holding"])}
                       for name, q in sorted(cluster["queues"].items())]})
    return answer


@dataclass(frozen=True, slots=True)
class EvictionRow:
    eviction_id: str
    cluster: str
    uid: str
    namespace: str
    name: str
    queue: str
    kind: str
    action: str
    for_queue: str | None
    for_uid: str | None
    message: str
    decided_at: datetime
    decided_by: str
    published_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        return {"eviction_id": self.eviction_id, "cluster": self.cluster, "uid": self.uid,
                "namespace": self.namespace, "name": self.name, "queue": self.queue,
                "kind": self.kind, "action": self.action, "for_queue": self.for_queue,
                "for_uid": self.for_uid, "message": self.message,
                "decided_at": self.decided_at.isoformat(), "decided_by": self.decided_by,
                "published_at": None if self.published_at is None
                else self.published_at.isoformat()}


_EVICTION_COLUMNS = ("eviction_id, cluster, uid, namespace, name, queue, kind, action, for_queue,"
                     " for_uid, message, decided_at, decided_by, published_at")


async def evictions(connection: AnyConnection, *, queue: str | None, cluster: str | None,
                    offset: int, limit: int) -> tuple[list[EvictionRow], int]:
    """Newest first (evictions_decided), filtered by the evicted pod's queue and cluster."""
    where = "($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR cluster = $2)"
    total = await connection.fetchval(
        f"SELECT count(*) FROM evictions WHERE {where}", queue, cluster)  # noqa: S608
    records = await connection.fetch(
        f"SELECT {_EVICTION_COLUMNS} FROM evictions WHERE {where}"  # noqa: S608
        " ORDER BY decided_at DESC, eviction_id OFFSET $3 LIMIT $4",
        queue, cluster, offset, limit)
    return [EvictionRow(**dict(r.items())) for r in records], int(total)


async def eviction_of(connection: AnyConnection, *, cluster: str,
                      uid: str) -> EvictionRow | None:
    record = await connection.fetchrow(
        f"SELECT {_EVICTION_COLUMNS} FROM evictions"  # noqa: S608 - constant columns
        " WHERE cluster = $1 AND uid = $2", cluster, uid)
    return None if record is None else EvictionRow(**dict(record.items()))


async def controller_backoffs(connection: AnyConnection) -> list[ControllerBackoff]:
    """Controllers backing off (lockgate.backoff), as the scheduler leader recorded them."""
    records = await connection.fetch(
        "SELECT cluster, controller_uid, attempts, given_up_at, until FROM controller_backoffs")
    return [ControllerBackoff(cluster=r["cluster"], controller_uid=r["controller_uid"],
                              attempts=r["attempts"], given_up_at=r["given_up_at"].timestamp(),
                              until=r["until"].timestamp()) for r in records]


def _json(value: Any) -> dict[str, Any]:
    if isinstance(value, str):  # a connection without the pool's jsonb codec
        loaded = json.loads(value)
        return loaded if isinstance(loaded, dict) else {}
    return dict(value or {})


