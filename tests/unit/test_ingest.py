"""The pure ingest fold: forward-only states, set-once milestones, requeue, snapshots, capacity."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from lockgate.events import (
    ClusterCapacity,
    ClusterSnapshot,
    NodeCapacity,
    PodEvent,
    ReleaseOutcome,
    ReleaseOutcomeKind,
)
from lockgate.ingest import (
    ClusterRow,
    CurrentRows,
    IngestEvent,
    JobRow,
    NodeRow,
    SnapshotScope,
    fold_batch,
    invalid_reason,
    rows_to_read,
    snapshot_cutoff,
)
from lockgate.jobs import JobState, advance
from lockgate.queues import QueueSpec

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
CLUSTER = "cluster-a"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def pod_event(uid: str = "u1", state: JobState = JobState.QUEUED, *, seen: float = 0,
              created: float = -10, **fields: object) -> PodEvent:
    values: dict[str, object] = {
        "event_id": f"{uid}-{state}-{seen}", "cluster": CLUSTER, "namespace": "team",
        "name": f"pod-{uid}", "uid": uid, "state": state, "queue": "research",
        "jobset": "sweep", "requests": {"cpu": 500, "memory": 2**30},
        "created_at": at(created), "observed_at": at(seen),
    }
    values.update(fields)
    return PodEvent.model_validate(values)


def job(uid: str = "u1", state: JobState = JobState.QUEUED, *, created: float = -10,
        **fields: object) -> JobRow:
    row = JobRow(cluster=CLUSTER, uid=uid, namespace="team", name=f"pod-{uid}",
                 queue="research", jobset="sweep", priority=0,
                 requests={"cpu": 500, "memory": 2**30}, state=state, node_name=None,
                 created_at=at(created), state_changed_at=at(created))
    return replace(row, **fields)  # type: ignore[arg-type]


def outcome(kind: ReleaseOutcomeKind, decision: str = "d1", uid: str = "u1", *,
            when: float = 5, reason: str = "") -> ReleaseOutcome:
    return ReleaseOutcome(decision_id=decision, cluster=CLUSTER, uid=uid, outcome=kind,
                          reason=reason, at=at(when))


def rows(*jobs: JobRow, nodes: tuple[NodeRow, ...] = (),
         clusters: tuple[ClusterRow, ...] = ()) -> CurrentRows:
    return CurrentRows(jobs={j.key: j for j in jobs}, nodes={n.key: n for n in nodes},
                       clusters={c.name: c for c in clusters})


def only_job(current: CurrentRows, *events: IngestEvent) -> JobRow:
    result = fold_batch(current, list(events))
    assert len(result.jobs) == 1, result.jobs
    return result.jobs[0]


# Pod events ---------------------------------------------------------------------------------

def test_a_new_pod_becomes_a_queued_job_with_what_it_asks_for() -> None:
    row = only_job(rows(), pod_event("u1", priority=3))
    assert (row.cluster, row.uid, row.queue, row.jobset, row.state) == (
        CLUSTER, "u1", "research", "sweep", JobState.QUEUED)
    assert row.requests == {"cpu": 500, "memory": 2**30}
    assert row.priority == 3
    assert row.created_at == at(-10)
    assert (row.released_at, row.ungated_at, row.running_at, row.finished_at) == (None,) * 4


def test_the_same_event_twice_changes_nothing_the_second_time() -> None:
    first = only_job(rows(), pod_event("u1", JobState.RUNNING, node_name="n1"))
    again = fold_batch(rows(first), [pod_event("u1", JobState.RUNNING, node_name="n1")])
    assert again.jobs == []


def test_an_older_state_never_moves_a_job_backwards() -> None:
    running = job("u1", JobState.RUNNING, running_at=at(3), ungated_at=at(2))
    result = fold_batch(rows(running), [pod_event("u1", JobState.QUEUED, seen=9),
                                        pod_event("u1", JobState.UNGATED, seen=9)])
    assert result.jobs == []


def test_terminal_states_are_final() -> None:
    done = job("u1", JobState.SUCCEEDED, finished_at=at(4))
    assert fold_batch(rows(done), [pod_event("u1", JobState.DELETED, seen=8)]).jobs == []


def test_any_order_of_a_pods_events_converges_to_its_furthest_state() -> None:
    events = [pod_event("u1", state, seen=i, node_name="n1" if i >= 2 else None)
              for i, state in enumerate([JobState.QUEUED, JobState.UNGATED, JobState.BOUND,
                                         JobState.RUNNING])]
    finals = set()
    for order in itertools.permutations(events):
        result = fold_batch(rows(), list(order))
        (row,) = result.jobs
        finals.add((row.state, row.node_name))
    assert finals == {(JobState.RUNNING, "n1")}


def test_milestones_are_stamped_once_when_first_reached() -> None:
    row = only_job(rows(), pod_event("u1", JobState.QUEUED, seen=0),
                   pod_event("u1", JobState.UNGATED, seen=2),
                   pod_event("u1", JobState.RUNNING, seen=3),
                   pod_event("u1", JobState.RUNNING, seen=7),
                   pod_event("u1", JobState.SUCCEEDED, seen=9))
    assert (row.ungated_at, row.running_at, row.finished_at) == (at(2), at(3), at(9))
    assert row.state_changed_at == at(9)


def test_identity_comes_from_the_first_event_stored() -> None:
    stored = job("u1", JobState.QUEUED)
    result = fold_batch(rows(stored), [pod_event("u1", JobState.QUEUED, queue="other",
                                                 requests={"cpu": 9000})])
    assert result.jobs == []


def test_a_node_name_is_learnt_once_the_pod_is_bound() -> None:
    row = only_job(rows(job("u1", JobState.UNGATED)),
                   pod_event("u1", JobState.BOUND, seen=4, node_name="node-7"))
    assert (row.state, row.node_name) == (JobState.BOUND, "node-7")


def test_pods_of_unknown_queues_are_stored_like_any_other() -> None:
    # The fold knows nothing of queues on purpose: see the module docstring.
    row = only_job(rows(), pod_event("u1", queue="not-created-yet"))
    assert row.queue == "not-created-yet"


def skipped(uid: str = "u1", state: JobState = JobState.UNGATED, **fields: object) -> PodEvent:
    """An event of a pod that no webhook gated, in namespace team (managed, team=a)."""
    return pod_event(uid, state, skipped_gate=True,
                     namespace_labels={"lockgate.io/managed": "true", "team": "a"}, **fields)


def binding(**values: object) -> QueueSpec:
    return QueueSpec.model_validate({"name": "research", "namespaces": [values]})


@pytest.mark.parametrize("bound", [
    binding(cluster=CLUSTER, names=["team"]),
    binding(names=["team"]),
    binding(selector={"matchLabels": {"team": "a"}}),
])
def test_a_pod_that_skipped_the_gate_is_stored_when_its_queue_binds_its_namespace(
        bound: QueueSpec) -> None:
    current = rows()
    current.queue_specs = {"research": bound}
    row = only_job(current, skipped("u1"), skipped("u1", JobState.RUNNING, seen=1,
                                                   node_name="n1"))
    assert (row.state, row.skipped_gate, row.node_name) == (JobState.RUNNING, True, "n1")
    assert rows_to_read([skipped("u1")]).skipped_gate_queues == {"research"}
    assert rows_to_read([pod_event("u2")]).skipped_gate_queues == frozenset()


@pytest.mark.parametrize("specs", [
    {},  # no such queue
    {"research": binding(cluster="cluster-b", names=["team"])},
    {"research": binding(names=["other"])},
    {"research": binding(selector={"matchLabels": {"team": "b"}})},
])
def test_a_pod_that_skipped_the_gate_is_not_stored_when_its_queue_does_not_bind_it(
        specs: dict[str, QueueSpec]) -> None:
    current = rows()
    current.queue_specs = specs
    result = fold_batch(current, [skipped("u1", JobState.RUNNING, node_name="n1")])
    assert result.jobs == [] and result.jobsets == []
    assert [reason for _, reason in result.ignored] == [
        "pod team/pod-u1 skipped the gate but queue research does not bind its namespace"]


def test_a_stored_job_that_skipped_the_gate_follows_its_pod_even_if_unbound_later() -> None:
    current = rows(job("u1", JobState.RUNNING, skipped_gate=True))
    row = only_job(current, skipped("u1", JobState.SUCCEEDED, seen=5))
    assert (row.state, row.skipped_gate) == (JobState.SUCCEEDED, True)


def test_the_skipped_gate_mark_is_set_once_with_the_row() -> None:
    current = rows(job("u1", JobState.QUEUED))
    current.queue_specs = {"research": binding(names=["team"])}
    row = only_job(current, skipped("u1", JobState.RUNNING, seen=5))
    assert row.skipped_gate is False and row.state is JobState.RUNNING


def test_jobsets_are_reported_once_per_batch_with_the_latest_sighting() -> None:
    result = fold_batch(rows(), [pod_event("u1", seen=1), pod_event("u2", seen=5),
                                 pod_event("u3", seen=3, jobset="other")])
    sightings = {(s.name, s.seen_at) for s in result.jobsets}
    assert sightings == {("sweep", at(5)), ("other", at(3))}


# Release outcomes -----------------------------------------------------------------------------

def released(decision: str = "d1", state: JobState = JobState.RELEASED,
             **fields: object) -> JobRow:
    return job("u1", state, decision_id=decision, released_at=at(1), **fields)


def test_a_failed_release_returns_the_job_to_its_queue() -> None:
    row = only_job(rows(released(release_attempts=1)),
                   outcome(ReleaseOutcomeKind.FAILED, reason="apiserver said 422"))
    assert row.state is JobState.QUEUED
    assert row.decision_id is None and row.released_at is None
    assert row.release_attempts == 1  # counted by the scheduler when it decided
    assert row.last_reason == "apiserver said 422"
    assert row.state_changed_at == at(5)


def test_an_outcome_of_a_stale_decision_leaves_the_job_alone() -> None:
    for kind in ReleaseOutcomeKind:
        result = fold_batch(rows(released("d2")), [outcome(kind, "d1")])
        assert result.jobs == [], kind
        assert [o.decision_id for o in result.decision_outcomes] == ["d1"]
        assert "stale" in result.ignored[0][1]


def test_failed_does_not_requeue_a_job_that_got_further_than_released() -> None:
    bound = job("u1", JobState.BOUND, decision_id="d1", released_at=at(1))
    assert fold_batch(rows(bound), [outcome(ReleaseOutcomeKind.FAILED)]).jobs == []


def test_failed_twice_requeues_once() -> None:
    result = fold_batch(rows(released(release_attempts=1)),
                        [outcome(ReleaseOutcomeKind.FAILED), outcome(ReleaseOutcomeKind.FAILED)])
    (row,) = result.jobs
    assert row.state is JobState.QUEUED and row.release_attempts == 1
    assert len(result.decision_outcomes) == 1


def test_ungated_moves_a_released_job_forward_and_stamps_it() -> None:
    row = only_job(rows(released()), outcome(ReleaseOutcomeKind.UNGATED, when=2))
    assert (row.state, row.ungated_at, row.decision_id) == (JobState.UNGATED, at(2), "d1")


def as_read_back(row: JobRow) -> JobRow:
    """`row` as job_store reads it from Postgres: its jsonb columns decoded from JSON."""
    return replace(row, placement=None if row.placement is None
                   else json.loads(json.dumps(row.placement)))


def test_the_gate_removal_the_ungater_reported_is_not_written_again_when_the_watcher_sees_it(
) -> None:
    """One fact, two reports: the ungater's outcome and the watcher's event of the same gate
    removal. Whichever queue-store folds second writes nothing (a row written is a new serial,
    the leader reads it again), even for a pod with tolerations, which every pod has (the
    apiserver adds its default ones): its placement read back from Postgres must equal the
    event's."""
    tolerated = {"placement": {"tolerations": [{"operator": "Exists"}]}}
    first = only_job(rows(), pod_event("u1", **tolerated))
    stored = as_read_back(replace(first, state=JobState.RELEASED, decision_id="d1",
                                  released_at=at(1)))
    ungated = as_read_back(only_job(rows(stored), outcome(ReleaseOutcomeKind.UNGATED, when=2)))
    again = fold_batch(rows(ungated), [pod_event("u1", JobState.UNGATED, seen=2, **tolerated)])
    assert again.jobs == []
    # The other order: the watcher's first, then the outcome (recorded on its decision only).
    seen = as_read_back(only_job(rows(stored),
                                 pod_event("u1", JobState.UNGATED, seen=2, **tolerated)))
    late = fold_batch(rows(seen), [outcome(ReleaseOutcomeKind.UNGATED, when=3)])
    assert late.jobs == [] and [o.decision_id for o in late.decision_outcomes] == ["d1"]
    # An event that does change the pod's books is still written.
    bound = fold_batch(rows(ungated), [pod_event("u1", JobState.BOUND, seen=3, node_name="n1",
                                                 **tolerated)])
    assert [(r.state, r.node_name) for r in bound.jobs] == [(JobState.BOUND, "n1")]


def test_ungated_after_the_watcher_saw_it_running_keeps_it_running() -> None:
    running = released(state=JobState.RUNNING, running_at=at(3), ungated_at=at(2))
    assert fold_batch(rows(running), [outcome(ReleaseOutcomeKind.UNGATED, when=9)]).jobs == []


def test_pod_gone_marks_the_job_deleted() -> None:
    row = only_job(rows(released()), outcome(ReleaseOutcomeKind.POD_GONE, reason="404"))
    assert (row.state, row.finished_at, row.last_reason) == (JobState.DELETED, at(5), "404")


def test_an_outcome_for_an_unknown_job_is_recorded_on_its_decision_only() -> None:
    result = fold_batch(rows(), [outcome(ReleaseOutcomeKind.UNGATED)])
    assert result.jobs == [] and len(result.decision_outcomes) == 1


# Snapshots ------------------------------------------------------------------------------------

def snapshot(*uids: str, listed: float = 100, cluster: str = CLUSTER,
             ended: dict[JobState, list[str]] | None = None, sid: str = "s1") -> ClusterSnapshot:
    return ClusterSnapshot(snapshot_id=sid, cluster=cluster, listed_at=at(listed),
                           pod_uids=list(uids), ended=ended or {})


def test_a_snapshot_deletes_unfinished_jobs_it_does_not_list() -> None:
    current = rows(job("kept"), job("gone"), job("running-gone", JobState.RUNNING),
                   job("done", JobState.SUCCEEDED))
    result = fold_batch(current, [snapshot("kept")])
    deleted = {r.uid: r for r in result.jobs}
    assert set(deleted) == {"gone", "running-gone"}
    assert all(r.state is JobState.DELETED and r.finished_at == at(100)
               for r in deleted.values())
    assert "snapshot s1" in deleted["gone"].last_reason
    (cluster,) = result.clusters
    assert (cluster.last_snapshot_id, cluster.last_snapshot_at) == ("s1", at(100))


def test_a_snapshot_spares_jobs_created_after_its_cutoff_and_other_clusters() -> None:
    listed_at = T0.replace(microsecond=500_000) + timedelta(seconds=100)
    same_second = job("same-second", created=100)  # creation timestamps are whole seconds
    later = job("later", created=101)
    elsewhere = replace(job("elsewhere"), cluster="cluster-b")
    event = ClusterSnapshot(snapshot_id="s", cluster=CLUSTER, listed_at=listed_at, pod_uids=[])
    assert snapshot_cutoff(event) == at(100)
    assert fold_batch(rows(same_second, later, elsewhere), [event]).jobs == []


def test_a_snapshot_spares_jobs_seen_changing_after_it_was_listed() -> None:
    # Created just before the list finished, reported by the watch that followed it, and that
    # report stored before the snapshot: the pod exists, the list merely missed it.
    seen_after_listing = job("during-list", created=99.0, state_changed_at=at(100.2))
    seen_before_listing = job("gone", created=99.0, state_changed_at=at(99.5))
    listed_at = at(100.1)
    event = ClusterSnapshot(snapshot_id="s", cluster=CLUSTER, listed_at=listed_at, pod_uids=[])
    (deleted,) = fold_batch(rows(seen_after_listing, seen_before_listing), [event]).jobs
    assert deleted.uid == "gone"


def after_snapshot(listed: set[str], *, listed_at: float = 100,
                   ended: dict[str, JobState] | None = None) -> CurrentRows:
    """Rows as stored once snapshot s1 (listing `listed` unfinished and `ended`) of CLUSTER was
    applied."""
    current = rows(clusters=(ClusterRow(CLUSTER, last_snapshot_id="s1",
                                        last_snapshot_at=at(listed_at)),))
    current.listed_by_latest_snapshot = {(CLUSTER, uid): None for uid in listed}
    current.listed_by_latest_snapshot |= {(CLUSTER, uid): s for uid, s in (ended or {}).items()}
    return current


def test_a_late_event_of_a_pod_the_latest_snapshot_did_not_list_stores_it_deleted() -> None:
    # Seen queued at 50 by a watcher that then died; the pod went; the restarted watcher's
    # snapshot (100) did not list it, and was applied before this event (another topic).
    row = only_job(after_snapshot({"other"}), pod_event("u1", seen=50, created=40))
    assert (row.state, row.finished_at) == (JobState.DELETED, at(100))
    assert row.last_reason == "vanished: not listed by snapshot s1"


def test_a_late_event_of_a_listed_pod_or_a_pod_seen_after_the_snapshot_is_stored_as_is() -> None:
    listed = only_job(after_snapshot({"u1"}), pod_event("u1", seen=50, created=40))
    seen_later = only_job(after_snapshot(set()), pod_event("u2", seen=120, created=40))
    created_later = only_job(after_snapshot(set()), pod_event("u3", seen=99, created=100.5))
    assert [r.state for r in (listed, seen_later, created_later)] == [JobState.QUEUED] * 3


def test_a_snapshot_earlier_in_the_batch_judges_late_events_after_it() -> None:
    result = fold_batch(rows(), [snapshot("u1", listed=100), pod_event("u1", seen=50),
                                 pod_event("u2", seen=50)])
    states = {r.uid: r.state for r in result.jobs}
    assert states == {"u1": JobState.QUEUED, "u2": JobState.DELETED}
    assert result.snapshot_listings == {CLUSTER: {"u1": None}}


def test_an_older_snapshot_does_not_replace_the_latest_listing() -> None:
    result = fold_batch(after_snapshot({"u1"}), [snapshot("u2", listed=90)])
    assert result.snapshot_listings == {} and result.clusters == []


def test_rows_to_read_asks_for_every_key_and_each_snapshots_scope() -> None:
    needed = rows_to_read([pod_event("u1"), outcome(ReleaseOutcomeKind.FAILED, uid="u2"),
                           snapshot("u1", listed=50), snapshot(listed=20),
                           ClusterCapacity(cluster="cluster-b", observed_at=T0, nodes=[])])
    assert needed.job_keys == {(CLUSTER, "u1"), (CLUSTER, "u2")}
    assert needed.snapshots == (SnapshotScope(CLUSTER, at(50), at(50), frozenset({"u1"})),
                                SnapshotScope(CLUSTER, at(20), at(20), frozenset()))
    assert needed.capacity_clusters == {"cluster-b"}
    assert needed.clusters == {CLUSTER, "cluster-b"}


def test_an_event_after_a_snapshot_deletion_does_not_revive_the_job() -> None:
    deleted = only_job(rows(job("u1")), snapshot())
    assert fold_batch(rows(deleted), [pod_event("u1", JobState.RUNNING, seen=200)]).jobs == []


# A watcher restart: the snapshot and its pods' events fold in any order ---------------------

def test_a_snapshot_folded_before_the_finish_event_records_how_the_pod_ended() -> None:
    # Running when the watcher died; finished while it was down. The restarted watcher's
    # relist publishes "succeeded" on pod-events and the snapshot on cluster-snapshots, and
    # queue-store folds the snapshot first (the pod-events consumer is behind a backlog).
    current = rows(job("done", JobState.RUNNING), job("broke", JobState.BOUND),
                   job("gone", JobState.RUNNING), job("alive", JobState.RUNNING))
    result = fold_batch(current, [snapshot("alive", ended={JobState.SUCCEEDED: ["done"],
                                                          JobState.FAILED: ["broke"]})])
    by_uid = {r.uid: r for r in result.jobs}
    assert {uid: r.state for uid, r in by_uid.items()} == {
        "done": JobState.SUCCEEDED, "broke": JobState.FAILED, "gone": JobState.DELETED}
    assert by_uid["done"].finished_at == at(100) and by_uid["done"].last_reason == ""
    assert result.snapshot_listings == {CLUSTER: {"alive": None, "done": JobState.SUCCEEDED,
                                                  "broke": JobState.FAILED}}
    # The finish event, folded afterwards, changes nothing.
    stored = rows(*(by_uid.get(j.uid, j) for j in current.jobs.values()))
    assert fold_batch(stored, [pod_event("done", JobState.SUCCEEDED, seen=100)]).jobs == []


def test_a_snapshot_says_ended_even_for_a_job_changed_after_it_was_listed() -> None:
    # What a snapshot says ended is final whenever it is folded: a pod never un-finishes.
    running = job("u1", JobState.RUNNING, state_changed_at=at(150))
    (row,) = fold_batch(rows(running), [snapshot(ended={JobState.FAILED: ["u1"]})]).jobs
    assert row.state is JobState.FAILED


def test_a_snapshot_leaves_a_job_already_ended_as_it_ended() -> None:
    done = job("u1", JobState.SUCCEEDED)
    assert fold_batch(rows(done), [snapshot(ended={JobState.DELETED: ["u1"]})]).jobs == []


def test_a_late_event_of_a_pod_the_latest_snapshot_listed_as_ended_takes_that_outcome() -> None:
    # Seen running at 50 by the watcher that died; stored only after the restarted watcher's
    # snapshot (100), which saw it succeeded.
    row = only_job(after_snapshot(set(), ended={"u1": JobState.SUCCEEDED}),
                   pod_event("u1", JobState.RUNNING, seen=50, created=40))
    assert (row.state, row.finished_at, row.running_at) == (JobState.SUCCEEDED, at(100), at(50))


def test_a_snapshot_earlier_in_the_batch_gives_late_events_their_outcome() -> None:
    result = fold_batch(rows(), [snapshot(listed=100, ended={JobState.FAILED: ["u1"]}),
                                 pod_event("u1", JobState.RUNNING, seen=50)])
    assert [r.state for r in result.jobs] == [JobState.FAILED]


def test_rows_to_read_asks_for_the_jobs_a_snapshot_says_ended() -> None:
    (scope,) = rows_to_read([snapshot("u1", ended={JobState.SUCCEEDED: ["u2"]})]).snapshots
    assert scope.listed == {"u1", "u2"} and scope.ended == {"u2": JobState.SUCCEEDED}


@pytest.mark.parametrize(("ended", "problem"), [
    ({JobState.RUNNING: ["u2"]}, "not how a pod ends"),
    ({JobState.CANCELLED: ["u2"]}, "not how a pod ends"),
    ({JobState.SUCCEEDED: ["u1"]}, "listed twice"),
    ({JobState.SUCCEEDED: ["u2"], JobState.FAILED: ["u2"]}, "listed twice"),
    ({JobState.SUCCEEDED: [" "]}, "blank uid"),
])
def test_a_snapshot_with_an_impossible_listing_is_refused(
        ended: dict[JobState, list[str]], problem: str) -> None:
    reason = invalid_reason(snapshot("u1", ended=ended))
    assert reason is not None and problem in reason


class _Books:
    """Postgres as queue-store's adapter keeps it: jobs, the clusters' latest snapshot, and its
    listing; each fold reads everything (a superset of what `rows_to_read` asks for)."""

    def __init__(self, jobs: list[JobRow]) -> None:
        self.jobs = {j.key: j for j in jobs}
        self.clusters: dict[str, ClusterRow] = {}
        self.listing: dict[tuple[str, str], JobState | None] = {}

    def fold(self, events: list[IngestEvent]) -> None:
        current = CurrentRows(jobs=dict(self.jobs), clusters=dict(self.clusters),
                              listed_by_latest_snapshot=dict(self.listing))
        result = fold_batch(current, events)
        self.jobs |= {r.key: r for r in result.jobs}
        self.clusters |= {c.name: c for c in result.clusters}
        for cluster, listed in result.snapshot_listings.items():
            self.listing = {k: v for k, v in self.listing.items() if k[0] != cluster}
            self.listing |= {(cluster, uid): state for uid, state in listed.items()}


@pytest.mark.parametrize("seed", range(300))
def test_a_restart_records_every_pod_as_the_apiserver_last_saw_it_in_any_order(
        seed: int) -> None:
    """Pods seen before the outage (some stored, some still in Kafka), then a relist: its
    events on pod-events (per pod in order, across pods in any order, some delivered twice)
    and its snapshot on cluster-snapshots, folded at any point, older snapshots redelivered
    too. Every pod ends as the relist saw it; a pod it did not list is deleted."""
    chooser = random.Random(seed)
    truth: dict[str, JobState] = {}  # as the relist at 100 saw each pod (DELETED: not listed)
    stored, pod_topic = [], []
    for i in range(12):
        uid = f"p{i}"
        before = chooser.choice([JobState.QUEUED, JobState.BOUND, JobState.RUNNING])
        seen_before = pod_event(uid, before, seen=chooser.uniform(10, 90), created=5)
        if chooser.random() < 0.5:
            stored.append(job(uid, before, created=5, state_changed_at=seen_before.observed_at))
            old_events: list[PodEvent] = []
        else:
            old_events = [seen_before]  # published by the dead watcher, not yet stored
        truth[uid] = chooser.choice([before, JobState.RUNNING, JobState.SUCCEEDED,
                                     JobState.FAILED, JobState.DELETED, JobState.DELETED])
        truth[uid] = advance(before, truth[uid])
        relist = ([] if truth[uid] is JobState.DELETED and chooser.random() < 0.8
                  else [pod_event(uid, truth[uid], seen=100, created=5, snapshot_id="s2")])
        if not relist:
            pass  # truly gone: the relist did not see it
        pod_topic.append(old_events + relist)
    listed_unfinished = [uid for uid, s in truth.items() if not s.is_terminal]
    ended: dict[JobState, list[str]] = {}
    for uid, state in truth.items():
        if state.is_terminal and any(e.uid == uid and e.snapshot_id for e in
                                     itertools.chain.from_iterable(pod_topic)):
            ended.setdefault(state, []).append(uid)
    old_snapshot = snapshot(*truth, listed=1, sid="s1")
    new_snapshot = snapshot(*listed_unfinished, listed=100, ended=ended, sid="s2")

    # Interleave: pods' event sequences merged at random (order kept per pod), some events
    # twice; the snapshots (and a redelivered old one) dropped in anywhere; random batches.
    queues = [list(events) for events in pod_topic if events]
    merged: list[IngestEvent] = []
    while queues:
        events = chooser.choice(queues)
        event = events.pop(0)
        merged.append(event)
        if chooser.random() < 0.2:
            merged.append(event)
        queues = [q for q in queues if q]
    for extra in (new_snapshot, old_snapshot, new_snapshot):
        merged.insert(chooser.randrange(len(merged) + 1), extra)
    books = _Books(stored)
    while merged:
        size = chooser.randint(1, 5)
        books.fold(merged[:size])
        merged = merged[size:]

    recorded = {j.uid: j.state for j in books.jobs.values()}
    expected = {uid: state for uid, state in truth.items() if uid in recorded}
    assert recorded == expected


# Capacity -------------------------------------------------------------------------------------

def capacity(observed: float, *nodes: tuple[str, int]) -> ClusterCapacity:
    return ClusterCapacity(
        cluster=CLUSTER, observed_at=at(observed),
        nodes=[NodeCapacity(name=name, allocatable={"cpu": cpu}) for name, cpu in nodes])


def node_row(name: str, cpu: int, *, present: bool = True, observed: float = 0) -> NodeRow:
    return NodeRow(cluster=CLUSTER, node=name, allocatable={"cpu": cpu}, unmanaged_usage={},
                   schedulable=True, present=present, observed_at=at(observed))


def test_capacity_upserts_nodes_and_marks_missing_ones_not_present() -> None:
    current = rows(nodes=(node_row("n1", 4000), node_row("n2", 4000), node_row("n3", 1000)),
                   clusters=(ClusterRow(CLUSTER, capacity_observed_at=at(0)),))
    result = fold_batch(current, [capacity(10, ("n1", 4000), ("n2", 8000), ("n4", 2000))])
    by_name = {n.node: n for n in result.nodes}
    assert set(by_name) == {"n2", "n3", "n4"}  # n1 did not change
    assert by_name["n2"].allocatable == {"cpu": 8000}
    assert by_name["n3"].present is False
    assert by_name["n4"].present is True
    assert result.clusters == [ClusterRow(CLUSTER, capacity_observed_at=at(10))]


def test_older_capacity_loses_to_newer() -> None:
    current = rows(nodes=(node_row("n1", 4000),),
                   clusters=(ClusterRow(CLUSTER, capacity_observed_at=at(10)),))
    result = fold_batch(current, [capacity(5, ("n1", 1))])
    assert (result.nodes, result.clusters) == ([], [])
    within_batch = fold_batch(rows(), [capacity(20, ("n1", 2)), capacity(15, ("n1", 1))])
    assert [n.allocatable for n in within_batch.nodes] == [{"cpu": 2}]


def test_a_node_that_comes_back_is_present_again() -> None:
    current = rows(nodes=(node_row("n1", 4000, present=False),),
                   clusters=(ClusterRow(CLUSTER, capacity_observed_at=at(1)),))
    (row,) = fold_batch(current, [capacity(2, ("n1", 4000))]).nodes
    assert row.present is True


# Validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("event", "reason"), [
    (pod_event("u1", requests={"cpu": -1}), "negative"),
    (pod_event(""), "uid must not be empty"),
    (pod_event("u1", queue="Not_A_Queue"), "queue name"),
    (pod_event("u1", jobset=""), "jobset"),
    (pod_event("u1", priority=2**40), "32-bit"),
    (pod_event("u1", namespace="a\x00b"), "NUL"),
    (pod_event("u1", created_at=datetime(2025, 1, 1)), "time zone"),
    (pod_event("u1", group="team/e", group_size=3, group_max_size=2), "not a valid elastic"),
    (pod_event("u1", group="team/e", group_size=3, group_max_size=10_001), "not a valid elastic"),
    (ClusterCapacity(cluster=CLUSTER, observed_at=T0,
                     nodes=[NodeCapacity(name="n", allocatable={"cpu": 1})] * 2), "twice"),
    (ClusterCapacity(cluster=CLUSTER, observed_at=T0,
                     nodes=[NodeCapacity(name="n", allocatable={"cpu": -4})]), "negative"),
    (snapshot("u1", ""), "blank uid"),
    (outcome(ReleaseOutcomeKind.FAILED, decision=""), "decision_id"),
])
def test_semantically_bad_events_are_refused_with_a_reason(event: IngestEvent,
                                                            reason: str) -> None:
    problem = invalid_reason(event)
    assert problem is not None and reason in problem


def test_good_events_pass_validation() -> None:
    for event in (pod_event("u1"), snapshot("u1"), capacity(1, ("n1", 1)),
                  outcome(ReleaseOutcomeKind.UNGATED)):
        assert invalid_reason(event) is None


def test_an_elastic_groups_maximum_is_stored_with_its_minimum() -> None:
    event = pod_event("u1", group="team/e", group_size=3, group_max_size=8)
    assert invalid_reason(event) is None
    (row,) = fold_batch(rows(), [event]).jobs
    assert (row.pod_group, row.pod_group_size, row.pod_group_max_size) == ("team/e", 3, 8)


# A property: whatever the batching, the end state is the same ---------------------------------

def test_batching_does_not_change_the_outcome() -> None:
    rng = random.Random(7)
    states = list(JobState)
    events: list[IngestEvent] = [
        pod_event(f"u{rng.randrange(20)}", rng.choice(states), seen=i) for i in range(300)
    ]

    def apply_in_batches(size: int) -> dict[tuple[str, str], JobRow]:
        current = rows()
        for start in range(0, len(events), size):
            for changed in fold_batch(current, events[start:start + size]).jobs:
                current.jobs[changed.key] = changed
        return current.jobs

    whole = apply_in_batches(len(events))
    assert apply_in_batches(1) == whole
    assert apply_in_batches(17) == whole


# A job set's cancel and its pods' ends, stored in either order --------------------------------

def cancelled(uid: str = "u1", *, at_: float = 50) -> JobRow:
    """As queue-store's cancel leaves a job: cancelled as of the cancel's time."""
    return job(uid, JobState.CANCELLED, state_changed_at=at(at_), finished_at=at(at_),
               last_reason="cancelled: sweep abandoned")


def test_a_pod_seen_finished_before_the_cancel_keeps_its_outcome_whatever_was_stored_first(
        ) -> None:
    # The end stored after the cancel (queue-store restarted, or behind on pod events).
    row = only_job(rows(cancelled()), pod_event("u1", JobState.SUCCEEDED, seen=40))
    assert (row.state, row.finished_at) == (JobState.SUCCEEDED, at(40))
    assert row.last_reason == "ended before its job set was cancelled (sweep abandoned)"
    # The end stored first: the cancel leaves a finished job alone (queue-store's UPDATE).
    failed = only_job(rows(job("u2", JobState.RUNNING)), pod_event("u2", JobState.FAILED, seen=40))
    assert failed.state is JobState.FAILED


def test_a_pod_that_ended_after_the_cancel_stays_cancelled() -> None:
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.DELETED, JobState.RUNNING):
        assert fold_batch(rows(cancelled()), [pod_event("u1", state, seen=60)]).jobs == []
    # A deletion seen before the cancel is no end of its own choosing: cancelled it stays.
    assert fold_batch(rows(cancelled()), [pod_event("u1", JobState.DELETED, seen=40)]).jobs == []
