"""Dependency outages as a user sees them: readiness names the dependency, logs stay short.

Every lockgate service runs as a process on the local stack. The tests then break a real
dependency of the stack itself: they SIGKILL the Kafka broker, or cluster-b's etcd (its
apiserver keeps running, fails /readyz, and keeps existing watch streams open), or shut
Postgres down.
Each affected service must report not ready naming the dependency within a few seconds, log the
outage in a bounded number of lines (a user once counted 10,484 ERROR lines in 35 s from one
service), recover once the component is back, and lose nothing: a pod created during the Kafka
outage is still recorded and released afterwards.

These tests stop components of the stack they run on, so develop them on a stack of your own
(`LOCKGATE_STACK_PORT_OFFSET=1000 LOCKGATE_STACK_DIR=...`). The `restored_stack` fixture starts
whatever was killed again and waits until the whole stack is healthy, even when a test fails, so
the tests after these find the stack as it was.

Isolation on a shared stack (helpers.runs): a database of its own, cluster names of its own
(aliases of the real clusters), consumer groups starting at the topics' end and a webhook
registration serving only this run's namespace, free ports, and logs in a temporary directory.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from kubernetes_asyncio import client

import devstack
from devstack.launcher import RUN_LABEL, Lockgate
from devstack.stack import Stack, StackInfo
from helpers.kube import gates_of
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.labels import QUEUE_LABEL, SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

KAFKA_USERS = ("queue-store", "cluster-watcher", "ungater", "fair-scheduler")
APISERVER_USERS = ("cluster-watcher", "ungater")
# Probes every 0.5 s, unready after 2 failures: an outage shows within ~1-3 s; the bound below
# leaves room for a loaded 2-core machine.
UNREADY_WITHIN_SECONDS = 15.0
OUTAGE_SECONDS = 20.0
# Lines a service may log during the outage. Expected: the outage's first line, the first of
# each rate-limited client or retry message, and a few ordinary ones. Before: thousands.
MAX_LINES_DURING_OUTAGE = 60

PREFIXES = {
    "queue-store": "LOCKGATE_QUEUE_STORE_",
    "cluster-watcher": "LOCKGATE_WATCHER_",
    "ungater": "LOCKGATE_UNGATER_",
    "fair-scheduler": "LOCKGATE_SCHEDULER_",
    "admission-webhook": "LOCKGATE_WEBHOOK_",
}
FAST = {
    "DEPENDENCY_CHECKS__INTERVAL_SECONDS": "0.5",
    "DEPENDENCY_CHECKS__TIMEOUT_SECONDS": "2",
    "DEPENDENCY_CHECKS__FAILURES_TO_UNREADY": "2",
    "RETRY__INITIAL_SECONDS": "0.1",
    "RETRY__MAX_SECONDS": "2",
}


# ---------------------------------------------------------------- the stack, always restored


@pytest.fixture
def restored_stack(stack: StackInfo) -> Iterator[Stack]:
    """The stack as a `devstack.stack.Stack`, to kill components of; afterwards every killed
    component is started again and the whole stack is healthy, whatever the test did."""
    controller = Stack()
    assert controller.info().kafka_bootstrap == stack.kafka_bootstrap, (
        "the stack fixture and devstack disagree on the stack (LOCKGATE_STACK_* variables?)")
    yield controller
    for component in controller.components():
        if controller.procs.inspect(component).state != "running":
            controller.start_component(component.name)
    devstack.ensure_up()  # waits until every component answers and both clusters are ready


# ---------------------------------------------------------------- lockgate, as processes


@dataclass
class Run:
    run: LockgateRun
    lockgate: Lockgate
    apis: dict[str, client.ApiClient]  # by alias
    namespace: str  # in run.a
    pool: asyncpg.Pool
    a: str  # the run's alias of cluster-a
    b: str  # and of cluster-b

    def log(self, service: str) -> Path:
        return self.lockgate.processes[service].log_path

    async def readiness(self, service: str) -> tuple[int, dict[str, Any]]:
        port = self.lockgate.processes[service].health_port
        try:
            async with aiohttp.ClientSession() as session, session.get(
                    f"http://127.0.0.1:{port}/readyz",
                    timeout=aiohttp.ClientTimeout(total=2)) as response:
                body: dict[str, Any] = await response.json()
                return response.status, body.get("checks", {})
        except (aiohttp.ClientError, TimeoutError) as error:
            return 0, {"unanswered": {"ready": False, "detail": repr(error)}}

    def logs(self) -> str:
        return self.run.logs()


@pytest.fixture(scope="module")
async def run(stack: StackInfo, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Run]:
    """One run for the module: each test creates pods of its own in the run's namespace."""
    env = {f"{prefix}{key}": value for prefix in PREFIXES.values() for key, value in FAST.items()}
    async with lockgate_run(stack, tmp_path_factory.mktemp("runs"), name="outage", env=env,
                            clusters=("cluster-a", "cluster-b"),
                            standby_scheduler=False) as run:
        queue = run.name("q")
        await run.create_queue(queue, namespaces=[run.namespace])
        await run.create_namespace(labels={QUEUE_LABEL: queue})
        assert RUN_LABEL in run.lockgate.run_namespace_labels
        yield Run(run, run.lockgate, run.apis, run.namespace, run.pool,
                  run.alias("cluster-a"), run.alias("cluster-b"))


async def all_ready(run: Run, services: tuple[str, ...], within: float) -> None:
    for service in services:
        async def ready(service: str = service) -> bool:
            status, _ = await run.readiness(service)
            return status == 200

        await eventually(ready, within=within, every=0.2,
                         what=lambda service=service: f"{service} ready:\n{run.logs()}")


async def create_pod(run: Run, name: str) -> str:
    manifest = a_pod(name).never_restarted().requesting(cpu="100m", memory="64Mi").manifest()
    created = await client.CoreV1Api(run.apis[run.a]).create_namespaced_pod(run.namespace,
                                                                              manifest)
    assert SCHEDULING_GATE in gates_of(created), "the webhook did not gate the pod"
    return str(created.metadata.uid)


async def released_and_recorded(run: Run, name: str, uid: str, within: float) -> None:
    """The pod's gate is removed and queue-store recorded the job past its release."""
    core = client.CoreV1Api(run.apis[run.a])

    async def released() -> bool:
        pod = await core.read_namespaced_pod(name, run.namespace)
        return SCHEDULING_GATE not in gates_of(pod)

    async def recorded() -> str | None:
        state = await run.pool.fetchval(
            "SELECT state FROM jobs WHERE cluster = $1 AND uid = $2", run.a, uid)
        return state if state in ("released", "running") else None

    await eventually(released, within=within, every=0.2,
                     what=lambda: f"pod {name} released:\n{run.logs()}")
    await eventually(recorded, within=within, every=0.2, what=f"job {uid} recorded as released")


@dataclass
class LogMark:
    """Where each service's log ended at some moment, to read what it wrote since."""

    offsets: dict[str, int]

    @classmethod
    def now(cls, run: Run, services: tuple[str, ...]) -> LogMark:
        return cls({s: run.log(s).stat().st_size for s in services})

    def since(self, run: Run, service: str) -> list[str]:
        with run.log(service).open("rb") as log:
            log.seek(self.offsets[service])
            return log.read().decode(errors="replace").splitlines()


async def wait_unready(run: Run, service: str, check: str, within: float) -> dict[str, Any]:
    """Until `service` is not ready and its `check` says the dependency is unreachable (the
    probe's word: a service's own loop may report the failure first, in its own terms)."""
    async def unready() -> dict[str, Any] | None:
        status, checks = await run.readiness(service)
        entry = checks.get(check, {})
        named = "unreachable" in str(entry.get("detail"))
        return checks if status == 503 and entry.get("ready") is False and named else None

    checks: dict[str, Any] = await eventually(
        unready, within=within, every=0.1,
        what=lambda: f"{service} to report {check} not ready:\n{run.logs()}")
    return checks


# ---------------------------------------------------------------- the tests


async def test_a_killed_kafka_broker_reads_as_one_outage_and_loses_nothing(
        run: Run, restored_stack: Stack) -> None:
    await all_ready(run, (*KAFKA_USERS, "admission-webhook"), within=90)
    # The whole path works before the outage.
    await released_and_recorded(run, "before", await create_pod(run, "before"), within=60)
    mark = LogMark.now(run, KAFKA_USERS)

    killed_at = time.monotonic()
    restored_stack.kill("kafka")
    unready_after: dict[str, float] = {}
    for service in KAFKA_USERS:
        checks = await wait_unready(run, service, "kafka", UNREADY_WITHIN_SECONDS)
        unready_after[service] = time.monotonic() - killed_at
        assert "unreachable" in str(checks["kafka"]["detail"]), checks
    print(f"not ready naming kafka after: { {k: round(v, 1) for k, v in unready_after.items()} }")
    # What does not need Kafka stays ready: readiness says what is wrong, not "something".
    status, checks = await run.readiness("admission-webhook")
    assert status == 200, checks

    during_uid = await create_pod(run, "during")
    await asyncio.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - killed_at)))
    lines = {service: mark.since(run, service) for service in KAFKA_USERS}
    restored_stack.start_component("kafka")
    down_for = time.monotonic() - killed_at

    counts = {service: len(found) for service, found in lines.items()}
    print(f"lines logged during a {down_for:.0f}s kafka outage: {counts}")
    for service, found in lines.items():
        shown = "\n".join(found[:80])
        assert len(found) <= MAX_LINES_DURING_OUTAGE, f"{service} logged {len(found)}:\n{shown}"
        announcements = [line for line in found if '"msg": "kafka unreachable: ' in line]
        assert len(announcements) == 1, f"{service}:\n{shown}"

    await all_ready(run, KAFKA_USERS, within=90)
    for service in KAFKA_USERS:
        ended = [line for line in mark.since(run, service)
                 if '"msg": "kafka reachable again after' in line]
        assert len(ended) == 1, f"{service}: {run.lockgate.processes[service].log_tail(40)}"
    # Nothing was lost: the pod created while Kafka was down goes all the way through.
    await released_and_recorded(run, "during", during_uid, within=90)


async def test_an_apiserver_whose_etcd_is_down_makes_its_users_unready(
        run: Run, restored_stack: Stack) -> None:
    await all_ready(run, APISERVER_USERS, within=90)
    mark = LogMark.now(run, APISERVER_USERS)
    killed_at = time.monotonic()
    restored_stack.kill("cluster-b/etcd")
    check_b, check_a = f"apiserver:{run.b}", f"apiserver:{run.a}"
    for service in APISERVER_USERS:
        checks = await wait_unready(run, service, check_b, UNREADY_WITHIN_SECONDS)
        # An apiserver without etcd answers /readyz "[-]etcd failed" only after its own etcd
        # checks time out (~4 s); the probe's timeout is shorter.
        print(f"{service}: {check_b}: {checks[check_b]['detail']}")
        assert "unreachable" in str(checks[check_b]["detail"]), checks
        assert checks[check_a]["ready"] is True, checks  # the other cluster is fine
    print(f"not ready naming {check_b} after {time.monotonic() - killed_at:.1f}s")
    await asyncio.sleep(max(0.0, 10 - (time.monotonic() - killed_at)))
    lines = {service: mark.since(run, service) for service in APISERVER_USERS}
    restored_stack.start_component("cluster-b/etcd")

    print(f"lines logged during the etcd outage: { {s: len(f) for s, f in lines.items()} }")
    for service, found in lines.items():
        shown = "\n".join(found[:80])
        assert len(found) <= MAX_LINES_DURING_OUTAGE, f"{service} logged {len(found)}:\n{shown}"
        announcements = [line for line in found if f'"msg": "{check_b} unreachable: ' in line]
        assert len(announcements) == 1, f"{service}:\n{shown}"
    await all_ready(run, APISERVER_USERS, within=90)


async def test_a_postgres_shutdown_makes_its_users_unready_until_it_is_back(
        run: Run, restored_stack: Stack) -> None:
    users = ("queue-store", "fair-scheduler")
    await all_ready(run, users, within=90)
    mark = LogMark.now(run, users)
    stopped_at = time.monotonic()
    # A fast shutdown (what an operator or a failover does): a SIGKILLed postmaster would leave
    # its backends holding shared memory, and the restart would wait for them.
    restored_stack.kill("postgres", signal.SIGINT)
    for service in users:
        checks = await wait_unready(run, service, "postgres", UNREADY_WITHIN_SECONDS)
        assert "unreachable" in str(checks["postgres"]["detail"]), checks
    print(f"not ready naming postgres after {time.monotonic() - stopped_at:.1f}s")
    # What does not need Postgres stays ready (the webhook reads its cluster's Queue objects).
    for service in ("cluster-watcher", "ungater", "admission-webhook"):
        status, checks = await run.readiness(service)
        assert status == 200, (service, checks)
    await asyncio.sleep(max(0.0, 10 - (time.monotonic() - stopped_at)))
    lines = {service: mark.since(run, service) for service in users}
    restored_stack.start_component("postgres")

    print(f"lines logged during the postgres outage: { {s: len(f) for s, f in lines.items()} }")
    for service, found in lines.items():
        shown = "\n".join(found[:80])
        assert len(found) <= MAX_LINES_DURING_OUTAGE, f"{service} logged {len(found)}:\n{shown}"
        announcements = [line for line in found if '"msg": "postgres unreachable: ' in line]
        assert len(announcements) == 1, f"{service}:\n{shown}"
    await all_ready(run, users, within=90)
