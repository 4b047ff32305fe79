"""Fairness end to end, judged by an independent model: per queue and pod shape, what the first
saturating round released must match DRF progressive filling (tests/helpers/progressive_filling)
to within one pod of each shape.

Four queues with weights 1:1:2:4 and two pod shapes (1 cpu / 1 GiB and 4 cpu / 8 GiB) ask for
far more than both clusters hold. The model gets only facts: the nodes and their room as Postgres
recorded them before the scheduler started, the queues' weights, and the pods in their queues'
release order (age).

Why the judgement is deterministic, on a busy machine too:
- The scheduler starts only after every pod is queued in Postgres, so its first round sees the
  whole backlog and is one complete progressive filling; the test judges exactly that round (the
  release decisions with the earliest decision time), not whatever later rounds did after
  kube-scheduler bound pods elsewhere than the round had in mind.
- Pods are created in waves, one (cluster, shape) per wave, each wave in a later second than the
  one before (creation timestamps have one-second resolution). Within a queue, pods of one wave
  are interchangeable, so the release order is fixed by age alone; no tie-break decides who gets
  what.
- Weights are powers of two, so equal costs are equal to the last bit in both.
Only one scheduler runs (no standby): the first round is the leader's first.

Isolation on the shared stack as in every end-to-end test (helpers.runs): its own database,
cluster aliases, queues, namespaces, webhook registration, consumer groups, ports; a trigger
keeps other runs' jobs and nodes out.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from devstack.stack import StackInfo
from helpers.pods import a_pod
from helpers.progressive_filling import Node, Pod, progressive_filling
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

# Priority factors (weight = 1 / factor): weights 1, 1, 2, 4; queue names are the run's own.
PRIORITY_FACTORS = {"w1a": 1.0, "w1b": 1.0, "w2": 0.5, "w4": 0.25}
SHAPES = {"small": {"cpu": "1", "memory": "1Gi"}, "big": {"cpu": "4", "memory": "8Gi"}}
GI = 2**30
CANONICAL = {"small": {"cpu": 1000, "memory": GI}, "big": {"cpu": 4000, "memory": 8 * GI}}
SCHEDULER = "fair-scheduler"


def factors(run: LockgateRun) -> dict[str, float]:
    """The run's queue names and their priority factors."""
    return {run.name(base): factor for base, factor in PRIORITY_FACTORS.items()}


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    # The scheduler starts later, once the whole backlog is queued (see the docstring).
    async with lockgate_run(stack, tmp_path, name="drf", clusters=("cluster-a", "cluster-b"),
                            needs_empty_nodes=True,
                            standby_scheduler=False,
                            services=["queue-store", "admission-webhook", "cluster-watcher",
                                      "ungater"]) as run:
        await run.create_queues({queue: {"priority_factor": factor}
                                 for queue, factor in factors(run).items()},
                                namespaces=[run.namespace])
        for alias in run.apis:
            await run.create_namespace(alias)
        yield run


# ---------------------------------------------------------------- facts from Postgres


async def nodes_as_recorded(pool: asyncpg.Pool) -> list[Node]:
    """The schedulable nodes of this run's clusters and what unmanaged pods use on them."""
    rows = await pool.fetch(
        "SELECT cluster, node, allocatable, unmanaged_usage FROM cluster_nodes"
        " WHERE present AND schedulable ORDER BY cluster, node")
    return [Node(name=f"{r['cluster']}/{r['node']}", cluster=r["cluster"],
                 allocatable=_ints(r["allocatable"]), used=_ints(r["unmanaged_usage"]))
            for r in rows]


def _ints(value: Any) -> dict[str, int]:
    mapping = json.loads(value) if isinstance(value, str) else (value or {})
    return {name: int(amount) for name, amount in mapping.items()}


async def queued_pods_in_release_order(pool: asyncpg.Pool, queues: Mapping[str, float]
                                       ) -> list[Pod]:
    """Every pod of this run, each queue's oldest first (all have priority 0)."""
    rows = await pool.fetch(
        "SELECT cluster, name, queue, requests, created_at, priority FROM jobs"
        " WHERE queue = ANY($1::text[]) ORDER BY created_at, cluster, name", list(queues))
    assert {r["priority"] for r in rows} == {0}, "the model assumes one priority"
    return [Pod(name=f"{r['cluster']}/{r['name']}", queue=r["queue"], cluster=r["cluster"],
                requests=_ints(r["requests"]), shape=r["name"].split("-")[0]) for r in rows]


async def first_round(pool: asyncpg.Pool, queues: Mapping[str, float]
                      ) -> dict[str, Counter[str]]:
    """Per queue and shape, what the scheduler's first round released."""
    rows = await pool.fetch(
        "SELECT j.queue, j.name FROM release_decisions d JOIN jobs j USING (cluster, uid)"
        " WHERE d.decided_at = (SELECT min(decided_at) FROM release_decisions)")
    released = {queue: Counter[str]() for queue in queues}
    for row in rows:
        released[row["queue"]][row["name"].split("-")[0]] += 1
    return released


# ---------------------------------------------------------------- creating the backlog


async def create_wave(run: LockgateRun, alias: str, shape: str, per_queue: int) -> None:
    """`per_queue` pods of one shape for every queue in one cluster, a few at a time."""
    gate = asyncio.Semaphore(8)

    async def create(queue: str, i: int) -> None:
        # Tolerating every taint, as the demo's pods do: this test is about shares, not nodes.
        manifest = (a_pod(f"{shape}-{queue}-{i}").in_queue(queue).never_restarted()
                    .requesting(**SHAPES[shape]).tolerating(operator="Exists").manifest())
        async with gate:
            await run.create_pod(manifest, alias=alias)

    await asyncio.gather(*(create(queue, i) for queue in factors(run)
                           for i in range(per_queue)))


async def next_second() -> None:
    """Until the wall clock is in a later whole second than when called (plus a margin), so
    that pods created afterwards get a later creationTimestamp than every pod before."""
    await asyncio.sleep(int(time.time()) + 1.05 - time.time())


async def wait_for_queued_jobs(pool: asyncpg.Pool, queues: Mapping[str, float], count: int, *,
                               within: float) -> None:
    queued: list[int] = [0]

    async def all_queued() -> bool:
        queued.append(await pool.fetchval(
            "SELECT count(*) FROM jobs WHERE queue = ANY($1::text[]) AND state = 'queued'",
            list(queues)))
        return queued[-1] >= count

    await eventually(all_queued, within=within, every=0.3,
                     what=lambda: f"{count} pods queued in Postgres (have {queued[-1]})")


# ---------------------------------------------------------------- the test


async def test_first_saturating_round_matches_progressive_filling(run: LockgateRun) -> None:
    queues = factors(run)
    clusters = sorted(run.clusters)
    a, b = run.alias("cluster-a"), run.alias("cluster-b")
    nodes = await eventually(lambda: _nodes_of_both(run.pool, clusters), within=60,
                             what="the nodes of both clusters recorded")
    cluster_cpu = min(sum(n.allocatable.get("cpu", 0) for n in nodes if n.cluster == alias)
                      for alias in clusters) // 1000
    # Per queue and cluster, about 0.8 of a cluster in total: four queues want ~3x what is there,
    # so even the heaviest queue (half the pool) still waits in both clusters at the end.
    bigs, smalls = max(2, cluster_cpu // 8), max(4, cluster_cpu * 5 // 16)
    waves = [(a, "big", bigs), (b, "small", smalls), (b, "big", bigs), (a, "small", smalls)]
    for alias, shape, per_queue in waves:
        await create_wave(run, alias, shape, per_queue)
        await next_second()
    created = sum(per_queue for _, _, per_queue in waves) * len(queues)
    await wait_for_queued_jobs(run.pool, queues, created, within=180)

    pods = await queued_pods_in_release_order(run.pool, queues)
    assert len(pods) == created
    nodes = await nodes_as_recorded(run.pool)
    await run.start(SCHEDULER)
    await eventually(lambda: _has_decisions(run.pool), within=60, every=0.2,
                     what="the scheduler's first round")
    released = await first_round(run.pool, queues)
    nodes_after = await nodes_as_recorded(run.pool)
    assert nodes_after == nodes, (
        "nodes or what unmanaged pods use on them changed while the scheduler started, so the "
        f"model's input is not the round's: before {nodes}, after {nodes_after}")

    model = progressive_filling(weights={q: 1 / f for q, f in queues.items()},
                                nodes=nodes, pods=pods)
    context = (f"released {_plain(released)}; model {_plain(model.released)}; "
               f"model shares {model.shares}")
    # Saturated: by the model, no node of either cluster has room for even a small pod, and
    # every queue still has pods of both shapes waiting in both clusters.
    small = CANONICAL["small"]
    assert all(any(room.get(r, 0) < amount for r, amount in small.items())
               for room in model.free.values()), f"not saturated: {model.free}; {context}"
    waiting = Counter((p.queue, p.cluster) for p in pods if p.name not in model.placed)
    assert all(waiting[(q, c)] > 0 for q in queues for c in clusters), (
        f"not every queue waits in every cluster: {waiting}; {context}")
    for queue in queues:
        for shape in SHAPES:
            assert abs(released[queue][shape] - model.released[queue][shape]) <= 1, (
                f"{queue} {shape}: released {released[queue][shape]}, model "
                f"{model.released[queue][shape]}; {context}")
    # The heavier queues got more, in the weights' proportion (the model says by how much).
    shares = {base: model.shares[run.name(base)] for base in PRIORITY_FACTORS}
    assert shares["w4"] > shares["w2"] > shares["w1a"], shares


async def _nodes_of_both(pool: asyncpg.Pool, clusters: list[str]) -> list[Node] | None:
    nodes = await nodes_as_recorded(pool)
    return nodes if {node.cluster for node in nodes} == set(clusters) else None


async def _has_decisions(pool: asyncpg.Pool) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM release_decisions"))


def _plain(counts: dict[str, Counter[str]] | Any) -> dict[str, dict[str, int]]:
    return {queue: dict(shapes) for queue, shapes in counts.items()}
