"""The web UI in a real browser (Debian's chromium, driven by Playwright) on a running lockgate.

Every service runs as a process (Lockgate.for_stack) on real Kafka, Postgres and two
kube-apiservers with kwok nodes; preemption is on. The scene is built the way users work, with
the scheduler already running: queue A's Deployment of preemptible pods fills cluster A; queue C
(weight 2) fills cluster B; then queue B (same weight as A) arrives with pods in cluster A, so
A's pods are preempted for it; B also has a job set whose pods fit no node (they wait), and an
ephemeral namespace that is made and deleted again.

The pages are then read as a person reads them, and what they show is checked against what the
test itself reads from the Kubernetes API and Postgres (never against the UI's own numbers):
- overview: every queue with weight, fair target and actual share; the shares chart has lines;
  both clusters with their capacity (the nodes' allocatable, read with the Kubernetes API) and
  what each queue holds; the waiting count follows a new pod with no page reload;
- queue page: waiting pods in release order (positions 1, 2, ...) with their reason, the bound
  namespaces, allowed kinds and limits;
- pod page: the journey of a bound pod (created, queued, released, bound), the explanation of a
  waiting one, and the trace link built from the pod's uid;
- ephemeral namespaces with their transitions; evictions with their reasons;
- a read-only token sees no action, and its own call to cancel (made from the page, as an
  attacker would) is refused; an admin cancels a job set from its page, after a confirmation,
  and its pods are gone from the cluster and cancelled in Postgres.
- The token is never in a URL, and no cookie is set.

Screenshots: test-artifacts/web-ui/*.png (tests/helpers/browser.py), one per page.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.isolation import keep_only_clusters
from devstack.launcher import Lockgate
from devstack.ports import ServicePorts
from helpers.browser import ARTIFACTS, browser, screenshot
from helpers.kube import Namespaces, until_nodes_hold_no_pods
from helpers.pods import a_pod
from helpers.postgres import fresh_database, migrate_database
from helpers.waiting import eventually
from lockgate.labels import (
    JOBSET_LABEL,
    MANAGED_NAMESPACE_LABEL,
    PREEMPTIBLE_LABEL,
    QUEUE_LABEL,
    SCHEDULING_GATE,
)
from lockgate.resources import parse_quantity
from lockgate_adapters.kube import api_client

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

RUN = uuid.uuid4().hex[:6]
ALIAS_A, ALIAS_B = f"uia-{RUN}", f"uib-{RUN}"
CLUSTERS = {ALIAS_A: "cluster-a", ALIAS_B: "cluster-b"}
NAMESPACE = f"e2e-ui-{RUN}"
QA, QB, QC, QD = (f"ui-{q}-{RUN}" for q in "abcd")
DOOMED = "b-doomed"  # B's job set whose pods fit no node: they wait, until cancelled
TRACE_URL = "http://127.0.0.1:16686/trace/{trace_id}"


@dataclass
class Scene:
    lockgate: Lockgate
    core: dict[str, client.CoreV1Api]
    pool: asyncpg.Pool
    capacity_cpu: dict[str, int]  # cluster alias -> millicores of its nodes, from the API
    requested_urls: list[str] = field(default_factory=list)
    # What the browser's console said as an error (a failed request among them).
    console_errors: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.lockgate.admin_url}/ui/"


async def _call(lockgate: Lockgate, method: str, path: str,
                body: dict[str, Any]) -> dict[str, Any]:
    async with (aiohttp.ClientSession(headers=lockgate.admin_headers) as session,
                session.request(method, f"{lockgate.admin_url}{path}", json=body) as response):
        assert response.status in (200, 201, 202), await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


async def _post(lockgate: Lockgate, path: str, body: dict[str, Any]) -> dict[str, Any]:
    return await _call(lockgate, "POST", path, body)


def _builder(name: str, queue: str, jobset: str, cpu: str, **labels: str) -> Any:
    return (a_pod(name).in_queue(queue).in_jobset(jobset).tolerating_kwok_nodes()
            .requesting(cpu=cpu, memory="256Mi").labelled(labels))


def _pod(name: str, queue: str, jobset: str, cpu: str, **labels: str) -> dict[str, Any]:
    manifest: dict[str, Any] = _builder(name, queue, jobset, cpu, **labels).never_restarted(
        ).manifest()
    return manifest


def _deployment(name: str, queue: str, replicas: int, cpu: str) -> dict[str, Any]:
    template = _builder(name, queue, name, cpu, app=name,
                        **{PREEMPTIBLE_LABEL: "true"}).manifest()
    template["metadata"].pop("name")
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": template["metadata"],
                                  "spec": template["spec"]}}}


async def _create(core: client.CoreV1Api, manifest: dict[str, Any]) -> None:
    """Create a pod; the webhook refuses one (503, "retry") while it has not yet seen a
    namespace made a moment ago: retry that, as a client would."""
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


async def _bound(core: client.CoreV1Api, queue: str) -> list[client.V1Pod]:
    pods = await core.list_namespaced_pod(NAMESPACE, label_selector=f"{QUEUE_LABEL}={queue}")
    return [p for p in pods.items if p.spec.node_name and p.metadata.deletion_timestamp is None]


async def _gated(core: client.CoreV1Api, queue: str) -> list[client.V1Pod]:
    pods = await core.list_namespaced_pod(NAMESPACE, label_selector=f"{QUEUE_LABEL}={queue}")
    return [p for p in pods.items if any(g.name == SCHEDULING_GATE
                                         for g in p.spec.scheduling_gates or [])
            and p.metadata.deletion_timestamp is None]


@pytest.fixture(scope="module")
async def scene(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Scene]:
    async with fresh_database(stack.postgres_dsn, prefix=f"lockgate_ui_{RUN}") as dsn:
        await migrate_database(dsn)
        await keep_only_clusters(dsn, list(CLUSTERS))
        apis = {alias: await api_client(stack.kubeconfigs[real])
                for alias, real in CLUSTERS.items()}
        core = {alias: client.CoreV1Api(api) for alias, api in apis.items()}
        await until_nodes_hold_no_pods(apis)  # the scene is sized from the nodes
        capacity = {}
        for alias, api in core.items():
            nodes = (await api.list_node()).items
            capacity[alias] = sum(int(parse_quantity(n.status.allocatable["cpu"]) * 1000)
                                  for n in nodes)
        lockgate = Lockgate.for_stack(
            stack, clusters=CLUSTERS, postgres_dsn=dsn, ports=ServicePorts.free(),
            run_id=f"ui-{RUN}", standby_scheduler=False,
            log_dir=tmp_path_factory.mktemp("service-logs"),
            cert_dir=tmp_path_factory.mktemp("webhook-certs"),
            extra_env={
                "LOCKGATE_SCHEDULER_PREEMPTION_ENABLED": "true",
                "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "1",
                "LOCKGATE_QUEUE_STORE_UI__SAMPLE_SECONDS": "1",
                "LOCKGATE_QUEUE_STORE_UI__TRACE_URL": TRACE_URL,
            })
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        namespaces = Namespaces(apis)
        try:
            await lockgate.start()
            binding = [{"cluster": "*", "names": [NAMESPACE]}]
            for queue, extra in ((QA, {}), (QB, {"resource_limits": {"cpu": "1000"}}),
                                 (QC, {"priority_factor": 0.5})):
                await _post(lockgate, "/api/v1/queues", {"name": queue, "namespaces": binding,
                                                         **extra})
            await lockgate.wait_for_queues({q: {"cordoned": False, "namespaces": binding}
                                            for q in (QA, QB, QC)})
            for alias in CLUSTERS:
                await namespaces.create(alias, NAMESPACE, labels={
                    MANAGED_NAMESPACE_LABEL: "true", **lockgate.run_namespace_labels})
            scene = Scene(lockgate, core, pool, capacity)
            await _build(scene)
            yield scene
        finally:
            codes = await lockgate.stop()
            await namespaces.delete_all()
            for api in apis.values():
                await api.close()
            await pool.close()
    assert not {name: code for name, code in codes.items() if code not in (0, None)}, codes


async def _build(scene: Scene) -> None:
    a, b = scene.core[ALIAS_A], scene.core[ALIAS_B]
    # Sized from the API: every pod takes half a node. A's Deployment of 2 per node fills
    # cluster A, C (weight 2) fills cluster B. Then B (weight 1, as A) arrives in cluster A:
    # A holds half the pool where its fair share is a quarter, so it is preempted for B.
    nodes_a = len((await a.list_node()).items)
    half_node = f"{scene.capacity_cpu[ALIAS_A] // nodes_a // 2}m"
    apps = client.AppsV1Api(a.api_client)
    await apps.create_namespaced_deployment(NAMESPACE, _deployment("a-deploy", QA, 2 * nodes_a,
                                                                   half_node))
    nodes_b = len((await b.list_node()).items)
    half_node_b = f"{scene.capacity_cpu[ALIAS_B] // nodes_b // 2}m"
    for i in range(2 * nodes_b):
        await _create(b, _pod(f"c-{i}", QC, "c-job", half_node_b))

    async def a_fills() -> bool:
        return (len(await _bound(a, QA)) == 2 * nodes_a
                and len(await _bound(b, QC)) == 2 * nodes_b)
    await eventually(a_fills, within=180, every=0.5,
                     what="queue A's Deployment to fill cluster A and C's pods to bind")
    # B arrives: pods that fit once A gives room back (A is preempted for them), and a job set
    # whose pods fit no node at all.
    for i in range(nodes_a):
        await _create(a, _pod(f"b-main-{i}", QB, "b-main", half_node))
    for i in range(3):
        await _create(a, _pod(f"{DOOMED}-{i}", QB, DOOMED, "900"))

    async def preempted() -> bool:
        return bool(await scene.pool.fetchval("SELECT count(*) FROM evictions"))
    await eventually(preempted, within=120, every=0.5,
                     what="the scheduler to preempt some of A's pods for B")
    # An ephemeral namespace, made and deleted: it has transitions to show.
    made = await _post(scene.lockgate, "/api/v1/namespaces",
                       {"queue": QB, "jobset": "b-ephemeral", "cluster": ALIAS_A})
    name = made["namespace"]["name"]
    await _call(scene.lockgate, "DELETE", f"/api/v1/namespaces/{ALIAS_A}/{name}",
                {"reason": "shown by the UI test"})

    async def collected() -> bool:
        state = await scene.pool.fetchval(
            "SELECT state FROM ephemeral_namespaces WHERE cluster = $1 AND name = $2",
            ALIAS_A, name)
        return state == "deleted"
    await eventually(collected, within=120, every=0.5, what=f"namespace {name} collected")


@pytest.fixture
async def signed_in(scene: Scene) -> AsyncIterator[Any]:
    """A page signed in with the admin token, recording every URL it requests."""
    async with browser() as chromium:
        context = await chromium.new_context(viewport={"width": 1400, "height": 900})
        page = await context.new_page()
        page.on("request", lambda request: scene.requested_urls.append(request.url))
        page.on("console", lambda message: scene.console_errors.append(message.text)
                if message.type == "error" else None)
        await sign_in(page, scene, scene.lockgate.admin_token)
        yield page
        assert await context.cookies() == [], "the UI sets no cookie"
        await context.close()


async def sign_in(page: Any, scene: Scene, token: str) -> None:
    # A loaded machine (the whole stack on two cores) can take a while to answer.
    page.set_default_timeout(90_000)
    await page.goto(scene.url)
    await page.fill("#token", token)
    await page.click("#signin-form button[type=submit]")
    await page.locator("#who").wait_for(state="visible")


async def text_of(page: Any, selector: str) -> str:
    found: str = await page.locator(selector).first.inner_text()
    return found


def percent(text: str) -> float:
    match = re.search(r"([0-9.]+)%", text)
    assert match, f"no percentage in {text!r}"
    return float(match.group(1)) / 100


async def test_overview_shows_every_queue_shares_over_time_and_the_clusters(
        scene: Scene, signed_in: Any) -> None:
    page = signed_in
    await page.wait_for_selector(f'[data-table=queues] tr[data-queue="{QA}"]')
    # Weights as set: C has priority factor 0.5, so weight 2.
    row_c = page.locator(f'tr[data-queue="{QC}"]')
    assert (await row_c.locator("td").nth(1).inner_text()).strip() == "2"
    # A's actual share against the test's own model: what its bound pods request, over the
    # pool's cpu (cpu is the dominant resource here: 256Mi per pod is far below its share).
    async def model() -> float:
        cpu = 0
        for pod in await _bound(scene.core[ALIAS_A], QA):
            cpu += int(parse_quantity(pod.spec.containers[0].resources.requests["cpu"]) * 1000)
        return cpu / sum(scene.capacity_cpu.values())

    async def actual_matches() -> bool:
        shown = percent(await page.locator(f'tr[data-queue="{QA}"] [data-actual]').inner_text())
        return abs(shown - await model()) < 0.02
    await eventually(actual_matches, within=30, every=0.5,
                     what="A's actual share on the overview to match its bound pods' cpu")
    # The headline is the fair target against what each queue holds; the fair and adjusted
    # shares are in the detail, and the chart's legend names every queue in its row's colour.
    headers = await page.locator("[data-table=queues] th").all_inner_texts()
    assert headers[:4] == ["Queue", "Weight", "Fair target", "Holds"], headers
    assert await page.locator("[data-table=shares] tr[data-queue-detail]").count() >= 3
    for queue in (QA, QB, QC):
        swatch = await page.locator(f'tr[data-queue="{queue}"] .swatch').evaluate(
            "e => getComputedStyle(e).backgroundColor")
        legend = await page.locator(f'[data-legend-queue="{queue}"] i').evaluate(
            "e => getComputedStyle(e).backgroundColor")
        assert swatch == legend, (queue, swatch, legend)
    # The chart draws each queue's lines once there are samples.
    await page.wait_for_selector(f'polyline[data-series="{QA}:actual"]', timeout=30_000)
    await page.wait_for_selector(f'polyline[data-series="{QB}:target"]', timeout=30_000)
    # Both clusters, with their capacity as the nodes' allocatable says.
    for alias in CLUSTERS:
        capacity = await text_of(page, f'[data-table=clusters] tr[data-cluster="{alias}"] td.num')
        assert float(capacity) == scene.capacity_cpu[alias] / 1000, (alias, capacity)
    held_by_c = await text_of(page, f'[data-table=clusters] tr[data-cluster="{ALIAS_B}"]')
    nodes_b = len((await scene.core[ALIAS_B].list_node()).items)
    assert QC in held_by_c and f"{2 * nodes_b} running/released" in held_by_c
    await screenshot(page, "overview")
    # Live: a new queue and its waiting pod show up with no page reload.
    await page.evaluate("window.__stayed = true")
    binding = [{"cluster": "*", "names": [NAMESPACE]}]
    await _post(scene.lockgate, "/api/v1/queues", {"name": QD, "namespaces": binding})
    await scene.lockgate.wait_for_queues({QD: {"cordoned": False, "namespaces": binding}})
    await _create(scene.core[ALIAS_A], _pod("d-0", QD, "d", "900"))

    async def counted() -> bool:
        cell = page.locator(f'tr[data-queue="{QD}"] [data-waiting]')
        return await cell.count() == 1 and (await cell.inner_text()).strip() == "1"
    await eventually(counted, within=45, every=0.5,
                     what=f"queue {QD} with 1 waiting pod on the open overview")
    assert await page.evaluate("window.__stayed === true"), "the page was reloaded"


async def test_queue_page_lists_waiting_pods_in_order_with_their_reason(
        scene: Scene, signed_in: Any) -> None:
    page = signed_in
    await page.goto(f"{scene.url}#/queues/{QB}")
    await page.wait_for_selector("[data-table=waiting] tr[data-pod]")

    async def all_listed() -> list[str] | None:
        gated = {p.metadata.name for p in await _gated(scene.core[ALIAS_A], QB)}
        rows = page.locator("[data-table=waiting] tr[data-pod]")
        names = [n.split("/")[-1] for n in await rows.evaluate_all(
            "rows => rows.map(r => r.dataset.pod)")]
        return names if set(names) == gated else None
    names = await eventually(all_listed, within=30, every=0.5,
                             what="the waiting table to list B's gated pods")
    positions = [int(p) for p in await page.locator(
        "[data-table=waiting] tr[data-pod] td:first-child").all_inner_texts()]
    assert positions == list(range(1, len(names) + 1))
    # Why each waits is the scheduler leader's, asked for the page: a pod newer than the
    # leader's last round gets its reason with the next round.
    doomed = page.locator(f'tr[data-pod="{ALIAS_A}/{NAMESPACE}/{DOOMED}-0"] [data-reason]')

    async def reasoned() -> str | None:
        reason = await doomed.get_attribute("data-reason")
        return reason or None
    assert await eventually(reasoned, within=60, every=0.5,
                            what=f"a reason for {DOOMED}-0 on the queue page") == "node_fit"
    assert NAMESPACE in await text_of(page, "[data-field=namespaces]")
    assert "pods" in await text_of(page, "[data-field=allowed_kinds]")
    # One line per pod: a short reason; the whole sentence opens below it.
    heights = await page.locator("[data-table=waiting] tr[data-pod]").evaluate_all(
        "rows => rows.map(r => r.getBoundingClientRect().height)")
    line = await page.locator("[data-table=waiting] tr[data-pod] td").first.evaluate(
        "td => parseFloat(getComputedStyle(td).lineHeight)")
    assert all(h < 2 * line + 12 for h in heights), (heights, line)
    summary = doomed.locator("xpath=ancestor::details")
    assert (await doomed.inner_text()).strip() == "fits no node"
    await summary.locator("summary").click()
    assert "fits no node of cluster" in await summary.inner_text()
    assert "cpu 1000" in await text_of(page, "[data-field=limits]")
    assert await page.locator(f'[data-table=jobsets] tr[data-jobset="{DOOMED}"]').count() == 1

    # Its share and fair target in each cluster (the leader's, asked for this queue alone):
    # B's pods run in cluster A only (some bound there by now), so it holds a part of A and
    # is owed one there, and holds nothing of cluster B.
    async def per_cluster() -> dict[str, tuple[float, float]] | None:
        spans = page.locator("[data-field=per-cluster] [data-cluster]")
        found = {}
        for span in await spans.all():
            found[await span.get_attribute("data-cluster")] = (
                float(await span.get_attribute("data-actual") or "nan"),
                float(await span.get_attribute("data-target") or "nan"))
        bound = len(await _bound(scene.core[ALIAS_A], QB))
        return found if bound and ALIAS_A in found and found[ALIAS_A][0] > 0 else None
    shown = await eventually(per_cluster, within=60, every=0.5,
                             what=f"queue {QB}'s share of {ALIAS_A} on its page")
    assert shown[ALIAS_A][1] > 0, shown
    assert shown.get(ALIAS_B, (0.0, 0.0))[0] == 0, shown
    await screenshot(page, "queue")


async def test_pod_page_shows_the_journey_the_explanation_and_the_trace(
        scene: Scene, signed_in: Any) -> None:
    page = signed_in
    bound = (await _bound(scene.core[ALIAS_B], QC))[0]
    await page.goto(f"{scene.url}#/pods/{ALIAS_B}/{NAMESPACE}/{bound.metadata.name}")
    await page.wait_for_selector("[data-journey] [data-step]")
    reached = await page.locator("[data-journey] [data-step][data-reached=true]").evaluate_all(
        "steps => steps.map(s => s.dataset.step)")
    assert reached == ["created", "queued", "released", "bound"]
    assert "not waiting" in await text_of(page, "[data-explain]")
    href = await page.locator("[data-trace] a").get_attribute("href")
    assert href == TRACE_URL.replace("{trace_id}", bound.metadata.uid.replace("-", ""))
    await screenshot(page, "pod")
    await page.goto(f"{scene.url}#/pods/{ALIAS_A}/{NAMESPACE}/{DOOMED}-0")
    await page.wait_for_selector("[data-journey] [data-step]")
    explained = await text_of(page, "[data-explain]")
    assert f'queue "{QB}", position' in explained, explained
    await screenshot(page, "pod-waiting")


async def test_namespaces_and_evictions_pages_show_transitions_and_reasons(
        scene: Scene, signed_in: Any) -> None:
    page = signed_in
    await page.goto(f"{scene.url}#/namespaces")
    row = page.locator("[data-table=namespaces] tr[data-namespace]").first
    await row.wait_for()
    assert "deleted" in await row.inner_text()
    await screenshot(page, "namespaces")
    await row.locator("a").first.click()
    await page.wait_for_selector("[data-table=transitions] tr")
    states = await page.locator("[data-table=transitions] tr[data-transition]").evaluate_all(
        "rows => rows.map(r => r.dataset.transition)")
    assert states[0] == "active" and states[-1] == "deleted", states
    await screenshot(page, "namespace")
    evicted = await scene.pool.fetch("SELECT eviction_id, message FROM evictions")
    await page.goto(f"{scene.url}#/evictions")
    await page.wait_for_selector("[data-table=evictions] tr[data-eviction]")
    shown = await page.locator("[data-table=evictions] tr[data-eviction]").evaluate_all(
        "rows => rows.map(r => r.dataset.eviction)")
    assert {r["eviction_id"] for r in evicted} <= set(shown)
    assert evicted[0]["message"] in await text_of(page, "[data-table=evictions]")
    await screenshot(page, "evictions")


async def test_a_read_only_token_sees_no_action_and_cannot_cancel(scene: Scene) -> None:
    async with browser() as chromium:
        context = await chromium.new_context(viewport={"width": 1400, "height": 900})
        page = await context.new_page()
        page.on("request", lambda request: scene.requested_urls.append(request.url))
        await sign_in(page, scene, scene.lockgate.read_only_token)
        assert "read-only" in await text_of(page, "#who")
        await page.goto(f"{scene.url}#/jobsets/{QB}/{DOOMED}")
        await page.wait_for_selector("[data-table=counts] tr[data-cluster]")
        assert await page.locator("[data-action]").count() == 0
        await screenshot(page, "jobset-read-only")
        # As an attacker holding a read-only token would: call the cancel from the page.
        status = await page.evaluate(
            """async ([queue, jobset]) => (await fetch(
                 `/api/v1/jobsets/${queue}/${jobset}/cancel`, {method: "POST",
                 headers: {Authorization: `Bearer ${sessionStorage.getItem("lockgate.token")}`,
                           "Content-Type": "application/json"}, body: "{}"})).status""",
            [QB, DOOMED])
        assert status == 403
        assert await scene.pool.fetchval(
            "SELECT count(*) FROM jobset_cancellations WHERE jobset = $1", DOOMED) == 0
        assert await context.cookies() == []
        await context.close()


async def test_an_admin_cancels_a_job_set_from_its_page(scene: Scene, signed_in: Any) -> None:
    page = signed_in
    await page.goto(f"{scene.url}#/jobsets/{QB}/{DOOMED}")
    await page.wait_for_selector(f'[data-table=counts] tr[data-cluster="{ALIAS_A}"]')
    headers = await page.locator("[data-table=counts] th").all_inner_texts()
    queued = page.locator(f'[data-table=counts] tr[data-cluster="{ALIAS_A}"] td').nth(
        headers.index("queued"))
    assert (await queued.inner_text()).strip() == "3"  # b-doomed-0..2, all waiting
    # A job set never cancelled is no error: the page asks nothing that answers 404.
    assert scene.console_errors == [], scene.console_errors
    await page.click("[data-action=cancel-jobset]")
    await page.wait_for_selector("#confirm[open]")
    await screenshot(page, "jobset-confirm")
    await page.click("#confirm-no")  # a second thought: nothing happens
    assert await scene.pool.fetchval(
        "SELECT count(*) FROM jobset_cancellations WHERE jobset = $1", DOOMED) == 0
    await page.click("[data-action=cancel-jobset]")
    await page.click("#confirm-yes")

    async def cancelled() -> bool:
        states = {r["state"] for r in await scene.pool.fetch(
            "SELECT state FROM jobs WHERE queue = $1 AND jobset = $2", QB, DOOMED)}
        return states == {"cancelled"}
    await eventually(cancelled, within=60, every=0.5, what=f"job set {DOOMED} cancelled")

    async def pods_gone() -> bool:
        pods = await scene.core[ALIAS_A].list_namespaced_pod(
            NAMESPACE, label_selector=f"{JOBSET_LABEL}={DOOMED}")
        return not [p for p in pods.items if p.metadata.deletion_timestamp is None]
    await eventually(pods_gone, within=60, every=0.5, what=f"the pods of {DOOMED} deleted")
    await page.wait_for_selector("[data-cancelled]", timeout=30_000)
    assert "launcher-admin" in await text_of(page, "[data-cancelled]")
    assert await page.locator("[data-action=cancel-jobset]").count() == 0
    await screenshot(page, "jobset")


def test_the_token_never_went_into_a_url(scene: Scene) -> None:
    assert scene.requested_urls, "the browser tests requested nothing"
    for token in (scene.lockgate.admin_token, scene.lockgate.read_only_token):
        assert not [u for u in scene.requested_urls if token in u]
    saved = {p.name for p in ARTIFACTS.glob("*.png")}
    assert {f"{name}.png" for name in ("overview", "queue", "pod", "namespaces", "namespace",
                                       "evictions", "jobset", "jobset-read-only")} <= saved


async def test_with_the_scheduler_stopped_the_pages_say_there_is_no_leader(
        scene: Scene, signed_in: Any) -> None:
    """The leader dies mid-run: the overview and the queue page say there are no shares and no
    reasons, never the last leader's."""
    scheduler = scene.lockgate.processes["fair-scheduler"]
    await scheduler.kill()
    try:
        page = signed_in
        await page.goto(f"{scene.url}#/")
        source = page.locator("[data-source]")

        async def says_no_leader() -> str | None:
            text = await source.inner_text() if await source.count() else ""
            return text if "no fair-scheduler leader" in text else None
        said = await eventually(says_no_leader, within=30, every=0.5,
                                what="the overview to say no leader answers")
        assert said.startswith("no shares")
        assert all(t.strip() == "\u2013" for t in await page.locator(  # the UI's dash: none
            "[data-table=queues] [data-target]").all_inner_texts())
        await screenshot(page, "overview-no-leader")
        await page.goto(f"{scene.url}#/queues/{QA}")
        await page.wait_for_selector("[data-reasons=unavailable]")
        assert "no reasons" in await text_of(page, "[data-reasons]")
        await screenshot(page, "queue-no-leader")
    finally:
        await scheduler.start()  # for the module's teardown: it stops every service gracefully
        await scheduler.wait_ready()
