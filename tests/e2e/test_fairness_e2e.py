"""Fairness end to end: every lockgate service as a process, pods created through the API.

Three queues with weights 1:1:2 ask for more than both clusters hold. The test checks what a user
would see: once full, each queue runs its weighted share (within one job); capacity freed by pods
that complete goes to the most under-served queue; a pod too big for any node waits without
holding up the others; and when the leading scheduler is SIGKILLed mid-run the standby carries
on and no pod is released twice.

Isolation on the shared stack (helpers.runs): a database of its own; the real clusters under
names of its own (so other runs' commands and events cannot be confused with these); its own
webhook registration, serving only namespaces that carry this run's label; consumer groups that
start at the current end of the topics; free ports. Other runs' cluster-watchers may be watching
the same clusters under other names, and their events reach this run's queue-store through the
shared topics: a trigger in this run's database keeps only jobs and nodes of this run's cluster
names, as if those watchers did not exist.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.kafka import TopicTail
from helpers.pods import COMPLETE_ANNOTATION, a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.services import fairness_report
from helpers.waiting import eventually, until
from lockgate.events import RELEASE_OUTCOMES, ReleaseOutcomeKind
from lockgate.labels import QUEUE_LABEL, SCHEDULING_GATE
from lockgate.resources import Resources

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

PRIORITY_FACTORS = {"light1": 1.0, "light2": 1.0, "heavy": 0.5}  # weights 1:1:2
POD_CPU, POD_MEMORY = "4", "1Gi"
TOO_BIG_CPU = "1000"  # more than any node has
LEADER, STANDBY = "fair-scheduler", "fair-scheduler-standby"


def factors(run: LockgateRun) -> dict[str, float]:
    """The run's queue names and their priority factors."""
    return {run.name(base): factor for base, factor in PRIORITY_FACTORS.items()}


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    # The schedulers start later, once the whole backlog is queued (see the test).
    async with lockgate_run(stack, tmp_path, name="fair", clusters=("cluster-a", "cluster-b"),
                            needs_empty_nodes=True,
                            standby_scheduler=True,
                            services=["queue-store", "admission-webhook", "cluster-watcher",
                                      "ungater"]) as run:
        await run.create_queues({queue: {"priority_factor": factor}
                                 for queue, factor in factors(run).items()},
                                namespaces=[run.namespace])
        for alias in run.apis:
            await run.create_namespace(alias)
        yield run


@pytest.fixture
async def outcomes(run: LockgateRun) -> AsyncIterator[TopicTail]:
    """Release outcomes for this run's clusters, from before any scheduler runs."""
    async with TopicTail(run.lockgate.kafka_bootstrap, [RELEASE_OUTCOMES],
                         keep=lambda outcome: outcome.cluster in run.clusters) as tail:
        yield tail


# ---------------------------------------------------------------- pods


def pod(name: str, queue: str, *, cpu: str = POD_CPU) -> dict[str, Any]:
    """A pod as a user writes it: no gate, just the queue label (the webhook does the rest)."""
    return (a_pod(name).in_queue(queue).never_restarted()
            .requesting(cpu=cpu, memory=POD_MEMORY).manifest())


@dataclass(frozen=True)
class PodView:
    alias: str
    name: str
    uid: str
    queue: str
    gated: bool
    phase: str


async def pods_of(run: LockgateRun) -> list[PodView]:
    views = []
    for alias, api in run.apis.items():
        listed = await client.CoreV1Api(api).list_namespaced_pod(run.namespace)
        for item in listed.items:
            gates = {gate.name for gate in item.spec.scheduling_gates or ()}
            views.append(PodView(alias, item.metadata.name, item.metadata.uid,
                                 (item.metadata.labels or {}).get(QUEUE_LABEL, ""),
                                 SCHEDULING_GATE in gates, item.status.phase or ""))
    return views


def released_per_queue(pods: list[PodView]) -> Counter[str]:
    """Pods lockgate let go (gate removed) that still hold room: pending to bind, or running."""
    return Counter(p.queue for p in pods if not p.gated and p.phase in ("Pending", "Running"))


async def create_pods(run: LockgateRun, per_queue_and_cluster: int, *, first: int = 0) -> None:
    for i in range(first, first + per_queue_and_cluster):
        for api in run.apis.values():
            for queue in factors(run):
                await client.CoreV1Api(api).create_namespaced_pod(
                    run.namespace, pod(f"{queue}-{i}", queue))


async def pool_capacity_in_pods(apis: Mapping[str, client.ApiClient]) -> int:
    """How many of this test's pods all schedulable nodes hold when empty (cpu decides)."""
    per_pod = Resources.from_kubernetes({"cpu": POD_CPU})["cpu"]
    total = 0
    for api in apis.values():
        for node in (await client.CoreV1Api(api).list_node()).items:
            if node.spec.unschedulable:
                continue
            total += Resources.from_kubernetes(node.status.allocatable)["cpu"] // per_pod
    return total


async def room_for_more(run: LockgateRun) -> dict[str, int]:
    """node → how many more of this test's pods it would hold, counting the requests of every
    pod bound to it (any namespace, other runs' too); a cluster whose released pods not yet
    bound would fill that room is left out, as are nodes without room."""
    per_pod = Resources.from_kubernetes({"cpu": POD_CPU, "memory": POD_MEMORY})
    room: dict[str, int] = {}
    for alias, api in run.apis.items():
        core = client.CoreV1Api(api)
        used: dict[str, Resources] = {}
        for item in (await core.list_pod_for_all_namespaces()).items:
            if item.spec.node_name and item.status.phase not in ("Succeeded", "Failed"):
                used[item.spec.node_name] = used.get(item.spec.node_name, Resources()) + (
                    Resources.sum(Resources.from_kubernetes(c.resources.requests
                                                            if c.resources else None)
                                  for c in item.spec.containers))
        in_cluster: dict[str, int] = {}
        for node in (await core.list_node()).items:
            if node.spec.unschedulable or any(t.effect in ("NoSchedule", "NoExecute")
                                              for t in node.spec.taints or ()):
                continue
            free = (Resources.from_kubernetes(node.status.allocatable)
                    - used.get(node.metadata.name, Resources()))
            fits = min(free[name] // amount for name, amount in per_pod.items())
            if fits > 0:
                in_cluster[f"{alias}/{node.metadata.name}"] = fits
        ours = (await core.list_namespaced_pod(run.namespace)).items
        about_to_bind = sum(1 for item in ours if not item.spec.node_name
                            and item.status.phase == "Pending" and not any(
                                g.name == SCHEDULING_GATE
                                for g in item.spec.scheduling_gates or ()))
        if sum(in_cluster.values()) > about_to_bind:
            room.update(in_cluster)
    return room


async def wait_until_steady(run: LockgateRun, *, quiet_seconds: float,
                            within: float) -> list[PodView]:
    """Pods once no gate has been removed for `quiet_seconds`."""
    deadline = time.monotonic() + within
    last_released: frozenset[str] = frozenset()
    since = time.monotonic()
    while True:
        pods = await pods_of(run)
        released = frozenset(p.uid for p in pods if not p.gated)
        if released != last_released:
            last_released, since = released, time.monotonic()
        elif time.monotonic() - since >= quiet_seconds:
            return pods
        assert time.monotonic() < deadline, (
            f"timed out after {within:.0f}s waiting for {quiet_seconds}s without a gate removed "
            f"({len(last_released)} pods released so far)")
        await asyncio.sleep(0.5)


# ---------------------------------------------------------------- the scenario


async def describe(run: LockgateRun, pods: list[PodView]) -> str:
    """What Kubernetes and Postgres say, for assertion messages."""
    phases = Counter((p.queue, "gated" if p.gated else p.phase) for p in pods)
    rows = await run.pool.fetch(
        "SELECT queue, state, count(*) AS n FROM jobs WHERE queue = ANY($1::text[])"
        " GROUP BY queue, state", list(factors(run)))
    nodes = await run.pool.fetch(
        "SELECT cluster, count(*) AS n FROM cluster_nodes WHERE present GROUP BY cluster")
    return (f"pods {dict(phases)}; jobs {[tuple(r) for r in rows]}; "
            f"nodes {[tuple(r) for r in nodes]}")


async def wait_for_queued_jobs(run: LockgateRun, count: int, *, within: float) -> None:
    queued: list[int] = []

    async def all_queued() -> bool:
        queued.append(await run.pool.fetchval(
            "SELECT count(*) FROM jobs WHERE queue = ANY($1::text[]) AND state = 'queued'",
            list(factors(run))))
        return queued[-1] >= count

    await eventually(all_queued, within=within, every=0.3,
                     what=lambda: f"{count} pods queued in Postgres (have {queued[-1]})")


async def test_weighted_shares_freed_capacity_big_pods_and_leader_failover(
        run: LockgateRun, outcomes: TopicTail) -> None:
    queues = factors(run)
    light1, light2, heavy = queues
    weights = {queue: 1 / factor for queue, factor in queues.items()}
    capacity = await pool_capacity_in_pods(run.apis)
    # Every queue asks for more than the heaviest share of the pool, split over both clusters.
    per_queue_and_cluster = capacity // 4 + 3
    big_alias = next(iter(run.apis))
    await client.CoreV1Api(run.apis[big_alias]).create_namespaced_pod(
        run.namespace, pod("too-big", light2, cpu=TOO_BIG_CPU))
    await create_pods(run, per_queue_and_cluster)
    created = 1 + per_queue_and_cluster * len(run.apis) * len(queues)
    pods = await pods_of(run)
    assert len(pods) == created and all(p.gated for p in pods), "the webhook did not gate"

    # The backlog is complete before any scheduler runs, so the first rounds divide a
    # contended pool (releasing as pods trickle in would hand it out first come first served).
    await wait_for_queued_jobs(run, created, within=120)
    await run.start(LEADER, STANDBY)

    # Full: each queue holds its weighted share of what was released, within one job.
    pods = await wait_until_steady(run, quiet_seconds=4, within=180)
    released = released_per_queue(pods)
    gated = Counter(p.queue for p in pods if p.gated and p.name != "too-big")
    assert all(gated[queue] > 0 for queue in queues), (
        f"not every queue still waits, so the pool is not contended: {gated}")
    total = sum(released.values())
    state = await describe(run, pods)
    # Work-conserving: with pods of every queue still waiting, no node has room for one more.
    room = await room_for_more(run)
    assert not room, f"{total} pods released, yet nodes have room for more: {room}; {state}"
    for queue, weight in weights.items():
        fair = total * weight / sum(weights.values())
        assert abs(released[queue] - fair) <= 1, (queue, dict(released), fair, state)
    # The pod too big for any node waits, and its queue got its share regardless.
    too_big = next(p for p in pods if p.name == "too-big")
    assert too_big.gated, "a pod too big for every node was released"
    report = await fairness_report(run.health_port(LEADER))
    assert report["leader"] is True
    by_queue = {q["name"]: q for q in report["queues"]}
    assert by_queue[light2]["unschedulable"] == 1, f"{by_queue[light2]}; {state}"
    # Pods of other runs in the same clusters may count as queues of their own: compare ratios.
    assert by_queue[heavy]["fair_share"] == pytest.approx(2 * by_queue[light1]["fair_share"])
    assert by_queue[light2]["fair_share"] == pytest.approx(by_queue[light1]["fair_share"])

    # The leader dies; the standby takes over.
    await run.kill(LEADER)
    await eventually(run.lockgate.processes[STANDBY].ready, within=30, every=0.2,
                     what="the standby to take over")

    # Freed capacity goes to the most under-served queue: complete three of light1's pods.
    before = {p.uid for p in pods if not p.gated}
    finishing = [p for p in pods if p.queue == light1 and p.phase == "Running"][:3]
    assert len(finishing) == 3, "light1 has fewer than three running pods"
    for finished in finishing:
        await client.CoreV1Api(run.apis[finished.alias]).patch_namespaced_pod(
            finished.name, run.namespace,
            {"metadata": {"annotations": {COMPLETE_ANNOTATION: "1s"}}})
    newly: list[PodView] = []

    async def three_released() -> bool:
        newly[:] = [p for p in await pods_of(run) if not p.gated and p.uid not in before]
        return len(newly) >= 3

    await eventually(three_released, within=60, every=0.2,
                     what=lambda: f"freed capacity to be reused: {newly}")
    assert [p.queue for p in newly] == [light1] * 3, newly
    pods = await wait_until_steady(run, quiet_seconds=3, within=60)

    # Nothing released twice, across the failover: one decision per released pod, and every
    # gate removed exactly once.
    ungated_uids = {p.uid for p in pods if not p.gated}
    decisions = await run.pool.fetch(
        "SELECT uid, count(*) AS n, min(decided_by) AS by FROM release_decisions GROUP BY uid")
    assert {row["uid"] for row in decisions} == ungated_uids
    assert all(row["n"] == 1 for row in decisions), [dict(r) for r in decisions if r["n"] > 1]
    deciders = Counter(row["by"] for row in decisions)
    assert deciders["scheduler-0"] > 0 and deciders["scheduler-1"] == 3, deciders
    await until(lambda: len({o.uid for o in outcomes.events()}) >= len(ungated_uids),
                within=30, every=0.2, what="an outcome of every release")
    removed = Counter(o.uid for o in outcomes.events()
                      if o.outcome is ReleaseOutcomeKind.UNGATED and o.reason == "gate removed")
    assert set(removed) == ungated_uids
    assert all(n == 1 for n in removed.values()), removed
    assert not outcomes.events(lambda o: o.outcome is ReleaseOutcomeKind.FAILED)
    assert run.lockgate.crashed() == [LEADER], run.lockgate.crashed()
