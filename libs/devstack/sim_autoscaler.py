"""A simulated Karpenter, and the kube-scheduler in front of it, for the fleet simulator.

Why: issue 35's claim (lockgate releases pods *for growth*, so an autoscaled cluster grows for
the pods fairly owed room and never for pods over their share) has to be checked at fleet scale,
where no real Karpenter runs. This module plays one autoscaled cluster's side of the system in
simulated time, as Karpenter really behaves (REFERENCE.md, "Autoscalers and scheduling gates";
`sigs.k8s.io/karpenter`, read for the rules, no code taken):

- **It sees only provisionable pods**: released by lockgate (ungated) *and* bound nowhere
  because no node had room (kube-scheduler marked them Unschedulable). A gated pod is never
  seen: `SimCluster.release` is the only way a pod reaches it.
- **Batching** (`provisioning/batcher.go`): a window opens at the first provisionable pod and
  closes after `batch_idle_seconds` (1 s) without a new one, or `batch_max_seconds` (10 s)
  after it opened, in simulated time.
- **Packing**: the batch, largest pods first, goes first onto NodeClaims still in flight (their
  pods are nominated to them), then onto new NodeClaims, each pod onto the first one it fits
  (first-fit decreasing). A NodeClaim's instance type is the smallest allowed one that holds
  its pods (Karpenter keeps every type that fits and the provider launches the cheapest;
  here, as in the kwok provider's families, smaller is cheaper).
- **Limits**: `spec.limits` caps the sum of the pool's node capacity, NodeClaims in flight
  included (`status.resources`); a type bigger than what remains is not used, and a pod that
  fits no type within what remains stays unschedulable (until capacity is given back).
- **Provisioning delay**: a NodeClaim becomes a Node `provisioning_seconds` after it is made
  (drawn from the seeded generator), and kube-scheduler then binds waiting pods to it.
- **Consolidation** (`WhenEmpty`): a pool node with no pod for `consolidate_after_seconds` is
  deleted. Nodes that are not the pool's (the cluster's fixed nodes) are never touched.

What it tells the scheduler is what the real watcher would: nodes as they register and go
(`SimEvent`, which the fleet simulator turns into `SchedulerState.set_node`), and the pool's
picture as `lockgate.events.ClusterGrowth` (`SimCluster.growth`).

The kube-scheduler part binds a released pod to the node the round suggested if it has room,
else to the first node with room, else marks it unschedulable; it binds waiting pods, oldest
first, whenever room appears (a node registers, a pod ends).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lockgate.events import ClusterGrowth, NodeClaimStatus, NodePoolStatus
from lockgate.placement import Requirement

RESOURCES = ("cpu", "memory")  # what the simulated nodes and pods are made of (canonical units)
CPU_LABEL = "karpenter.kwok.sh/instance-cpu"
MEMORY_LABEL = "karpenter.kwok.sh/instance-memory"


class AutoscalerError(ValueError):
    """A NodePool or a call the simulated autoscaler cannot work with; the message says which."""


@dataclass(frozen=True)
class InstanceType:
    """One instance type a NodePool may launch (capacity equals allocatable, as on kwok)."""

    name: str
    cpu: int  # millicores
    memory: int  # bytes

    @property
    def resources(self) -> dict[str, int]:
        return {"cpu": self.cpu, "memory": self.memory}

    def holds(self, used: Mapping[str, int]) -> bool:
        return used.get("cpu", 0) <= self.cpu and used.get("memory", 0) <= self.memory

    @property
    def labels(self) -> dict[str, str]:
        """The kwok provider's instance labels on its nodes (cpu in cores, memory in MiB)."""
        return {CPU_LABEL: f"{self.cpu / 1000:g}", MEMORY_LABEL: str(self.memory // 2**20)}

    def excluded_by(self, avoid: Iterable[Requirement]) -> bool:
        """Whether a pod whose node affinity has `avoid` (`NotIn` on instance labels, what
        lockgate adds to a pod it releases onto headroom) may not run on this type."""
        labels = self.labels
        return any(r.operator == "NotIn" and labels.get(r.key) in r.values for r in avoid)


@dataclass(frozen=True)
class NodePoolSpec:
    """One Karpenter NodePool: the instance types it may launch and its limits."""

    name: str
    instance_types: tuple[InstanceType, ...]
    # spec.limits in canonical units; a resource not named is not capped.
    limits: Mapping[str, int]
    provisioning_seconds: tuple[float, float] = (5.0, 60.0)
    consolidate_after_seconds: float = 30.0
    batch_idle_seconds: float = 1.0
    batch_max_seconds: float = 10.0

    def __post_init__(self) -> None:
        if not self.instance_types:
            raise AutoscalerError(f"NodePool {self.name}: needs at least one instance type")
        if any(t.cpu <= 0 or t.memory <= 0 for t in self.instance_types):
            raise AutoscalerError(f"NodePool {self.name}: instance types need cpu and memory")
        if any(amount < 0 for amount in self.limits.values()):
            raise AutoscalerError(f"NodePool {self.name}: limits must not be negative")
        low, high = self.provisioning_seconds
        if not 0 <= low <= high:
            raise AutoscalerError(f"NodePool {self.name}: provisioning_seconds is [low, high], "
                                  "0 <= low <= high")
        if self.consolidate_after_seconds < 0 or not (
                0 < self.batch_idle_seconds <= self.batch_max_seconds):
            raise AutoscalerError(f"NodePool {self.name}: consolidate_after must not be "
                                  "negative, 0 < batch idle <= batch max")

    @property
    def requirements(self) -> tuple[Requirement, ...]:
        """The pool's `spec.template.spec.requirements` on the kwok provider's instance labels
        (cpu in cores, memory in MiB, as AWS's are): which sizes it may launch."""
        kinds = self.by_size
        return (Requirement(key=CPU_LABEL, operator="In",
                            values=tuple(dict.fromkeys(t.labels[CPU_LABEL] for t in kinds))),
                Requirement(key=MEMORY_LABEL, operator="In",
                            values=tuple(dict.fromkeys(t.labels[MEMORY_LABEL] for t in kinds))))

    @property
    def by_size(self) -> list[InstanceType]:
        """Smallest first (the cheapest first, in the kwok provider's families)."""
        return sorted(self.instance_types, key=lambda t: (t.cpu, t.memory, t.name))

    def headroom(self, in_use: Mapping[str, int]) -> dict[str, int]:
        """What the pool may still add within its limits, in whole instances of one type: the
        type that adds the most (cpu, then memory). Issue 35: "rounded down to whole instances
        of the types that fit". A pool with no limit on cpu or memory has no finite headroom,
        which the simulator refuses (the fair model needs a finite cluster)."""
        if any(r not in self.limits for r in RESOURCES):
            raise AutoscalerError(f"NodePool {self.name}: the simulator needs limits on "
                                  f"{' and '.join(RESOURCES)}")
        best = (0, 0)
        for kind in self.instance_types:
            count = min((self.limits[r] - in_use.get(r, 0)) // kind.resources[r]
                        for r in RESOURCES)
            best = max(best, (max(0, count) * kind.cpu, max(0, count) * kind.memory))
        return {"cpu": best[0], "memory": best[1]}


@dataclass
class NodeClaim:
    name: str
    instance: InstanceType
    created_at: float
    ready_at: float
    node_name: str
    nominated: set[str] = field(default_factory=set)  # pods packed onto it while in flight
    registered: bool = False


@dataclass(frozen=True)
class SimEvent:
    """What the simulated cluster did, at simulated time `at`: a node registered (`allocatable`
    set), a node deleted (`allocatable` None, `pod` empty), or a pod bound to a node (`pod`)."""

    at: float
    node: str
    allocatable: Mapping[str, int] | None = None
    pod: str = ""

    @property
    def kind(self) -> str:
        return "bound" if self.pod else "added" if self.allocatable is not None else "removed"


@dataclass
class _Node:
    allocatable: dict[str, int]
    used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0))
    pods: int = 0
    pool: bool = False
    empty_since: float | None = None
    instance: InstanceType | None = None  # a pool node's type (None: a fixed node)

    def fits(self, requests: Mapping[str, int]) -> bool:
        return all(self.used[r] + requests.get(r, 0) <= self.allocatable.get(r, 0)
                   for r in RESOURCES)


class SimCluster:
    """One autoscaled cluster: its nodes, kube-scheduler binding pods, and one NodePool.

    Time only moves forward: every call gives the simulated time it happens at, and `advance`
    plays the autoscaler's own events (a batch closing, a NodeClaim registering, an empty node
    consolidated) up to a time, returning what happened in order."""

    def __init__(self, name: str, pool: NodePoolSpec, *, fixed_nodes: Mapping[str, Mapping[
            str, int]], rng: random.Random, clock_origin: float = 0.0) -> None:
        self.name = name
        self.pool = pool
        self._rng = rng
        self._origin = clock_origin  # epoch seconds of simulated time 0 (for ClusterGrowth)
        self.nodes: dict[str, _Node] = {n: _Node(dict(a)) for n, a in fixed_nodes.items()}
        self.claims: dict[str, NodeClaim] = {}
        self.bound: dict[str, str] = {}  # pod -> node
        self.requests: dict[str, dict[str, int]] = {}  # every pod this cluster holds
        # Released pods bound nowhere (kube-scheduler's unschedulable queue), oldest first.
        self.waiting: dict[str, float] = {}  # pod -> since
        self._nominated: dict[str, str] = {}  # waiting pod -> the claim in flight it waits for
        # Pods whose node affinity rules instance types out (lockgate's `avoid`), and what.
        self._avoid: dict[str, tuple[Requirement, ...]] = {}
        self._window: tuple[float, float] | None = None  # (opened, last pod) of the batch
        self._count = 0
        self.now = 0.0
        self.created = 0  # NodeClaims made
        self.created_by_type: dict[str, int] = {}  # NodeClaims made, by instance type
        self.consolidated = 0  # pool nodes deleted empty
        self.delays: list[float] = []  # each NodeClaim's provisioning delay
        self._by_size = pool.by_size
        self._in_flight: dict[str, NodeClaim] = {}  # claims not registered yet, by name
        self._empty: set[str] = set()  # pool nodes with no pod (consolidation candidates)

    # ---- kube-scheduler ------------------------------------------------------------------

    def release(self, pod: str, requests: Mapping[str, int], hint: str | None,
                at: float, *, avoid: Iterable[Requirement] = ()) -> str | None:
        """A pod lockgate released (ungated): bound to `hint` if it has room, else to the
        first node with room; None when no node has room (it is then provisionable).
        `avoid`: `NotIn` requirements on the instance labels its node affinity has (no node
        of, and no NodeClaim made as, a type they rule out is its)."""
        self._tick(at)
        if pod in self.requests:
            raise AutoscalerError(f"{self.name}: pod {pod} released twice")
        self.requests[pod] = {r: int(requests.get(r, 0)) for r in RESOURCES}
        avoid = tuple(avoid)
        if avoid:
            self._avoid[pod] = avoid
        node = self._fit(pod, hint)
        if node is not None:
            self._bind(pod, node, at)
            return node
        self.waiting[pod] = at
        self._provisionable(at)
        return None

    def finish(self, pod: str, at: float) -> list[SimEvent]:
        """A pod ended (or was deleted): its room is free; waiting pods may bind there."""
        self._tick(at)
        requests = self.requests.pop(pod, None)
        if requests is None:
            raise AutoscalerError(f"{self.name}: pod {pod} is not in this cluster")
        self._avoid.pop(pod, None)
        if self.waiting.pop(pod, None) is not None:
            self._unnominate(pod)
            return []
        node_name = self.bound.pop(pod)
        node = self.nodes[node_name]
        for resource, amount in requests.items():
            node.used[resource] -= amount
        node.pods -= 1
        if node.pods == 0 and node.pool:
            node.empty_since = at
            self._empty.add(node_name)
        return self._bind_waiting(at)

    def _fit(self, pod: str, hint: str | None) -> str | None:
        requests = self.requests[pod]
        avoid = self._avoid.get(pod, ())

        def allowed(node: _Node) -> bool:
            return node.fits(requests) and not (
                avoid and node.instance is not None and node.instance.excluded_by(avoid))

        if hint is not None and hint in self.nodes and allowed(self.nodes[hint]):
            return hint
        return next((name for name, node in self.nodes.items() if allowed(node)), None)

    def _bind(self, pod: str, node_name: str, at: float) -> None:
        node = self.nodes[node_name]
        requests = self.requests[pod]
        for resource in RESOURCES:
            node.used[resource] += requests[resource]
        node.pods += 1
        node.empty_since = None
        self._empty.discard(node_name)
        self.bound[pod] = node_name

    def _unnominate(self, pod: str) -> None:
        claim = self._nominated.pop(pod, None)
        if claim is not None and claim in self.claims:
            self.claims[claim].nominated.discard(pod)

    def _bind_waiting(self, at: float) -> list[SimEvent]:
        events: list[SimEvent] = []
        for pod in list(self.waiting):
            node = self._fit(pod, None)
            if node is None:
                continue
            del self.waiting[pod]
            self._unnominate(pod)
            self._bind(pod, node, at)
            events.append(SimEvent(at=at, node=node, pod=pod))
        return events

    # ---- Karpenter -------------------------------------------------------------------------

    def _provisionable(self, at: float) -> None:
        """A pod became provisionable at `at`: open the batch window, or keep it open."""
        self._window = (at, at) if self._window is None else (self._window[0], at)

    def _window_closes(self) -> float | None:
        if self._window is None:
            return None
        opened, last = self._window
        return min(last + self.pool.batch_idle_seconds, opened + self.pool.batch_max_seconds)

    def advance(self, to: float) -> list[SimEvent]:
        """Play the autoscaler's events up to `to`, in time order: batches close and make
        NodeClaims, NodeClaims register as nodes (and waiting pods bind), empty pool nodes are
        consolidated."""
        self._tick(to)
        events: list[SimEvent] = []
        while True:
            candidates: list[tuple[float, int, str]] = []
            closes = self._window_closes()
            if closes is not None:
                candidates.append((closes, 0, ""))
            for claim in self._in_flight.values():
                candidates.append((claim.ready_at, 1, claim.name))
            for name in self._empty:
                since = self.nodes[name].empty_since
                assert since is not None
                candidates.append((since + self.pool.consolidate_after_seconds, 2, name))
            if not candidates:
                break
            at, kind, name = min(candidates)
            if at > to:
                break
            if kind == 0:
                self._window = None
                self._provision(at)
            elif kind == 1:
                events.extend(self._register(self.claims[name], at))
            else:
                events.append(self._consolidate(name, at))
        return events

    def _provision(self, at: float) -> None:
        """Close the batch: pack every provisionable pod not yet nominated to a claim."""
        batch = sorted((p for p in self.waiting if p not in self._nominated),
                       key=lambda p: (-self.requests[p]["cpu"], -self.requests[p]["memory"], p))
        if not batch:
            return
        in_flight = list(self._in_flight.values())
        packed: dict[str, dict[str, int]] = {c.name: self._packed(c) for c in in_flight}
        # The batch's new claims: their pods, what they hold, the smallest type holding it;
        # `reserved` is the pool's usage with each new claim counted at that type.
        new: list[tuple[list[str], dict[str, int], InstanceType]] = []
        reserved = self.in_use()
        for pod in batch:
            requests = self.requests[pod]
            avoid = self._avoid.get(pod, ())
            home = next((c for c in in_flight if c.instance.holds(
                _plus(packed[c.name], requests)) and not (
                    avoid and c.instance.excluded_by(avoid))), None)
            if home is not None:
                home.nominated.add(pod)
                self._nominated[pod] = home.name
                packed[home.name] = _plus(packed[home.name], requests)
                continue
            for index, (pods, holding, instance) in enumerate(new):
                grown = _plus(holding, requests)
                kind = self._smallest_holding(grown, (
                    *avoid, *(r for p in pods for r in self._avoid.get(p, ()))))
                if kind is None:
                    continue
                after = _plus(_minus(reserved, instance.resources), kind.resources)
                if self._within_limits(after):
                    pods.append(pod)
                    new[index] = (pods, grown, kind)
                    reserved = after
                    break
            else:
                alone = self._smallest_holding(requests, avoid)
                if alone is not None and self._within_limits(_plus(reserved, alone.resources)):
                    new.append(([pod], dict(requests), alone))
                    reserved = _plus(reserved, alone.resources)
                # else: no type holds it within the pool's limits; it stays unschedulable.
        for pods, _, instance in new:
            self._count += 1
            delay = self._rng.uniform(*self.pool.provisioning_seconds)
            claim = NodeClaim(name=f"{self.pool.name}-{self._count:05d}", instance=instance,
                              created_at=at, ready_at=at + delay,
                              node_name=f"{self.name}-{self.pool.name}-{self._count:05d}",
                              nominated=set(pods))
            self.claims[claim.name] = claim
            self._in_flight[claim.name] = claim
            self._nominated.update(dict.fromkeys(pods, claim.name))
            self.created += 1
            self.created_by_type[instance.name] = self.created_by_type.get(instance.name, 0) + 1
            self.delays.append(delay)

    def _packed(self, claim: NodeClaim) -> dict[str, int]:
        total = dict.fromkeys(RESOURCES, 0)
        for pod in claim.nominated:
            total = _plus(total, self.requests[pod])
        return total

    def _smallest_holding(self, holding: Mapping[str, int],
                          avoid: tuple[Requirement, ...] = ()) -> InstanceType | None:
        """The cheapest type that holds `holding` and that no pod's affinity rules out."""
        return next((t for t in self._by_size if t.holds(holding) and not (
            avoid and t.excluded_by(avoid))), None)

    def _within_limits(self, usage: Mapping[str, int]) -> bool:
        return all(usage.get(r, 0) <= limit for r, limit in self.pool.limits.items())

    def _register(self, claim: NodeClaim, at: float) -> list[SimEvent]:
        claim.registered = True
        del self._in_flight[claim.name]
        for pod in claim.nominated:
            self._nominated.pop(pod, None)
        claim.nominated.clear()
        node = _Node(dict(claim.instance.resources), pool=True, empty_since=at,
                     instance=claim.instance)
        self.nodes[claim.node_name] = node
        self._empty.add(claim.node_name)
        events = [SimEvent(at=at, node=claim.node_name, allocatable=dict(node.allocatable))]
        events.extend(self._bind_waiting(at))
        if any(p not in self._nominated for p in self.waiting):
            self._provisionable(at)  # pods it was made for bound elsewhere, or more came
        return events

    def _consolidate(self, node_name: str, at: float) -> SimEvent:
        del self.nodes[node_name]
        self._empty.discard(node_name)
        claim = next(c for c in self.claims.values() if c.node_name == node_name)
        del self.claims[claim.name]
        self.consolidated += 1
        if any(p not in self._nominated for p in self.waiting):
            self._provisionable(at)  # capacity given back: pods over the limits may fit now
        return SimEvent(at=at, node=node_name)

    # ---- what the watcher would see -----------------------------------------------------

    def in_use(self) -> dict[str, int]:
        """The pool's `status.resources`: every NodeClaim's capacity, in flight or a node."""
        total = dict.fromkeys(RESOURCES, 0)
        for claim in self.claims.values():
            total = _plus(total, claim.instance.resources)
        return total

    def headroom(self) -> dict[str, int]:
        return self.pool.headroom(self.in_use())

    def pool_nodes(self) -> int:
        """NodeClaims alive: nodes of the pool and those in flight."""
        return len(self.claims)

    def growth(self) -> ClusterGrowth:
        """The cluster's growth picture as the watcher publishes it."""
        return ClusterGrowth(
            cluster=self.name, observed_at=self._when(self.now), autoscaled=True,
            node_pools=[NodePoolStatus(name=self.pool.name, limits=dict(self.pool.limits),
                                       in_use=self.in_use(),
                                       requirements=self.pool.requirements)],
            node_claims=[NodeClaimStatus(
                name=c.name, node_pool=self.pool.name, created_at=self._when(c.created_at),
                allocatable=dict(c.instance.resources), launched=True,
                node_name=c.node_name if c.registered else "", registered=c.registered,
                initialized=c.registered) for c in self.claims.values()])

    def _when(self, at: float) -> datetime:
        return datetime.fromtimestamp(self._origin + at, tz=UTC)

    def _tick(self, at: float) -> None:
        if at < self.now:
            raise AutoscalerError(f"{self.name}: time went back from {self.now} to {at}")
        self.now = at


def _plus(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {r: a.get(r, 0) + b.get(r, 0) for r in RESOURCES}


def _minus(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {r: a.get(r, 0) - b.get(r, 0) for r in RESOURCES}


def fewest_nodes(needed: Mapping[str, float], instance_types: Iterable[InstanceType]) -> int:
    """A lower bound on the nodes that hold `needed` (cpu, memory): no fewer than the biggest
    type's count for each resource alone."""
    kinds = list(instance_types)
    biggest = {r: max(t.resources[r] for t in kinds) for r in RESOURCES}
    # Fluid amounts from the model: a millionth of a node is the solver's rounding.
    return max(0, *(math.ceil(needed.get(r, 0.0) / biggest[r] - 1e-6) for r in RESOURCES))


__all__ = ["AutoscalerError", "InstanceType", "NodeClaim", "NodePoolSpec", "SimCluster",
           "SimEvent", "fewest_nodes"]
