"""Pod groups and preemption end to end: every lockgate service as a process, real apiserver,
kube-controller-manager (Deployments), kube-scheduler and kwok nodes.

One cluster is watched (cluster-a, 4 nodes of 16 cpu), so the pool is that cluster: 8 pods of
8 cpu fill it. Pod groups: a group of 8 with room for 7 is not released; once room for the
eighth appears all 8 are released in one round; a group that never fills up times out as its
queue says (deleted, with an Event and a row in `evictions`). Preemption: queue A's Deployment of
preemptible pods (and one pod that is not preemptible) fills the cluster; queue B, same weight,
arrives with pods that wait; A is evicted down to its fair share, B's pods are released, nothing
not preemptible is evicted, and over a further window of rounds nothing is evicted again. The
same for a pod group: B's complete group of 4 gets room by evicting 4 of A's pods, and runs
whole, released in one round.

Each test runs lockgate of its own (helpers.runs): a database, cluster alias, namespace, queues,
webhook registration and consumer groups named for that test alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.pods import a_deployment, a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.services import fairness_report
from helpers.waiting import eventually
from lockgate.groups import GROUP_LABEL, GROUP_SIZE_KEY
from lockgate.labels import PREEMPTIBLE_LABEL, SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

GROUP_TIMEOUT_SECONDS = 8.0
POD_CPU = "8"  # a 16-cpu node takes 2; the cluster 8


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path, name="gang", standby_scheduler=False,
                            needs_empty_nodes=True, env={
            "LOCKGATE_SCHEDULER_PREEMPTION_ENABLED": "true",
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1"}) as run:
        core = run.core()
        nodes = (await core.list_node()).items
        sizes = sorted((n.metadata.name, n.status.allocatable.get("cpu")) for n in nodes)
        if len(nodes) != 4 or any(cpu != "16" for _, cpu in sizes):
            pytest.fail(f"this test sizes its pods for 4 nodes of 16 cpu in cluster-a; "
                        f"the stack has {sizes} (LOCKGATE_STACK_NODE_CPU)")
        queues: dict[str, dict[str, Any]] = {
            run.name(name): {} for name in ("filler", "gang", "qa", "qb")}
        queues[run.name("late")] = {"group_timeout_seconds": GROUP_TIMEOUT_SECONDS,
                                    "group_timeout_action": "delete"}
        await run.create_queues(queues, namespaces=[run.namespace])
        await run.create_namespace()
        yield run


def pod(name: str, queue: str, *, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    builder = (a_pod(name).in_queue(queue).never_restarted()
               .requesting(cpu=POD_CPU, memory="1Gi"))
    if labels:
        builder = builder.labelled(labels)
    if annotations:
        builder = builder.annotated(annotations)
    return builder.manifest()


def member(name: str, queue: str, group: str, size: int) -> dict[str, Any]:
    return pod(name, queue, labels={GROUP_LABEL: group}, annotations={GROUP_SIZE_KEY: str(size)})


async def pods(run: LockgateRun, prefix: str = "") -> list[client.V1Pod]:
    listed = await run.core().list_namespaced_pod(run.namespace)
    return [p for p in listed.items if p.metadata.name.startswith(prefix)]


def released(pod_: client.V1Pod) -> bool:
    return SCHEDULING_GATE not in {gate.name for gate in pod_.spec.scheduling_gates or ()}


async def wait_queued(run: LockgateRun, names: list[str]) -> None:
    """Until lockgate knows every one of these pods (and so has judged them at least once)."""
    async def all_known() -> bool:
        count = await run.pool.fetchval(
            "SELECT count(*) FROM jobs WHERE namespace = $1 AND name = ANY($2::text[])",
            run.namespace, names)
        return bool(count == len(names))
    await eventually(all_known, within=60, what=f"lockgate to store pods {names}")


async def rounds(run: LockgateRun, count: int) -> dict[str, Any]:
    """Until the leader has finished `count` more rounds (safety rounds come every second);
    returns the last one's report."""
    seen: set[str] = set()
    report: dict[str, Any] = {}

    async def another() -> bool:
        nonlocal report
        report = await fairness_report(run.lockgate.ports.scheduler_health)
        at = (report.get("last_round") or {}).get("at")
        if at is not None:
            seen.add(at)
        return len(seen) > count  # the first one seen may have been under way already
    await eventually(another, within=120, every=0.1, what=f"{count} scheduling rounds")
    return report


def skipped(report: dict[str, Any], queue: str) -> dict[str, int]:
    return next((q["skipped_last_round"] for q in report["queues"] if q["name"] == queue), {})


async def test_a_group_is_released_whole_only_when_every_member_fits(run: LockgateRun) -> None:
    # The filler takes one 8-cpu slot: room for 7 of the group's 8 members.
    await run.core().create_namespaced_pod(run.namespace, pod("filler", run.name("filler")))
    await eventually(lambda: _bound(run, "filler"), within=60, what="the filler pod to run")
    names = [f"gang-{i}" for i in range(8)]
    for name in names:
        await run.core().create_namespaced_pod(run.namespace,
                                               member(name, run.name("gang"), "g8", 8))
    await wait_queued(run, names)

    async def judged_without_room() -> bool:
        # A round saw the complete group and found no room for all of it at once.
        return "no_node_with_room" in skipped(await rounds(run, 1), run.name("gang"))
    await eventually(judged_without_room, within=120, what="a round to find no room for g8")
    await rounds(run, 3)
    assert not any(released(p) for p in await pods(run, "gang-")), "a member was released"
    # Room for the eighth.
    await run.core().delete_namespaced_pod("filler", run.namespace, grace_period_seconds=0)

    async def all_released() -> bool:
        return sum(released(p) for p in await pods(run, "gang-")) == 8
    await eventually(all_released, within=60, what="all 8 members to be released")
    decided = await run.pool.fetch(
        "SELECT DISTINCT d.decided_at FROM release_decisions d JOIN jobs j"
        " ON j.cluster = d.cluster AND j.uid = d.uid WHERE j.queue = $1", run.name("gang"))
    assert len(decided) == 1, f"the group was released over {len(decided)} rounds"


async def test_a_group_that_never_fills_up_times_out_as_its_queue_says(run: LockgateRun) -> None:
    names = [f"late-{i}" for i in range(3)]
    for name in names:
        await run.core().create_namespaced_pod(run.namespace,
                                               member(name, run.name("late"), "g4", 4))
    await wait_queued(run, names)

    async def all_gone() -> bool:
        return not await pods(run, "late-")
    await eventually(all_gone, within=GROUP_TIMEOUT_SECONDS + 60,
                     what="the timed-out group's members to be deleted")
    rows = await run.pool.fetch("SELECT name, kind, action, message, decided_at FROM evictions"
                                " WHERE queue = $1", run.name("late"))
    assert sorted(r["name"] for r in rows) == names
    assert {(r["kind"], r["action"]) for r in rows} == {("group_timeout", "delete")}
    assert "3 of 4 members" in rows[0]["message"]
    created = await run.pool.fetchval("SELECT min(created_at) FROM jobs WHERE queue = $1",
                                      run.name("late"))
    assert (rows[0]["decided_at"] - created).total_seconds() >= GROUP_TIMEOUT_SECONDS
    events = await run.core().list_namespaced_event(run.namespace)
    reasons = {(e.involved_object.name, e.reason) for e in events.items}
    assert {(name, "LockgateGroupTimedOut") for name in names} <= reasons


async def test_preemption_frees_room_down_to_fair_share_and_does_not_thrash(
        run: LockgateRun) -> None:
    # A: one pod that is not preemptible, and a Deployment of 7 preemptible ones: the cluster.
    await run.core().create_namespaced_pod(run.namespace, pod("a-fixed", run.name("qa")))
    await run.apps().create_namespaced_deployment(run.namespace,
                                                  deployment("a-deploy", run.name("qa"), 7))

    async def a_fills() -> bool:
        return sum(1 for p in await pods(run, "a-") if _running(p)) == 8
    await eventually(a_fills, within=90, what="queue A's 8 pods to run")
    fixed_uid = (await run.core().read_namespaced_pod("a-fixed", run.namespace)).metadata.uid
    # B, same weight, arrives with pods that wait.
    b_names = [f"b-{i}" for i in range(8)]
    for name in b_names:
        await run.core().create_namespaced_pod(run.namespace, pod(name, run.name("qb")))

    async def b_has_four() -> bool:
        return sum(1 for p in await pods(run, "b-") if _running(p)) == 4
    await eventually(b_has_four, within=90, what="queue B to get its fair share (4 pods)")
    evicted = await run.pool.fetch("SELECT name, kind, for_queue, message FROM evictions")
    assert len(evicted) == 4, evicted
    assert all(r["kind"] == "preempted" and r["for_queue"] == run.name("qb") for r in evicted)
    assert all(r["name"].startswith("a-deploy-") for r in evicted)  # only preemptible pods
    # A is down to its fair share: 4 running, its Deployment's new pods wait (gated).
    a_pods = await pods(run, "a-")
    assert sum(1 for p in a_pods if _running(p)) == 4
    assert sum(1 for p in a_pods if not released(p)) == 4
    events = await run.core().list_namespaced_event(run.namespace)
    preempted = {e.involved_object.name for e in events.items
                 if e.reason == "LockgatePreempted"}
    assert preempted == {r["name"] for r in evicted}
    # A further window of rounds: nothing is evicted again, nothing moves.
    await rounds(run, 10)
    assert await run.pool.fetchval("SELECT count(*) FROM evictions") == 4
    assert sum(1 for p in await pods(run, "b-") if _running(p)) == 4
    fixed = await run.core().read_namespaced_pod("a-fixed", run.namespace)
    assert fixed.metadata.uid == fixed_uid, "the pod that is not preemptible was replaced"


@pytest.mark.timeout(180)
async def test_a_group_below_its_fair_share_gets_room_by_preemption_all_at_once(
        run: LockgateRun) -> None:
    # A's Deployment of preemptible pods fills the cluster.
    await run.apps().create_namespaced_deployment(run.namespace,
                                                  deployment("a-deploy", run.name("qa"), 8))

    async def a_fills() -> bool:
        return sum(1 for p in await pods(run, "a-") if _running(p)) == 8
    await eventually(a_fills, within=45, what="queue A's 8 pods to run")
    # B, same weight, arrives with a complete group of 4: exactly its fair share.
    names = [f"bg-{i}" for i in range(4)]
    for name in names:
        await run.core().create_namespaced_pod(run.namespace, member(name, run.name("qb"), "bg", 4))

    async def group_runs() -> bool:
        group = await pods(run, "bg-")
        return len(group) == 4 and all(released(p) and _running(p) for p in group)
    await eventually(group_runs, within=45, what="B's whole group to be released and bound")
    evicted = await run.pool.fetch("SELECT name, kind, for_queue, for_uid, message"
                                   " FROM evictions")
    assert len(evicted) == 4, evicted
    assert all(r["kind"] == "preempted" and r["for_queue"] == run.name("qb") for r in evicted)
    assert all(r["name"].startswith("a-deploy-") for r in evicted)
    assert all("pod group" in r["message"] for r in evicted), evicted[0]["message"]
    decided = await run.pool.fetch(
        "SELECT DISTINCT d.decided_at FROM release_decisions d JOIN jobs j"
        " ON j.cluster = d.cluster AND j.uid = d.uid WHERE j.queue = $1", run.name("qb"))
    assert len(decided) == 1, f"the group was released over {len(decided)} rounds"
    events = await run.core().list_namespaced_event(run.namespace)
    preempted = {e.involved_object.name for e in events.items
                 if e.reason == "LockgatePreempted"}
    assert preempted == {r["name"] for r in evicted}
    # A is down to its fair share: 4 running, its Deployment's new pods wait (gated).
    a_pods = await pods(run, "a-")
    assert sum(1 for p in a_pods if _running(p)) == 4
    assert sum(1 for p in a_pods if not released(p)) == 4
    # A further window of rounds: nothing is evicted again, the group keeps running.
    await rounds(run, 10)
    assert await run.pool.fetchval("SELECT count(*) FROM evictions") == 4
    assert sum(1 for p in await pods(run, "bg-") if _running(p)) == 4


def deployment(name: str, queue: str, replicas: int) -> dict[str, Any]:
    """`replicas` preemptible pods of POD_CPU in `queue`."""
    return (a_deployment(name).with_replicas(replicas)
            .of(a_pod(name).in_queue(queue).requesting(cpu=POD_CPU, memory="1Gi")
                .labelled({PREEMPTIBLE_LABEL: "true"}))
            .manifest())


def _running(pod_: client.V1Pod) -> bool:
    return (pod_.metadata.deletion_timestamp is None and bool(pod_.spec.node_name)
            and pod_.status.phase in ("Pending", "Running"))


async def _bound(run: LockgateRun, name: str) -> bool:
    found = await run.core().read_namespaced_pod(name, run.namespace)
    return bool(found.spec.node_name)
