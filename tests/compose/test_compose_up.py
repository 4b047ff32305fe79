"""`docker compose up` end to end: docker-compose.yml + docker-compose.local.yml, the way a user
runs lockgate, against the local stack's two control planes (`make compose-test`).

What it checks, as a user would see it:
- a Docker engine is there (the one running, or a dockerd of the test's own), the images are
  built or found cached, and `docker compose up` (v2, or Debian's v1) brings every service to
  healthy (each lockgate service's healthcheck is its /readyz);
- the webhook image runs as a kubelet would run it (service-link variables, a ServiceAccount
  token and CA mounted, KUBERNETES_SERVICE_HOST at the local apiserver), registered by the
  static configuration through its Service (devstack.incluster), and gates the pods it admits;
- queues made through the admin API (with a token) release those pods fairly: weights 1:2, more
  demand than the clusters hold, so the heavier queue gets twice the pods. Other runs use the
  same clusters, so the free capacity is whatever they leave: fairness is judged between this
  run's two queues, and the fair-scheduler container starts only once every pod is queued in
  Postgres (releasing while pods trickle in would hand the pool out first come first served);
- a released pod's trace (trace id = its uid) is in Jaeger, through Jaeger's HTTP API;
- everything is gone afterwards: containers, networks, volumes, the dockerd it started, its nft
  tables, docker0.

Isolation on the shared stack: Kafka, Postgres and Jaeger are the compose project's own; Queue
objects of a source of the run's own; a webhook registration that serves only the run's
namespace; unique queue names; free ports.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from kubernetes_asyncio import client

from devstack.compose import LOCKGATE_SERVICES, ComposeProject, compose_project
from devstack.compose_up import compose_env, kube_dir_for, webhook_for
from devstack.config import Settings
from devstack.docker import (
    BRIDGE,
    RUN_DIR,
    DockerEngine,
    docker_engine,
    link_exists,
    mounts_under,
    nft_tables,
)
from devstack.images import REPO, Images
from devstack.incluster import InClusterWebhook
from devstack.launcher import RUN_LABEL
from devstack.manifests import delete_queue_copies, ensure_queue_crd
from devstack.ports import COMPOSE_PORTS, free_port
from devstack.procs import pid_alive
from helpers.kube import Namespaces, gates_of
from helpers.pods import a_pod
from helpers.waiting import eventually
from lockgate.labels import ADMISSION_TRACE_ANNOTATION, MANAGED_NAMESPACE_LABEL, SCHEDULING_GATE
from lockgate.resources import Resources
from lockgate_adapters.admin_tokens import new_token
from lockgate_adapters.kube import api_client

pytestmark = [pytest.mark.stack, pytest.mark.timeout(2400)]

RUN = uuid.uuid4().hex[:6]
PROJECT = f"lgc{RUN}"
NAMESPACE = f"lgc-{RUN}"
LIGHT, HEAVY = f"light-{RUN}", f"heavy-{RUN}"
PRIORITY_FACTORS = {LIGHT: 1.0, HEAVY: 0.5}  # weights 1:2
WEIGHTS = {queue: 1 / factor for queue, factor in PRIORITY_FACTORS.items()}
POD_CPU = "4"
SCHEDULER = "fair-scheduler"
TIMINGS = Path(Settings.from_env().cache_logs_dir) / "compose-test-timings.json"


def _say(msg: str) -> None:
    print(f"[compose-test] {msg}", flush=True)


@dataclass
class Deployment:
    engine: DockerEngine
    compose: ComposeProject
    apis: dict[str, client.ApiClient]
    webhooks: dict[str, InClusterWebhook]
    env: dict[str, str]
    admin_token: str
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.env['LOCKGATE_COMPOSE_ADMIN_PORT']}"

    @property
    def jaeger_url(self) -> str:
        return f"http://127.0.0.1:{self.env['LOCKGATE_COMPOSE_JAEGER_QUERY_PORT']}"

    @property
    def postgres_dsn(self) -> str:
        return ("postgresql://lockgate:lockgate@127.0.0.1:"
                f"{self.env['LOCKGATE_COMPOSE_POSTGRES_PORT']}/lockgate")


SERVICES = ("postgres", "kafka", "jaeger", *LOCKGATE_SERVICES)


def run_env(kube_dir: Path, images: dict[str, str], admin_token: str) -> dict[str, str]:
    """The compose variables of a person's `make compose-up`, on free ports and under this
    run's own queue source."""
    ports = {name: free_port() for name in COMPOSE_PORTS}
    return compose_env(kube_dir=kube_dir, images=images, admin_token=admin_token, ports=ports,
                       project=PROJECT, queue_source=PROJECT)


def _record(timings: dict[str, float], name: str, started: float) -> None:
    timings[name] = round(time.monotonic() - started, 1)
    _say(f"{name}: {timings[name]} s")


@pytest.fixture(scope="module")
async def deployment(stack: Any, tmp_path_factory: pytest.TempPathFactory
                     ) -> AsyncIterator[Deployment]:
    settings = Settings.from_env()
    tables_before, bridge_before = nft_tables(), link_exists(BRIDGE)
    timings: dict[str, float] = {}
    work = tmp_path_factory.mktemp("compose")
    work.chmod(0o755)
    admin_token = new_token()
    started_all = time.monotonic()
    with docker_engine(settings, _say) as engine:
        started = time.monotonic()
        images = Images(engine, _say).all()
        _record(timings, "images", started)
        env = run_env(kube_dir_for(stack, work / "kube"), images, admin_token)
        apis = {cluster: await api_client(path) for cluster, path in stack.kubeconfigs.items()}
        webhooks: dict[str, InClusterWebhook] = {}
        namespaces = Namespaces(apis)
        try:
            with compose_project(engine, PROJECT, env, _say) as compose:
                started = time.monotonic()
                # All but the fair scheduler, which the fairness test starts once pods queue.
                compose.up(*(s for s in SERVICES if s != SCHEDULER), timeout=420)
                _record(timings, "compose up", started)
                started = time.monotonic()
                for cluster, api in apis.items():
                    await ensure_queue_crd(api)
                    webhook = webhook_for(
                        engine=engine, info=stack, cluster=cluster, api=api,
                        image=images["lockgate"], work_dir=work / f"webhook-{cluster}",
                        ports=(free_port(), free_port()),
                        otlp_endpoint=f"http://127.0.0.1:{env['LOCKGATE_COMPOSE_OTLP_PORT']}",
                        run_id=PROJECT, project=PROJECT, queue_source=PROJECT)
                    webhooks[cluster] = webhook
                    await webhook.start()
                    await webhook.register()
                _record(timings, "in-cluster webhooks up", started)
                for cluster in apis:
                    await namespaces.create(cluster, NAMESPACE, labels={
                        MANAGED_NAMESPACE_LABEL: "true", RUN_LABEL: PROJECT})
                try:
                    yield Deployment(engine, compose, apis, webhooks, env, admin_token, timings)
                except BaseException:
                    _say(compose.logs(tail=80))
                    raise
                finally:
                    for webhook in webhooks.values():
                        await webhook.stop()
                    await namespaces.delete_all()
                    for api in apis.values():
                        await delete_queue_copies(api, source=PROJECT)
                started = time.monotonic()
            leftovers = compose.leftovers()
            _record(timings, "compose down", started)
        finally:
            for api in apis.values():
                await api.close()
        assert not leftovers, f"compose down left {leftovers}"
        dockerd_pid = engine.pid
    _record(timings, "compose-test total", started_all)
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps(timings, indent=2) + "\n")
    # Nothing behind: the dockerd it started, its nft tables, docker0.
    assert dockerd_pid is None or not pid_alive(dockerd_pid), "the dockerd it started runs on"
    assert dockerd_pid is None or not mounts_under(RUN_DIR), f"mounts left: {mounts_under(RUN_DIR)}"
    assert nft_tables() <= tables_before, f"nft tables left: {nft_tables() - tables_before}"
    assert link_exists(BRIDGE) == bridge_before


async def test_the_containerised_webhook_gates_pods_and_queues_release_them_fairly(
        deployment: Deployment) -> None:
    # Started only once the backlog is complete (below), whichever test ran first.
    deployment.compose.run("stop", SCHEDULER)
    binding = [{"cluster": "*", "names": [NAMESPACE]}]
    async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {deployment.admin_token}"}) as session:
        for queue, factor in PRIORITY_FACTORS.items():
            async with session.post(f"{deployment.admin_url}/api/v1/queues", json={
                    "name": queue, "priority_factor": factor,
                    "namespaces": binding}) as response:
                assert response.status in (200, 201), await response.text()

    async def webhooks_know_the_queues() -> bool:
        async with aiohttp.ClientSession() as session:
            for webhook in deployment.webhooks.values():
                async with session.get(
                        f"http://127.0.0.1:{webhook.health_port}/api/v1/queues") as response:
                    known = (await response.json()).get("local") or {}
                if not all(queue in known for queue in PRIORITY_FACTORS):
                    return False
        return True

    await eventually(webhooks_know_the_queues, within=60,
                     what="the in-cluster webhooks' copy of the queues")

    # Each queue alone asks for more than its share of both clusters, empty.
    capacity = await pool_capacity_in_pods(deployment.apis)
    per_queue_and_cluster = capacity // 3 + 2
    for cluster, api in deployment.apis.items():
        core = client.CoreV1Api(api)
        for i in range(per_queue_and_cluster):
            for queue in PRIORITY_FACTORS:
                manifest = (a_pod(f"{queue}-{i}").in_queue(queue).never_restarted()
                            .requesting(cpu=POD_CPU, memory="1Gi").manifest())
                pod = await core.create_namespaced_pod(NAMESPACE, manifest)
                # Admitted by the container through the static registration: gated, traced.
                assert SCHEDULING_GATE in gates_of(pod), f"{cluster}: {pod.spec}"
                assert ADMISSION_TRACE_ANNOTATION in (pod.metadata.annotations or {})
    created = per_queue_and_cluster * len(deployment.apis) * len(PRIORITY_FACTORS)
    await wait_for_queued(deployment, created)
    started = time.monotonic()
    deployment.compose.up(SCHEDULER, timeout=180)
    _record(deployment.timings, "fair-scheduler up", started)

    released = await wait_until_settled(deployment, quiet_seconds=6, within=240)
    _say(f"released per queue: {released} (of {created} pods; capacity ~{capacity} pods)")
    gated = await gated_counts(deployment.apis)
    assert all(gated.get(queue, 0) > 0 for queue in PRIORITY_FACTORS), (
        f"not every queue still waits, so the pool is not contended: {gated}")
    total = sum(released.values())
    assert total >= len(PRIORITY_FACTORS), f"too little was released to judge: {released}"
    # Weighted fair share between this run's queues: within one pod of it each.
    for queue, weight in WEIGHTS.items():
        fair = total * weight / sum(WEIGHTS.values())
        assert abs(released.get(queue, 0) - fair) <= 1, (queue, released, fair)

    cluster, name, uid = await first_released(deployment.apis)

    async def trace_of_pod() -> dict[str, Any] | None:
        async with aiohttp.ClientSession() as session, session.get(
                f"{deployment.jaeger_url}/api/traces/{uid.replace('-', '')}") as response:
            if response.status != 200:
                return None
            data = (await response.json()).get("data") or []
        services = {p["serviceName"] for t in data for p in t["processes"].values()}
        return data[0] if {"fair-scheduler", "ungater"} <= services else None

    trace = await eventually(trace_of_pod, within=90, every=2,
                             what=f"the trace of pod {uid} in Jaeger")
    names = {span["operationName"] for span in trace["spans"]}
    assert "release decided" in names, names
    # The web UI's pod page draws the same trace, through queue-store, from compose's Jaeger.
    async with aiohttp.ClientSession() as session, session.get(
            f"{deployment.admin_url}/api/v1/pods/{cluster}/{NAMESPACE}/{name}/trace",
            headers={"Authorization": f"Bearer {deployment.admin_token}"}) as response:
        assert response.status == 200, await response.text()
        drawn = await response.json()
    assert {s["span_id"] for s in drawn["spans"]} >= {s["spanID"] for s in trace["spans"]}, (
        "the UI's waterfall lacks spans Jaeger holds", drawn)


async def test_the_users_compose_files_are_valid(deployment: Deployment) -> None:
    # What a plain `docker compose up` reads (docker-compose.yml + docker-compose.override.yml),
    # checked by the same compose as the rest of the test.
    done = await asyncio.to_thread(
        subprocess.run,
        [*deployment.compose.argv_base, "-f", str(REPO / "docker-compose.yml"),
         "-f", str(REPO / "docker-compose.override.yml"), "config", "-q"],
        env={**deployment.compose.environment, "KUBECONFIG_DIR": "./.kube"},
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


async def test_every_lockgate_service_is_healthy(deployment: Deployment) -> None:
    deployment.compose.up(timeout=180)  # the fair scheduler too, if not started yet
    health = deployment.compose.health()
    for service in LOCKGATE_SERVICES:
        assert health.get(service) == "healthy", f"{service}: {health}"


async def pool_capacity_in_pods(apis: dict[str, client.ApiClient]) -> int:
    """How many of this test's pods all schedulable nodes hold when empty (cpu decides)."""
    per_pod = Resources.from_kubernetes({"cpu": POD_CPU})["cpu"]
    total = 0
    for api in apis.values():
        for node in (await client.CoreV1Api(api).list_node()).items:
            if not node.spec.unschedulable:
                total += Resources.from_kubernetes(node.status.allocatable)["cpu"] // per_pod
    return total


async def wait_for_queued(deployment: Deployment, count: int) -> None:
    """Until queue-store has stored every pod as a queued job (its own Postgres)."""
    conn = await asyncpg.connect(deployment.postgres_dsn)
    try:
        queued: list[int] = [0]

        async def all_queued() -> bool:
            queued.append(await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE queue = ANY($1::text[]) AND state = 'queued'",
                list(PRIORITY_FACTORS)))
            return queued[-1] >= count

        await eventually(all_queued, within=180, every=0.5,
                         what=lambda: f"{count} pods queued in Postgres (have {queued[-1]})")
    finally:
        await conn.close()


async def wait_until_settled(deployment: Deployment, *, quiet_seconds: float,
                             within: float) -> dict[str, int]:
    """Released pods per queue once no release is in flight (decided but still gated, in
    Postgres) and no gate has been removed for `quiet_seconds`."""
    deadline = time.monotonic() + within
    last: dict[str, int] = {}
    since = time.monotonic()
    conn = await asyncpg.connect(deployment.postgres_dsn)
    try:
        while True:
            counts = await released_counts(deployment.apis)
            in_flight = await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE queue = ANY($1::text[]) AND state = 'released'",
                list(PRIORITY_FACTORS))
            if counts != last or not counts or in_flight:
                last, since = counts, time.monotonic()
            elif time.monotonic() - since >= quiet_seconds:
                return counts
            assert time.monotonic() < deadline, (
                f"releases did not settle: {counts}, {in_flight} in flight")
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


async def gated_counts(apis: dict[str, client.ApiClient]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for api in apis.values():
        pods = await client.CoreV1Api(api).list_namespaced_pod(NAMESPACE)
        for pod in pods.items:
            if SCHEDULING_GATE in gates_of(pod):
                queue = pod.metadata.labels["lockgate.io/queue"]
                counts[queue] = counts.get(queue, 0) + 1
    return counts


async def released_counts(apis: dict[str, client.ApiClient]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for api in apis.values():
        pods = await client.CoreV1Api(api).list_namespaced_pod(NAMESPACE)
        for pod in pods.items:
            if SCHEDULING_GATE not in gates_of(pod):
                queue = pod.metadata.labels["lockgate.io/queue"]
                counts[queue] = counts.get(queue, 0) + 1
    return counts


async def first_released(apis: dict[str, client.ApiClient]) -> tuple[str, str, str]:
    """(cluster, pod name, uid) of a released pod of this run."""
    for cluster, api in apis.items():
        pods = await client.CoreV1Api(api).list_namespaced_pod(NAMESPACE)
        for pod in pods.items:
            if SCHEDULING_GATE not in gates_of(pod):
                return cluster, str(pod.metadata.name), str(pod.metadata.uid)
    raise AssertionError("no pod was released")
