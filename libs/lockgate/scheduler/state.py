"""The scheduler's in-memory picture of queues, clusters and jobs, kept current change by change.

Why it exists: a scheduling round must decide within a fraction of a second over a million queued
jobs, so it cannot rebuild anything per round. `SchedulerState` is fed every change as it happens
(a queue defined, a node's capacity observed, a job's state moved) and keeps, in O(log n) per
change, exactly what a round needs: per queue and cluster a heap of its pending jobs in release
order; per queue its allocation and demand; per cluster its nodes and what managed jobs hold,
and, where an autoscaler may add nodes, those nodes that may exist (`set_growth`,
`lockgate.growth`: virtual nodes, one node model with the real ones).

Its concerns live in their own modules, each with a public interface, and the state composes
them: `records` (what a job is: interned shapes and kinds), `pending` (a queue's heap per
cluster, changed only through its methods), `room_caches` (a cluster's nodes and the room
rounds copy) and `target_inputs` (the fair targets' inputs, kept change by change, and the
targets). What is left here is the bookkeeping that ties them: every change of a job applied to
each, in step.

It mirrors what it is told and judges nothing: callers fold events through
`lockgate.jobs.advance` first. The rest of the package (`round`, `room`, `preemption`,
`explain`) reads the records below (`JobRecord`, `QueueRecord`, `ClusterRecord`, ...) through
the state's read-only views (`job_records`, `queue_records`, `cluster_records`, and
`bound_jobs`: the jobs bound to each node of a cluster, an index kept with the allocation);
only the round changes them, through its transaction (`begin_round`, `RoundTransaction`) and
`park`.
`lockgate.scheduler.invariants` checks that every aggregate agrees with the records.

Internally, resource vectors are dense lists of ints indexed by an axis number assigned to each
resource name on first sight (the axes only ever grow), and a job's requests are interned into a
shared `Shape` holding the nonzero (axis, amount) pairs, because a million jobs typically share
a handful of request shapes and the hot loops stay on small tuples. For the same reason a job's
record is only its heap entry and an interned `JobKind` (queue, cluster, shape, state, flags...):
per queued job the state keeps its id, its time in line, one entry and one two-slot record.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from lockgate.backoff import ControllerBackoff, ControllerKey
from lockgate.events import ClusterGrowth
from lockgate.growth import (
    NODE_POOL_LABEL,
    GrowthPlan,
    GrowthPolicy,
    is_virtual,
    plan_growth,
)
from lockgate.jobs import JobKey, JobState
from lockgate.max_queued import JobSetMaxQueued
from lockgate.node_groups import in_a_group, node_groups_growth
from lockgate.placement import NodeTraits, PodPlacement
from lockgate.queue_tree import (
    QueueTree,
    QueueTreeError,
    in_operator_units,
    scheduling_tree,
)
from lockgate.queues import QueueSpec
from lockgate.resources import Resources
from lockgate.scheduler.groups import GroupIndex, GroupKey
from lockgate.scheduler.holds import RoomHolds
from lockgate.scheduler.pending import PendingJobs, unique
from lockgate.scheduler.records import (
    HeapEntry,
    JobKind,
    JobRecord,
    Shape,
    add_pairs,
    placement_key,
    subtract_pairs,
)
from lockgate.scheduler.room_caches import (
    ClusterRecord,
    NodeClass,
    NodeInfo,
    NodeRecord,
    fits_node_class,
)
from lockgate.scheduler.target_inputs import (
    Inputs,
    TargetCluster,
    TargetInputs,
    TargetsKey,
    TargetSlot,
)
from lockgate.scheduler.targets import (
    Demand,
    FairTargets,
    NodeGroup,
    TargetProblem,
)

_QUEUED = JobState.QUEUED
_RELEASED = JobState.RELEASED

# How many request objects `_intern` remembers by identity before starting over.
_SHAPE_OBJECT_CACHE = 1024

# What fair shares are computed over by default, as Armada does: a resource nobody schedules by
# (ephemeral-storage, hugepages, pods) must never become a queue's dominant one by accident.
DEFAULT_FAIRNESS_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


@dataclass(frozen=True, slots=True)
class SchedJob:
    """One job (pod) as the scheduler sees it.

    A QUEUED job is pending. A job whose state holds capacity (released, ungated, bound, running)
    counts towards its queue's allocation and uses room in its cluster: on `node_name` once it
    is bound there, before that wherever a round can fit it (see `lockgate.scheduler.room`). A node
    the state does not know offers no room, so jobs bound to it take none from other nodes.
    Terminal jobs are dropped.
    """

    job_id: str
    queue: str
    cluster: str
    requests: Resources
    priority: int = 0
    # Epoch seconds: when it took its place in line, what its queue orders by and its maximum
    # time queued counts from; the pod's creation, or that of the deleted pod whose place it
    # kept (lockgate.places).
    created_at: float = 0.0
    state: JobState = JobState.QUEUED
    node_name: str | None = None
    # The pod's node filters (None: it carries none); jobs with other filters never share a
    # `Shape`, so everything a round caches per shape is per (requests, placement).
    placement: PodPlacement | None = None
    # Read by the leader only (lockgate.unplaceable): kube-scheduler reports the pod
    # Unschedulable since then (epoch seconds), whether a controller owns it, and whether the
    # leader already gave up on it (then it is not in the state while unbound).
    unschedulable_since: float | None = None
    unschedulable_message: str = ""
    controlled: bool = False
    unplaceable: bool = False
    # A pod group (lockgate.groups): "<namespace>/<name>", how many members are released
    # together (a static group's size, an elastic group's minimum), and an elastic group's
    # maximum (0: static, the maximum is its size).
    group: str | None = None
    group_size: int = 0
    group_max_size: int = 0
    # May be evicted to give a queue below its fair share its room (lockgate.scheduler.preemption):
    # the pod's lockgate.io/preemptible label, or a priority class configured as preemptible.
    preemptible: bool = False
    priority_class: str = ""
    # Its job set's own maximum time queued (lockgate.max_queued); the stricter of it and its
    # queue's ends the pod (lockgate.scheduler.waiting).
    max_queued: JobSetMaxQueued | None = None
    # The uid of its controlling ownerReference ("": none, or not reported): while that
    # controller backs off (lockgate.backoff), the job waits out of its queue's line.
    controller: str = ""
    # Its pod's namespace and name ("": not known, as in tests and the simulator), which the
    # state keeps (`SchedulerState.job_key`): what the leader tells a pod needs no second read.
    namespace: str = ""
    name: str = ""

    @property
    def key(self) -> JobKey:
        """Who the job is (`lockgate.jobs.JobKey`)."""
        return JobKey.from_id(self.job_id, namespace=self.namespace, name=self.name)


@dataclass(frozen=True, slots=True)
class GrowthRelease:
    """A pod released for growth (onto a virtual node, `lockgate.growth`), until it binds.

    The state keeps it so that the round can pace waves (`wave`: the growth picture's marker
    when it was released, and the round that did) and see growth stall (`at`)."""

    cluster: str
    pool: str
    node: str  # the virtual node it is charged to
    claim: str  # the NodeClaim that node is, when in flight ("": headroom)
    at: float | None  # the round's clock when it was released (None: no clock)
    round: int
    marker: object


@dataclass(frozen=True, slots=True)
class GrowthGathering:
    """A cluster whose releases for growth are held until they fill a node of its pool
    (`GrowthPolicy.gather_seconds`): since when (the round's clock), and why, in words."""

    since: float
    words: str


@dataclass(frozen=True, slots=True)
class QueueUsage:
    """A queue's aggregates, as the state holds them right now."""

    queued_jobs: int
    unschedulable_jobs: int  # queued, but too big for every node of their cluster (parked)
    allocated_jobs: int
    allocation: Resources
    pending_requests: Resources  # sum of requests of queued jobs that are not unschedulable
    backing_off_jobs: int = 0  # queued, held while their controller backs off


# How many kinds a state remembers before starting over (a cache: equal kinds need not be one
# object, sharing them only saves memory).
_KIND_CACHE = 1 << 16


class QueueRecord:
    __slots__ = (
        "alloc_changes",
        "alloc_in",
        "alloc_shapes",
        "allocated",
        "allocation",
        "demand",
        "held",
        "limit_pairs",
        "name",
        "parked",
        "pending",
        "priority_factor",
        "queued",
        "shares_in_cache",
        "spec",
    )

    def __init__(self, name: str, axes: int) -> None:
        self.name = name
        self.spec: QueueSpec | None = None  # None: jobs name a queue nobody defined (yet)
        self.priority_factor = 1.0  # cost = share * priority_factor, i.e. share / weight
        self.limit_pairs: tuple[tuple[int, int], ...] = ()
        self.pending: dict[str, PendingJobs] = {}  # by cluster
        self.queued = 0  # queued jobs, parked and held included
        self.parked = 0
        self.held = 0  # queued jobs held while their controller backs off
        self.demand = [0] * axes  # requests of queued, unparked jobs
        self.allocated = 0
        self.allocation = [0] * axes  # requests of jobs holding capacity
        # The same per cluster, and how many jobs of each shape hold it there (fair targets).
        self.alloc_in: dict[str, list[int]] = {}
        self.alloc_shapes: dict[str, dict[Shape, int]] = {}
        # Changes to `alloc_in` so far, and what `costs.shares_in` last worked out of it (the
        # count it was worked out at, the pool's inverse, the shares): kept here for costs.
        self.alloc_changes = 0
        self.shares_in_cache: tuple[int, list[float], Mapping[str, float]] | None = None

    @property
    def weight(self) -> float:
        return 1.0 / self.priority_factor

    @property
    def schedulable(self) -> bool:
        return self.spec is not None and not self.spec.cordoned

    def is_empty(self) -> bool:
        return self.queued == 0 and self.allocated == 0

    def pending_in(self, cluster: str) -> PendingJobs:
        pending = self.pending.get(cluster)
        if pending is None:
            pending = self.pending[cluster] = PendingJobs(cluster)
        return pending


class SchedulerState:
    """Queues, cluster capacity and jobs, each change applied incrementally in O(log n).

    `lockgate.scheduler.round.schedule_round` reads it and applies its own decisions to it (as
    RELEASED), through a transaction (`begin_round`).
    """

    def __init__(self, fairness_resources: Iterable[str] = DEFAULT_FAIRNESS_RESOURCES) -> None:
        self._fairness_resources = frozenset(fairness_resources)
        self._axes: dict[str, int] = {}
        self._axis_names: list[str] = []
        self._shapes: dict[tuple[frozenset[tuple[str, int]], PodPlacement | None], Shape] = {}
        self._shape_of_object: dict[
            tuple[int, int], tuple[Resources, PodPlacement | None, Shape]] = {}
        self._jobs: dict[str, JobRecord] = {}
        self._kinds: dict[tuple[object, ...], JobKind] = {}
        self._queues: dict[str, QueueRecord] = {}
        self._clusters: dict[str, ClusterRecord] = {}
        # The jobs bound to a node, per cluster and node (`bound_jobs`): kept where their
        # allocation is added and taken away (`_apply`, `_retract`), so a reader of the running
        # pods (preemption's plan) reads them without a pass over every job, most of them queued.
        self._bound: dict[str, dict[str, dict[str, JobRecord]]] = {}
        self._pool_total: list[int] = []
        self._groups = GroupIndex()
        # Controllers backing off (lockgate.backoff), and every queued job with a controller,
        # so a hold or its end moves exactly that controller's jobs.
        self._holds: dict[ControllerKey, ControllerBackoff] = {}
        self._queued_by_controller: dict[ControllerKey, set[str]] = {}
        # Room held for pods of queues below their fair target (lockgate.scheduler.holds).
        self._room_holds = RoomHolds()
        # Per autoscaled cluster, its autoscaler's last picture (`set_growth`), the plan made
        # from it (`lockgate.growth.plan_growth`: headroom and virtual nodes), the policy, and
        # the pods released for growth that are not bound yet.
        self._growth: dict[str, ClusterGrowth] = {}
        self._growth_plans: dict[str, GrowthPlan] = {}
        self._growth_policy = GrowthPolicy()
        self._growth_releases: dict[str, GrowthRelease] = {}
        # Per autoscaled cluster whose pods owed room are held to fill a node of its pool
        # (`lockgate.scheduler.round`, "gathering"): since when, and the words that say so.
        self.growth_gathering: dict[str, GrowthGathering] = {}
        self._rounds_begun = 0
        # The round's transaction while one is open (`begin_round`).
        self._transaction: RoundTransaction | None = None
        # The queue tree (`refresh_queue_tree`): whether a definition changed since it was
        # built, the tree (None: today's flat path), and why the definitions are not a tree.
        self._queue_tree_stale = False
        # Counts the changes of definitions a tree is made of (`tree_shape_version`).
        self._tree_shape_version = 0
        self._queue_tree: QueueTree | None = None
        self._queue_tree_error: str | None = None
        # The fair targets' inputs, kept change by change, and the targets last computed.
        self._targets = TargetInputs(clusters=self._clusters, axis_names=self._axis_names,
                                     weights_now=self._weights_now, pool=self._target_pool)
        # Told of every job's change (`_apply`, `_retract`): bound once, as they are hot.
        self._slot_add = self._targets.slot_add
        self._slot_remove = self._targets.slot_remove

    # ---- queues ----------------------------------------------------------------------------

    def upsert_queue(self, spec: QueueSpec) -> None:
        queue = self._queue(spec.name)
        if queue.spec is not spec and queue.spec != spec:
            self._targets.queues_changed()
            old = queue.spec
            if old is None or (old.parent, old.guarantee, old.resource_limits, old.weight) != (
                    spec.parent, spec.guarantee, spec.resource_limits, spec.weight):
                self._queue_tree_stale = True
                self._tree_shape_version += 1
        queue.spec = spec
        queue.priority_factor = spec.priority_factor
        queue.limit_pairs = tuple(
            (self._axis(name), amount) for name, amount in sorted(spec.limits.items())
        )

    def remove_queue(self, name: str) -> None:
        """Forget a queue's definition. Its jobs stay, unscheduled, until it is defined again."""
        queue = self._queues.get(name)
        if queue is None:
            return
        if queue.spec is not None:
            self._targets.queues_changed()
            self._queue_tree_stale = True
            self._tree_shape_version += 1
        queue.spec = None
        queue.priority_factor = 1.0
        queue.limit_pairs = ()
        if queue.is_empty():
            self._forget_queue(queue)

    def queue_names(self) -> list[str]:
        return sorted(self._queues)

    def queue_spec(self, name: str) -> QueueSpec | None:
        queue = self._queues.get(name)
        return None if queue is None else queue.spec

    def queue_usage(self, name: str) -> QueueUsage:
        queue = self._queues.get(name)
        if queue is None:
            return QueueUsage(0, 0, 0, Resources(), Resources())
        return QueueUsage(
            queued_jobs=queue.queued,
            unschedulable_jobs=queue.parked,
            allocated_jobs=queue.allocated,
            allocation=self._resources(queue.allocation),
            pending_requests=self._resources(queue.demand),
            backing_off_jobs=queue.held,
        )

    # ---- clusters --------------------------------------------------------------------------

    def set_cluster(self, cluster: str, nodes: Mapping[str, NodeInfo]) -> None:
        """Replace what is known of a cluster's nodes; unchanged nodes cost one comparison."""
        state = self._cluster(cluster)
        for name in [name for name in state.nodes if name not in nodes and not is_virtual(name)]:
            self._set_node(cluster, name, None)
        for name, info in nodes.items():
            self._set_node(cluster, name, self._real(name, info))
        if cluster in self._growth or self._has_node_groups(cluster):
            self._plan_growth(cluster)

    def _has_node_groups(self, cluster: str) -> bool:
        return any(group.cluster == cluster for group in self._growth_policy.node_groups)

    def set_node(self, cluster: str, name: str, info: NodeInfo | None) -> None:
        """Add, update or (with None) remove one node."""
        old = self._clusters.get(cluster)
        old_node = None if old is None else old.nodes.get(name)
        self._set_node(cluster, name, self._real(name, info))
        picture = self._growth.get(cluster)
        if picture is not None and (
                any(claim.node_name == name for claim in picture.node_claims)
                or NODE_POOL_LABEL in (info.labels if info is not None else {})
                or (old_node is not None and NODE_POOL_LABEL in old_node.info.labels)):
            # A claim's node arrived (it is no longer a virtual node), or a node of a pool
            # whose size may be read from its nodes changed.
            self._plan_growth(cluster)
        elif (picture is None or not picture.autoscaled) and self._has_node_groups(cluster) and any(
                in_a_group(cluster, self._growth_policy.node_groups, node.labels)
                for node in (info, None if old_node is None else old_node.info)
                if node is not None):
            # A node group's size is its nodes: one came, went or changed.
            self._plan_growth(cluster)

    @staticmethod
    def _real(name: str, info: NodeInfo | None) -> NodeInfo | None:
        if is_virtual(name):
            raise ValueError(f"node name {name!r} is reserved for nodes that may exist "
                             "(lockgate.growth)")
        return info

    def _set_node(self, cluster: str, name: str, info: NodeInfo | None) -> None:
        state = self._cluster(cluster)
        old = state.nodes.get(name)
        if old is not None and old.info == info:
            return
        state.version += 1
        self._targets.note_change()
        old_class = None
        if old is not None and old.info.schedulable:
            old_class = (tuple(old.allocatable), old.traits)
        if old is not None:
            del state.nodes[name]
            if old.info.schedulable:
                state.fits_no_node.clear()
                state.order.remove(name)
                _subtract_into(state.total, old.allocatable)
                if old.info.in_pool:
                    _subtract_into(self._pool_total, old.allocatable)
                size = (tuple(old.allocatable), old.traits)
                state.node_sizes[size] -= 1
                if state.node_sizes[size] == 0:
                    del state.node_sizes[size]
        if info is None:
            return
        for resource in (*info.allocatable, *info.unmanaged_usage):
            self._axis(resource)  # every axis first: a new one would leave a vector short
        node = NodeRecord(info, self._dense(info.allocatable), self._dense(info.unmanaged_usage),
                          NodeTraits(name, info.labels, info.taints),
                          state.used_by_node.get(name))
        state.nodes[name] = node
        if info.schedulable:
            state.fits_no_node.clear()
            bisect.insort(state.order, name)
            _add_into(state.total, node.allocatable)
            if info.in_pool:
                _add_into(self._pool_total, node.allocatable)
            size = (tuple(node.allocatable), node.traits)
            state.node_sizes[size] = state.node_sizes.get(size, 0) + 1
            # Only a class new to the cluster may let a parked job in: a node whose usage alone
            # changed (every node is a class of its own, its name being a trait) may not.
            if state.node_sizes[size] == 1 and size != old_class:
                self._unpark(cluster, size)

    def set_growth(self, cluster: str, growth: ClusterGrowth | None) -> None:
        """Replace what the cluster's autoscaler may still add (None: forget it).

        A picture older than the one kept is ignored (the newest `observed_at` wins, as on the
        topic); an equal one costs one comparison. A change counts as a change of the cluster's
        nodes (its `version`, the fair targets' inputs): what a cluster may grow by is capacity
        its fair targets are over.
        """
        if growth is not None and growth.cluster != cluster:
            raise ValueError(
                f"growth of cluster {growth.cluster!r} given as that of {cluster!r}")
        old = self._growth.get(cluster)
        if growth is None:
            if old is None:
                return
            del self._growth[cluster]
        else:
            if old is not None and (old == growth or growth.observed_at < old.observed_at):
                return
            self._growth[cluster] = growth
        self._plan_growth(cluster)

    def set_growth_policy(self, policy: GrowthPolicy) -> None:
        """How clusters grow (`lockgate.growth.GrowthPolicy`); every plan is made again."""
        if policy == self._growth_policy:
            return
        self._growth_policy = policy
        stated = {group.cluster for group in policy.node_groups}
        for cluster in sorted(set(self._growth) | stated | set(self._growth_plans)):
            self._plan_growth(cluster)

    @property
    def growth_policy(self) -> GrowthPolicy:
        return self._growth_policy

    def growth_plan(self, cluster: str) -> GrowthPlan | None:
        """The cluster's headroom and virtual nodes, as last planned (None: not autoscaled, or
        no picture yet)."""
        return self._growth_plans.get(cluster)

    @property
    def growth_releases(self) -> Mapping[str, GrowthRelease]:
        """The pods released for growth not bound yet, by job id (callers must not change
        it)."""
        return self._growth_releases

    @property
    def rounds_begun(self) -> int:
        """How many rounds' transactions were opened (`begin_round`): a round's number."""
        return self._rounds_begun

    def _plan_growth(self, cluster: str) -> None:
        """Make the cluster's growth plan again, and its virtual nodes agree with it: each is
        a schedulable node of the cluster, changed only when it changes (`set_node`)."""
        picture = self._growth.get(cluster)
        record = self._cluster(cluster)
        if picture is None or not picture.autoscaled:
            # No Karpenter there: the cluster-autoscaler's groups, if the operator stated any.
            picture = node_groups_growth(
                cluster, self._growth_policy.node_groups,
                [node.info.labels for name, node in record.nodes.items()
                 if not is_virtual(name)]) or picture
        # A cluster with no autoscaler has no plan: it grows by nothing, as before issue 35.
        plan = None if picture is None or not picture.autoscaled else plan_growth(
            picture, policy=self._growth_policy,
            largest_node_of=lambda pool: self._largest_node_of(record, pool),
            has_node=lambda name: name in record.nodes,
            pool_nodes=lambda pool: self._nodes_of_pool(record, pool))
        if plan is None:
            self._growth_plans.pop(cluster, None)
        else:
            self._growth_plans[cluster] = plan
        wanted = {} if plan is None else {
            node.name: NodeInfo(allocatable=Resources(dict(node.allocatable)),
                                labels=dict(node.labels), taints=node.taints)
            for node in plan.nodes}
        record.claim_nodes = {} if plan is None else {
            node.node_name: node.name for node in plan.nodes if node.node_name}
        for name in [name for name in record.nodes if is_virtual(name) and name not in wanted]:
            self._set_node(cluster, name, None)
        for name, info in wanted.items():
            self._set_node(cluster, name, info)

    @staticmethod
    def _nodes_of_pool(record: ClusterRecord, pool: str) -> dict[str, Mapping[str, int]]:
        return {name: node.info.allocatable for name, node in record.nodes.items()
                if not is_virtual(name) and node.info.labels.get(NODE_POOL_LABEL) == pool}

    def _largest_node_of(self, record: ClusterRecord, pool: str,
                         ) -> tuple[str, Mapping[str, int]] | None:
        best: tuple[tuple[int, ...], str, Mapping[str, int]] | None = None
        cpu, memory = self._axes.get("cpu"), self._axes.get("memory")
        for name, node in record.nodes.items():
            if is_virtual(name) or node.info.labels.get(NODE_POOL_LABEL) != pool:
                continue
            size = tuple(node.allocatable[axis] if axis is not None else 0
                         for axis in (cpu, memory))
            if best is None or (size, name) > (best[0], best[1]):
                best = (size, name, node.info.allocatable.as_dict())
        return None if best is None else (best[1], best[2])

    def growth(self, cluster: str) -> ClusterGrowth | None:
        """The cluster's autoscaler picture last set (`set_growth`), or None."""
        return self._growth.get(cluster)

    @property
    def growth_pictures(self) -> Mapping[str, ClusterGrowth]:
        """Every cluster's autoscaler picture, by cluster (callers must not change it)."""
        return self._growth

    def cluster_names(self) -> list[str]:
        return sorted(self._clusters)

    def fairness_inverse(self) -> list[float]:
        """Per axis, 1 / the pool's total of it; 0 for resources fair shares are not over."""
        names = self._axis_names
        fair = self._fairness_resources
        return [1.0 / amount if amount > 0 and names[axis] in fair else 0.0
                for axis, amount in enumerate(self._pool_total)]

    # ---- read-only views for the rest of the package (round, room, preemption, explain) ------

    @property
    def fairness_resources(self) -> frozenset[str]:
        return self._fairness_resources

    @property
    def job_records(self) -> Mapping[str, JobRecord]:
        return self._jobs

    @property
    def queue_records(self) -> Mapping[str, QueueRecord]:
        return self._queues

    @property
    def cluster_records(self) -> Mapping[str, ClusterRecord]:
        return self._clusters

    def bound_jobs(self, cluster: str) -> Mapping[str, Mapping[str, JobRecord]]:
        """The cluster's jobs that hold capacity on a node (released and bound to it: ungated,
        bound, running), per node and job id; its released jobs without a node yet are its
        `ClusterRecord.held_unbound`. Read-only: the state changes it as jobs change."""
        return self._bound.get(cluster, _NO_BOUND_JOBS)

    @property
    def axis_names(self) -> list[str]:
        """Resource names by axis (callers must not change it)."""
        return self._axis_names

    @property
    def pool_vector(self) -> list[int]:
        """The pool's total as a dense vector (callers must not change it)."""
        return self._pool_total

    @property
    def axes(self) -> Mapping[str, int]:
        """Each resource name's axis."""
        return self._axes

    @property
    def shapes(self) -> Mapping[tuple[frozenset[tuple[str, int]], PodPlacement | None], Shape]:
        """The interned request shapes, by (requests, placement)."""
        return self._shapes

    @property
    def holds(self) -> Mapping[ControllerKey, ControllerBackoff]:
        """The controllers backing off, whose queued jobs are held."""
        return self._holds

    @property
    def queued_by_controller(self) -> Mapping[ControllerKey, set[str]]:
        """Every queued job with a controller, by controller (callers must not change it)."""
        return self._queued_by_controller

    def groups(self) -> GroupIndex:
        """Pod groups with members still unfinished (lockgate.groups)."""
        return self._groups

    def room_holds(self) -> RoomHolds:
        """Room held for pods below their queue's fair target (lockgate.scheduler.holds)."""
        return self._room_holds

    def fair_targets(self, *, now: float | None = None, max_age: float = 0.0,
                     latest: bool = False, adopted_max_age: float | None = None,
                     ) -> FairTargets:
        """Every queue's constrained fair target (`TargetInputs.fair_targets`)."""
        return self._targets.fair_targets(now=now, max_age=max_age, latest=latest,
                                          adopted_max_age=adopted_max_age)

    @property
    def tree_shape_version(self) -> int:
        """Changes when a queue is defined or removed, or its parent, guarantee, limits or
        weight change: what a tree built from the definitions is made of."""
        return self._tree_shape_version

    def use_queue_tree(self, tree: QueueTree | None) -> None:
        """Divide the fair targets by a queue tree (`TargetInputs.use_queue_tree`)."""
        self._targets.use_queue_tree(tree)
        self._queue_tree = tree

    @property
    def queue_tree(self) -> QueueTree | None:
        """The tree the fair targets divide by (None: today's flat queues)."""
        return self._queue_tree

    def refresh_queue_tree(self) -> bool:
        """Rebuild the queue tree from the queue definitions if any changed since the last
        time (`lockgate.queue_tree.scheduling_tree`: None, today's path exactly, while every
        queue is a child of the root with no guarantee), and divide by it. Definitions that
        are not a tree (only possible by writing Postgres past the admin API, which refuses
        them) leave today's flat path in place and `queue_tree_problem` says why. Returns
        whether the tree changed."""
        if not self._queue_tree_stale:
            return False
        self._queue_tree_stale = False
        specs = [queue.spec for queue in self._queues.values() if queue.spec is not None]
        try:
            tree = scheduling_tree(specs)
            self._queue_tree_error = None
        except QueueTreeError as error:
            tree = None
            self._queue_tree_error = (f"the queue definitions are not a tree ({error}): the "
                                      f"fair targets divide by each queue's weight alone")
        previous = self._queue_tree
        self.use_queue_tree(tree)
        return tree is not previous

    def queue_tree_problem(self) -> str | None:
        """Why the queue tree cannot be honoured as defined, or None: the definitions are not
        a tree, or the guarantees of the root's children do not fit in the fleet as it is now
        (nodes come and go, so this is judged against the fleet of the moment)."""
        if self._queue_tree_error is not None:
            return self._queue_tree_error
        tree = self._queue_tree
        if tree is None:
            return None
        fleet = {name: float(amount) for name, amount
                 in zip(self._axis_names, self._pool_total, strict=False)}
        try:
            QueueTree.build([tree.node(name) for name in tree.names], fleet=fleet,
                            shown=in_operator_units)
        except QueueTreeError as error:
            return (f"{error}: the guarantees are served as far as the fleet allows, "
                    f"deepest first")
        return None

    def use_history_weights(self, weights: Mapping[str, float]) -> None:
        """Divide the fair targets by these effective weights from usage history
        (`TargetInputs.use_history_weights`; empty: the configured weights)."""
        self._targets.use_history_weights(weights)

    def dominant_shares(self) -> dict[str, float]:
        """Each queue's dominant share of the pool over what it holds now (for usage history:
        lockgate.scheduler.history), for the queues holding anything."""
        inverse = self.fairness_inverse()
        shares: dict[str, float] = {}
        for name, queue in self._queues.items():
            if queue.allocated:
                share = max((amount * inv for amount, inv
                             in zip(queue.allocation, inverse, strict=False)), default=0.0)
                if share > 0:
                    shares[name] = share
        return shares

    def dominant_share_of(self, requests: Mapping[str, int]) -> float:
        """The dominant share of the pool as it is now of `requests` (canonical units, by
        resource name; resources the pool lacks or fairness is not over count for nothing)."""
        inverse = self.fairness_inverse()
        axes = self._axes
        return max((amount * inverse[axes[name]] for name, amount in requests.items()
                    if name in axes and axes[name] < len(inverse)), default=0.0)

    def target_problem(self) -> tuple[TargetProblem, TargetsKey]:
        """The fair targets' inputs as one value to solve elsewhere
        (`TargetInputs.target_problem`)."""
        return self._targets.target_problem()

    def hand_over_targets(self, *, at: float, min_demands: int = 0,
                          ) -> tuple[TargetProblem, TargetsKey] | None:
        """What to solve elsewhere now, or None (`TargetInputs.hand_over_targets`)."""
        return self._targets.hand_over_targets(at=at, min_demands=min_demands)

    def adopt_targets(self, key: TargetsKey, targets: FairTargets, *, at: float) -> None:
        """Keep targets solved elsewhere (`TargetInputs.adopt_targets`)."""
        self._targets.adopt_targets(key, targets, at=at)

    def targets_current(self, key: TargetsKey) -> bool:
        """Whether the last targets were computed from the inputs `key` names."""
        return self._targets.targets_current(key)

    def target_inputs(self) -> Inputs:
        """The fair targets' inputs as kept (groups, weights, demands, structure, amounts)."""
        return self._targets.inputs()

    @property
    def target_clusters(self) -> Mapping[str, TargetCluster]:
        """The fair targets' bookkeeping per cluster (callers must not change it)."""
        return self._targets.target_clusters

    @property
    def target_slots(self) -> Mapping[tuple[str, str, int], TargetSlot]:
        """Every slot of `target_clusters`, by (queue, cluster, placement id)."""
        return self._targets.target_slots

    @property
    def placement_ids(self) -> Mapping[PodPlacement | None, int]:
        """Every placement seen, by its number (`Shape.placement_id`)."""
        return self._targets.placement_ids

    def _weights_now(self) -> tuple[dict[str, float], dict[str, bool]]:
        """The defined, non-empty queues' weights, and whether each is schedulable."""
        weight_of = self._targets.weight_of
        weights = {name: weight_of(name, queue.weight) for name, queue in self._queues.items()
                   if queue.spec is not None and not queue.is_empty()}
        return weights, {name: self._queues[name].schedulable for name in weights}

    def _target_pool(self) -> dict[str, float]:
        inverse = self.fairness_inverse()
        return {name: float(amount) for name, amount, inv
                in zip(self._axis_names, self._pool_total, inverse, strict=False) if inv > 0}

    def recount_target_inputs(self) -> Inputs:
        """`target_inputs` recounted from the queues' records, O(their shapes): what the
        bookkeeping must equal (for `lockgate.scheduler.invariants`, not for the hot path)."""
        names = self._axis_names
        weights: dict[str, float] = {}
        per_cluster: dict[str, dict[tuple[str, PodPlacement | None], list[list[int]]]] = {}
        axes = len(names)
        for name, queue in self._queues.items():
            if queue.spec is None or queue.is_empty():
                continue
            weights[name] = self._targets.weight_of(name, queue.weight)
            for cluster, counts in queue.alloc_shapes.items():
                slots = per_cluster.setdefault(cluster, {})
                for shape, count in counts.items():
                    slot = slots.setdefault((name, shape.placement), [[0] * axes, [0] * axes])
                    for axis, amount in shape.pairs:
                        slot[0][axis] += amount * count
                        slot[1][axis] += amount * count
            if not queue.schedulable:
                continue  # a cordoned queue asks only for what it holds
            for cluster, pending in queue.pending.items():
                slots = per_cluster.setdefault(cluster, {})
                for shape, count in pending.shapes.items():
                    slot = slots.setdefault((name, shape.placement), [[0] * axes, [0] * axes])
                    for axis, amount in shape.pairs:
                        slot[0][axis] += amount * count
        groups: list[NodeGroup] = []
        demands: list[Demand] = []
        structure: list[object] = [tuple(sorted(weights.items()))]
        amounts: list[object] = []
        for cluster_name in sorted(per_cluster):
            slots = per_cluster[cluster_name]
            placements = sorted({placement for _, placement in slots}, key=placement_key)
            cluster_groups, usable = self._targets.groups_for(cluster_name, placements)
            groups += cluster_groups
            structure.append((cluster_name, tuple((g.name, tuple(sorted(g.capacity.items())))
                                                  for g in cluster_groups)))
            for (queue_name, placement), slot in sorted(
                    slots.items(), key=lambda item: (item[0][0], placement_key(item[0][1]))):
                asked, held = slot
                structure.append((cluster_name, queue_name, placement_key(placement)))
                amounts.append((tuple(asked), tuple(held)))
                demands.append(Demand(
                    queue=queue_name, cluster=cluster_name,
                    amount={names[a]: float(v) for a, v in enumerate(asked) if v},
                    held={names[a]: float(v) for a, v in enumerate(held) if v},
                    groups=usable[placement]))
        return groups, weights, demands, tuple(structure), tuple(amounts)

    def pool_total(self) -> Resources:
        """Allocatable over the schedulable nodes of every cluster: what shares are shares of."""
        return self._resources(self._pool_total)

    # ---- jobs ------------------------------------------------------------------------------

    def upsert_job(self, job: SchedJob) -> None:
        """Record a job as it now is. Repeating an upsert is a no-op; terminal states remove it."""
        if job.state.is_terminal:
            self.remove_job(job.job_id)
            return
        if self._growth_releases and (job.node_name is not None or job.state is _QUEUED):
            self._growth_releases.pop(job.job_id, None)  # it bound (or queues again)
        shape = self._intern(job.requests, job.placement)
        old = self._jobs.get(job.job_id)
        if job.state is not _QUEUED:
            self._room_holds.end(job.job_id)
        controller = _controller_key(job)
        if old is not None:
            if job.name and not old.pod:  # a pod's name never changes; a row may bring it late
                old.pod = f"{job.namespace}/{job.name}"
            kind = old.kind
            if (
                kind.state is job.state
                and kind.shape is shape
                and kind.queue == job.queue
                and kind.cluster == job.cluster
                and old.entry[0] == -job.priority
                and old.entry[1] == job.created_at
                and kind.node_name == job.node_name
                and kind.group == job.group
                and kind.group_size == job.group_size
                and kind.group_max_size == job.group_max_size
                and kind.preemptible == job.preemptible
                and kind.priority_class == job.priority_class
                and kind.max_queued == job.max_queued
                and kind.controller == controller
            ):
                return
        shape.refs += 1
        if old is None:
            record = self._jobs[job.job_id] = JobRecord(
                (-job.priority, job.created_at, job.job_id),
                self._kind_of(job, shape, controller, parked=False),
                f"{job.namespace}/{job.name}" if job.name else "")
            self._apply(job.job_id, record, None)
            if record.kind.state is _QUEUED:
                self._push(record, job.job_id)
            return
        # A change: the record is updated in place (a new object per change would pile up in
        # the collector's oldest generation at a million jobs).
        kind = old.kind
        old_queue, old_cluster, old_shape = kind.queue, kind.cluster, kind.shape
        same_place = old.entry[0] == -job.priority and old.entry[1] == job.created_at
        entry_in_place = (
            kind.state is _QUEUED
            and job.state is _QUEUED
            and old_queue == job.queue
            and old_cluster == job.cluster
            and same_place
        )
        # A parked job's entry stays valid among the parked ones if its requests did not change.
        stays_parked = entry_in_place and kind.parked and old_shape is shape
        # A held job has no entry to keep.
        entry_in_place = entry_in_place and (not kind.parked or stays_parked) and not kind.held
        hint = self._retract(job.job_id, old)
        self._release_shape(old_shape)
        if not same_place:
            old.entry = (-job.priority, job.created_at, job.job_id)
        old.kind = self._kind_of(job, shape, controller, parked=stays_parked)
        self._apply(job.job_id, old, hint)
        if old.kind.state is _QUEUED and not entry_in_place:
            self._push(old, job.job_id)
        self._tidy(old_queue, old_cluster)

    def upsert_jobs(self, jobs: Iterable[SchedJob]) -> None:
        for job in jobs:
            self.upsert_job(job)

    def remove_job(self, job_id: str) -> None:
        self._room_holds.end(job_id)
        if self._growth_releases:
            self._growth_releases.pop(job_id, None)
        old = self._jobs.pop(job_id, None)
        if old is None:
            return
        self._retract(job_id, old)
        self._release_shape(old.shape)
        self._tidy(old.queue, old.cluster)

    def job(self, job_id: str) -> SchedJob | None:
        record = self._jobs.get(job_id)
        if record is None:
            return None
        namespace, _, name = record.pod.partition("/")
        return SchedJob(
            job_id=job_id,
            queue=record.queue,
            cluster=record.cluster,
            requests=record.shape.requests,
            priority=record.priority,
            created_at=record.created_at,
            state=record.state,
            node_name=record.node_name,
            placement=record.shape.placement,
            group=record.group,
            group_size=record.group_size,
            group_max_size=record.group_max_size,
            preemptible=record.preemptible,
            priority_class=record.priority_class,
            max_queued=record.max_queued,
            controller="" if record.controller is None else record.controller[1],
            namespace=namespace,
            name=name,
        )

    def job_key(self, job_id: str) -> JobKey | None:
        """Who a job the state holds is (None: it holds none, or does not know its pod)."""
        record = self._jobs.get(job_id)
        if record is None or not record.pod:
            return None
        namespace, _, name = record.pod.partition("/")
        return JobKey.from_id(job_id, namespace=namespace, name=name)

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    # ---- controllers backing off (lockgate.backoff) ----------------------------------------

    def hold_controller(self, backoff: ControllerBackoff) -> None:
        """The controller backs off: its queued jobs, and those queued later, wait out of their
        queues' lines (not released, not demand) until `release_controller`. O(its jobs)."""
        key = backoff.key
        held = key in self._holds
        self._holds[key] = backoff  # the newest record, for what explain says
        if not held:
            self._move_controller_jobs(key)

    def release_controller(self, key: ControllerKey) -> None:
        """The controller's back-off ended (or was reset): its jobs queue again."""
        if self._holds.pop(key, None) is not None:
            self._move_controller_jobs(key)

    def controller_hold(self, job_id: str) -> ControllerBackoff | None:
        """The back-off a queued job waits out, if it is held."""
        record = self._jobs.get(job_id)
        if record is None or not record.held or record.controller is None:
            return None
        return self._holds.get(record.controller)

    def held_controllers(self) -> list[ControllerBackoff]:
        return list(self._holds.values())

    def _move_controller_jobs(self, key: ControllerKey) -> None:
        """Re-apply a controller's queued jobs after its hold changed: `_apply` decides from
        `_holds` whether each is held."""
        for job_id in sorted(self._queued_by_controller.get(key, ())):
            record = self._jobs[job_id]
            self._retract(job_id, record)
            record.kind = self._vary(record.kind, parked=False)  # judged again by _push
            self._apply(job_id, record, None)
            self._push(record, job_id)
            self._tidy(record.queue, record.cluster)

    # ---- for the round (lockgate.scheduler.round) --------------------------------------------

    def begin_round(self) -> RoundTransaction:
        """Open the transaction a round works through (`RoundTransaction`); one at a time."""
        if self._transaction is not None:
            raise RuntimeError("a round's transaction is open already: commit it first")
        self._transaction = RoundTransaction(self)
        self._rounds_begun += 1
        return self._transaction

    def _mark_released(self, job_id: str, record: JobRecord, node_hint: str | None) -> JobKind:
        """The round decided to release this queued job: it now holds capacity. Returns the
        kind it had (queued), for the transaction to take the release back."""
        before = record.kind
        self._retract(job_id, record)
        record.kind = self._vary(before, released=True)
        self._apply(job_id, record, node_hint)
        return before

    def _take_back(self, job_id: str, record: JobRecord, before: JobKind) -> None:
        """A release the round decided and the caller did not record: the job queues again
        exactly as it was (the same kind, the same place in line)."""
        self._retract(job_id, record)
        record.kind = before
        self._apply(job_id, record, None)
        if record.kind.state is _QUEUED:
            self._push(record, job_id)
        self._tidy(before.queue, before.cluster)

    def _closed(self, transaction: RoundTransaction) -> None:
        if self._transaction is transaction:
            self._transaction = None

    def park(self, queue: QueueRecord, pending: PendingJobs, record: JobRecord,
             entry: HeapEntry) -> None:
        """Set aside a queued job that fits no node of its cluster (its entry already popped)."""
        pending.forget_head(record.entry)
        record.kind = self._vary(record.kind, parked=True)
        queue.parked += 1
        pending.parked += 1
        subtract_pairs(queue.demand, record.shape.pairs)
        self._forget_shape(pending, record.shape)
        self._slot_remove(queue.name, pending.cluster, record.shape, False)
        if pending.park(entry):
            pending.compact_parked(functools.partial(self._is_parked_entry, queue, pending))

    # ---- internals -------------------------------------------------------------------------

    def _push(self, record: JobRecord, job_id: str) -> None:
        kind = record.kind
        if kind.held:
            return  # out of the line until its controller's back-off ends
        queue = self._queues[kind.queue]
        pending = queue.pending[kind.cluster]
        entry = record.entry  # the job's one entry, shared by its record and its heap
        if not kind.parked and self._fits_no_node(kind.cluster, kind.shape):
            # Parked at once, wherever it would sit in its queue: a round may set a full
            # cluster aside without reaching it, and it must neither pass for waiting nor swell
            # its queue's demand.
            self.park(queue, pending, record, entry)
            return
        pending.push(entry)

    def _kind_of(self, job: SchedJob, shape: Shape, controller: ControllerKey | None, *,
                 parked: bool) -> JobKind:
        # Looked up as a plain tuple (equal to, and hashed like, the kind): building the named
        # tuple only for a new kind keeps loading a million jobs fast.
        key = (job.queue, job.cluster, shape, job.state, job.node_name, parked, False, job.group,
               job.group_size, job.group_max_size, job.preemptible, job.priority_class,
               job.max_queued, controller)
        kind = self._kinds.get(key)
        return self._kind(JobKind._make(key)) if kind is None else kind

    def _vary(self, kind: JobKind, *, released: bool = False, parked: bool | None = None,
              held: bool | None = None) -> JobKind:
        """The kind with these fields changed (released: RELEASED, on no node yet)."""
        new_state = JobState.RELEASED if released else kind.state
        new_node = None if released else kind.node_name
        new_parked = kind.parked if parked is None else parked
        new_held = kind.held if held is None else held
        if (new_state is kind.state and new_node is kind.node_name and new_parked is kind.parked
                and new_held is kind.held):
            return kind
        return self._kind(kind._replace(state=new_state, node_name=new_node, parked=new_parked,
                                        held=new_held))

    def _kind(self, kind: JobKind) -> JobKind:
        """The state's one copy of an equal kind, so that a million records share a few."""
        shared = self._kinds.get(kind)
        if shared is None:
            if len(self._kinds) >= _KIND_CACHE:
                # Kinds are values: after starting over, new records get new (equal) kinds.
                self._kinds.clear()
            shared = self._kinds[kind] = kind
        return shared

    def _fits_no_node(self, cluster_name: str, shape: Shape) -> bool:
        """Known nodes exist in the cluster, and none of their sizes could hold the shape."""
        cluster = self._clusters.get(cluster_name)
        if cluster is None or not cluster.node_sizes:
            return False  # no nodes seen yet: the round reports it, nothing is decided here
        known = cluster.fits_no_node.get(shape)
        if known is None:
            known = cluster.fits_no_node[shape] = not any(
                fits_node_class(shape, size) for size in cluster.node_sizes)
        return known

    def _retract(self, job_id: str, record: JobRecord) -> str | None:
        """Remove a record's contribution to every aggregate; returns its node hint, if any."""
        hint: str | None = None
        kind = record.kind
        queue = self._queues[kind.queue]
        shape = kind.shape
        if kind.group is not None:
            self._groups.remove(_group_key(record), job_id, queued=kind.state is _QUEUED)
        if kind.state is _QUEUED:
            queue.queued -= 1
            if queue.queued == 0 and queue.allocated == 0 and queue.spec is not None:
                self._targets.queues_changed()  # it leaves the fair targets' weights
            controller = kind.controller
            if controller is not None:
                bucket = self._queued_by_controller[controller]
                bucket.discard(job_id)
                if not bucket:
                    del self._queued_by_controller[controller]
            if kind.held:
                queue.held -= 1
                return hint
            pending = queue.pending[kind.cluster]
            pending.forget_head(record.entry)
            if kind.parked:
                queue.parked -= 1
                pending.parked -= 1
            else:
                subtract_pairs(queue.demand, shape.pairs)
                self._forget_shape(pending, shape)
                self._slot_remove(kind.queue, kind.cluster, shape, False)
        else:
            cluster = self._clusters[kind.cluster]
            queue.allocated -= 1
            if queue.queued == 0 and queue.allocated == 0 and queue.spec is not None:
                self._targets.queues_changed()
            self._slot_remove(kind.queue, kind.cluster, shape, True)
            subtract_pairs(queue.allocation, shape.pairs)
            subtract_pairs(queue.alloc_in[kind.cluster], shape.pairs)
            queue.alloc_changes += 1
            counts = queue.alloc_shapes[kind.cluster]
            if counts[shape] == 1:
                del counts[shape]
                if not counts:
                    del queue.alloc_shapes[kind.cluster]
                    del queue.alloc_in[kind.cluster]
            else:
                counts[shape] -= 1
            node = kind.node_name
            if kind.state is _RELEASED:
                cluster.releasing -= 1
            if node is None:
                held = cluster.held_unbound.pop(job_id, None)
                hint = None if held is None else held[1]
            else:
                subtract_pairs(cluster.used_by_node[node], shape.pairs)
                record_on = cluster.nodes.get(node)
                if record_on is not None:
                    add_pairs(record_on.free, shape.pairs)
                    cluster.note_free(node, record_on.free)
                cluster.jobs_on_node[node] -= 1
                if cluster.jobs_on_node[node] == 0:
                    del cluster.jobs_on_node[node]
                    del cluster.used_by_node[node]
                bound_in = self._bound[kind.cluster]
                bound_on = bound_in[node]
                del bound_on[job_id]
                if not bound_on:
                    del bound_in[node]
                    if not bound_in:
                        del self._bound[kind.cluster]
        return hint

    def _apply(self, job_id: str, record: JobRecord, hint: str | None) -> None:
        # The hot path of loading a million jobs: lookups inlined on purpose.
        kind = record.kind  # only its held and parked flags change below
        queue = self._queues.get(kind.queue) or self._queue(kind.queue)
        shape = kind.shape
        if queue.queued == 0 and queue.allocated == 0 and queue.spec is not None:
            self._targets.queues_changed()  # it joins the fair targets' weights
        if kind.group is not None:
            self._groups.add(_group_key(record), job_id, size=kind.group_size,
                             max_size=kind.group_max_size,
                             queued=kind.state is _QUEUED, created_at=record.entry[1])
        if kind.state is _QUEUED:
            if kind.cluster not in self._clusters:
                self._cluster(kind.cluster)
            queue.queued += 1
            controller = kind.controller
            if controller is not None:
                bucket = self._queued_by_controller.get(controller)
                if bucket is None:
                    bucket = self._queued_by_controller[controller] = set()
                bucket.add(job_id)
                if controller in self._holds:
                    record.kind = self._vary(kind, parked=False, held=True)
                    queue.held += 1
                    return
            if kind.held:
                record.kind = self._vary(kind, held=False)
            pending = queue.pending.get(kind.cluster)
            if pending is None:
                pending = queue.pending_in(kind.cluster)
                self._targets.pending_came(kind.queue, kind.cluster)
            if kind.parked:
                queue.parked += 1
                pending.parked += 1
            else:
                demand = queue.demand
                for axis, amount in shape.pairs:
                    demand[axis] += amount
                pending.live += 1
                shapes = pending.shapes
                shapes[shape] = shapes.get(shape, 0) + 1
                self._slot_add(kind.queue, kind.cluster, shape, False)
        else:
            if kind.held:
                record.kind = self._vary(kind, held=False)
            cluster = self._cluster(kind.cluster)
            queue.allocated += 1
            add_pairs(queue.allocation, shape.pairs)
            alloc_in = queue.alloc_in.get(kind.cluster)
            if alloc_in is None:
                alloc_in = queue.alloc_in[kind.cluster] = [0] * len(self._axis_names)
                queue.alloc_shapes[kind.cluster] = {}
            add_pairs(alloc_in, shape.pairs)
            queue.alloc_changes += 1
            counts = queue.alloc_shapes[kind.cluster]
            counts[shape] = counts.get(shape, 0) + 1
            self._slot_add(kind.queue, kind.cluster, shape, True)
            node = kind.node_name
            if kind.state is _RELEASED:
                cluster.releasing += 1
            if node is None:
                cluster.held_unbound[job_id] = (shape, hint)
            else:
                used = cluster.used_by_node.get(node)
                if used is None:
                    used = cluster.used_by_node[node] = [0] * len(self._axis_names)
                    cluster.jobs_on_node[node] = 0
                add_pairs(used, shape.pairs)
                record_on = cluster.nodes.get(node)
                if record_on is not None:
                    subtract_pairs(record_on.free, shape.pairs)
                    cluster.note_free(node, record_on.free)
                cluster.jobs_on_node[node] += 1
                bound_in = self._bound.get(kind.cluster)
                if bound_in is None:
                    bound_in = self._bound[kind.cluster] = {}
                bound_on = bound_in.get(node)
                if bound_on is None:
                    bound_on = bound_in[node] = {}
                bound_on[job_id] = record

    @staticmethod
    def _forget_shape(pending: PendingJobs, shape: Shape) -> None:
        pending.live -= 1
        left = pending.shapes[shape] - 1
        if left:
            pending.shapes[shape] = left
        else:
            del pending.shapes[shape]

    def _is_heap_entry(self, queue: QueueRecord, pending: PendingJobs, entry: HeapEntry) -> bool:
        record = self._jobs.get(entry[2])
        if record is None:
            return False
        kind = record.kind
        return (
            kind.state is _QUEUED
            and not kind.parked
            and not kind.held
            and kind.queue == queue.name
            and kind.cluster == pending.cluster
            and record.entry[0] == entry[0]
            and record.entry[1] == entry[1]
        )

    def _is_parked_entry(self, queue: QueueRecord, pending: PendingJobs, entry: HeapEntry) -> bool:
        record = self._jobs.get(entry[2])
        if record is None:
            return False
        kind = record.kind
        return (
            kind.state is _QUEUED
            and kind.parked
            and kind.queue == queue.name
            and kind.cluster == pending.cluster
            and record.entry[0] == entry[0]
            and record.entry[1] == entry[1]
        )

    def _tidy(self, queue_name: str, cluster: str) -> None:
        """After a change: forget what is empty, compact a heap that is mostly stale entries."""
        queue = self._queues.get(queue_name)
        if queue is None:
            return
        pending = queue.pending.get(cluster)
        if pending is not None:
            if pending.live == 0 and pending.parked == 0:
                del queue.pending[cluster]
                self._targets.pending_went(queue_name, cluster)
            elif pending.mostly_stale():
                # Lazy deletion leaves stale entries behind; dropping them once they outnumber
                # the live ones keeps the heap O(live) at O(1) amortised cost per change.
                pending.compact(functools.partial(self._is_heap_entry, queue, pending))
        if queue.spec is None and queue.is_empty():
            self._forget_queue(queue)

    def _unpark(self, cluster: str, size: NodeClass) -> None:
        """The cluster gained a node size: parked jobs that fit it queue again.

        Only those: a node size that merely came back (a node flapping NotReady and Ready, say)
        must not put jobs that still fit nowhere back in front of rounds that skip full clusters
        without looking at each job, where they would pass for merely waiting.
        """
        for queue in self._queues.values():
            pending = queue.pending.get(cluster)
            if pending is None or not pending.parked_entries:
                continue
            entries = unique([e for e in pending.parked_entries
                               if self._is_parked_entry(queue, pending, e)])
            pending.parked_entries = [e for e in entries
                                      if not fits_node_class(self._jobs[e[2]].shape, size)]
            for entry in entries:
                record = self._jobs[entry[2]]
                if not fits_node_class(record.shape, size):
                    continue
                record.kind = self._vary(record.kind, parked=False)
                queue.parked -= 1
                pending.parked -= 1
                add_pairs(queue.demand, record.shape.pairs)
                pending.live += 1
                pending.shapes[record.shape] = pending.shapes.get(record.shape, 0) + 1
                self._slot_add(queue.name, cluster, record.shape, False)
                pending.push(entry)

    def _forget_queue(self, queue: QueueRecord) -> None:
        """Drop an undefined, empty queue's record (and its leftover pending entries)."""
        for cluster in queue.pending:
            self._targets.pending_went(queue.name, cluster)
        del self._queues[queue.name]

    def _queue(self, name: str) -> QueueRecord:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = QueueRecord(name, len(self._axis_names))
        return queue

    def _cluster(self, name: str) -> ClusterRecord:
        cluster = self._clusters.get(name)
        if cluster is None:
            cluster = self._clusters[name] = ClusterRecord(name, len(self._axis_names))
        return cluster

    def _intern(self, requests: Resources, placement: PodPlacement | None = None) -> Shape:
        # Callers usually share one Resources object per distinct request (the ingest path
        # decodes the same JSON again and again), so look the object itself up first.
        seen = self._shape_of_object.get((id(requests), id(placement)))
        if (seen is not None and seen[0] is requests and seen[1] is placement
                and seen[2].refs > 0):
            return seen[2]  # (a shape nobody uses any more may be gone from the table)
        amounts = requests.as_dict()
        key = (frozenset(amounts.items()), placement)
        shape = self._shapes.get(key)
        if shape is None:
            if any(amount < 0 for amount in amounts.values()):
                raise ValueError(f"negative resource request: {requests!r}")
            pairs = tuple(sorted((self._axis(name), amount) for name, amount in amounts.items()))
            placement_id = self._targets.placement_id(placement)
            shape = self._shapes[key] = Shape(key, requests, pairs, placement, placement_id)
        if len(self._shape_of_object) >= _SHAPE_OBJECT_CACHE:
            self._shape_of_object.clear()
        # Holding the objects keeps their ids from being reused while the entry exists.
        self._shape_of_object[(id(requests), id(placement))] = (requests, placement, shape)
        return shape

    def _release_shape(self, shape: Shape) -> None:
        shape.refs -= 1
        if shape.refs == 0 and self._shapes.get(shape.key) is shape:
            del self._shapes[shape.key]

    def _axis(self, name: str) -> int:
        axis = self._axes.get(name)
        if axis is None:
            axis = self._axes[name] = len(self._axis_names)
            self._axis_names.append(name)
            self._grow_vectors()
            self._targets.note_change()
        return axis

    def _grow_vectors(self) -> None:
        """A resource never seen before: every dense vector gets a zero for it."""
        axes = len(self._axis_names)
        vectors: list[list[int]] = [self._pool_total]
        for queue in self._queues.values():
            vectors += (queue.demand, queue.allocation, *queue.alloc_in.values())
        vectors += self._targets.slot_vectors()
        for cluster in self._clusters.values():
            cluster.cached_version = -1  # its room index gains the axis too
            vectors.append(cluster.total)
            vectors.extend(cluster.used_by_node.values())
            for node in cluster.nodes.values():
                vectors += (node.allocatable, node.unmanaged, node.room, node.free)
            cluster.node_sizes = {
                (size + (0,) * (axes - len(size)), traits): count
                for (size, traits), count in cluster.node_sizes.items()
            }
        for vector in vectors:
            vector.extend([0] * (axes - len(vector)))

    def _dense(self, resources: Resources) -> list[int]:
        """A dense vector over the current axes; every resource in it must have an axis."""
        vector = [0] * len(self._axis_names)
        for name, amount in resources.as_dict().items():
            vector[self._axes[name]] = amount
        return vector

    def _resources(self, vector: list[int]) -> Resources:
        return Resources(dict(zip(self._axis_names, vector, strict=False)))


class RoundTransaction:
    """A round's releases, applied to the state at once and kept only when committed.

    Why: a round's decisions count as soon as it makes them (the next job it looks at must see
    the room and the share they took), but a decision stands only once its caller has recorded
    it (the leader writes it to Postgres, which drops those whose job is no longer queued
    there). So the round releases through a transaction (`release`), and its caller commits it
    after recording: the releases it names stay, every other one is taken back, its job queued
    again exactly as before the round (its kind, its place in line), as if the round had not
    decided it. A job that changed since the round (upserted or removed meanwhile) is the
    change's, and is not taken back.

    Only releases are transactional. What else a round changes is true whatever the caller
    records: jobs parked as too big for every node, holds ended or placed, the order its heaps
    were left in, the last fair targets.
    """

    __slots__ = ("_open", "_released", "number", "state")

    def __init__(self, state: SchedulerState) -> None:
        self.state = state
        # Per release: the job, its record, its kind before and after the release.
        self._released: list[tuple[str, JobRecord, JobKind, JobKind]] = []
        self._open = True
        self.number = state.rounds_begun + 1  # the round's number (`GrowthRelease.round`)

    def release(self, job_id: str, record: JobRecord, node_hint: str | None, *,
                growth: GrowthRelease | None = None) -> None:
        """Release a queued job (RELEASED, holding capacity on `node_hint`'s node) until the
        transaction is committed without it; `growth`: it is released for growth (its node
        hint a virtual node), which the state keeps until it binds."""
        if not self._open:
            raise RuntimeError("the round's transaction is closed")
        before = self.state._mark_released(job_id, record, node_hint)
        self._released.append((job_id, record, before, record.kind))
        if growth is not None:
            self.state._growth_releases[job_id] = growth

    def take_back(self, job_ids: Collection[str]) -> None:
        """Take back, before the round ends, releases it made (the job queues again exactly as
        before, as `commit` does for those the caller did not record): the round held them
        after all (pods gathered to fill a node, `lockgate.scheduler.round`)."""
        if not self._open:
            raise RuntimeError("the round's transaction is closed")
        kept: list[tuple[str, JobRecord, JobKind, JobKind]] = []
        for item in reversed(self._released):
            job_id, record, before, _ = item
            if job_id in job_ids:
                self.state._take_back(job_id, record, before)
                self.state._growth_releases.pop(job_id, None)
            else:
                kept.append(item)
        kept.reverse()
        self._released = kept

    @property
    def released(self) -> list[str]:
        """The jobs released through it, in order."""
        return [job_id for job_id, *_ in self._released]

    def commit(self, *, kept: Collection[str] | None = None) -> list[str]:
        """Keep the releases of `kept` (None: every one) and take the others back; returns the
        jobs taken back, in the order they were released."""
        if not self._open:
            raise RuntimeError("the round's transaction is closed")
        self._open = False
        self.state._closed(self)
        if kept is None:
            return []
        taken_back: list[str] = []
        jobs = self.state.job_records
        for job_id, record, before, after in reversed(self._released):
            if job_id in kept:
                continue
            taken_back.append(job_id)
            if jobs.get(job_id) is record and record.kind is after:
                self.state._take_back(job_id, record, before)
                self.state._growth_releases.pop(job_id, None)
        taken_back.reverse()
        return taken_back

    def rollback(self) -> list[str]:
        """Take every release back (the caller recorded none)."""
        return self.commit(kept=())


_NO_BOUND_JOBS: Mapping[str, Mapping[str, JobRecord]] = MappingProxyType({})


def _controller_key(job: SchedJob) -> ControllerKey | None:
    return (job.cluster, job.controller) if job.controller else None


def _group_key(record: JobRecord) -> GroupKey:
    assert record.group is not None
    return (record.cluster, record.queue, record.group)


def _add_into(vector: list[int], other: list[int]) -> None:
    for axis, amount in enumerate(other):
        vector[axis] += amount


def _subtract_into(vector: list[int], other: list[int]) -> None:
    for axis, amount in enumerate(other):
        vector[axis] -= amount
