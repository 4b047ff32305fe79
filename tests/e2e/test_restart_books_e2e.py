"""Books that survive a watcher restart, under load (issue 16).

A chaos run found pods that finished while the cluster-watcher was down recorded `deleted`
("vanished: not listed by snapshot"), although the apiserver said Succeeded: the restarted
watcher's relist publishes every pod's event on pod-events and then its snapshot on
cluster-snapshots; queue-store consumes the two topics independently, so behind a backlog of pod
events it folded the snapshot first, and the snapshot listed only unfinished pods. It needs
load: here, as in the chaos run, 1,500 pods wait, too big for any node, so every relist
publishes some 1,600 events before its snapshot. (They wait in a queue of their own: in the
finishing pods' queue, older and skipped one by one, they would exhaust the scheduler's
lookback per queue, 1,000 by default, before it reached the small pods.)

Each round: pods are created, released and seen running (Postgres says `running`); the watcher
is SIGKILLed; while it is down the pods end every way a pod ends (the test, not a timer, ends
them: kwok completes a pod once it carries lockgate.io/complete-after, and fails it with
lockgate.io/fail; some are deleted); once the apiserver shows them all ended, the watcher is
started again. Then every one of them must be in Postgres exactly as the apiserver last saw it:
succeeded, failed, or `deleted` for a pod the apiserver no longer has; pods still running stay
running. One round by default: on the code before the fix it caught the race every time (all
80 pods that finished or failed booked `deleted`); LOCKGATE_TEST_BOOKS_ROUNDS=N repeats it,
each relist then also listing the earlier rounds' ended pods.

A cancel taken late by a restarted ungater: while the ungater is down, a job set is cancelled
(queue-store cancels its jobs at once) and the job set then creates another pod. The ungater,
started again, deletes the pods the cancel covered and leaves the new one, whose job was not
cancelled either: it is released and runs. (It deleted every pod of the job set it found.)

Everything is real: every service as a process with its own identity (helpers.runs, a run of
its own per test, names unique per run), Kafka, Postgres, the kube-apiserver and kube-scheduler
of cluster-a with kwok nodes (4 of 16 cpu).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devstack.stack import StackInfo
from helpers.kube import create_pods_as_a_controller
from helpers.pods import COMPLETE_ANNOTATION, FAIL_ANNOTATION, a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.events import JobSetCommand
from lockgate.labels import JOBSET_LABEL

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1200)]

BACKLOG = 1500  # queued pods too big for any node: a relist publishes all their events
PER_ROUND = 120  # pods that end while the watcher is down, each round
# One round caught the race every time on the old code (80 of 80 finished pods booked
# deleted); more rounds, for a soak: LOCKGATE_TEST_BOOKS_ROUNDS.
ROUNDS = int(os.environ.get("LOCKGATE_TEST_BOOKS_ROUNDS", "1"))
CREATE_CONCURRENCY = 8
CREATE_RETRY_SECONDS = 600  # a loaded machine's webhook may time out reading the namespace
ROUND_LABEL = "lockgate-test.io/round"
TRUTH = {"Succeeded": "succeeded", "Failed": "failed", "Running": "running"}


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    # Waiting notices for 1,500 pods are not what these tests are about.
    async with lockgate_run(stack, tmp_path, name="books",
                            env={"LOCKGATE_SCHEDULER_WAIT_NOTICES": "false"}) as run:
        await run.create_queues([queue(run), backlog_queue(run)], namespaces=[run.namespace])
        await run.create_namespace()
        yield run


def queue(run: LockgateRun) -> str:
    return run.name("books")


def backlog_queue(run: LockgateRun) -> str:
    return run.name("backlog")


async def create_pods(run: LockgateRun, manifests: list[dict[str, Any]]) -> None:
    await create_pods_as_a_controller(run.core(), run.namespace, manifests,
                                      concurrency=CREATE_CONCURRENCY,
                                      retry_seconds=CREATE_RETRY_SECONDS)


async def states_in_postgres(run: LockgateRun, names: list[str]) -> dict[str, str]:
    rows = await run.pool.fetch("SELECT name, state FROM jobs WHERE cluster = $1"
                                " AND namespace = $2 AND name = ANY($3::text[])",
                                run.alias(), run.namespace, names)
    return {row["name"]: row["state"] for row in rows}


async def apiserver_truth(run: LockgateRun, names: list[str], *, selector: str) -> dict[str, str]:
    """How the apiserver says each pod is: its phase as a job state, `deleted` when gone
    (`selector` picks them out of the backlog's pods)."""
    pods = await run.core().list_namespaced_pod(run.namespace, label_selector=selector)
    phases = {p.metadata.name: p.status.phase for p in pods.items}
    return {name: TRUTH.get(phases[name], phases[name]) if name in phases else "deleted"
            for name in names}


async def end_while_nobody_watches(run: LockgateRun, names: list[str], *,
                                   selector: str) -> dict[str, str]:
    """End the pods every way a pod ends (some stay running); the apiserver's final word."""
    patch = {"metadata": {"annotations": {COMPLETE_ANNOTATION: "0s"}}}
    failing = {"metadata": {"annotations": {COMPLETE_ANNOTATION: "0s", FAIL_ANNOTATION: "true"}}}
    planned: dict[str, str] = {}
    for index, name in enumerate(names):
        planned[name] = ("succeeded", "failed", "succeeded", "deleted", "succeeded",
                         "running")[index % 6]
    slots = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def end(name: str, how: str) -> None:
        async with slots:
            if how == "succeeded":
                await run.core().patch_namespaced_pod(name, run.namespace, patch)
            elif how == "failed":
                await run.core().patch_namespaced_pod(name, run.namespace, failing)
            elif how == "deleted":
                await run.core().delete_namespaced_pod(name, run.namespace,
                                                       grace_period_seconds=0)

    async with asyncio.TaskGroup() as group:
        for name, how in planned.items():
            group.create_task(end(name, how))

    async def all_ended() -> dict[str, str] | None:
        truth = await apiserver_truth(run, names, selector=selector)
        return truth if truth == planned else None

    return await eventually(all_ended, within=120, every=0.5,
                            what=lambda: "kwok to end the pods as planned")


async def test_pods_that_end_while_the_watcher_is_down_are_booked_as_the_apiserver_says(
        run: LockgateRun) -> None:
    big = (a_pod("big").in_namespace(run.namespace).in_queue(backlog_queue(run))
           .requesting(cpu="64", memory="1Gi"))
    started = time.monotonic()
    await create_pods(run, [big.named(run.name(f"big-{i}")).manifest() for i in range(BACKLOG)])
    backlog = [run.name(f"big-{i}") for i in range(BACKLOG)]

    async def backlog_stored() -> bool:
        states = await states_in_postgres(run, backlog)
        return len(states) == BACKLOG and set(states.values()) == {"queued"}

    await eventually(backlog_stored, within=180, every=1,
                     what=f"{BACKLOG} big pods stored queued")
    print(f"\nbacklog of {BACKLOG} pods created and stored in {time.monotonic() - started:.0f}s")

    for round_ in range(ROUNDS):
        await outage_round(run, round_)
    assert not run.lockgate.crashed(), run.lockgate.crashed()


async def outage_round(run: LockgateRun, round_: int) -> None:
    """Pods seen running; the watcher killed; the pods end; the watcher back; the books."""
    selector = f"{ROUND_LABEL}=r{round_}"
    small = (a_pod("small").in_namespace(run.namespace).in_queue(queue(run))
             .labelled({ROUND_LABEL: f"r{round_}"})
             .requesting(cpu="100m", memory="64Mi").never_restarted())
    names = [run.name(f"r{round_}-{i}") for i in range(PER_ROUND)]
    await create_pods(run, [small.named(name).manifest() for name in names])

    async def all_running() -> bool:
        states = await states_in_postgres(run, names)
        return len(states) == PER_ROUND and set(states.values()) == {"running"}

    await eventually(all_running, within=180, every=0.5,
                     what=f"round {round_}: {PER_ROUND} pods released and running")

    await run.kill("cluster-watcher")
    down_at = time.monotonic()
    truth = await end_while_nobody_watches(run, names, selector=selector)
    await run.restart("cluster-watcher", within=180)
    print(f"round {round_}: watcher down {time.monotonic() - down_at:.1f}s")

    async def booked_as_the_apiserver_says() -> bool:
        return await states_in_postgres(run, names) == truth

    async def mismatches() -> str:
        stored = await states_in_postgres(run, names)
        wrong = {n: (stored.get(n), truth[n]) for n in names if stored.get(n) != truth[n]}
        reasons = await run.pool.fetch(
            "SELECT name, last_reason FROM jobs WHERE cluster = $1 AND name = ANY($2)",
            run.alias(), list(wrong)[:3])
        return (f"{len(wrong)} of {PER_ROUND} pods booked wrong (stored, apiserver): "
                f"{dict(list(wrong.items())[:8])}; reasons {[dict(r) for r in reasons]}")

    try:
        await eventually(booked_as_the_apiserver_says, within=120, every=0.5,
                         what="every pod booked as the apiserver says")
    except AssertionError as failure:
        raise AssertionError(f"round {round_}: {await mismatches()}") from failure
    print(f"round {round_}: all {PER_ROUND} booked as the apiserver says "
          f"({sorted(set(truth.values()))})")


async def test_a_cancel_taken_by_a_restarted_ungater_leaves_the_pods_created_after_it(
        run: LockgateRun) -> None:
    jobset = run.name("cancelled")
    pod = (a_pod("member").in_namespace(run.namespace).in_queue(queue(run)).in_jobset(jobset)
           .requesting(cpu="100m", memory="64Mi").never_restarted())
    before = [run.name(f"before-{i}") for i in range(3)]
    await create_pods(run, [pod.named(name).manifest() for name in before])

    async def running(names: list[str]) -> bool:
        states = await states_in_postgres(run, names)
        return len(states) == len(names) and set(states.values()) == {"running"}

    await eventually(lambda: running(before), within=120, every=0.5,
                     what="the job set's first pods running")
    await run.kill("ungater")
    url = f"{run.lockgate.admin_url}/api/v1/jobsets/{queue(run)}/{jobset}/cancel"
    async with aiohttp.ClientSession(headers=run.lockgate.admin_headers) as session, \
            session.post(url, json={"reason": "superseded"}) as reply:
        assert reply.status == 202, await reply.text()
        command = JobSetCommand.model_validate(await reply.json())

    async def cancelled_in_postgres() -> bool:
        return set((await states_in_postgres(run, before)).values()) == {"cancelled"}

    await eventually(cancelled_in_postgres, within=60, every=0.2,
                     what="queue-store to cancel the job set's jobs")

    # Creation timestamps are whole seconds: a pod of the cancel's own second may be covered.
    covered_until = command.at.replace(microsecond=0) + timedelta(seconds=1)

    async def past_the_cancels_second() -> bool:
        return bool(await run.pool.fetchval("SELECT now() >= $1", covered_until))

    await eventually(past_the_cancels_second, within=5, every=0.05,
                     what="the second of the cancel to pass")
    after = run.name("after")
    await create_pods(run, [pod.named(after).manifest()])
    await eventually(lambda: states_in_postgres(run, [after]), within=60, every=0.2,
                     what="the pod created after the cancel stored")
    await run.restart("ungater", within=180)

    async def covered_pods_gone() -> bool:
        truth = await apiserver_truth(run, before, selector=f"{JOBSET_LABEL}={jobset}")
        return set(truth.values()) == {"deleted"}

    await eventually(covered_pods_gone, within=60, every=0.2,
                     what="the restarted ungater to delete the pods the cancel covered")
    survivors = await run.core().list_namespaced_pod(
        run.namespace, label_selector=f"{JOBSET_LABEL}={jobset}")
    assert [(p.metadata.name, p.metadata.deletion_timestamp) for p in survivors.items] == [
        (after, None)], "the restarted ungater deleted the pod the job set created after the " \
        f"cancel (or left a covered one): {await states_in_postgres(run, [after])}"
    await eventually(lambda: running([after]), within=120, every=0.5,
                     what="the pod created after the cancel released and running")
    assert set((await states_in_postgres(run, before)).values()) == {"cancelled"}
