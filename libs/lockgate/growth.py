"""What an autoscaled cluster may still grow by, as nodes the scheduler can place pods on.

Why it exists: Karpenter and the cluster-autoscaler ignore gated pods, so a cluster under
lockgate grows only for pods lockgate releases; and lockgate's fair targets counted only nodes
that exist, so it never released a pod that needed a node that does not exist yet (issue 35).
This module turns an autoscaler's picture (`lockgate.events.ClusterGrowth`: its NodePools and
the NodeClaims in flight) into *virtual nodes*: one per NodeClaim in flight whose Node the
scheduler does not have yet, and one per whole instance each NodePool may still add within its
limits (its *headroom*). The scheduler adds them to the cluster's nodes, so its node filters
(resources, selectors, affinity, tolerations) decide which pods a pool can take, its fair
targets count what can exist, and its round places a pod released for growth on one of them
(`lockgate.scheduler`, docs/autoscaling.md).

Headroom, per NodePool: `limits - in_use` per resource it limits (`in_use` is Karpenter's
`status.resources`, which counts the nodes that exist and the NodeClaims in flight, so neither is
counted twice); a resource it does not limit is bounded only by the cluster's cap in
`GrowthPolicy.cluster_caps`, if any; rounded down to whole instances of the types that fit
(`instance_sizes`): the biggest as many times as it fits, then what is left as instances of the
pool's smaller allowed sizes, biggest first (a pool of 4, 8 and 16-cpu types with 28 cpu left
adds 16 + 8 + 4, not one 16 and nothing); never more than `GrowthPolicy.max_nodes_per_pool`
instances in all. A pool not Ready, or whose instance size is unknown, adds nothing, and says
why.

Pure: no clock (the caller passes what it needs), no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from lockgate.events import ClusterGrowth, NodeClaimStatus, NodePoolStatus
from lockgate.node_groups import NodeGroup, check_node_groups
from lockgate.placement import Requirement, Taint
from lockgate.resources import InvalidQuantityError, parse_quantity

# The label Karpenter puts on every node (and NodeClaim) a NodePool makes.
NODE_POOL_LABEL = "karpenter.sh/nodepool"
# Virtual nodes are named with a character no Kubernetes node name may hold (node names are
# DNS subdomains), so a virtual node never takes a real node's name.
VIRTUAL_PREFIX = "growth:"

# Well-known instance labels, by suffix, so that every provider that follows the convention is
# read: Karpenter's kwok provider (karpenter.kwok.sh/instance-cpu "4", instance-memory "16Gi"),
# AWS (karpenter.k8s.aws/instance-cpu "4", instance-memory "16384", in MiB, instance-gpu-count).
# A bare number for memory is MiB (AWS's unit); a quantity with a suffix is read as one.
_INSTANCE_LABELS: tuple[tuple[str, str], ...] = (
    ("/instance-cpu", "cpu"),
    ("/instance-memory", "memory"),
    ("/instance-gpu-count", "nvidia.com/gpu"),
)
_MIB = 1 << 20
_FROM_REQUIREMENTS = "its requirements' instance size"


@dataclass(frozen=True, slots=True)
class GrowthPolicy:
    """How lockgate releases pods for growth (the fair scheduler's settings fill it).

    Amounts are in canonical units (`lockgate.resources`: cpu in millicores, memory in bytes).
    """

    # Per cluster, per resource, the most its NodePools together may still add, for resources
    # a pool does not limit (and a tighter bound for those it does). A cluster not named, and
    # a resource not named, has no cap beyond the pools' own limits.
    cluster_caps: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # The capacity of one node a NodePool makes, by "<cluster>/<pool>" or by "<pool>" (any
    # cluster): when its requirements do not name an instance size, or to correct them.
    instance_shapes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # What every node loses to pods lockgate does not manage (DaemonSets, system reserve):
    # subtracted from each virtual node's room.
    node_overhead: Mapping[str, int] = field(default_factory=dict)
    # At most this many virtual nodes per NodePool (a pool with no limit would be endless).
    max_nodes_per_pool: int = 32
    # A pod released for growth and still unbound this long after its release stalls the
    # cluster's growth (no more releases for growth there until it binds or goes).
    stall_after_seconds: float = 600.0
    # A next wave of releases for growth into a cluster waits until the last wave's NodeClaims
    # are counted (a pool's `in_use` grew), but no longer than this.
    wave_wait_seconds: float = 60.0
    # Releases for growth into a cluster that would fill less than one node of its pool (the
    # biggest instance its headroom holds) are held, owed, until a node's worth is owed or
    # this long passed since the first was held (Karpenter makes nodes the size of its
    # batches: a few pods make a small node). 0: never held.
    gather_seconds: float = 12.0
    # The cluster-autoscaler's node groups (lockgate.node_groups), stated by the operator: a
    # cluster with groups and no published picture grows within them, by the same rule.
    node_groups: tuple[NodeGroup, ...] = ()

    def __post_init__(self) -> None:
        check_node_groups(self.node_groups)
        if self.max_nodes_per_pool < 0:
            raise ValueError("max_nodes_per_pool must not be negative")
        if (self.stall_after_seconds <= 0 or self.wave_wait_seconds < 0
                or self.gather_seconds < 0):
            raise ValueError("stall_after_seconds must be positive, wave_wait_seconds and "
                             "gather_seconds must not be negative")
        for where, amounts in (("node_overhead", self.node_overhead),
                               *((f"cluster_caps[{c!r}]", a)
                                 for c, a in self.cluster_caps.items()),
                               *((f"instance_shapes[{p!r}]", a)
                                 for p, a in self.instance_shapes.items())):
            negative = [name for name, amount in amounts.items() if amount < 0]
            if negative:
                raise ValueError(f"{where}: negative amounts of {', '.join(sorted(negative))}")

    def shape_for(self, cluster: str, pool: str) -> Mapping[str, int] | None:
        stated = self.instance_shapes.get(f"{cluster}/{pool}", self.instance_shapes.get(pool))
        if stated is not None:
            return stated
        for group in self.node_groups:  # a node group states its nodes' size
            if group.cluster == cluster and group.name == pool:
                return group.allocatable.as_dict()
        return None


@dataclass(frozen=True, slots=True)
class VirtualNode:
    """A node that may exist: one a NodeClaim in flight makes (`claim`), or one a NodePool may
    still add within its headroom (`claim` empty)."""

    name: str
    pool: str
    allocatable: Mapping[str, int]
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    claim: str = ""
    # The Node the claim names (its `status.nodeName`), when the scheduler does not have it
    # yet: pods bound there are charged to this virtual node until it does.
    node_name: str = ""
    # The node affinity a pod released onto it needs so that Karpenter makes an instance of
    # this size for it, not a smaller one (`smaller_instances`): for headroom, and for a
    # launched claim of a pool sized by its requirements (should the pod not fit it after all,
    # the claim made for it is of that size); None: nothing smaller to rule out.
    avoid: Requirement | None = None

    @property
    def size_named(self) -> bool:
        """Whether a pod released onto it makes Karpenter launch this node's size, not the
        cheapest that holds the pod alone: it carries the pool's instance-cpu label (its own
        size of a pool of several, whose smaller sizes `avoid` rules out, or the one size a
        pool allows). Then gathering a node's worth before releasing (`GrowthPolicy.
        gather_seconds`) gains no node and only delays the pods owed room
        (`lockgate.scheduler.round`)."""
        return any(key.endswith("/instance-cpu") for key in self.labels)


@dataclass(frozen=True, slots=True)
class PoolHeadroom:
    """What one NodePool may still add, and why not more."""

    pool: str
    nodes: int  # whole instances it may still add (virtual nodes made for it)
    # Per resource it (or the cluster's cap) bounds: how much is left; a resource not named is
    # unbounded.
    remaining: Mapping[str, int]
    shape: Mapping[str, int] | None  # one node's capacity (None: unknown)
    shape_source: str  # where the shape came from, in words
    why_none: str = ""  # why it adds nothing ("": it adds `nodes`)
    # The instances it adds, biggest first: (one instance's capacity, how many). Their counts
    # sum to `nodes`; the first is `shape` unless no instance of it fits.
    instances: tuple[tuple[Mapping[str, int], int], ...] = ()


@dataclass(frozen=True, slots=True)
class GrowthPlan:
    """A cluster's growth as the scheduler models it (`plan_growth`)."""

    cluster: str
    pools: tuple[PoolHeadroom, ...]
    nodes: tuple[VirtualNode, ...]  # claims in flight first, then headroom, pool by pool
    claims_in_flight: tuple[str, ...]
    # The first failed NodeClaim's words ("": none failed): the cluster's growth is stalled.
    failed_claim: str = ""
    # What moves when the last wave's NodeClaims appear (`wave_answered`): the claims' names
    # and each pool's in_use.
    marker: tuple[frozenset[str], tuple[tuple[str, tuple[tuple[str, int], ...]], ...]] = (
        frozenset(), ())

    def headroom(self, pool: str) -> PoolHeadroom | None:
        return next((p for p in self.pools if p.pool == pool), None)


# Who asks for a node the scheduler knows: (its name, its allocatable) for the largest node of a
# pool; and whether a node of that name exists.
LargestNodeOf = Callable[[str], tuple[str, Mapping[str, int]] | None]


def plan_growth(growth: ClusterGrowth, *, policy: GrowthPolicy,
                largest_node_of: LargestNodeOf,
                has_node: Callable[[str], bool],
                pool_nodes: Callable[[str], Mapping[str, Mapping[str, int]]] = lambda _: {},
                ) -> GrowthPlan:
    """The virtual nodes and headroom of one cluster's autoscaler picture.

    `largest_node_of(pool)`: the largest existing node labelled with the pool (the shape's last
    resort); `has_node(name)`: whether the scheduler has that node (a claim whose Node it has is
    a node already, not a virtual one); `pool_nodes(pool)`: the existing nodes labelled with the
    pool, name -> allocatable (what it has made, however late its `status.resources` counts
    them). A cluster that is not autoscaled grows by nothing.
    """
    cluster = growth.cluster
    if not growth.autoscaled:
        return GrowthPlan(cluster=cluster, pools=(), nodes=(), claims_in_flight=())
    pools = {pool.name: pool for pool in growth.node_pools}
    nodes: list[VirtualNode] = []
    in_flight: list[str] = []
    failed = ""
    shapes: dict[str, tuple[dict[str, int] | None, str]] = {}
    for pool in sorted(growth.node_pools, key=lambda p: p.name):
        shapes[pool.name] = instance_shape(pool, cluster=cluster, policy=policy,
                                           largest_node_of=largest_node_of)
    unnamed = _claims_left_within_limits(growth, shapes, pool_nodes, has_node)
    for claim in sorted(growth.node_claims, key=lambda c: (c.created_at, c.name)):
        if claim.failure:
            if not failed:
                failed = f"NodeClaim {claim.name}: {claim.failure}"
            continue
        if claim.deleting or (claim.node_name and has_node(claim.node_name)):
            continue
        in_flight.append(claim.name)
        if claim.name not in unnamed:
            continue  # its Node is (very likely) one the scheduler has, not yet named by it
        claim_pool = pools.get(claim.node_pool)
        shape, source = shapes.get(claim.node_pool, (None, ""))
        if claim.allocatable and claim_pool is not None and shape is not None \
                and source == _FROM_REQUIREMENTS:
            # Its allocatable already excludes what the instance keeps back (kubelet and
            # system reserve); the overhead is counted from the instance's capacity, as for
            # headroom: subtracting it from allocatable took the reserve off twice.
            nodes.append(_claim_of_instance(claim, claim_pool, shape, policy))
            continue
        allocatable: Mapping[str, int] | None = claim.allocatable or shape
        if allocatable is None:
            continue  # its size is unknown until it launches: no room promised on it yet
        nodes.append(_virtual(f"{VIRTUAL_PREFIX}{claim.node_pool}/claim/{claim.name}",
                              claim.node_pool, allocatable, claim_pool, policy, claim=claim))
    caps = dict(policy.cluster_caps.get(cluster, {}))
    headrooms: list[PoolHeadroom] = []
    # Karpenter tries pools of higher weight first: they take the cluster's cap first.
    for pool in sorted(growth.node_pools, key=lambda p: (-p.weight, p.name)):
        shape, source = shapes[pool.name]
        sizes = (() if shape is None else
                 instance_sizes(pool, shape) if source == _FROM_REQUIREMENTS else (shape,))
        headroom = pool_headroom(
            _with_made_counted(pool, growth.node_claims, shape, pool_nodes(pool.name)),
            shape=shape, shape_source=source, caps=caps, max_nodes=policy.max_nodes_per_pool,
            sizes=sizes)
        headrooms.append(headroom)
        index = 0
        for size, count in headroom.instances:
            for resource, amount in size.items():
                if resource in caps:
                    caps[resource] -= amount * count
            avoid = smaller_instances(pool, size)
            labels = instance_labels(pool, size)
            for _ in range(count):
                nodes.append(_virtual(f"{VIRTUAL_PREFIX}{pool.name}/{index}", pool.name, size,
                                      pool, policy, avoid=avoid, sized=labels))
                index += 1
    marker = (frozenset(c.name for c in growth.node_claims),
              tuple(sorted((p.name, tuple(sorted(p.in_use.items())))
                           for p in growth.node_pools)))
    return GrowthPlan(cluster=cluster, pools=tuple(sorted(headrooms, key=lambda h: h.pool)),
                      nodes=tuple(nodes), claims_in_flight=tuple(in_flight),
                      failed_claim=failed, marker=marker)


def _claim_of_instance(claim: NodeClaimStatus, pool: NodePoolStatus, shape: Mapping[str, int],
                       policy: GrowthPolicy) -> VirtualNode:
    """The virtual node of a launched NodeClaim of a pool whose requirements name its instance
    sizes: per resource, the least of its `status.allocatable` and its instance's capacity
    less `GrowthPolicy.node_overhead` (the instance: the smallest of the pool's sizes that
    holds its allocatable; none: its allocatable less the overhead, as before it launched).

    Why: the overhead is what a node loses of its *instance's capacity* to what lockgate does
    not manage, system reserve included (a kwok c-8x node: 8 cpu, 7900m allocatable, overhead
    100m), and headroom is counted from capacity. A claim's allocatable already lost the
    reserve, so its capacity less the overhead is the node it becomes; its allocatable less the
    overhead was 100m short (7800m), one 1975m pod fewer on a claim in flight than its node
    holds."""
    allocatable = claim.allocatable
    instance = next((size for size in reversed(instance_sizes(pool, shape))
                     if all(size.get(r, 0) >= amount for r, amount in allocatable.items()
                            if r in size)), None)
    name = f"{VIRTUAL_PREFIX}{claim.node_pool}/claim/{claim.name}"
    if instance is None:
        return _virtual(name, claim.node_pool, allocatable, pool, policy, claim=claim)
    overhead = policy.node_overhead
    room = {resource: (min(amount, instance[resource] - overhead.get(resource, 0))
                       if resource in instance else amount - overhead.get(resource, 0))
            for resource, amount in allocatable.items()}
    # A pod released onto it that Karpenter cannot pack onto it after all (kube-scheduler bound
    # others there first, or Karpenter packed the batch its own way) makes a new claim: of this
    # size, not the cheapest that holds the pod alone.
    return _virtual(name, claim.node_pool, room, pool, policy, claim=claim,
                    overhead_counted=True, avoid=smaller_instances(pool, instance))


def _claims_left_within_limits(growth: ClusterGrowth,
                               shapes: Mapping[str, tuple[dict[str, int] | None, str]],
                               pool_nodes: Callable[[str], Mapping[str, Mapping[str, int]]],
                               has_node: Callable[[str], bool]) -> frozenset[str]:
    """The NodeClaims in flight that may be virtual nodes: per pool, the newest that fit
    within its limits once its existing nodes are counted.

    Why: a claim's Node registers (and the watcher reports it) before Karpenter writes the
    claim's `status.nodeName`, and the pictures travel apart from the nodes; in between the
    scheduler has the Node *and* the claim in flight, the same node twice. `_with_made_counted`
    keeps the headroom from counting it again, but the claim's virtual node stayed: its room
    and the real node's were both offered (seen on the stack: 48 pods released where the
    limits hold 32; the pods over the limits never got a node). Karpenter never makes a pool's
    nodes exceed its limits, so the claims beyond them are nodes the scheduler already has.
    The oldest go first: they are the first whose Nodes register."""
    pools = {pool.name: pool for pool in growth.node_pools}
    live = [claim for claim in growth.node_claims
            if not (claim.failure or claim.deleting
                    or (claim.node_name and has_node(claim.node_name)))]
    kept: set[str] = set()
    by_pool: dict[str, list[NodeClaimStatus]] = {}
    for claim in live:
        by_pool.setdefault(claim.node_pool, []).append(claim)
    for pool_name, claims in by_pool.items():
        pool = pools.get(pool_name)
        if pool is None or not pool.limits:
            kept.update(claim.name for claim in claims)
            continue
        left = dict(pool.limits)
        for size in pool_nodes(pool_name).values():
            for resource in left:
                left[resource] -= size.get(resource, 0)
        shape = shapes.get(pool_name, (None, ""))[0]
        for claim in sorted(claims, key=lambda c: (c.created_at, c.name), reverse=True):
            size = claim.allocatable or shape or {}
            if all(left[resource] >= size.get(resource, 0) for resource in left):
                kept.add(claim.name)
                for resource in left:
                    left[resource] -= size.get(resource, 0)
    return frozenset(kept)


def _with_made_counted(pool: NodePoolStatus, claims: Sequence[NodeClaimStatus],
                       shape: Mapping[str, int] | None,
                       nodes: Mapping[str, Mapping[str, int]]) -> NodePoolStatus:
    """The pool with `in_use` at least what it has made: its live NodeClaims (each of the
    pool's shape, or its own size once launched) and its nodes that exist (labelled with the
    pool; each counted once, whether or not a claim names it).

    Why: Karpenter updates a NodePool's `status.resources` in a controller of its own, seconds
    after the NodeClaims and nodes it counts exist, and writes a new NodeClaim before counting
    it; the watcher may publish a picture in between, and it publishes only claims in flight (an
    initialized claim is a node). Read alone, a stale `in_use` counted a new node twice, as a
    node (or claim in flight) and as headroom: pods were released for growth that no node could
    ever hold (seen on the real stack: 48 released under a 32-pod limit; and a second wave
    offered the node of the first)."""
    made: dict[str, Mapping[str, int]] = {name: size for name, size in nodes.items()}
    for claim in claims:
        if claim.node_pool != pool.name or claim.failure or claim.deleting:
            continue
        key = claim.node_name or f"claim:{claim.name}"
        if key not in made:
            size = claim.allocatable or shape
            if size is None:
                continue
            made[key] = size
    if not made:
        return pool
    in_use = dict(pool.in_use)
    for resource in {resource for size in made.values() for resource in size}:
        counted = sum(size.get(resource, 0) for size in made.values())
        in_use[resource] = max(in_use.get(resource, 0), counted)
    return pool.model_copy(update={"in_use": in_use})


def pool_headroom(pool: NodePoolStatus, *, shape: Mapping[str, int] | None, shape_source: str,
                  caps: Mapping[str, int], max_nodes: int,
                  sizes: Sequence[Mapping[str, int]] = ()) -> PoolHeadroom:
    """How many whole instances the pool may still add: within its limits, the cluster's caps
    left (`caps`, per resource) and `max_nodes`. `sizes`, biggest first (default: `shape`
    alone), are the instance types it may launch: the biggest as many times as it fits, then
    what is left as instances of the next, and so on."""
    remaining = {resource: limit - pool.in_use.get(resource, 0)
                 for resource, limit in pool.limits.items()}
    for resource, cap in caps.items():
        remaining[resource] = min(remaining.get(resource, cap), cap)
    if not pool.ready:
        why = pool.not_ready_reason or "no reason given"
        return PoolHeadroom(pool.name, 0, remaining, shape, shape_source,
                            f"NodePool {pool.name} is not Ready ({why})")
    if shape is None:
        return PoolHeadroom(pool.name, 0, remaining, None, shape_source,
                            f"NodePool {pool.name}: the size of its nodes is unknown ("
                            f"{shape_source})")
    left = dict(remaining)
    budget = max_nodes
    instances: list[tuple[Mapping[str, int], int]] = []
    bound_by = f"at most {max_nodes} nodes counted per pool"
    for position, size in enumerate(sizes or (shape,)):
        count = budget
        for resource, amount in sorted(left.items()):
            per_node = size.get(resource, 0)
            if amount < 0 or (per_node > 0 and amount // per_node < count):
                count = 0 if amount < 0 else amount // per_node
                if position == 0:  # the reason given is the biggest type's
                    bound_by = (f"no {resource} left" if amount <= 0 else
                                f"{describe_amounts({resource: amount})} left: less than a node")
        if count > 0:
            instances.append((size, count))
            budget -= count
            for resource in left:
                left[resource] -= size.get(resource, 0) * count
        if budget == 0:
            break
    total = sum(count for _, count in instances)
    why = "" if total > 0 else f"NodePool {pool.name} is at its limits ({bound_by})"
    return PoolHeadroom(pool.name, total, remaining, shape, shape_source, why,
                        instances=tuple(instances))


def instance_sizes(pool: NodePoolStatus, shape: Mapping[str, int]) -> tuple[dict[str, int], ...]:
    """The instance types a pool whose requirements name its sizes may launch, biggest first:
    `shape` (the biggest), then one per smaller cpu value its instance-cpu requirement allows.

    Its requirements list cpu and memory values separately, so which memory goes with a smaller
    cpu is not stated; the rule keeps a type's memory per cpu at most the biggest type's: the
    largest allowed memory value no more than `shape`'s memory scaled to that cpu (kwok's and
    AWS's families have a fixed memory per cpu, so this is the family's own size). A smaller
    cpu value with no such memory value is left out (never a node with more room than any
    instance). Other resources (gpus) scale with cpu, rounded down."""
    cpu_values: set[int] = set()
    memory_values: set[int] = set()
    for requirement in pool.requirements:
        resource = next((name for suffix, name in _INSTANCE_LABELS
                         if requirement.key.endswith(suffix)), None)
        if resource not in ("cpu", "memory") or requirement.operator != "In":
            continue
        for value in requirement.values:
            amount = _label_amount(resource, value)
            if amount is not None:
                (cpu_values if resource == "cpu" else memory_values).add(amount)
    biggest_cpu, biggest_memory = shape.get("cpu", 0), shape.get("memory", 0)
    sizes: list[dict[str, int]] = [dict(shape)]
    if biggest_cpu <= 0:
        return tuple(sizes)
    for cpu in sorted((c for c in cpu_values if c < biggest_cpu), reverse=True):
        ceiling = biggest_memory * cpu // biggest_cpu
        fitting = [m for m in memory_values if m <= ceiling]
        if not fitting:
            continue
        size = {resource: amount * cpu // biggest_cpu for resource, amount in shape.items()}
        size["cpu"], size["memory"] = cpu, max(fitting)
        sizes.append(size)
    return tuple(sizes)


def smaller_instances(pool: NodePoolStatus, size: Mapping[str, int]) -> Requirement | None:
    """The requirement (`NotIn`, on the pool's instance-cpu label) that rules out the instance
    types the pool allows that are smaller in cpu than `size`, or None when it allows none
    (or names no instance cpu).

    Why: Karpenter launches the cheapest type that holds the pods of a batch, and lockgate's
    releases for growth come a few pods at a time (what is owed trickles), so a pool of 4, 8
    and 16-cpu types made mostly small nodes where the headroom lockgate counted was in
    16-cpu instances (BENCHMARKS.md, scenario (d): 2-3x the nodes the fair split needs). A pod
    released onto headroom of one size, with this added to its node affinity, makes Karpenter
    make that size; the next pods owed room go onto the claim in flight, then onto its node.
    `NotIn` matches a node without the label, so the pod may still bind to the cluster's other
    nodes (those no NodePool made)."""
    cpu = size.get("cpu", 0)
    for requirement in pool.requirements:
        if requirement.operator != "In" or not requirement.key.endswith("/instance-cpu"):
            continue
        smaller = tuple(value for value in requirement.values
                        if (amount := _label_amount("cpu", value)) is not None and amount < cpu)
        return Requirement(key=requirement.key, operator="NotIn", values=smaller) \
            if smaller else None
    return None


def instance_labels(pool: NodePoolStatus, size: Mapping[str, int]) -> dict[str, str]:
    """The pool's instance-size labels (cpu, memory) an instance of `size` carries, where its
    requirements allow a value of exactly that size: so that a pod whose own affinity names
    an instance size is placed only on virtual nodes of that size (and is never told to avoid
    the size it asks for, `smaller_instances`)."""
    labels: dict[str, str] = {}
    for requirement in pool.requirements:
        resource = next((name for suffix, name in _INSTANCE_LABELS[:2]
                         if requirement.key.endswith(suffix)), None)
        if resource is None or requirement.operator != "In":
            continue
        value = next((v for v in requirement.values
                      if _label_amount(resource, v) == size.get(resource)), None)
        if value is not None:
            labels[requirement.key] = value
    return labels


def instance_shape(pool: NodePoolStatus, *, cluster: str, policy: GrowthPolicy,
                   largest_node_of: LargestNodeOf) -> tuple[dict[str, int] | None, str]:
    """One node's capacity for the pool, and where it came from: the policy's shape for the
    pool, else its requirements on the well-known instance labels (the largest value each
    allows), else its largest existing node. (None, why) when none of them tells."""
    override = policy.shape_for(cluster, pool.name)
    if override is not None:
        return dict(override), "lockgate's setting for the pool"
    shape: dict[str, int] = {}
    for requirement in pool.requirements:
        resource = next((name for suffix, name in _INSTANCE_LABELS
                         if requirement.key.endswith(suffix)), None)
        if resource is None or requirement.operator != "In" or not requirement.values:
            continue
        amounts = [_label_amount(resource, value) for value in requirement.values]
        known = [amount for amount in amounts if amount is not None]
        if known:
            shape[resource] = max(shape.get(resource, 0), *known)
    if "cpu" in shape and "memory" in shape:
        return shape, _FROM_REQUIREMENTS
    largest = largest_node_of(pool.name)
    if largest is not None:
        name, allocatable = largest
        return dict(allocatable), f"its largest node, {name}"
    return None, ("its requirements name no instance cpu and memory, it has no node yet, "
                  "and lockgate has no setting for it")


def wave_answered(at_release: object, now_marker: object) -> bool:
    """Whether the NodeClaims of a wave released when the picture's marker was `at_release`
    are counted: a pool whose `in_use` grew (`GrowthPlan.marker`).

    Why not a new NodeClaim alone: Karpenter writes the claim before it adds it to the pool's
    `status.resources`, and a picture taken in between shows the claim in flight *and* the
    pool's old headroom, the same node twice; a next wave let go then took both (seen on the
    stack in `make demo`: 6 pods released where one 3-pod node could be made)."""
    if not (isinstance(at_release, tuple) and isinstance(now_marker, tuple)):
        return True
    _, pools_then = at_release
    _, pools_now = now_marker
    used_then = {name: dict(used) for name, used in pools_then}
    for name, used in pools_now:
        before = used_then.get(name, {})
        if any(amount > before.get(resource, 0) for resource, amount in used):
            return True
    return False


def describe_amounts(amounts: Mapping[str, int]) -> str:
    """Amounts as a person reads them: "cpu=48 memory=96Gi"."""
    words = []
    for resource, amount in sorted(amounts.items()):
        if resource == "cpu":
            text = f"{amount / 1000:g}"
        elif resource in ("memory", "ephemeral-storage") and amount >= _MIB:
            unit, size = next((u, s) for u, s in (("Ti", 1 << 40), ("Gi", 1 << 30),
                                                   ("Mi", _MIB)) if amount >= s)
            text = f"{amount / size:g}{unit}"
        else:
            text = str(amount)
        words.append(f"{resource}={text}")
    return " ".join(words)


def _label_amount(resource: str, value: str) -> int | None:
    try:
        quantity = parse_quantity(value)
    except InvalidQuantityError:
        return None
    if resource == "cpu":
        quantity *= 1000
    elif resource == "memory" and value.strip().isdigit():
        quantity *= _MIB
    return int(quantity.to_integral_value(rounding="ROUND_FLOOR")) if quantity > Decimal(0) \
        else None


def _virtual(name: str, pool_name: str, capacity: Mapping[str, int],
             pool: NodePoolStatus | None, policy: GrowthPolicy, *,
             claim: NodeClaimStatus | None = None,
             avoid: Requirement | None = None,
             sized: Mapping[str, str] | None = None,
             overhead_counted: bool = False) -> VirtualNode:
    """A virtual node of the pool: its capacity less the per-node overhead (unless
    `overhead_counted`: the caller did), its instance-size
    labels (`sized`, headroom only), the pool's template labels, the values its requirements
    fix (single-valued `In`) and the pool label, and its taints."""
    overhead = {} if overhead_counted else policy.node_overhead
    allocatable = {resource: max(0, amount - overhead.get(resource, 0))
                   for resource, amount in capacity.items()}
    labels: dict[str, str] = dict(sized or {})
    taints: tuple[Taint, ...] = ()
    if pool is not None:
        for requirement in pool.requirements:
            if requirement.operator == "In" and len(requirement.values) == 1:
                labels[requirement.key] = requirement.values[0]
        labels.update(pool.labels)
        taints = pool.taints
    labels[NODE_POOL_LABEL] = pool_name
    return VirtualNode(name=name, pool=pool_name, allocatable=allocatable, labels=labels,
                       taints=taints, claim="" if claim is None else claim.name,
                       node_name="" if claim is None else claim.node_name, avoid=avoid)


def is_virtual(node_name: str) -> bool:
    """Whether a node name is a virtual node's (`plan_growth`), not a real node's."""
    return node_name.startswith(VIRTUAL_PREFIX)
