"""What a cluster may grow by, on the real stack: Karpenter's objects → cluster-watcher → Kafka →
queue-store → Postgres → the fair-scheduler leader's load.

Karpenter's CRDs (v1.13.0's, from the Go module cache) are installed into cluster-b only while
this module runs; Karpenter itself does not run there, so the NodePool and NodeClaims are
created by the test, their status written through the status subresource as Karpenter writes
it. cluster-a never serves the kinds. The watcher runs in this process with the watcher's own
ServiceAccount (proving its ClusterRole suffices) and watches both clusters under names of this
module's own; queue-store runs as a process on a database of its own that keeps only those
clusters' rows (devstack.isolation). The leader's reads are made as the scheduler's role.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import REGISTRY

import devstack
from cluster_watcher.app import compose
from cluster_watcher.settings import WatcherSettings
from devstack import StackInfo
from devstack.isolation import keep_only_clusters
from devstack.roles import service_dsn
from helpers.kafka import TopicTail
from helpers.postgres import fresh_database
from helpers.queue_store import QueueStoreUnderTest
from helpers.services import FAST_RETRY, service_in_process
from helpers.waiting import eventually
from lockgate.events import CLUSTER_GROWTH, ClusterGrowth
from lockgate.growth_observing import KARPENTER_GROUP, KARPENTER_VERSION, NODE_CLAIMS, NODE_POOLS
from lockgate.placement import Requirement, Taint
from lockgate.scheduler import SchedulerState
from lockgate_adapters import scheduler_store
from lockgate_adapters.postgres import CHANGES_CHANNEL
from lockgate_adapters.service import ServiceContext

pytestmark = [pytest.mark.timeout(300)]

SUFFIX = uuid.uuid4().hex[:6]
AUTOSCALED, PLAIN = "cluster-b", "cluster-a"
ALIASES = {f"growth-b-{SUFFIX}": AUTOSCALED, f"growth-a-{SUFFIX}": PLAIN}
GROWING, STILL = f"growth-b-{SUFFIX}", f"growth-a-{SUFFIX}"
POOL = f"lockgate-test-{SUFFIX}"
# A pool the apiserver stores (the CRD's quantity pattern takes a fractional exponent) that
# lockgate cannot read: it must be left out and said, the watcher going on.
UNREADABLE_POOL = f"lockgate-unreadable-{SUFFIX}"
KARPENTER_MODULE = "sigs.k8s.io/karpenter@v1.13.0"
CRD_FILES = ("karpenter.sh_nodepools.yaml", "karpenter.sh_nodeclaims.yaml")
RECHECK_SECONDS = 2.0
GIB = 2**30


# Karpenter's CRDs, from the Go module cache --------------------------------------------------
# (libs/devstack/karpenter.py, on its way from branch `karpenter`, caches the same files; once it
# is merged this reads them from there.)


def karpenter_crds() -> list[dict[str, Any]]:
    """The NodePool and NodeClaim CRDs of Karpenter v1.13.0, downloaded into the Go module cache
    if they are not there yet."""
    go = shutil.which("go")
    if go is None:
        pytest.fail("Go is not on PATH: Karpenter's CRDs come from its Go module "
                    f"({KARPENTER_MODULE}); install Go 1.25+", pytrace=False)
    result = subprocess.run(
        ["nice", go, "mod", "download", "-json", KARPENTER_MODULE], capture_output=True,
        text=True, timeout=600, check=False)
    if result.returncode != 0:
        pytest.fail(f"go mod download {KARPENTER_MODULE} failed: {result.stdout[-500:]}"
                    f"{result.stderr[-500:]}", pytrace=False)
    directory = Path(json.loads(result.stdout)["Dir"]) / "pkg" / "apis" / "crds"
    return [yaml.safe_load((directory / name).read_text()) for name in CRD_FILES]


async def serves_node_pools(api: client.ApiClient) -> bool:
    try:
        await client.ApiextensionsV1Api(api).read_custom_resource_definition(
            f"{NODE_POOLS}.{KARPENTER_GROUP}")
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


async def install_crds(api: client.ApiClient, crds: list[dict[str, Any]]) -> None:
    extensions = client.ApiextensionsV1Api(api)
    for crd in crds:
        await extensions.create_custom_resource_definition(crd)

    async def established() -> bool:
        for crd in crds:
            found = await extensions.read_custom_resource_definition(crd["metadata"]["name"])
            conditions = {c.type: c.status for c in found.status.conditions or ()}
            if conditions.get("Established") != "True":
                return False
        return True

    await eventually(established, within=60, every=0.2,
                     what="Karpenter's CRDs to be established")


async def remove_crds(api: client.ApiClient, crds: list[dict[str, Any]]) -> None:
    extensions = client.ApiextensionsV1Api(api)
    for crd in crds:
        with contextlib.suppress(ApiException):
            await extensions.delete_custom_resource_definition(crd["metadata"]["name"])

    async def gone() -> bool:
        return not await serves_node_pools(api) and not await _exists(
            extensions, f"{NODE_CLAIMS}.{KARPENTER_GROUP}")

    await eventually(gone, within=120, every=0.2, what="Karpenter's CRDs to be deleted")


async def _exists(extensions: client.ApiextensionsV1Api, name: str) -> bool:
    try:
        await extensions.read_custom_resource_definition(name)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


# Karpenter's objects, as Karpenter would write them ------------------------------------------


def _condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def node_pool(name: str = POOL, cpu_limit: str = "64") -> dict[str, Any]:
    return {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
        "spec": {
            "limits": {"cpu": cpu_limit, "memory": "256Gi"},
            "weight": 10,
            "template": {
                "metadata": {"labels": {"team": "ml"}},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                                     "name": "default"},
                    "requirements": [
                        {"key": "karpenter.sh/capacity-type", "operator": "In",
                         "values": ["on-demand"]},
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}],
                    "taints": [{"key": "lockgate.io/test", "value": "growth",
                                "effect": "NoSchedule"}],
                    "startupTaints": [{"key": "example.com/warming", "effect": "NoExecute"}],
                },
            },
        },
    }


def node_pool_status() -> dict[str, Any]:
    return {"resources": {"cpu": "8", "memory": "32Gi", "pods": "220", "nodes": "2"},
            "conditions": [_condition("ValidationSucceeded", "True", "ValidationSucceeded"),
                           _condition("NodeClassReady", "True", "NodeClassReady"),
                           _condition("Ready", "True", "Ready")]}


def node_claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": POOL}},
        "spec": {
            "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                             "name": "default"},
            "requirements": [{"key": "karpenter.sh/nodepool", "operator": "In",
                              "values": [POOL]}],
            "resources": {"requests": {"cpu": "3", "memory": "1Gi"}},
        },
    }


def launching_status() -> dict[str, Any]:
    return {"allocatable": {"cpu": "3920m", "memory": "7Gi", "pods": "110"},
            "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [_condition("Launched", "True", "Launched"),
                           _condition("Registered", "Unknown", "NodeNotFound",
                                      "Node not registered with cluster"),
                           _condition("Initialized", "Unknown", "NodeNotFound",
                                      "Node not registered with cluster")]}


def failed_status() -> dict[str, Any]:
    return {"conditions": [_condition(
        "Launched", "Unknown", "LaunchFailed",
        "creating instance, insufficient capacity, all requested instance types were "
        "unavailable during launch")]}


async def create_with_status(custom: client.CustomObjectsApi, plural: str, body: dict[str, Any],
                             status: dict[str, Any]) -> None:
    created = await custom.create_cluster_custom_object(
        KARPENTER_GROUP, KARPENTER_VERSION, plural, body)
    created["status"] = status
    await custom.replace_cluster_custom_object_status(
        KARPENTER_GROUP, KARPENTER_VERSION, plural, body["metadata"]["name"], created)


async def delete_object(custom: client.CustomObjectsApi, plural: str, name: str) -> None:
    with contextlib.suppress(ApiException):
        await custom.delete_cluster_custom_object(KARPENTER_GROUP, KARPENTER_VERSION, plural,
                                                  name)


# The path under test -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_watcher(kubeconfigs: Mapping[str, str], kafka_bootstrap: str, *,
                          aliases: Mapping[str, str] = ALIASES,
                          ready: Callable[[ServiceContext], bool] | None = None,
                          ) -> AsyncIterator[ServiceContext]:
    settings = WatcherSettings(
        clusters={alias: kubeconfigs[real] for alias, real in aliases.items()},
        kafka_bootstrap=kafka_bootstrap, http_port=0, retry=FAST_RETRY,
        watch_timeout_seconds=30, kafka_send_timeout_seconds=5,
        growth_min_interval_seconds=0.2, growth_refresh_seconds=5,
        growth_recheck_seconds=RECHECK_SECONDS)
    checks = {f"{alias}/growth" for alias in aliases}

    def all_ready(ctx: ServiceContext) -> bool:
        return checks <= set(ctx.readiness.report()) and ctx.readiness.ready

    async with service_in_process(settings, compose, name="growth-watcher-under-test",
                                  ready=ready or all_ready) as ctx:
        yield ctx


@pytest.fixture(scope="module")
async def database(stack: StackInfo) -> AsyncIterator[str]:
    async with fresh_database(stack.postgres_dsn, prefix="growth_it", migrated=True) as dsn:
        await keep_only_clusters(dsn, ALIASES)
        yield dsn


@pytest.fixture(scope="module")
async def queue_store(database: str, kafka_bootstrap: str) -> AsyncIterator[None]:
    spec = QueueStoreUnderTest(postgres_dsn=database, kafka_bootstrap=kafka_bootstrap)
    name = f"queue-store-growth-{SUFFIX}"
    process = await spec.start(name, {"LOCKGATE_QUEUE_STORE_INSTANCE_ID": name})
    yield
    assert await process.stop() == 0, process.log_tail()


@pytest.fixture(scope="module")
async def leader(database: str, queue_store: None) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the fair scheduler's role, as its leader reads."""
    connection = await scheduler_store.connect(service_dsn(database, "fair-scheduler"))
    yield connection
    await connection.close()


@pytest.fixture(scope="module")
def crds() -> list[dict[str, Any]]:
    return karpenter_crds()


async def growth_loaded(leader: asyncpg.Connection) -> dict[str, ClusterGrowth]:
    return (await scheduler_store.load_everything(leader)).growth


def pool_names(growth: ClusterGrowth) -> list[str]:
    return [pool.name for pool in growth.node_pools]


async def test_the_leader_loads_what_each_cluster_may_grow_by(
        stack: StackInfo, kafka_bootstrap: str, kube_clients: dict[str, client.ApiClient],
        database: str, leader: asyncpg.Connection, crds: list[dict[str, Any]]) -> None:
    api = kube_clients[AUTOSCALED]
    if await serves_node_pools(api) or await serves_node_pools(kube_clients[PLAIN]):
        pytest.fail(f"{AUTOSCALED} or {PLAIN} already serves Karpenter's NodePool kind: "
                    "another test installed it and did not remove it (nodepools.karpenter.sh)",
                    pytrace=False)
    custom = client.CustomObjectsApi(api)
    notified: list[str] = []
    listener = await asyncpg.connect(database)
    await listener.add_listener(CHANGES_CHANNEL, lambda *args: notified.append(str(args[3])))
    installed = False
    # k8s/base as this checkout has it (the watcher's rule for the kinds), again: every test
    # session on the shared stack applies its own checkout's, which may predate the rule.
    await asyncio.to_thread(devstack.install_cluster_objects)
    try:
        async with running_watcher(stack.kubeconfigs_of("cluster-watcher"), kafka_bootstrap):
            # Neither cluster serves the kinds yet: both are said not to be autoscaled.
            await eventually(lambda: _pictures(leader, lambda g: set(g) == set(ALIASES)
                                          and not any(p.autoscaled for p in g.values())),
                        within=60, every=0.2, what="both clusters stored as not autoscaled")
            cursor = (await scheduler_store.load_everything(leader)).cursor
            still_said_at = await _observed_at(leader, STILL)

            # Karpenter's CRDs arrive later, with a pool and two claims: noticed on the recheck.
            await install_crds(api, crds)
            installed = True
            await create_with_status(custom, NODE_POOLS, node_pool(), node_pool_status())
            await create_with_status(custom, NODE_POOLS, node_pool(UNREADABLE_POOL, "1e1.5"),
                                     node_pool_status())
            await create_with_status(custom, NODE_CLAIMS, node_claim(f"{POOL}-up"),
                                     launching_status())
            await create_with_status(custom, NODE_CLAIMS, node_claim(f"{POOL}-bad"),
                                     failed_status())
            await eventually(lambda: _pictures(leader, lambda g: g[GROWING].autoscaled
                                          and len(g[GROWING].node_claims) == 2),
                        within=60, every=0.2, what=f"{GROWING}'s pool and claims stored")
            growth = (await growth_loaded(leader))[GROWING]
            assert not (await growth_loaded(leader))[STILL].autoscaled
            assert REGISTRY.get_sample_value(
                "lockgate_watcher_unreadable_autoscaler_objects_total",
                {"cluster": GROWING, "kind": "NodePool"}), "the unreadable pool was not said"
            [pool] = growth.node_pools  # the unreadable one left out
            assert (pool.name, pool.ready, pool.weight) == (POOL, True, 10)
            assert pool.limits == {"cpu": 64_000, "memory": 256 * GIB}
            assert pool.in_use == {"cpu": 8_000, "memory": 32 * GIB, "pods": 220, "nodes": 2}
            assert pool.requirements == (
                Requirement(key="karpenter.sh/capacity-type", operator="In",
                            values=("on-demand",)),
                Requirement(key="kubernetes.io/arch", operator="In", values=("amd64",)))
            assert pool.labels == {"team": "ml", "karpenter.sh/nodepool": POOL}
            assert pool.taints == (Taint(key="lockgate.io/test", value="growth",
                                         effect="NoSchedule"),)
            claims = {claim.name: claim for claim in growth.node_claims}
            up, bad = claims[f"{POOL}-up"], claims[f"{POOL}-bad"]
            assert (up.node_pool, up.launched, up.registered, up.failure) == (
                POOL, True, False, "")
            assert up.allocatable == {"cpu": 3920, "memory": 7 * GIB, "pods": 110}
            assert bad.failure.startswith("Launched: LaunchFailed: creating instance, "
                                          "insufficient capacity")
            assert not bad.launched

            # The leader's change feed brings the change, and the state takes it.
            changes = await scheduler_store.changes_since(leader, cursor)
            assert changes.growth[GROWING] == growth
            state = SchedulerState()
            for cluster, picture in changes.growth.items():
                state.set_growth(cluster, picture)
            assert state.growth(GROWING) == growth
            assert "cluster_growth" in notified

            # The pool goes: the picture follows, through the feed from the last read.
            cursor = changes.cursor
            await delete_object(custom, NODE_POOLS, POOL)
            await delete_object(custom, NODE_POOLS, UNREADABLE_POOL)
            await eventually(lambda: _pictures(leader, lambda g: not g[GROWING].node_pools),
                        within=60, every=0.2, what=f"{GROWING}'s pool gone from the stored picture")
            changes = await scheduler_store.changes_since(leader, cursor)
            assert changes.growth[GROWING].autoscaled
            assert changes.growth[GROWING].node_pools == []
            assert STILL not in changes.growth, "an unchanged picture must not be fed again"

            # A refresh that changes nothing does not reach the feed (only observed_at moves).
            cursor = changes.cursor
            stored_at = await _observed_at(leader, GROWING)
            await eventually(lambda: _observed_after(leader, GROWING, stored_at), within=30,
                             every=0.2, what=f"a refresh of {GROWING}'s picture")
            assert GROWING not in (await scheduler_store.changes_since(leader, cursor)).growth
            # A cluster that is not autoscaled was said so once, not at every refresh.
            assert await _observed_at(leader, STILL) == still_said_at

            # Karpenter uninstalled: the cluster is no longer autoscaled.
            for name in (f"{POOL}-up", f"{POOL}-bad"):
                await delete_object(custom, NODE_CLAIMS, name)
            await remove_crds(api, crds)
            installed = False
            await eventually(lambda: _pictures(leader, lambda g: not g[GROWING].autoscaled),
                        within=60, every=0.2, what=f"{GROWING} stored as not autoscaled again")
    finally:
        await listener.close()
        if installed:
            await delete_object(custom, NODE_POOLS, POOL)
            await delete_object(custom, NODE_POOLS, UNREADABLE_POOL)
            for name in (f"{POOL}-up", f"{POOL}-bad"):
                await delete_object(custom, NODE_CLAIMS, name)
            await remove_crds(api, crds)


async def _pictures(leader: asyncpg.Connection, check: Any) -> bool:
    growth = await growth_loaded(leader)
    try:
        return bool(check(growth))
    except KeyError:
        return False


async def _observed_at(leader: asyncpg.Connection, cluster: str) -> datetime:
    value = await leader.fetchval(
        "SELECT observed_at FROM cluster_growth WHERE cluster = $1", cluster)
    assert isinstance(value, datetime)
    return value


async def _observed_after(leader: asyncpg.Connection, cluster: str, at: datetime) -> bool:
    return await _observed_at(leader, cluster) > at


async def test_a_watcher_that_may_not_see_the_kinds_counts_the_cluster_as_not_autoscaled(
        stack: StackInfo, kafka_bootstrap: str) -> None:
    """Without the ClusterRole's rule (an upgrade that did not apply k8s/base), the watcher
    says so and falls back to today's behaviour rather than keep a stale picture, and it stays
    ready: its pods and nodes must still be reported. The ungater's identity has no such rule
    (nor one for pods and nodes, so only the growth check is awaited here)."""
    alias = f"growth-forbidden-{SUFFIX}"

    def growth_said(ctx: ServiceContext) -> bool:
        check = ctx.readiness.report().get(f"{alias}/growth") or {}
        return bool(check.get("ready")) and "NOT WATCHED" in str(check.get("detail"))

    async with (TopicTail(kafka_bootstrap, [CLUSTER_GROWTH],
                          keep=lambda e: getattr(e, "cluster", None) == alias) as pictures,
                running_watcher(stack.kubeconfigs_of("ungater"), kafka_bootstrap,
                                aliases={alias: PLAIN}, ready=growth_said) as ctx):
        picture: ClusterGrowth = await pictures.wait_for(
            lambda e: True, what=f"{alias}'s growth picture")
        detail = str(ctx.readiness.report()[f"{alias}/growth"]["detail"])
    assert not picture.autoscaled
    assert (picture.node_pools, picture.node_claims) == ([], [])
    assert "403" in detail and "k8s/base/cluster-watcher-rbac.yaml" in detail
