"""The event contracts: one typed, versioned model per Kafka topic, with its key and consumers.

Why one module: producers and consumers live in different services and must agree on the bytes.
Every topic is described by a `Topic` that names its model, how its key is derived (which fixes
partitioning and therefore ordering) and which services consume it. Models carry `v`, the schema
version; a consumer that meets a version or shape it does not know sends the message to the
dead-letter topic instead of guessing.

Consumers must be idempotent: every message may arrive twice, and messages with different keys
arrive in any order relative to each other.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from lockgate.jobs import JobState
from lockgate.max_queued import JobSetMaxQueued
from lockgate.placement import PodPlacement, Requirement, Taint


class Event(BaseModel):
    """Base of every event: immutable, and unknown fields are an error, not silence."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PodEvent(Event):
    """What cluster-watcher observed of one managed pod: its state and what it asks for.

    State-carrying rather than delta-carrying: folding any subset of these through
    `lockgate.jobs.advance`, in any order, converges to the truth.
    """

    v: Literal[1] = 1
    event_id: str
    cluster: str
    namespace: str
    name: str
    uid: str
    state: JobState
    queue: str
    jobset: str
    priority: int = 0
    requests: dict[str, int] = Field(default_factory=dict)  # canonical units (cpu: millicores)
    node_name: str | None = None
    created_at: datetime  # the pod's creationTimestamp
    observed_at: datetime
    resource_version: str = ""
    gated: bool = True  # lockgate's gate still present
    snapshot_id: str | None = None  # set when published as part of a (re)start snapshot
    admission_trace: str | None = None  # traceparent of the admission review that gated it
    # Added in place (optional, defaulted): which nodes the pod may land on, and what
    # kube-scheduler says of it. A consumer older than these fields dead-letters events that
    # carry them, so queue-store is upgraded before cluster-watcher.
    placement: PodPlacement | None = None  # tolerations, nodeSelector, required node affinity
    # PodScheduled=False with reason Unschedulable: since when (its lastTransitionTime), and why.
    unschedulable_since: datetime | None = None
    unschedulable_message: str = ""
    controlled: bool = False  # has an ownerReference with controller: true (e.g. a ReplicaSet)
    # Added in place (optional, defaulted): that controller's uid, which a back-off is kept by
    # (lockgate.backoff); "" when none. Upgrade queue-store before cluster-watcher.
    controller_uid: str = ""
    # Pod groups and preemption (lockgate.groups, lockgate.scheduler.preemption); a group is per
    # namespace.
    group: str | None = None
    group_size: int = 0  # the members released together: a static group's size, else its minimum
    # Added in place (optional, defaulted): an elastic group's maximum (0: a static group).
    # Upgrade queue-store before cluster-watcher.
    group_max_size: int = 0
    preemptible: bool = False  # the pod's lockgate.io/preemptible label is "true"
    priority_class: str = ""  # spec.priorityClassName
    # The job set's own maximum time queued (lockgate.max_queued), from the pod's annotations
    # as the webhook left them; None: only its queue's rule, if any.
    max_queued: JobSetMaxQueued | None = None
    # Added in place (optional, defaulted): lockgate never gated the pod (no webhook served
    # its namespace, or it failed open; lockgate.observing.skipped_the_gate), and its
    # namespace's labels when it did, so queue-store can check that the queue binds the
    # namespace before counting the pod as the queue's. Upgrade queue-store before
    # cluster-watcher.
    skipped_gate: bool = False
    namespace_labels: dict[str, str] = Field(default_factory=dict)
    # Added in place (optional, defaulted): the pod is being deleted while its node carries
    # Karpenter's `karpenter.sh/disrupted:NoSchedule` taint, which the pod does not tolerate:
    # the autoscaler took the node away (consolidation, drift, expiry, a deleted NodeClaim),
    # so its replacement keeps its place in line (lockgate.places, lockgate.observing
    # .disrupted_by_autoscaler). Set only by the watcher, from the node's taints: a tenant
    # cannot taint nodes. Upgrade queue-store before cluster-watcher.
    disrupted_by_autoscaler: bool = False


class ClusterSnapshot(Event):
    """Sent after cluster-watcher (re)listed a cluster: every managed pod it saw, and how each
    listed pod that had already ended ended.

    queue-store marks as deleted the unfinished jobs of this cluster that are not listed (in
    `pod_uids` or `ended`) and were created before `listed_at`: they vanished while nobody was
    watching. A job listed in `ended` takes that outcome: the snapshot travels on another topic
    than its pods' events, so it may be folded before the event that says the pod finished
    (lockgate.ingest).
    """

    v: Literal[1] = 1
    snapshot_id: str
    cluster: str
    listed_at: datetime
    pod_uids: list[str]  # listed, not ended
    # Added in place (optional, defaulted): listed pods that had ended, by how (succeeded,
    # failed, or deleted: being deleted). An older consumer dead-letters snapshots that carry
    # it, so queue-store is upgraded before cluster-watcher.
    ended: dict[JobState, list[str]] = Field(default_factory=dict)

    def ended_by_uid(self) -> dict[str, JobState]:
        return {uid: state for state, uids in self.ended.items() for uid in uids}


class NodeCapacity(Event):
    name: str
    allocatable: dict[str, int]  # canonical units
    schedulable: bool = True
    # Requests of pods lockgate does not manage that are bound to this node.
    unmanaged_usage: dict[str, int] = Field(default_factory=dict)
    # Added in place (optional, defaulted), for placement; see PodEvent.placement.
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)


class ClusterCapacity(Event):
    """The whole capacity picture of one cluster; the newest `observed_at` wins."""

    v: Literal[1] = 1
    cluster: str
    observed_at: datetime
    nodes: list[NodeCapacity]


class NodePoolStatus(Event):
    """One autoscaler NodePool (Karpenter's `karpenter.sh/v1` NodePool), as the watcher saw it.

    Amounts in canonical units (lockgate.resources). `limits` lists only the resources the pool
    caps (`spec.limits`; a resource not named is unbounded); `in_use` is `status.resources`,
    which counts the NodeClaims in flight as well as the nodes that exist.
    """

    name: str
    limits: dict[str, int] = Field(default_factory=dict)
    in_use: dict[str, int] = Field(default_factory=dict)
    # spec.template.spec.requirements, and the labels and taints every node it makes carries
    # (spec.template.metadata.labels, spec.template.spec.taints; startupTaints are not kept:
    # they go before pods land).
    requirements: tuple[Requirement, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    # Why it is not Ready (the Ready condition's reason and message), when it is not.
    not_ready_reason: str = ""
    weight: int = 0  # spec.weight: Karpenter tries pools of higher weight first


class NodeClaimStatus(Event):
    """One NodeClaim: a node an autoscaler is making (or made) for a NodePool."""

    name: str
    node_pool: str
    created_at: datetime
    # status.capacity / status.allocatable once launched (empty before).
    allocatable: dict[str, int] = Field(default_factory=dict)
    node_name: str = ""  # status.nodeName once registered
    launched: bool = False
    registered: bool = False
    initialized: bool = False
    # Set when the claim failed or cannot launch: its condition's reason and message, for
    # example "InsufficientCapacity: ..." or a NodePool limit reached.
    failure: str = ""
    deleting: bool = False


class ClusterGrowth(Event):
    """What a cluster's autoscaler may still add: its NodePools and the NodeClaims in flight.

    One message is the whole picture of one cluster; the newest `observed_at` wins. A cluster
    with no autoscaler (no NodePool kind served) publishes `autoscaled=False` and empty lists.
    """

    v: Literal[1] = 1
    cluster: str
    observed_at: datetime
    autoscaled: bool = False
    node_pools: list[NodePoolStatus] = Field(default_factory=list)
    node_claims: list[NodeClaimStatus] = Field(default_factory=list)


class ReleaseCommand(Event):
    """The fair scheduler's decision to release one pod; recorded in Postgres before it is sent."""

    v: Literal[1] = 1
    decision_id: str
    cluster: str
    namespace: str
    name: str
    uid: str
    queue: str
    decided_at: datetime
    # Added in place (optional, defaulted): a release for growth (docs/autoscaling.md) says why,
    # "released so that cluster-b grows (NodePool default: headroom cpu=48)", and the ungater
    # writes it on the pod as an Event. "" for any other release, and for a command published
    # again (the words live in the leader's round, not in Postgres). Events forbid unknown
    # fields, so upgrade the ungater before the fair-scheduler.
    growth: str = ""
    # Added in place (optional, defaulted) the same way: node affinity requirements the ungater
    # ANDs into each term of the pod's required node affinity while the pod is still gated (a
    # release for growth onto a node of a given size: `GrowthNote.avoid`, so that Karpenter
    # makes that size). Empty for any other release and for a command published again. Same
    # upgrade order: the ungater first, then the fair-scheduler.
    node_requirements: tuple[Requirement, ...] = ()


class ReleaseOutcomeKind(StrEnum):
    UNGATED = "ungated"  # lockgate's gate removed now or earlier
    POD_GONE = "pod_gone"  # the pod no longer exists (or was replaced under the same name)
    FAILED = "failed"  # gave up; the job goes back to its queue


class ReleaseOutcome(Event):
    v: Literal[1] = 1
    decision_id: str
    cluster: str
    uid: str
    outcome: ReleaseOutcomeKind
    reason: str = ""
    at: datetime


class PodNotice(Event):
    """Something a pod's owner should read on the pod: why lockgate keeps it gated.

    The fair-scheduler leader sends it (cluster-watcher too, for a pod that skipped the gate);
    the ungater of the pod's cluster writes it as a Warning Event on the pod. `reason` is a
    `lockgate.noticing.NoticeReason` value; a reason this ungater does not know is still
    written (it is only text on the pod).
    """

    v: Literal[1] = 1
    cluster: str
    namespace: str
    name: str
    uid: str
    queue: str
    reason: str
    message: str
    at: datetime
    # Added in place (optional, defaulted): after writing the Event, delete the pod (only this
    # uid: a precondition), so that its controller creates a replacement, gated again. Sent for
    # a released pod kube-scheduler could not place (see docs/scheduling.md).
    delete_pod: bool = False
    # Added compatibly (an older scheduler sends none of these): "Normal" for a pod that waits
    # its turn, "Warning" when the pod needs its owner (queue unknown or cordoned, fits no node).
    event_type: Literal["Normal", "Warning"] = "Warning"
    # Tells repeated notices of one reason apart (the Event's name holds it); "" for a notice
    # written once per (pod, reason).
    series: str = ""
    # What the ungater does to the pod after writing the Event: "" nothing; "delete" deletes it
    # (waited past its queue's maximum time queued, preempted to fair share, its pod group timed
    # out); "fail" marks it Failed (maximum time queued, or a timed-out group, as the queue says).
    action: Literal["", "delete", "fail"] = ""


class JobSetCommand(Event):
    """An operator's command about a whole job set; today only `cancel`.

    queue-store sets the job set's unfinished jobs to cancelled (with the reason) and starts
    collecting its ephemeral namespaces; every ungater deletes the job set's pods, gated and
    running, in the clusters it serves. Both are idempotent: a redelivered or repeated cancel
    changes nothing more.

    A cancel is about the pods that existed when it was asked for (`covers`), not those that
    exist when a consumer gets to it: a consumer restarted after a while, or behind a backlog,
    must do what it would have done at once, or queue-store would cancel a job whose pod the
    ungater left alone (or the reverse), and the books would depend on who lagged.
    """

    v: Literal[1] = 1
    command_id: str
    kind: Literal["cancel"] = "cancel"
    queue: str
    jobset: str
    reason: str
    requested_by: str
    at: datetime

    @property
    def covers_created_before(self) -> datetime:
        """The cancel covers the job set's pods created before this instant.

        Kubernetes creationTimestamps have whole seconds, so a pod created in the second of the
        cancel cannot be told from one created just before: it is covered too.
        """
        return self.at.replace(microsecond=0) + timedelta(seconds=1)

    def covers(self, created_at: datetime) -> bool:
        return created_at < self.covers_created_before


class NamespaceCommand(Event):
    """An operator's command about one ephemeral namespace; today only `delete`, which starts
    its collection (trigger `requested`). queue-store, the collector, consumes it."""

    v: Literal[1] = 1
    command_id: str
    kind: Literal["delete"] = "delete"
    cluster: str
    name: str
    reason: str
    requested_by: str
    at: datetime


class PayloadEncoding(StrEnum):
    UTF8 = "utf-8"  # `data` is the bytes as text
    BASE64 = "base64"  # `data` is the bytes in standard base64 (they were not text, or less fit)


class PayloadExcerpt(Event):
    """A dead message's key or value: its size and digest always, its bytes as far as they fit.

    `data` holds the whole original when `complete`, else only its first bytes: a letter must fit
    under Kafka's maximum message size whatever the message carried. `sha256` (of the whole
    original) identifies the message even then, e.g. against a producer's own log.
    """

    size: int = Field(ge=0)  # bytes of the original
    sha256: str  # hex digest of the whole original
    encoding: PayloadEncoding
    data: str
    complete: bool

    def kept(self) -> bytes:
        """The original bytes `data` holds: all of them if `complete`, else a prefix."""
        if self.encoding is PayloadEncoding.BASE64:
            return base64.b64decode(self.data, validate=True)
        return self.data.encode()

    @property
    def text(self) -> str | None:
        """The original as text, if it was valid UTF-8 and is kept whole."""
        return self.data if self.complete and self.encoding is PayloadEncoding.UTF8 else None


class DeadLetter(Event):
    """A message a consumer could not process: where it was, why, and what it held.

    Built by `lockgate.dead_lettering.dead_letter`, which keeps every letter under a size bound
    whatever the message was. v2: key and value are `PayloadExcerpt`s (size, sha256, and as much
    of the bytes as fits); v1 carried them as lossy UTF-8 text of any size, so a large binary
    message made a letter Kafka refused. Nothing in lockgate consumes this topic; operators'
    readers must accept `v` 2.
    """

    v: Literal[2] = 2
    source_topic: str
    partition: int
    offset: int
    key: PayloadExcerpt | None  # None: the message had no key
    value: PayloadExcerpt | None  # None: the message had no value (a tombstone)
    reason: str
    consumer: str  # the service's name for the consuming loop, e.g. "queue-store:<topic>"
    at: datetime
    # Added in place (optional, defaulted): who wrote the letter, so a letter on a Kafka that
    # several deployments share leads to the one that wrote it: its consumer group (which
    # deployment) and its instance (which process: LOCKGATE_<SERVICE>_INSTANCE_ID, by default
    # host-pid; the pod's name in k8s/).
    group: str = ""
    instance: str = ""

    @property
    def source_key(self) -> str | None:
        """The message's key as text, if it was text and is kept whole."""
        return self.key.text if self.key is not None else None

    def reference(self) -> str:
        """Where the message is and what identifies it, for a log line."""
        parts = [f"{self.source_topic}[{self.partition}]@{self.offset}"]
        for name, payload in (("key", self.key), ("value", self.value)):
            if payload is not None:
                parts.append(f"{name} {payload.size} bytes sha256 {payload.sha256}")
        return ", ".join(parts)

    def writer(self) -> str:
        """Who wrote the letter, for a log line."""
        return f"consumer {self.consumer} of group {self.group!r}, instance {self.instance!r}"


def _dead_letter_key(letter: DeadLetter) -> str:
    """The source key when it is text, else its digest: one message's letters stay together."""
    if letter.key is None:
        return ""
    return letter.key.text if letter.key.text is not None else letter.key.sha256


EventT = TypeVar("EventT", bound=Event)


@dataclass(frozen=True)
class Topic(Generic[EventT]):
    name: str
    model: type[EventT]
    key: Callable[[EventT], str]
    consumers: tuple[str, ...]
    why: str

    def encode(self, event: EventT) -> bytes:
        return event.model_dump_json().encode()

    def decode(self, payload: bytes) -> EventT:
        return self.model.model_validate_json(payload)

    def key_bytes(self, event: EventT) -> bytes:
        return self.key(event).encode()


POD_EVENTS: Topic[PodEvent] = Topic(
    name="lockgate.pod-events.v1",
    model=PodEvent,
    key=lambda e: e.uid,  # one pod's events stay in one partition, in order
    consumers=("queue-store",),
    why="managed pods' lifecycle as seen by cluster-watcher",
)
CLUSTER_SNAPSHOTS: Topic[ClusterSnapshot] = Topic(
    name="lockgate.cluster-snapshots.v1",
    model=ClusterSnapshot,
    key=lambda e: e.cluster,
    consumers=("queue-store",),
    why="reconcile pods that vanished while no watcher was looking",
)
CLUSTER_CAPACITY: Topic[ClusterCapacity] = Topic(
    name="lockgate.cluster-capacity.v1",
    model=ClusterCapacity,
    key=lambda e: e.cluster,
    consumers=("queue-store",),
    why="allocatable per node and usage by pods lockgate does not manage",
)
CLUSTER_GROWTH: Topic[ClusterGrowth] = Topic(
    name="lockgate.cluster-growth.v1",
    model=ClusterGrowth,
    key=lambda e: e.cluster,
    consumers=("queue-store",),
    why="what each cluster's autoscaler may still add (NodePools, NodeClaims in flight)",
)
RELEASE_COMMANDS: Topic[ReleaseCommand] = Topic(
    name="lockgate.release-commands.v1",
    model=ReleaseCommand,
    key=lambda e: e.uid,
    consumers=("ungater",),
    why="decisions of the fair scheduler, for the ungater of the pod's cluster",
)
RELEASE_OUTCOMES: Topic[ReleaseOutcome] = Topic(
    name="lockgate.release-outcomes.v1",
    model=ReleaseOutcome,
    key=lambda e: e.uid,
    consumers=("queue-store",),
    why="what became of each release, so a job's state follows and failed releases requeue",
)
POD_NOTICES: Topic[PodNotice] = Topic(
    name="lockgate.pod-notices.v1",
    model=PodNotice,
    key=lambda e: e.uid,
    consumers=("ungater",),
    why="why a pod stays gated (its queue, its position, what it waits for), for an Event on "
        "the pod; and pods to delete or fail after their maximum time queued. Sent by the "
        "fair-scheduler leader, and by cluster-watcher for a pod that skipped the gate",
)
JOBSET_COMMANDS: Topic[JobSetCommand] = Topic(
    name="lockgate.jobset-commands.v1",
    model=JobSetCommand,
    key=lambda e: f"{e.queue}/{e.jobset}",  # one job set's commands stay in order
    consumers=("queue-store", "ungater"),
    why="cancel a job set: jobs end cancelled, pods deleted in every cluster, namespaces "
        "collected",
)
NAMESPACE_COMMANDS: Topic[NamespaceCommand] = Topic(
    name="lockgate.namespace-commands.v1",
    model=NamespaceCommand,
    key=lambda e: f"{e.cluster}/{e.name}",
    consumers=("queue-store",),
    why="operators' requests to collect an ephemeral namespace (lockgate namespace delete)",
)
DEAD_LETTERS: Topic[DeadLetter] = Topic(
    name="lockgate.dead-letter.v1",
    model=DeadLetter,
    key=_dead_letter_key,
    consumers=(),
    why="malformed or unprocessable messages, kept with their reason for an operator",
)

ALL_TOPICS: tuple[Topic[PodEvent] | Topic[ClusterSnapshot] | Topic[ClusterCapacity]
                  | Topic[ClusterGrowth]
                  | Topic[ReleaseCommand] | Topic[ReleaseOutcome] | Topic[PodNotice]
                  | Topic[JobSetCommand] | Topic[NamespaceCommand]
                  | Topic[DeadLetter], ...] = (
    POD_EVENTS,
    CLUSTER_SNAPSHOTS,
    CLUSTER_CAPACITY,
    CLUSTER_GROWTH,
    RELEASE_COMMANDS,
    RELEASE_OUTCOMES,
    POD_NOTICES,
    JOBSET_COMMANDS,
    NAMESPACE_COMMANDS,
    DEAD_LETTERS,
)
