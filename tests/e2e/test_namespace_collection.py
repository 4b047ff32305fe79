"""Ephemeral namespaces are collected: on cancel, TTL and finished job sets, through crashes.

Every lockgate service runs as a process on the local stack. Records are stood up the way
namespace creation leaves them (an active row with its "created" transition, and the labelled
namespace in its cluster) by `ephemeral`, so these tests do not depend on the creation path.

The crash tests SIGKILL queue-store (the collector) while a namespace is held in Terminating by
a finalizer the test controls, and stop cluster-b's kube-apiserver during a deletion; develop
them on a stack of your own (LOCKGATE_STACK_PORT_OFFSET, LOCKGATE_STACK_DIR). `restored_stack`
starts whatever was stopped again, even when a test fails.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import devstack
from devstack.launcher import Lockgate
from devstack.stack import Stack, StackInfo
from helpers.kafka import wait_consumed
from helpers.kube import Namespaces, wait_for_default_service_account
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.events import JOBSET_COMMANDS
from lockgate.labels import JOBSET_LABEL, QUEUE_LABEL
from lockgate.namespace_access import DEFAULT_ALLOWED_KINDS, namespace_object
from lockgate_adapters import namespace_store
from lockgate_cli import root as cli

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

SELECT_LABEL = "lockgate.io/test-gc"
HOLD = "lockgate.io/test-hold"  # a finalizer only the tests remove
FINISHED_GRACE_SECONDS = 3.0
ENV = {
    "LOCKGATE_QUEUE_STORE_COLLECTION__INTERVAL_SECONDS": "0.3",
    "LOCKGATE_QUEUE_STORE_COLLECTION__CHECK_AFTER_SECONDS": "0.3",
    "LOCKGATE_QUEUE_STORE_COLLECTION__FINISHED_GRACE_SECONDS": str(FINISHED_GRACE_SECONDS),
    "LOCKGATE_QUEUE_STORE_COLLECTION__RETRY_INITIAL_SECONDS": "0.5",
    "LOCKGATE_QUEUE_STORE_COLLECTION__RETRY_MAX_SECONDS": "2",
    "LOCKGATE_QUEUE_STORE_COLLECTION__REQUEST_TIMEOUT_SECONDS": "2",
    **{f"{prefix}RETRY__{key}": value
       for prefix in ("LOCKGATE_QUEUE_STORE_", "LOCKGATE_UNGATER_", "LOCKGATE_WATCHER_",
                      "LOCKGATE_SCHEDULER_")
       for key, value in (("INITIAL_SECONDS", "0.1"), ("MAX_SECONDS", "1"))},
}


@dataclass
class Run:
    run: LockgateRun
    lockgate: Lockgate
    apis: dict[str, client.ApiClient]  # admin, by alias
    pool: asyncpg.Pool  # superuser, the run's database
    namespaces: Namespaces
    token_file: str
    a: str  # the run's alias of cluster-a
    b: str  # and of cluster-b
    queue: str

    def core(self, cluster: str) -> client.CoreV1Api:
        return client.CoreV1Api(self.apis[cluster])

    def name(self, base: str) -> str:
        return self.run.name(base)

    def cli(self, *args: str) -> str:
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["--api", self.lockgate.admin_url, "--token-file", self.token_file,
                         *args], out=out, err=err)
        assert code == 0, err.getvalue()
        return out.getvalue()

    def logs(self) -> str:
        return self.run.logs(25)


@pytest.fixture(scope="module")
async def run(stack: StackInfo, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Run]:
    """One run for the module: each test makes namespaces and job sets of its own."""
    async with lockgate_run(stack, tmp_path_factory.mktemp("runs"), name="gc", env=ENV,
                            clusters=("cluster-a", "cluster-b"),
                            standby_scheduler=False) as run:
        queue = run.name("q")
        # One pod of 1 cpu at a time: the others of a job set stay gated.
        await run.create_queue(queue, resource_limits={"cpu": "1"}, binding=[
            {"cluster": "*", "selector": {"matchLabels": {SELECT_LABEL: run.id}}}])
        token_file = str(run.lockgate.write_token_files()["admin"])
        try:
            yield Run(run, run.lockgate, run.apis, run.pool, run.namespaces, token_file,
                      run.alias("cluster-a"), run.alias("cluster-b"), queue)
        finally:
            await _release_holds(run.apis, run.namespaces)


@pytest.fixture
def restored_stack(stack: StackInfo) -> Iterator[Stack]:
    controller = Stack()
    assert controller.info().kafka_bootstrap == stack.kafka_bootstrap
    yield controller
    for component in controller.components():
        if controller.procs.inspect(component).state != "running":
            controller.start_component(component.name)
    devstack.ensure_up()


async def _release_holds(apis: dict[str, client.ApiClient], namespaces: Namespaces) -> None:
    for cluster, name in namespaces.created:
        try:
            await client.CoreV1Api(apis[cluster]).patch_namespace(
                name, {"metadata": {"finalizers": None}})
        except ApiException as error:
            if error.status != 404:
                raise


# ---------------------------------------------------------------- helpers


async def ephemeral(run: Run, cluster: str, name: str, jobset: str, *,
                    ttl_seconds: int | None = None, held: bool = False) -> str:
    """An ephemeral namespace as creation leaves it: labelled, and its active record."""
    # The object lockgate's creation makes (marked ephemeral, with the queue's allowed kinds):
    # namespace-keeper may delete no other namespace.
    namespace = namespace_object(
        name=name, queue=run.queue, jobset=jobset, kinds=DEFAULT_ALLOWED_KINDS,
        extra_labels={SELECT_LABEL: run.run.id, **run.lockgate.run_namespace_labels})
    if held:
        namespace["metadata"]["finalizers"] = [HOLD]
    core = run.core(cluster)
    await core.create_namespace(namespace)
    run.namespaces.created.append((cluster, name))
    await wait_for_default_service_account(core, name)
    async with run.pool.acquire() as connection:
        await namespace_store.create_or_get(
            connection, cluster=cluster, name=name, queue=run.queue, jobset=jobset,
            service_account="coordinator", ttl_seconds=ttl_seconds)
    return name


async def create_pod(run: Run, cluster: str, namespace: str, name: str, **kind: Any) -> None:
    pod = a_pod(name).never_restarted().requesting(cpu="1", memory="64Mi")
    if kind.get("completing_after"):
        pod = pod.completing_after(kind["completing_after"])
    if kind.get("jobset"):
        pod = pod.in_queue(run.queue).in_jobset(kind["jobset"])
    await run.core(cluster).create_namespaced_pod(namespace, pod.manifest())


async def record_of(run: Run, cluster: str, name: str) -> dict[str, Any]:
    async with run.pool.acquire() as connection:
        rows = await connection.fetch(
            "SELECT * FROM ephemeral_namespaces WHERE cluster = $1 AND name = $2", cluster, name)
    assert len(rows) == 1, f"{len(rows)} records of {cluster}/{name}"
    return dict(rows[0].items())


async def history(run: Run, cluster: str, name: str) -> list[tuple[str | None, str, str]]:
    async with run.pool.acquire() as connection:
        found = await namespace_store.transitions(connection, cluster, name)
    return [(t.from_state.value if t.from_state else None, t.to_state.value, t.cause)
            for t in found]


async def deleted(run: Run, cluster: str, name: str, within: float = 60) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        record = await record_of(run, cluster, name)
        return record if record["state"] == "deleted" else None

    record: dict[str, Any] = await eventually(
        done, within=within, every=0.2,
        what=lambda: f"{cluster}/{name} deleted:\n{run.logs()}")
    return record


async def gone(run: Run, cluster: str, name: str) -> bool:
    try:
        await run.core(cluster).read_namespace(name)
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


async def in_state(run: Run, cluster: str, name: str, state: str,
                   within: float = 60) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        record = await record_of(run, cluster, name)
        return record if record["state"] == state else None

    found: dict[str, Any] = await eventually(
        reached, within=within, every=0.1,
        what=lambda: f"{cluster}/{name} {state}:\n{run.logs()}")
    return found


def states(steps: list[tuple[str | None, str, str]]) -> list[str]:
    return [to for _, to, _ in steps]


async def pods_of(run: Run, cluster: str, jobset: str) -> list[str]:
    pods = await run.core(cluster).list_pod_for_all_namespaces(
        label_selector=f"{QUEUE_LABEL}={run.queue},{JOBSET_LABEL}={jobset}")
    return [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods.items]


async def jobs_of(run: Run, jobset: str) -> list[tuple[str, str]]:
    rows = await run.pool.fetch("SELECT state, last_reason FROM jobs WHERE queue = $1 AND"
                                " jobset = $2 ORDER BY uid", run.queue, jobset)
    return [(r["state"], r["last_reason"]) for r in rows]


# ---------------------------------------------------------------- the tests


async def test_cancel_deletes_pods_everywhere_collects_namespaces_and_cancels_jobs(
        run: Run) -> None:
    jobset = run.name("cancel")
    ns_a = await ephemeral(run, run.a, f"{run.run.id}-cancel-a", jobset)
    ns_b = await ephemeral(run, run.b, f"{run.run.id}-cancel-b", jobset)
    # A pod of the job set outside its ephemeral namespaces: only the ungater deletes it.
    plain = f"{run.run.id}-plain"
    await run.run.create_namespace(run.b, plain, labels={SELECT_LABEL: run.run.id})
    for i in range(3):
        await create_pod(run, run.a, ns_a, f"worker-{i}")
    await create_pod(run, run.b, ns_b, "worker-b")
    await create_pod(run, run.b, plain, "outside", jobset=jobset)

    async def running_and_queued() -> bool:
        found = [state for state, _ in await jobs_of(run, jobset)]
        return len(found) == 5 and "queued" in found and "running" in found

    await eventually(running_and_queued, within=90, every=0.2,
                     what=lambda: f"jobs of {jobset} running and queued:\n{run.logs()}")

    answer = run.cli("jobset", "cancel", run.queue, jobset, "--reason", "superseded by run 2",
                     "--wait", "90", "-o", "json")
    assert '"state": "deleted"' in answer

    for cluster in (run.a, run.b):
        async def no_pods(cluster: str = cluster) -> bool:
            return not await pods_of(run, cluster, jobset)

        await eventually(no_pods, within=60, every=0.2, what=f"no pods of {jobset} in {cluster}")
    assert await gone(run, run.a, ns_a) and await gone(run, run.b, ns_b)
    for cluster, name in ((run.a, ns_a), (run.b, ns_b)):
        record = await record_of(run, cluster, name)
        assert (record["state"], record["trigger"]) == ("deleted", "cancelled")
        steps = await history(run, cluster, name)
        assert states(steps) == ["active", "expiring", "deleting", "deleted"], steps
        assert "superseded by run 2" in steps[1][2]
    assert await jobs_of(run, jobset) == [("cancelled", "cancelled: superseded by run 2")] * 5
    # A second cancel changes nothing and says so through the same path.
    run.cli("jobset", "cancel", run.queue, jobset, "--reason", "again")
    await wait_consumed(run.lockgate.kafka_bootstrap, JOBSET_COMMANDS,
                        groups=run.lockgate.groups_reading(JOBSET_COMMANDS),
                        what="the second cancel")
    assert await jobs_of(run, jobset) == [("cancelled", "cancelled: superseded by run 2")] * 5
    assert len(await history(run, run.a, ns_a)) == 4


async def test_a_namespace_whose_ttl_passed_is_collected(run: Run) -> None:
    name = await ephemeral(run, run.a, f"{run.run.id}-ttl", run.name("ttl"), ttl_seconds=3)
    assert (await record_of(run, run.a, name))["state"] == "active"
    record = await deleted(run, run.a, name)
    assert record["trigger"] == "ttl"
    assert record["deleted_at"] >= record["expires_at"]
    assert await gone(run, run.a, name)
    assert states(await history(run, run.a, name)) == [
        "active", "expiring", "deleting", "deleted"]
    # Every admin API answer gives the record in one shape: describe, and delete once collected.
    described = json.loads(run.cli("namespace", "describe", f"{run.a}/{name}", "-o", "json"))
    again = json.loads(run.cli("namespace", "delete", f"{run.a}/{name}", "-o", "json"))
    assert {k: v for k, v in described.items()
            if k not in ("allowed_kinds", "transitions")} == again
    assert (again["state"], again["ttl_seconds"], again["service_account"]) == (
        "deleted", 3, "coordinator")
    assert [(t["from_state"], t["to_state"]) for t in described["transitions"]] == [
        (None, "active"), ("active", "expiring"), ("expiring", "deleting"),
        ("deleting", "deleted")]


async def test_a_finished_job_set_s_namespace_is_collected_after_the_grace(run: Run) -> None:
    jobset = run.name("done")
    name = await ephemeral(run, run.a, f"{run.run.id}-done", jobset)
    await create_pod(run, run.a, name, "only", completing_after="1s")

    async def succeeded() -> asyncpg.Record | None:
        row = await run.pool.fetchrow(
            "SELECT state, finished_at FROM jobs WHERE queue = $1 AND jobset = $2", run.queue,
            jobset)
        return row if row is not None and row["state"] == "succeeded" else None

    job = await eventually(succeeded, within=90, every=0.2,
                           what=lambda: f"the job of {jobset} succeeded:\n{run.logs()}")
    record = await deleted(run, run.a, name)
    assert record["trigger"] == "finished"
    async with run.pool.acquire() as connection:
        expired_at = await connection.fetchval(
            "SELECT at FROM ephemeral_namespace_transitions WHERE cluster = $1 AND name = $2"
            " AND to_state = 'expiring'", run.a, name)
    finished_at = job["finished_at"]
    assert (expired_at - finished_at).total_seconds() >= FINISHED_GRACE_SECONDS - 0.5
    assert await gone(run, run.a, name)


async def test_a_collector_killed_mid_deletion_finishes_after_restart(run: Run) -> None:
    name = await ephemeral(run, run.a, f"{run.run.id}-kill", run.name("kill"), held=True)
    run.cli("namespace", "delete", f"{run.a}/{name}", "--reason", "crash test")
    deleting = await in_state(run, run.a, name, "deleting")
    # Held by the finalizer, it stays Terminating: the collector keeps looking (each look moves
    # the next one on), and it stays deleting.
    checks: list[Any] = [deleting["next_attempt_at"]]

    async def looked_twice_more() -> bool:
        record = await record_of(run, run.a, name)
        assert record["state"] == "deleting", record
        if record["next_attempt_at"] != checks[-1]:
            checks.append(record["next_attempt_at"])
        return len(checks) >= 3

    await eventually(looked_twice_more, within=30, every=0.1,
                     what=lambda: f"the collector to look at {name} twice more ({checks})")
    assert not await gone(run, run.a, name)

    await run.run.kill("queue-store")
    await run.core(run.a).patch_namespace(name, {"metadata": {"finalizers": None}})
    await eventually(lambda: gone(run, run.a, name), within=60, every=0.2,
                     what=f"{name} gone from its cluster")
    assert (await record_of(run, run.a, name))["state"] == "deleting"  # nobody collects now
    await run.run.restart("queue-store")

    record = await deleted(run, run.a, name)
    assert record["trigger"] == "requested"
    steps = await history(run, run.a, name)
    assert states(steps) == ["active", "expiring", "deleting", "deleted"], steps
    assert "crash test" in steps[1][2]


async def test_an_unreachable_cluster_delays_collection_and_loses_nothing(
        run: Run, restored_stack: Stack) -> None:
    held = await ephemeral(run, run.b, f"{run.run.id}-outage-b", run.name("out"), held=True)
    other = await ephemeral(run, run.a, f"{run.run.id}-outage-a", run.name("out"))
    run.cli("namespace", "delete", f"{run.b}/{held}")
    await in_state(run, run.b, held, "deleting")

    restored_stack.kill("cluster-b/kube-apiserver")
    failed = await in_state(run, run.b, held, "failed", within=60)
    assert "unreachable" in failed["failure_reason"], failed
    # The other cluster is not held up meanwhile.
    run.cli("namespace", "delete", f"{run.a}/{other}")
    await deleted(run, run.a, other)

    async def retried() -> dict[str, Any] | None:
        record = await record_of(run, run.b, held)
        return record if record["attempts"] >= 2 else None

    await eventually(retried, within=60, every=0.2, what="a second failed attempt")
    restored_stack.start_component("cluster-b/kube-apiserver")
    await run.core(run.b).patch_namespace(held, {"metadata": {"finalizers": None}})

    record = await deleted(run, run.b, held, within=90)
    assert record["failure_reason"] == ""
    assert await gone(run, run.b, held)
    steps = await history(run, run.b, held)
    assert states(steps)[:4] == ["active", "expiring", "deleting", "failed"], steps
    assert states(steps)[-2:] == ["deleting", "deleted"], steps
    assert states(steps).count("deleted") == 1, steps
    assert "unreachable" in steps[3][2], steps
