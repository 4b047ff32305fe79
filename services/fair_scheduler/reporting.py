"""How every queue stands: Prometheus gauges, and the leader's picture served over HTTP.

Why: "why isn't my job released?" is the first question users ask of a fair scheduler. After
every round the leader keeps the round's report (`lockgate.scheduler.report`): each queue's fair
share, adjusted fair share, fair target and actual share, its jobs by phase, and why waiting
jobs wait. It is the only picture: queue-store's `status`, `explain` and web UI ask it here.

    GET  /api/v1/fairness   every queue after the last round ({"leader": false} on a standby),
                            and each autoscaled cluster's growth ("growth": nodes, capacity,
                            headroom per NodePool, NodeClaims in flight, stall or wait)
    GET  /api/v1/fairness/clusters   the same, each queue with its target and share in every
                            cluster too ("cluster_targets", "cluster_shares", "clusters"):
                            queues x clusters numbers (100,000 at 1,000 queues in 50 clusters),
                            so only `status -o wide`, `-o json` and a queue's page ask it
    POST /api/v1/explain    {"jobs": [{"id": "CLUSTER/UID", "place": [P, N] | null}, ...]}
                            -> {"leader": ..., "round": ..., "explanations": {id: ... | null}}
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
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
# Pods asked about again within WATCH_SECONDS (a UI page refreshing, explain run again) are
# explained again after every round, the most recently asked first, for at most
# REFRESH_SECONDS of the loop a round (explaining pods of many clusters costs each cluster's
# room and ranks), so asking again is answered without waiting for the round in progress
# (`answered`). A pod asked once is not: at fleet scale, explaining again every pod anyone
# asked about once took most of the leader's loop.
WATCH_SECONDS = 30.0
MAX_WATCHED = 500
# 100 ms: a UI page's 50 pods span up to 50 clusters at fleet scale, and 50 ms left some of
# them out, sending the page's next ask to the loop; a step of the loop this long is still
# shorter than the round itself there (150-350 ms at 1,000,000 queued).
REFRESH_SECONDS = 0.1
REFRESH_SLICE = 25  # pods explained between looks at the clock

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


@dataclass(frozen=True, slots=True)
class _Shown:
    """What GET /api/v1/fairness shows, replaced whole after each round and at each change of
    leadership: the health server's own thread reads it while the next round runs on the loop
    (`encoded`), so nothing in it may be changed in place. The picture's queues, rounds,
    growth, history and tree are fixed when the round is reported (the tree built then:
    `RoundReport.tree` reads the live state)."""

    leader: bool
    picture: RoundReport | None
    seconds: float = 0.0
    decisions: int = 0


Place = tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class _Explained:
    """Answers about pods from one round's picture, by (job id, place in line): read on the
    health server's thread (`answered`), added to only on the loop while that picture is the
    last round's, and replaced whole (never cleared in place) when the next round reports."""

    picture: RoundReport | None
    entries: dict[tuple[str, Place], dict[str, Any] | None]


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
    # Each picture's queues as JSON, by whether each carries its per-cluster figures.
    _queues_cache: dict[bool, tuple[RoundReport, list[dict[str, Any]]]] = field(
        default_factory=dict)
    _shown: _Shown = field(default_factory=lambda: _Shown(leader=False, picture=None))
    # The last encoded answer of each kind (per cluster or not), with the `_Shown` it is of.
    _encoded: dict[bool, tuple[_Shown, bytes]] = field(default_factory=dict)
    _encoding: threading.Lock = field(default_factory=threading.Lock)
    _explained: _Explained = field(default_factory=lambda: _Explained(None, {}))
    # Pods asked about, with the place they were asked at and when (monotonic seconds): the
    # health server's thread and the loop both write it, under `_watching`.
    _watched: dict[str, tuple[Place, float, int]] = field(default_factory=dict)
    _watching: threading.Lock = field(default_factory=threading.Lock)

    def set_leader(self, leader: bool) -> None:
        self.leader = leader
        IS_LEADER.set(1 if leader else 0)
        if not leader:
            # A standby says nothing of the queues: its last picture is stale at once.
            self.picture = None
            self.release_rates = None
            self.held_out = None
            self._forget_queues(set())
        self._shown = _Shown(leader=leader, picture=self.picture,
                             seconds=self.last_round_seconds,
                             decisions=self.last_round_decisions)

    def record_round(self, picture: RoundReport, *, seconds: float, decisions: int) -> None:
        picture.tree()  # built now, from the state as the round left it (see `_Shown`)
        self.picture = picture
        self.last_round_decisions = decisions
        self.last_round_seconds = seconds
        self._shown = _Shown(leader=self.leader, picture=picture, seconds=seconds,
                             decisions=decisions)
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

    def _round_json(self, shown: _Shown | None = None) -> dict[str, Any] | None:
        shown = shown or self._shown
        picture = shown.picture
        if picture is None:
            return None
        return {"number": picture.number,
                "at": datetime.fromtimestamp(picture.at, UTC).isoformat(),
                "decisions": shown.decisions,
                "duration_ms": round(shown.seconds * 1000, 3)}

    def as_json(self, shown: _Shown | None = None, *, per_cluster: bool = False
                ) -> dict[str, Any]:
        """GET /api/v1/fairness: every queue's standing and its part in the last round
        (`per_cluster`: with its target and share in each cluster, /api/v1/fairness/clusters).
        Reads only `shown` (by default the latest): safe on the health server's thread."""
        shown = shown or self._shown
        picture = shown.picture if shown.leader else None
        body = {"instance_id": self.instance_id, "leader": shown.leader,
                "last_round": self._round_json(shown),
                "queues": self._queues_json(picture, per_cluster=per_cluster),
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
        """`as_json` without the per-cluster figures, encoded once per round: queue-store
        asks it for every status, overview and explain, and at fleet scale (1,000 queues in
        50 clusters) the per-cluster figures were nearly all of the answer and of its cost,
        encoded here and decoded and encoded again by queue-store and its client.

        Called on the health server's own thread (`off_loop`), while the loop may be running
        the next round: it reads only the last `_Shown`, never the live state, so it never
        waits for the round and never shows half of one."""
        return self._encoded_as(per_cluster=False)

    def encoded_per_cluster(self) -> bytes:
        """GET /api/v1/fairness/clusters: `as_json` with every queue's target and share in
        each cluster, encoded once per round when asked (as `encoded`)."""
        return self._encoded_as(per_cluster=True)

    def _encoded_as(self, *, per_cluster: bool) -> bytes:
        shown = self._shown
        cached = self._encoded.get(per_cluster)
        if cached is not None and cached[0] is shown:
            return cached[1]
        with self._encoding:  # two requests at once encode it once
            cached = self._encoded.get(per_cluster)
            if cached is None or cached[0] is not shown:
                # orjson: a tenth of json's time, which on this thread is time the round
                # in progress does not hold the GIL.
                cached = self._encoded[per_cluster] = (
                    shown, orjson.dumps(self.as_json(shown, per_cluster=per_cluster)))
        return cached[1]

    def _queues_json(self, picture: RoundReport | None, *, per_cluster: bool
                     ) -> list[dict[str, Any]]:
        """The queues of a picture as JSON, built once per round and kind: every status,
        the UI's overview and queue-store's samples ask for them (1,000 queues at fleet
        scale). Read on the health server's thread too: built whole, then kept."""
        if picture is None:
            return []
        cached = self._queues_cache.get(per_cluster)
        if cached is not None and cached[0] is picture:
            return cached[1]
        queues: list[dict[str, Any]] = []
        if picture is not None:
            for status in picture.queues:
                entry = status_json(status, per_cluster=per_cluster)
                entry["name"] = status.queue
                part = picture.rounds.get(status.queue)
                if part is not None:
                    if per_cluster:
                        # The constrained fair target (docs/scheduling.md, "Fair targets"):
                        # per cluster, beside what the queue holds there.
                        entry["clusters"] = {cluster: {
                            "target": status.cluster_targets.get(cluster, 0.0),
                            "actual": status.cluster_shares.get(cluster, 0.0)}
                            for cluster in sorted({*status.cluster_targets,
                                                   *status.cluster_shares})}
                    entry.update({
                        "demand_share": part.demand_share,
                        "allocated": part.allocated,
                        "released_last_round": part.released,
                        "outcome_last_round": part.outcome,
                        # Why waiting jobs were passed over, so "why isn't my job released?"
                        # has an answer: e.g. {"no_room": 12} or clusters set aside as full.
                        "skipped_last_round": dict(part.skipped),
                        "clusters_set_aside_last_round": list(part.set_aside),
                    })
                queues.append(entry)
        self._queues_cache[per_cluster] = (picture, queues)
        return queues

    def answered(self, body: object) -> dict[str, Any] | None:
        """POST /api/v1/explain on the health server's own thread: the answer when the last
        round's picture already explained every asked pod at the place asked (each asked
        again within WATCH_SECONDS is explained again after every round), else None and the
        loop explains them (`explain_json`, waiting for the round in progress). So an answer
        is always of the last round reported, never older, and never made up here."""
        jobs = _explain_request(body)
        shown = self._shown
        if not jobs or not shown.leader or shown.picture is None:
            return None
        explained = self._explained
        if explained.picture is not shown.picture:  # the next round reported meanwhile
            return None
        entries = explained.entries
        found: dict[str, Any] = {}
        for key in jobs:
            if key not in entries:
                return None
            found[key[0]] = entries[key]
        self._watch(jobs)
        return {"instance_id": self.instance_id, "leader": True,
                "round": self._round_json(shown), "explanations": found}

    def _watch(self, jobs: list[tuple[str, Place]]) -> None:
        now = time.monotonic()
        with self._watching:
            for job_id, place in jobs:
                before = self._watched.pop(job_id, None)  # the most recently asked last
                self._watched[job_id] = (place, now, 1 if before is None else before[2] + 1)
            while len(self._watched) > MAX_WATCHED:
                del self._watched[next(iter(self._watched))]

    def explain_again(self, *, now: float) -> int:
        """After a round is reported, on the loop: explain again, from the new picture, the
        pods asked about again lately (see REFRESH_SECONDS), so that asking once more need
        not wait for the next round. Returns how many."""
        cutoff = time.monotonic() - WATCH_SECONDS
        with self._watching:
            for job_id in [job_id for job_id, (_, at, _) in self._watched.items()
                           if at < cutoff]:
                del self._watched[job_id]
            jobs = [(job_id, place) for job_id, (place, _, asks) in self._watched.items()
                    if asks > 1]
        picture = self.picture if self.leader else None
        if picture is None:
            return 0
        if self._explained.picture is not picture:
            self._explained = _Explained(picture, {})
        jobs.reverse()  # the most recently asked first
        deadline = time.perf_counter() + REFRESH_SECONDS
        done = 0
        while done < len(jobs) and time.perf_counter() < deadline:
            self._explain(picture, jobs[done:done + REFRESH_SLICE], now=now)
            done = min(len(jobs), done + REFRESH_SLICE)
        return done

    def explain_json(self, body: object, *, now: float) -> dict[str, Any]:
        """POST /api/v1/explain: why each asked pod waits, from the last round's picture."""
        jobs = _explain_request(body)
        picture = self.picture if self.leader else None
        if picture is None:  # a standby, or a leader before its first round
            return {"instance_id": self.instance_id, "leader": self.leader, "round": None,
                    "explanations": {}}
        explained = self._explain(picture, jobs, now=now)
        self._watch(jobs)
        return {"instance_id": self.instance_id, "leader": True, "round": self._round_json(),
                "explanations": explained}

    def _explain(self, picture: RoundReport, jobs: list[tuple[str, Place]], *,
                 now: float) -> dict[str, Any]:
        """Each job's answer from `picture` (the last round's), kept for `answered`."""
        memo = self._explained
        if memo.picture is not picture:
            memo = self._explained = _Explained(picture, {})
        explained: dict[str, Any] = {}
        rates = self.release_rates
        places = dict(jobs)
        for job_id, explanation in picture.explain(jobs, now=now).items():
            if explanation is None:
                held_out, retry_due = (None, None) if self.held_out is None \
                    else self.held_out(job_id)
                explained[job_id] = memo.entries[(job_id, places[job_id])] = (
                    None if held_out is None else {
                        "explanation": None, "held_out": held_out, "retry_due": retry_due})
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
            explained[job_id] = memo.entries[(job_id, places[job_id])] = entry
        return explained


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
