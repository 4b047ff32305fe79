"""Folding a batch of ingested events into the row changes queue-store writes to Postgres.

Why pure: queue-store's correctness (nothing moves backwards, nothing counts twice, a redelivered
batch changes nothing) lives here, where it is tested without Kafka or Postgres. The adapter reads
the current rows a batch touches (`rows_to_read`), this module computes the rows to write
(`fold_batch`), and the adapter writes exactly those, stamping only them for the change feed.

Rules:
- A job's state only moves forward (`lockgate.jobs.advance`); duplicates and out-of-order pod
  events are harmless. Milestone timestamps (released/ungated/running/finished) are set once.
- A job's identity (namespace, name, queue, jobset, priority, requests, created_at) comes from
  the first event stored for it: lockgate relies on what the webhook admitted, and a pod's
  requests and labels are fixed from then on as far as lockgate is concerned.
- A pod event whose queue does not exist (or was deleted) is still stored: the webhook vetted it
  when the pod was created, and the queue may be created (again) later. The job simply waits, and
  the fair scheduler does not consider it while its queue is missing; `lockgate jobs list` shows it.
- Except a pod that skipped the gate (`PodEvent.skipped_gate`, lockgate.observing): no webhook
  vetted it, so its job is first stored only if its queue exists and binds its namespace
  (`QueueSpec.allows`, with the namespace's labels the event carries); otherwise the event is
  ignored, and a label alone never charges a queue. Once stored, it is a job like any other
  (`skipped_gate` set once, with its row): it holds its queue's usage while it runs.
- Release outcomes apply only to the decision in force (`decision_id` on the job); outcomes of
  stale decisions are recorded on their decision but do not touch the job. FAILED returns a
  RELEASED job to its queue, the one backward move.
- A cluster snapshot marks DELETED the unfinished jobs of its cluster that it does not list,
  that were created before its cutoff (see `snapshot_cutoff`) and whose state last changed
  before it was listed (see `SnapshotScope`); it moves the jobs it lists as ended to how they
  ended. Snapshots and pod events travel on different topics and are consumed independently,
  so either may be stored first: the snapshot of a relist may be folded before the event, in
  the same relist, that says a pod finished while nobody watched (behind a backlog of pod
  events, it nearly always is). Hence the snapshot carries each listed pod's outcome itself,
  and a pod it lists is never taken for vanished. A pod event observed before the latest
  snapshot may likewise be stored after it: a job first stored from such a late event is judged
  by that snapshot too (its listing, with the outcomes, is kept for this).
- A job cancelled with its job set (queue-store stamps it with the cancel's time) whose pod was
  seen succeeded or failed before that time had ended before the cancel: it takes that outcome,
  the one exception to "terminal is final". So the books do not depend on whether queue-store
  stored the pod's end before or after it took the cancel (a restart, a backlog).
- A job deleted while queued, never released, leaves its place in line (lockgate.places); a
  new job first stored within the grace period that does the same work takes the place queued
  longest: its `queued_since` and `kept_place_of` are set once, with its row, and the place
  records its heir, so a redelivered or late event cannot hand it out twice. A replacement
  stored before the deletion (its event overtook the deletion's on another partition) takes
  the place when the deletion is stored, if it still waits and has taken none. A released job
  the autoscaler disrupted on its node (`PodEvent.disrupted_by_autoscaler`) leaves its place
  the same way (lockgate.places.disrupted_place_left); a snapshot's "vanished" never does.
- Capacity: the newest `observed_at` per cluster wins; nodes missing from a newer report are
  marked not present. Node rows change (and take a new serial) only when their content changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from lockgate.events import (
    ClusterCapacity,
    ClusterSnapshot,
    PodEvent,
    ReleaseOutcome,
    ReleaseOutcomeKind,
)
from lockgate.jobs import JobState, advance, can_return_to_queue
from lockgate.labels import InvalidLabelError, validate_label_value, validate_queue_name
from lockgate.max_queued import JobSetMaxQueued, stricter
from lockgate.places import (
    DEFAULT_GRACE_SECONDS,
    Claimant,
    LeftPlace,
    best_place,
    disrupted_place_left,
    disrupted_place_since,
    place_left,
    refusal,
    replacement_created_from,
    waited_its_maximum,
)
from lockgate.queues import MaxQueued, QueueSpec

IngestEvent = PodEvent | ClusterSnapshot | ClusterCapacity | ReleaseOutcome
JobKey = tuple[str, str]  # (cluster, uid)
NodeKey = tuple[str, str]  # (cluster, node)

_INT32_MAX = 2**31 - 1
_UNGATED_OR_LATER = frozenset({JobState.UNGATED, JobState.BOUND, JobState.RUNNING})


@dataclass(frozen=True, slots=True)
class JobRow:
    """One row of `jobs`, as far as ingest reads and writes it (serial is the database's)."""

    cluster: str
    uid: str
    namespace: str
    name: str
    queue: str
    jobset: str
    priority: int
    requests: Mapping[str, int]
    state: JobState
    node_name: str | None
    created_at: datetime
    state_changed_at: datetime
    released_at: datetime | None = None
    ungated_at: datetime | None = None
    running_at: datetime | None = None
    finished_at: datetime | None = None
    decision_id: str | None = None
    release_attempts: int = 0
    last_reason: str = ""
    # Placement (migration 008): the pod's PodPlacement as JSON (None: it carries no filters),
    # and what kube-scheduler last said of it. Taken from the newest event.
    placement: Mapping[str, Any] | None = None
    unschedulable_since: datetime | None = None
    unschedulable_message: str = ""
    controlled: bool = False
    pod_group: str | None = None  # "<namespace>/<name>" (lockgate.groups)
    pod_group_size: int = 0
    pod_group_max_size: int = 0  # an elastic group's maximum (migration 017); 0: static
    preemptible: bool = False
    priority_class: str = ""
    # The job set's maximum time queued (lockgate.max_queued.JobSetMaxQueued as JSON), taken
    # from the first event, as the group is: the webhook fixes it at admission.
    max_queued: Mapping[str, Any] | None = None
    # The uid of its controlling owner (migration 011; "" none), from the newest event: what a
    # back-off per controller is kept by (lockgate.backoff).
    controller_uid: str = ""
    # Waits that clients survive (migration 030, lockgate.places): when the place it holds in
    # its queue was taken (None: its creation), and the name of the deleted pod it was taken
    # from (""). Set once, when the row is first written.
    queued_since: datetime | None = None
    kept_place_of: str = ""
    # Lockgate never gated the pod (migration 034, lockgate.observing.skipped_the_gate). Set
    # once, when the row is first written.
    skipped_gate: bool = False

    @property
    def key(self) -> JobKey:
        return (self.cluster, self.uid)

    @property
    def in_line_since(self) -> datetime:
        """What it is ordered by in its queue, and its maximum time queued counts from."""
        return self.created_at if self.queued_since is None else self.queued_since


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One row of `cluster_nodes`; `observed_at` is when this content was first reported."""

    cluster: str
    node: str
    allocatable: Mapping[str, int]
    unmanaged_usage: Mapping[str, int]
    schedulable: bool
    present: bool
    observed_at: datetime
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()  # lockgate.placement.Taint as JSON

    @property
    def key(self) -> NodeKey:
        return (self.cluster, self.node)

    def same_content(self, other: NodeRow) -> bool:
        return (
            dict(self.allocatable) == dict(other.allocatable)
            and dict(self.labels) == dict(other.labels)
            and [dict(t) for t in self.taints] == [dict(t) for t in other.taints]
            and dict(self.unmanaged_usage) == dict(other.unmanaged_usage)
            and self.schedulable == other.schedulable
            and self.present == other.present
        )


@dataclass(frozen=True, slots=True)
class ClusterRow:
    """One row of `clusters`: how fresh its capacity and its last snapshot are."""

    name: str
    capacity_observed_at: datetime | None = None
    last_snapshot_id: str | None = None
    last_snapshot_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class DecisionOutcome:
    """What became of a release decision; only the first outcome of a decision is recorded."""

    decision_id: str
    outcome: ReleaseOutcomeKind
    reason: str
    at: datetime


@dataclass(frozen=True, slots=True)
class JobsetSighting:
    cluster: str
    queue: str
    name: str
    seen_at: datetime


@dataclass(frozen=True)
class SnapshotScope:
    """The jobs one snapshot may delete: unfinished, of `cluster`, not `listed`, created before
    `cutoff`, and last changed before `listed_at`; and those it says ended (`ended`, listed too).

    The last condition protects pods created while the list was running: the watch that follows
    the list reports them, possibly before queue-store reads the snapshot (another topic), and
    such a report stamps the job after `listed_at` (the watcher's own clock on both sides). A
    job seen alive after the list began is never judged by it; a wrong deletion would be final,
    while a missed one is settled by the next snapshot, a watch event, or the ungater's POD_GONE.
    """

    cluster: str
    cutoff: datetime
    listed_at: datetime
    listed: frozenset[str]  # every listed pod, ended ones included
    ended: Mapping[str, JobState] = field(default_factory=dict)

    def judges(self, row: JobRow) -> bool:
        """Whether `row` vanished according to this snapshot."""
        return (row.cluster == self.cluster and not row.state.is_terminal
                and row.created_at < self.cutoff and row.state_changed_at < self.listed_at
                and row.uid not in self.listed)


@dataclass(frozen=True)
class RowsToRead:
    """What the adapter must load (and lock) before folding a batch."""

    job_keys: frozenset[JobKey]
    snapshots: tuple[SnapshotScope, ...]
    capacity_clusters: frozenset[str]  # load all their nodes
    clusters: frozenset[str]
    # (cluster, namespace) of every pod event: load the places left there (lockgate.places).
    place_namespaces: frozenset[tuple[str, str]] = frozenset()
    place_grace: timedelta = timedelta(seconds=DEFAULT_GRACE_SECONDS)  # older places go
    # Of every pod event saying a pod is gone: (cluster, namespace, name, controller uid), so
    # the adapter loads the queued jobs that may replace it, stored before its deletion was.
    heirs_of: frozenset[tuple[str, str, str, str]] = frozenset()
    # The queues named by pods that skipped the gate: load their definitions (bindings).
    skipped_gate_queues: frozenset[str] = frozenset()

    @property
    def changed_clusters(self) -> frozenset[str]:
        """The clusters whose rows the fold may change (a snapshot's or a capacity report's);
        of the others it only reads the latest snapshot, so the adapter locks them shared."""
        return self.capacity_clusters | frozenset(scope.cluster for scope in self.snapshots)


@dataclass
class CurrentRows:
    """The rows a batch may change, as read (and locked) from Postgres.

    Contract: `jobs` holds every existing job of `RowsToRead.job_keys` and every job in the scope
    of each of `RowsToRead.snapshots`; `nodes` holds every node of a capacity cluster; `clusters`
    holds every existing cluster row asked for; `listed_by_latest_snapshot` holds those of
    `RowsToRead.job_keys` that the latest stored snapshot of their cluster listed, each with how
    that snapshot said it ended (None: not ended).
    """

    jobs: dict[JobKey, JobRow] = field(default_factory=dict)
    nodes: dict[NodeKey, NodeRow] = field(default_factory=dict)
    clusters: dict[str, ClusterRow] = field(default_factory=dict)
    listed_by_latest_snapshot: dict[JobKey, JobState | None] = field(default_factory=dict)
    # The places left in `RowsToRead.place_namespaces` (lockgate.places), and every live queue's
    # maximum time queued (a pod that waited it leaves no place).
    places: dict[JobKey, LeftPlace] = field(default_factory=dict)
    queue_max_queued: dict[str, MaxQueued | None] = field(default_factory=dict)
    # The live queues of `RowsToRead.skipped_gate_queues` (a deleted or unknown one is absent).
    queue_specs: dict[str, QueueSpec] = field(default_factory=dict)


Listing = Mapping[str, JobState | None]
"""The pods one snapshot listed: uid → how it had ended (None: not ended)."""


@dataclass
class IngestResult:
    """Rows to write: only new or changed ones, so a redelivered batch writes nothing."""

    jobs: list[JobRow] = field(default_factory=list)
    nodes: list[NodeRow] = field(default_factory=list)
    clusters: list[ClusterRow] = field(default_factory=list)
    decision_outcomes: list[DecisionOutcome] = field(default_factory=list)
    jobsets: list[JobsetSighting] = field(default_factory=list)
    # cluster → the pods its new latest snapshot listed (replaces the stored listing).
    snapshot_listings: dict[str, Listing] = field(default_factory=dict)
    # Places left or taken in this batch (lockgate.places).
    places: list[LeftPlace] = field(default_factory=list)
    # Events that changed nothing on purpose (stale outcome, old capacity), with why.
    ignored: list[tuple[IngestEvent, str]] = field(default_factory=list)

    @property
    def changes_anything(self) -> bool:
        return bool(self.jobs or self.nodes or self.clusters or self.decision_outcomes
                    or self.jobsets or self.snapshot_listings or self.places)


def invalid_reason(event: IngestEvent) -> str | None:
    """Why a well-formed message is semantically unusable (it goes to the dead letters), or None.

    These checks also keep values Postgres would refuse out of the batch write, so one bad message
    cannot block the messages behind it.
    """
    match event:
        case PodEvent():
            return _pod_event_problem(event)
        case ClusterSnapshot():
            return (_blank("cluster", event.cluster) or _blank("snapshot_id", event.snapshot_id)
                    or _naive("listed_at", event.listed_at) or _snapshot_listing_problem(event))
        case ClusterCapacity():
            return _capacity_problem(event)
        case ReleaseOutcome():
            return (_blank("decision_id", event.decision_id) or _blank("cluster", event.cluster)
                    or _blank("uid", event.uid) or _nul("reason", event.reason)
                    or _naive("at", event.at))


def _pod_event_problem(event: PodEvent) -> str | None:
    for name, value in (("uid", event.uid), ("cluster", event.cluster),
                        ("namespace", event.namespace), ("name", event.name)):
        if problem := _blank(name, value):
            return problem
    try:
        validate_queue_name(event.queue)
        if not event.jobset:
            return "jobset must not be empty"
        validate_label_value("jobset", event.jobset)
    except InvalidLabelError as error:
        return str(error)
    if not -_INT32_MAX <= event.priority <= _INT32_MAX:
        return f"priority {event.priority} is outside the 32-bit range"
    if problem := _amounts_problem("requests", event.requests):
        return problem
    if (event.group is None) != (event.group_size == 0) or not 0 <= event.group_size <= 10_000:
        return f"pod group {event.group!r} with size {event.group_size} is not a valid group"
    if event.group_max_size and not event.group_size <= event.group_max_size <= 10_000:
        return (f"pod group {event.group!r} with minimum {event.group_size} and maximum "
                f"{event.group_max_size} is not a valid elastic group")
    return (_nul("node_name", event.node_name or "") or _nul("event_id", event.event_id)
            or _nul("resource_version", event.resource_version)
            or _naive("created_at", event.created_at) or _naive("observed_at", event.observed_at))


def _snapshot_listing_problem(event: ClusterSnapshot) -> str | None:
    if (blank := next((uid for uid in event.pod_uids if not _text_ok(uid)), None)) is not None:
        return f"pod_uids contains a blank uid ({blank!r})"
    seen = set(event.pod_uids)
    for state, uids in event.ended.items():
        if not state.is_terminal or state is JobState.CANCELLED:
            return f"ended lists pods as {state.value}, which is not how a pod ends"
        for uid in uids:
            if not _text_ok(uid):
                return f"ended contains a blank uid ({uid!r})"
            if uid in seen:
                return f"pod {uid} is listed twice"
            seen.add(uid)
    return None


def _capacity_problem(event: ClusterCapacity) -> str | None:
    if problem := _blank("cluster", event.cluster) or _naive("observed_at", event.observed_at):
        return problem
    seen: set[str] = set()
    for node in event.nodes:
        if problem := _blank("node name", node.name):
            return problem
        if node.name in seen:
            return f"node {node.name!r} is listed twice"
        seen.add(node.name)
        problem = (_amounts_problem(f"node {node.name} allocatable", node.allocatable)
                   or _amounts_problem(f"node {node.name} unmanaged_usage", node.unmanaged_usage))
        if problem:
            return problem
    return None


def _text_ok(value: str) -> bool:
    return bool(value.strip()) and "\x00" not in value


def _blank(name: str, value: str) -> str | None:
    if not value.strip():
        return f"{name} must not be empty"
    return _nul(name, value)


def _nul(name: str, value: str) -> str | None:
    return f"{name} contains a NUL character" if "\x00" in value else None


def _naive(name: str, value: datetime) -> str | None:
    return f"{name} has no time zone" if value.tzinfo is None else None


def _amounts_problem(what: str, amounts: Mapping[str, int]) -> str | None:
    for resource, amount in amounts.items():
        if not _text_ok(resource):
            return f"{what}: blank resource name"
        if amount < 0:
            return f"{what}: {resource} is negative ({amount})"
    return None


def snapshot_cutoff(snapshot: ClusterSnapshot) -> datetime:
    """Jobs created before this instant and not listed by the snapshot are gone.

    Kubernetes creationTimestamps have whole-second precision, so a pod created just after the
    list (in the same second as `listed_at`) can carry a timestamp before `listed_at`. Only jobs
    created before the start of that second are judged; later ones wait for the next snapshot.
    """
    return _cutoff(snapshot.listed_at)


def _cutoff(listed_at: datetime) -> datetime:
    return listed_at.replace(microsecond=0)


def _scope(snapshot: ClusterSnapshot) -> SnapshotScope:
    ended = snapshot.ended_by_uid()
    return SnapshotScope(cluster=snapshot.cluster, cutoff=snapshot_cutoff(snapshot),
                         listed_at=snapshot.listed_at,
                         listed=frozenset(snapshot.pod_uids) | frozenset(ended), ended=ended)


def _listing(scope: SnapshotScope) -> Listing:
    return {uid: scope.ended.get(uid) for uid in scope.listed}


def rows_to_read(events: Iterable[IngestEvent], *,
                 place_grace: timedelta = timedelta(seconds=DEFAULT_GRACE_SECONDS)) -> RowsToRead:
    job_keys: set[JobKey] = set()
    snapshots: list[SnapshotScope] = []
    capacity_clusters: set[str] = set()
    pod_clusters: set[str] = set()
    place_namespaces: set[tuple[str, str]] = set()
    heirs_of: set[tuple[str, str, str, str]] = set()
    skipped_gate_queues: set[str] = set()
    for event in events:
        match event:
            case PodEvent():
                job_keys.add((event.cluster, event.uid))
                if event.skipped_gate:
                    skipped_gate_queues.add(event.queue)
                pod_clusters.add(event.cluster)  # its latest snapshot may judge a late event
                place_namespaces.add((event.cluster, event.namespace))
                if event.state is JobState.DELETED:
                    heirs_of.add((event.cluster, event.namespace, event.name,
                                  event.controller_uid))
            case ReleaseOutcome():
                job_keys.add((event.cluster, event.uid))
            case ClusterSnapshot():
                snapshots.append(_scope(event))
            case ClusterCapacity():
                capacity_clusters.add(event.cluster)
    snapshot_clusters = frozenset(scope.cluster for scope in snapshots)
    return RowsToRead(
        job_keys=frozenset(job_keys),
        snapshots=tuple(snapshots),
        capacity_clusters=frozenset(capacity_clusters),
        clusters=snapshot_clusters | capacity_clusters | pod_clusters,
        place_namespaces=frozenset(place_namespaces) if place_grace > timedelta(0)
        else frozenset(),
        place_grace=place_grace,
        heirs_of=frozenset(heirs_of) if place_grace > timedelta(0) else frozenset(),
        skipped_gate_queues=frozenset(skipped_gate_queues),
    )


def fold_batch(current: CurrentRows, events: Sequence[IngestEvent], *,
               place_grace: timedelta = timedelta(seconds=DEFAULT_GRACE_SECONDS),
               ) -> IngestResult:
    """The rows to write after applying `events`, in order, to `current`. Does not mutate it.

    `place_grace`: how long a deleted queued pod's place waits for a replacement
    (lockgate.places); zero keeps none.
    """
    folding = _Folding(current, place_grace)
    for event in events:
        match event:
            case PodEvent():
                folding.pod_event(event)
            case ReleaseOutcome():
                folding.release_outcome(event)
            case ClusterSnapshot():
                folding.snapshot(event)
            case ClusterCapacity():
                folding.capacity(event)
    return folding.result()


class _Folding:
    """Working copies of the rows, and which of them changed."""

    def __init__(self, current: CurrentRows, place_grace: timedelta) -> None:
        self._original = current
        self._place_grace = place_grace
        self.places = dict(current.places)
        self.jobs = dict(current.jobs)
        self.nodes = dict(current.nodes)
        self.clusters = dict(current.clusters)
        self.listings: dict[str, Listing] = {}  # new latest snapshots, by cluster
        self.outcomes: dict[str, DecisionOutcome] = {}
        self.jobsets: dict[tuple[str, str, str], JobsetSighting] = {}
        self.ignored: list[tuple[IngestEvent, str]] = []

    def pod_event(self, event: PodEvent) -> None:
        if (event.skipped_gate and (event.cluster, event.uid) not in self.jobs
                and not self._binds(event)):
            self.ignored.append((event, f"pod {event.namespace}/{event.name} skipped the gate "
                                        f"but queue {event.queue} does not bind its namespace"))
            return
        sighting_key = (event.cluster, event.queue, event.jobset)
        previous = self.jobsets.get(sighting_key)
        if previous is None or previous.seen_at < event.observed_at:
            self.jobsets[sighting_key] = JobsetSighting(
                event.cluster, event.queue, event.jobset, event.observed_at)

        row = self.jobs.get((event.cluster, event.uid))
        if row is None:
            row = JobRow(
                cluster=event.cluster, uid=event.uid, namespace=event.namespace, name=event.name,
                queue=event.queue, jobset=event.jobset, priority=event.priority,
                requests=dict(event.requests), state=event.state, node_name=event.node_name,
                created_at=event.created_at, state_changed_at=event.observed_at,
                **_placement_columns(event, None),
                pod_group=event.group, pod_group_size=event.group_size,
                pod_group_max_size=event.group_max_size,
                preemptible=event.preemptible, priority_class=event.priority_class,
                max_queued=None if event.max_queued is None
                else event.max_queued.model_dump(mode="json"),
                skipped_gate=event.skipped_gate,
            )
            row = _stamp_milestones(row, event.state, event.observed_at)
            if row.state is JobState.QUEUED:
                row = self._takes_a_place(row, event.observed_at)
            self.jobs[row.key] = self._judged_by_latest_snapshot(row)
            return
        if _ended_before_its_cancel(row, event):
            self.jobs[row.key] = replace(
                row, state=event.state, state_changed_at=event.observed_at,
                finished_at=event.observed_at, last_reason="ended before its job set was "
                f"cancelled ({row.last_reason.removeprefix('cancelled: ')})")
            return
        updated = _moved_to(row, advance(row.state, event.state), event.observed_at)
        if updated.node_name is None and event.node_name:
            updated = replace(updated, node_name=event.node_name)
        if not updated.state.is_terminal:
            columns = _placement_columns(event, updated.unschedulable_since)
            if any(getattr(updated, name) != value for name, value in columns.items()):
                updated = replace(updated, **columns)
        self._set_job(row.state, updated, disrupted=event.disrupted_by_autoscaler)

    def _binds(self, event: PodEvent) -> bool:
        """Whether the pod's queue exists and binds its namespace (for a pod no webhook
        vetted)."""
        spec = self._original.queue_specs.get(event.queue)
        return spec is not None and spec.allows(cluster=event.cluster, namespace=event.namespace,
                                                labels=event.namespace_labels)

    def _takes_a_place(self, row: JobRow, seen_at: datetime) -> JobRow:
        """`row` with the place it inherits, if any (lockgate.places)."""
        if self._place_grace <= timedelta(0):
            return row
        place = best_place(_claimant(row, seen_at=seen_at), self.places.values(),
                           grace=self._place_grace)
        if place is None or place.queued_since > row.created_at:
            return row
        self.places[place.key] = replace(place, inherited_by=row.uid)
        return replace(row, queued_since=place.queued_since, kept_place_of=place.name)

    def _set_job(self, before: JobState, row: JobRow, *, disrupted: bool = False) -> None:
        """Store `row`, which was in state `before`; a job deleted while queued, never released,
        leaves its place (lockgate.places), unless it had waited its maximum time queued; so
        does one the autoscaler disrupted on its node (`disrupted`: the event said so)."""
        self.jobs[row.key] = row
        if self._place_grace <= timedelta(0) or row.key in self.places:
            return
        released = row.released_at is not None or row.decision_id is not None
        limit = stricter(self._original.queue_max_queued.get(row.queue),
                         None if row.max_queued is None
                         else JobSetMaxQueued.model_validate(row.max_queued))
        if disrupted_place_left(before=before, after=row.state, released=released,
                                skipped_gate=row.skipped_gate,
                                disrupted_by_autoscaler=disrupted):
            place = LeftPlace(
                cluster=row.cluster, namespace=row.namespace, queue=row.queue, name=row.name,
                uid=row.uid, controller_uid=row.controller_uid, requests=dict(row.requests),
                queued_since=disrupted_place_since(
                    in_line_since=row.in_line_since,
                    released_at=row.released_at or row.ungated_at,
                    deleted_at=row.state_changed_at,
                    max_queued_seconds=None if limit is None else limit.seconds),
                deleted_at=row.state_changed_at)
            self.places[row.key] = self._passed_to_an_early_heir(
                place, deleted=row, created_from=replacement_created_from(place.deleted_at))
            return
        if not place_left(before=before, after=row.state, released=released):
            return
        if not waited_its_maximum(queued_since=row.in_line_since,
                                  deleted_at=row.state_changed_at,
                                  max_queued_seconds=None if limit is None else limit.seconds):
            place = LeftPlace(
                cluster=row.cluster, namespace=row.namespace, queue=row.queue, name=row.name,
                uid=row.uid, controller_uid=row.controller_uid, requests=dict(row.requests),
                queued_since=row.in_line_since, deleted_at=row.state_changed_at)
            self.places[row.key] = self._passed_to_an_early_heir(place, deleted=row)

    def _passed_to_an_early_heir(self, place: LeftPlace, *, deleted: JobRow,
                                 created_from: datetime | None = None) -> LeftPlace:
        """`place`, taken by a replacement already stored, if one may take it: queued, in line
        since its own creation (it took no place), created no earlier than the deleted pod, nor
        than `created_from` if given (a disrupted pod's replacement comes after its eviction:
        its controller's other pods, queued while it ran, are not replacements)."""
        heirs = sorted(
            (row for row in self.jobs.values()
             if row.namespace == place.namespace and row.cluster == place.cluster
             and row.state is JobState.QUEUED and row.queued_since is None
             and row.released_at is None and row.decision_id is None
             and deleted.created_at <= row.created_at and place.queued_since < row.created_at
             and (created_from is None or created_from <= row.created_at)
             and refusal(place, _claimant(row, seen_at=place.deleted_at),
                         grace=self._place_grace) is None),
            key=lambda row: (row.created_at, row.uid))
        if not heirs:
            return place
        heir = heirs[0]
        self.jobs[heir.key] = replace(heir, queued_since=place.queued_since,
                                      kept_place_of=place.name)
        return replace(place, inherited_by=heir.uid)

    def release_outcome(self, event: ReleaseOutcome) -> None:
        if event.decision_id not in self.outcomes:
            self.outcomes[event.decision_id] = DecisionOutcome(
                event.decision_id, event.outcome, event.reason, event.at)
        row = self.jobs.get((event.cluster, event.uid))
        if row is None:
            self.ignored.append((event, "no such job"))
            return
        if row.decision_id != event.decision_id:
            self.ignored.append((event, f"stale decision (in force: {row.decision_id})"))
            return
        match event.outcome:
            case ReleaseOutcomeKind.FAILED:
                if not can_return_to_queue(row.state):
                    self.ignored.append((event, f"job is {row.state}, not released"))
                    return
                # release_attempts was counted when the scheduler decided; it reads it, with
                # state_changed_at, to back off before releasing this job again.
                self.jobs[row.key] = replace(
                    row, state=JobState.QUEUED, state_changed_at=event.at, decision_id=None,
                    released_at=None, last_reason=event.reason or "release failed",
                )
            case ReleaseOutcomeKind.UNGATED:
                updated = _moved_to(row, advance(row.state, JobState.UNGATED), event.at)
                if updated.ungated_at is None:
                    updated = replace(updated, ungated_at=event.at)
                self.jobs[row.key] = updated
            case ReleaseOutcomeKind.POD_GONE:
                updated = _moved_to(row, advance(row.state, JobState.DELETED), event.at)
                if updated is not row:
                    updated = replace(updated, last_reason=event.reason or "pod gone")
                self.jobs[row.key] = updated

    def snapshot(self, event: ClusterSnapshot) -> None:
        """Apply a snapshot whatever its order among pod events and other snapshots: what it
        says ended is final and true whenever it is folded, and what it does not list was gone
        when it was listed (an older snapshot folded late deletes only what was gone then)."""
        scope = _scope(event)
        for key, row in list(self.jobs.items()):
            if row.cluster != event.cluster or row.state.is_terminal:
                continue
            if (ended := scope.ended.get(row.uid)) is not None:
                self.jobs[key] = _moved_to(row, advance(row.state, ended), event.listed_at)
            elif scope.judges(row):
                self._set_job(row.state, _vanished(row, event.snapshot_id, event.listed_at))
        cluster = self.clusters.get(event.cluster) or ClusterRow(event.cluster)
        if cluster.last_snapshot_at is None or cluster.last_snapshot_at < event.listed_at:
            self.clusters[event.cluster] = replace(
                cluster, last_snapshot_id=event.snapshot_id, last_snapshot_at=event.listed_at)
            self.listings[event.cluster] = _listing(scope)

    def _judged_by_latest_snapshot(self, row: JobRow) -> JobRow:
        """A job first stored now, from an event older than the cluster's latest snapshot: as
        that snapshot says it ended, or deleted if it says it was gone."""
        cluster = self.clusters.get(row.cluster)
        if cluster is None or cluster.last_snapshot_at is None:
            return row
        if row.cluster in self.listings:
            listing = self.listings[row.cluster]
            listed, ended = row.uid in listing, listing.get(row.uid)
        else:
            listed = row.key in self._original.listed_by_latest_snapshot
            ended = self._original.listed_by_latest_snapshot.get(row.key)
        if ended is not None:
            return _moved_to(row, advance(row.state, ended), cluster.last_snapshot_at)
        scope = SnapshotScope(cluster=row.cluster, cutoff=_cutoff(cluster.last_snapshot_at),
                              listed_at=cluster.last_snapshot_at,
                              listed=frozenset({row.uid}) if listed else frozenset())
        if not scope.judges(row):
            return row
        return _vanished(row, cluster.last_snapshot_id, cluster.last_snapshot_at)

    def capacity(self, event: ClusterCapacity) -> None:
        cluster = self.clusters.get(event.cluster) or ClusterRow(event.cluster)
        newest = cluster.capacity_observed_at
        if newest is not None and event.observed_at <= newest:
            self.ignored.append((event, f"older than the capacity observed at {newest}"))
            return
        self.clusters[event.cluster] = replace(cluster, capacity_observed_at=event.observed_at)
        reported = set()
        for node in event.nodes:
            reported.add(node.name)
            self._set_node(NodeRow(
                cluster=event.cluster, node=node.name, allocatable=dict(node.allocatable),
                unmanaged_usage=dict(node.unmanaged_usage), schedulable=node.schedulable,
                present=True, observed_at=event.observed_at, labels=dict(node.labels),
                taints=[taint.model_dump() for taint in node.taints],
            ))
        for row in list(self.nodes.values()):
            if row.cluster == event.cluster and row.present and row.node not in reported:
                self._set_node(replace(row, present=False, observed_at=event.observed_at))

    def _set_node(self, row: NodeRow) -> None:
        existing = self.nodes.get(row.key)
        if existing is None or not existing.same_content(row):
            self.nodes[row.key] = row

    def result(self) -> IngestResult:
        original = self._original
        return IngestResult(
            jobs=[row for key, row in self.jobs.items() if original.jobs.get(key) != row],
            nodes=[row for key, row in self.nodes.items() if original.nodes.get(key) != row],
            clusters=[row for name, row in self.clusters.items()
                      if original.clusters.get(name) != row],
            decision_outcomes=list(self.outcomes.values()),
            jobsets=list(self.jobsets.values()),
            snapshot_listings=self.listings,
            places=[place for key, place in self.places.items()
                    if original.places.get(key) != place],
            ignored=self.ignored,
        )


def _claimant(row: JobRow, *, seen_at: datetime) -> Claimant:
    return Claimant(cluster=row.cluster, namespace=row.namespace, queue=row.queue, name=row.name,
                    uid=row.uid, controller_uid=row.controller_uid, requests=row.requests,
                    seen_at=seen_at)


def _placement_columns(event: PodEvent, since: datetime | None) -> dict[str, Any]:
    """The row's placement columns after `event`. unschedulable_since is when lockgate first saw
    the pod Unschedulable, not the condition's lastTransitionTime: that stays at the time the
    pod was gated (PodScheduled is False from SchedulingGated on), so it would predate the
    release."""
    if event.unschedulable_since is None:
        since = None
    elif since is None:
        since = max(event.unschedulable_since, event.observed_at)
    return {
        # As JSON (lists, not tuples): equal to the row read back from Postgres, so an event that
        # changes nothing writes nothing (a tuple never equalled the stored list: every event of
        # a pod with a toleration, which every pod has by default, rewrote its row).
        "placement": None if event.placement is None else event.placement.model_dump(mode="json"),
        "unschedulable_since": since,
        "unschedulable_message": event.unschedulable_message,
        "controlled": event.controlled,
        "controller_uid": event.controller_uid,
    }


def _ended_before_its_cancel(row: JobRow, event: PodEvent) -> bool:
    return (row.state is JobState.CANCELLED
            and event.state in (JobState.SUCCEEDED, JobState.FAILED)
            and event.observed_at < row.state_changed_at)


def _vanished(row: JobRow, snapshot_id: str | None, listed_at: datetime) -> JobRow:
    return replace(_moved_to(row, JobState.DELETED, listed_at),
                   last_reason=f"vanished: not listed by snapshot {snapshot_id}")


def _moved_to(row: JobRow, state: JobState, at: datetime) -> JobRow:
    """`row` in `state` (the same object when nothing changes), with its milestones stamped."""
    if state == row.state:
        return row
    return _stamp_milestones(replace(row, state=state, state_changed_at=at), state, at)


def _stamp_milestones(row: JobRow, state: JobState, at: datetime) -> JobRow:
    """Set the timestamps that reaching `state` implies, each only once."""

    def once(stamp: datetime | None, reached: bool) -> datetime | None:
        return at if stamp is None and reached else stamp

    released_at = once(row.released_at, state is JobState.RELEASED)
    ungated_at = once(row.ungated_at, state in _UNGATED_OR_LATER)
    running_at = once(row.running_at, state is JobState.RUNNING)
    finished_at = once(row.finished_at, state.is_terminal)
    if (released_at is row.released_at and ungated_at is row.ungated_at
            and running_at is row.running_at and finished_at is row.finished_at):
        return row  # nothing to stamp (a new queued pod): copying the row was a quarter of ingest
    return replace(row, released_at=released_at, ungated_at=ungated_at, running_at=running_at,
                   finished_at=finished_at)
