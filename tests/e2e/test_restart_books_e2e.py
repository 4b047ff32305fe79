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
running. Two rounds, so a second relist (with the first round's finished pods lying around)
is judged too.

A cancel taken late by a restarted ungater: while the ungater is down, a job set is cancelled
(queue-store cancels its jobs at once) and the job set then creates another pod. The ungater,
started again, deletes the pods the cancel covered and leaves the new one, whose job was not
cancelled either: it is released and runs. (It deleted every pod of the job set it found.)

Everything is real: every service as a process with its own identity (Lockgate.for_stack),
Kafka, Postgres, the kube-apiserver and kube-scheduler of cluster-a with kwok nodes (4 of 16
cpu). The database is this module's, keeping only its cluster's rows.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import aiohttp
import asyncpg
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.launcher import Lockgate
from devstack.stack import StackInfo
from helpers.pods import COMPLETE_ANNOTATION, FAIL_ANNOTATION, a_pod
from helpers.runs import lockgate_run
from helpers.waiting import eventually
from lockgate.events import JobSetCommand
from lockgate.labels import JOBSET_LABEL

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

RUN = uuid.uuid4().hex[:6]  # queues of this module's run
QUEUE = f"books-{RUN}"
BACKLOG_QUEUE = f"books-backlog-{RUN}"
BACKLOG = 1500  # queued pods too big for any node: a relist publishes all their events
PER_ROUND = 120  # pods that end while the watcher is down, each round
ROUNDS = 2
CREATE_CONCURRENCY = 8
CREATE_RETRY_SECONDS = 600  # a loaded machine's webhook may time out reading the namespace
ROUND_LABEL = "lockgate-test.io/round"
TRUTH = {"Succeeded": "succeeded", "Failed": "failed", "Running": "running"}


@dataclass
class Books:
    lockgate: Lockgate
    core: client.CoreV1Api
    namespace: str
    db: asyncpg.Pool
    alias: str  # the run's name of cluster-a


@pytest.fixture(scope="module")
async def books(stack: StackInfo,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Books]:
    """One run for the module (helpers.runs): each test has pods of its own."""
    async with lockgate_run(stack, tmp_path_factory.mktemp("runs"), name="books", env={
            # Waiting notices for 1,500 pods are not what this test is about.
            "LOCKGATE_SCHEDULER_WAIT_NOTICES": "false"}) as run:
        await run.create_queues([QUEUE, BACKLOG_QUEUE], namespaces=[run.namespace])
        await run.create_namespace()
        yield Books(run.lockgate, run.core(), run.namespace, run.pool, run.alias())


async def create_pods(books: Books, manifests: list[dict[str, Any]]) -> None:
    """Create them as a controller would: a few at a time, and again after a 503 (the webhook
    answers that while it cannot verify the namespace yet, and says to retry)."""
    slots = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def create(manifest: dict[str, Any]) -> None:
        deadline = time.monotonic() + CREATE_RETRY_SECONDS
        delay = 0.25
        async with slots:
            while True:
                try:
                    await books.core.create_namespaced_pod(books.namespace, manifest)
                    return
                except ApiException as error:
                    if error.status != 503 or time.monotonic() > deadline:
                        raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async with asyncio.TaskGroup() as group:
        for manifest in manifests:
            group.create_task(create(manifest))


async def states_in_postgres(books: Books, names: list[str]) -> dict[str, str]:
    rows = await books.db.fetch("SELECT name, state FROM jobs WHERE cluster = $1"
                                " AND namespace = $2 AND name = ANY($3::text[])",
                                books.alias, books.namespace, names)
    return {row["name"]: row["state"] for row in rows}


async def apiserver_truth(books: Books, names: list[str], *, selector: str) -> dict[str, str]:
    """How the apiserver says each pod is: its phase as a job state, `deleted` when gone
    (`selector` picks them out of the backlog's pods)."""
    pods = await books.core.list_namespaced_pod(books.namespace, label_selector=selector)
    phases = {p.metadata.name: p.status.phase for p in pods.items}
    return {name: TRUTH.get(phases[name], phases[name]) if name in phases else "deleted"
            for name in names}


async def end_while_nobody_watches(books: Books, names: list[str], *,
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
                await books.core.patch_namespaced_pod(name, books.namespace, patch)
            elif how == "failed":
                await books.core.patch_namespaced_pod(name, books.namespace, failing)
            elif how == "deleted":
                await books.core.delete_namespaced_pod(name, books.namespace,
                                                       grace_period_seconds=0)

    async with asyncio.TaskGroup() as group:
        for name, how in planned.items():
            group.create_task(end(name, how))

    async def all_ended() -> dict[str, str] | None:
        truth = await apiserver_truth(books, names, selector=selector)
        return truth if truth == planned else None

    return await eventually(all_ended, within=120, every=0.5,
                            what=lambda: "kwok to end the pods as planned")


async def test_pods_that_end_while_the_watcher_is_down_are_booked_as_the_apiserver_says(
        books: Books) -> None:
    big = (a_pod("big").in_namespace(books.namespace).in_queue(BACKLOG_QUEUE)
           .requesting(cpu="64", memory="1Gi"))
    started = time.monotonic()
    await create_pods(books, [big.named(f"big-{RUN}-{i}").manifest() for i in range(BACKLOG)])
    backlog = [f"big-{RUN}-{i}" for i in range(BACKLOG)]

    async def backlog_stored() -> bool:
        states = await states_in_postgres(books, backlog)
        return len(states) == BACKLOG and set(states.values()) == {"queued"}

    await eventually(backlog_stored, within=180, every=1,
                     what=f"{BACKLOG} big pods stored queued")
    print(f"\nbacklog of {BACKLOG} pods created and stored in {time.monotonic() - started:.0f}s")

    for round_ in range(ROUNDS):
        await outage_round(books, round_)
    assert not books.lockgate.crashed(), books.lockgate.crashed()


async def outage_round(books: Books, round_: int) -> None:
    """Pods seen running; the watcher killed; the pods end; the watcher back; the books."""
    watcher = books.lockgate.processes["cluster-watcher"]
    selector = f"{ROUND_LABEL}=r{round_}"
    small = (a_pod("small").in_namespace(books.namespace).in_queue(QUEUE)
             .labelled({ROUND_LABEL: f"r{round_}"})
             .requesting(cpu="100m", memory="64Mi").never_restarted())
    names = [f"r{round_}-{RUN}-{i}" for i in range(PER_ROUND)]
    await create_pods(books, [small.named(name).manifest() for name in names])

    async def all_running() -> bool:
        states = await states_in_postgres(books, names)
        return len(states) == PER_ROUND and set(states.values()) == {"running"}

    await eventually(all_running, within=180, every=0.5,
                     what=f"round {round_}: {PER_ROUND} pods released and running")

    await watcher.kill()
    down_at = time.monotonic()
    truth = await end_while_nobody_watches(books, names, selector=selector)
    await watcher.start()
    await watcher.wait_ready(180)
    print(f"round {round_}: watcher down {time.monotonic() - down_at:.1f}s")

    async def booked_as_the_apiserver_says() -> bool:
        return await states_in_postgres(books, names) == truth

    async def mismatches() -> str:
        stored = await states_in_postgres(books, names)
        wrong = {n: (stored.get(n), truth[n]) for n in names if stored.get(n) != truth[n]}
        reasons = await books.db.fetch(
            "SELECT name, last_reason FROM jobs WHERE cluster = $1 AND name = ANY($2)",
            books.alias, list(wrong)[:3])
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
        books: Books) -> None:
    jobset = f"cancelled-{RUN}"
    pod = (a_pod("member").in_namespace(books.namespace).in_queue(QUEUE).in_jobset(jobset)
           .requesting(cpu="100m", memory="64Mi").never_restarted())
    before = [f"before-{RUN}-{i}" for i in range(3)]
    await create_pods(books, [pod.named(name).manifest() for name in before])

    async def running(names: list[str]) -> bool:
        states = await states_in_postgres(books, names)
        return len(states) == len(names) and set(states.values()) == {"running"}

    await eventually(lambda: running(before), within=120, every=0.5,
                     what="the job set's first pods running")
    ungater = books.lockgate.processes["ungater"]
    await ungater.kill()
    async with aiohttp.ClientSession(headers=books.lockgate.admin_headers) as session, \
            session.post(f"{books.lockgate.admin_url}/api/v1/jobsets/{QUEUE}/{jobset}/cancel",
                         json={"reason": "superseded"}) as reply:
        assert reply.status == 202, await reply.text()
        command = JobSetCommand.model_validate(await reply.json())

    async def cancelled_in_postgres() -> bool:
        return set((await states_in_postgres(books, before)).values()) == {"cancelled"}

    await eventually(cancelled_in_postgres, within=60, every=0.2,
                     what="queue-store to cancel the job set's jobs")

    # Creation timestamps are whole seconds: a pod of the cancel's own second may be covered.
    covered_until = command.at.replace(microsecond=0) + timedelta(seconds=1)

    async def past_the_cancels_second() -> bool:
        return bool(await books.db.fetchval("SELECT now() >= $1", covered_until))

    await eventually(past_the_cancels_second, within=5, every=0.05,
                     what="the second of the cancel to pass")
    after = f"after-{RUN}"
    await create_pods(books, [pod.named(after).manifest()])
    await eventually(lambda: states_in_postgres(books, [after]), within=60, every=0.2,
                     what="the pod created after the cancel stored")
    await ungater.start()
    await ungater.wait_ready(180)

    async def covered_pods_gone() -> bool:
        truth = await apiserver_truth(books, before, selector=f"{JOBSET_LABEL}={jobset}")
        return set(truth.values()) == {"deleted"}

    await eventually(covered_pods_gone, within=60, every=0.2,
                     what="the restarted ungater to delete the pods the cancel covered")
    survivors = await books.core.list_namespaced_pod(
        books.namespace, label_selector=f"{JOBSET_LABEL}={jobset}")
    assert [(p.metadata.name, p.metadata.deletion_timestamp) for p in survivors.items] == [
        (after, None)], "the restarted ungater deleted the pod the job set created after the " \
        f"cancel (or left a covered one): {await states_in_postgres(books, [after])}"
    await eventually(lambda: running([after]), within=120, every=0.5,
                     what="the pod created after the cancel released and running")
    assert set((await states_in_postgres(books, before)).values()) == {"cancelled"}
