"""The web UI's overview is the queue tree (issue 36, item 5), in a real browser.

Every lockgate service runs as a process on the real stack (Kafka, Postgres, a kube-apiserver
with kwok nodes, kube-controller-manager for Deployments, kube-scheduler). The scene is built
the way an administrator would:

1. two flat queues (children of the root): the overview looks as it always did, with no tree;
2. then the issue's organisation: research (weight 3: vision with alice and bob, nlp with carol)
   beside production (weight 2, guarantee 32 cpu); alice, bob and carol get Deployments of 1-cpu
   pods. The overview shows the tree root -> inner nodes -> leaves with weight, guarantee, fair
   target and actual share at every level; what vision holds is checked against the pods the
   apiserver shows bound (never the UI's or the scheduler's own numbers); picking vision charts
   its children over time; collapsing research hides its subtree;
3. then 1,000 leaves (ten teams of a hundred under one department): the tree opens collapsed,
   with counts, and the page stays short enough to read.

Screenshots: test-artifacts/web-ui/overview-flat.png, overview-tree.png, overview-tree-vision.png,
overview-tree-1000.png.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devstack.demo_weights import schedulable_capacity
from devstack.stack import StackInfo
from helpers.browser import browser, screenshot
from helpers.pods import a_deployment, a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.labels import QUEUE_LABEL
from lockgate.resources import canonical_amount

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

CLUSTER = os.environ.get("LOCKGATE_E2E_TREE_UI_CLUSTER", "cluster-b")
PODS = {"alice": 6, "bob": 4, "carol": 3}  # 1-cpu pods: together far less than the cluster
TEAMS, PER_TEAM = 10, 100  # the big tree: 1,000 leaves


async def arrive(run: LockgateRun, queue: str, namespace: str, replicas: int) -> None:
    pod = a_pod(queue).in_queue(queue).requesting(cpu="1", memory="64Mi")
    manifest = a_deployment(queue).with_replicas(replicas).of(pod).manifest()
    await run.apps(run.alias(CLUSTER)).create_namespaced_deployment(namespace, manifest)


async def bound_pods(run: LockgateRun, queue: str, namespace: str) -> int:
    pods = (await run.core(run.alias(CLUSTER)).list_namespaced_pod(namespace)).items
    return sum(1 for p in pods if p.spec.node_name and p.metadata.deletion_timestamp is None
               and p.status.phase in ("Pending", "Running")
               and p.metadata.labels.get(QUEUE_LABEL) == queue)


def percent(text: str) -> float:
    match = re.search(r"([0-9.]+)%", text)
    assert match, f"no percentage in {text!r}"
    return float(match.group(1)) / 100


async def sign_in(page: Any, run: LockgateRun) -> None:
    page.set_default_timeout(90_000)
    await page.goto(f"{run.lockgate.admin_url}/ui/")
    await page.fill("#token", run.lockgate.read_only_token)
    await page.click("#signin-form button[type=submit]")
    await page.locator("#who").wait_for(state="visible")


async def create_quietly(run: LockgateRun, queues: list[dict[str, Any]]) -> None:
    """Many queues through the admin API, without waiting for each to reach the clusters'
    Queue copies (`create_queues` waits; a thousand bind no namespace and hold no pod)."""
    async with aiohttp.ClientSession(headers=run.lockgate.admin_headers) as session:
        for queue in queues:
            async with session.post(f"{run.lockgate.admin_url}/api/v1/queues",
                                    json={"namespaces": [], **queue}) as reply:
                assert reply.status in (200, 201), f"{queue['name']}: {await reply.text()}"


async def test_the_overview_is_the_queue_tree(stack: StackInfo, tmp_path: Path) -> None:
    async with lockgate_run(stack, tmp_path, name="qtreeui", clusters=(CLUSTER,), env={
            "LOCKGATE_QUEUE_STORE_UI__SAMPLE_SECONDS": "1",
            # A write does not wait for the clusters' Queue copies: a thousand queues created
            # one by one would wait a copy pass each (create_queues waits where pods need it).
            "LOCKGATE_QUEUE_STORE_QUEUE_SYNC_SETTLE_SECONDS": "0"}) as run, browser() as chromium:
        name = run.name
        context = await chromium.new_context(viewport={"width": 1400, "height": 900})
        page = await context.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

        # 1. Flat: two queues under the root. No tree card; the queue table as ever.
        flat = [name("ops"), name("web")]
        await run.create_queues(flat, binding=[])
        await sign_in(page, run)
        for queue in flat:
            await page.locator(f'tr[data-queue="{queue}"]').wait_for()
        assert await page.locator('[data-card="tree"]').count() == 0, (
            "a flat installation shows no tree")
        assert (await page.locator("[data-region=queues] h2").inner_text()) == "Queues"
        await screenshot(page, "overview-flat")

        # 2. The organisation.
        await run.create_queues({
            name("research"): {"priority_factor": 1 / 3},
            name("vision"): {"parent": name("research")},
            name("nlp"): {"parent": name("research")}}, binding=[])
        leaves = {"alice": name("vision"), "bob": name("vision"), "carol": name("nlp")}
        namespaces = {leaf: name(f"ns-{leaf}") for leaf in leaves}
        for leaf, parent in leaves.items():
            await run.create_queue(name(leaf), namespaces=[namespaces[leaf]], parent=parent)
            await run.create_namespace(run.alias(CLUSTER), name=namespaces[leaf])
        await run.create_queue(name("production"), priority_factor=0.5,
                               guarantee={"cpu": "32"}, binding=[])
        for leaf, replicas in PODS.items():
            await arrive(run, name(leaf), namespaces[leaf], replicas)

        tree = page.locator('[data-card="tree"]')
        await tree.wait_for()
        # root -> research -> vision -> alice: each a row, indented by its depth.
        for node, depth in (("research", 0), ("vision", 1), ("nlp", 1), ("alice", 2),
                            ("bob", 2), ("carol", 2), ("production", 0)):
            row = tree.locator(f'tr[data-node="{name(node)}"]')
            await row.wait_for()
            assert await row.get_attribute("data-depth") == str(depth), node
        assert await tree.locator('tr[data-node=""]').count() == 1, "the root's row"
        production = tree.locator(f'tr[data-node="{name("production")}"]')
        assert "cpu 32" in await production.locator("[data-guarantee]").inner_text()
        research = tree.locator(f'tr[data-node="{name("research")}"]')
        # weight 3 of the root's 3 + 2 (production) + 1 + 1 (the flat queues): 42.9%.
        assert "(42.9%)" in await research.locator("td").nth(1).inner_text()

        # What vision holds is what the apiserver shows its leaves' pods hold.
        cpu_pods = sum(c.capacity.get("cpu", 0.0) for c in await schedulable_capacity(
            {run.alias(CLUSTER): run.apis[run.alias(CLUSTER)]})) / canonical_amount("cpu", "1")
        vision = tree.locator(f'tr[data-node="{name("vision")}"]')

        async def vision_holds() -> float | None:
            bound = sum([await bound_pods(run, name(leaf), namespaces[leaf])
                         for leaf in ("alice", "bob")])
            if bound < PODS["alice"] + PODS["bob"]:
                return None
            shown = percent(await vision.locator("[data-actual]").inner_text())
            # Nothing holds vision back: once the leader's round has seen all its pods, its
            # fair target covers what it asks (a round before may show less).
            target = percent(await vision.locator("[data-target]").inner_text())
            return shown if abs(shown - bound / cpu_pods) <= 0.0015 and (
                target >= bound / cpu_pods - 0.0015) else None
        await eventually(vision_holds, within=180, every=1.0,
                         what="vision's row to show what alice's and bob's bound pods hold, "
                              "and a fair target that covers it")
        await screenshot(page, "overview-tree")

        # Pick vision: the chart shows its children over time, and the queue table its leaves.
        await vision.locator("button[data-pick]").click()
        await page.locator('[data-chart-of="' + name("vision") + '"]').wait_for()

        async def charted() -> bool:
            series = await page.locator("svg.chart polyline").evaluate_all(
                "lines => lines.map(l => l.dataset.series)")
            return {f"{name('alice')}:actual", f"{name('bob')}:actual"} <= set(series) and not any(
                s.startswith(name("carol")) for s in series)
        await eventually(charted, within=60, every=1.0,
                         what="the chart of vision's children, alice and bob, over time")
        listed = await page.locator("tr[data-queue]").evaluate_all(
            "rows => rows.map(r => r.dataset.queue)")
        assert sorted(listed) == sorted([name("alice"), name("bob")]), listed
        await screenshot(page, "overview-tree-vision")

        # Collapse research: its subtree's rows go, its leaf count stays.
        await research.locator("button[data-toggle]").click()
        await eventually(lambda: _gone(tree, name("alice")), within=10, every=0.2,
                         what="alice's row hidden under the collapsed research")
        assert await research.locator("[data-leaves]").get_attribute("data-leaves") == "3"

        # Back to the root: its children's chart draws research at what its leaves hold (its
        # line above production's, which holds nothing), not at the nothing an inner node
        # holds of its own.
        await tree.locator('button[data-pick=""]').click()
        await page.locator('[data-chart-of=""]').wait_for()

        async def research_above_production() -> bool:
            last_y = await page.locator("svg.chart polyline").evaluate_all(
                """lines => Object.fromEntries(lines.map(l => [l.dataset.series,
                     +l.getAttribute("points").trim().split(" ").pop().split(",")[1]]))""")
            research_y = last_y.get(f"{name('research')}:actual")
            production_y = last_y.get(f"{name('production')}:actual")
            return (research_y is not None and production_y is not None
                    and research_y < production_y)
        await eventually(research_above_production, within=30, every=1.0,
                         what="the root's chart to draw research above production")

        # 3. A thousand leaves: ten teams of a hundred under one department.
        department = name("dept")
        await create_quietly(run, [{"name": department}])
        await create_quietly(run, [{"name": name(f"team{t}"), "parent": department}
                                   for t in range(TEAMS)])
        await create_quietly(run, [{"name": name(f"u{t}-{u}"), "parent": name(f"team{t}")}
                                   for t in range(TEAMS) for u in range(PER_TEAM)])
        dept_row = tree.locator(f'tr[data-node="{department}"]')
        await eventually(lambda: _leaves(dept_row, TEAMS * PER_TEAM), within=120, every=1.0,
                         what="the department's row counting its 1,000 leaves")
        assert await tree.locator(f'tr[data-node="{name("team0")}"]').count() == 0, (
            "a large tree opens collapsed")
        rows = await tree.locator("tr[data-node]").count()
        assert rows <= 12, f"collapsed, the tree is a dozen rows, not {rows}"
        await dept_row.locator("button[data-toggle]").click()
        team0 = tree.locator(f'tr[data-node="{name("team0")}"]')
        await team0.wait_for()
        assert await team0.locator("[data-leaves]").get_attribute("data-leaves") == "100"
        assert await tree.locator(f'tr[data-node="{name("u0-0")}"]').count() == 0
        assert await page.locator("[data-leaves-shown]").count() == 1, (
            "the queue table says it lists some of the leaves")
        listed = await page.locator("tr[data-queue]").evaluate_all(
            "rows => rows.map(r => r.dataset.queue)")
        assert len(listed) <= 30, f"a page a person reads, not {len(listed)} rows"
        assert listed[:3] == [name("alice"), name("bob"), name("carol")], (
            "the leaves holding most come first (alice 6 pods, bob 4, carol 3)", listed[:5])
        await screenshot(page, "overview-tree-1000")
        assert not [e for e in errors if "favicon" not in e], errors
        await context.close()


async def _gone(tree: Any, node: str) -> bool:
    return await tree.locator(f'tr[data-node="{node}"]').count() == 0


async def _leaves(row: Any, count: int) -> bool:
    if await row.count() == 0:
        return False
    return await row.locator("[data-leaves]").get_attribute("data-leaves") == str(count)

