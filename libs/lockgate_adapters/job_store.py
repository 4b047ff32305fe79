"""Postgres reads and writes of jobs, queues, jobsets, clusters and their nodes.

Why one module: these tables are lockgate's shared truth, written by queue-store (ingest, queue
admin) and the fair scheduler (decisions) and read by the scheduler and the admin API. Keeping
every statement about them here keeps the change-feed rules in one place:

- every changed row of jobs, queues or cluster_nodes gets `serial = nextval('change_serial')`
  and `writer_xid = pg_current_xact_id()` (an INSERT's default; lockgate.change_feed);
- the writer calls `postgres.notify_changes` before committing.

No lock is taken for the feed's sake: writers commit concurrently (several queue-store
instances in one consumer group, the scheduler). Rows are locked in one global order, so their
locks never wait in a cycle:

  clusters (by name) < job buckets < jobs (by cluster, uid) < left_places (by cluster, uid)
  < cluster_nodes (by cluster, node) < cluster_snapshot_pods < jobsets < release_decisions
  (by decision id).

Each writer first locks the existing rows it may change, table by table in that order, each
table's rows in one statement sorted by key (`lock_current_rows`; the scheduler's statements
lock their jobs in a sorted MATERIALIZED CTE first), and only then inserts new rows. Rows it
did not find cannot have been inserted meanwhile by another writer, or its inserts could wait
for a writer waiting for it: a batch first creates its clusters' rows (ON CONFLICT DO NOTHING,
sorted), and takes an advisory lock per bucket of its job keys (`job_bucket`, sorted) before
it reads any job; only ingest inserts jobs and left places, always under those buckets.
A statement that waits only for locks later in the order than any it holds cannot close a
cycle. Two exceptions, both safe: rows only the leader writes
(controller_backoffs, evictions) nobody else waits for; collecting old left_places skips rows
locked by others and is a batch's last statement, so nothing waits after it. Cancelling a job
set (namespace_store.cancel_jobs) locks its jobs sorted, then its jobset_cancellations row, then
its ephemeral_namespaces rows: tables no other writer of jobs locks.

A pod-event batch locks its clusters' rows FOR SHARE, a snapshot or capacity batch (which
changes the row) FOR UPDATE: batches of pod events run concurrently, and a snapshot's scope is
read with no pod batch of its cluster in flight, as under the old global lock (a job stored
concurrently with the snapshot would be judged by neither).

Functions take a connection already inside a transaction where they write, so callers choose
the transaction's extent (queue-store folds a whole batch in one). Bulk writes go through
`unnest` of column arrays: one statement per table per batch, whatever the batch size; jobs, the
widest and most numerous rows, are COPYed into a staging table and merged by one statement.

Sections: ingest (lock + read, write), queues, job views for operators.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import asyncpg
from aiokafka.partitioner import murmur2

from lockgate.ingest import (
    ClusterRow,
    CurrentRows,
    IngestResult,
    JobRow,
    Listing,
    NodeRow,
    RowsToRead,
)
from lockgate.jobs import TERMINAL_STATES, JobState
from lockgate.places import LeftPlace
from lockgate.queues import MaxQueued, QueueSpec
from lockgate_adapters.postgres import AnyConnection, notify_changes

_TERMINAL = [state.value for state in TERMINAL_STATES]

# Ingest: read and lock ------------------------------------------------------------------------

# Statements interpolate only these constant column lists, never input: hence the S608 (SQL
# built from strings) suppressions below.
_JOB_COLUMNS = (
    "cluster, uid, namespace, name, queue, jobset, priority, requests, state, node_name, "
    "created_at, state_changed_at, released_at, ungated_at, running_at, finished_at, "
    "decision_id, release_attempts, last_reason, placement, unschedulable_since, "
    "unschedulable_message, controlled, pod_group, pod_group_size, preemptible, priority_class, "
    "max_queued, controller_uid, pod_group_max_size, queued_since, kept_place_of, skipped_gate"
)
_JOB_COLUMNS_OF_J = ", ".join(f"j.{column.strip()}" for column in _JOB_COLUMNS.split(","))


async def lock_current_rows(connection: AnyConnection, needed: RowsToRead) -> CurrentRows:
    """Read, `FOR UPDATE`, every row a batch may change (see `lockgate.ingest.CurrentRows`),
    in the global lock order of this module's docstring.

    The jobs of a snapshot's scope and the possible heirs of a deleted pod are found by plain
    reads, then locked with the batch's own jobs in one sorted statement, which returns each as
    it is once locked: a row that left the scope meanwhile comes too, and the fold judges every
    row again (`SnapshotScope.judges`, heirs must still be queued).
    """
    current = CurrentRows()
    await _lock_clusters(connection, needed, current)
    await _lock_job_buckets(connection, needed)
    keys = set(needed.job_keys)
    for scope in needed.snapshots:
        # Unfinished jobs it did not list (it may delete them), and those it says ended.
        records = await connection.fetch(
            "SELECT cluster, uid FROM jobs"
            " WHERE cluster = $1 AND state <> ALL($4::text[]) AND ("
            " (created_at < $2 AND state_changed_at < $3 AND uid <> ALL($5::text[]))"
            " OR uid = ANY($6::text[]))",
            scope.cluster, scope.cutoff, scope.listed_at, _TERMINAL, sorted(scope.listed),
            sorted(scope.ended),
        )
        keys.update((r["cluster"], r["uid"]) for r in records)
    if needed.heirs_of:
        # Queued jobs that may replace a pod gone in this batch, stored before its deletion.
        clusters, namespaces, names, controllers = zip(*sorted(needed.heirs_of), strict=True)
        records = await connection.fetch(
            "SELECT j.cluster, j.uid FROM jobs j"
            " JOIN unnest($1::text[], $2::text[], $3::text[], $4::text[])"
            " AS k(cluster, namespace, name, controller_uid)"
            " ON j.cluster = k.cluster AND j.namespace = k.namespace"
            " AND (j.name = k.name OR (k.controller_uid <> ''"
            " AND j.controller_uid = k.controller_uid))"
            " WHERE j.state = 'queued' AND j.queued_since IS NULL",
            list(clusters), list(namespaces), list(names), list(controllers))
        keys.update((r["cluster"], r["uid"]) for r in records)
    if keys:
        clusters, uids = zip(*sorted(keys), strict=True)
        records = await connection.fetch(
            f"SELECT {_JOB_COLUMNS_OF_J} FROM jobs j"  # noqa: S608
            " JOIN unnest($1::text[], $2::text[]) AS k(cluster, uid)"
            " ON j.cluster = k.cluster AND j.uid = k.uid"
            " ORDER BY j.cluster, j.uid FOR UPDATE OF j",
            list(clusters), list(uids),
        )
        current.jobs.update((row.key, row) for row in map(_job_row, records))
    if needed.job_keys:
        clusters, uids = zip(*sorted(needed.job_keys), strict=True)
        listed = await connection.fetch(
            "SELECT p.cluster, p.uid, p.state FROM cluster_snapshot_pods p"
            " JOIN unnest($1::text[], $2::text[]) AS k(cluster, uid)"
            " ON p.cluster = k.cluster AND p.uid = k.uid",
            list(clusters), list(uids),
        )
        current.listed_by_latest_snapshot = {
            (r["cluster"], r["uid"]): None if r["state"] is None else JobState(r["state"])
            for r in listed}
    if needed.place_namespaces:
        await _lock_places(connection, needed, current)
    if needed.skipped_gate_queues:
        # Read, not locked: a binding changed concurrently applies to the pod's next event.
        records = await connection.fetch(
            f"SELECT {_QUEUE_COLUMNS} FROM queues"  # noqa: S608
            " WHERE name = ANY($1::text[]) AND NOT deleted", sorted(needed.skipped_gate_queues))
        current.queue_specs = {spec.name: spec for spec in map(_queue_spec, records)}
    if needed.capacity_clusters:
        records = await connection.fetch(
            "SELECT cluster, node, allocatable, unmanaged_usage, schedulable, present,"
            " observed_at, labels, taints FROM cluster_nodes WHERE cluster = ANY($1::text[])"
            " ORDER BY cluster, node FOR UPDATE",
            sorted(needed.capacity_clusters),
        )
        for record in records:
            node = NodeRow(**_as_dict(record))
            current.nodes[node.key] = node
    return current


# How far behind a job set's last sighting may be before a batch writes it (`write_ingest`).
JOBSET_LAST_SEEN_STEP = timedelta(seconds=60)
_CLUSTER_COLUMNS = "name, capacity_observed_at, last_snapshot_id, last_snapshot_at"
# Advisory locks (the two-int form, apart from postgres.py's single-key locks): one per bucket
# of job keys. The bucket is the pod uid's Kafka partition among JOB_BUCKETS (murmur2, as
# Kafka's default partitioner): with a partition count dividing it, queue-store instances
# owning different partitions never share a bucket.
JOB_BUCKET_LOCKS = 7_310
JOB_BUCKETS = 64


def job_bucket(uid: str) -> int:
    return int(murmur2(uid.encode()) & 0x7FFFFFFF) % JOB_BUCKETS


async def _lock_job_buckets(connection: AnyConnection, needed: RowsToRead) -> None:
    """The buckets of the batch's own job keys, in order, before any job row: whoever may
    insert a job row holds its bucket, so the rows a batch does not find cannot be inserted by
    another writer before it commits, and its inserts never wait (module docstring)."""
    buckets = sorted({job_bucket(uid) for _, uid in needed.job_keys})
    if buckets:
        # Volatile functions are evaluated after ORDER BY: the locks are taken in order.
        await connection.execute(
            "SELECT pg_advisory_xact_lock($1, b) FROM unnest($2::int[]) AS t(b) ORDER BY b",
            JOB_BUCKET_LOCKS, buckets)


async def _lock_clusters(connection: AnyConnection, needed: RowsToRead,
                         current: CurrentRows) -> None:
    """The batch's cluster rows, by name: FOR UPDATE those it may change, FOR SHARE the rest
    (a pod-event batch only reads its clusters' latest snapshot). A cluster seen for the first
    time gets its row first (empty until a snapshot or capacity report fills it), so that the
    lock exists and no later insert of it can wait for another writer."""
    changed = needed.changed_clusters
    if not needed.clusters:  # a batch of release outcomes only
        return
    await connection.execute(
        "INSERT INTO clusters (name) SELECT n FROM unnest($1::text[]) AS t(n) ORDER BY n"
        " ON CONFLICT DO NOTHING", sorted(needed.clusters))
    if not changed:
        records = await connection.fetch(
            f"SELECT {_CLUSTER_COLUMNS} FROM clusters"  # noqa: S608
            " WHERE name = ANY($1::text[]) ORDER BY name FOR SHARE",
            sorted(needed.clusters))
    else:
        records = []
        for name in sorted(needed.clusters):  # one mode per row, in name order
            mode = "UPDATE" if name in changed else "SHARE"
            records += await connection.fetch(
                f"SELECT {_CLUSTER_COLUMNS} FROM clusters WHERE name = $1 FOR {mode}",  # noqa: S608
                name)
    for record in records:
        cluster = ClusterRow(**_as_dict(record))
        current.clusters[cluster.name] = cluster


async def _lock_places(connection: AnyConnection, needed: RowsToRead,
                       current: CurrentRows) -> None:
    """The places left in the batch's namespaces (lockgate.places), and every live queue's
    maximum time queued; places older than `needed.place_grace` are left out, as if collected
    (`collect_left_places` deletes them at the end of the batch)."""
    clusters, namespaces = zip(*sorted(needed.place_namespaces), strict=True)
    records = await connection.fetch(
        "SELECT p.cluster, p.uid, p.namespace, p.queue, p.name, p.controller_uid, p.requests,"
        " p.queued_since, p.deleted_at, p.inherited_by FROM left_places p"
        " JOIN unnest($1::text[], $2::text[]) AS k(cluster, namespace)"
        " ON p.cluster = k.cluster AND p.namespace = k.namespace"
        " WHERE p.deleted_at >= now() - make_interval(secs => $3)"
        " ORDER BY p.cluster, p.uid FOR UPDATE OF p",
        list(clusters), list(namespaces), needed.place_grace.total_seconds())
    for record in records:
        place = LeftPlace(**_as_dict(record))
        current.places[place.key] = place
    if not needed.heirs_of:
        # Only a deletion leaves a place (lockgate.places.place_left), and only then does the
        # fold ask for its queue's maximum time queued: no need to read every queue per batch.
        return
    queues = await connection.fetch("SELECT name, max_queued FROM queues WHERE NOT deleted")
    for record in queues:
        found = record["max_queued"]
        found = json.loads(found) if isinstance(found, str) else found
        current.queue_max_queued[record["name"]] = (None if not found
                                                    else MaxQueued.model_validate(found))


def _job_row(record: asyncpg.Record) -> JobRow:
    values = _as_dict(record)
    values["state"] = JobState(values["state"])
    return JobRow(**values)


def _as_dict(record: asyncpg.Record) -> dict[str, Any]:
    values = dict(record.items())
    for key, value in values.items():
        if isinstance(value, str) and key in ("requests", "allocatable", "unmanaged_usage",
                                                     "placement", "labels", "taints",
                                                     "max_queued"):
            values[key] = json.loads(value)  # a connection without the pool's jsonb codec
    return values


# Ingest: write ------------------------------------------------------------------------------

async def write_ingest(connection: AnyConnection, result: IngestResult) -> None:
    """Write a folded batch: new/changed rows only, each changed row taking a new serial."""
    if result.jobs:
        await upsert_jobs(connection, result.jobs)
    if result.nodes:
        await upsert_nodes(connection, result.nodes)
    if result.clusters:
        await upsert_clusters(connection, result.clusters)
    for cluster, listed in result.snapshot_listings.items():
        await replace_snapshot_listing(connection, cluster, listed)
    if result.places:
        await upsert_places(connection, result.places)
    if result.jobsets:
        # last_seen moves only when it is JOBSET_LAST_SEEN_STEP behind: every pod event of a
        # batch sights its job set, and rewriting its row per batch (a new tuple, WAL) was most
        # of the rows a release wrote, for a column nothing reads finer than that.
        await connection.execute(
            "INSERT INTO jobsets (cluster, queue, name, first_seen, last_seen)"
            " SELECT c, q, n, s, s FROM unnest($1::text[], $2::text[], $3::text[],"
            " $4::timestamptz[]) AS t(c, q, n, s) ORDER BY c, q, n"
            " ON CONFLICT (cluster, queue, name)"
            " DO UPDATE SET last_seen = EXCLUDED.last_seen"
            " WHERE jobsets.last_seen < EXCLUDED.last_seen - make_interval(secs => $5)",
            *_columns(result.jobsets, "cluster", "queue", "name", "seen_at"),
            JOBSET_LAST_SEEN_STEP.total_seconds(),
        )
    if result.decision_outcomes:
        # Locked by id first: the leader marks decisions published concurrently.
        await connection.execute(
            "WITH locked AS MATERIALIZED (SELECT decision_id FROM release_decisions"
            " WHERE decision_id = ANY($1::text[]) AND outcome IS NULL"
            " ORDER BY decision_id FOR UPDATE)"
            " UPDATE release_decisions d SET outcome = t.outcome, outcome_at = t.at"
            " FROM locked l,"
            " unnest($1::text[], $2::text[], $3::timestamptz[]) AS t(id, outcome, at)"
            " WHERE d.decision_id = l.decision_id AND d.decision_id = t.id AND d.outcome IS NULL",
            [o.decision_id for o in result.decision_outcomes],
            [o.outcome.value for o in result.decision_outcomes],
            [o.at for o in result.decision_outcomes],
        )


# The staging table of `upsert_jobs`: the jobs columns with the types the merge casts from (the
# jsonb ones as text, so a connection without the pool's jsonb codec copies them alike). A
# temporary table is private to its session, so concurrent writers never see each other's rows;
# it is created once per connection and emptied by TRUNCATE before each use. (ON COMMIT DELETE
# ROWS cost 60-200 ms per commit when measured; a DELETE leaves dead rows only VACUUM, which
# autovacuum never runs on temporary tables, would reclaim.)
_STAGED_JOBS = "lockgate_staged_jobs"
_PREPARE_STAGED_JOBS = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGED_JOBS} ("
    " cluster text, uid text, namespace text, name text, queue text, jobset text,"
    " priority int, requests text, state text, node_name text, created_at timestamptz,"
    " state_changed_at timestamptz, released_at timestamptz, ungated_at timestamptz,"
    " running_at timestamptz, finished_at timestamptz, decision_id text,"
    " release_attempts int, last_reason text, placement text,"
    " unschedulable_since timestamptz, unschedulable_message text, controlled bool,"
    " pod_group text, pod_group_size int, preemptible bool, priority_class text,"
    " max_queued text, controller_uid text, pod_group_max_size int,"
    " queued_since timestamptz, kept_place_of text, skipped_gate bool);"
    f" TRUNCATE {_STAGED_JOBS}")
_JOB_COLUMN_NAMES = tuple(c.strip() for c in _JOB_COLUMNS.split(","))
_JSONB_JOB_COLUMNS = ("requests", "placement", "max_queued")
_job_values = operator.attrgetter(*_JOB_COLUMN_NAMES)
_MERGE_STAGED_JOBS = (
    f"INSERT INTO jobs ({_JOB_COLUMNS}, serial)"  # noqa: S608
    " SELECT " + ", ".join(f"{c}::jsonb" if c in _JSONB_JOB_COLUMNS else c
                           for c in _JOB_COLUMN_NAMES)
    + f", nextval('change_serial') FROM {_STAGED_JOBS}"
    # Sorted: new rows are inserted in the global lock order (module docstring).
    " ORDER BY cluster, uid"
    " ON CONFLICT (cluster, uid) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _JOB_COLUMN_NAMES[2:])
    + ", serial = EXCLUDED.serial, writer_xid = EXCLUDED.writer_xid")


async def upsert_jobs(connection: AnyConnection, rows: Sequence[JobRow]) -> None:
    """Insert or overwrite whole job rows (the caller read them FOR UPDATE and folded them).

    The rows are COPYed into a session-private staging table and merged with one INSERT ...
    SELECT ... ON CONFLICT: COPY is the cheapest way in (binary rows, no parameter arrays to
    build and unnest), and the merge keeps the single statement's semantics (one new serial per
    row, all or nothing, ON CONFLICT for rows that exist).
    """
    if not rows:
        return
    if connection.is_in_transaction():
        await _copy_and_merge_jobs(connection, rows)
    else:
        async with connection.transaction():  # the staging and the merge, all or nothing
            await _copy_and_merge_jobs(connection, rows)


async def _copy_and_merge_jobs(connection: AnyConnection, rows: Sequence[JobRow]) -> None:
    # Emptied first: an earlier call in this transaction or session left its rows there.
    await connection.execute(_PREPARE_STAGED_JOBS)
    await connection.copy_records_to_table(
        _STAGED_JOBS, columns=_JOB_COLUMN_NAMES, records=map(_staged_job, rows))
    await connection.execute(_MERGE_STAGED_JOBS)


def _staged_job(row: JobRow) -> tuple[Any, ...]:
    values = list(_job_values(row))
    values[7] = json.dumps(dict(values[7]))  # requests
    values[8] = JobState(values[8]).value  # state
    values[19] = None if values[19] is None else json.dumps(dict(values[19]))  # placement
    values[27] = None if values[27] is None else json.dumps(dict(values[27]))  # max_queued
    return tuple(values)


async def upsert_places(connection: AnyConnection, places: Sequence[LeftPlace]) -> None:
    """Record places left and taken; a place once taken stays taken (a late or redelivered
    batch cannot hand it out again)."""
    columns = _columns(places, "cluster", "uid", "namespace", "queue", "name", "controller_uid",
                       "requests", "queued_since", "deleted_at", "inherited_by")
    columns[6] = [json.dumps(dict(r)) for r in columns[6]]
    await connection.execute(
        "INSERT INTO left_places (cluster, uid, namespace, queue, name, controller_uid, requests,"
        " queued_since, deleted_at, inherited_by)"
        " SELECT c, u, ns, q, n, cu, r::jsonb, qs, da, ib FROM unnest($1::text[], $2::text[],"
        " $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::timestamptz[],"
        " $9::timestamptz[], $10::text[]) AS t(c, u, ns, q, n, cu, r, qs, da, ib)"
        " ORDER BY c, u"
        " ON CONFLICT (cluster, uid) DO UPDATE SET"
        " inherited_by = COALESCE(left_places.inherited_by, EXCLUDED.inherited_by)",
        *columns,
    )


async def upsert_nodes(connection: AnyConnection, rows: Sequence[NodeRow]) -> None:
    columns = _columns(rows, "cluster", "node", "allocatable", "unmanaged_usage",
                       "schedulable", "present", "observed_at", "labels", "taints")
    columns[2] = [json.dumps(dict(a)) for a in columns[2]]
    columns[3] = [json.dumps(dict(u)) for u in columns[3]]
    columns[7] = [json.dumps(dict(labels)) for labels in columns[7]]
    columns[8] = [json.dumps([dict(t) for t in taints]) for taints in columns[8]]
    await connection.execute(
        "INSERT INTO cluster_nodes (cluster, node, allocatable, unmanaged_usage, schedulable,"
        " present, observed_at, labels, taints, serial)"
        " SELECT c, n, a::jsonb, u::jsonb, s, p, o, l::jsonb, tn::jsonb, nextval('change_serial')"
        " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], $6::bool[],"
        " $7::timestamptz[], $8::text[], $9::text[]) AS t(c, n, a, u, s, p, o, l, tn)"
        " ORDER BY c, n"
        " ON CONFLICT (cluster, node) DO UPDATE SET allocatable = EXCLUDED.allocatable,"
        " labels = EXCLUDED.labels, taints = EXCLUDED.taints,"
        " unmanaged_usage = EXCLUDED.unmanaged_usage, schedulable = EXCLUDED.schedulable,"
        " present = EXCLUDED.present, observed_at = EXCLUDED.observed_at,"
        " serial = EXCLUDED.serial, writer_xid = EXCLUDED.writer_xid",
        *columns,
    )


async def upsert_clusters(connection: AnyConnection, rows: Sequence[ClusterRow]) -> None:
    await connection.execute(
        "INSERT INTO clusters (name, capacity_observed_at, last_snapshot_id, last_snapshot_at)"
        " SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::timestamptz[])"
        " AS t(n, c, i, a) ORDER BY n"
        " ON CONFLICT (name) DO UPDATE SET"
        " capacity_observed_at = EXCLUDED.capacity_observed_at,"
        " last_snapshot_id = EXCLUDED.last_snapshot_id,"
        " last_snapshot_at = EXCLUDED.last_snapshot_at",
        *_columns(rows, "name", "capacity_observed_at", "last_snapshot_id", "last_snapshot_at"),
    )


async def replace_snapshot_listing(connection: AnyConnection, cluster: str,
                                   listed: Listing) -> None:
    """Keep the pods listed by `cluster`'s latest snapshot, with how the ended ones ended
    (migrations 002 and 012)."""
    uids = sorted(listed)
    await connection.execute("DELETE FROM cluster_snapshot_pods WHERE cluster = $1", cluster)
    await connection.execute(
        "INSERT INTO cluster_snapshot_pods (cluster, uid, state)"
        " SELECT $1, uid, state FROM unnest($2::text[], $3::text[]) AS t(uid, state)"
        " ON CONFLICT DO NOTHING",
        cluster, uids, [None if (state := listed[uid]) is None else state.value for uid in uids])


async def collect_left_places(connection: AnyConnection, grace: timedelta,
                              written: Sequence[LeftPlace] = ()) -> None:
    """Delete the places left longer than `grace` ago that no other writer has locked, except
    those this batch just `written` (they go with a later batch, as before it): a batch's last
    statement, so what it locks out of the global order never waits in a cycle."""
    await connection.execute(
        "DELETE FROM left_places WHERE (cluster, uid) IN (SELECT cluster, uid FROM left_places"
        " WHERE deleted_at < now() - make_interval(secs => $1)"
        " AND (cluster, uid) NOT IN (SELECT * FROM unnest($2::text[], $3::text[]))"
        " FOR UPDATE SKIP LOCKED)",
        grace.total_seconds(), [p.cluster for p in written], [p.uid for p in written])


def _columns(rows: Sequence[object], *names: str) -> list[list[Any]]:
    """Rows as one list per column, the shape `unnest` takes."""
    return [[getattr(row, name) for row in rows] for name in names]


# Queues ---------------------------------------------------------------------------------------

class QueueNotFoundError(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"queue {name!r} does not exist")
        self.name = name


class QueueExistsError(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"queue {name!r} already exists")
        self.name = name


_QUEUE_COLUMNS = ("name, priority_factor, cordoned, resource_limits, namespaces, allowed_kinds,"
                  " created_at, updated_at, max_queued, group_timeout_seconds,"
                  " group_timeout_action, parent, guarantee")
# Every write of a queue takes this transaction-scoped advisory lock, then checks the whole tree
# of queues as it would be after the write (`check_tree`): two writes that are each fine alone
# (a child under a queue, and a namespace bound to that queue) cannot both pass unseen.
QUEUE_TREE_LOCK = 0x6C67_7174  # "lgqt"
# Checks the queues as they would be after a write, and the unfinished jobs' queues; raises
# (lockgate.queue_tree.QueueTreeError) to refuse it.
TreeCheck = Callable[[list[QueueSpec], set[str]], None]


class QueueTreeRefused(ValueError):
    """A write that would make the queues something other than a valid tree (400-worthy)."""


async def _check_tree(connection: AnyConnection, check: TreeCheck | None,
                      after: Callable[[list[QueueSpec]], list[QueueSpec]]) -> None:
    if check is None:
        return
    await connection.execute("SELECT pg_advisory_xact_lock($1)", QUEUE_TREE_LOCK)
    current = await list_queues(connection)
    queues = after(current)
    parents = sorted({spec.parent for spec in queues if spec.parent is not None})
    busy = {record["queue"] for record in await connection.fetch(
        "SELECT parent AS queue FROM unnest($1::text[]) AS parent WHERE EXISTS"
        " (SELECT 1 FROM jobs WHERE queue = parent AND NOT (state = ANY($2::text[])))",
        parents, sorted(state.value for state in TERMINAL_STATES))} if parents else set()
    try:
        check(queues, busy)
    except ValueError as error:
        raise QueueTreeRefused(str(error)) from error


def _queue_spec(record: asyncpg.Record) -> QueueSpec:
    values = dict(record.items())
    for column in ("resource_limits", "namespaces", "max_queued", "allowed_kinds", "guarantee"):
        if isinstance(values[column], str):
            values[column] = json.loads(values[column])
    return QueueSpec.model_validate(values)


def _max_queued_json(spec: QueueSpec) -> str | None:
    return None if spec.max_queued is None else spec.max_queued.model_dump_json()


async def list_queues(connection: AnyConnection) -> list[QueueSpec]:
    records = await connection.fetch(
        f"SELECT {_QUEUE_COLUMNS} FROM queues WHERE NOT deleted ORDER BY name")  # noqa: S608
    return [_queue_spec(record) for record in records]


async def get_queue(connection: AnyConnection, name: str) -> QueueSpec | None:
    record = await connection.fetchrow(
        f"SELECT {_QUEUE_COLUMNS} FROM queues WHERE name = $1 AND NOT deleted", name)  # noqa: S608
    return None if record is None else _queue_spec(record)


async def create_queue(connection: AnyConnection, spec: QueueSpec, *,
                       check: TreeCheck | None = None) -> QueueSpec:
    """Create a queue, or revive a deleted one under the same name; 409-worthy if it exists.
    `check`: the queue tree's rules, run under QUEUE_TREE_LOCK on the queues as they would be
    (QueueTreeRefused)."""
    async with connection.transaction():
        # A queue that exists is a conflict (409), said before the tree's rules (which would
        # call it "defined twice"); checked again below, under the lock, for a racing create.
        if await connection.fetchval(
                "SELECT NOT deleted FROM queues WHERE name = $1", spec.name):
            raise QueueExistsError(spec.name)
        await _check_tree(connection, check, lambda queues: [*queues, spec])
        existing = await connection.fetchrow(
            "SELECT deleted FROM queues WHERE name = $1 FOR UPDATE", spec.name)
        if existing is not None and not existing["deleted"]:
            raise QueueExistsError(spec.name)
        record = await connection.fetchrow(
            "INSERT INTO queues (name, priority_factor, cordoned, resource_limits, namespaces,"  # noqa: S608
            " max_queued, group_timeout_seconds, group_timeout_action, allowed_kinds, parent,"
            " guarantee)"
            " VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb, $6::text::jsonb, $7, $8,"
            " $9::text::jsonb, $10, $11::text::jsonb)"
            " ON CONFLICT (name) DO UPDATE SET priority_factor = EXCLUDED.priority_factor,"
            " cordoned = EXCLUDED.cordoned, resource_limits = EXCLUDED.resource_limits,"
            " namespaces = EXCLUDED.namespaces, max_queued = EXCLUDED.max_queued,"
            " group_timeout_seconds = EXCLUDED.group_timeout_seconds,"
            " group_timeout_action = EXCLUDED.group_timeout_action,"
            " allowed_kinds = EXCLUDED.allowed_kinds,"
            " parent = EXCLUDED.parent, guarantee = EXCLUDED.guarantee,"
            " deleted = false, created_at = now(), updated_at = now(),"
            " serial = nextval('change_serial'), writer_xid = EXCLUDED.writer_xid"
            f" RETURNING {_QUEUE_COLUMNS}",
            spec.name, spec.priority_factor, spec.cordoned, json.dumps(spec.resource_limits),
            json.dumps(spec.namespaces_json()), _max_queued_json(spec),
            spec.group_timeout_seconds, spec.group_timeout_action.value, _kinds_json(spec),
            spec.parent, json.dumps(spec.guarantee),
        )
        await notify_changes(connection, "queues")
    assert record is not None
    return _queue_spec(record)


def _kinds_json(spec: QueueSpec) -> str | None:
    return None if spec.allowed_kinds is None else json.dumps(list(spec.allowed_kinds))


async def update_queue(connection: AnyConnection, name: str,
                       edit: Callable[[QueueSpec], QueueSpec], *,
                       check: TreeCheck | None = None) -> QueueSpec:
    """Replace an existing queue's settings with `edit(current)`.

    Read, edit and write happen in one transaction under the row lock, so concurrent updates do
    not lose each other's fields. Raises QueueNotFoundError, or whatever `edit` raises (pydantic's
    ValidationError for an invalid result). The name and creation time never change.
    """
    async with connection.transaction():
        record = await connection.fetchrow(
            f"SELECT {_QUEUE_COLUMNS} FROM queues WHERE name = $1 AND NOT deleted FOR UPDATE",  # noqa: S608
            name)
        if record is None:
            raise QueueNotFoundError(name)
        current = _queue_spec(record)
        updated = edit(current)
        if (updated.priority_factor, updated.cordoned, updated.resource_limits,
                updated.namespaces, updated.max_queued, updated.group_timeout_seconds,
                updated.group_timeout_action, updated.allowed_kinds, updated.parent,
                updated.guarantee) == (
                    current.priority_factor, current.cordoned, current.resource_limits,
                    current.namespaces, current.max_queued, current.group_timeout_seconds,
                    current.group_timeout_action, current.allowed_kinds, current.parent,
                    current.guarantee):
            return current
        await _check_tree(connection, check, lambda queues: [
            updated if queue.name == name else queue for queue in queues])
        record = await connection.fetchrow(
            "UPDATE queues SET priority_factor = $2, cordoned = $3,"  # noqa: S608
            " resource_limits = $4::text::jsonb, namespaces = $5::text::jsonb,"
            " max_queued = $6::text::jsonb, group_timeout_seconds = $7,"
            " group_timeout_action = $8, allowed_kinds = $9::text::jsonb,"
            " parent = $10, guarantee = $11::text::jsonb,"
            " updated_at = now(), serial = nextval('change_serial'),"
            " writer_xid = pg_current_xact_id()::text::bigint"
            f" WHERE name = $1 RETURNING {_QUEUE_COLUMNS}",
            name, updated.priority_factor, updated.cordoned,
            json.dumps(updated.resource_limits), json.dumps(updated.namespaces_json()),
            _max_queued_json(updated), updated.group_timeout_seconds,
            updated.group_timeout_action.value, _kinds_json(updated),
            updated.parent, json.dumps(updated.guarantee),
        )
        await notify_changes(connection, "queues")
    assert record is not None
    return _queue_spec(record)


async def delete_queue(connection: AnyConnection, name: str, *,
                       check: TreeCheck | None = None) -> None:
    """Tombstone a queue (readers of the change feed must see it go); its jobs stay stored.
    `check`: as `create_queue`'s (a queue with child queues cannot go)."""
    async with connection.transaction():
        await _check_tree(connection, check, lambda queues: [
            queue for queue in queues if queue.name != name])
        status = await connection.execute(
            "UPDATE queues SET deleted = true, updated_at = now(),"
            " serial = nextval('change_serial'), writer_xid = pg_current_xact_id()::text::bigint"
            " WHERE name = $1 AND NOT deleted", name)
        if status != "UPDATE 1":
            raise QueueNotFoundError(name)
        await notify_changes(connection, "queues")


# Job views for operators ----------------------------------------------------------------------

_JOBS_WHERE = (
    " WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR state = $2)"
    " AND ($3::text IS NULL OR cluster = $3) AND (NOT $4::bool OR state <> ALL($5::text[]))")


async def list_jobs(
    connection: AnyConnection, *, queue: str | None = None, state: JobState | None = None,
    cluster: str | None = None, unfinished: bool = False, limit: int = 100,
) -> list[JobRow]:
    """Jobs matching the filters (`unfinished`: only jobs not yet ended), oldest first (the order
    a queue is served in, by default)."""
    records = await connection.fetch(
        f"SELECT {_JOB_COLUMNS} FROM jobs{_JOBS_WHERE}"  # noqa: S608 - constant parts
        " ORDER BY created_at, cluster, uid LIMIT $6",
        queue, None if state is None else state.value, cluster, unfinished, _TERMINAL, limit,
    )
    return [_job_row(record) for record in records]


async def count_jobs(
    connection: AnyConnection, *, queue: str | None = None, state: JobState | None = None,
    cluster: str | None = None, unfinished: bool = False,
) -> int:
    """How many jobs `list_jobs` with the same filters would list without a limit."""
    return int(await connection.fetchval(
        f"SELECT count(*) FROM jobs{_JOBS_WHERE}",  # noqa: S608 - constant parts
        queue, None if state is None else state.value, cluster, unfinished, _TERMINAL))


async def count_jobs_by_state(connection: AnyConnection,
                              *, cluster: str | None = None) -> dict[str, int]:
    records = await connection.fetch(
        "SELECT state, count(*) AS n FROM jobs WHERE ($1::text IS NULL OR cluster = $1)"
        " GROUP BY state", cluster)
    return {record["state"]: int(record["n"]) for record in records}
