"""Fair shares for pinned pods, end to end (issue 17): the natural tests of weights and shapes.

Every lockgate service runs as a process on the real stack (two control planes with kwok nodes,
kube-controller-manager for Deployments and Jobs, kube-scheduler). Both clusters are lockgate's,
so the pool is cluster-a and cluster-b together, but every pod is created in cluster-a and is
pinned there: cluster-b stays idle. Workloads arrive over time, from Deployments and Jobs, with
the scheduler already running; nothing is staged. What the queues end up holding is judged
against an independent model of the constrained max-min fair allocation
(`devstack.fair_model`, linear programs, which shares no code with the scheduler), fed with
what the test itself created and the capacity the apiservers report.

- Weights under preemption: queues nw1 (weight 1) and nw2 (weight 2), a Deployment of 40 x 1
  cpu each, applied at the same moment. DRF against the pool alone sees both at 40/128, all they
  ask, and evicts nothing; the constrained targets are 24 : 40, and preemption ends there and
  then nothing moves.
- Weights without preemption: cluster-a is full of a third queue's Job pods that finish in
  four waves; nw1 and nw2 wait with 40 pods each. As room frees, nw2 is never behind its share
  of it (2 : 1 by weight, capped by its 40: 40 of every 64), and they end at 24 : 40.
- Shapes without preemption: queue comp keeps cluster-a full with Jobs of 1-cpu pods that
  finish after 30-36 s; queue q arrives with one 1-cpu scheduler and 30 workers of 2 cpu, one
  Deployment each (as the dask-kubernetes operator makes them). Every gap a finishing 1-cpu pod
  leaves is too small for a worker; room held for q's workers gets q at least 30 cpu within 60 s.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devstack.demo_weights import schedulable_capacity
from devstack.fair_model import Cluster, Demand, FairAllocation, fair_allocation
from devstack.stack import StackInfo
from helpers.pods import a_deployment, a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.labels import PREEMPTIBLE_LABEL, QUEUE_LABEL, SCHEDULING_GATE
from lockgate.resources import canonical_amount

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

# How long nothing may move once preemption has settled. The issue asks for 5 minutes; a round
# runs at least every second here (LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS=1), and an eviction
# thrash shows within a cycle of evict, recreate, queue and release (a few seconds), so 60 s
# covers dozens of cycles at a fraction of CI's 90-minute budget. Set it to 300 to run the
# issue's window.
SETTLED_SECONDS = float(os.environ.get("LOCKGATE_E2E_SETTLED_SECONDS", "60"))
MEMORY = "64Mi"  # every pod: cpu is the dominant resource


@dataclass
class Queues:
    run: LockgateRun
    namespaces: dict[str, str]  # queue -> its own namespace in cluster-a


async def start(stack: StackInfo, tmp_path: Path, name: str, queues: dict[str, float],
                preemption: bool, env: dict[str, str] | None = None) -> AsyncIterator[Queues]:
    async with lockgate_run(stack, tmp_path, name=name, clusters=("cluster-a", "cluster-b"),
                            needs_empty_nodes=True,
                            standby_scheduler=False, env={
                                "LOCKGATE_SCHEDULER_PREEMPTION_ENABLED": str(preemption).lower(),
                                "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1",
                                **(env or {})}) as run:
        namespaces = {run.name(queue): run.name(f"ns-{queue}") for queue in queues}
        for queue, weight in queues.items():
            await run.create_queue(run.name(queue), namespaces=[namespaces[run.name(queue)]],
                                   priority_factor=1 / weight)
        for namespace in namespaces.values():
            await run.create_namespace(name=namespace)
        yield Queues(run, namespaces)


async def capacity(run: LockgateRun) -> list[Cluster]:
    """Each cluster's schedulable capacity, as its apiserver reports it (not lockgate)."""
    return await schedulable_capacity({alias: run.apis[alias] for alias in run.clusters})


def shape(cpu: str) -> dict[str, float]:
    return {"cpu": float(canonical_amount("cpu", cpu)),
            "memory": float(canonical_amount("memory", MEMORY))}


def deployment(name: str, queue: str, replicas: int, cpu: str, *,
               preemptible: bool = False) -> dict[str, Any]:
    pod = a_pod(name).in_queue(queue).requesting(cpu=cpu, memory=MEMORY)
    if preemptible:
        pod = pod.labelled({PREEMPTIBLE_LABEL: "true"})
    return a_deployment(name).with_replicas(replicas).of(pod).manifest()


def job(name: str, queue: str, *, parallelism: int, completions: int, cpu: str,
        runs_for: str) -> dict[str, Any]:
    pod = (a_pod(name).in_queue(queue).never_restarted().requesting(cpu=cpu, memory=MEMORY)
           .completing_after(runs_for))
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": parallelism, "completions": completions,
                     "backoffLimit": 1000, "template": pod.template()}}


@dataclass(frozen=True)
class Holding:
    """What one queue holds in cluster-a right now, as the apiserver shows it."""

    bound: int  # pods on a node, not being deleted, not finished
    cpu: float  # their cpu, in cores
    waiting: int  # pods not on a node yet
    in_flight: int = 0  # of those, pods whose gate is already gone (released, not yet bound)


async def holdings(queues: Queues) -> dict[str, Holding]:
    run = queues.run
    found: dict[str, Holding] = {}
    for queue, namespace in queues.namespaces.items():
        pods = (await run.core().list_namespaced_pod(namespace)).items
        bound = [p for p in pods if p.spec.node_name and p.metadata.deletion_timestamp is None
                 and p.status.phase in ("Pending", "Running")
                 and p.metadata.labels.get(QUEUE_LABEL) == queue]
        waiting = [p for p in pods if not p.spec.node_name
                   and p.metadata.deletion_timestamp is None]
        in_flight = [p for p in waiting if not any(
            gate.name == SCHEDULING_GATE for gate in p.spec.scheduling_gates or ())]
        cpu = sum(canonical_amount("cpu", c.resources.requests["cpu"])
                  for p in bound for c in p.spec.containers) / 1000
        found[queue] = Holding(len(bound), cpu, len(waiting), len(in_flight))
    return found


async def evictions(run: LockgateRun) -> int:
    return int(await run.pool.fetchval(
        "SELECT count(*) FROM evictions WHERE kind = 'preempted'"))


def pods_of(model: FairAllocation, queue: str) -> float:
    return model.pods(queue)


# ---- weights, with preemption -----------------------------------------------------------------

# Where the leader solves the fair targets: in the round (a small fleet's default), or in its
# worker process with rounds using the last answer (the default at fleet scale; here forced
# with a threshold of 0 demands).
TARGETS_IN = {"round": {}, "worker": {"LOCKGATE_SCHEDULER_TARGETS_WORKER_MIN_DEMANDS": "0"}}


@pytest.fixture(params=sorted(TARGETS_IN))
async def weighted(stack: StackInfo, tmp_path: Path,
                   request: pytest.FixtureRequest) -> AsyncIterator[Queues]:
    async for queues in start(stack, tmp_path, f"pinw{request.param[0]}",
                              {"nw1": 1.0, "nw2": 2.0}, preemption=True,
                              env=TARGETS_IN[request.param]):
        yield queues


async def targets_solved_in_worker(run: LockgateRun) -> float:
    """The leader's count of fair targets its worker process solved, from its /metrics."""
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{run.health_port('fair-scheduler')}/metrics",
            timeout=aiohttp.ClientTimeout(total=5)) as reply:
        lines = (await reply.text()).splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("lockgate_scheduler_targets_solved_in_worker_total"))


async def test_weights_count_for_pinned_pods_and_preemption_settles_at_the_targets(
        weighted: Queues, request: pytest.FixtureRequest) -> None:
    run = weighted.run
    nw1, nw2 = run.name("nw1"), run.name("nw2")
    # Both Deployments at the same moment, the scheduler already running.
    await asyncio.gather(*(
        run.apps().create_namespaced_deployment(weighted.namespaces[queue], deployment(
            queue, queue, 40, "1", preemptible=True)) for queue in (nw1, nw2)))
    model = fair_allocation(
        clusters=await capacity(run), weights={nw1: 1.0, nw2: 2.0},
        demands=[Demand(queue, run.alias("cluster-a"), shape("1"), 40) for queue in (nw1, nw2)])
    want = {nw1: pods_of(model, nw1), nw2: pods_of(model, nw2)}
    assert round(want[nw1]) == 24 and round(want[nw2]) == 40, want  # the worked example

    async def at_targets() -> dict[str, Holding] | None:
        now = await holdings(weighted)
        ok = all(abs(now[queue].bound - want[queue]) <= 1 for queue in want)
        return now if ok else None

    await eventually(at_targets, within=300, every=1.0,
                     what=lambda: f"bound pods at the model's {want} (within one pod)")
    moved = await evictions(run)  # how many it took depends on how the pods arrived

    # Nothing moves afterwards: no eviction, and the holdings stay at the targets.
    started = time.monotonic()
    while time.monotonic() - started < SETTLED_SECONDS:
        now = await holdings(weighted)
        assert all(abs(now[queue].bound - want[queue]) <= 1 for queue in want), (
            f"moved after settling: {now}, model {want}")
        assert await evictions(run) == moved, "evicted again after settling"
        await asyncio.sleep(2.0)  # sampling the window, not waiting for a condition
    solved_in_worker = await targets_solved_in_worker(run)
    if request.node.callspec.params["weighted"] == "worker":
        assert solved_in_worker > 0, "the leader never used its targets worker"
    else:
        assert solved_in_worker == 0, "a small fleet's targets went to the worker"


# ---- weights, without preemption --------------------------------------------------------------

@pytest.fixture
async def contested(stack: StackInfo, tmp_path: Path) -> AsyncIterator[Queues]:
    async for queues in start(stack, tmp_path, "pinc", {"fill": 1.0, "nw1": 1.0, "nw2": 2.0},
                              preemption=False):
        yield queues


async def test_without_preemption_the_weight_two_queue_goes_first_when_both_wait(
        contested: Queues) -> None:
    run = contested.run
    fill, nw1, nw2 = run.name("fill"), run.name("nw1"), run.name("nw2")
    # cluster-a (64 cpu) filled by Jobs that finish in four waves, 16 pods each.
    for wave, seconds in enumerate((40, 48, 56, 64)):
        await run.batch().create_namespaced_job(contested.namespaces[fill], job(
            f"{fill}-{wave}", fill, parallelism=16, completions=16, cpu="1",
            runs_for=f"{seconds}s"))

    async def full() -> bool:
        return (await holdings(contested))[fill].bound == 64

    await eventually(full, within=120, every=0.5, what="the filler's 64 pods bound")
    for queue in (nw1, nw2):
        await run.apps().create_namespaced_deployment(
            contested.namespaces[queue], deployment(queue, queue, 40, "1"))

    async def both_wait() -> bool:
        now = await holdings(contested)
        return now[nw1].waiting == 40 and now[nw2].waiting == 40

    await eventually(both_wait, within=120, every=0.5, what="40 pods of each queue waiting")
    clusters = await capacity(run)

    def model_for(now: dict[str, Holding]) -> dict[str, float]:
        filler = now[fill].bound + now[fill].waiting
        model = fair_allocation(
            clusters=clusters, weights={fill: 1.0, nw1: 1.0, nw2: 2.0},
            demands=[Demand(queue, run.alias("cluster-a"), shape("1"), count)
                     for queue, count in ((fill, filler), (nw1, 40), (nw2, 40)) if count])
        return {queue: pods_of(model, queue) for queue in (nw1, nw2)}

    # While both wait for the same room, the room that frees goes in proportion to their
    # fair targets, which the model recomputes as the filler's demand shrinks (1 : 2 while it
    # holds on, 24 : 40 once it is gone): nw1 is never ahead of weight-2 nw2, nor nw2 ahead of
    # its share (a pod and a half either way: pods are whole). Judged at settled looks only:
    # no released pod still on its way to a node, and nothing changed since the look before.
    # A round's releases reach the apiserver one PATCH at a time and kube-scheduler binds them
    # in its own order, so a look in the middle of a burst (once: 3 : 10 of a round that
    # released 5 : 10) shows the pipeline's order, not the round's decision.
    seen: list[tuple[int, int]] = []
    judged = 0
    previous: dict[str, Holding] | None = None
    deadline = time.monotonic() + 240
    while True:
        now = await holdings(contested)
        want = model_for(now)
        a, b = now[nw1].bound, now[nw2].bound
        seen.append((a, b))
        settled = previous == now and not any(h.in_flight for h in now.values())
        previous = now
        if settled and now[nw1].waiting and now[nw2].waiting and a + b:
            judged += 1
            assert a / want[nw1] <= (b + 1.5) / want[nw2], (
                f"nw1 ahead of weight-2 nw2 (model {want}): {seen[-10:]}")
            assert b / want[nw2] <= (a + 1.5) / want[nw1], (
                f"nw2 ahead of its share (model {want}): {seen[-10:]}")
        if now[fill].bound == 0 and abs(a - want[nw1]) <= 1 and abs(b - want[nw2]) <= 1:
            assert round(want[nw1]) == 24 and round(want[nw2]) == 40, want
            break
        assert time.monotonic() < deadline, f"never reached the model's {want}: {seen[-10:]}"
        await asyncio.sleep(0.5)  # sampling while the waves finish
    assert len({b for _, b in seen}) >= 3, f"the room never freed in steps: {seen}"
    assert judged >= 5, f"only {judged} settled looks while both waited: {seen}"


# ---- shapes, without preemption ---------------------------------------------------------------

@pytest.fixture
async def shapes(stack: StackInfo, tmp_path: Path) -> AsyncIterator[Queues]:
    async for queues in start(stack, tmp_path, "pins", {"comp": 1.0, "q": 1.0},
                              preemption=False):
        yield queues


async def test_a_queue_of_big_pods_gets_its_share_against_a_stream_of_small_ones(
        shapes: Queues) -> None:
    run = shapes.run
    comp, q = run.name("comp"), run.name("q")
    # comp keeps 80 pods of 1 cpu going (64 fit), each finishing 30-36 s after it starts.
    for index, seconds in enumerate((30, 32, 34, 36)):
        await run.batch().create_namespaced_job(shapes.namespaces[comp], job(
            f"{comp}-{index}", comp, parallelism=20, completions=400, cpu="1",
            runs_for=f"{seconds}s"))

    async def comp_fills_and_waits() -> bool:
        now = (await holdings(shapes))[comp]
        return now.cpu >= 62 and now.waiting >= 4

    await eventually(comp_fills_and_waits, within=180, every=0.5,
                     what="comp's pods filling cluster-a with more waiting")
    # q arrives: a Dask cluster's scheduler and 30 workers, one Deployment each.
    arrived = time.monotonic()
    namespace = shapes.namespaces[q]
    await run.apps().create_namespaced_deployment(namespace, deployment(
        f"{q}-scheduler", q, 1, "1"))
    for worker in range(30):
        await run.apps().create_namespaced_deployment(namespace, deployment(
            f"{q}-worker-{worker}", q, 1, "2"))
    # comp's demand is what its Jobs keep going (4 x parallelism 20), not a count of its pods
    # at one moment: between a pod's end and its replacement the count dips.
    model = fair_allocation(
        clusters=await capacity(run), weights={comp: 1.0, q: 1.0},
        demands=[Demand(comp, run.alias("cluster-a"), shape("1"), 80),
                 Demand(q, run.alias("cluster-a"), shape("1"), 1),
                 Demand(q, run.alias("cluster-a"), shape("2"), 30)])
    fair_q_cpu = model.resources(q).get("cpu", 0.0) / 1000
    assert round(fair_q_cpu) == 32, model  # half of cluster-a: both ask for more than that

    async def q_holds_its_share() -> Holding | None:
        now = (await holdings(shapes))[q]
        return now if now.cpu >= min(30.0, fair_q_cpu - 2) else None

    held = await eventually(q_holds_its_share, within=60 - (time.monotonic() - arrived),
                            every=0.5, what=lambda: "q holding at least 30 cpu within 60 s of "
                            "its arrival")
    assert held.cpu <= fair_q_cpu + 2, f"q got more than its share: {held}"
