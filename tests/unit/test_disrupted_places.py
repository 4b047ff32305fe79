"""Pods the autoscaler disrupts keep their place in line for their replacements (the kept-place
rule for a pod released, then evicted by Karpenter), and nothing else does: the attack cases.

Both halves are pure: what the watcher marks (lockgate.observing.disrupted_by_autoscaler, from
the node's taint) and what queue-store does with the mark (lockgate.places, lockgate.ingest).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from helpers import pods
from helpers.pods import PodBuilder
from lockgate.events import ClusterSnapshot, PodEvent
from lockgate.ingest import CurrentRows, JobRow, fold_batch
from lockgate.jobs import JobState
from lockgate.labels import MANAGED_NAMESPACE_LABEL
from lockgate.observing import ObservedCluster
from lockgate.places import disrupted_place_left, disrupted_place_since
from lockgate.queues import MaxQueued

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
GRACE = timedelta(minutes=10)
CPU = {"cpu": 1000, "memory": 2**30}
RS = "rs-uid-1"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# What queue-store does with the mark ---------------------------------------------------------

def pod_event(uid: str, state: JobState = JobState.QUEUED, *, seen: float, created: float,
              **fields: Any) -> PodEvent:
    values: dict[str, object] = {
        "event_id": f"{uid}-{state}-{seen}", "cluster": "c", "namespace": "alice",
        "name": f"web-{uid}", "uid": uid, "state": state, "queue": "research",
        "jobset": "web", "requests": CPU, "created_at": at(created), "observed_at": at(seen),
        "controller_uid": RS, "controlled": True}
    values.update(fields)
    return PodEvent.model_validate(values)


def stored(current: CurrentRows, events: list[PodEvent | ClusterSnapshot]) -> CurrentRows:
    result = fold_batch(current, events, place_grace=GRACE)
    jobs = dict(current.jobs) | {row.key: row for row in result.jobs}
    places = dict(current.places) | {place.key: place for place in result.places}
    return replace(current, jobs=jobs, places=places)


def job(current: CurrentRows, uid: str) -> JobRow:
    return current.jobs[("c", uid)]


def running(uid: str, *, created: float, released: float,
            current: CurrentRows | None = None, **fields: Any) -> CurrentRows:
    """`uid` queued at `created`, released by lockgate at `released`, running on node n1."""
    books = stored(current or CurrentRows(), [pod_event(uid, seen=created, created=created,
                                                        **fields)])
    books.jobs[("c", uid)] = replace(job(books, uid), state=JobState.RELEASED,
                                     released_at=at(released), decision_id=f"d-{uid}")
    return stored(books, [pod_event(uid, JobState.RUNNING, seen=released + 5, created=created,
                                    node_name="n1", **fields)])


def test_the_replacement_of_a_disrupted_pod_keeps_its_place_ahead_of_later_pods() -> None:
    books = running("orig", created=0, released=30)
    books = stored(books, [pod_event("later", seen=100, created=100)])  # queued after orig
    books = stored(books, [pod_event("orig", JobState.DELETED, seen=3600, created=0,
                                     node_name="n1", disrupted_by_autoscaler=True)])
    assert books.places[("c", "orig")].queued_since == at(0)
    books = stored(books, [pod_event("repl", seen=3601, created=3601)])
    assert job(books, "repl").in_line_since == at(0)
    assert job(books, "repl").kept_place_of == "web-orig"
    # The controller's other pod, queued while orig ran, is no replacement: it stays where it is.
    assert job(books, "later").in_line_since == at(100)
    assert job(books, "repl").in_line_since < job(books, "later").in_line_since
    assert books.places[("c", "orig")].inherited_by == "repl"


def test_a_replacement_stored_before_the_disruption_takes_the_place_when_it_is_stored() -> None:
    books = running("orig", created=0, released=30)
    books = stored(books, [pod_event("repl", seen=3601, created=3601)])
    books = stored(books, [pod_event("orig", JobState.DELETED, seen=3600, created=0,
                                     node_name="n1", disrupted_by_autoscaler=True)])
    assert job(books, "repl").in_line_since == at(0)


def test_the_mark_coming_after_the_deletion_still_leaves_the_place() -> None:
    """The watcher may see the pod going before its node's taint; the pod's removal, seen
    after the taint, carries the mark."""
    books = running("orig", created=0, released=30)
    books = stored(books, [pod_event("orig", JobState.DELETED, seen=3600, created=0,
                                     node_name="n1")])
    assert not books.places
    books = stored(books, [pod_event("orig", JobState.DELETED, seen=3602, created=0,
                                     node_name="n1", disrupted_by_autoscaler=True)])
    assert books.places[("c", "orig")].queued_since == at(0)
    assert books.places[("c", "orig")].deleted_at == at(3600)


def test_attack_deleting_or_evicting_your_own_running_pod_gains_no_place() -> None:
    """The owner's delete or eviction (DisruptionTarget set by the Eviction API) on a node the
    autoscaler is not disrupting: the watcher does not mark it, and a released pod had its
    turn."""
    books = running("orig", created=0, released=30)
    books = stored(books, [pod_event("orig", JobState.DELETED, seen=3600, created=0,
                                     node_name="n1")])
    assert not books.places
    books = stored(books, [pod_event("repl", seen=3601, created=3601)])
    assert job(books, "repl").in_line_since == at(3601)


def test_attack_a_pod_that_skipped_the_gate_gains_no_place() -> None:
    books = stored(CurrentRows(), [pod_event("orig", JobState.RUNNING, seen=0, created=0,
                                             node_name="n1")])
    books.jobs[("c", "orig")] = replace(job(books, "orig"), skipped_gate=True)
    books = stored(books, [pod_event("orig", JobState.DELETED, seen=60, created=0,
                                     node_name="n1", disrupted_by_autoscaler=True)])
    assert not books.places


@pytest.mark.parametrize(("replacement", "why"), [
    ({"requests": {"cpu": 4000, "memory": 2**30}}, "bigger"),
    ({"controller_uid": "rs-of-a-new-template"}, "another controller"),
    ({"queue": "other"}, "another queue"),
    ({"namespace": "bob"}, "another namespace"),
])
def test_attack_the_place_goes_only_to_the_same_work(replacement: dict[str, Any],
                                                     why: str) -> None:
    books = running("orig", created=0, released=30)
    books = stored(books, [pod_event("orig", JobState.DELETED, seen=3600, created=0,
                                     node_name="n1", disrupted_by_autoscaler=True)])
    books = stored(books, [pod_event("repl", seen=3601, created=3601, **replacement)])
    assert job(books, "repl").in_line_since == at(3601), why
    assert books.places[("c", "orig")].inherited_by is None


def test_one_disrupted_pod_leaves_one_place() -> None:
    books = running("orig", created=0, released=30)
    books = stored(books, [pod_event("orig", JobState.DELETED, seen=3600, created=0,
                                     node_name="n1", disrupted_by_autoscaler=True)])
    books = stored(books, [pod_event("r1", seen=3601, created=3601),
                           pod_event("r2", seen=3602, created=3602)])
    assert job(books, "r1").in_line_since == at(0)
    assert job(books, "r2").in_line_since == at(3602)


def test_a_pod_vanished_from_a_snapshot_leaves_no_place() -> None:
    """Nothing says how it went: no mark, no place."""
    books = running("orig", created=0, released=30)
    books = stored(books, [ClusterSnapshot(snapshot_id="s", cluster="c", listed_at=at(3600),
                                           pod_uids=[])])
    assert job(books, "orig").state is JobState.DELETED
    assert not books.places


def test_with_a_maximum_time_queued_the_replacement_has_the_wait_left_the_pod_had() -> None:
    """It ran an hour after waiting 30 s: its place counted from its creation would put the
    replacement past a 10-minute maximum at once."""
    limited = CurrentRows(queue_max_queued={"research": MaxQueued(seconds=600,
                                                                  action="delete")})
    books = running("orig", created=0, released=30, current=limited)
    books = stored(books, [pod_event("orig", JobState.DELETED, seen=3600, created=0,
                                     node_name="n1", disrupted_by_autoscaler=True)])
    assert books.places[("c", "orig")].queued_since == at(3570)


@pytest.mark.parametrize(("before", "released", "skipped", "marked", "want"), [
    (JobState.RUNNING, True, False, True, True),
    (JobState.BOUND, True, False, True, True),
    (JobState.DELETED, True, False, True, True),  # the mark came with a later event
    (JobState.RUNNING, True, False, False, False),  # its owner deleted or evicted it
    (JobState.RUNNING, False, False, True, False),  # never released by lockgate
    (JobState.RUNNING, True, True, True, False),  # skipped the gate
    (JobState.QUEUED, False, False, True, False),  # not on a node (the queued rule applies)
    (JobState.SUCCEEDED, True, False, True, False),  # it had finished
])
def test_disrupted_place_left(before: JobState, released: bool, skipped: bool, marked: bool,
                              want: bool) -> None:
    assert disrupted_place_left(before=before, after=JobState.DELETED, released=released,
                                skipped_gate=skipped, disrupted_by_autoscaler=marked) is want


def test_disrupted_place_since() -> None:
    assert disrupted_place_since(in_line_since=at(0), released_at=at(30), deleted_at=at(3600),
                                 max_queued_seconds=None) == at(0)
    assert disrupted_place_since(in_line_since=at(0), released_at=at(30), deleted_at=at(3600),
                                 max_queued_seconds=600) == at(3570)
    assert disrupted_place_since(in_line_since=at(0), released_at=at(30), deleted_at=at(20),
                                 max_queued_seconds=600) == at(0)


# What the watcher marks ----------------------------------------------------------------------

DISRUPTED = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}


def a_node(name: str, *taints: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"taints": list(taints)},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def a_cluster(*nodes: dict[str, Any]) -> ObservedCluster:
    ticks, ids = itertools.count(), itertools.count()
    cluster = ObservedCluster("c", now=lambda: T0 + timedelta(seconds=next(ticks)),
                              new_id=lambda: f"id-{next(ids)}")
    cluster.relist_namespaces([{"metadata": {"name": "team-a",
                                             "labels": {MANAGED_NAMESPACE_LABEL: "true"}}}])
    cluster.relist_nodes(list(nodes))
    cluster.relist_pods([])
    return cluster


def web_pod(node: str = "n1") -> PodBuilder:
    return (pods.a_pod("web-1").in_namespace("team-a").with_uid("u1").in_queue("q")
            .requesting(cpu="1").on_node(node).in_phase("Running"))


EVICTED = {"conditions": [{"type": "DisruptionTarget", "status": "True",
                           "reason": "EvictionByEvictionAPI"}]}


def test_a_pod_evicted_from_a_node_the_autoscaler_disrupts_is_marked() -> None:
    cluster = a_cluster(a_node("n1"))
    assert cluster.observe_pod(web_pod().obj()) is not None
    cluster.observe_node(a_node("n1", DISRUPTED))
    event = cluster.observe_pod(web_pod().being_deleted().obj())
    assert event is not None and event.state is JobState.DELETED
    assert event.disrupted_by_autoscaler


def test_a_running_pod_on_a_disrupted_node_is_not_marked_until_it_goes() -> None:
    cluster = a_cluster(a_node("n1", DISRUPTED))
    event = cluster.observe_pod(web_pod().obj())
    assert event is not None and not event.disrupted_by_autoscaler


def test_the_pods_removal_after_its_tainted_node_went_is_marked() -> None:
    """The node watch may report the node's deletion before the pod watch reports the pod's."""
    cluster = a_cluster(a_node("n1"))
    cluster.observe_pod(web_pod().obj())
    cluster.observe_node(a_node("n1", DISRUPTED))
    cluster.observe_node(a_node("n1", DISRUPTED), deleted=True)
    event = cluster.observe_pod(web_pod().obj(), deleted=True)
    assert event is not None and event.disrupted_by_autoscaler


def test_a_node_gone_while_tainted_is_remembered_across_a_node_relist() -> None:
    cluster = a_cluster(a_node("n1", DISRUPTED))
    cluster.observe_pod(web_pod().obj())
    cluster.relist_nodes([])
    event = cluster.observe_pod(web_pod().obj(), deleted=True)
    assert event is not None and event.disrupted_by_autoscaler


def test_the_mark_seen_late_is_published_again() -> None:
    cluster = a_cluster(a_node("n1"))
    cluster.observe_pod(web_pod().obj())
    first = cluster.observe_pod(web_pod().being_deleted().obj())
    assert first is not None and not first.disrupted_by_autoscaler
    cluster.observe_node(a_node("n1", DISRUPTED))
    late = cluster.observe_pod(web_pod().being_deleted().obj(), deleted=True)
    assert late is not None and late.disrupted_by_autoscaler


def test_attack_evicting_your_own_pod_is_not_marked() -> None:
    """A tenant's eviction sets DisruptionTarget (EvictionByEvictionAPI) as Karpenter's does;
    the node carries no taint of the autoscaler's."""
    cluster = a_cluster(a_node("n1", {"key": "team", "value": "a", "effect": "NoSchedule"}))
    cluster.observe_pod(web_pod().obj())
    event = cluster.observe_pod(web_pod().being_deleted().with_status(**EVICTED).obj())
    assert event is not None and event.state is JobState.DELETED
    assert not event.disrupted_by_autoscaler


def test_attack_a_pod_that_tolerates_the_disrupted_taint_is_not_marked() -> None:
    """Karpenter never evicts a pod that tolerates its taint (it could land on a node being
    disrupted): if it goes, someone else deleted it."""
    cluster = a_cluster(a_node("n1", DISRUPTED))
    pod = web_pod().tolerating(key="karpenter.sh/disrupted", operator="Exists")
    cluster.observe_pod(pod.obj())
    event = cluster.observe_pod(pod.being_deleted().obj())
    assert event is not None and not event.disrupted_by_autoscaler


def test_a_disruption_called_off_is_not_marked() -> None:
    """Karpenter removes the taint when it abandons a disruption; a pod deleted afterwards was
    deleted by someone else."""
    cluster = a_cluster(a_node("n1", DISRUPTED))
    cluster.observe_pod(web_pod().obj())
    cluster.observe_node(a_node("n1"))
    event = cluster.observe_pod(web_pod().being_deleted().obj())
    assert event is not None and not event.disrupted_by_autoscaler
