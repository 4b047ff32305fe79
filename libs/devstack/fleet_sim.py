"""The fleet simulator: lockgate's real, pure scheduler driven by a simulated clock.

Why: claims about fairness and round time at the scale of 50 clusters and a million queued pods
cannot be checked on a local stack. Here they are checked on the production algorithm
(`SchedulerState`, `schedule_round`, `plan_evictions`), with no I/O, and judged against the
independent model of the constrained fair allocation (`devstack.fair_model`), which never
imports the scheduler.

A scenario (YAML under bench/scenarios/, keys in `Scenario`) gives clusters and their nodes,
queues and their weights, and jobs: a Poisson arrival process over part of the day, runtimes,
shapes, pod groups and the clusters each queue's pods are pinned to. Each simulated round:
arrivals join the state, finished pods leave it, the round releases pods (they run at once on
the node the round placed them on), and, with preemption on, evicted pods are recreated at the
back of their queue (as a Deployment's would be).

What is measured: each round's wall time (p50, p99); memory, as the peak RSS the run added per
job the state held at its fullest; utilisation per cluster; and, at samples, each queue's
deviation from the model's fair allocation, in pods of its most common shape, judged only once
the fleet has been contested (some cluster's demand exceeds its capacity) for the longest runtime
without a break (`Report.settled`). The deviation is judged for each queue in each cluster it
asks in, against the split of the fair allocation nearest what the queues hold
(`fair_model.nearest_split`): the fair shares are unique, their split across clusters need not
be, and any split that gives every queue its share is a fair target. Each queue's deviation on
its total is reported too.

`scale` shrinks jobs and queues linearly and clusters and nodes by its square root each, so that
capacity shrinks with demand and a contested fleet stays contested.

Scenario (e) (`tree`, `history`; issue 36): the queues are the leaves of a three-level tree with
guarantees on some teams, given to the state as the leader's are, and usage decays on the
simulated clock through the leader's own bookkeeping (`UsageHistory`). It is judged against the
hierarchical model (`fair_model.hierarchical_allocation`) with weights from the judge's own
decayed usage (`fair_model.DecayedUsageModel`, `history_effective_weights`), per level, and the
time an idle guaranteed team takes to get its guarantee back is measured (`_TreeRun`).
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import heapq
import itertools
import math
import random
import resource
import statistics
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from devstack.fair_model import (
    Cluster,
    DecayedUsageModel,
    Demand,
    FairAllocation,
    TreeQueue,
    fair_allocation,
    hierarchical_allocation,
    history_effective_weights,
    nearest_split,
)
from devstack.sim_autoscaler import (
    AutoscalerError,
    InstanceType,
    NodePoolSpec,
    SimCluster,
    SimEvent,
    fewest_nodes,
)
from lockgate.events import ClusterGrowth
from lockgate.growth import GrowthPolicy
from lockgate.jobs import JobState
from lockgate.queues import QueueSpec
from lockgate.resources import Resources
from lockgate.scheduler import (
    Eviction,
    FairTargets,
    NodeInfo,
    PreemptionPolicy,
    RoundResult,
    SchedJob,
    SchedulerState,
    SkipReason,
    TargetsKey,
    plan_evictions,
    schedule_round,
)
from lockgate.scheduler.collection import RoundCollector, collect_for_large_state
from lockgate.scheduler.history import UsageHistory
from lockgate_adapters.targets_worker import TargetsWorker

GI = 2**30
EPOCH = 1_700_000_000.0  # the simulated day starts here (epoch seconds)


class ScenarioError(ValueError):
    """A scenario file that cannot be simulated; the message names the file and the key."""


@dataclass(frozen=True)
class Shape:
    cpu: float
    memory_gi: float
    weight: float = 1.0  # how often a queue has this shape, relative to the others


@dataclass(frozen=True)
class Targets:
    """What scenario (a) must reach at scale 1 (issue 17); None: not judged."""

    round_p99_ms: float | None = None
    contested_utilisation_min: float | None = None
    deviation_pods_max: float | None = None
    # Scenario (d): NodeClaims made, against the fewest nodes the fair allocation needs.
    nodes_provisioned_ratio_max: float | None = None


@dataclass(frozen=True)
class Autoscaling:
    """Scenario (d): the last `fraction` of the clusters grow and shrink under one Karpenter
    NodePool each (devstack.sim_autoscaler), from `fixed_nodes` nodes of the scenario's node
    shape that are not the pool's (a fixed node group, never consolidated). Limits are per
    cluster at scale 1 and shrink with `scale` as nodes do (by its square root), rounded down
    to whole instances of the biggest type."""

    fraction: float
    fixed_nodes: int
    limits_cpu: int
    limits_memory_gi: int
    instance_types: tuple[tuple[str, float, float], ...]  # (name, cpu, memory_gi)
    provisioning_seconds: tuple[float, float] = (5.0, 60.0)
    consolidate_after_seconds: float = 30.0
    # The leader's GrowthPolicy.max_nodes_per_pool (0: enough to cover the pool's limits).
    max_nodes_per_pool: int = 0
    # Pods released onto headroom carry the node affinity lockgate asks for
    # (`GrowthNote.avoid`: no instance type smaller than the virtual node they were placed on),
    # so Karpenter makes the size lockgate counted. False: they go as they came.
    steer_instance_size: bool = False
    # The leader's GrowthPolicy.gather_seconds (None: its default).
    gather_seconds: float | None = None

    def node_pool(self, scale: float) -> NodePoolSpec:
        types = tuple(InstanceType(name, int(cpu * 1000), int(memory_gi * GI))
                      for name, cpu, memory_gi in self.instance_types)
        if not types:
            raise AutoscalerError("the NodePool needs at least one instance type")
        biggest = max(types, key=lambda t: (t.cpu, t.memory))
        whole = max(1, math.floor(min(self.limits_cpu * 1000 * math.sqrt(scale) / biggest.cpu,
                                      self.limits_memory_gi * GI * math.sqrt(scale)
                                      / biggest.memory)))
        return NodePoolSpec(
            name="default", instance_types=types,
            limits={"cpu": whole * biggest.cpu, "memory": whole * biggest.memory},
            provisioning_seconds=self.provisioning_seconds,
            consolidate_after_seconds=self.consolidate_after_seconds)


@dataclass(frozen=True)
class TreeSpec:
    """Scenario (e): the queues become the leaves of a three-level tree, root -> divisions ->
    teams -> leaves (issue 36). Leaf i hangs from team i mod teams, team j from division
    j mod divisions; weights are drawn per node from the lists (a leaf keeps the queue's
    weight). The first `guaranteed_teams` (a fraction, at least one) of the teams are given a
    guarantee of `guarantee_times_share` times an equal split of the fleet among teams (cpu
    and memory). The first guaranteed team sends nothing until `idle_until` (a fraction of the
    day), while the others borrow its room; then `burst_times_guarantee` times its guarantee
    arrives at once, spread over its leaves, and the time until it holds its guarantee (or its
    fair target, if lower) is measured. With `scale`, divisions and teams per division shrink
    by its cube root each (the leaves, as queues do, linearly)."""

    divisions: int
    teams_per_division: int
    division_weights: tuple[float, ...] = (1.0,)
    team_weights: tuple[float, ...] = (1.0,)
    guaranteed_teams: float = 0.1
    guarantee_times_share: float = 2.0
    idle_until: float = 0.25
    burst_times_guarantee: float = 1.5
    # How long after the burst evictions are planned (None: all day, as `preemption` alone
    # says). Every pod is preemptible all day; a window keeps a long run short where planning
    # is what costs (scenario (e) had 2 h while `plan_evictions` took 0.5 s a round at 0.01).
    preempt_for_seconds: float | None = None

    def scaled(self, scale: float) -> TreeSpec:
        root = scale ** (1 / 3)
        return replace(self, divisions=max(2, round(self.divisions * root)),
                       teams_per_division=max(2, round(self.teams_per_division * root)))


@dataclass(frozen=True)
class HistorySpec:
    """Usage that decays (issue 36; the leader's LOCKGATE_SCHEDULER_HISTORY_* settings), kept
    on the simulated clock."""

    half_life_seconds: float
    recompute_seconds: float = 60.0
    tolerance: float = 0.05


@dataclass(frozen=True)
class Scenario:
    name: str
    clusters: int
    nodes_per_cluster: int
    node_cpu: int
    node_memory_gi: int
    queues: int
    weights: tuple[float, ...]
    clusters_per_queue: int
    shapes: tuple[Shape, ...]
    jobs: int
    duration_seconds: float
    arrival_fraction: float
    runtime_seconds: tuple[float, float]
    round_seconds: float
    sample_seconds: float
    hot_fraction: float = 1.0  # the first this fraction of clusters are the hot ones
    hot_queues: float = 0.0  # the fraction of queues pinned to hot clusters only
    # Whether a queue's share of the arrivals follows its weight (a team given more of the
    # fleet sends more work) rather than being the same for every queue.
    arrivals_by_weight: bool = False
    gang_fraction: float = 0.0  # the fraction of arrivals that are pod groups
    gang_size: int = 0
    preemption: bool = False
    max_decisions: int = 10_000
    max_lookback_per_queue: int = 100
    room_hold_seconds: float | None = 120.0
    room_holds_per_queue: int = 1
    # The leader's LOCKGATE_SCHEDULER_TARGETS_WORKER_MIN_DEMANDS: fair targets with at least
    # this many demands are solved in a worker process between rounds (0: always).
    targets_worker_min_demands: int = 200
    scale: float = 1.0
    targets: Targets = field(default_factory=Targets)
    autoscaling: Autoscaling | None = None
    tree: TreeSpec | None = None  # scenario (e)
    history: HistorySpec | None = None

    @classmethod
    def load(cls, path: Path) -> Scenario:
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as error:
            raise ScenarioError(f"{path}: {error}") from error
        return cls.from_mapping(data, source=str(path))

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "scenario") -> Scenario:
        if not isinstance(data, dict):
            raise ScenarioError(f"{source}: a scenario is a mapping of keys, not {type(data)}")

        def need(key: str, kind: Callable[[Any], Any], where: Mapping[str, Any] = data) -> Any:
            if key not in where:
                raise ScenarioError(f"{source}: `{key}` is missing")
            try:
                return kind(where[key])
            except (TypeError, ValueError) as error:
                raise ScenarioError(f"{source}: `{key}`: {error}") from error

        clusters = need("clusters", dict)
        queues = need("queues", dict)
        gangs = data.get("gangs") or {}
        runtime = need("runtime_seconds", list)
        if len(runtime) != 2 or not 0 < float(runtime[0]) <= float(runtime[1]):
            raise ScenarioError(f"{source}: `runtime_seconds` is [low, high], 0 < low <= high")
        shapes = tuple(Shape(float(s["cpu"]), float(s["memory_gi"]), float(s.get("weight", 1)))
                       for s in need("shapes", list))
        if not shapes:
            raise ScenarioError(f"{source}: `shapes` needs at least one shape")
        targets = data.get("targets") or {}
        autoscaling = _autoscaling(data.get("autoscaling"), source)
        scenario = cls(
            name=str(data.get("name", source)),
            clusters=need("count", int, clusters),
            nodes_per_cluster=need("nodes", int, clusters),
            node_cpu=need("cpu", int, clusters),
            node_memory_gi=need("memory_gi", int, clusters),
            queues=need("count", int, queues),
            weights=tuple(float(w) for w in need("weights", list, queues)),
            clusters_per_queue=need("clusters_per_queue", int),
            shapes=shapes,
            jobs=need("jobs", int),
            duration_seconds=need("duration_seconds", float),
            arrival_fraction=float(data.get("arrival_fraction", 0.5)),
            runtime_seconds=(float(runtime[0]), float(runtime[1])),
            round_seconds=float(data.get("round_seconds", 10)),
            sample_seconds=float(data.get("sample_seconds", 3600)),
            hot_fraction=float(data.get("hot_fraction", 1.0)),
            hot_queues=float(data.get("hot_queues", 0.0)),
            arrivals_by_weight=bool(data.get("arrivals_by_weight", False)),
            gang_fraction=float(gangs.get("fraction", 0.0)),
            gang_size=int(gangs.get("size", 0)),
            preemption=bool(data.get("preemption", False)),
            max_decisions=int(data.get("max_decisions", cls.max_decisions)),
            max_lookback_per_queue=int(data.get("max_lookback_per_queue",
                                                cls.max_lookback_per_queue)),
            # The leader's LOCKGATE_SCHEDULER_ROOM_HOLD_SECONDS; 0 turns holds off.
            room_hold_seconds=float(data.get("room_hold_seconds", cls.room_hold_seconds or 0))
            or None,
            room_holds_per_queue=int(data.get("room_holds_per_queue",
                                              cls.room_holds_per_queue)),
            targets_worker_min_demands=int(data.get("targets_worker_min_demands",
                                                    cls.targets_worker_min_demands)),
            scale=float(data.get("scale", 1.0)),
            targets=Targets(**{k: float(v) for k, v in targets.items()}),
            autoscaling=autoscaling,
            tree=_tree(data.get("tree"), source),
            history=_history(data.get("history"), source),
        )
        if scenario.clusters < 1 or scenario.nodes_per_cluster < 1 or scenario.queues < 1:
            raise ScenarioError(f"{source}: clusters, nodes and queues must be 1 or more")
        if not scenario.weights or min(scenario.weights) <= 0:
            raise ScenarioError(f"{source}: queue weights must be positive")
        if scenario.max_decisions < 1 or scenario.room_holds_per_queue < 1 or (
                scenario.max_lookback_per_queue < 0) or scenario.targets_worker_min_demands < 0 or (
                scenario.room_hold_seconds is not None and scenario.room_hold_seconds < 0):
            raise ScenarioError(f"{source}: max_decisions and room_holds_per_queue must be 1 or "
                                "more, max_lookback_per_queue, room_hold_seconds and "
                                "targets_worker_min_demands not negative")
        if scenario.gang_fraction and scenario.gang_size < 2:
            raise ScenarioError(f"{source}: `gangs.size` must be 2 or more")
        return scenario

    def node_pool(self) -> NodePoolSpec | None:
        return None if self.autoscaling is None else self.autoscaling.node_pool(self.scale)

    def scaled(self, scale: float) -> Scenario:
        if not 0 < scale <= 1:
            raise ScenarioError(f"{self.name}: scale must be in (0, 1], not {scale}")
        root = math.sqrt(scale)
        return replace(
            self, scale=scale, jobs=max(10, round(self.jobs * scale)),
            tree=None if self.tree is None else self.tree.scaled(scale),
            queues=max(2, round(self.queues * scale)),
            clusters=max(1, round(self.clusters * root)),
            nodes_per_cluster=max(1, round(self.nodes_per_cluster * root)))


def _tree(data: Any, source: str) -> TreeSpec | None:
    """The scenario's `tree` key (scenario (e)); None when it has none."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: `tree` is a mapping of keys")
    try:
        tree = TreeSpec(
            divisions=int(data["divisions"]), teams_per_division=int(data["teams_per_division"]),
            division_weights=tuple(float(w) for w in data.get("division_weights", [1])),
            team_weights=tuple(float(w) for w in data.get("team_weights", [1])),
            guaranteed_teams=float(data.get("guaranteed_teams", 0.1)),
            guarantee_times_share=float(data.get("guarantee_times_share", 2.0)),
            idle_until=float(data.get("idle_until", 0.25)),
            burst_times_guarantee=float(data.get("burst_times_guarantee", 1.5)),
            preempt_for_seconds=None if data.get("preempt_for_seconds") is None
            else float(data["preempt_for_seconds"]))
    except KeyError as error:
        raise ScenarioError(f"{source}: `tree`: {error} is missing") from error
    except (TypeError, ValueError) as error:
        raise ScenarioError(f"{source}: `tree`: {error}") from error
    if tree.divisions < 1 or tree.teams_per_division < 1 or not tree.division_weights or (
            not tree.team_weights) or min(*tree.division_weights, *tree.team_weights) <= 0:
        raise ScenarioError(f"{source}: `tree`: divisions and teams 1 or more, weights positive")
    if not 0 < tree.guaranteed_teams <= 1 or tree.guarantee_times_share <= 0 or (
            tree.guaranteed_teams * tree.guarantee_times_share > 1) or (
            not 0 <= tree.idle_until < 1) or tree.burst_times_guarantee <= 0:
        raise ScenarioError(f"{source}: `tree`: guaranteed_teams in (0, 1], their guarantees "
                            "together at most the fleet (guaranteed_teams x "
                            "guarantee_times_share <= 1), idle_until in [0, 1), "
                            "burst_times_guarantee positive")
    return tree


def _history(data: Any, source: str) -> HistorySpec | None:
    """The scenario's `history` key; None: history off (today's instantaneous fairness)."""
    if data is None:
        return None
    if not isinstance(data, dict) or "half_life_seconds" not in data:
        raise ScenarioError(f"{source}: `history` needs `half_life_seconds` (history on "
                            "without a half-life is an error, as in the leader)")
    try:
        history = HistorySpec(half_life_seconds=float(data["half_life_seconds"]),
                              recompute_seconds=float(data.get("recompute_seconds", 60)),
                              tolerance=float(data.get("tolerance", 0.05)))
    except (TypeError, ValueError) as error:
        raise ScenarioError(f"{source}: `history`: {error}") from error
    if history.half_life_seconds <= 0 or history.recompute_seconds <= 0 or (
            not 0 <= history.tolerance < 1):
        raise ScenarioError(f"{source}: `history`: half-life and recompute period positive, "
                            "tolerance in [0, 1)")
    return history


def _autoscaling(data: Any, source: str) -> Autoscaling | None:
    """The scenario's `autoscaling` key (scenario (d)); None when it has none."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: `autoscaling` is a mapping of keys")
    try:
        pool = data["node_pool"]
        limits = pool["limits"]
        delay = pool.get("provisioning_seconds", [5, 60])
        autoscaling = Autoscaling(
            fraction=float(data["fraction"]), fixed_nodes=int(data.get("fixed_nodes", 0)),
            limits_cpu=int(limits["cpu"]), limits_memory_gi=int(limits["memory_gi"]),
            instance_types=tuple((str(t["name"]), float(t["cpu"]), float(t["memory_gi"]))
                                 for t in pool["instance_types"]),
            provisioning_seconds=(float(delay[0]), float(delay[1])),
            consolidate_after_seconds=float(pool.get("consolidate_after_seconds", 30)),
            max_nodes_per_pool=int(data.get("max_nodes_per_pool", 0)),
            steer_instance_size=bool(data.get("steer_instance_size", False)),
            gather_seconds=(None if data.get("gather_seconds") is None
                            else float(data["gather_seconds"])))
    except KeyError as error:
        raise ScenarioError(f"{source}: `autoscaling`: {error} is missing") from error
    except (TypeError, ValueError, IndexError) as error:
        raise ScenarioError(f"{source}: `autoscaling`: {error}") from error
    if autoscaling.gather_seconds is not None and autoscaling.gather_seconds < 0:
        raise ScenarioError(f"{source}: `autoscaling.gather_seconds` must not be negative")
    if not 0 < autoscaling.fraction <= 1 or min(autoscaling.fixed_nodes,
                                                 autoscaling.max_nodes_per_pool) < 0:
        raise ScenarioError(f"{source}: `autoscaling.fraction` is in (0, 1], `fixed_nodes` "
                            "and `max_nodes_per_pool` not negative")
    try:
        autoscaling.node_pool(1.0)
    except (AutoscalerError, ValueError) as error:
        raise ScenarioError(f"{source}: `autoscaling.node_pool`: {error}") from error
    return autoscaling


@dataclass
class Sample:
    at: float  # simulated seconds
    contested: tuple[str, ...]
    deviation_pods: dict[str, float]  # queue -> (held - fair) in pods of its common shape
    # queue -> its largest |held - part| in a cluster, in pods, at the fair split nearest the
    # holding (`fair_model.nearest_split`): what the target "in each cluster" is judged on.
    cluster_deviation_pods: dict[str, float]
    # The queues at saturation: pods waiting in every cluster they ask in (their target is
    # less than their demand everywhere, so it moves with weights and pinning, not with their
    # own arrivals); the judged deviation is theirs.
    saturated_queues: frozenset[str]
    saturated: bool  # every cluster contested, every queue at saturation
    utilisation: dict[str, float]  # cluster -> cpu used / cpu there
    queued: int
    model_seconds: float
    # Autoscaled clusters only (scenario (d)): NodeClaims alive (nodes of the pool and those in
    # flight), and the fewest pool nodes the fair split nearest the holding needs there
    # (`sim_autoscaler.fewest_nodes` over what it gives the cluster beyond its fixed nodes).
    pool_nodes: dict[str, int] = field(default_factory=dict)
    fewest_nodes: dict[str, int] = field(default_factory=dict)
    waiting_for_nodes: int = 0  # released pods no node had room for (yet)
    # Scenario (e): per level of the tree ("leaf", "team", "division"), each node's held share
    # less its fair share by the hierarchical model, in pods of the fleet's smallest shape
    # (signed); and the nodes whose every leaf with demand is at saturation (judged).
    level_deviation: dict[str, dict[str, float]] = field(default_factory=dict)
    level_saturated: frozenset[str] = frozenset()


@dataclass
class Report:
    scenario: Scenario
    round_ms: list[float] = field(default_factory=list)
    # Rounds that used fair targets solved in the worker; the seconds each solve took there
    # (how stale they are, beyond a round), and the leader's own time handing a problem over.
    rounds_with_worker_targets: int = 0
    worker_solve_ms: list[float] = field(default_factory=list)
    handoff_ms: list[float] = field(default_factory=list)
    # With preemption: each round's `plan_evictions` time (not in the round's time: the
    # simulator has always timed `schedule_round` alone).
    eviction_plan_ms: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    peak_jobs: int = 0
    rss_added_bytes: int = 0
    worker_rss_bytes: int = 0  # the targets worker's peak RSS (0: it never ran)
    evictions: int = 0
    created: int = 0  # pods: every arrival's, and each evicted pod's replacement
    released: int = 0
    wall_seconds: float = 0.0
    # Every decision the run made, in order: each round's releases (job and node) and
    # evictions. Deterministic for a seed, so a change to the scheduler that must not change
    # what it decides is checked digest for digest (`decisions_digest`); why each job waited
    # is digested apart (`skipped_digest`), as reasons may be reworded without a decision
    # changing.
    decisions: Any = field(default_factory=hashlib.sha256)
    skipped: Any = field(default_factory=hashlib.sha256)
    # Scenario (d): each autoscaled cluster's simulated side (its Karpenter's counts), and the
    # released pods that found no node with room (what the autoscaler is asked to grow for).
    autoscaled: dict[str, SimCluster] = field(default_factory=dict)
    released_unschedulable: int = 0
    tree: _TreeRun | None = None  # scenario (e)
    # Pods released for growth: seconds from the first round that owed them a node that may
    # exist (released for growth, or held to gather a node's worth) to their binding. What
    # gathering and provisioning cost the pods owed room.
    growth_waits: list[float] = field(default_factory=list)

    def record_round(self, number: int, result: RoundResult) -> None:
        self.decisions.update(f"round {number}\n".encode())
        self.decisions.update("".join(f"release {d.job_id} {d.node_hint}\n"
                                      for d in result.decisions).encode())
        self.skipped.update(f"round {number}\n".encode())
        self.skipped.update("".join(f"{job} {reason.value}\n" for job, reason
                                    in sorted(result.skipped_jobs.items())).encode())

    def record_evictions(self, evictions: list[Eviction]) -> None:
        self.decisions.update("".join(f"evict {e.job_id} {e.node} for {e.for_job}\n"
                                      for e in evictions).encode())

    def _contested_utilisation(self) -> list[float]:
        return [sample.utilisation[c] for sample in self.samples for c in sample.contested]

    def settled(self) -> list[Sample]:
        """Samples taken after the fleet had been contested without a break for the longest
        runtime: then no pod released before the contest still runs, and the allocation is the
        scheduler's answer to the contest (without preemption, earlier releases keep their room
        until they finish)."""
        settled: list[Sample] = []
        since: float | None = None
        for sample in self.samples:
            if not sample.contested:
                since = None
                continue
            since = sample.at if since is None else since
            if sample.at - since >= self.scenario.runtime_seconds[1]:
                settled.append(sample)
        return settled

    def summary(self) -> dict[str, Any]:
        rounds = sorted(self.round_ms) or [0.0]
        contested = [s for s in self.samples if s.contested]
        settled = self.settled()
        # Judged: each queue at saturation in each cluster, against the fair split nearest the
        # holding. Reported: every queue so, and every queue on its total.
        deviations = [d for s in settled for q, d in s.cluster_deviation_pods.items()
                      if q in s.saturated_queues]
        every = [d for s in settled for d in s.cluster_deviation_pods.values()]
        totals = [abs(d) for s in settled for d in s.deviation_pods.values()]
        saturated = [s for s in settled if s.saturated]
        at_saturation = [d for s in saturated for d in s.cluster_deviation_pods.values()]
        utilisation = self._contested_utilisation()
        autoscaling = self.scenario.autoscaling
        fixed_clusters = self.scenario.clusters - len(self.autoscaled)
        summary: dict[str, Any] = {
            "scenario": self.scenario.name, "scale": self.scenario.scale,
            "clusters": self.scenario.clusters,
            # At the start (an autoscaled cluster starts from its fixed nodes).
            "nodes": fixed_clusters * self.scenario.nodes_per_cluster + len(self.autoscaled) * (
                autoscaling.fixed_nodes if autoscaling else 0),
            "queues": self.scenario.queues, "jobs": self.scenario.jobs,
            "rounds": len(self.round_ms),
            "round_ms_p50": round(statistics.median(rounds), 2),
            "round_ms_p99": round(rounds[min(len(rounds) - 1, int(len(rounds) * 0.99))], 2),
            "round_ms_max": round(rounds[-1], 2),
            "rounds_with_worker_targets": self.rounds_with_worker_targets,
            "worker_solve_ms_p50": _percentile(self.worker_solve_ms, 0.5),
            "worker_solve_ms_p99": _percentile(self.worker_solve_ms, 0.99),
            "handoff_ms_p99": _percentile(self.handoff_ms, 0.99),
            "eviction_plan_ms_p50": _percentile(self.eviction_plan_ms, 0.5),
            "eviction_plan_ms_p99": _percentile(self.eviction_plan_ms, 0.99),
            "created": self.created, "released": self.released, "evictions": self.evictions,
            "peak_jobs_held": self.peak_jobs,
            "peak_queued": max((s.queued for s in self.samples), default=0),
            "bytes_per_job_held": round(self.rss_added_bytes / max(1, self.peak_jobs)),
            "worker_peak_rss_mib": round(self.worker_rss_bytes / 2**20, 1),
            "samples": len(self.samples), "contested_samples": len(contested),
            "settled_samples": len(self.settled()),
            "contested_utilisation_min": round(min(utilisation), 4) if utilisation else None,
            "deviation_pods_max": round(max(deviations), 2) if deviations else None,
            "deviation_pods_p99": round(sorted(deviations)[int(len(deviations) * 0.99)], 2)
            if deviations else None,
            # Reported, not judged: the same for every queue (those not at saturation too),
            # and on each queue's total (over all its clusters).
            "deviation_every_queue_pods_max": round(max(every), 2) if every else None,
            "deviation_total_pods_max": round(max(totals), 2) if totals else None,
            "queues_at_saturation_min": min((len(s.saturated_queues) for s in settled),
                                            default=0),
            # Reported, not judged: every queue's, over the settled samples where every
            # queue is at saturation (rare in a pinned fleet: a queue is given all it asks
            # somewhere).
            "saturated_samples": len(saturated),
            "deviation_pods_max_saturated": round(max(at_saturation), 2)
            if at_saturation else None,
            "wall_seconds": round(self.wall_seconds, 1),
            "decisions_digest": self.decisions.hexdigest(),
            "skipped_digest": self.skipped.hexdigest(),
        }
        if self.autoscaled:
            summary.update(self._growth_summary())
        if self.tree is not None:
            summary.update(self.tree.figures())
            summary.update(self._level_summary(settled))
        summary["verdicts"] = self.verdicts(summary)
        return summary

    def _level_summary(self, settled: list[Sample]) -> dict[str, Any]:
        """Scenario (e): the largest |held - fair| per level of the tree over the settled
        samples, in pods of the fleet's smallest shape (a subtree mixes shapes), for the nodes
        at saturation (every leaf under them with demand is) and for every node."""
        levels = ("leaf", "team", "division")
        at_saturation: dict[str, list[float]] = {level: [] for level in levels}
        every: dict[str, list[float]] = {level: [] for level in levels}
        for sample in settled:
            for level, nodes in sample.level_deviation.items():
                for node, deviation in nodes.items():
                    every[level].append(abs(deviation))
                    if node in sample.level_saturated:
                        at_saturation[level].append(abs(deviation))
        return {
            "deviation_by_level_saturated_pods": {
                level: round(max(values), 2) if values else None
                for level, values in at_saturation.items()},
            "deviation_by_level_every_node_pods": {
                level: round(max(values), 2) if values else None
                for level, values in every.items()},
        }

    def _growth_summary(self) -> dict[str, Any]:
        """Scenario (d)'s figures: what the autoscalers did, against the fewest nodes the fair
        allocation needs. `nodes_fewest` sums, over the autoscaled clusters, the most pool nodes
        any sample's fair split needed there; `nodes_provisioned` counts every NodeClaim made
        (a node consolidated and made again counts twice)."""
        pool = self.scenario.node_pool()
        assert pool is not None
        fewest = sum(max((s.fewest_nodes.get(c, 0) for s in self.samples), default=0)
                     for c in self.autoscaled)
        provisioned = sum(c.created for c in self.autoscaled.values())
        delays = [d for c in self.autoscaled.values() for d in c.delays]
        biggest = max(pool.instance_types, key=lambda t: (t.cpu, t.memory))
        return {
            "autoscaled_clusters": len(self.autoscaled),
            "pool_limit_nodes": pool.limits["cpu"] // biggest.cpu,  # in the biggest type
            "nodes_provisioned": provisioned,
            "nodes_provisioned_by_type": {
                kind.name: made for kind in pool.by_size if (made := sum(
                    c.created_by_type.get(kind.name, 0) for c in self.autoscaled.values()))},
            "nodes_consolidated": sum(c.consolidated for c in self.autoscaled.values()),
            "nodes_fewest": fewest,
            "nodes_provisioned_ratio": round(provisioned / fewest, 3) if fewest else None,
            "pool_nodes_peak": max((sum(s.pool_nodes.values()) for s in self.samples),
                                   default=0),
            "pool_nodes_end": sum(c.pool_nodes() for c in self.autoscaled.values()),
            "provisioning_seconds_p50": _percentile(delays, 0.5),
            "released_unschedulable": self.released_unschedulable,
            "growth_wait_seconds_p50": _percentile(self.growth_waits, 0.5),
            "growth_wait_seconds_p99": _percentile(self.growth_waits, 0.99),
            "waiting_for_nodes_peak": max((s.waiting_for_nodes for s in self.samples),
                                          default=0),
        }

    def verdicts(self, summary: Mapping[str, Any]) -> dict[str, str]:
        """Each target of the scenario: met, missed or not judged (and why).

        The nodes provisioned are judged from both sides: at most the target times the fewest
        the fair allocation needs, and not fewer than those (fewer means some autoscaled
        cluster never reached its part of the fair allocation, which a ratio alone would call
        met)."""
        targets = self.scenario.targets
        checks = (("round_p99_ms", targets.round_p99_ms, summary["round_ms_p99"], "<="),
                  ("contested_utilisation_min", targets.contested_utilisation_min,
                   summary["contested_utilisation_min"], ">="),
                  ("deviation_pods_max", targets.deviation_pods_max,
                   summary["deviation_pods_max"], "<="),
                  ("nodes_provisioned_ratio_max", targets.nodes_provisioned_ratio_max,
                   summary.get("nodes_provisioned_ratio"), "1 <= x <="))
        verdicts: dict[str, str] = {}
        for name, target, value, sense in checks:
            if target is None:
                continue
            if self.scenario.scale != 1.0:
                verdicts[name] = f"not judged: the target holds at scale 1, this run is at " \
                                 f"{self.scenario.scale} ({value} here, target {sense} {target})"
            elif value is None:
                verdicts[name] = "not judged: no autoscaled cluster needed a node" if (
                    name == "nodes_provisioned_ratio_max") else \
                    "not judged: no settled contested sample"
            else:
                met = (value <= target if sense == "<=" else value >= target
                       if sense == ">=" else 1.0 <= value <= target)
                verdicts[name] = f"{'met' if met else 'MISSED'}: {value} (target {sense} {target})"
        return verdicts

    @property
    def missed(self) -> list[str]:
        return [name for name, verdict in self.summary()["verdicts"].items()
                if verdict.startswith("MISSED")]


def _percentile(values: list[float], at: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * at))], 2)


class _Fleet:
    """The scenario's fleet, its queues and its arrivals, drawn from one seeded generator."""

    def __init__(self, scenario: Scenario, rng: random.Random, *, seed: int = 17) -> None:
        self.scenario = scenario
        self.clusters = [f"c{i:03d}" for i in range(scenario.clusters)]
        self.weights = {f"q{i:04d}": rng.choice(scenario.weights) for i in range(scenario.queues)}
        hot = self.clusters[:max(1, round(len(self.clusters) * scenario.hot_fraction))]
        self.pinned: dict[str, list[str]] = {}
        self.shape: dict[str, Shape] = {}
        for queue in self.weights:
            pool = hot if rng.random() < scenario.hot_queues else self.clusters
            count = rng.randint(1, min(len(pool), scenario.clusters_per_queue))
            self.pinned[queue] = rng.sample(pool, count)
            self.shape[queue] = rng.choices(scenario.shapes,
                                            weights=[s.weight for s in scenario.shapes])[0]
        self.names = list(self.weights)
        self.cumulative = list(itertools.accumulate(self.weights.values()))
        span = scenario.duration_seconds * scenario.arrival_fraction
        self.arrivals = sorted(rng.uniform(0, span) for _ in range(scenario.jobs))
        self.node_cpu_milli = scenario.node_cpu * 1000
        self.node_memory = scenario.node_memory_gi * GI
        # Scenario (d): the last clusters grow and shrink (their own draws come from another
        # generator, so the fleet above is the same with autoscaling or without).
        autoscaled = 0 if scenario.autoscaling is None else max(
            1, round(len(self.clusters) * scenario.autoscaling.fraction))
        self.autoscaled = self.clusters[len(self.clusters) - autoscaled:]
        # Scenario (e): the tree over the queues (its own generator too: the fleet above, and
        # every arrival but the idle team's, are scenario (a)'s).
        self.tree: list[TreeQueue] = []  # as the independent model takes it
        self.parent: dict[str, str] = {}  # every node but a division -> its parent
        self.level: dict[str, str] = {}  # node -> "division", "team" or "leaf"
        self.guarantees: dict[str, dict[str, float]] = {}  # team -> canonical amounts
        self.idle_team: str | None = None
        self.idle_leaves: frozenset[str] = frozenset()
        if scenario.tree is not None:
            self._grow_tree(scenario.tree, random.Random(f"{seed}/tree"))

    def _grow_tree(self, spec: TreeSpec, rng: random.Random) -> None:
        divisions = [f"d{i:02d}" for i in range(spec.divisions)]
        teams = [f"t{j:03d}" for j in range(spec.divisions * spec.teams_per_division)]
        pool = self.pool_total()
        guaranteed = teams[:max(1, round(len(teams) * spec.guaranteed_teams))]
        part = spec.guarantee_times_share / len(teams)
        for division in divisions:
            self.level[division] = "division"
            self.tree.append(TreeQueue(division, None, rng.choice(spec.division_weights)))
        for j, team in enumerate(teams):
            self.level[team] = "team"
            self.parent[team] = divisions[j % len(divisions)]
            if team in guaranteed:
                # Whole millicores and bytes, rounded down: they fit in the fleet together.
                self.guarantees[team] = {r: float(math.floor(amount * part))
                                         for r, amount in pool.items()}
            self.tree.append(TreeQueue(team, self.parent[team], rng.choice(spec.team_weights),
                                       guarantee=self.guarantees.get(team, {})))
        for i, leaf in enumerate(self.weights):
            self.level[leaf] = "leaf"
            self.parent[leaf] = teams[i % len(teams)]
            self.tree.append(TreeQueue(leaf, self.parent[leaf], self.weights[leaf]))
        self.idle_team = guaranteed[0]
        self.idle_leaves = frozenset(leaf for leaf in self.weights
                                     if self.parent[leaf] == self.idle_team)

    def queue_specs(self) -> list[QueueSpec]:
        """Every queue as an operator would define it: the flat queues, or scenario (e)'s tree
        (inner nodes with their parents and guarantees, leaves under their teams)."""
        if not self.tree:
            return [QueueSpec(name=queue, priority_factor=1 / weight)
                    for queue, weight in self.weights.items()]
        return [QueueSpec(name=node.name, priority_factor=1 / node.weight, parent=node.parent,
                          guarantee={r: f"{int(a)}m" if r == "cpu" else str(int(a))
                                     for r, a in node.guarantee.items()})
                for node in self.tree]

    def ancestors(self, node: str) -> list[str]:
        found = []
        while node in self.parent:
            node = self.parent[node]
            found.append(node)
        return found

    def pool_total(self) -> dict[str, float]:
        total = dict.fromkeys(("cpu", "memory"), 0.0)
        for cluster in self.clusters:
            for name, amount in self.fixed_capacity(cluster).items():
                total[name] += amount
        return total

    def pod_share(self, queue: str) -> float:
        """One of the queue's pods' dominant share of the pool."""
        pool = self.pool_total()
        return max(amount / pool[r] for r, amount in _model_shape(self.shape[queue]).items())

    def sender(self, rng: random.Random) -> str:
        """The queue an arrival comes from: any with the same chance, or by its weight."""
        if self.scenario.arrivals_by_weight:
            return self.names[bisect.bisect(self.cumulative, rng.random() * self.cumulative[-1])]
        return rng.choice(self.names)

    def node_count(self, cluster: str) -> int:
        """Its fixed nodes: all of them, or an autoscaled cluster's that are not the pool's."""
        autoscaling = self.scenario.autoscaling
        if autoscaling is not None and cluster in self.autoscaled:
            return autoscaling.fixed_nodes
        return self.scenario.nodes_per_cluster

    def nodes(self, cluster: str) -> dict[str, NodeInfo]:
        allocatable = Resources({"cpu": self.node_cpu_milli, "memory": self.node_memory})
        return {f"{cluster}-n{i}": NodeInfo(allocatable=allocatable)
                for i in range(self.node_count(cluster))}

    def fixed_capacity(self, cluster: str) -> dict[str, float]:
        nodes = self.node_count(cluster)
        return {"cpu": float(self.node_cpu_milli * nodes),
                "memory": float(self.node_memory * nodes)}


def simulate(scenario: Scenario, *, seed: int = 17,
             progress: Callable[[str], None] | None = None) -> Report:
    started = time.perf_counter()
    # The leader's garbage collection (fair_scheduler's settings defaults), for the run only.
    thresholds = collect_for_large_state()
    worker = TargetsWorker()
    try:
        report = _simulate(scenario, seed, progress, started, worker)
        worker.close()
        # The leader's memory is its own and its worker's (a waited-for child's peak).
        report.worker_rss_bytes = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        return report
    finally:
        worker.close()
        gc.unfreeze()
        gc.set_threshold(*thresholds)


class _TreeRun:
    """Scenario (e)'s side of a run: the leader's usage history on the simulated clock, the
    judge's own (what the simulator saw run, decayed and turned into weights by the documented
    rule, never the scheduler's numbers), the idle guaranteed team and its reclaim."""

    def __init__(self, scenario: Scenario, fleet: _Fleet) -> None:
        self.fleet = fleet
        self.history: UsageHistory | None = None
        self.judge_usage: DecayedUsageModel | None = None
        spec = scenario.history
        if spec is not None:
            # The leader's bookkeeping (lockgate.scheduler.history), on simulated epoch seconds.
            self.history = UsageHistory(half_life_seconds=spec.half_life_seconds,
                                        recompute_seconds=spec.recompute_seconds,
                                        tolerance=spec.tolerance, at=EPOCH)
            self.judge_usage = DecayedUsageModel(half_life_seconds=spec.half_life_seconds,
                                                 at=EPOCH)
        # The weights the judge's model divides by: configured, or the rule's from the judge's
        # usage, moved on the same period and past the same tolerance as the leader's are
        # (docs/scheduling.md, "Usage that decays": the targets stand still in between).
        self.judge_weights: dict[str, float] = {node.name: node.weight for node in fleet.tree}
        self.next_recompute = -math.inf
        self.history_changes = 0
        self.held: dict[str, int] = {}  # leaf -> its pods running, as the simulator saw them
        self.unit = {leaf: fleet.pod_share(leaf) for leaf in fleet.weights}
        tree_spec = scenario.tree
        assert tree_spec is not None
        self.burst_at = tree_spec.idle_until * scenario.duration_seconds
        self.burst_pods = 0
        team = fleet.idle_team
        assert team is not None
        pool = fleet.pool_total()
        self.guarantee_share = max(amount / pool[r]
                                   for r, amount in fleet.guarantees[team].items())
        self.goal_share: float | None = None  # min(guarantee, model's target) after the burst
        self.reclaim_seconds: float | None = None
        self.guarantee_seconds: float | None = None  # until it held its whole guarantee

    def preempting(self, now: float) -> bool:
        """Whether evictions are planned this round (`TreeSpec.preempt_for_seconds`)."""
        spec = self.fleet.scenario.tree
        assert spec is not None
        return spec.preempt_for_seconds is None or (
            self.burst_at <= now < self.burst_at + spec.preempt_for_seconds)

    def ran(self, queue: str, pods: int) -> None:
        self.held[queue] = self.held.get(queue, 0) + pods

    def shares(self) -> dict[str, float]:
        return {leaf: pods * self.unit[leaf] for leaf, pods in self.held.items() if pods}

    def keep_history(self, state: SchedulerState, now: float) -> None:
        """What the leader does before each round (fair_scheduler's `_keep_history`)."""
        history = self.history
        if history is None:
            return
        at = EPOCH + now
        history.observe(now=at, shares=state.dominant_shares())
        tree = state.queue_tree
        assert tree is not None
        if history.recompute(tree, now=at):
            state.use_history_weights(history.weights_in_force)
            self.history_changes += 1

    def judge_history(self, now: float) -> None:
        """The judge's own usage and weights, at the same moment of the round."""
        usage, spec = self.judge_usage, self.fleet.scenario.history
        if usage is None or spec is None:
            return
        at = EPOCH + now
        usage.advance(now=at, shares=self.shares())
        if at < self.next_recompute:
            return
        first = self.next_recompute == -math.inf
        self.next_recompute = at + spec.recompute_seconds
        weights = history_effective_weights(self.fleet.tree, usage.of_tree(self.fleet.tree))
        old = self.judge_weights
        if first or any(abs(weights[name] - old[name]) > spec.tolerance * old[name]
                        for name in weights):
            self.judge_weights = weights

    def model(self, demand: Mapping[tuple[str, str], int],
              clusters: list[Cluster]) -> dict[str, float]:
        """Every node's fair share by the independent hierarchical model, with the judge's
        weights."""
        tree = [replace(node, weight=self.judge_weights.get(node.name, node.weight))
                for node in self.fleet.tree]
        demands = [Demand(q, c, _model_shape(self.fleet.shape[q]), count)
                   for (q, c), count in demand.items()]
        return hierarchical_allocation(clusters=clusters, tree=tree, demands=demands,
                                       pool_total=self.fleet.pool_total()).shares

    def team_share(self) -> float:
        return sum(self.held.get(leaf, 0) * self.unit[leaf] for leaf in self.fleet.idle_leaves)

    def check_reclaim(self, state: SchedulerState, now: float) -> None:
        """After the burst: the goal once (the model over the demand with the burst in), then
        each round whether the idle team holds it (within its smallest pod)."""
        if now < self.burst_at or self.burst_pods == 0:
            return
        if self.goal_share is None:
            demand: dict[tuple[str, str], int] = {}
            for record in state.job_records.values():
                pair = (record.queue, record.cluster)
                demand[pair] = demand.get(pair, 0) + 1
            clusters = [Cluster.of(c, self.fleet.fixed_capacity(c)) for c in self.fleet.clusters]
            target = self.model(demand, clusters).get(self.fleet.idle_team or "", 0.0)
            self.goal_share = min(self.guarantee_share, target)
        slack = min(self.unit[leaf] for leaf in self.fleet.idle_leaves)
        held = self.team_share()
        if self.reclaim_seconds is None and held >= self.goal_share - slack:
            self.reclaim_seconds = now - self.burst_at
        if self.guarantee_seconds is None and held >= self.guarantee_share - slack:
            self.guarantee_seconds = now - self.burst_at

    def figures(self) -> dict[str, Any]:
        return {
            "tree_nodes": {level: sum(1 for v in self.fleet.level.values() if v == level)
                           for level in ("division", "team", "leaf")},
            "guaranteed_teams": len(self.fleet.guarantees),
            "history_half_life_seconds": self.history.half_life_seconds
            if self.history else None,
            "history_weight_changes": self.history_changes,
            "reclaim_team": self.fleet.idle_team,
            "reclaim_burst_at_seconds": self.burst_at, "reclaim_burst_pods": self.burst_pods,
            "reclaim_guarantee_share": round(self.guarantee_share, 4),
            "reclaim_goal_share": None if self.goal_share is None
            else round(self.goal_share, 4),
            "guarantee_reclaim_seconds": self.reclaim_seconds,
            "guarantee_whole_seconds": self.guarantee_seconds,
        }


def _simulate(scenario: Scenario, seed: int, progress: Callable[[str], None] | None,
              started: float, worker: TargetsWorker) -> Report:
    rng = random.Random(seed)
    fleet = _Fleet(scenario, rng, seed=seed)
    report = Report(scenario=scenario)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    state = SchedulerState()
    for spec in fleet.queue_specs():
        state.upsert_queue(spec)
    if fleet.tree:
        state.refresh_queue_tree()
    for cluster in fleet.clusters:
        state.set_cluster(cluster, fleet.nodes(cluster))
    tree_run: _TreeRun | None = None
    if fleet.tree:
        problem = state.queue_tree_problem()
        if problem is not None or state.queue_tree is None:
            raise ScenarioError(f"{scenario.name}: the tree is not honoured: {problem}")
        tree_run = report.tree = _TreeRun(scenario, fleet)
    pool = scenario.node_pool()
    if pool is not None:
        growth_rng = random.Random(f"{seed}/autoscaling")
        for cluster in fleet.autoscaled:
            report.autoscaled[cluster] = SimCluster(
                cluster, pool, rng=growth_rng, clock_origin=EPOCH,
                fixed_nodes={name: dict(info.allocatable)
                             for name, info in fleet.nodes(cluster).items()})
        # The leader's LOCKGATE_SCHEDULER_GROWTH_* settings: virtual nodes enough to cover
        # each pool's limits (the default, 32 per pool, would count less than the pools may
        # add at fleet scale, and the model judges over all of it).
        assert scenario.autoscaling is not None
        gather = scenario.autoscaling.gather_seconds
        growth_policy = GrowthPolicy(
            max_nodes_per_pool=scenario.autoscaling.max_nodes_per_pool or max(
                pool.limits[r] // min(t.resources[r] for t in pool.instance_types)
                for r in ("cpu", "memory")))
        if gather is not None:
            growth_policy = replace(growth_policy, gather_seconds=gather)
        state.set_growth_policy(growth_policy)
    steer = scenario.autoscaling is not None and scenario.autoscaling.steer_instance_size
    autoscaled = report.autoscaled
    published: dict[str, ClusterGrowth] = {}
    policy = PreemptionPolicy(max_evictions_per_round=1_000)
    ends: list[tuple[float, str]] = []  # (simulated end, job id) of running pods
    runtime: dict[str, float] = {}
    running: set[str] = set()
    next_arrival = number = 0
    now, next_sample = 0.0, 0.0
    collector = RoundCollector(clock=lambda: now)  # as the leader: a full one each 6 h
    # Fair targets being solved in the worker: (answer, key, when the problem was taken).
    solving: tuple[Future[tuple[FairTargets, float]], TargetsKey, float] | None = None

    def add(queue: str, cluster: str, created: float, group: str | None, size: int) -> None:
        nonlocal number
        number += 1
        report.created += 1
        job_id = f"{cluster}/j{number}"
        runtime[job_id] = rng.uniform(*scenario.runtime_seconds)
        shape = fleet.shape[queue]
        state.upsert_job(SchedJob(
            job_id=job_id, queue=queue, cluster=cluster, created_at=EPOCH + created,
            requests=Resources({"cpu": int(shape.cpu * 1000),
                                "memory": int(shape.memory_gi * GI)}),
            preemptible=scenario.preemption, group=group, group_size=size))

    owed_since: dict[str, float] = {}  # pods owed a node that may exist, since when

    def run(job_id: str, node: str, since: float) -> None:
        """A pod bound to `node` at `since` starts its runtime there."""
        owed = owed_since.pop(job_id, None)
        if owed is not None:
            report.growth_waits.append(since - owed)
        job = state.job(job_id)
        assert job is not None
        state.upsert_job(replace(job, state=JobState.RUNNING, node_name=node,
                                 unschedulable_since=None, unschedulable_message=""))
        running.add(job_id)
        if tree_run is not None:
            tree_run.ran(job.queue, 1)
        heapq.heappush(ends, (since + runtime.pop(job_id), job_id))

    def happened(cluster: str, events: list[SimEvent]) -> None:
        """An autoscaled cluster's events, told to the state as the watcher would."""
        for event in events:
            if event.kind == "added":
                assert event.allocatable is not None
                state.set_node(cluster, event.node, NodeInfo(
                    allocatable=Resources(dict(event.allocatable)),
                    labels={"karpenter.sh/nodepool": autoscaled[cluster].pool.name}))
            elif event.kind == "removed":
                state.set_node(cluster, event.node, None)
            else:
                run(event.pod, event.node, event.at)

    def publish(cluster: str) -> None:
        """The cluster's growth picture, when it changed (as the watcher publishes it)."""
        growth = autoscaled[cluster].growth()
        last = published.get(cluster)
        if last is None or last.model_copy(update={"observed_at": growth.observed_at}) != growth:
            published[cluster] = growth
            state.set_growth(cluster, growth)

    for cluster in autoscaled:
        publish(cluster)
    while now <= scenario.duration_seconds:
        while next_arrival < len(fleet.arrivals) and fleet.arrivals[next_arrival] <= now:
            queue = fleet.sender(rng)
            cluster = rng.choice(fleet.pinned[queue])
            at = fleet.arrivals[next_arrival]
            if tree_run is not None and queue in fleet.idle_leaves and at < tree_run.burst_at:
                next_arrival += 1  # scenario (e): the idle team sends nothing yet
                continue
            if rng.random() < scenario.gang_fraction:
                group = f"{queue}/g{next_arrival}"
                for member in range(scenario.gang_size):
                    add(queue, cluster, at + member * 1e-3, group, scenario.gang_size)
            else:
                add(queue, cluster, at, None, 0)
            next_arrival += 1
        if tree_run is not None and now >= tree_run.burst_at and not tree_run.burst_pods:
            # Scenario (e): the idle team's work arrives at once, past its guarantee.
            tree_spec = scenario.tree
            assert tree_spec is not None
            wanted = tree_spec.burst_times_guarantee * tree_run.guarantee_share
            leaves = sorted(fleet.idle_leaves)
            while wanted > 0:
                leaf = leaves[tree_run.burst_pods % len(leaves)]
                add(leaf, rng.choice(fleet.pinned[leaf]), now, None, 0)
                tree_run.burst_pods += 1
                wanted -= tree_run.unit[leaf]
        while ends and ends[0][0] <= now:
            _, job_id = heapq.heappop(ends)
            if job_id in running:
                running.discard(job_id)
                cluster = state.job_records[job_id].cluster
                if tree_run is not None:
                    tree_run.ran(state.job_records[job_id].queue, -1)
                state.remove_job(job_id)
                if cluster in autoscaled:
                    happened(cluster, autoscaled[cluster].finish(job_id, now))
        for cluster, side in autoscaled.items():
            happened(cluster, side.advance(now))
            publish(cluster)
        report.peak_jobs = max(report.peak_jobs, len(state))
        if solving is not None:
            # The leader adopts the worker's answer when it comes; here it has had a whole
            # round's interval, so waiting for it (outside the round's time) is what happens.
            future, key, taken = solving
            solving = None
            targets, seconds = future.result()
            state.adopt_targets(key, targets, at=EPOCH + taken)
            report.worker_solve_ms.append(seconds * 1000)
            report.rounds_with_worker_targets += 1
        if tree_run is not None:
            tree_run.judge_history(now)  # the judge's, outside the round's time
        tick = time.perf_counter()
        if tree_run is not None:
            tree_run.keep_history(state, now)  # the leader's, in its round
        result = schedule_round(
            state, max_decisions=scenario.max_decisions,
            max_lookback_per_queue=scenario.max_lookback_per_queue, now=EPOCH + now,
            group_reserve_after_seconds=60, room_hold_seconds=scenario.room_hold_seconds,
            room_holds_per_queue=scenario.room_holds_per_queue,
            # One round old (plus a margin: epoch seconds in floating point).
            adopted_targets_max_age=scenario.round_seconds + 1.0)
        collector.after_round()  # as the leader does; counted in the round's time
        report.round_ms.append((time.perf_counter() - tick) * 1000)
        report.record_round(len(report.round_ms), result)
        if autoscaled:
            for job_id, reason in result.skipped_jobs.items():
                if reason is SkipReason.GATHERING_FOR_GROWTH:
                    owed_since.setdefault(job_id, now)
            for decision in result.decisions:
                if decision.growth is not None:
                    owed_since.setdefault(decision.job_id, now)
        for decision in result.decisions:
            job = state.job(decision.job_id)
            if job is None:
                continue
            growing = autoscaled.get(job.cluster)
            if growing is not None:
                # kube-scheduler binds it where it fits, or it is Unschedulable and the
                # cluster's autoscaler sees it.
                report.released += 1
                avoid = decision.growth.avoid if steer and decision.growth else None
                node = growing.release(job.job_id, job.requests, decision.node_hint or None,
                                       now, avoid=() if avoid is None else (avoid,))
                if node is not None:
                    run(job.job_id, node, now)
                    continue
                report.released_unschedulable += 1
                state.upsert_job(replace(
                    job, state=JobState.UNGATED, unschedulable_since=EPOCH + now,
                    unschedulable_message=f"0/{len(growing.nodes)} nodes are available"))
                continue
            state.upsert_job(replace(job, state=JobState.RUNNING, node_name=decision.node_hint))
            running.add(decision.job_id)
            if tree_run is not None:
                tree_run.ran(job.queue, 1)
            report.released += 1
            heapq.heappush(ends, (now + runtime.pop(decision.job_id), decision.job_id))
        if scenario.preemption and (tree_run is None or tree_run.preempting(now)):
            planning = time.perf_counter()
            evictions = plan_evictions(state, result, policy=policy, evicting=())
            report.eviction_plan_ms.append((time.perf_counter() - planning) * 1000)
            report.record_evictions(evictions)
            for eviction in evictions:
                victim = state.job(eviction.job_id)
                if victim is None:
                    continue
                report.evictions += 1
                running.discard(victim.job_id)
                if tree_run is not None:
                    tree_run.ran(victim.queue, -1)
                state.remove_job(victim.job_id)
                if victim.cluster in autoscaled:
                    happened(victim.cluster, autoscaled[victim.cluster].finish(victim.job_id, now))
                add(victim.queue, victim.cluster, now, None, 0)
        if tree_run is not None:
            tree_run.check_reclaim(state, now)
        handing = time.perf_counter()
        handed = state.hand_over_targets(at=EPOCH + now,
                                         min_demands=scenario.targets_worker_min_demands)
        if handed is not None:
            solving = (worker.submit(handed[0]), handed[1], now)
            report.handoff_ms.append((time.perf_counter() - handing) * 1000)
        if now >= next_sample:
            report.samples.append(_sample(state, fleet, running, now, autoscaled, tree_run))
            next_sample += scenario.sample_seconds
            if progress:
                sample = report.samples[-1]
                progress(f"{scenario.name}: {now / 3600:.1f} h simulated, {len(state)} jobs, "
                         f"{sample.queued} queued, rounds so far p50 "
                         f"{statistics.median(report.round_ms):.1f} ms")
        now += scenario.round_seconds
    report.rss_added_bytes = max(
        0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before)
    report.wall_seconds = time.perf_counter() - started
    return report


def _sample(state: SchedulerState, fleet: _Fleet, running: set[str], now: float,
            autoscaled: Mapping[str, SimCluster], tree_run: _TreeRun | None = None) -> Sample:
    held_in: dict[tuple[str, str], int] = {}  # (queue, cluster) -> its pods running there
    demand: dict[tuple[str, str], int] = {}
    asked_cpu: dict[str, float] = dict.fromkeys(fleet.clusters, 0.0)
    used_cpu: dict[str, float] = dict.fromkeys(fleet.clusters, 0.0)
    waiting: set[tuple[str, str]] = set()  # (queue, cluster) with pods waiting there
    for job_id, record in state.job_records.items():
        demand[(record.queue, record.cluster)] = demand.get((record.queue, record.cluster), 0) + 1
        cpu = fleet.shape[record.queue].cpu * 1000
        asked_cpu[record.cluster] += cpu
        if job_id in running:
            pair = (record.queue, record.cluster)
            held_in[pair] = held_in.get(pair, 0) + 1
            used_cpu[record.cluster] += cpu
        else:
            waiting.add((record.queue, record.cluster))
    # Each cluster's capacity: its nodes; an autoscaled one's, its fixed nodes, its pool's
    # NodeClaims (nodes and in flight) and what the pool may still add (issue 35: fair shares
    # over existing capacity plus headroom).
    capacity_of: dict[str, dict[str, float]] = {}
    for c in fleet.clusters:
        capacity_of[c] = fleet.fixed_capacity(c)
        if c in autoscaled:
            pool = _plus_float(autoscaled[c].in_use(), autoscaled[c].headroom())
            capacity_of[c] = _plus_float(capacity_of[c], pool)
    contested = tuple(c for c in fleet.clusters if asked_cpu[c] > capacity_of[c]["cpu"])
    utilisation = {c: used_cpu[c] / capacity_of[c]["cpu"] for c in fleet.clusters}
    held: dict[str, int] = {}
    for (queue, _), pods in held_in.items():
        held[queue] = held.get(queue, 0) + pods
    # A queue with no pod waiting in some cluster it asks in is given all it asks there.
    served_somewhere = {queue for queue, cluster in demand if (queue, cluster) not in waiting}
    at_saturation = frozenset(queue for queue, _ in demand) - served_somewhere
    deviation: dict[str, float] = {}
    in_clusters: dict[str, float] = {}
    fewest: dict[str, int] = {}
    levels: dict[str, dict[str, float]] = {}
    level_saturated: set[str] = set()
    solving = time.perf_counter()
    if contested:
        clusters = [Cluster.of(c, capacity_of[c]) for c in fleet.clusters]
        demands = [Demand(q, c, _model_shape(fleet.shape[q]), count)
                   for (q, c), count in demand.items()]
        if tree_run is None:
            model = fair_allocation(clusters=clusters, weights=fleet.weights, demands=demands)
        else:
            model = _tree_judgement(tree_run, demand, clusters, held, levels)
            # A node is at saturation when every leaf under it with demand is.
            short = {node for q, _ in demand if q not in at_saturation
                     for node in (q, *fleet.ancestors(q))}
            level_saturated.update(node for q, _ in demand
                                   for node in (q, *fleet.ancestors(q)) if node not in short)
        deviation = {q: held.get(q, 0) - model.pods(q)
                     for q in fleet.weights if q in model.shares and model.common_shapes.get(q)}
        nearest = nearest_split(model, clusters=clusters, demands=demands,
                                held={pair: float(n) for pair, n in held_in.items()},
                                judged=at_saturation)
        in_clusters = {q: nearest.by_queue.get(q, 0.0) for q in deviation}
        for c, side in autoscaled.items():
            # What the fair split gives the cluster beyond its fixed nodes, in nodes.
            given = dict.fromkeys(("cpu", "memory"), 0.0)
            for (q, cluster), part in nearest.parts.items():
                if cluster == c:
                    for resource, amount in _model_shape(fleet.shape[q]).items():
                        given[resource] += part * amount
            beyond = {r: given[r] - fleet.fixed_capacity(c)[r] for r in given}
            fewest[c] = fewest_nodes(beyond, side.pool.instance_types)
    # Saturated: every cluster contested, and every queue has pods waiting wherever it asks;
    # then the fair allocation no longer depends on how much anyone asks, only on weights and
    # pinning (it holds still while pods come and go).
    saturated = len(contested) == len(fleet.clusters) and not served_somewhere
    return Sample(at=now, contested=contested, deviation_pods=deviation,
                  cluster_deviation_pods=in_clusters, saturated_queues=at_saturation,
                  saturated=saturated,
                  utilisation=utilisation, queued=len(state) - len(running),
                  model_seconds=time.perf_counter() - solving,
                  pool_nodes={c: side.pool_nodes() for c, side in autoscaled.items()},
                  fewest_nodes=fewest,
                  waiting_for_nodes=sum(len(side.waiting) for side in autoscaled.values()),
                  level_deviation=levels, level_saturated=frozenset(level_saturated))


def _tree_judgement(tree_run: _TreeRun, demand: Mapping[tuple[str, str], int],
                    clusters: list[Cluster], held: Mapping[str, int],
                    levels: dict[str, dict[str, float]]) -> FairAllocation:
    """Scenario (e): every node's fair share by the independent hierarchical model (with the
    judge's weights), each node's deviation into `levels`, and the leaves' shares as a
    `FairAllocation` (what `nearest_split` judges each leaf in each cluster against: the
    hierarchical model fixes each leaf's total, any split of it is fair)."""
    fleet = tree_run.fleet
    shares = tree_run.model(demand, clusters)
    smallest = min(tree_run.unit.values())
    held_share: dict[str, float] = {}
    for leaf, pods in held.items():
        for node in (leaf, *fleet.ancestors(leaf)):
            held_share[node] = held_share.get(node, 0.0) + pods * tree_run.unit[leaf]
    for node, share in shares.items():
        levels.setdefault(fleet.level[node], {})[node] = (
            held_share.get(node, 0.0) - share) / smallest
    leaves = {leaf: share for leaf, share in shares.items() if fleet.level[leaf] == "leaf"}
    return FairAllocation(
        pool_total=fleet.pool_total(), weights=dict(tree_run.judge_weights), shares=leaves,
        cluster_shares={}, cluster_pods={},
        common_shapes={leaf: _model_shape(fleet.shape[leaf]) for leaf in leaves},
        levels=0, programs=0)


def _plus_float(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    return {r: float(a.get(r, 0)) + float(b.get(r, 0)) for r in ("cpu", "memory")}


def _model_shape(shape: Shape) -> dict[str, float]:
    return {"cpu": shape.cpu * 1000, "memory": shape.memory_gi * GI}


def plot(report: Report, out: Path) -> Path:
    """A PNG: the largest deviation from the fair allocation over time, and utilisation; with
    autoscaled clusters, their pools' nodes against the fewest the fair split needs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{report.scenario.name}.png"
    hours = [s.at / 3600 for s in report.samples]
    growing = sorted(report.autoscaled)
    figure, axes = plt.subplots(3 if growing else 2, 1, figsize=(9, 9 if growing else 6),
                                sharex=True)
    top, bottom = axes[0], axes[1]
    top.plot(hours, [max(s.cluster_deviation_pods.values(), default=0.0)
                     for s in report.samples], marker="o", label="largest |deviation|")
    top.plot(hours, [statistics.mean(s.cluster_deviation_pods.values())
                     if s.cluster_deviation_pods else 0.0 for s in report.samples],
             marker=".", label="mean |deviation|")
    top.set_ylabel("pods from the fair allocation")
    top.legend()
    top.set_title(f"{report.scenario.name}: scale {report.scenario.scale}, "
                  f"{report.scenario.clusters} clusters, {report.scenario.queues} queues")
    hot = sorted({c for s in report.samples for c in s.contested}) or sorted(
        report.samples[0].utilisation if report.samples else [])
    for cluster in hot[:8]:
        bottom.plot(hours, [s.utilisation[cluster] for s in report.samples], label=cluster)
    bottom.set_ylabel("cpu utilisation (contested clusters)")
    bottom.set_xlabel("simulated hours")
    bottom.set_ylim(0, 1.05)
    if hot:
        bottom.legend(fontsize="small", ncol=4)
    if growing:
        nodes = axes[2]
        nodes.plot(hours, [sum(s.pool_nodes.values()) for s in report.samples], marker="o",
                   label="pool nodes (NodeClaims alive)")
        nodes.plot(hours, [sum(s.fewest_nodes.values()) for s in report.samples], marker=".",
                   label="fewest the fair split needs")
        nodes.set_ylabel(f"nodes, {len(growing)} autoscaled clusters")
        nodes.set_xlabel("simulated hours")
        nodes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
