"""How every queue stands: Prometheus gauges and the JSON behind GET /api/v1/fairness.

Why: "why isn't my job released?" is the first question users ask of a fair scheduler. After
every round the leader publishes each queue's fair share, adjusted fair share (what it can
actually use), actual share, and its jobs by phase, so the answer is one request away.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import Gauge, Histogram

from lockgate.scheduler import PHASES, RoundResult

IS_LEADER = Gauge("lockgate_scheduler_is_leader",
                  "1 while this instance holds the leader lock, else 0")
ROUND_SECONDS = Histogram(
    "lockgate_scheduler_round_duration_seconds",
    "Seconds per scheduling round, from computing to publishing its releases",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
SHARE = Gauge("lockgate_scheduler_queue_share",
              "A queue's share of the pool's dominant resource (ratio), by kind: fair, "
              "adjusted_fair, actual, target (its constrained fair target)", ["queue", "kind"])
QUEUE_JOBS = Gauge("lockgate_scheduler_queue_jobs",
                   "A queue's unfinished jobs (count), by phase: queued, released (gate being "
                   "removed or removed), running (bound or running)", ["queue", "phase"])
SHARE_KINDS = ("fair", "adjusted_fair", "actual", "target")



@dataclass
class FairnessReport:
    """The newest round's view, kept by the leader and read by the HTTP endpoint."""

    instance_id: str
    leader: bool = False
    last_round_at: datetime | None = None
    last_round_decisions: int = 0
    last_round_seconds: float = 0.0
    queues: list[dict[str, Any]] = field(default_factory=list)
    # Each queue's labelled gauges, looked up once: `labels()` per queue and round took 7% of
    # the leader's CPU on the release benchmark (100 queues).
    _gauges: dict[str, tuple[tuple[Gauge, ...], tuple[Gauge, ...]]] = field(
        default_factory=dict)
    # The values each queue's gauges were last set to (shares, then jobs by phase): only those
    # that changed are set again (700 sets a round were most of `record_round`'s cost on the
    # release benchmark, most of them to the value the gauge already had). The report owns its
    # queues' gauges: one report per process, as the leader keeps.
    _values: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def set_leader(self, leader: bool) -> None:
        self.leader = leader
        IS_LEADER.set(1 if leader else 0)
        if not leader:
            self.queues = []
            self._forget_queues(set())

    def record_round(self, result: RoundResult, *, phases: dict[str, Counter[str]],
                     at: datetime, seconds: float, decisions: int) -> None:
        self.last_round_at = at
        self.last_round_decisions = decisions
        self.last_round_seconds = seconds
        ROUND_SECONDS.observe(seconds)
        queues: list[dict[str, Any]] = []
        for name, report in sorted(result.queues.items()):
            counts = phases.get(name, Counter())
            share = report.share
            queues.append({
                "name": name,
                "weight": share.weight,
                "fair_share": share.fair_share,
                "adjusted_fair_share": share.adjusted_fair_share,
                "actual_share": share.actual_share,
                "demand_share": share.demand_share,
                # The constrained fair target (docs/scheduling.md, "Fair targets"): over the
                # pool, and per cluster, beside what the queue holds there.
                "fair_target": share.fair_target,
                "clusters": {cluster: {"target": share.cluster_targets.get(cluster, 0.0),
                                       "actual": share.cluster_shares.get(cluster, 0.0)}
                             for cluster in sorted({*share.cluster_targets,
                                                    *share.cluster_shares})},
                "queued": counts["queued"],
                "unschedulable": report.unschedulable,
                # Queued, held while their controller backs off (lockgate.backoff).
                "backing_off": report.backing_off,
                "released": counts["released"],
                "running": counts["running"],
                "allocated": report.allocated,
                "released_last_round": report.released,
                "outcome_last_round": report.outcome.value,
                # Why waiting jobs were passed over, so "why isn't my job released?" has an
                # answer: e.g. {"no_room": 12} or clusters set aside as full.
                "skipped_last_round": {str(getattr(reason, "value", reason)): count
                                       for reason, count in report.skipped.items() if count},
                "clusters_set_aside_last_round": list(report.set_aside),
            })
            gauges = self._gauges.get(name)
            if gauges is None:
                gauges = self._gauges[name] = (
                    tuple(SHARE.labels(name, kind) for kind in SHARE_KINDS),
                    tuple(QUEUE_JOBS.labels(name, phase) for phase in PHASES))
            values = (share.fair_share, share.adjusted_fair_share, share.actual_share,
                      share.fair_target, *(counts[phase] for phase in PHASES))
            last = self._values.get(name)
            if last != values:
                shares, jobs = gauges
                for index, (gauge, value) in enumerate(zip((*shares, *jobs), values,
                                                           strict=True)):
                    if last is None or last[index] != value:
                        gauge.set(value)
                self._values[name] = values
        self.queues = queues
        self._forget_queues({entry["name"] for entry in queues})

    def _forget_queues(self, current: set[str]) -> None:
        for name in set(self._gauges) - current:
            for kind in SHARE_KINDS:
                SHARE.remove(name, kind)
            for phase in PHASES:
                QUEUE_JOBS.remove(name, phase)
            del self._gauges[name]
            self._values.pop(name, None)

    def as_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "leader": self.leader,
            "last_round": None if self.last_round_at is None else {
                "at": self.last_round_at.isoformat(),
                "decisions": self.last_round_decisions,
                "duration_ms": round(self.last_round_seconds * 1000, 3),
            },
            "queues": self.queues,
        }
