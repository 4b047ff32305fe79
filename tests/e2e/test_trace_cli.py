"""`lockgate trace CLUSTER/NAMESPACE/POD` on a real pod's journey, read from a real Jaeger.

Every service of a run of lockgate sends its spans to a Jaeger v2 of this module's own (the
binary `make compose-test` and `make run` build into the cache from the Go module proxy, with
the compose image's loopback configuration, memory storage, on free loopback ports). A pod is
created in the run's managed namespace and released; then the CLI, as installed, prints its
journey. The check is against Jaeger's own answer, read here directly: every span of the pod's
trace is in the waterfall, each service that handled the pod is there, the admission review
(a trace of its own, linked from "pod observed") comes first, and the rows follow time.

The answer Jaeger gave is written beside the test's logs (`jaeger-answer.json`): it is the kind
of recording tests/fixtures/jaeger-pod-trace.json holds for the unit tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devstack.config import Settings
from devstack.images import JAEGER, ensure_go_tool
from devstack.ports import free_port
from devstack.stack import StackInfo
from helpers.network import answers_ok
from helpers.pods import a_pod
from helpers.runs import lockgate_run
from helpers.waiting import eventually

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
LOCKGATE_CLI = Path(sys.executable).parent / "lockgate"
JOURNEY = {"cluster-watcher", "queue-store", "fair-scheduler", "ungater"}


@dataclass
class Jaeger:
    otlp_endpoint: str
    query_url: str
    log: Path


@pytest.fixture(scope="module")
async def jaeger(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Jaeger]:
    # Cached by version; a cold cache builds it here once (minutes), as make compose-test does.
    binary = await asyncio.to_thread(ensure_go_tool, Settings.from_env(), JAEGER,
                                     lambda text: print(text, flush=True))
    ports = {name: free_port() for name in ("JAEGER_QUERY_PORT", "JAEGER_QUERY_GRPC_PORT",
                                            "JAEGER_HEALTH_PORT", "JAEGER_OTLP_HTTP_PORT")}
    log = tmp_path_factory.mktemp("jaeger") / "jaeger.log"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            str(binary), "--config", str(REPO / "deploy/images/jaeger/loopback.yaml"),
            env={**os.environ, **{k: str(v) for k, v in ports.items()}},
            stdout=output, stderr=output, stdin=asyncio.subprocess.DEVNULL)
    store = Jaeger(otlp_endpoint=f"http://127.0.0.1:{ports['JAEGER_OTLP_HTTP_PORT']}",
                   query_url=f"http://127.0.0.1:{ports['JAEGER_QUERY_PORT']}", log=log)

    async def answering() -> bool:
        assert process.returncode is None, f"Jaeger exited: {log.read_text()[-3000:]}"
        return await answers_ok(f"{store.query_url}/api/services")

    try:
        await eventually(answering, within=120, every=0.5,
                         what=lambda: f"Jaeger's query API answering; log {log}")
        yield store
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 20)
            except TimeoutError:
                process.kill()
                await process.wait()


async def jaeger_trace(store: Jaeger, trace_id: str) -> dict[str, Any] | None:
    async with aiohttp.ClientSession() as session, session.get(
            f"{store.query_url}/api/traces/{trace_id}") as response:
        if response.status == 404:
            return None
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


async def lockgate(*argv: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        str(LOCKGATE_CLI), *argv, env={"PATH": "/usr/bin", **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_lockgate_trace_prints_a_released_pods_journey_from_jaeger(
        stack: StackInfo, tmp_path: Path, jaeger: Jaeger) -> None:
    async with lockgate_run(stack, tmp_path, name="trace", standby_scheduler=False,
                            env={"LOCKGATE_OTLP_ENDPOINT": jaeger.otlp_endpoint,
                                 "LOCKGATE_QUEUE_STORE_UI__TRACES_URL": jaeger.query_url}) as run:
        queue = run.name("traced")
        await run.create_queue(queue, namespaces=[run.namespace])
        await run.create_namespace()
        created = await run.create_pod(a_pod("traced").in_queue(queue)
                                       .requesting(cpu="100m", memory="64Mi")
                                       .tolerating_kwok_nodes().manifest())
        name, uid = created.metadata.name, created.metadata.uid
        trace_id = uid.replace("-", "")

        async def bound() -> bool:
            pod = await run.pod(name)
            return pod is not None and bool(pod.spec.node_name)

        await eventually(bound, within=180, every=0.5, what=f"pod {name} released and bound")

        answers: list[dict[str, Any] | None] = []

        async def whole_journey_stored() -> bool:
            answers.append(await jaeger_trace(jaeger, trace_id))
            answer = answers[-1]
            if not answer:
                return False
            services = {p["serviceName"] for t in answer["data"] for p in
                        t["processes"].values()}
            return services >= JOURNEY

        await eventually(whole_journey_stored, within=120, every=1,
                         what=lambda: f"the spans of {sorted(JOURNEY)} for pod {uid} in "
                                      f"Jaeger (its answer: {str(answers[-1])[:2000]})")
        answer = answers[-1]
        assert answer is not None
        (tmp_path / "jaeger-answer.json").write_text(json.dumps(answer, indent=1))
        stored = {(s["spanID"], s["operationName"]) for s in answer["data"][0]["spans"]}

        env = {"LOCKGATE_API": run.lockgate.admin_url, "LOCKGATE_TOKEN": run.lockgate.admin_token,
               "LOCKGATE_TRACES_URL": jaeger.query_url}
        pod_ref = f"{run.alias()}/{run.namespace}/{name}"
        code, out, err = await lockgate("trace", pod_ref, "-o", "json", env=env)
        assert code == 0, err
        shown = json.loads(out)
        assert shown["trace_id"] == trace_id
        own = [s for s in shown["spans"] if not s["linked"]]
        # Every span Jaeger holds for the pod (more may have arrived since: the pod lives on).
        assert stored <= {(s["span_id"], s["name"]) for s in own}, (stored, own)
        assert {s["service"] for s in own} >= JOURNEY
        names = [s["name"] for s in own]
        for step in ("pod observed", "release decided", "ungate"):
            assert step in names, names
        assert names.index("release decided") < names.index("ungate"), names
        linked = [s for s in shown["spans"] if s["linked"]]
        assert linked and linked[0]["service"] == "admission-webhook", shown["spans"][:3]
        assert shown["spans"][0]["name"] == "admission review", "the journey starts there"
        roots = [s["offset_us"] for s in shown["spans"] if s["depth"] == 0]
        assert roots == sorted(roots), "rows follow time"

        # The web UI's pod page draws the same rows, from queue-store's route to the same store.
        async with aiohttp.ClientSession() as session, session.get(
                f"{run.lockgate.admin_url}/api/v1/pods/{pod_ref}/trace",
                headers={"Authorization": f"Bearer {run.lockgate.admin_token}"}) as response:
            assert response.status == 200, await response.text()
            drawn = await response.json()
        assert drawn["trace_id"] == trace_id and drawn["store"], drawn
        assert stored <= {(s["span_id"], s["name"]) for s in drawn["spans"] if not s["linked"]}
        # Spans may have arrived between the two reads; none the CLI showed may be missing.
        assert {s["span_id"] for s in drawn["spans"]} >= {s["span_id"] for s in shown["spans"]}, (
            "the UI's waterfall lacks rows `lockgate trace` shows", drawn["spans"], shown["spans"])
        assert drawn["spans"][0]["name"] == "admission review", drawn["spans"][:3]

        code, text, err = await lockgate("trace", pod_ref, "--width", "120", env=env)
        assert code == 0, err
        lines = text.splitlines()
        assert lines[0].startswith(f"Trace {trace_id} of pod {pod_ref}: ")
        assert lines[1].split()[:4] == ["SERVICE", "SPAN", "START", "DURATION"]
        assert all(len(line) <= 120 for line in lines[1:-1]), lines
        assert any("~admission review" in line for line in lines), lines
        assert all("|" in line for line in lines[2:-1]), lines

        # With no trace store named, it says how to name one; with a typo'd cluster, which exist.
        code, _, err = await lockgate("trace", pod_ref, env={
            k: v for k, v in env.items() if k != "LOCKGATE_TRACES_URL"})
        assert code == 1 and "no trace store is configured" in err, err
