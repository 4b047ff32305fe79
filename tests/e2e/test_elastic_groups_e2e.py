"""An elastic pod group end to end: it grows and shrinks under fair share against a competing
queue, judged from what the apiserver shows. Every lockgate service runs as a process against
the real apiserver, kube-scheduler and kwok nodes of cluster-a (4 nodes of 16 cpu).

Pods of 8 cpu: the cluster holds 8, and two queues of the same weight that both wait have a fair
share of 4 each. The group (minimum 3, maximum 8, as Spark's minExecutors and maxExecutors):
- with room for 2 of its minimum of 3, none is released; once room for 3 frees, all 3 are
  released together, in one round;
- its later members are released one at a time, each in a round of its own, as room frees and
  only while the group's queue is below its fair share: a slot that frees when the group holds
  4 goes to the rival queue;
- members that end shrink the group (below its minimum: it keeps running) and the room they
  free goes back to its next members, one at a time, up to its fair share again.

No preemption (nothing of the rival's is evicted): room frees only as the test deletes pods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.groups import GROUP_LABEL, GROUP_MAX_SIZE_KEY, GROUP_MIN_SIZE_KEY
from lockgate.labels import SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

POD_CPU = "8"  # a 16-cpu node takes 2; the cluster 8
FAIR = 4  # either queue's fair share, in pods, while both wait


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path, name="elastic", standby_scheduler=False,
                            needs_empty_nodes=True, env={
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1"}) as run:
        # Nodes other runs add for a while are tainted (their pods tolerate it, ours do not):
        # lockgate's fair targets count only the nodes a pod may land on, the same for both
        # queues here.
        nodes = [n for n in (await run.core().list_node()).items if not n.spec.taints]
        sizes = sorted((n.metadata.name, n.status.allocatable.get("cpu")) for n in nodes)
        if len(nodes) != 4 or any(cpu != "16" for _, cpu in sizes):
            pytest.fail(f"this test sizes its pods for 4 untainted nodes of 16 cpu in cluster-a; "
                        f"the stack has {sizes} (LOCKGATE_STACK_NODE_CPU)")
        await run.create_queues([run.name("elastic"), run.name("rival")],
                                namespaces=[run.namespace])
        await run.create_namespace()
        yield run


def pod(name: str, queue: str, **annotations: str) -> dict[str, Any]:
    builder = (a_pod(name).in_queue(queue).never_restarted()
               .requesting(cpu=POD_CPU, memory="1Gi"))
    if annotations:
        builder = builder.labelled({GROUP_LABEL: "executors"}).annotated(annotations)
    return builder.manifest()


def executor(index: int, queue: str) -> dict[str, Any]:
    return pod(f"exec-{index}", queue,
               **{GROUP_MIN_SIZE_KEY: "3", GROUP_MAX_SIZE_KEY: "8"})


def released(pod_: client.V1Pod) -> bool:
    return SCHEDULING_GATE not in {gate.name for gate in pod_.spec.scheduling_gates or ()}


class Watch:
    """What the apiserver shows of the run's pods; every look checks that the group never
    holds more than its fair share while the rival queue has pods waiting."""

    def __init__(self, run: LockgateRun) -> None:
        self.run = run
        self.looks = 0

    async def released(self) -> tuple[list[str], list[str], int]:
        """Released executors, released rival pods, rival pods still gated."""
        listed = (await self.run.core().list_namespaced_pod(self.run.namespace)).items
        live = [p for p in listed if p.metadata.deletion_timestamp is None]
        executors = sorted(p.metadata.name for p in live
                           if p.metadata.name.startswith("exec-") and released(p))
        rivals = sorted(p.metadata.name for p in live
                        if p.metadata.name.startswith("rival-") and released(p))
        waiting = sum(1 for p in live
                      if p.metadata.name.startswith("rival-") and not released(p))
        self.looks += 1
        if waiting:
            assert len(executors) <= FAIR, (
                f"the group holds {len(executors)} ({executors}) while the rival queue, "
                f"{len(rivals)} released, has {waiting} waiting: more than its fair share")
        return executors, rivals, waiting

    async def until(self, executors: int, rivals: int, what: str) -> list[str]:
        async def there() -> list[str] | None:
            now_executors, now_rivals, _ = await self.released()
            return now_executors if (len(now_executors), len(now_rivals)) == (
                executors, rivals) else None
        return await eventually(there, within=90, every=0.2, what=what)

    async def steady(self, executors: int, rivals: int, seconds: float = 4.0) -> None:
        """Nothing moves for a few rounds (safety rounds come every second)."""
        import asyncio

        for _ in range(int(seconds / 0.5)):
            now_executors, now_rivals, _ = await self.released()
            assert (len(now_executors), len(now_rivals)) == (executors, rivals), (
                now_executors, now_rivals)
            await asyncio.sleep(0.5)


async def rounds_of(run: LockgateRun, names: list[str]) -> int:
    """In how many distinct rounds these pods were released."""
    return int(await run.pool.fetchval(
        "SELECT count(DISTINCT d.decided_at) FROM release_decisions d JOIN jobs j"
        " ON j.cluster = d.cluster AND j.uid = d.uid"
        " WHERE j.namespace = $1 AND j.name = ANY($2::text[])", run.namespace, names))


async def delete(run: LockgateRun, name: str) -> None:
    await run.core().delete_namespaced_pod(name, run.namespace, grace_period_seconds=0)


async def test_an_elastic_group_grows_and_shrinks_under_fair_share(run: LockgateRun) -> None:
    core = run.core()
    elastic, rival = run.name("elastic"), run.name("rival")
    watch = Watch(run)
    # The rival takes 6 of the 8 slots.
    for i in range(6):
        await core.create_namespaced_pod(run.namespace, pod(f"rival-{i}", rival))
    await watch.until(0, 6, "the rival's 6 pods to be released")
    # The group's minimum of 3 with room for 2: none goes.
    for i in range(3):
        await core.create_namespaced_pod(run.namespace, executor(i, elastic))

    async def stored() -> bool:
        count = await run.pool.fetchval(
            "SELECT count(*) FROM jobs WHERE namespace = $1 AND queue = $2"
            " AND pod_group_size = 3 AND pod_group_max_size = 8", run.namespace, elastic)
        return bool(count == 3)
    await eventually(stored, within=60, what="lockgate to store the 3 executors, min 3 max 8")
    await watch.steady(0, 6)
    # Room for 3: the minimum goes together, in one round.
    await delete(run, "rival-0")
    first = await watch.until(3, 5, "the group's minimum of 3 to be released")
    assert await rounds_of(run, first) == 1, "the minimum was released over several rounds"

    # Grow: 5 more executors (the group's maximum is 8) and 4 more rival pods, all waiting.
    for i in range(3, 8):
        await core.create_namespaced_pod(run.namespace, executor(i, elastic))
    for i in range(6, 10):
        await core.create_namespaced_pod(run.namespace, pod(f"rival-{i}", rival))
    await watch.steady(3, 5)
    # A slot frees: the group (3 of its fair 4) is the cheaper unit, and takes one member.
    await delete(run, "rival-1")
    grown = await watch.until(4, 4, "one more executor, released alone")
    (fourth,) = set(grown) - set(first)
    assert await rounds_of(run, [*first, fourth]) == 2, "the fourth went with the minimum?"
    # Another slot frees: the group holds its fair share, so the rival gets it.
    await delete(run, "rival-2")
    await watch.until(4, 4, "the rival to take the freed slot")
    await watch.steady(4, 4)

    # Shrink: an executor ends, then another; the group runs below its minimum (2 of 3) and
    # keeps running, and its next members take the room back alone, up to its fair share.
    ended = grown[:2]
    await delete(run, ended[0])
    await delete(run, ended[1])
    regrown = await watch.until(FAIR, 4, "the group to grow back to its fair share")
    assert not set(regrown) & set(ended)
    assert set(grown) - set(ended) <= set(regrown)  # below its minimum, the rest ran on
    assert len(set(regrown) - set(grown)) == 2
    await watch.steady(FAIR, 4)
    # The two waiting executors stay gated: the group holds its fair share, the rival waits.
    listed = (await core.list_namespaced_pod(run.namespace)).items
    assert sum(1 for p in listed if p.metadata.name.startswith("exec-")
               and not released(p)) == 8 - 2 - FAIR
    assert watch.looks > 20
