"""Back-off per controller end to end: a ReplicaSet whose pods lockgate's model wrongly thinks fit.

Its pods select a kwok node of this run's that has room for one of them, but carry a required
pod anti-affinity to a bare pod already on that node: a filter lockgate does not model, so
lockgate releases them and kube-scheduler refuses them. The test shows the whole cycle on the
real services: the first give-up deletes the pod; the replacement waits with the back-off reason
(`lockgate explain`, the fairness report), is released only after the delay, is refused again,
and the next delay is twice as long; the next replacement says so in its waiting Event, still
waits after a restart of the scheduler (the back-off is in Postgres), and, the blocker gone,
binds after the delay and resets the back-off.

Isolation as in every end-to-end test (helpers.runs): a database of its own, cluster-a under a
name of its own, its own node, webhook registration, consumer groups and namespaces. Bounded:
each step waits on a condition with a deadline; the delays are set short (give up after 3 s,
back off 15 s, then 30 s).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.services import fairness_report
from helpers.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.timeout(400)]

GIVE_UP_AFTER = 3  # LOCKGATE_SCHEDULER_UNPLACEABLE_AFTER_SECONDS
BACKOFF = 15  # LOCKGATE_SCHEDULER_UNPLACEABLE_BACKOFF_INITIAL_SECONDS


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path, name="backoff", standby_scheduler=False, env={
            "LOCKGATE_SCHEDULER_UNPLACEABLE_AFTER_SECONDS": str(GIVE_UP_AFTER),
            "LOCKGATE_SCHEDULER_UNPLACEABLE_BACKOFF_INITIAL_SECONDS": str(BACKOFF),
            "LOCKGATE_SCHEDULER_UNPLACEABLE_BACKOFF_MAX_SECONDS": str(8 * BACKOFF),
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1",
            "LOCKGATE_SCHEDULER_WAIT_NOTICE_CHECK_SECONDS": "1"}) as run:
        await run.create_namespace()
        await run.create_namespace(name=unmanaged(run), managed=False)
        yield run


def unmanaged(run: LockgateRun) -> str:
    return run.name("unmanaged")


async def backoff_of(run: LockgateRun) -> asyncpg.Record | None:
    return await run.pool.fetchrow(
        "SELECT * FROM controller_backoffs WHERE cluster = $1", run.alias())


async def replicas(run: LockgateRun) -> list[client.V1Pod]:
    """The ReplicaSet's pods not being deleted."""
    pods = await run.core().list_namespaced_pod(run.namespace, label_selector="app=rs")
    return [p for p in pods.items if p.metadata.deletion_timestamp is None]


async def explain(run: LockgateRun, pod: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(headers=run.lockgate.admin_headers) as session, \
            session.get(f"{run.lockgate.admin_url}/api/v1/explain/{run.alias()}/"
                        f"{run.namespace}/{pod}") as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body


def anti_affinity_to(app: str) -> dict[str, Any]:
    """Required anti-affinity to pods labelled app=<app> on the same node: lockgate does not
    model it, so its model says "fits" where kube-scheduler says Unschedulable."""
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"app": app}}, "namespaceSelector": {},
        "topologyKey": "kubernetes.io/hostname"}]}}


async def test_a_controller_whose_pods_keep_being_refused_backs_off(run: LockgateRun) -> None:
    queue, trap, blocker = run.name("rs"), run.name("trap"), run.name("blocker")
    await run.add_node(trap, allocatable={"cpu": "1", "memory": "8Gi", "pods": "110"},
                       labels={"pool": trap})
    await run.create_queue(queue, namespaces=[run.namespace])
    # A bare, unmanaged pod on the node, which the ReplicaSet's pods must not share a node with.
    await run.create_pod(a_pod(blocker).labelled(app=blocker).on_node(trap).manifest(),
                         namespace=unmanaged(run))
    template = (a_pod("unused").in_queue(queue).requesting(cpu="1", memory="1Gi")
                .with_spec(nodeSelector={"pool": trap}, affinity=anti_affinity_to(blocker),
                           restartPolicy="Always").manifest())
    created = await run.apps().create_namespaced_replica_set(run.namespace, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rs"}},
                 "template": {"metadata": {"labels": {**template["metadata"]["labels"],
                                                      "app": "rs"}},
                              "spec": template["spec"]}}})
    rs_uid = str(created.metadata.uid)

    async def one_replica_other_than(*uids: str) -> client.V1Pod | None:
        pods = await replicas(run)
        return pods[0] if len(pods) == 1 and pods[0].metadata.uid not in uids else None

    async def given_up(uid: str) -> asyncpg.Record | None:
        row = await run.job(uid)
        return row if row is not None and row["unplaceable_at"] is not None else None

    async def backoff_with(attempts: int) -> asyncpg.Record | None:
        row = await backoff_of(run)
        return row if row is not None and row["attempts"] == attempts else None

    # 1. The first replica is released, refused by kube-scheduler, given up on and deleted; its
    #    controller backs off for the first delay.
    first = await eventually(one_replica_other_than, within=60, what="the first replica")
    await eventually(lambda: given_up(first.metadata.uid), within=90,
                     what="the first replica given up on")
    one = await eventually(lambda: backoff_with(1), within=30, what="the first back-off")
    assert (one["cluster"], one["controller_uid"]) == (run.alias(), rs_uid)
    assert one["pod"] == first.metadata.name
    assert (one["until"] - one["given_up_at"]).total_seconds() == pytest.approx(BACKOFF)
    assert (await run.job(first.metadata.uid))["controller_uid"] == rs_uid

    # 2. Its replacement waits, and says why; it is no head of a blocked line, only counted.
    second = await eventually(lambda: one_replica_other_than(first.metadata.uid), within=60,
                              what="the first replacement")

    async def explained_backing_off() -> dict[str, Any] | None:
        row = await run.job(second.metadata.uid)
        if row is None:
            return None
        assert row["state"] == "queued", (
            f"the replacement was {row['state']} before its back-off could be seen "
            f"(back-off until {one['until']})")
        body = await explain(run, second.metadata.name)
        report = await fairness_report(run.lockgate.ports.scheduler_health)
        counted = [q for q in report["queues"] if q["name"] == queue and q["backing_off"] == 1]
        explanation = body["explanation"]
        return body if explanation["reason"] == "backing_off" and counted else None

    body = await eventually(explained_backing_off, within=BACKOFF,
                            what="explain and the fairness report saying it backs off")
    assert body["explanation"]["backoff_attempts"] == 1
    until_text = one["until"].strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (f"backing off after 1 unplaceable attempt; next try after {until_text}"
            in body["message"])

    # 3. Released only after the delay, refused again: the next delay is twice as long.
    await eventually(lambda: given_up(second.metadata.uid), within=BACKOFF + 90,
                     what="the first replacement released after the back-off and given up on")
    second_row = await run.job(second.metadata.uid)
    assert second_row["released_at"] >= one["until"]
    two = await eventually(lambda: backoff_with(2), within=30, what="the second back-off")
    assert (two["until"] - two["given_up_at"]).total_seconds() == pytest.approx(2 * BACKOFF)

    # 4. The model fits again (the blocker goes); the back-off survives a restart of the
    #    scheduler; the next replacement is released after it, binds, and resets it.
    await run.core().delete_namespaced_pod(blocker, unmanaged(run), grace_period_seconds=0)

    async def blocker_gone() -> bool:
        return await run.pod(blocker, namespace=unmanaged(run)) is None

    await eventually(blocker_gone, within=30, what="the blocker pod gone")
    scheduler = run.lockgate.processes["fair-scheduler"]
    assert await scheduler.stop() == 0
    await scheduler.start()
    await scheduler.wait_ready()
    third = await eventually(lambda: one_replica_other_than(first.metadata.uid,
                                                            second.metadata.uid),
                             within=60, what="the second replacement")

    async def told_backing_off() -> client.CoreV1Event | None:
        events = await run.core().list_namespaced_event(
            run.namespace, field_selector=f"involvedObject.uid={third.metadata.uid}")
        return next((e for e in events.items
                     if "backing off after 2 unplaceable attempts" in (e.message or "")), None)

    # The waiting Event on the pod says it too (written while it is gated, so before the end).
    await eventually(told_backing_off, within=2 * BACKOFF,
                     what="a waiting Event on the second replacement saying it backs off")

    async def bound() -> str | None:
        pod = await run.core().read_namespaced_pod(third.metadata.name, run.namespace)
        return pod.spec.node_name or None

    assert await eventually(bound, within=2 * BACKOFF + 90,
                            what="the second replacement bound") == trap
    third_row = await run.job(third.metadata.uid)
    assert third_row["released_at"] >= two["until"]
    assert third_row["unplaceable_at"] is None
    await eventually(lambda: _is_none(backoff_of(run)), within=30,
                     what="the back-off reset by the bind")


async def _is_none(value: Any) -> bool:
    return await value is None
