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

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from lockgate.jobs import JobState


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


class ClusterSnapshot(Event):
    """Sent after cluster-watcher (re)listed a cluster: every managed, unfinished pod it saw.

    queue-store marks as deleted the unfinished jobs of this cluster that are not listed and were
    created before `listed_at`: they vanished while nobody was watching.
    """

    v: Literal[1] = 1
    snapshot_id: str
    cluster: str
    listed_at: datetime
    pod_uids: list[str]


class NodeCapacity(Event):
    name: str
    allocatable: dict[str, int]  # canonical units
    schedulable: bool = True
    # Requests of pods lockgate does not manage that are bound to this node.
    unmanaged_usage: dict[str, int] = Field(default_factory=dict)


class ClusterCapacity(Event):
    """The whole capacity picture of one cluster; the newest `observed_at` wins."""

    v: Literal[1] = 1
    cluster: str
    observed_at: datetime
    nodes: list[NodeCapacity]


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


class DeadLetter(Event):
    """A message a consumer could not process, with why, so nothing is lost silently."""

    v: Literal[1] = 1
    source_topic: str
    partition: int
    offset: int
    key: str | None
    value: str  # the original bytes, decoded as UTF-8 with replacement
    reason: str
    consumer: str
    at: datetime


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
DEAD_LETTERS: Topic[DeadLetter] = Topic(
    name="lockgate.dead-letter.v1",
    model=DeadLetter,
    key=lambda e: e.key or "",
    consumers=(),
    why="malformed or unprocessable messages, kept with their reason for an operator",
)

ALL_TOPICS: tuple[Topic[PodEvent] | Topic[ClusterSnapshot] | Topic[ClusterCapacity]
                  | Topic[ReleaseCommand] | Topic[ReleaseOutcome] | Topic[DeadLetter], ...] = (
    POD_EVENTS,
    CLUSTER_SNAPSHOTS,
    CLUSTER_CAPACITY,
    RELEASE_COMMANDS,
    RELEASE_OUTCOMES,
    DEAD_LETTERS,
)
