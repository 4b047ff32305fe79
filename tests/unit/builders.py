"""Builders that make scheduling tests read like sentences.

    a_job(queue="a").in_cluster("cluster-a").requesting(cpu="1", memory="1Gi").build()
    a_queue("b").with_priority_factor(0.5).limited_to(cpu="4").build()
    a_node(cpu="4", memory="16Gi").with_unmanaged_usage(cpu="1").build()

Builders are immutable: every call returns a new builder, so one can serve as a template. Jobs
built without a name get a fresh id and a creation time later than every job built before them,
so "built first" means "older".
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from lockgate.jobs import JobState
from lockgate.queues import QueueSpec
from lockgate.resources import Resources
from lockgate.scheduler import NodeInfo, RoundResult, SchedJob, SchedulerState

_sequence = itertools.count(1)
_BASE_TIME = 1_700_000_000.0


@dataclass(frozen=True)
class JobBuilder:
    queue: str
    cluster: str = "cluster-a"
    requests: Mapping[str, str | int] = field(default_factory=lambda: {"cpu": "1"})
    priority: int = 0
    created: float | None = None
    state: JobState = JobState.QUEUED
    node: str | None = None
    job_id: str | None = None
    group: str | None = None
    group_size: int = 0
    group_max_size: int = 0
    is_preemptible: bool = False
    priority_class: str = ""
    controller: str = ""
    namespace: str = "default"
    name: str | None = None  # None: its uid (its job id's, after the cluster)

    def controlled_by(self, uid: str) -> JobBuilder:
        """Owned by the controller (ReplicaSet, Job...) with this uid."""
        return replace(self, controller=uid)

    def in_group(self, name: str, size: int) -> JobBuilder:
        """A member of pod group `name` (per namespace: "<namespace>/<name>") of `size` pods."""
        return replace(self, group=name, group_size=size)

    def in_elastic_group(self, name: str, *, min_size: int, max_size: int) -> JobBuilder:
        """A member of elastic pod group `name`: `min_size` released together, then one at a
        time up to `max_size`."""
        return replace(self, group=name, group_size=min_size, group_max_size=max_size)

    def preemptible(self) -> JobBuilder:
        return replace(self, is_preemptible=True)

    def with_priority_class(self, name: str) -> JobBuilder:
        return replace(self, priority_class=name)

    def in_cluster(self, cluster: str) -> JobBuilder:
        return replace(self, cluster=cluster)

    def requesting(self, **quantities: str | int) -> JobBuilder:
        """Kubernetes quantities by resource name; use `requesting_resources` for odd names."""
        return replace(self, requests=dict(quantities))

    def requesting_resources(self, quantities: Mapping[str, str | int]) -> JobBuilder:
        return replace(self, requests=dict(quantities))

    def with_priority(self, priority: int) -> JobBuilder:
        return replace(self, priority=priority)

    def created_at(self, seconds_after_start: float) -> JobBuilder:
        return replace(self, created=_BASE_TIME + seconds_after_start)

    def named(self, job_id: str) -> JobBuilder:
        return replace(self, job_id=job_id)

    def of_pod(self, namespace: str, name: str) -> JobBuilder:
        """Its pod's namespace and name."""
        return replace(self, namespace=namespace, name=name)

    def in_state(self, state: JobState) -> JobBuilder:
        return replace(self, state=state)

    def released(self) -> JobBuilder:
        return replace(self, state=JobState.RELEASED, node=None)

    def running_on(self, node: str) -> JobBuilder:
        return replace(self, state=JobState.RUNNING, node=node)

    def build(self) -> SchedJob:
        number = next(_sequence)
        job_id = self.job_id or f"{self.cluster}/job-{number}"
        return SchedJob(
            job_id=job_id,
            queue=self.queue,
            cluster=self.cluster,
            requests=Resources.from_kubernetes(self.requests),
            priority=self.priority,
            created_at=self.created if self.created is not None else _BASE_TIME + number,
            state=self.state,
            node_name=self.node,
            group=self.group,
            group_size=self.group_size,
            group_max_size=self.group_max_size,
            preemptible=self.is_preemptible,
            priority_class=self.priority_class,
            controlled=bool(self.controller),
            controller=self.controller,
            namespace=self.namespace,
            name=self.name if self.name is not None else job_id.rpartition("/")[2],
        )

    def times(self, count: int) -> list[SchedJob]:
        """`count` jobs like this one, each with its own id, oldest first."""
        return [self.build() for _ in range(count)]


def a_job(queue: str = "a") -> JobBuilder:
    return JobBuilder(queue=queue)


@dataclass(frozen=True)
class QueueBuilder:
    name: str
    priority_factor: float = 1.0
    is_cordoned: bool = False
    limits: Mapping[str, str] = field(default_factory=dict)

    def with_priority_factor(self, factor: float) -> QueueBuilder:
        return replace(self, priority_factor=factor)

    def with_weight(self, weight: float) -> QueueBuilder:
        return replace(self, priority_factor=1.0 / weight)

    def cordoned(self) -> QueueBuilder:
        return replace(self, is_cordoned=True)

    def limited_to(self, **quantities: str) -> QueueBuilder:
        return replace(self, limits=dict(quantities))

    def build(self) -> QueueSpec:
        return QueueSpec(
            name=self.name,
            priority_factor=self.priority_factor,
            cordoned=self.is_cordoned,
            resource_limits=dict(self.limits),
        )


def a_queue(name: str) -> QueueBuilder:
    return QueueBuilder(name=name)


@dataclass(frozen=True)
class NodeBuilder:
    allocatable: Mapping[str, str | int]
    unmanaged: Mapping[str, str | int] = field(default_factory=dict)
    is_schedulable: bool = True

    def with_unmanaged_usage(self, **quantities: str | int) -> NodeBuilder:
        return replace(self, unmanaged=dict(quantities))

    def unschedulable(self) -> NodeBuilder:
        return replace(self, is_schedulable=False)

    def build(self) -> NodeInfo:
        return NodeInfo(
            allocatable=Resources.from_kubernetes(self.allocatable),
            unmanaged_usage=Resources.from_kubernetes(self.unmanaged),
            schedulable=self.is_schedulable,
        )

    def times(self, count: int, *, prefix: str = "node") -> dict[str, NodeInfo]:
        """`count` such nodes named node-1, node-2, ..."""
        return {f"{prefix}-{i}": self.build() for i in range(1, count + 1)}


def a_node(**allocatable: str | int) -> NodeBuilder:
    return NodeBuilder(allocatable=dict(allocatable))


@dataclass(frozen=True)
class StateBuilder:
    queues: tuple[QueueSpec, ...] = ()
    clusters: tuple[tuple[str, Mapping[str, NodeInfo]], ...] = ()
    jobs: tuple[SchedJob, ...] = ()

    def with_queues(self, *queues: QueueBuilder | str) -> StateBuilder:
        specs = tuple(a_queue(q).build() if isinstance(q, str) else q.build() for q in queues)
        return replace(self, queues=self.queues + specs)

    def with_cluster(self, name: str, nodes: Mapping[str, NodeInfo]) -> StateBuilder:
        return replace(self, clusters=(*self.clusters, (name, nodes)))

    def with_jobs(self, *jobs: SchedJob | JobBuilder | Iterable[SchedJob]) -> StateBuilder:
        built: list[SchedJob] = []
        for job in jobs:
            if isinstance(job, SchedJob):
                built.append(job)
            elif isinstance(job, JobBuilder):
                built.append(job.build())
            else:
                built.extend(job)
        return replace(self, jobs=self.jobs + tuple(built))

    def build(self) -> SchedulerState:
        state = SchedulerState()
        for spec in self.queues:
            state.upsert_queue(spec)
        for name, nodes in self.clusters:
            state.set_cluster(name, nodes)
        for job in self.jobs:
            state.upsert_job(job)
        return state


def a_state() -> StateBuilder:
    return StateBuilder()


def released_per_queue(result: RoundResult) -> dict[str, int]:
    counts: dict[str, int] = {}
    for decision in result.decisions:
        counts[decision.queue] = counts.get(decision.queue, 0) + 1
    return counts


def released_ids(result: RoundResult) -> list[str]:
    return [decision.job_id for decision in result.decisions]
