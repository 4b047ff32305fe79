"""A newcomer does not wait behind another queue's backlog (issue 19: latency while releasing).

A Deployment of 200 small pods is being released, the scheduler running, room to spare; then
one pod of a queue that holds nothing arrives. Its gate must go while most of the backlog still
waits. Two things used to put it last: a round decided the whole backlog at once, so the
newcomer's release was carried out after every release already handed to the ungater; and the
round ranked a queue given all it asks by its fraction of its own (one-pod) target, so the
newcomer ranked behind every backlog pod. The cap on releases in flight is set low here
(LOCKGATE_SCHEDULER_MAX_RELEASES_IN_FLIGHT_PER_CLUSTER) so that 200 pods are a backlog on this
machine; with no cap the same test fails (the newcomer goes after the backlog).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devstack.stack import StackInfo
from helpers.pods import a_deployment, a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.labels import SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

BACKLOG = 200
IN_FLIGHT = 4


@pytest.fixture
async def paced(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path, name="pace", env={
            "LOCKGATE_SCHEDULER_MAX_RELEASES_IN_FLIGHT_PER_CLUSTER": str(IN_FLIGHT)}) as run:
        yield run


def gated(pod: object) -> bool:
    gates = pod.spec.scheduling_gates or ()  # type: ignore[attr-defined]
    return any(gate.name == SCHEDULING_GATE for gate in gates)


async def test_a_newcomer_is_released_while_a_backlog_is(paced: LockgateRun) -> None:
    run = paced
    backlog, newcomer = run.name("backlog"), run.name("newcomer")
    namespaces = {backlog: run.name("ns-backlog"), newcomer: run.name("ns-newcomer")}
    for queue, namespace in namespaces.items():
        await run.create_queue(queue, namespaces=[namespace])
        await run.create_namespace(name=namespace)
    pod = a_pod("work").in_queue(backlog).requesting(cpu="10m", memory="16Mi")
    await run.apps().create_namespaced_deployment(
        namespaces[backlog], a_deployment("work").with_replicas(BACKLOG).of(pod).manifest())

    async def backlog_under_way() -> int | None:
        pods = (await run.core().list_namespaced_pod(namespaces[backlog])).items
        ungated = sum(1 for p in pods if not gated(p))
        return ungated if len(pods) == BACKLOG and ungated >= IN_FLIGHT else None

    await eventually(backlog_under_way, within=180, every=0.2,
                     what=lambda: f"the {BACKLOG} pods created and the first released")

    created = time.monotonic()
    await run.create_pod(a_pod("newcomer").in_queue(newcomer)
                         .requesting(cpu="10m", memory="16Mi").manifest(),
                         namespace=namespaces[newcomer])

    async def newcomer_released() -> int | None:
        mine = await run.core().read_namespaced_pod("newcomer", namespaces[newcomer])
        if gated(mine):
            return None
        pods = (await run.core().list_namespaced_pod(namespaces[backlog])).items
        return sum(1 for p in pods if gated(p))

    still_waiting = await eventually(newcomer_released, within=120, every=0.1,
                                     what=lambda: "the newcomer's pod released")
    waited = time.monotonic() - created
    # Its share is nothing, the backlog queue's grows with every pod: it goes first, behind at
    # most the releases already in flight.
    assert still_waiting >= BACKLOG // 2, (
        f"the newcomer was released after {waited:.1f} s, with only {still_waiting} of the "
        f"backlog's {BACKLOG} pods still waiting")
