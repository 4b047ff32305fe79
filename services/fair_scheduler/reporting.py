"""How every queue stands: Prometheus gauges, and the leader's picture served over HTTP.

Why: "why isn't my job released?" is the first question users ask of a fair scheduler. After
every round the leader keeps the round's report (`lockgate.scheduler.report`): each queue's fair
share, adjusted fair share, fair target and actual share, its jobs by phase, and why waiting
jobs wait. It is the only picture: queue-store's `status`, `explain` and web UI ask it here.

    GET  /api/v1/fairness   every queue after the last round ({"leader": false} on a standby),
                            and each autoscaled cluster's growth ("growth": nodes, capacity,
                            headroom per NodePool, NodeClaims in flight, stall or wait)
    POST /api/v1/explain    {"jobs": [{"id": "CLUSTER/UID", "place": [P, N] | null}, ...]}
                            -> {"leader": ..., "round": ..., "explanations": {id: ... | null}}
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Gauge, Histogram

from lockgate.scheduler import PHASES
from lockgate.scheduler.history import history_json
from lockgate.scheduler.report import (
    RoundReport,
    explanation_json,
    growth_json,
    short_reason,
    status_json,
)
from lockgate.scheduler.tree_status import tree_node_json
from lockgate.wait_estimates import ReleaseRates

MAX_EXPLAINED = 1000  # pods per explain request: a UI page is at most 500

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


class ExplainRequestError(ValueError):
    """A malformed explain request: the caller gets the message with a 400."""


@dataclass
class FairnessReport:
    """The newest round's picture, kept by the leader and read by the HTTP endpoints."""

    instance_id: str
    leader: bool = False
    last_round_seconds: float = 0.0
    last_round_decisions: int = 0
    picture: RoundReport | None = None
    # The leader's pace of releases per queue and cluster, for the wait estimates explain gives
    # (the same its Events give).
    release_rates: ReleaseRates | None = None
    # Why the leader holds a queued job out of its queue's line (its feed's hold-out policy:
    # "expired", "backing_off") and when it queues again: (None, None) for any other job.
    held_out: Callable[[str], tuple[str | None, float | None]] | None = None
    # Each queue's labelled gauges, looked up once: `labels()` per queue and round took 7% of
    # the leader's CPU on the release benchmark (100 queues).
    _gauges: dict[str, tuple[tuple[Gauge, ...], tuple[Gauge, ...]]] = field(
        default_factory=dict)
    # The values each queue's gauges were last set to (shares, then jobs by phase): only those
    # that changed are set again (700 sets a round were most of `record_round`'s cost on the
    # release benchmark, most of them to the value the gauge already had). The report owns its
    # queues' gauges: one report per process, as the leader keeps.
    _values: dict[str, tuple[float, ...]] = field(default_factory=dict)
    _queues_cache: tuple[RoundReport, list[dict[str, Any]]] | None = None
    _encoded: tuple[RoundReport | None, bool, bytes] | None = None

    def set_leader(self, leader: bool) -> None:
        self.leader = leader
        IS_LEADER.set(1 if leader else 0)
        if not leader:
            # A standby says nothing of the queues: its last picture is stale at once.
            self.picture = None
            self.release_rates = None
            self.held_out = None
            self._forget_queues(set())

    def record_round(self, picture: RoundReport, *, seconds: float, decisions: int) -> None:
        self.picture = picture
        self.last_round_decisions = decisions
        self.last_round_seconds = seconds
        ROUND_SECONDS.observe(seconds)
        for status in picture.queues:
            name = status.queue
            gauges = self._gauges.get(name)
            if gauges is None:
                gauges = self._gauges[name] = (
                    tuple(SHARE.labels(name, kind) for kind in SHARE_KINDS),
                    tuple(QUEUE_JOBS.labels(name, phase) for phase in PHASES))
            phase_counts = {"queued": status.queued, "released": status.released,
                            "running": status.running}
            values = (status.fair_share, status.adjusted_fair_share, status.actual_share,
                      status.fair_target, *(phase_counts[phase] for phase in PHASES))
            last = self._values.get(name)
            if last != values:
                shares, jobs = gauges
                for index, (gauge, value) in enumerate(zip((*shares, *jobs), values,
                                                           strict=True)):
                    if last is None or last[index] != value:
                        gauge.set(value)
                self._values[name] = values
        self._forget_queues({status.queue for status in picture.queues})

    def _forget_queues(self, current: set[str]) -> None:
        for name in set(self._gauges) - current:
            for kind in SHARE_KINDS:
                SHARE.remove(name, kind)
            for phase in PHASES:
                QUEUE_JOBS.remove(name, phase)
            del self._gauges[name]
            self._values.pop(name, None)

    def _round_json(self) -> dict[str, Any] | None:
        picture = self.picture
        if picture is None:
            return None
        return {"number": picture.number,
                "at": datetime.fromtimestamp(picture.at, UTC).isoformat(),
                "decisions": self.last_round_decisions,
                "duration_ms": round(self.last_round_seconds * 1000, 3)}

    def as_json(self) -> dict[str, Any]:
        """GET /api/v1/fairness: every queue's standing and its part in the last round."""
        picture = self.picture if self.leader else None
        body = {"instance_id": self.instance_id, "leader": self.leader,
                "last_round": self._round_json(), "queues": self._queues_json(picture),
                # The queue tree (lockgate.scheduler.tree_status), parents before children.
                "tree": [] if picture is None else [tree_node_json(node)
                                                    for node in picture.tree()],
                "tree_problem": None if picture is None else picture.tree_problem,
                "growth": [] if picture is None else [
                    growth_json(status) for _, status in sorted(picture.growth.items())]}
        if picture is not None and picture.history is not None:
            # Every node's decayed usage and what the rule made of its weight (`status --tree`
            # reads inner nodes here; each queue's entry carries its own too).
            body["history"] = history_json(picture.history)
        return body

    def encoded(self) -> bytes:
        """`as_json` encoded, once per round: queue-store asks it for every status, overview
        and explain, and at fleet scale (1,000 queues) encoding it was most of answering."""
        picture = self.picture if self.leader else None
        cached = self._encoded
        if cached is None or cached[0] is not picture or cached[1] != self.leader:
            cached = self._encoded = (picture, self.leader,
                                      json.dumps(self.as_json()).encode())
        return cached[2]

    def _queues_json(self, picture: RoundReport | None) -> list[dict[str, Any]]:
        """The queues of a picture as JSON, built once per round: every status, the UI's
        overview and queue-store's samples ask for them (1,000 queues at fleet scale)."""
        if picture is None:
            return []
        cached = self._queues_cache
        if cached is not None and cached[0] is picture:
            return cached[1]
        queues: list[dict[str, Any]] = []
        if picture is not None:
            for status in picture.queues:
                entry = status_json(status)
                entry["name"] = status.queue
                part = picture.rounds.get(status.queue)
                if part is not None:
                    entry.update({
                        "demand_share": part.demand_share,
                        # The constrained fair target (docs/scheduling.md, "Fair targets"): per
                        # cluster, beside what the queue holds there.
                        "clusters": {cluster: {
                            "target": status.cluster_targets.get(cluster, 0.0),
                            "actual": status.cluster_shares.get(cluster, 0.0)}
                            for cluster in sorted({*status.cluster_targets,
                                                   *status.cluster_shares})},
                        "allocated": part.allocated,
                        "released_last_round": part.released,
                        "outcome_last_round": part.outcome,
                        # Why waiting jobs were passed over, so "why isn't my job released?"
                        # has an answer: e.g. {"no_room": 12} or clusters set aside as full.
                        "skipped_last_round": dict(part.skipped),
                        "clusters_set_aside_last_round": list(part.set_aside),
                    })
                queues.append(entry)
        self._queues_cache = (picture, queues)
        return queues

    def explain_json(self, body: object, *, now: float) -> dict[str, Any]:
        """POST /api/v1/explain: why each asked pod waits, from the last round's picture."""
        jobs = _explain_request(body)
        picture = self.picture if self.leader else None
        if picture is None:  # a standby, or a leader before its first round
            return {"instance_id": self.instance_id, "leader": self.leader, "round": None,
                    "explanations": {}}
        explained: dict[str, Any] = {}
        rates = self.release_rates
        for job_id, explanation in picture.explain(jobs, now=now).items():
            if explanation is None:
                held_out, retry_due = (None, None) if self.held_out is None \
                    else self.held_out(job_id)
                explained[job_id] = None if held_out is None else {
                    "explanation": None, "held_out": held_out, "retry_due": retry_due}
                continue
            entry: dict[str, Any] = {"explanation": explanation_json(explanation),
                                     "summary": short_reason(explanation),
                                     "round_skip": None}
            skip = picture.skipped.get(job_id)
            if skip is not None:
                entry["round_skip"] = skip.value
            if rates is not None and explanation.reason is not None:
                estimate = rates.estimate_for(explanation, now=now)
                entry["estimate"] = {"seconds": estimate.seconds, "text": estimate.text()}
            explained[job_id] = entry
        return {"instance_id": self.instance_id, "leader": True, "round": self._round_json(),
                "explanations": explained}


def _explain_request(body: object) -> list[tuple[str, tuple[int, int] | None]]:
    if not isinstance(body, dict) or not isinstance(body.get("jobs"), list):
        raise ExplainRequestError('expected {"jobs": [{"id": "CLUSTER/UID", "place": [P, N]}]}')
    jobs: list[tuple[str, tuple[int, int] | None]] = []
    for item in body["jobs"]:
        job_id = item.get("id") if isinstance(item, dict) else None
        if not isinstance(job_id, str) or "/" not in job_id:
            raise ExplainRequestError(f"each job needs an id CLUSTER/UID, got {item!r}")
        place = item.get("place")
        if place is None:
            jobs.append((job_id, None))
        elif (isinstance(place, list) and len(place) == 2
              and all(isinstance(n, int) and n >= 0 for n in place)):
            jobs.append((job_id, (place[0], place[1])))
        else:
            raise ExplainRequestError(f"place must be [PLACE, OF], got {place!r}")
    if len(jobs) > MAX_EXPLAINED:
        raise ExplainRequestError(f"at most {MAX_EXPLAINED} jobs per request")
    return jobs
