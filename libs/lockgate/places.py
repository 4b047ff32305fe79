"""Keeping a deleted pod's place in line for the pod that replaces it.

Why: clients that wait for their pod to start give up after a timeout and delete it while it is
still gated (JupyterHub's KubeSpawner after `start_timeout`, Airflow's KubernetesPodOperator after
`schedule_timeout_seconds`); a retry creates it again. Without this module the retry queues at
the back, and every retry loses the place the user had waited for.

The rule (docs/pending-pods.md, "Waits that clients survive"): a pod deleted while queued, never
released, leaves a `LeftPlace`. A new pod that does the same work, first stored within the grace
period after that deletion, inherits it: it is ordered in its queue, and its maximum time queued
counts, from when the deleted pod was queued (`queued_since`). The honest choice: the work has
waited since then, and a deadline that restarted on every retry would never end.

"The same work" (`refusal`): the same cluster, namespace and queue, and either the same pod name
(KubeSpawner's `jupyter-<user>`, a bare pod retried) or the same controlling owner (uid). A
controller's uid fixes the pod template for a ReplicaSet (a Deployment's new template is a new
ReplicaSet) and for a Job (its template is immutable); for other controllers the bound on the
requests below is what matters. The replacement asks at most what the deleted pod asked, resource
by resource. Each place is inherited once.

Attack cases, each refused (tests/unit/test_places.py):
- placeholder swap: a tiny pod queued early, deleted, and a big one created in its place —
  `BIGGER`;
- the same name in another queue, or in another namespace or cluster (another user's) —
  `OTHER_QUEUE`, `OTHER_NAMESPACE`, `OTHER_CLUSTER`;
- a pod that was released (it held or was about to hold capacity) leaves no place
  (`place_left`), nor does one that waited its maximum time queued (it was, or could have been,
  failed or deleted for it: inheriting that time would end its replacement at once, and a
  ReplicaSet would replace and lose pods in a loop);
- one place claimed twice — `TAKEN`; claimed after the grace period — `EXPIRED`;
- an unrelated pod of another controller, or a bare pod with another name — `OTHER_WORK`.

Pure: the adapter (lockgate_adapters.job_store) keeps the places in Postgres (table
`left_places`, collected after the grace period) and asks `best_place` where a new job's row is
first written (lockgate.ingest).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from lockgate.jobs import JobState

DEFAULT_GRACE_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class LeftPlace:
    """The place in line of a pod deleted while queued, kept for a replacement."""

    cluster: str
    namespace: str
    queue: str
    name: str
    uid: str
    controller_uid: str  # "" for a bare pod
    requests: Mapping[str, int]
    queued_since: datetime  # its own creation, or the place it had inherited
    deleted_at: datetime
    inherited_by: str | None = None  # the uid of the pod that took it

    @property
    def key(self) -> tuple[str, str]:
        return (self.cluster, self.uid)


@dataclass(frozen=True, slots=True)
class Claimant:
    """A pod stored for the first time, that may take a place."""

    cluster: str
    namespace: str
    queue: str
    name: str
    uid: str
    controller_uid: str
    requests: Mapping[str, int]
    seen_at: datetime  # when it was observed: the grace period is judged by this


class Refusal(StrEnum):
    ITSELF = "itself"
    OTHER_CLUSTER = "other_cluster"
    OTHER_NAMESPACE = "other_namespace"
    OTHER_QUEUE = "other_queue"
    OTHER_WORK = "other_work"  # neither the same name nor the same controller
    BIGGER = "bigger"  # asks more of some resource than the deleted pod did
    TAKEN = "taken"
    EXPIRED = "expired"


def place_left(*, before: JobState, after: JobState, released: bool) -> bool:
    """Whether a job that moved from `before` to `after` leaves its place for a replacement:
    deleted while queued, never released (a release in force or past, however it ended, gave
    it its turn)."""
    return before is JobState.QUEUED and after is JobState.DELETED and not released


def waited_its_maximum(*, queued_since: datetime, deleted_at: datetime,
                       max_queued_seconds: float | None) -> bool:
    """Whether a deleted pod had waited its maximum time queued (then it leaves no place)."""
    return (max_queued_seconds is not None
            and (deleted_at - queued_since).total_seconds() >= max_queued_seconds)


def refusal(place: LeftPlace, claimant: Claimant, *, grace: timedelta) -> Refusal | None:
    """Why `claimant` may not take `place`, or None when it may."""
    if claimant.uid == place.uid:
        return Refusal.ITSELF
    if claimant.cluster != place.cluster:
        return Refusal.OTHER_CLUSTER
    if claimant.namespace != place.namespace:
        return Refusal.OTHER_NAMESPACE
    if claimant.queue != place.queue:
        return Refusal.OTHER_QUEUE
    same_controller = bool(place.controller_uid) and claimant.controller_uid == place.controller_uid
    if claimant.name != place.name and not same_controller:
        return Refusal.OTHER_WORK
    if not asks_at_most(claimant.requests, place.requests):
        return Refusal.BIGGER
    if place.inherited_by is not None and place.inherited_by != claimant.uid:
        return Refusal.TAKEN
    if claimant.seen_at - place.deleted_at > grace:
        return Refusal.EXPIRED
    return None


def asks_at_most(requests: Mapping[str, int], bound: Mapping[str, int]) -> bool:
    """Every resource of `requests` is at most `bound`'s (a resource it lacks counts as 0)."""
    return all(amount <= bound.get(resource, 0) for resource, amount in requests.items()
               if amount > 0)


def kept_place_note(*, deleted_pod: str, waited: str) -> str:
    """What a replacement's first notice says before why it waits: whose place it kept, and
    how long the work has waited in all (`waited`, formatted)."""
    return (f'it kept the place in line of deleted pod "{deleted_pod}" (waiting {waited} in '
            "all); ")


def best_place(claimant: Claimant, places: Iterable[LeftPlace], *,
               grace: timedelta) -> LeftPlace | None:
    """The place `claimant` takes: of those it may, the one queued longest (then by uid, so the
    choice does not depend on the order they were read in)."""
    allowed = [place for place in places if refusal(place, claimant, grace=grace) is None]
    return min(allowed, key=lambda place: (place.queued_since, place.uid), default=None)
