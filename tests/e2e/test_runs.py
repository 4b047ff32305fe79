"""The run every end-to-end test starts lockgate with (helpers.runs), tested itself.

Two runs of the same module, one right after the other, share no name: the second creates its
namespace at once, while the first one's is still being deleted (the bug that made
test_gangs_preemption_e2e fail on a machine where namespaces take long to go). A run leaves
nothing behind that another could trip over: its database is dropped, its webhook registration
and Queue objects removed, its namespaces deleted. A service that dies fails the run, unless the
test killed it on purpose.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.stack import StackInfo
from helpers.kube import gates_of, temporary_namespaces, until_nodes_hold_no_pods
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run, new_run_id
from helpers.waiting import eventually
from lockgate.labels import SCHEDULING_GATE
from lockgate_adapters.postgres import database_of

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

QUEUE_STORE_AND_WEBHOOK = ("queue-store", "admission-webhook")
QUIET_SECONDS = 5


async def database_exists(server_dsn: str, dsn: str) -> bool:
    connection = await asyncpg.connect(server_dsn)
    try:
        return bool(await connection.fetchval(
            "SELECT 1 FROM pg_database WHERE datname = $1", database_of(dsn)))
    finally:
        await connection.close()


async def webhook_registered(api: client.ApiClient, name: str) -> bool:
    try:
        await client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(name)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


async def namespace_phase(api: client.ApiClient, name: str) -> str:
    """"Active", "Terminating", or "gone"."""
    try:
        namespace = await client.CoreV1Api(api).read_namespace(name)
    except ApiException as error:
        if error.status == 404:
            return "gone"
        raise
    return str(namespace.status.phase)


async def use(run: LockgateRun) -> None:
    """What a test does with a run: a queue, its namespace, a pod the webhook gates."""
    queue = run.name("q")
    await run.create_queue(queue, namespaces=[run.namespace])
    await run.create_namespace()
    created = await run.core().create_namespaced_pod(
        run.namespace, a_pod("p").in_queue(queue).manifest())
    assert gates_of(created) == [SCHEDULING_GATE], "the run's webhook did not gate its pod"


def test_run_ids_are_new_each_time_and_fit_kubernetes_names() -> None:
    ids = {new_run_id("gang") for _ in range(100)}
    assert len(ids) == 100
    assert all(len(i) <= 20 and i.startswith("gang-") for i in ids)


async def test_a_run_right_after_another_of_the_same_name_shares_nothing_and_waits_for_nothing(
        stack: StackInfo, kube_clients: dict[str, client.ApiClient], tmp_path: Path) -> None:
    admin = kube_clients["cluster-a"]
    async with lockgate_run(stack, tmp_path, name="runs",
                            services=QUEUE_STORE_AND_WEBHOOK) as first:
        await use(first)
        assert await webhook_registered(admin, first.lockgate.webhook_configuration_name)
    assert not await database_exists(stack.postgres_dsn, first.dsn), "the database was kept"
    assert not await webhook_registered(admin, first.lockgate.webhook_configuration_name)
    assert await namespace_phase(admin, first.namespace) in ("Terminating", "gone")

    async with lockgate_run(stack, tmp_path, name="runs",
                            services=QUEUE_STORE_AND_WEBHOOK) as second:
        names = {"id": (first.id, second.id), "namespace": (first.namespace, second.namespace),
                 "name": (first.name("q"), second.name("q")),
                 "cluster alias": (first.alias(), second.alias()),
                 "database": (database_of(first.dsn), database_of(second.dsn)),
                 "webhook registration": (first.lockgate.webhook_configuration_name,
                                          second.lockgate.webhook_configuration_name),
                 "queue source": (first.lockgate.queue_source, second.lockgate.queue_source)}
        shared = {what: pair for what, pair in names.items() if pair[0] == pair[1]}
        assert not shared, f"names shared by two runs: {shared}"
        # No waiting for the first run's namespace to go: the second has its own.
        await use(second)


async def test_a_service_that_dies_fails_the_run_unless_the_test_killed_it(
        stack: StackInfo, tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"did not stop gracefully.*queue-store"):
        async with lockgate_run(stack, tmp_path, name="runs", services=["queue-store"]) as run:
            await run.lockgate.processes["queue-store"].kill()  # as if it crashed
    async with lockgate_run(stack, tmp_path, name="runs", services=["queue-store"]) as run:
        await run.kill("queue-store")
    async with lockgate_run(stack, tmp_path, name="runs", services=["queue-store"]) as run:
        await run.kill("queue-store")
        await run.restart("queue-store")  # back again: it must stop gracefully once more
        assert "queue-store" not in run.killed


async def test_a_run_that_sizes_from_the_nodes_waits_for_a_leak_to_go_and_names_it(
        stack: StackInfo, kube_clients: dict[str, client.ApiClient], tmp_path: Path) -> None:
    """A pod another test left bound to a node fails `needs_empty_nodes` with its name, once;
    gone, it no longer stands in the way."""
    admin = kube_clients["cluster-a"]
    leak = new_run_id("leak")
    async with temporary_namespaces({"cluster-a": admin}) as namespaces:
        await namespaces.create("cluster-a", leak)  # not managed: nothing gates its pod
        await client.CoreV1Api(admin).create_namespaced_pod(
            leak, a_pod("sleeper").tolerating_kwok_nodes().requesting(cpu="500m").manifest())

        async def bound() -> bool:
            pod = await client.CoreV1Api(admin).read_namespaced_pod("sleeper", leak)
            return bool(pod.spec.node_name)
        await eventually(bound, within=60, what="the leaked pod to bind")
        with pytest.raises(AssertionError, match=rf"cluster-a/{leak}/sleeper on "):
            await until_nodes_hold_no_pods({"cluster-a": admin}, within=2)
    await until_nodes_hold_no_pods({"cluster-a": admin}, within=60)
    async with lockgate_run(stack, tmp_path, name="runs", services=["queue-store"],
                            needs_empty_nodes=True) as run:
        assert run.lockgate.processes["queue-store"].alive()


async def test_two_runs_sharing_a_cluster_take_only_their_own_pods(
        stack: StackInfo, tmp_path: Path) -> None:
    """Each run's watcher takes pods only from namespaces its webhook serves (the run label),
    so another run's pod is never its job, counted in its queues or told "queue does not
    exist". Pod events travel on Kafka partitions of their own, so after both runs hold their
    own pod, a quiet period (ingest takes well under a second here) lets a wrong one arrive."""
    services = ("queue-store", "admission-webhook", "cluster-watcher")
    async with lockgate_run(stack, tmp_path, name="runs", services=services) as ours, \
            lockgate_run(stack, tmp_path, name="runs", services=services) as theirs:
        pods: dict[str, str] = {}
        for run in (theirs, ours):
            queue = run.name("q")
            await run.create_queue(queue, namespaces=[run.namespace])
            await run.create_namespace()
            created = await run.create_pod(a_pod("p").in_queue(queue).manifest())
            assert gates_of(created) == [SCHEDULING_GATE]
            pods[run.id] = created.metadata.uid
        await eventually(lambda: ours.job(pods[ours.id]), within=60, what="our pod's job")
        await eventually(lambda: theirs.job(pods[theirs.id]), within=60,
                         what="their pod's job")
        await asyncio.sleep(QUIET_SECONDS)
        assert await ours.job(pods[theirs.id]) is None, "our run took their pod as a job"
        assert await ours.pool.fetchval("SELECT count(*) FROM jobs") == 1
