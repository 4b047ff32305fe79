"""The first wait notices come quickly, then back off (issue 18: waits that clients survive).

A client that gives a pod a minute to start (JupyterHub's spawner shows the pod's Events on its
progress page) must see why it waits before it gives up. Every service runs as a process on the
real stack; a pod that fits no node waits, and its Events, read back with the Kubernetes API,
come at the early times after the first (here 3 s and 9 s, as 15 s and 45 s by default), then
not again before the interval (here 30 s, as 5 minutes by default).

Isolation as in every end-to-end test (helpers.runs).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from devstack.stack import StackInfo
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

RUN = uuid.uuid4().hex[:6]
QUEUE = f"waits-{RUN}"
EARLY = (3.0, 9.0)
INTERVAL = 30.0
CHECK = 0.5  # the scheduler looks for pods due a notice this often
SLACK = 2.0  # Event timestamps are whole seconds, and the look comes up to CHECK late


@pytest.fixture(scope="module")
async def run(stack: StackInfo,
              tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path_factory.mktemp("runs"), name="waits", env={
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "0.5",
            "LOCKGATE_SCHEDULER_WAIT_NOTICE_CHECK_SECONDS": str(CHECK),
            "LOCKGATE_SCHEDULER_WAIT_NOTICE_EARLY_SECONDS": f"[{EARLY[0]}, {EARLY[1]}]",
            "LOCKGATE_SCHEDULER_WAIT_NOTICE_INTERVAL_SECONDS": str(INTERVAL)}) as running:
        await running.create_queues({QUEUE: {}}, namespaces=[running.namespace])
        await running.create_namespace()
        yield running


async def notices_on(run: LockgateRun, uid: str) -> list[Any]:
    """The pod's wait notices (not other notices, such as LockgateQueueUnknown), oldest first."""
    events = await run.core().list_namespaced_event(
        run.namespace, field_selector=f"source=lockgate-ungater,involvedObject.uid={uid}")
    return sorted((e for e in events.items if e.reason != "LockgateQueueUnknown"),
                  key=lambda event: event.first_timestamp)


async def test_a_waiting_pod_is_told_at_once_then_at_the_early_times_then_backs_off(
        run: LockgateRun) -> None:
    # Bigger than every node: it waits as long as the test looks.
    pod = await run.create_pod(a_pod("notebook").in_queue(QUEUE).tolerating_kwok_nodes()
                               .requesting(cpu="1000", memory="64Mi").manifest())
    uid = pod.metadata.uid

    async def three() -> list[Any] | None:
        found = await notices_on(run, uid)
        return found if len(found) >= 3 else None

    events = await eventually(three, within=60, every=0.5,
                              what="three Events on the waiting pod")
    first = events[0].first_timestamp
    offsets = [(event.first_timestamp - first).total_seconds() for event in events]
    assert [event.reason for event in events][:2] == ["LockgateQueued", "LockgateFitsNoNode"]
    assert offsets[0] == 0
    for offset, early in zip(offsets[1:3], EARLY, strict=True):
        assert early - 1 <= offset <= early + SLACK, offsets
    # ... and then it backs off: nothing more for the interval after the last early one
    # (looked at until 25 s after the first, well past where a flat rate of 3 s would be).
    await asyncio.sleep(max(0.0, 25.0 - (datetime.now(UTC) - first).total_seconds()))
    later = await notices_on(run, uid)
    assert len(later) == 3, [(e.reason, e.first_timestamp) for e in later]
