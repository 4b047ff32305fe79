"""Waits that clients survive: which replacement keeps a deleted queued pod's place, and the
attack cases that must not (lockgate.places), through the ingest fold (lockgate.ingest)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from lockgate.events import PodEvent
from lockgate.ingest import CurrentRows, JobRow, fold_batch, rows_to_read
from lockgate.jobs import JobState
from lockgate.places import Claimant, LeftPlace, Refusal, best_place, place_left, refusal
from lockgate.queues import MaxQueued

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
GRACE = timedelta(minutes=10)
CPU = {"cpu": 1000, "memory": 2**30}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def a_place(**fields: object) -> LeftPlace:
    place = LeftPlace(cluster="c", namespace="alice", queue="research", name="jupyter-alice",
                      uid="old", controller_uid="", requests=CPU, queued_since=at(0),
                      deleted_at=at(60))
    return replace(place, **fields)  # type: ignore[arg-type]


def a_claimant(**fields: object) -> Claimant:
    claimant = Claimant(cluster="c", namespace="alice", queue="research", name="jupyter-alice",
                        uid="new", controller_uid="", requests=CPU, seen_at=at(90))
    return replace(claimant, **fields)  # type: ignore[arg-type]


# The rule, case by case ------------------------------------------------------------------------

@pytest.mark.parametrize(("place", "claimant", "want"), [
    pytest.param(a_place(), a_claimant(), None, id="same name, same shape"),
    pytest.param(a_place(), a_claimant(requests={"cpu": 500}), None, id="smaller"),
    pytest.param(a_place(name="web-abc12", controller_uid="rs-1"),
                 a_claimant(name="web-xyz89", controller_uid="rs-1"), None,
                 id="same controller, new name (a ReplicaSet's replacement)"),
    pytest.param(a_place(), a_claimant(requests={"cpu": 8000, "memory": 2**30}), Refusal.BIGGER,
                 id="attack: placeholder swapped for a bigger pod"),
    pytest.param(a_place(), a_claimant(requests={**CPU, "nvidia.com/gpu": 1}), Refusal.BIGGER,
                 id="attack: placeholder swapped for a pod asking a resource it did not"),
    pytest.param(a_place(), a_claimant(queue="other"), Refusal.OTHER_QUEUE,
                 id="attack: the same name in another queue"),
    pytest.param(a_place(), a_claimant(namespace="bob"), Refusal.OTHER_NAMESPACE,
                 id="attack: the same name in another user's namespace"),
    pytest.param(a_place(), a_claimant(cluster="d"), Refusal.OTHER_CLUSTER,
                 id="attack: the same name in another cluster"),
    pytest.param(a_place(), a_claimant(name="jupyter-mallory"), Refusal.OTHER_WORK,
                 id="another bare pod"),
    pytest.param(a_place(name="web-1", controller_uid="rs-1"),
                 a_claimant(name="web-2", controller_uid="rs-2"), Refusal.OTHER_WORK,
                 id="another controller"),
    pytest.param(a_place(name="a"), a_claimant(name="b", controller_uid=""), Refusal.OTHER_WORK,
                 id="two bare pods share no controller"),
    pytest.param(a_place(inherited_by="first"), a_claimant(), Refusal.TAKEN,
                 id="attack: one place claimed twice"),
    pytest.param(a_place(), a_claimant(seen_at=at(60) + GRACE + timedelta(seconds=1)),
                 Refusal.EXPIRED, id="after the grace period"),
    pytest.param(a_place(), a_claimant(uid="old"), Refusal.ITSELF, id="the deleted pod itself"),
])
def test_refusal(place: LeftPlace, claimant: Claimant, want: Refusal | None) -> None:
    assert refusal(place, claimant, grace=GRACE) == want


@pytest.mark.parametrize(("before", "after", "released", "want"), [
    (JobState.QUEUED, JobState.DELETED, False, True),
    (JobState.QUEUED, JobState.DELETED, True, False),  # attack: a pod that was released
    (JobState.RELEASED, JobState.DELETED, True, False),
    (JobState.RUNNING, JobState.DELETED, False, False),
    (JobState.QUEUED, JobState.CANCELLED, False, False),  # its job set was cancelled
    (JobState.QUEUED, JobState.FAILED, False, False),
])
def test_place_left(before: JobState, after: JobState, released: bool, want: bool) -> None:
    assert place_left(before=before, after=after, released=released) is want


def test_the_oldest_allowed_place_is_taken() -> None:
    places = [a_place(uid="p1", queued_since=at(10)), a_place(uid="p2", queued_since=at(5)),
              a_place(uid="p3", queued_since=at(1), requests={"cpu": 1})]  # too small
    assert best_place(a_claimant(), places, grace=GRACE) == places[1]


# Through the ingest fold ----------------------------------------------------------------------

def pod_event(uid: str, state: JobState = JobState.QUEUED, *, seen: float, created: float,
              **fields: object) -> PodEvent:
    values: dict[str, object] = {
        "event_id": f"{uid}-{state}-{seen}", "cluster": "c", "namespace": "alice",
        "name": "jupyter-alice", "uid": uid, "state": state, "queue": "research",
        "jobset": "notebooks", "requests": CPU, "created_at": at(created),
        "observed_at": at(seen)}
    values.update(fields)
    return PodEvent.model_validate(values)


def stored(current: CurrentRows, events: list[PodEvent], *,
           grace: timedelta = GRACE) -> CurrentRows:
    """`current` after folding `events` and writing the result, as the adapter would."""
    result = fold_batch(current, events, place_grace=grace)
    jobs = dict(current.jobs) | {row.key: row for row in result.jobs}
    places = dict(current.places) | {place.key: place for place in result.places}
    return replace(current, jobs=jobs, places=places)


def job(current: CurrentRows, uid: str) -> JobRow:
    return current.jobs[("c", uid)]


def test_a_retried_pod_keeps_its_place_and_counts_its_wait_from_the_original() -> None:
    books = stored(CurrentRows(), [pod_event("old", seen=0, created=0)])
    books = stored(books, [pod_event("old", JobState.DELETED, seen=60, created=0)])
    assert books.places[("c", "old")].queued_since == at(0)
    books = stored(books, [pod_event("new", seen=70, created=70)])
    assert job(books, "new").in_line_since == at(0)
    assert job(books, "new").kept_place_of == "jupyter-alice"
    assert books.places[("c", "old")].inherited_by == "new"
    # Redelivered, or late: nothing changes, nothing is handed out again.
    again = fold_batch(books, [pod_event("new", seen=70, created=70),
                               pod_event("old", JobState.DELETED, seen=60, created=0)])
    assert not again.jobs and not again.places


def test_a_retry_of_a_retry_keeps_the_first_place() -> None:
    books = stored(CurrentRows(), [pod_event("a", seen=0, created=0),
                                   pod_event("a", JobState.DELETED, seen=60, created=0)])
    books = stored(books, [pod_event("b", seen=70, created=70),
                           pod_event("b", JobState.DELETED, seen=130, created=70),
                           pod_event("c", seen=140, created=140)])
    assert job(books, "c").in_line_since == at(0)


def test_one_place_goes_to_one_replacement() -> None:
    books = stored(CurrentRows(), [pod_event("old", seen=0, created=0, controller_uid="rs"),
                                   pod_event("old", JobState.DELETED, seen=60, created=0,
                                             controller_uid="rs")])
    books = stored(books, [pod_event("r1", seen=70, created=70, name="w-1", controller_uid="rs"),
                           pod_event("r2", seen=71, created=71, name="w-2", controller_uid="rs")])
    assert job(books, "r1").in_line_since == at(0)
    assert job(books, "r2").in_line_since == at(71)


def test_a_bigger_replacement_queues_at_the_back() -> None:
    books = stored(CurrentRows(), [pod_event("tiny", seen=0, created=0, requests={"cpu": 10}),
                                   pod_event("tiny", JobState.DELETED, seen=60, created=0,
                                             requests={"cpu": 10})])
    books = stored(books, [pod_event("big", seen=70, created=70)])
    assert job(books, "big").in_line_since == at(70)
    assert job(books, "big").kept_place_of == ""
    assert books.places[("c", "tiny")].inherited_by is None


def test_a_released_pod_leaves_no_place() -> None:
    books = stored(CurrentRows(), [pod_event("old", seen=0, created=0)])
    books.jobs[("c", "old")] = replace(job(books, "old"), state=JobState.RELEASED,
                                       released_at=at(30), decision_id="d1")
    books = stored(books, [pod_event("old", JobState.DELETED, seen=60, created=0)])
    assert not books.places


def test_a_pod_that_waited_its_maximum_leaves_no_place() -> None:
    """Else a ReplicaSet whose pods lockgate deletes after their maximum time queued would
    create replacements lockgate deletes at once, in a loop."""
    books = stored(CurrentRows(queue_max_queued={"research": MaxQueued(seconds=60,
                                                                       action="delete")}),
                   [pod_event("old", seen=0, created=0),
                    pod_event("old", JobState.DELETED, seen=61, created=0)])
    assert not books.places


def test_no_grace_keeps_no_places() -> None:
    books = stored(CurrentRows(), [pod_event("old", seen=0, created=0),
                                   pod_event("old", JobState.DELETED, seen=60, created=0)],
                   grace=timedelta(0))
    assert not books.places
    assert not rows_to_read([pod_event("x", seen=0, created=0)],
                            place_grace=timedelta(0)).place_namespaces


def test_the_adapter_is_asked_for_the_places_of_each_namespace() -> None:
    needed = rows_to_read([pod_event("x", seen=0, created=0),
                           pod_event("y", seen=0, created=0, namespace="bob")])
    assert needed.place_namespaces == {("c", "alice"), ("c", "bob")}


def test_a_replacement_stored_before_the_deletion_takes_the_place_when_it_is_stored() -> None:
    """Pod events are keyed by uid: the replacement's may overtake the deletion's."""
    books = stored(CurrentRows(), [pod_event("old", seen=0, created=0)])
    books = stored(books, [pod_event("new", seen=70, created=70)])
    assert job(books, "new").in_line_since == at(70)
    books = stored(books, [pod_event("old", JobState.DELETED, seen=60, created=0)])
    assert job(books, "new").in_line_since == at(0)
    assert job(books, "new").kept_place_of == "jupyter-alice"
    assert books.places[("c", "old")].inherited_by == "new"
    needed = rows_to_read([pod_event("old", JobState.DELETED, seen=60, created=0)])
    assert needed.heirs_of == {("c", "alice", "jupyter-alice", "")}


def test_an_early_bigger_replacement_does_not_take_the_place() -> None:
    books = stored(CurrentRows(), [pod_event("old", seen=0, created=0, requests={"cpu": 10}),
                                   pod_event("big", seen=70, created=70)])
    books = stored(books, [pod_event("old", JobState.DELETED, seen=60, created=0,
                                     requests={"cpu": 10})])
    assert job(books, "big").in_line_since == at(70)
    assert books.places[("c", "old")].inherited_by is None
