"""The leader's picture after a round: the one answer to `status`, `explain` and the web UI.

Why this exists: what users read about the scheduler used to be worked out three times (the
leader's round, queue-store per request from a full load of Postgres, and a second incremental
copy for the UI), and the copies could not see the leader's holds and reservations, so they
could disagree with it. Now the leader builds a `RoundReport` from each round's own results and
keeps it; queue-store asks the leader (as Armada's non-leaders proxy scheduling reports to it)
and answers from Postgres alone, saying that the reasons are unavailable, when no leader answers.

A report holds every queue's standing after the round (`QueueStatus`, the shape `lockgate
status` shows) and what the round said of each job it passed over (`skipped`). Why a waiting pod
waits is explained against the leader's state with the same `Explainer` the pod's Events use,
built once per round when first asked (so a page of 500 pods costs one explainer), and never
older than the last round: the leader replaces the report after every round.

Pure: the leader passes the state, the round's result and the clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from lockgate.growth import PoolHeadroom
from lockgate.scheduler.explain import (
    Explainer,
    Explanation,
    GrowthStanding,
    QueueStatus,
    WaitReason,
)
from lockgate.scheduler.history import HistoryReport
from lockgate.scheduler.round import RoundResult, RoundShares, SkipReason, growth_gate
from lockgate.scheduler.state import SchedulerState
from lockgate.scheduler.tree_status import TreeNodeStatus, tree_statuses


@dataclass(frozen=True, slots=True)
class ExplainSettings:
    """What an explanation says of the leader's own settings."""

    preemption: bool
    group_reserve_after: float | None
    holds: bool


@dataclass(frozen=True, slots=True)
class QueueRound:
    """One queue's part in the round, beside its standing."""

    demand_share: float
    allocated: int
    released: int  # in this round
    outcome: str
    skipped: Mapping[str, int]  # why its waiting jobs were passed over, by reason
    set_aside: tuple[str, ...]  # clusters none of its waiting jobs could go to this round


@dataclass(frozen=True, slots=True)
class ClusterGrowthStatus:
    """An autoscaled cluster after the round (lockgate.growth; docs/autoscaling.md)."""

    cluster: str
    nodes: int  # schedulable nodes that exist
    capacity: Mapping[str, int]  # their allocatable, summed
    pools: tuple[PoolHeadroom, ...]  # per NodePool: its headroom and why not more
    claims_in_flight: tuple[str, ...]  # NodeClaims whose Node does not exist yet
    released_unbound: int  # pods released for growth not bound yet
    stalled: str  # "growth stalled: ..." ("": not stalled)
    waiting: str  # why the next wave of releases for growth waits ("": it need not)


@dataclass(slots=True)
class RoundReport:
    """What the leader's last round decided and why, for every queue and waiting job."""

    number: int  # rounds of this term of leadership, 1 for the first
    at: float  # epoch seconds the round decided at
    queues: tuple[QueueStatus, ...]
    rounds: Mapping[str, QueueRound]  # by queue name
    skipped: Mapping[str, SkipReason]  # every job the round looked at and passed over
    _state: SchedulerState
    _settings: ExplainSettings
    _explainer: Explainer | None = field(default=None)
    # Per autoscaled cluster, its growth after the round (by cluster name).
    growth: Mapping[str, ClusterGrowthStatus] = field(default_factory=dict)
    # The queue tree after the round (`tree`, built when first asked, as the explainer is),
    # and why the definitions cannot be honoured as they are (None: they can).
    _tree: tuple[TreeNodeStatus, ...] | None = None
    tree_problem: str | None = None
    # Usage history after the round (lockgate.scheduler.history); None when it is off.
    history: HistoryReport | None = None
    # Every queue's fair share as the round reported it, for its explainer (None: the
    # explainer works them out from the state).
    _shares: RoundShares | None = None

    def explain(self, jobs: Iterable[tuple[str, tuple[int, int] | None]], *,
                now: float) -> dict[str, Explanation | None]:
        """Why each (job id, (place, of how many) in its queue) waits, or None for a job the
        leader does not hold (finished, or not yet seen). Pass the place when it is known
        (queue-store reads it from Postgres's index): without it the explainer counts the
        queue's pods, a pass over every job."""
        explainer = self.explainer(now=now)
        return {job_id: explainer.explain(job_id, place) for job_id, place in jobs}

    def explainer(self, *, now: float) -> Explainer:
        """The round's one explainer (the leader's Events use it too), at the time `now`."""
        explainer = self._explainer
        if explainer is None:
            settings = self._settings
            explainer = self._explainer = Explainer(
                self._state, now=now, preemption=settings.preemption,
                group_reserve_after=settings.group_reserve_after, holds=settings.holds,
                shares=None if self._shares is None else self._shares.every())
            if self.history is not None:
                explainer.history_words = self.history.words
        explainer.now = now
        return explainer

    def tree(self) -> tuple[TreeNodeStatus, ...]:
        """The queue tree after the round, parents before children (`status --tree`): built
        when first asked (a pass over the queues), never older than the round."""
        if self._tree is None:
            tree = tree_statuses(self._state)
            if self.history is not None:
                # Each node's decayed usage, from the round's own history report.
                nodes = self.history.nodes
                tree = tuple(replace(node, decayed_usage=nodes[node.name].usage)
                             if node.name in nodes else node for node in tree)
            self._tree = tree
        return self._tree

    def status_of(self, queue: str) -> QueueStatus | None:
        for status in self.queues:
            if status.queue == queue:
                return status
        return None


def report_round(state: SchedulerState, result: RoundResult, *, number: int, at: float,
                 phases: Mapping[str, Counter[str]], settings: ExplainSettings,
                 history: HistoryReport | None = None) -> RoundReport:
    """The report of a round just run on `state` (after its decisions were recorded).

    O(queues): the counts come from the leader's running tallies (`Feed.phases` and the state's
    per-queue usage), never from a pass over the jobs, which at fleet scale is a million."""
    queues: list[QueueStatus] = []
    rounds: dict[str, QueueRound] = {}
    for name, report in sorted(result.queues.items()):
        spec = state.queue_spec(name)
        usage = state.queue_usage(name)
        share = report.share
        counts = phases.get(name, Counter())
        queues.append(QueueStatus(
            queue=name, defined=spec is not None, cordoned=spec is not None and spec.cordoned,
            # An undefined queue has no weight: it releases nothing (as its outcome says).
            weight=share.weight if spec is not None else 0.0, fair_share=share.fair_share,
            adjusted_fair_share=share.adjusted_fair_share, actual_share=share.actual_share,
            queued=usage.queued_jobs, unschedulable=usage.unschedulable_jobs,
            released=counts["released"], running=counts["running"],
            # Postgres knows when each pod joined the line (kept places included); the leader
            # keeps no per-queue minimum, so the reader adds it (`status_json`).
            oldest_queued_at=None,
            max_queued_seconds=None if spec is None or spec.max_queued is None
            else spec.max_queued.seconds,
            backing_off=usage.backing_off_jobs, fair_target=share.fair_target,
            cluster_targets=share.cluster_targets,  # neither changes once given
            cluster_shares=share.cluster_shares,
            **_history_fields(history, name)))
        rounds[name] = QueueRound(
            demand_share=share.demand_share, allocated=report.allocated,
            released=report.released, outcome=report.outcome.value,
            skipped={str(reason.value): count for reason, count in report.skipped.items()
                     if count},
            set_aside=tuple(report.set_aside))
    return RoundReport(number=number, at=at, queues=tuple(queues), rounds=rounds,
                       skipped=result.skipped_jobs, _state=state, _settings=settings,
                       growth=growth_statuses(state, now=at), history=history,
                       tree_problem=state.queue_tree_problem(), _shares=result.shares)


def _history_fields(history: HistoryReport | None, queue: str) -> dict[str, Any]:
    """A queue's `QueueStatus` fields of usage history (none when it is off)."""
    if history is None:
        return {}
    node = history.nodes.get(queue)
    return {"decayed_usage": 0.0 if node is None else node.usage,
            "effective_weight": None if node is None else node.effective_weight,
            "history": history.words.get(queue, "")}


def growth_statuses(state: SchedulerState, *, now: float) -> dict[str, ClusterGrowthStatus]:
    """Every autoscaled cluster's growth (`ClusterGrowthStatus`): O(clusters' nodes and pods
    released for growth), read from the state's growth plans."""
    unbound: dict[str, int] = {}
    for release in state.growth_releases.values():
        unbound[release.cluster] = unbound.get(release.cluster, 0) + 1
    statuses: dict[str, ClusterGrowthStatus] = {}
    names = state.axis_names
    for cluster_name in state.cluster_names():
        plan = state.growth_plan(cluster_name)
        if plan is None:
            continue
        record = state.cluster_records[cluster_name]
        virtual = {node.name: node for node in plan.nodes}
        capacity = [0] * len(names)
        nodes = 0
        for node_name in record.order:
            if node_name in virtual:
                continue
            nodes += 1
            for axis, amount in enumerate(record.nodes[node_name].allocatable):
                capacity[axis] += amount
        gate = growth_gate(state, cluster_name, now=now)
        statuses[cluster_name] = ClusterGrowthStatus(
            cluster=cluster_name, nodes=nodes,
            capacity={names[axis]: amount for axis, amount in enumerate(capacity) if amount},
            pools=plan.pools, claims_in_flight=plan.claims_in_flight,
            released_unbound=unbound.get(cluster_name, 0), stalled=gate.stalled,
            waiting=gate.waiting)
    return statuses


def growth_json(status: ClusterGrowthStatus) -> dict[str, Any]:
    """A cluster's growth as `lockgate status` and the UI may read it."""
    return {
        "cluster": status.cluster, "nodes": status.nodes, "capacity": dict(status.capacity),
        "node_pools": [{"name": pool.pool, "headroom_nodes": pool.nodes,
                        "headroom": dict(pool.remaining),
                        "node_shape": None if pool.shape is None else dict(pool.shape),
                        "node_shape_from": pool.shape_source, "why_none": pool.why_none}
                       for pool in status.pools],
        "claims_in_flight": list(status.claims_in_flight),
        "released_unbound": status.released_unbound, "stalled": status.stalled,
        "waiting": status.waiting}


def status_json(status: QueueStatus, *, per_cluster: bool = True) -> dict[str, Any]:
    """A queue's standing as `lockgate status` and the UI read it (field by field, not
    `asdict`, whose deep copies were most of the leader's answer at 1,000 queues);
    `per_cluster`: with its target and share in each cluster (`-o wide`), which at fleet scale
    (50 clusters) are nearly all of it."""
    body = {name: getattr(status, name) for name in _STATUS_FIELDS}
    if per_cluster:
        body["cluster_targets"] = dict(status.cluster_targets)
        body["cluster_shares"] = dict(status.cluster_shares)
    return body


_STATUS_FIELDS = tuple(f.name for f in fields(QueueStatus)
                       if f.name not in ("cluster_targets", "cluster_shares"))


def explanation_json(explanation: Explanation) -> dict[str, Any]:
    """An explanation as `lockgate explain` and the UI read it."""
    body = asdict(explanation)
    body["reason"] = None if explanation.reason is None else explanation.reason.value
    body["competing_queues"] = list(explanation.competing_queues)
    return body


def short_reason(explanation: Explanation) -> str:
    """Why a pod waits in a few words, for a line of a list (the web UI's queue page): what a
    team lead reads at a glance. The whole sentence is `Explanation.message`."""
    reason, cluster = explanation.reason, explanation.cluster
    if explanation.growth_standing:
        return _SHORT_GROWTH[explanation.growth_standing].format(cluster=cluster)
    if reason is None:
        return "not waiting"
    if explanation.held_on is not None:
        return "room held for it"
    if reason is WaitReason.FAIR_SHARE:
        return f"over its share in {cluster}"
    if reason is WaitReason.CLUSTER_ROOM:
        return f"owed room in {cluster}" if explanation.below_target else (
            f"no room in {cluster}")
    return _SHORT[reason].format(cluster=cluster)


_SHORT_GROWTH: dict[str, str] = {
    GrowthStanding.RELEASED.value: "released so that {cluster} grows",
    GrowthStanding.OVER_SHARE.value: "over its share: {cluster} will not grow for it",
    GrowthStanding.WAITING.value: "waiting for new nodes in {cluster}",
    GrowthStanding.STALLED.value: "growth stalled in {cluster}",
    GrowthStanding.GATHERING.value: "gathering a node's worth to grow {cluster}",
}

_SHORT: dict[WaitReason, str] = {
    WaitReason.NODE_FIT: "fits no node",
    WaitReason.NO_NODES: "no nodes in {cluster}",
    WaitReason.QUEUE_LIMIT: "at its queue's limit",
    WaitReason.QUEUE_CORDONED: "queue cordoned",
    WaitReason.QUEUE_UNKNOWN: "queue not defined",
    WaitReason.BACKING_OFF: "its controller backs off",
    WaitReason.GROUP_INCOMPLETE: "waiting for its group",
    WaitReason.NEXT_ROUND: "next round",
}
