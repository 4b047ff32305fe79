"""The newcomer's path through the web UI (issue 38), in a real browser, on every service running
as `make run` starts them, with a real Jaeger for the traces.

A team lead's queue holds 3,000 waiting pods of a Deployment, arriving while the scheduler runs;
one pod of theirs was released and runs; and one pod of a JupyterHub-like namespace, bound to
the queue but not served by the run's webhook, skipped the queue. The test walks the pages as a
newcomer does and checks what they see against what it reads itself from the Kubernetes API:
- the overview warns that a pod skipped the queue, and names the queue;
- the queue page lists the waiting pods one line each, 50 to a page, and the page stays under
  2,000 pixels tall;
- the released pod's page draws its trace with a bar for its wait in line;
- the skipped pod's page says it skipped the queue.
Screenshots go to test-artifacts/web-ui/newcomer-*.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.stack import StackInfo
from e2e.test_trace_cli import Jaeger, jaeger  # noqa: F401 - the fixture, shared
from helpers.browser import browser, screenshot
from helpers.pods import a_deployment, a_pod
from helpers.runs import lockgate_run
from helpers.waiting import eventually
from lockgate.labels import MANAGED_NAMESPACE_LABEL, QUEUE_LABEL

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

WAITING = 3_000


async def test_a_newcomer_reads_the_overview_a_queue_of_3000_a_pods_trace_and_a_skipped_pod(
        stack: StackInfo, tmp_path: Path, jaeger: Jaeger) -> None:  # noqa: F811
    async with lockgate_run(stack, tmp_path, name="newcomer", standby_scheduler=False,
                            env={"LOCKGATE_OTLP_ENDPOINT": jaeger.otlp_endpoint,
                                 "LOCKGATE_QUEUE_STORE_UI__TRACES_URL": jaeger.query_url,
                                 "LOCKGATE_QUEUE_STORE_UI__SAMPLE_SECONDS": "1"}) as run:
        queue = run.name("team")
        jhub = await run.create_namespace(name=run.name("jhub"), managed=False, labels={
            MANAGED_NAMESPACE_LABEL: "true", QUEUE_LABEL: queue})
        await run.create_queues([queue], namespaces=[run.namespace, jhub])
        await run.create_namespace()
        # One pod that fits: released and bound while the scheduler runs.
        released = await run.create_pod(a_pod("first").in_queue(queue)
                                        .requesting(cpu="100m", memory="64Mi")
                                        .tolerating_kwok_nodes().manifest())
        # 3,000 that fit no node (a node has 16 cpu): they wait, in line behind nothing.
        await run.apps().create_namespaced_deployment(run.namespace, a_deployment("crowd")
                                                      .labelled({QUEUE_LABEL: queue})
                                                      .with_replicas(WAITING)
                                                      .of(a_pod("crowd").in_queue(queue)
                                                          .requesting(cpu="20", memory="64Mi")
                                                          .tolerating_kwok_nodes())
                                                      .manifest())
        # Not served by the run's webhook: it runs at once, skipping the queue.
        skipped = await run.create_pod(a_pod("jupyter").tolerating_kwok_nodes().manifest(),
                                       namespace=jhub)

        async def bound() -> bool:
            pod = await run.pod(released.metadata.name)
            return pod is not None and bool(pod.spec.node_name)
        await eventually(bound, within=180, every=0.5, what="the first pod released and bound")

        async with browser() as chromium:
            context = await chromium.new_context(viewport={"width": 1400, "height": 900})
            page = await context.new_page()
            page.set_default_timeout(90_000)
            await page.goto(f"{run.lockgate.admin_url}/ui/")
            await page.fill("#token", run.lockgate.admin_token)
            await page.click("#signin-form button[type=submit]")
            await page.locator("#who").wait_for(state="visible")

            # The overview: the pod that skipped the queue is the first thing said.
            warning = page.locator("[data-warning=skipped-gate]")

            async def warned() -> str | None:
                text = await warning.inner_text() if await warning.count() else ""
                return text if queue in text else None
            said = await eventually(warned, within=120, every=1,
                                    what="the overview's warning of a pod that skipped the queue")
            assert "1 pod" in said
            await screenshot(page, "newcomer-overview")

            # The queue page: the crowd, one line each, the page under 2,000 px.
            await page.goto(f"{run.lockgate.admin_url}/ui/#/queues/{queue}")
            rows = page.locator("[data-table=waiting] tr[data-pod]")

            async def all_waiting() -> int | None:
                line = page.locator("[data-reasons]")
                text = await line.inner_text() if await line.count() else ""
                count = int(text.split()[0]) if text[:1].isdigit() else 0
                return count if count >= WAITING and await rows.count() == 50 else None
            await eventually(all_waiting, within=300, every=2,
                             what=f"{WAITING} waiting pods listed, 50 to a page")
            await page.locator("[data-table=waiting] [data-reason]").first.wait_for()

            async def reasons_in() -> bool:
                texts = await page.locator("[data-table=waiting] [data-reason]").all_inner_texts()
                return bool(texts) and all(t.strip() == "fits no node" for t in texts)
            await eventually(reasons_in, within=60, every=1, what="a short reason on every row")
            await screenshot(page, "newcomer-queue")
            heights = await rows.evaluate_all(
                "rows => rows.map(r => r.getBoundingClientRect().height)")
            line = await rows.first.locator("td").first.evaluate(
                "td => parseFloat(getComputedStyle(td).lineHeight)")
            assert all(h < 2 * line + 12 for h in heights), (heights, line)
            height = await page.evaluate("document.documentElement.scrollHeight")
            assert height < 2000, height

            # The released pod's trace, with its wait in line as a bar of its own.
            await page.goto(f"{run.lockgate.admin_url}/ui/#/pods/{run.alias()}/"
                            f"{run.namespace}/{released.metadata.name}")
            wait_bar = page.locator("[data-waterfall] tr[data-wait] rect")

            async def wait_drawn() -> float | None:
                if not await wait_bar.count():
                    await page.reload()
                    return None
                width = float(await wait_bar.first.get_attribute("width") or 0)
                return width if width > 2 else None  # of 1,000: more than a hairline
            await eventually(wait_drawn, within=120, every=2,
                             what="the trace's bar for the wait in line")
            await screenshot(page, "newcomer-pod-trace")

            # The pod that skipped the queue says so on its page.
            await page.goto(f"{run.lockgate.admin_url}/ui/#/pods/{run.alias()}/{jhub}/"
                            f"{skipped.metadata.name}")
            await page.wait_for_selector("[data-warning=skipped-gate]")
            assert "skipped the queue" in await page.locator(
                "[data-warning=skipped-gate]").inner_text()
            await screenshot(page, "newcomer-skipped-pod")
            await context.close()
        await run.apps().delete_namespaced_deployment("crowd", run.namespace)
