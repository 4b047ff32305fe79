"""Property tests (issue 17 item 9): on many random fleets, pinnings, weights and demands, the
real scheduler's allocations at saturation match the independent model (devstack.fair_model,
linear programs that share no code with lockgate.scheduler), and preemption reaches them and
stops.

Each random queue has one pod shape (so the model's share is exactly the DRF dominant share);
nodes hold a whole number of every shape (so packing loses nothing the fluid model keeps). The
judgement is per queue total (the split across clusters need not be unique), within one pod
of the largest shape among the queues it shares a cluster with (`slack_cpu`). Seeded, so a
failure names the fleet that broke it (LOCKGATE_PROPERTY_FLEETS sets how many).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, replace

import pytest
from builders import a_job, a_node, a_queue, a_state

from devstack.fair_model import Cluster, Demand, FairAllocation, fair_allocation
from lockgate.jobs import JobState
from lockgate.scheduler import (
    PreemptionPolicy,
    RoundResult,
    SchedulerState,
    check_invariants,
    plan_evictions,
    schedule_round,
)

FLEETS = int(os.environ.get("LOCKGATE_PROPERTY_FLEETS", "200"))
POLICY = PreemptionPolicy(max_evictions_per_round=1_000)


@dataclass(frozen=True)
class Fleet:
    seed: int
    nodes: dict[str, list[int]]  # cluster -> cpu per node
    weights: dict[str, float]
    shape: dict[str, int]  # queue -> cpu per pod
    demand: dict[tuple[str, str], int]  # (queue, cluster) -> pods

    def model(self) -> FairAllocation:
        clusters = [Cluster.of(name, {"cpu": 1000 * sum(cpus), "memory": len(cpus) * 64 * 2**30})
                    for name, cpus in self.nodes.items()]
        return fair_allocation(
            clusters=clusters, weights=self.weights,
            demands=[Demand(q, c, {"cpu": 1000 * self.shape[q], "memory": 2**30}, count)
                     for (q, c), count in self.demand.items()])

    def describe(self) -> str:
        return (f"fleet seed {self.seed}: nodes {self.nodes}, weights {self.weights}, "
                f"shapes {self.shape}, demand {self.demand}")


def random_fleet(seed: int) -> Fleet:
    rng = random.Random(seed)
    # Node cpu in multiples of 4, pod shapes 1, 2 or 4 cpu: every node holds whole pods.
    nodes = {f"c{i}": [4 * rng.randint(1, 4) for _ in range(rng.randint(1, 3))]
             for i in range(rng.randint(1, 4))}
    queues = [f"q{i}" for i in range(rng.randint(2, 5))]
    weights = {q: rng.choice([1.0, 1.0, 2.0, 0.5, 3.0]) for q in queues}
    shape = {q: rng.choice([1, 1, 2, 4]) for q in queues}
    demand: dict[tuple[str, str], int] = {}
    for q in queues:
        pinned = rng.sample(sorted(nodes), rng.randint(1, len(nodes)))
        for c in pinned:
            demand[(q, c)] = rng.randint(1, 40 // shape[q])
    return Fleet(seed, nodes, weights, shape, demand)


def build_state(fleet: Fleet, *, preemptible: bool = False,
                running: dict[tuple[str, str], int] | None = None) -> SchedulerState:
    """The fleet's jobs all queued, or (with `running`) that many of each already running,
    placed first-fit, and the rest queued."""
    builder = a_state().with_queues(*(a_queue(q).with_weight(w) for q, w in fleet.weights.items()))
    free: dict[str, list[int]] = {}
    for cluster, cpus in fleet.nodes.items():
        nodes = {f"{cluster}-n{i}": a_node(cpu=str(cpu), memory="64Gi").build()
                 for i, cpu in enumerate(cpus)}
        builder = builder.with_cluster(cluster, nodes)
        free[cluster] = list(cpus)
    for q, c in (running or fleet.demand):  # filled in that order
        count = fleet.demand[(q, c)]
        job = a_job(q).in_cluster(c).requesting(cpu=str(fleet.shape[q]), memory="1Gi")
        if preemptible:
            job = job.preemptible()
        placed = 0
        for _ in range(min(count, (running or {}).get((q, c), 0))):
            node = next((i for i, room in enumerate(free[c]) if room >= fleet.shape[q]), None)
            if node is None:
                break
            free[c][node] -= fleet.shape[q]
            builder = builder.with_jobs(job.running_on(f"{c}-n{node}"))
            placed += 1
        builder = builder.with_jobs(job.times(count - placed))
    state = builder.build()
    check_invariants(state)
    return state


def run_round(state: SchedulerState) -> RoundResult:
    """One round; kube-scheduler binds each release where the round placed it."""
    result = schedule_round(state, max_decisions=100_000, max_lookback_per_queue=1_000)
    check_invariants(state)
    for decision in result.decisions:
        job = state.job(decision.job_id)
        assert job is not None
        state.upsert_job(replace(job, state=JobState.RUNNING, node_name=decision.node_hint))
    check_invariants(state)
    return result


_again = iter(range(10**9))


def evict(state: SchedulerState, result: RoundResult) -> int:
    """Plan evictions after a round and carry them out: each victim is deleted, and its
    controller creates it again (queued)."""
    evictions = plan_evictions(state, result, policy=POLICY, evicting=())
    for eviction in evictions:
        victim = state.job(eviction.job_id)
        assert victim is not None
        state.upsert_job(replace(victim, state=JobState.DELETED))
        state.upsert_job(replace(victim, job_id=f"{victim.cluster}/again-{next(_again)}",
                                 state=JobState.QUEUED, node_name=None,
                                 created_at=victim.created_at + 10_000))
    check_invariants(state)
    return len(evictions)


def allocated_pods(state: SchedulerState, fleet: Fleet) -> dict[str, float]:
    return {q: state.queue_usage(q).allocated_jobs for q in fleet.weights}


def slack_cpu(fleet: Fleet, queue: str) -> int:
    """How far (in cpu) an integral allocation may be from the fluid one: one pod of the
    largest shape among the queues that share a cluster with it (its own included). A queue
    whose 4-cpu pods get 3.5 fluidly holds 3, and the 2 cpu left go, rightly, to a neighbour's
    1-cpu pods: two pods above its fluid allocation."""
    clusters = {c for (q, c) in fleet.demand if q == queue}
    neighbours = {q for (q, c) in fleet.demand if c in clusters}
    return max(fleet.shape[q] for q in neighbours)


def assert_matches_model(state: SchedulerState, fleet: Fleet, what: str) -> None:
    fair = fleet.model()
    held = allocated_pods(state, fleet)
    wrong = {q: (held[q], round(fair.pods(q), 3)) for q in fleet.weights
             if abs(held[q] - fair.pods(q)) * fleet.shape[q] > slack_cpu(fleet, q) + 1e-6}
    assert not wrong, (f"{what}: queue -> (pods held, fair pods) off by more than one pod of "
                       f"the largest neighbouring shape: {wrong}; {fleet.describe()}")


def test_the_random_fleets_are_varied() -> None:
    """The property tests would prove little on fleets that are all alike."""
    fleets = [random_fleet(seed) for seed in range(200)]
    assert len({len(f.nodes) for f in fleets}) == 4
    assert any(len({c for (q, c) in f.demand if q == "q0"}) == 1 and len(f.nodes) > 1
               for f in fleets)  # pinned to one cluster of several
    assert len({w for f in fleets for w in f.weights.values()}) >= 4


def test_rounds_at_saturation_match_the_independent_model() -> None:
    """From an empty fleet with every pod queued, rounds (with each release bound) reach an
    allocation within one pod of the model's, per queue."""
    for seed in range(FLEETS):
        fleet = random_fleet(seed)
        state = build_state(fleet)
        for _ in range(3):
            if not run_round(state).decisions:
                break
        assert_matches_model(state, fleet, "after the rounds")


def settle(fleet: Fleet) -> SchedulerState:
    """From an unfair start (clusters filled in a random queue order, everything preemptible),
    rounds and evictions until neither releases nor evicts; then ten more windows in which
    nothing may be released or evicted (no thrash)."""
    rng = random.Random(fleet.seed + 10**6)
    order = list(fleet.demand)
    rng.shuffle(order)
    state = build_state(fleet, preemptible=True, running=dict.fromkeys(order, 10**6))
    history = []
    for _ in range(40):
        result = run_round(state)
        released = len(result.decisions)
        evicted = evict(state, result)
        history.append((evicted, released))
        if evicted == 0 and released == 0:
            break
    else:
        pytest.fail(f"preemption did not settle in 40 rounds: {history[-5:]}; "
                    f"{fleet.describe()}")
    for _ in range(10):
        result = run_round(state)
        assert not result.decisions, f"a release after settling; {fleet.describe()}"
        assert evict(state, result) == 0, f"an eviction after settling; {fleet.describe()}"
    return state


@pytest.mark.parametrize("block", range(4))
def test_preemption_settles_and_then_stops(block: int) -> None:
    for seed in range(block, FLEETS // 2, 4):
        settle(random_fleet(seed))


def test_preemption_reaches_the_model() -> None:
    for seed in range(FLEETS // 2):
        fleet = random_fleet(seed)
        assert_matches_model(settle(fleet), fleet, "once preemption settled")
