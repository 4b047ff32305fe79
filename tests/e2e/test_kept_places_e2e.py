"""Waits that clients survive (issue 18, item 2): a gated pod deleted by its client's timeout and
created again keeps its place in line; a bigger replacement does not.

Every service runs as a process on the real stack. Each test has a kwok node of its own (3 cpu,
tainted and labelled for it) that its pods select and tolerate, so "the cluster is full" is true
for them whatever other tests run: a filler holds the node, `jupyter-alice` (2 cpu) waits, a
later pod of the same queue waits behind it. The client (as KubeSpawner's `stop()` after
`start_timeout`) deletes `jupyter-alice` and creates it again; the filler ends; the pod the
apiserver shows released (its gate removed, bound) must be the replacement, not the later pod.

Isolation as in every end-to-end test (helpers.runs).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.pods import PodBuilder, a_pod
from helpers.runs import LockgateRun, first_notice, lockgate_run
from helpers.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

RUN = uuid.uuid4().hex[:6]
KEEPS, SWAPS = f"keeps-{RUN}", f"swaps-{RUN}"


@pytest.fixture(scope="module")
async def run(stack: StackInfo,
              tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path_factory.mktemp("runs"), name="places",
                            standby_scheduler=False, env={
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "0.5",
            "LOCKGATE_SCHEDULER_WAIT_NOTICE_CHECK_SECONDS": "0.5"}) as running:
        await running.create_queues([KEEPS, SWAPS], namespaces=[running.namespace])
        await running.create_namespace()
        yield running


async def own_node(run: LockgateRun, name: str) -> PodBuilder:
    """A 3-cpu node for one test; the builder its pods start from (they fit only there)."""
    node = run.name(name)
    await run.add_node(node, allocatable={"cpu": "3", "memory": "8Gi", "pods": "110"},
                       labels={"places": node},
                       taints=[{"key": "places", "value": node, "effect": "NoSchedule"}])
    return (a_pod("pod").tolerating_kwok_nodes()
            .tolerating(key="places", operator="Equal", value=node, effect="NoSchedule")
            .with_spec(nodeSelector={"places": node}))


def released(pod: client.V1Pod | None) -> bool:
    return pod is not None and not (pod.spec.scheduling_gates or [])


async def until_released(run: LockgateRun, name: str) -> None:
    async def done() -> bool:
        return released(await run.pod(name))

    await eventually(done, within=60, every=0.5, what=f"{name} released")


async def until_stored(run: LockgateRun, uid: str, state: str) -> None:
    async def stored() -> bool:
        row = await run.job(uid)
        return row is not None and row["state"] == state

    await eventually(stored, within=60, every=0.2, what=f"pod {uid} {state} in Postgres")


async def delete_and_wait(run: LockgateRun, name: str) -> None:
    await run.core().delete_namespaced_pod(name, run.namespace, grace_period_seconds=0)

    async def gone() -> bool:
        return await run.pod(name) is None

    await eventually(gone, within=60, every=0.2, what=f"{name} gone")


async def retried_and_room_freed(run: LockgateRun, base: PodBuilder, queue: str, user: str, *,
                                 cpu: str, retry_cpu: str) -> tuple[str, str, str]:
    """The scenario both tests share (pods named for `user`, as KubeSpawner names them); the
    names of the retried pod and the later one, and the retried pod's first Event."""
    retried, filler, later_name = f"jupyter-{user}", f"filler-{user}", f"later-{user}"
    base = base.in_queue(queue)
    await run.create_pod(base.named(filler).requesting(cpu="3", memory="64Mi").manifest())
    await until_released(run, filler)
    original = await run.create_pod(
        base.named(retried).requesting(cpu=cpu, memory="64Mi").manifest())
    await until_stored(run, original.metadata.uid, "queued")
    # creationTimestamps are whole seconds: the later pod is later, whatever its uid.
    await asyncio.sleep(1.1)
    later = await run.create_pod(base.named(later_name).requesting(cpu="2", memory="64Mi")
                                 .manifest())
    await until_stored(run, later.metadata.uid, "queued")
    # The client's timeout: the gated pod is deleted, and created again with the same name.
    await delete_and_wait(run, retried)
    await until_stored(run, original.metadata.uid, "deleted")
    await asyncio.sleep(1.1)  # the retry is created after the later pod
    retry = await run.create_pod(
        base.named(retried).requesting(cpu=retry_cpu, memory="64Mi").manifest())
    await until_stored(run, retry.metadata.uid, "queued")
    notice = await first_notice(run, retry.metadata.uid)
    assert not released(await run.pod(retried))
    await delete_and_wait(run, filler)  # room for one of the two, not both
    return retried, later_name, notice


async def test_a_retried_pod_keeps_its_place(run: LockgateRun) -> None:
    base = await own_node(run, "keeps")
    retried, later, notice = await retried_and_room_freed(run, base, KEEPS, "alice", cpu="2",
                                                          retry_cpu="2")
    assert notice.startswith('queued: it kept the place in line of deleted pod "jupyter-alice"'
                             " (waiting "), notice
    # One release of this queue in this cluster so far (the filler): too few for a pace.
    assert notice.endswith("; no wait estimate: this queue had 1 pod released in this cluster "
                           "in the last 15 minutes, too few to tell a pace"), notice
    await until_released(run, retried)
    assert not released(await run.pod(later)), "the later pod went before the retried one"
    pod = await run.pod(retried)
    assert pod is not None
    row = await run.job(pod.metadata.uid)
    assert row is not None and row["kept_place_of"] == "jupyter-alice"
    # explain (the admin API the CLI reads) says so too.
    async with aiohttp.ClientSession(headers=run.lockgate.admin_headers) as session, \
            session.get(f"{run.lockgate.admin_url}/api/v1/explain/{run.alias()}/"
                        f"{run.namespace}/{later}") as reply:
        answer = await reply.json()
    assert answer["explanation"]["position"] == 1, answer
    # Its queue had two pods released here (the filler, then the retried pod): too few.
    assert answer["estimate"] == {"seconds": None, "text": (
        "no wait estimate: this queue had 2 pods released in this cluster in the last 15 "
        "minutes, too few to tell a pace")}, answer


async def test_a_bigger_replacement_does_not_keep_the_place(run: LockgateRun) -> None:
    base = await own_node(run, "swaps")
    # A 1-cpu placeholder holds the place; the replacement asks 2.
    retried, later, notice = await retried_and_room_freed(run, base, SWAPS, "bob", cpu="1",
                                                          retry_cpu="2")
    assert "kept the place" not in notice, notice
    await until_released(run, later)
    assert not released(await run.pod(retried)), "the bigger replacement jumped the queue"
    pod = await run.pod(retried)
    assert pod is not None
    row = await run.job(pod.metadata.uid)
    assert row is not None and row["kept_place_of"] == "" and row["queued_since"] is None
