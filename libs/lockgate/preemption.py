"""Preemption to fair share: free room for a queue below its fair share by evicting pods of
queues above theirs, by a rule that cannot thrash.

Why it exists: a queue that took idle capacity first keeps it for as long as its pods live, and
a Deployment's pods live forever. Without preemption a queue that arrives later waits for
capacity that never comes back. With it, running pods marked preemptible (the pod label
`lockgate.io/preemptible=true`, or a priority class the operator lists) may be evicted, that is
deleted; their controller creates them again, gated, and they queue again.

The rule (compare Kueue's `LessThanOrEqualToFinalShare`), with cost = dominant share / weight,
the quantity progressive filling equalises: a pod V of queue A may be evicted for a pod J of
queue B only if

  1. B is below its adjusted fair share and stays at or below it with J;
  2. A does not drop below its adjusted fair share without V;
  3. cost(B with J) <= cost(A without V)   (each eviction of a batch judged cumulatively);
  4. V is preemptible, runs (bound to a node) in J's cluster, and the victims chosen on one
     node make room there for J; J is a single pod (groups are not preempted for).

Rule 3 is the no-thrash invariant; docs/scheduling.md ("Preemption") proves that it rules out
evicting back and forth, and that in a closed system every run of evictions ends.

Pure: the caller passes the state after a round, that round's result (which jobs found no
room), and the jobs already being evicted (still running until their deletion is observed: they
are counted as gone, so a later round does not evict again for the same need).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection
from dataclasses import dataclass

from lockgate.fairness import RoundResult, SkipReason, fair_shares
from lockgate.jobs import JobState
from lockgate.labels import PREEMPTIBLE_LABEL
from lockgate.scheduling import SchedulerState, _Job, _Shape

__all__ = ["PREEMPTIBLE_LABEL", "Eviction", "PreemptionPolicy", "plan_evictions"]
# Shares are floats: a queue exactly at its fair share must not look a hair above or below it.
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    """Off unless configured: the scheduler runs `plan_evictions` only when enabled."""

    preemptible_priority_classes: frozenset[str] = frozenset()
    max_evictions_per_round: int = 100


@dataclass(frozen=True, slots=True)
class Eviction:
    """Delete `job_id` (queue `queue`, on `node`) to make room for `for_job` of `for_queue`."""

    job_id: str
    queue: str
    cluster: str
    node: str
    for_job: str
    for_queue: str
    # Costs (share / weight) the rule compared, and the shares, for the record and the Event.
    victim_cost_after: float
    preemptor_cost_after: float
    victim_share: float
    victim_fair_share: float
    preemptor_share: float
    preemptor_fair_share: float

    @property
    def message(self) -> str:
        return (
            f"preempted by lockgate to fair share: queue {self.queue!r} holds "
            f"{self.victim_share:.1%} of the pool (fair share {self.victim_fair_share:.1%}); "
            f"queue {self.for_queue!r} holds {self.preemptor_share:.1%} (fair share "
            f"{self.preemptor_fair_share:.1%}) and has a pod waiting for this room. The pod's "
            f"controller may create it again; it then waits in queue {self.queue!r}.")


def is_preemptible(job: _Job, policy: PreemptionPolicy) -> bool:
    return job.preemptible or (
        bool(job.priority_class) and job.priority_class in policy.preemptible_priority_classes)


def plan_evictions(state: SchedulerState, result: RoundResult, *, policy: PreemptionPolicy,
                   evicting: Collection[str]) -> list[Eviction]:
    """Evictions that would let queues below their fair share run their waiting pods.

    Costs O(jobs) when some queue below its fair share has a pod that found no room (to index
    running pods by node), nothing otherwise.
    """
    if policy.max_evictions_per_round <= 0:
        return []
    waiting = _waiting_for_room(state, result, policy.max_evictions_per_round)
    if not waiting:
        return []
    return _Planner(state, policy, evicting).plan(waiting)


def _waiting_for_room(state: SchedulerState, result: RoundResult,
                      limit: int) -> dict[str, list[str]]:
    """Per queue, the first `limit` single pods waiting in clusters where the round found no
    room for one of its pods (or set the cluster aside for it), in release order."""
    jobs = state._jobs
    clusters: dict[str, set[str]] = {}
    for job_id, reason in result.skipped_jobs.items():
        job = jobs.get(job_id)
        if reason is SkipReason.NO_NODE_WITH_ROOM and job is not None:
            clusters.setdefault(job.queue, set()).add(job.cluster)
    for name, report in result.queues.items():
        if report.set_aside:
            clusters.setdefault(name, set()).update(report.set_aside)
    waiting: dict[str, list[str]] = {}
    for name, where in clusters.items():
        queue = state._queues.get(name)
        if queue is None:
            continue
        entries = []
        for cluster in where:
            pending = queue.pending.get(cluster)
            if pending is not None:
                # Stale entries are filtered below; twice the limit leaves room for them.
                entries += heapq.nsmallest(2 * limit + 16, pending.heap)
        seen: set[str] = set()
        picked: list[str] = []
        for priority, created_at, job_id in sorted(entries):
            job = jobs.get(job_id)
            if (job_id in seen or job is None or job.state is not JobState.QUEUED
                    or job.parked or job.group is not None or job.queue != name
                    or job.priority != -priority or job.created_at != created_at):
                continue
            seen.add(job_id)
            picked.append(job_id)
            if len(picked) >= limit:
                break
        if picked:
            waiting[name] = picked
    return waiting


class _Planner:
    def __init__(self, state: SchedulerState, policy: PreemptionPolicy,
                 evicting: Collection[str]) -> None:
        self.state = state
        self.policy = policy
        total = state._pool_total
        self.inverse = [1.0 / amount if amount > 0 else 0.0 for amount in total]
        shares = fair_shares(state)
        self.fair = {name: share.adjusted_fair_share for name, share in shares.items()}
        self.alloc = {name: queue.allocation[:] for name, queue in state._queues.items()}
        self.factor = {name: queue.priority_factor for name, queue in state._queues.items()}
        self.evicting = set(evicting)
        self.free: dict[str, dict[str, list[int]] | None] = {}
        self.victims: dict[str, dict[str, list[tuple[str, _Job]]]] = {}
        jobs = state._jobs
        for job_id in self.evicting:
            job = jobs.get(job_id)
            if job is not None and job.state is not JobState.QUEUED:
                _subtract(self.alloc[job.queue], job.shape)  # as good as gone

    def share(self, queue: str, vector: list[int] | None = None) -> float:
        vector = self.alloc[queue] if vector is None else vector
        return max((a * i for a, i in zip(vector, self.inverse, strict=False)), default=0.0)

    def cost(self, queue: str, vector: list[int] | None = None) -> float:
        return self.share(queue, vector) * self.factor[queue]

    def plan(self, waiting: dict[str, list[str]]) -> list[Eviction]:
        state = self.state
        preemptors = [
            name for name in waiting
            if state._queues[name].schedulable and self.share(name) < self.fair[name] - _EPSILON
        ]
        preemptors.sort(key=lambda name: (self.cost(name), name))
        evictions: list[Eviction] = []
        limit = self.policy.max_evictions_per_round
        for name in preemptors:
            for job_id in waiting[name]:
                if len(evictions) >= limit:
                    return evictions
                job = state._jobs[job_id]
                with_job = _plus(self.alloc[name], job.shape)
                if self.share(name, with_job) > self.fair[name] + _EPSILON:
                    break  # the queue would pass its fair share: nothing more to free for it
                found = self._make_room(name, job_id, job, limit - len(evictions))
                if found is None:
                    continue
                self.alloc[name] = with_job
                evictions.extend(found)
        return evictions

    def _make_room(self, queue: str, job_id: str, job: _Job,
                   budget: int) -> list[Eviction] | None:
        """Evictions that make room for `job` on one node (empty if room is already free), and
        take that room for it; None when no node can be freed by the rule."""
        rooms = self._rooms(job.cluster)
        if rooms is None:
            return None
        shape = job.shape
        for room in rooms.values():
            if _fits(room, shape):
                _take(room, shape)  # freed already (earlier evictions in flight), or free
                return []
        preemptor_cost = self.cost(queue, _plus(self.alloc[queue], shape))
        for node, room in rooms.items():
            chosen = self._victims_on(job.cluster, node, queue, shape, room, preemptor_cost)
            if chosen is None or len(chosen) > budget:
                continue
            evictions = []
            for victim_id, victim in chosen:
                before = self.share(victim.queue)
                _subtract(self.alloc[victim.queue], victim.shape)
                _add(room, victim.shape)
                self.evicting.add(victim_id)
                evictions.append(Eviction(
                    job_id=victim_id, queue=victim.queue, cluster=job.cluster, node=node,
                    for_job=job_id, for_queue=queue,
                    victim_cost_after=self.cost(victim.queue),
                    preemptor_cost_after=preemptor_cost,
                    victim_share=before, victim_fair_share=self.fair.get(victim.queue, 0.0),
                    preemptor_share=self.share(queue),
                    preemptor_fair_share=self.fair[queue]))
            _take(room, shape)
            return evictions
        return None

    def _victims_on(self, cluster: str, node: str, queue: str, shape: _Shape,
                    room: list[int], preemptor_cost: float) -> list[tuple[str, _Job]] | None:
        """The fewest-first greedy choice of victims on `node` that the rule allows and that
        make room for `shape`; None if they cannot."""
        candidates = [(victim_id, victim) for victim_id, victim
                      in self.victims[cluster].get(node, ())
                      if victim.queue != queue and victim_id not in self.evicting]
        if not candidates:
            return None
        # Take from the most over-served queue first, its lowest priority and newest pods first.
        candidates.sort(key=lambda item: (-self.cost(item[1].queue), item[1].priority,
                                          -item[1].created_at, item[0]))
        freed = room[:]
        trial = {name: vector[:] for name, vector in self.alloc.items()}
        chosen: list[tuple[str, _Job]] = []
        for victim_id, victim in candidates:
            if _fits(freed, shape):
                break
            short = [axis for axis, amount in shape.pairs if freed[axis] < amount]
            if not any(axis in short for axis, _ in victim.shape.pairs):
                continue  # would not help
            without = _minus(trial[victim.queue], victim.shape)
            if self.share(victim.queue, without) < self.fair.get(victim.queue, 0.0) - _EPSILON:
                continue  # rule 2: never below its own fair share
            if self.cost(victim.queue, without) < preemptor_cost - _EPSILON:
                continue  # rule 3: the preemptor would end up above its victim
            trial[victim.queue] = without
            _add(freed, victim.shape)
            chosen.append((victim_id, victim))
        return chosen if _fits(freed, shape) else None

    def _rooms(self, cluster_name: str) -> dict[str, list[int]] | None:
        """Free room per schedulable node of a cluster, counting evictions in flight as done;
        None while released pods there are not bound yet (they may be about to take it)."""
        if cluster_name in self.free:
            return self.free[cluster_name]
        cluster = self.state._clusters.get(cluster_name)
        rooms: dict[str, list[int]] | None = None
        if cluster is not None and not cluster.held_unbound:
            rooms = {}
            for name in cluster.order:
                node = cluster.nodes[name]
                used = cluster.used_by_node.get(name)
                rooms[name] = [a - u - (used[i] if used is not None else 0)
                               for i, (a, u) in enumerate(zip(node.allocatable, node.unmanaged,
                                                              strict=True))]
            victims: dict[str, list[tuple[str, _Job]]] = {}
            for job_id, job in self.state._jobs.items():
                if (job.cluster != cluster_name or job.state is JobState.QUEUED
                        or job.node_name not in rooms):
                    continue
                if job_id in self.evicting:
                    _add(rooms[job.node_name], job.shape)
                elif is_preemptible(job, self.policy):
                    victims.setdefault(job.node_name, []).append((job_id, job))
            self.victims[cluster_name] = victims
        self.free[cluster_name] = rooms
        return rooms


def _fits(room: list[int], shape: _Shape) -> bool:
    return all(room[axis] >= amount for axis, amount in shape.pairs)


def _take(room: list[int], shape: _Shape) -> None:
    for axis, amount in shape.pairs:
        room[axis] -= amount


def _add(room: list[int], shape: _Shape) -> None:
    for axis, amount in shape.pairs:
        room[axis] += amount


def _subtract(vector: list[int], shape: _Shape) -> None:
    for axis, amount in shape.pairs:
        vector[axis] -= amount


def _plus(vector: list[int], shape: _Shape) -> list[int]:
    result = vector[:]
    _add(result, shape)
    return result


def _minus(vector: list[int], shape: _Shape) -> list[int]:
    result = vector[:]
    _subtract(result, shape)
    return result
