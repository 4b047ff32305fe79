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

A pod that the autoscaler disrupted (Karpenter's consolidation, drift, expiry, a deleted
NodeClaim: it taints the node `karpenter.sh/disrupted:NoSchedule` and evicts the pods) did not
have its turn: the autoscaler took it away. It leaves a place too (`disrupted_place_left`),
though it was released: its controller's replacement, gated again, keeps the place it had in
line. What marks it is the watcher's `PodEvent.disrupted_by_autoscaler` (lockgate.observing
.disrupted_by_autoscaler): its node carried the taint, which only the autoscaler (an admin)
puts, when it was being deleted; never the pod's DisruptionTarget condition, which any eviction,
a tenant's own included, sets. Its place is in line since it was first queued
(`disrupted_place_since`), unless a maximum time queued is in force: then since as long before
its disruption as it had waited before its release, so the replacement has as long left to
wait as the pod had when it was released, not a deadline already past.

Attack cases, each refused (tests/unit/test_places.py):
- placeholder swap: a tiny pod queued early, deleted, and a big one created in its place —
  `BIGGER`;
- the same name in another queue, or in another namespace or cluster (another user's) —
  `OTHER_QUEUE`, `OTHER_NAMESPACE`, `OTHER_CLUSTER`;
- a pod that was released (it held or was about to hold capacity) leaves no place
  (`place_left`), nor does one that waited its maximum time queued (it was, or could have been,
  failed or deleted for it: inheriting that time would end its replacement at once, and a
  ReplicaSet would replace and lose pods in a loop);
- a released pod its owner deleted or evicted (the DisruptionTarget condition set), on a node
  the autoscaler was not disrupting: no place (`disrupted_place_left` is False); nor a pod that
  tolerates the disrupted taint (Karpenter never evicts it: only its owner could have), nor one
  that skipped the gate (lockgate never gave it a turn);
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


_ON_A_NODE = frozenset({JobState.BOUND, JobState.RUNNING})


def disrupted_place_left(*, before: JobState, after: JobState, released: bool,
                         skipped_gate: bool, disrupted_by_autoscaler: bool) -> bool:
    """Whether a job released by lockgate, bound to a node, that the autoscaler disrupted
    (`PodEvent.disrupted_by_autoscaler`) leaves its place for its replacement.

    `before` may be DELETED already: the event that first said the pod was going may have come
    before the watcher saw its node's taint, and a later one (its removal) says it."""
    return (disrupted_by_autoscaler and released and not skipped_gate
            and after is JobState.DELETED
            and (before in _ON_A_NODE or before is JobState.DELETED))


def disrupted_place_since(*, in_line_since: datetime, released_at: datetime | None,
                          deleted_at: datetime, max_queued_seconds: float | None) -> datetime:
    """Where a disrupted pod's place is in line: where it was (`in_line_since`); with a maximum
    time queued in force, as long before its disruption as it waited before its release, so
    the replacement is not over its maximum at once for the time the pod ran."""
    if max_queued_seconds is None or released_at is None:
        return in_line_since
    waited_before_release = max(released_at - in_line_since, timedelta(0))
    return max(in_line_since, deleted_at - waited_before_release)


# How long before the watcher saw a disrupted pod going its replacement may have been created:
# the controller acts on the eviction itself, and the watch reports it a moment later; a
# creationTimestamp is whole seconds.
REPLACEMENT_CLOCK_SLACK = timedelta(seconds=5)


def replacement_created_from(deleted_at: datetime) -> datetime:
    """The earliest creation of a pod that replaces one seen deleted at `deleted_at`."""
    return (deleted_at - REPLACEMENT_CLOCK_SLACK).replace(microsecond=0)


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
