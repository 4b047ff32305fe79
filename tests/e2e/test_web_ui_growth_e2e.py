"""The web UI's clusters that grow, in a real browser (Debian's chromium, driven by Playwright).

lockgate runs as processes (Lockgate.for_stack) watching the stack's autoscaled cluster-c alone,
where real Karpenter (its kwok provider) makes the nodes. Inside `autoscaled_cluster` (cluster-c
emptied before and after, one user at a time): a NodePool of at most 2 nodes of 8 cpu, and a
second one whose KWOKNodeClass does not exist (never Ready, so it adds nothing, and says why).
A queue's 3 pods of 2 cpu are released for growth and Karpenter makes a node for them; the
node registers 20 s after its NodeClaim (the KWOKNodeClass's delay), so for a while the pods are
released and wait for it.

While they wait, `lockgate explain` (queue-store's API, asking the leader) and the pod's Event
say that the pod was released so that the cluster grows, and for which NodePool.

The overview's "Clusters that grow" table is then checked against what the test reads itself
from the Kubernetes API (the nodes Karpenter made, their allocatable) and the NodePool's limit:
the nodes, their capacity, each pool's headroom (whole nodes left under the limit) and the
broken pool's reason. Screenshot: test-artifacts/web-ui/growth-overview.png.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.isolation import keep_only_clusters
from devstack.launcher import Lockgate
from devstack.ports import ServicePorts
from helpers.browser import browser, screenshot
from helpers.karpenter import (
    AUTOSCALED_CLUSTER,
    apply_node_class,
    apply_node_pool,
    autoscaled_cluster,
    list_nodes,
    node_pool,
    node_ready,
)
from helpers.pods import a_pod
from helpers.postgres import fresh_database, migrate_database
from helpers.waiting import eventually
from lockgate.labels import MANAGED_NAMESPACE_LABEL
from lockgate.resources import parse_quantity

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

RUN = uuid.uuid4().hex[:6]
ALIAS = f"uig-{RUN}"
NAMESPACE = f"e2e-uig-{RUN}"
QUEUE = f"uig-{RUN}"
POOL, BROKEN_POOL, NODE_CLASS = f"uig-{RUN}", f"uig-broken-{RUN}", f"uig-{RUN}"
NODE_CPU, MAX_NODES, PODS = 8, 2, 3
REGISTRATION_DELAY = "20s"  # a window in which the pods are released and wait for their node


@pytest.fixture
async def growing(autoscaled_stack: Any, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[tuple[Lockgate, client.ApiClient]]:
    """lockgate watching cluster-c, a pool that grew a node for a queue's pods."""
    async with (autoscaled_cluster(autoscaled_stack) as api,
                fresh_database(autoscaled_stack.postgres_dsn, prefix=f"lockgate_uig_{RUN}")
                as dsn):
        await migrate_database(dsn)
        await keep_only_clusters(dsn, [ALIAS])
        await apply_node_class(api, NODE_CLASS, registration_delay=REGISTRATION_DELAY)
        await apply_node_pool(api, node_pool(POOL, node_class=NODE_CLASS,
                                             cpu_limit=str(NODE_CPU * MAX_NODES)))
        await apply_node_pool(api, node_pool(BROKEN_POOL, node_class=f"missing-{RUN}",
                                             cpu_limit="64"))
        lockgate = Lockgate.for_stack(
            autoscaled_stack, clusters={ALIAS: AUTOSCALED_CLUSTER}, postgres_dsn=dsn,
            ports=ServicePorts.free(), run_id=f"uig-{RUN}", standby_scheduler=False,
            log_dir=tmp_path_factory.mktemp("service-logs"),
            cert_dir=tmp_path_factory.mktemp("webhook-certs"),
            extra_env={"LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1",
                       "LOCKGATE_SCHEDULER_GROWTH_INSTANCE_SHAPES": json.dumps(
                           {POOL: {"cpu": str(NODE_CPU), "memory": "16Gi"}}),
                       "LOCKGATE_SCHEDULER_GROWTH_NODE_OVERHEAD": json.dumps({"cpu": "100m"})})
        core = client.CoreV1Api(api)
        try:
            await lockgate.start()
            binding = [{"cluster": "*", "names": [NAMESPACE]}]
            async with (aiohttp.ClientSession(headers=lockgate.admin_headers) as session,
                        session.post(f"{lockgate.admin_url}/api/v1/queues",
                                     json={"name": QUEUE, "namespaces": binding}) as answer):
                assert answer.status in (200, 201), await answer.text()
            await lockgate.wait_for_queues({QUEUE: {"cordoned": False, "namespaces": binding}})
            await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": NAMESPACE,
                "labels": {MANAGED_NAMESPACE_LABEL: "true", **lockgate.run_namespace_labels}}})
            for i in range(PODS):
                await _create(core, a_pod(f"g-{i}").in_queue(QUEUE).in_jobset("g")
                              .requesting(cpu="2", memory="1Gi").never_restarted().manifest())
            yield lockgate, api
        finally:
            codes = await lockgate.stop()
            try:
                await core.delete_namespace(NAMESPACE)
            except ApiException as error:
                if error.status != 404:
                    raise
    assert not {name: code for name, code in codes.items() if code not in (0, None)}, codes


async def _create(core: client.CoreV1Api, manifest: dict[str, Any]) -> None:
    """Create a pod; the webhook refuses one (503) while it has not yet seen the namespace."""
    async def created() -> bool:
        try:
            await core.create_namespaced_pod(NAMESPACE, manifest)
        except ApiException as error:
            if error.status == 503:
                return False
            raise
        return True
    await eventually(created, within=30, every=0.5,
                     what=f"the webhook to admit pod {manifest['metadata']['name']}")


async def _explained(lockgate: Lockgate, pod: str) -> dict[str, Any]:
    """What `lockgate explain` answers of the pod; {} while lockgate does not know it yet (404:
    the watcher has not brought it to queue-store)."""
    async with (aiohttp.ClientSession(headers=lockgate.admin_headers) as session,
                session.get(f"{lockgate.admin_url}/api/v1/explain/{ALIAS}/{NAMESPACE}/{pod}")
                as answer):
        if answer.status == 404:
            return {}
        assert answer.status == 200, await answer.text()
        body: dict[str, Any] = await answer.json()
        return body


async def test_a_release_for_growth_is_explained_and_the_overview_shows_nodes_and_headroom(
        growing: tuple[Lockgate, client.ApiClient]) -> None:
    lockgate, api = growing
    core = client.CoreV1Api(api)
    words = f"released so that {ALIAS} grows (NodePool {POOL}"
    last: dict[str, Any] = {}

    async def explained_as_released_for_growth() -> bool:
        nonlocal last
        last = await _explained(lockgate, "g-0")
        # The leader's words and queue-store's row of the pod are two reads: the row says
        # released a moment after the leader decided (and a release gathered into a node's
        # worth waits up to GROWTH_GATHER_SECONDS first).
        return (words in str(last.get("message"))
                and (last.get("pod") or {}).get("state") in ("released", "ungated"))
    await eventually(explained_as_released_for_growth, within=90, every=0.5,
                     what=lambda: f"explain to say {words!r} of g-0, released (last: {last})")
    assert "waiting for a node" in last["message"] or "NodeClaim" in last["message"], last
    told: list[str] = []

    async def told_on_the_pod() -> bool:
        nonlocal told
        events = (await core.list_namespaced_event(
            NAMESPACE, field_selector="involvedObject.name=g-0")).items
        told = [e.message for e in events if e.reason == "LockgateReleasedForGrowth"]
        return bool(told)
    await eventually(told_on_the_pod, within=30, every=0.5,
                     what="the ungater's LockgateReleasedForGrowth Event on g-0")
    assert len(told) == 1 and told[0].startswith(words), told

    async def all_bound() -> bool:
        pods = (await core.list_namespaced_pod(NAMESPACE)).items
        return len(pods) == PODS and all(p.spec.node_name for p in pods)
    await eventually(all_bound, within=180, every=1.0,
                     what=f"the {PODS} pods to run on a node Karpenter made")
    nodes = [n for n in await list_nodes(api, POOL) if node_ready(n)]
    assert nodes, "Karpenter made no node"
    node_cpu = sum(int(parse_quantity(n.status.allocatable["cpu"]) * 1000) for n in nodes)
    # The pool's limit counts each node at its instance type's 8 cpu: whole nodes left.
    nodes_left = MAX_NODES - len(nodes)
    async with browser() as chromium:
        context = await chromium.new_context(viewport={"width": 1400, "height": 900})
        page = await context.new_page()
        page.set_default_timeout(90_000)
        await page.goto(f"{lockgate.admin_url}/ui/")
        await page.fill("#token", lockgate.admin_token)
        await page.click("#signin-form button[type=submit]")
        row = page.locator(f'[data-table=growth] tr[data-growth="{ALIAS}"]')

        async def shows_the_nodes() -> bool:
            if not await row.count():
                return False
            shown = (await row.locator("[data-nodes]").inner_text()).strip()
            return shown == str(len(nodes))
        await eventually(shows_the_nodes, within=60, every=1.0,
                         what=f"the growth row of {ALIAS} with {len(nodes)} nodes")
        headers = await page.locator("[data-table=growth] th").all_inner_texts()
        assert headers[:4] == ["Cluster", "Nodes", "Capacity",
                               "Headroom (what its NodePools may still add)"], headers
        capacity = await row.locator("[data-capacity]").inner_text()
        assert f"cpu {node_cpu / 1000:g}" in capacity, (capacity, node_cpu)
        headroom = await row.locator(f'[data-pool="{POOL}"]').inner_text()
        plural = "" if nodes_left == 1 else "s"
        assert f"{nodes_left} more node{plural}" in headroom, headroom
        assert f"cpu {NODE_CPU * nodes_left} left" in headroom, headroom
        broken = await row.locator(f'[data-pool="{BROKEN_POOL}"]').inner_text()
        assert "none (" in broken and "not Ready" in broken, broken
        assert (await row.locator("[data-growth-state]").get_attribute(
            "data-growth-state")) == "ok"
        await screenshot(page, "growth-overview")
        await context.close()
