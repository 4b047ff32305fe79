"""The fair targets' inputs, kept change by change, against a recount after random operations.

`SchedulerState` keeps what every queue holds and has queued per (cluster, queue, placement)
(`TargetSlot`) and builds the fair targets' inputs from it, again only where something changed.
These tests drive states through random sequences of every kind of change (queues defined,
reweighted, cordoned and removed; jobs queued, released, bound, moved, finished, too big for
every node; nodes added, tainted and removed; controllers backing off; new resources; rounds)
and compare, after each, the kept inputs with `recount_target_inputs` (the from-scratch code the
bookkeeping replaced) and the targets computed from each. The invariants
(`lockgate.scheduler.invariants`, run after every change by conftest) compare the slots too.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from lockgate.backoff import ControllerBackoff
from lockgate.jobs import JobState
from lockgate.placement import Label, PodPlacement, Taint, Toleration
from lockgate.queues import QueueSpec
from lockgate.resources import Resources
from lockgate.scheduler import NodeInfo, SchedJob, SchedulerState, schedule_round
from lockgate.scheduler.invariants import check_invariants
from lockgate.scheduler.targets import fair_targets

CLUSTERS = ("c1", "c2", "c3")
QUEUES = ("qa", "qb", "qc", "qd")
GPU = Taint(key="gpu", value="yes", effect="NoSchedule")
PLACEMENTS: tuple[PodPlacement | None, ...] = (
    None,
    PodPlacement(tolerations=(Toleration(key="gpu", value="yes"),)),
    PodPlacement(node_selector=(Label(key="zone", value="a"),)),
    # equal to the one before, another object: one slot for both
    PodPlacement(node_selector=(Label(key="zone", value="a"),)),
)
STATES = (JobState.QUEUED, JobState.QUEUED, JobState.RELEASED, JobState.RUNNING)


def _compare(state: SchedulerState) -> None:
    groups, weights, demands, _, _ = state.target_inputs()
    r_groups, r_weights, r_demands, _, _ = state.recount_target_inputs()
    assert groups == r_groups
    assert weights == r_weights
    assert demands == r_demands
    check_invariants(state)  # the structure and amounts, laid out as the recount lays them
    pool = state.pool_total().as_dict()
    fair = state.fairness_resources
    pool_f = {name: float(v) for name, v in pool.items() if v > 0 and name in fair}
    assert (fair_targets(groups=groups, weights=weights, demands=demands, pool=pool_f)
            == fair_targets(groups=r_groups, weights=r_weights, demands=r_demands, pool=pool_f))


def _node(rng: random.Random) -> NodeInfo:
    resources = {"cpu": rng.choice((4000, 8000, 16000)), "memory": rng.choice((8, 32)) << 30}
    if rng.random() < 0.2:
        resources["nvidia.com/gpu"] = rng.choice((1, 4))
    return NodeInfo(
        allocatable=Resources(resources),
        unmanaged_usage=Resources({"cpu": rng.choice((0, 500))}),
        schedulable=rng.random() > 0.1,
        labels={"zone": rng.choice("ab")},
        taints=(GPU,) if rng.random() < 0.3 else ())


def _job(rng: random.Random, job_id: str, old: SchedJob | None) -> SchedJob:
    if old is not None and rng.random() < 0.6:
        # a change of an existing job: its state mostly, sometimes its queue or requests
        state = rng.choice(STATES)
        return replace(
            old, state=state,
            node_name=(rng.choice((None, "n0", "n1", "n9"))
                       if state is JobState.RUNNING else None),
            queue=rng.choice(QUEUES) if rng.random() < 0.1 else old.queue,
            priority=rng.choice((0, 0, 5)))
    requests = {"cpu": rng.choice((250, 1000, 4000, 64000)), "memory": rng.choice((1, 4)) << 30}
    if rng.random() < 0.15:
        requests["nvidia.com/gpu"] = 1
    if rng.random() < 0.03:
        requests["example.com/fpga"] = 1  # a resource no node has: a new axis, parked
    state = rng.choice(STATES)
    return SchedJob(
        job_id=job_id, queue=rng.choice(QUEUES), cluster=rng.choice(CLUSTERS),
        requests=Resources(requests), priority=rng.choice((0, 0, 5)),
        created_at=rng.random() * 100, state=state,
        node_name=rng.choice((None, "n0", "n1")) if state is JobState.RUNNING else None,
        placement=rng.choice(PLACEMENTS),
        controller=rng.choice(("", "", "rs-1", "rs-2")))


def _operate(state: SchedulerState, rng: random.Random, jobs: dict[str, SchedJob],
             step: int) -> None:
    roll = rng.random()
    if roll < 0.08:
        name = rng.choice(QUEUES)
        state.upsert_queue(QueueSpec(name=name, priority_factor=rng.choice((0.5, 1.0, 2.0)),
                                     cordoned=rng.random() < 0.25))
    elif roll < 0.11:
        state.remove_queue(rng.choice(QUEUES))
    elif roll < 0.18:
        cluster = rng.choice(CLUSTERS)
        name = f"n{rng.randrange(3)}"
        state.set_node(cluster, name, None if rng.random() < 0.2 else _node(rng))
    elif roll < 0.21:
        cluster = rng.choice(CLUSTERS)
        uid = rng.choice(("rs-1", "rs-2"))
        if rng.random() < 0.5:
            state.hold_controller(ControllerBackoff(cluster=cluster, controller_uid=uid,
                                                    attempts=1, given_up_at=0.0, until=1e18))
        else:
            state.release_controller((cluster, uid))
    elif roll < 0.26:
        schedule_round(state, max_decisions=rng.choice((1, 5, 50)), max_lookback_per_queue=10,
                       now=1000.0 + step)
        for job_id in list(jobs):
            current = state.job(job_id)
            if current is None:
                del jobs[job_id]
            else:
                jobs[job_id] = current
    elif roll < 0.36 and jobs:
        job_id = rng.choice(sorted(jobs))
        if rng.random() < 0.5:
            state.remove_job(job_id)
            del jobs[job_id]
        else:
            state.upsert_job(replace(jobs.pop(job_id), state=JobState.SUCCEEDED))
    else:
        job_id = (rng.choice(sorted(jobs)) if jobs and rng.random() < 0.4
                  else f"j{step}")
        job = _job(rng, job_id, jobs.get(job_id))
        state.upsert_job(job)
        jobs[job_id] = job


@pytest.mark.parametrize("seed", range(12))
def test_kept_inputs_equal_a_recount_after_random_operations(seed: int) -> None:
    rng = random.Random(seed)
    state = SchedulerState()
    jobs: dict[str, SchedJob] = {}
    for name in QUEUES[:3]:
        state.upsert_queue(QueueSpec(name=name))
    for step in range(300):
        _operate(state, rng, jobs, step)
        if rng.random() < 0.5:  # not after every step: some changes pile up between reads
            _compare(state)
    _compare(state)


def test_an_unchanged_state_returns_the_inputs_it_kept() -> None:
    state = SchedulerState()
    state.upsert_queue(QueueSpec(name="qa"))
    state.set_node("c1", "n0", NodeInfo(allocatable=Resources({"cpu": 8000})))
    state.upsert_job(SchedJob(job_id="j", queue="qa", cluster="c1",
                              requests=Resources({"cpu": 1000})))
    first = state.target_inputs()
    assert state.target_inputs() is first
    state.upsert_queue(QueueSpec(name="qa"))  # the same spec: nothing changed
    assert state.target_inputs() is first
    state.upsert_job(SchedJob(job_id="k", queue="qa", cluster="c1",
                              requests=Resources({"cpu": 1000})))
    second = state.target_inputs()
    assert second is not first
    assert second[2][0].amount == {"cpu": 2000.0}
    assert second[3] == first[3]  # the same slots: only amounts changed
    assert second[4] != first[4]


def test_a_queue_emptied_and_filled_again_keeps_the_structure() -> None:
    """A queue's last job released is, inside one change, taken out and put back: the queue is
    empty for an instant, its weight unchanged."""
    state = SchedulerState()
    state.upsert_queue(QueueSpec(name="qa"))
    state.set_node("c1", "n0", NodeInfo(allocatable=Resources({"cpu": 8000})))
    job = SchedJob(job_id="j", queue="qa", cluster="c1", requests=Resources({"cpu": 1000}))
    state.upsert_job(job)
    before = state.target_inputs()
    state.upsert_job(replace(job, state=JobState.RUNNING, node_name="n0"))
    after = state.target_inputs()
    assert after[3] == before[3]
    assert after[2][0].held == {"cpu": 1000.0}
    _compare(state)
