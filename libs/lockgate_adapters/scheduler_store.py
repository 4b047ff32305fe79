"""Postgres for the fair scheduler: leadership, the change feed it reads, the decisions it writes.

Why one module: the scheduler's guarantees live in these statements.
- Leadership is a session-level advisory lock (`postgres.LEADER_LOCK`) held by one dedicated
  connection. Decisions are written on that same connection, so a scheduler that lost its
  connection (and with it the lock) cannot write: the connection is the fence.
- Reading: load queues, nodes, unfinished jobs and each cluster's growth picture (what its
  autoscaler may still add) once, in one snapshot, and keep that snapshot
  (`lockgate.change_feed.FeedCursor`); afterwards fetch only the rows whose writer
  (`writer_xid`) that snapshot did not see as committed, and keep the new read's snapshot. No
  writer takes a lock for the feed's sake, yet nothing is skipped, whatever order writers commit
  in, and no row version is delivered twice. (Delivering one twice would be harmless anyway: a
  job, queue or node row is applied as the whole current row, replacing what the state held.)
- Writers lock rows in the global order of job_store's docstring: the decisions' jobs are
  locked sorted by (cluster, uid) in a MATERIALIZED CTE before they are updated.
- Writing a round: one transaction marks the decided jobs released — only those still queued,
  so a job is never released twice — and records one `release_decisions` row per job actually
  released, before any command is published. Publishing is recorded afterwards
  (`published_at`), and what was recorded but not published, or published long ago without an
  outcome, is found again by `decisions_to_republish`.
- A connection that dies silently (a peer gone without a FIN, a frozen NAT or proxy) must not
  keep a leader that cannot lead, nor a lock nobody uses: see `SessionLiveness`.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from lockgate.backoff import ControllerBackoff
from lockgate.change_feed import FeedCursor
from lockgate.events import ClusterGrowth
from lockgate.jobs import TERMINAL_STATES, JobState, job_id
from lockgate.max_queued import JobSetMaxQueued
from lockgate.placement import PodPlacement, Taint
from lockgate.queues import QueueSpec
from lockgate.resources import Resources
from lockgate.scheduler import NodeInfo, SchedJob
from lockgate_adapters.growth_store import GROWTH_COLUMNS, growth_of
from lockgate_adapters.postgres import LEADER_LOCK, notify_changes

_TERMINAL = [state.value for state in TERMINAL_STATES]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionLiveness:
    """How both ends of the leader's connection notice that it died silently.

    - Client side: TCP keepalives and TCP_USER_TIMEOUT on the socket (a peer that vanished),
      and a timeout on every command, so no call waits forever; the leader also checks its
      connection every `check_interval` with a `SELECT 1` that must answer within
      `check_timeout` (`check_alive`), which catches what TCP cannot see (a proxy that
      accepts bytes but forwards nothing).
    - Server side: the session's own tcp_keepalives_* and tcp_user_timeout, and
      idle_session_timeout / idle_in_transaction_session_timeout: a live leader is never idle
      that long (it checks in every `check_interval`), so a session idle that long belongs to
      a leader that is gone, and Postgres ends it, which frees the leader lock for a standby.
    - A session frozen mid-command is not idle, so Postgres never ends it: a standby does
      (`end_stuck_leader`) once it has been in one command for `stuck_after`.
    """

    check_interval: float = 2.0
    check_timeout: float = 3.0
    command_timeout: float = 120.0
    idle_session_timeout: float = 30.0
    keepalive_idle: int = 10
    keepalive_interval: int = 5
    keepalive_count: int = 3
    tcp_user_timeout: float = 20.0

    @property
    def stuck_after(self) -> float:
        """How long a leader's session may stay in one command before a standby ends it
        (`end_stuck_leader`): past the leader's own bound for stepping down (a command times
        out, then its next check fails), plus a check interval of margin."""
        return 2 * self.check_interval + self.check_timeout + self.command_timeout

    def server_settings(self) -> dict[str, str]:
        return {
            "idle_session_timeout": f"{int(self.idle_session_timeout * 1000)}",
            "idle_in_transaction_session_timeout": f"{int(self.idle_session_timeout * 1000)}",
            "tcp_keepalives_idle": str(self.keepalive_idle),
            "tcp_keepalives_interval": str(self.keepalive_interval),
            "tcp_keepalives_count": str(self.keepalive_count),
            "tcp_user_timeout": f"{int(self.tcp_user_timeout * 1000)}",
        }

    def socket_options(self) -> list[tuple[int, int, int]]:
        options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
        for name, value in (("TCP_KEEPIDLE", self.keepalive_idle),
                            ("TCP_KEEPINTVL", self.keepalive_interval),
                            ("TCP_KEEPCNT", self.keepalive_count),
                            ("TCP_USER_TIMEOUT", int(self.tcp_user_timeout * 1000))):
            if hasattr(socket, name):  # Linux has them all; others some
                options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
        return options


@dataclass(frozen=True, slots=True)
class QueueChange:
    name: str
    spec: QueueSpec | None  # None: the queue was deleted


@dataclass(frozen=True, slots=True)
class NodeChange:
    cluster: str
    node: str
    info: NodeInfo | None  # None: the node is gone


@dataclass
class Changes:
    """Rows changed since a cursor (or everything, for the first load), and the cursor of the
    read that found them: the next read's starting point."""

    cursor: FeedCursor
    queues: list[QueueChange] = field(default_factory=list)
    nodes: list[NodeChange] = field(default_factory=list)
    jobs: list[SchedJob] = field(default_factory=list)
    # Queued jobs that were released before and came back (the release failed): job id ->
    # (how many releases it had, when it came back), so the scheduler can back off.
    returned: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    # Controllers backing off or remembered (lockgate.backoff): only the first load has them;
    # the leader alone writes them.
    backoffs: list[ControllerBackoff] = field(default_factory=list)
    # What each cluster's autoscaler may still add (migration 035), by cluster: every stored
    # picture in the first load, the changed ones afterwards.
    growth: dict[str, ClusterGrowth] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.queues or self.nodes or self.jobs or self.growth)


@dataclass(frozen=True, slots=True)
class RecordedRelease:
    """A decision recorded in Postgres, with what a release command needs."""

    decision_id: str
    cluster: str
    uid: str
    namespace: str
    name: str
    queue: str
    decided_at: datetime


# Connections -----------------------------------------------------------------------------------

async def connect(dsn: str, *, liveness: SessionLiveness | None = None) -> asyncpg.Connection:
    """A dedicated connection (not from a pool): the leader's (with `liveness`), or the
    listener's."""
    if liveness is None:
        plain: asyncpg.Connection = await asyncpg.connect(dsn)
        return plain
    connection: asyncpg.Connection = await asyncpg.connect(
        dsn, timeout=liveness.check_timeout + liveness.check_interval,
        command_timeout=liveness.command_timeout, server_settings=liveness.server_settings())
    # asyncpg has no socket options of its own: set them on its transport's socket (a
    # private attribute, hence getattr; without it only the liveness checks remain).
    transport = getattr(connection, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        log.warning("no socket to set TCP keepalives on; relying on liveness checks alone")
    else:
        for level, option, value in liveness.socket_options():
            sock.setsockopt(level, option, value)
    return connection


async def check_alive(connection: asyncpg.Connection, *, within_seconds: float) -> None:
    """Raise TimeoutError unless the server answers within `within_seconds` (a silently dead
    connection never does)."""
    await connection.fetchval("SELECT 1", timeout=within_seconds)


async def try_lead(connection: asyncpg.Connection) -> bool:
    """Take leadership if nobody holds it; it lasts as long as this connection's session."""
    return bool(await connection.fetchval("SELECT pg_try_advisory_lock($1)", LEADER_LOCK))


# The backend holding the leader lock ($1: LEADER_LOCK), in this database.
_LEADER_LOCK_HOLDER = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND classid = 0 AND objid = $1 AND objsubid = 1"
)


async def end_stuck_leader(connection: asyncpg.Connection, *,
                           stuck_for_seconds: float) -> int | None:
    """End the leader's session if it has been in one command longer than `stuck_for_seconds`
    (`SessionLiveness.stuck_after`); returns its backend pid, or None.

    A leader whose connection froze mid-message (a proxy that stops forwarding halfway
    through a query) leaves its session "active", waiting for the rest of the message:
    neither idle_session_timeout nor statement_timeout ends it, and TCP keepalives succeed, so
    the lock would be held for ever. By then the leader has stepped down on its own (its
    command timed out and its checks failed), so ending the session only frees the lock. The
    scheduler's role may end sessions of its own role (pg_terminate_backend)."""
    pid = await connection.fetchval(
        f"SELECT a.pid FROM ({_LEADER_LOCK_HOLDER}) l"  # noqa: S608 - a constant query
        " JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE a.pid <> pg_backend_pid() AND a.state = 'active'"
        " AND a.state_change < clock_timestamp() - make_interval(secs => $2)",
        LEADER_LOCK, stuck_for_seconds,
    )
    if pid is None:
        return None
    # Waits (up to 5 s) for it to exit, so the lock is free when this returns.
    ended = await connection.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)
    return int(pid) if ended else None


async def leader_pid(connection: asyncpg.Connection) -> int | None:
    """The backend pid of the current leader's connection, for operators and tests."""
    pid = await connection.fetchval(_LEADER_LOCK_HOLDER, LEADER_LOCK)
    return None if pid is None else int(pid)


# Reading ---------------------------------------------------------------------------------------

_SNAPSHOT = "SELECT pg_current_snapshot()::text"
# Written by a transaction the cursor's snapshot did not see: one range and a few probes of the
# writer_xid index (migration 032).
_UNSEEN = "writer_xid >= $1 OR writer_xid = ANY($2::bigint[])"
_QUEUE_COLUMNS = ("name, priority_factor, cordoned, resource_limits, created_at, updated_at,"
                  " deleted, serial, max_queued, group_timeout_seconds, group_timeout_action")
_NODE_COLUMNS = ("cluster, node, allocatable, unmanaged_usage, schedulable, present, serial,"
                 " labels, taints")
_JOB_COLUMNS = ("cluster, uid, queue, priority, requests, state, node_name, created_at,"
                " release_attempts, state_changed_at, serial, placement::text AS placement,"
                " unschedulable_since, unschedulable_message, controlled, unplaceable_at,"
                " pod_group, pod_group_size, preemptible, priority_class, max_queued,"
                " controller_uid, pod_group_max_size, namespace, name,"
                " COALESCE(queued_since, created_at) AS in_line_since")
# Placements by their JSON text: a million jobs share a handful, and one object per distinct
# text lets the scheduler intern them by identity.
_PLACEMENT_CACHE_SIZE = 4096
_placements: dict[str, PodPlacement] = {}


# Rows turned into jobs between two calls of `load_everything`'s `keep_alive` (about a second
# of work on a busy host).
LOAD_CHUNK = 20_000


async def load_everything(connection: asyncpg.Connection, *,
                          keep_alive: Callable[[], Awaitable[None]] | None = None) -> Changes:
    """Live queues, present nodes, unfinished jobs and every cluster's growth picture, all from
    one snapshot.

    `keep_alive` is awaited between chunks of the rows turned into jobs, after the snapshot's
    transaction: at a million jobs that takes longer than the leader's session may stay idle
    (Postgres would end it, and with it the leader lock), so the leader checks in meanwhile."""
    async with connection.transaction(isolation="repeatable_read", readonly=True):
        cursor = FeedCursor.from_snapshot(await connection.fetchval(_SNAPSHOT))
        queues = await connection.fetch(
            f"SELECT {_QUEUE_COLUMNS} FROM queues WHERE NOT deleted")  # noqa: S608
        nodes = await connection.fetch(
            f"SELECT {_NODE_COLUMNS} FROM cluster_nodes WHERE present")  # noqa: S608
        jobs = await connection.fetch(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state <> ALL($1::text[])",  # noqa: S608
            _TERMINAL)
        backoffs = await connection.fetch(
            "SELECT cluster, controller_uid, attempts, given_up_at, until"
            " FROM controller_backoffs")
        growth = await connection.fetch(
            f"SELECT {GROWTH_COLUMNS} FROM cluster_growth")  # noqa: S608
    changes = _changes(cursor, queues, nodes, [], growth)
    ordered = sorted(jobs, key=_serial)
    for start in range(0, len(ordered), LOAD_CHUNK):
        changes.jobs += [_sched_job(r) for r in ordered[start:start + LOAD_CHUNK]]
        if keep_alive is not None:
            await keep_alive()
    changes.returned = _returned(jobs)
    changes.backoffs = [
        ControllerBackoff(cluster=r["cluster"], controller_uid=r["controller_uid"],
                          attempts=r["attempts"], given_up_at=r["given_up_at"].timestamp(),
                          until=r["until"].timestamp())
        for r in backoffs]
    return changes


async def changes_since(connection: asyncpg.Connection, cursor: FeedCursor) -> Changes:
    """Every queue, node and job row written by a transaction `cursor`'s snapshot did not see
    as committed, from one snapshot, whose cursor the result carries."""
    async with connection.transaction(isolation="repeatable_read", readonly=True):
        # First: a repeatable-read transaction's snapshot is taken by its first statement.
        newest = FeedCursor.from_snapshot(await connection.fetchval(_SNAPSHOT))
        unseen = (cursor.xmax, list(cursor.in_progress))
        queues = await connection.fetch(
            f"SELECT {_QUEUE_COLUMNS} FROM queues WHERE {_UNSEEN}", *unseen)  # noqa: S608
        nodes = await connection.fetch(
            f"SELECT {_NODE_COLUMNS} FROM cluster_nodes WHERE {_UNSEEN}", *unseen)  # noqa: S608
        jobs = await connection.fetch(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE {_UNSEEN}", *unseen)  # noqa: S608
        growth = await connection.fetch(
            f"SELECT {GROWTH_COLUMNS} FROM cluster_growth WHERE {_UNSEEN}",  # noqa: S608
            *unseen)
    return _changes(newest, queues, nodes, jobs, growth)




async def kept_places(connection: asyncpg.Connection, keys: Sequence[tuple[str, str]]
                      ) -> dict[tuple[str, str], str]:
    """The name of the deleted pod whose place each job kept (lockgate.places), by (cluster,
    uid); jobs that kept none are missing."""
    if not keys:
        return {}
    rows = await connection.fetch(
        "SELECT cluster, uid, kept_place_of FROM jobs"
        " WHERE (cluster, uid) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
        " AND kept_place_of <> ''",
        [cluster for cluster, _ in keys], [uid for _, uid in keys])
    return {(r["cluster"], r["uid"]): r["kept_place_of"] for r in rows}


def _changes(cursor: FeedCursor, queues: Sequence[asyncpg.Record], nodes: Sequence[asyncpg.Record],
             jobs: Sequence[asyncpg.Record], growth: Sequence[asyncpg.Record] = ()) -> Changes:
    return Changes(
        cursor=cursor,
        queues=[_queue_change(r) for r in sorted(queues, key=_serial)],
        nodes=[_node_change(r) for r in sorted(nodes, key=_serial)],
        jobs=[_sched_job(r) for r in sorted(jobs, key=_serial)],
        returned=_returned(jobs),
        growth={r["cluster"]: growth_of(r) for r in sorted(growth, key=_serial)},
    )


def _returned(jobs: Sequence[asyncpg.Record]) -> dict[str, tuple[int, datetime]]:
    return {job_id(r["cluster"], r["uid"]): (int(r["release_attempts"]), r["state_changed_at"])
            for r in jobs if r["state"] == JobState.QUEUED and r["release_attempts"]}


def _serial(record: asyncpg.Record) -> int:
    return int(record["serial"])


def _json(value: Any) -> Any:
    """jsonb arrives decoded or as text, depending on the connection's codecs."""
    return json.loads(value) if isinstance(value, str) else value


def _queue_change(record: asyncpg.Record) -> QueueChange:
    if record["deleted"]:
        return QueueChange(record["name"], None)
    spec = QueueSpec(
        name=record["name"],
        priority_factor=record["priority_factor"],
        cordoned=record["cordoned"],
        resource_limits=_json(record["resource_limits"]) or {},
        max_queued=_json(record["max_queued"]),
        created_at=record["created_at"],
        updated_at=record["updated_at"],
        group_timeout_seconds=record["group_timeout_seconds"],
        group_timeout_action=record["group_timeout_action"],
    )
    return QueueChange(spec.name, spec)


def _node_change(record: asyncpg.Record) -> NodeChange:
    if not record["present"]:
        return NodeChange(record["cluster"], record["node"], None)
    info = NodeInfo(
        allocatable=Resources(_json(record["allocatable"]) or {}),
        unmanaged_usage=Resources(_json(record["unmanaged_usage"]) or {}),
        schedulable=record["schedulable"],
        labels=_json(record["labels"]) or {},
        taints=tuple(Taint.model_validate(t) for t in _json(record["taints"]) or ()),
    )
    return NodeChange(record["cluster"], record["node"], info)


def _placement(text: str | None) -> PodPlacement | None:
    if text is None:
        return None
    placement = _placements.get(text)
    if placement is None:
        if len(_placements) >= _PLACEMENT_CACHE_SIZE:
            _placements.clear()
        placement = _placements[text] = PodPlacement.model_validate_json(text)
    return placement


def _sched_job(record: asyncpg.Record) -> SchedJob:
    since = record["unschedulable_since"]
    return SchedJob(
        job_id=job_id(record["cluster"], record["uid"]),
        queue=record["queue"],
        cluster=record["cluster"],
        requests=Resources(_json(record["requests"]) or {}),
        priority=record["priority"],
        # A job that kept a deleted pod's place is ordered, and its maximum time queued counts,
        # from when that place was taken (lockgate.places).
        created_at=record["in_line_since"].timestamp(),
        state=JobState(record["state"]),
        node_name=record["node_name"],
        placement=_placement(record["placement"]),
        unschedulable_since=None if since is None else since.timestamp(),
        unschedulable_message=record["unschedulable_message"],
        controlled=record["controlled"],
        unplaceable=record["unplaceable_at"] is not None,
        group=record["pod_group"],
        group_size=record["pod_group_size"],
        group_max_size=record["pod_group_max_size"],
        preemptible=record["preemptible"],
        priority_class=record["priority_class"],
        max_queued=_jobset_max_queued(record["max_queued"]),
        controller=record["controller_uid"],
        # Carried with the job (the state keeps them): the leader tells a pod without asking
        # Postgres for its name again. A million jobs share a few namespaces.
        namespace=sys.intern(record["namespace"]),
        name=record["name"],
    )


def _jobset_max_queued(value: Any) -> JobSetMaxQueued | None:
    found = _json(value)
    return None if not found else JobSetMaxQueued.model_validate(found)


# Giving up on released pods kube-scheduler cannot place -------------------------------------

@dataclass(frozen=True, slots=True)
class BackoffRow:
    """A controller's back-off as stored, with the pod whose give-up set it."""

    backoff: ControllerBackoff
    namespace: str
    pod: str


async def record_unplaceable(connection: asyncpg.Connection, *, keys: Sequence[tuple[str, str]],
                             reasons: Sequence[str], at: datetime,
                             backoffs: Sequence[BackoffRow] = ()) -> int:
    """Mark released, still unbound jobs as given up on (unplaceable_at, last_reason), and
    store the back-offs of their controllers that this starts, in one transaction; returns how
    many job rows changed. Jobs that got bound meanwhile are left alone; jobs already deleted
    without ever being bound are marked too: the ungater, told first, may have deleted the pod
    (and queue-store recorded that) before this runs."""
    if not keys:
        return 0
    async with connection.transaction():
        if backoffs:  # rows only the leader writes: nobody waits for them
            await _store_backoffs(connection, backoffs)
        result = await connection.execute(
            "WITH locked AS MATERIALIZED (SELECT j.cluster, j.uid FROM jobs j"
            " JOIN unnest($1::text[], $2::text[]) AS k(cluster, uid)"
            " ON j.cluster = k.cluster AND j.uid = k.uid"
            " ORDER BY j.cluster, j.uid FOR UPDATE OF j)"
            " UPDATE jobs j SET unplaceable_at = $4, last_reason = t.reason,"
            " serial = nextval('change_serial'), writer_xid = pg_current_xact_id()::text::bigint"
            " FROM locked l, unnest($1::text[], $2::text[], $3::text[]) AS t(cluster, uid, reason)"
            " WHERE j.cluster = l.cluster AND j.uid = l.uid"
            " AND j.cluster = t.cluster AND j.uid = t.uid"
            " AND (j.state IN ('released', 'ungated')"
            " OR (j.state = 'deleted' AND j.node_name IS NULL AND j.released_at IS NOT NULL))"
            " AND j.unplaceable_at IS NULL",
            [k[0] for k in keys], [k[1] for k in keys], list(reasons), at)
        changed = int(result.split()[-1])
        if changed:
            await notify_changes(connection, "jobs")
    return changed


# Writing decisions -----------------------------------------------------------------------------

async def record_releases(
    connection: asyncpg.Connection,
    *,
    decisions: Sequence[tuple[str, str, str]],
    decided_at: datetime,
    decided_by: str,
) -> list[RecordedRelease]:
    """Release the jobs still queued among `decisions` ((decision_id, cluster, uid) each) and
    record their decisions, in one transaction; returns the releases actually recorded.

    Must run on the leader's connection: if it lost the session (and the leader lock), this
    fails instead of writing.
    """
    if not decisions:
        return []
    ids, clusters, uids = (list(column) for column in zip(*decisions, strict=True))
    async with connection.transaction():
        rows = await connection.fetch(
            # Locked sorted first (job_store's global lock order), only those still queued.
            "WITH locked AS MATERIALIZED (SELECT j.cluster, j.uid, d.decision_id FROM jobs j"
            " JOIN unnest($1::text[], $2::text[], $3::text[]) AS d(decision_id, cluster, uid)"
            " ON j.cluster = d.cluster AND j.uid = d.uid WHERE j.state = 'queued'"
            " ORDER BY j.cluster, j.uid FOR UPDATE OF j"
            "), released AS ("
            " UPDATE jobs j SET state = 'released', decision_id = d.decision_id,"
            " released_at = $4, state_changed_at = $4,"
            " release_attempts = j.release_attempts + 1, serial = nextval('change_serial'),"
            " writer_xid = pg_current_xact_id()::text::bigint"
            " FROM locked d"
            " WHERE j.cluster = d.cluster AND j.uid = d.uid AND j.state = 'queued'"
            " RETURNING d.decision_id, j.cluster, j.uid, j.namespace, j.name, j.queue"
            "), recorded AS ("
            " INSERT INTO release_decisions (decision_id, cluster, uid, queue, decided_at,"
            " decided_by)"
            " SELECT decision_id, cluster, uid, queue, $4, $5 FROM released"
            ")"
            " SELECT decision_id, cluster, uid, namespace, name, queue FROM released",
            ids, clusters, uids, decided_at, decided_by,
        )
        if rows:
            await notify_changes(connection, "jobs")
    return [RecordedRelease(decided_at=decided_at, **dict(row.items())) for row in rows]


async def mark_published(connection: asyncpg.Connection, decision_ids: Sequence[str],
                         at: datetime) -> None:
    # Locked by id first: ingest records outcomes on these rows concurrently, in that order.
    await connection.execute(
        "WITH locked AS MATERIALIZED (SELECT decision_id FROM release_decisions"
        " WHERE decision_id = ANY($1::text[]) ORDER BY decision_id FOR UPDATE)"
        " UPDATE release_decisions d SET published_at = $2 FROM locked l"
        " WHERE d.decision_id = l.decision_id",
        list(decision_ids), at,
    )


async def decisions_to_republish(
    connection: asyncpg.Connection, *, unanswered_for: timedelta, now: datetime,
    include_unpublished: bool, limit: int = 10_000,
) -> list[RecordedRelease]:
    """Decisions in force whose job is still only released: never published (when
    `include_unpublished`: a previous leader died in between), or published more than
    `unanswered_for` ago without the job moving on (a command or outcome went missing)."""
    rows = await connection.fetch(
        "SELECT d.decision_id, d.cluster, d.uid, j.namespace, j.name, d.queue, d.decided_at"
        " FROM jobs j JOIN release_decisions d ON d.decision_id = j.decision_id"
        " WHERE j.state = 'released' AND d.outcome IS NULL"
        " AND ((d.published_at IS NULL AND $1) OR d.published_at < $2)"
        " ORDER BY d.decided_at LIMIT $3",
        include_unpublished, now - unanswered_for, limit,
    )
    return [RecordedRelease(**dict(row.items())) for row in rows]


# Back-off per controller (lockgate.backoff) ---------------------------------------------------

async def _store_backoffs(connection: asyncpg.Connection, rows: Sequence[BackoffRow]) -> None:
    await connection.execute(
        "INSERT INTO controller_backoffs"
        " (cluster, controller_uid, attempts, given_up_at, until, namespace, pod)"
        " SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::timestamptz[],"
        " $5::timestamptz[], $6::text[], $7::text[])"
        " ON CONFLICT (cluster, controller_uid) DO UPDATE SET attempts = EXCLUDED.attempts,"
        " given_up_at = EXCLUDED.given_up_at, until = EXCLUDED.until,"
        " namespace = EXCLUDED.namespace, pod = EXCLUDED.pod",
        [r.backoff.cluster for r in rows], [r.backoff.controller_uid for r in rows],
        [r.backoff.attempts for r in rows],
        [datetime.fromtimestamp(r.backoff.given_up_at, UTC) for r in rows],
        [datetime.fromtimestamp(r.backoff.until, UTC) for r in rows],
        [r.namespace for r in rows], [r.pod for r in rows])


async def forget_backoffs(connection: asyncpg.Connection,
                          backoffs: Sequence[ControllerBackoff]) -> None:
    """Delete these back-offs (reset by a bind, or over long enough), each only as it was read:
    a row a give-up has changed since stays."""
    if not backoffs:
        return
    await connection.execute(
        "DELETE FROM controller_backoffs b"
        " USING unnest($1::text[], $2::text[], $3::timestamptz[]) AS t(cluster, uid, given_up_at)"
        " WHERE b.cluster = t.cluster AND b.controller_uid = t.uid"
        " AND b.given_up_at = t.given_up_at",
        [b.cluster for b in backoffs], [b.controller_uid for b in backoffs],
        [datetime.fromtimestamp(b.given_up_at, UTC) for b in backoffs])
