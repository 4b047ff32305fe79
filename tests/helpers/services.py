"""lockgate's services in tests: in this process (to read their readiness and spans directly), or
as real processes (to SIGKILL them), isolated from other tests sharing the stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from devstack.launcher import STARTUP_SECONDS, ServiceProcess
from devstack.ports import free_port
from devstack.roles import service_dsn
from fair_scheduler.app import FAIRNESS_PATH
from helpers.waiting import until
from lockgate_adapters.service import Loop, ServiceContext, run_service
from lockgate_adapters.settings import RetryPolicy, ServiceSettings

# Dependencies that come back are noticed within a fraction of a second.
FAST_RETRY = RetryPolicy(initial_seconds=0.05, max_seconds=0.5)

Compose = Callable[[ServiceContext], Awaitable[list[Loop]]]


@contextlib.asynccontextmanager
async def service_in_process(
    settings: ServiceSettings, compose: Compose, *, name: str,
    ready: Callable[[ServiceContext], bool] | None, within: float = STARTUP_SECONDS,
) -> AsyncIterator[ServiceContext]:
    """The service running in this process while the block runs, then stopped gracefully.

    Enters once `ready(ctx)` holds (at once if `ready` is None); if the service ends before
    that, its error is raised.
    """
    ctx = ServiceContext(settings)
    task = asyncio.create_task(
        run_service(settings, compose, install_signal_handlers=False, context=ctx), name=name)
    try:
        if ready is not None:
            await until(lambda: ready(ctx) or task.done(), within=within,
                        what=lambda: f"{name} to be ready: {ctx.readiness.report()}")
            if task.done():
                task.result()
        yield ctx
    finally:
        ctx.stopping.set()
        await asyncio.wait_for(task, 30)


def watcher_process(name: str, *, clusters: Mapping[str, str],
                    kafka_bootstrap: str) -> ServiceProcess:
    """`python -m cluster_watcher` of `clusters` (name → kubeconfig), with fast retries.

    Give it the watcher's own kubeconfigs (`stack.kubeconfigs_of("cluster-watcher")`), as in a
    worker cluster, so the tests prove its ClusterRole suffices.
    """
    health_port = free_port()
    return ServiceProcess(name, "cluster_watcher", {
        "LOCKGATE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LOCKGATE_WATCHER_CLUSTERS": json.dumps(dict(clusters)),
        "LOCKGATE_WATCHER_HTTP_PORT": str(health_port),
        "LOCKGATE_WATCHER_RETRY__INITIAL_SECONDS": str(FAST_RETRY.initial_seconds),
        "LOCKGATE_WATCHER_RETRY__MAX_SECONDS": str(FAST_RETRY.max_seconds),
    }, health_port=health_port)


@dataclass
class WebhookProcess:
    """`python -m admission_webhook` on free loopback ports, its certificates in `cert_dir`."""

    process: ServiceProcess
    port: int
    cert_dir: Path

    async def readiness(self) -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{self.process.health_port}/readyz"
        ) as response:
            return response.status, await response.json()

    async def post_review(self, cluster: str, review: dict[str, Any]) -> dict[str, Any]:
        """Send a review the way an apiserver does, trusting only the webhook's own CA."""
        trust = ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))
        async with aiohttp.ClientSession() as session, session.post(
            f"https://127.0.0.1:{self.port}/mutate/{cluster}", json=review, ssl=trust
        ) as response:
            assert response.status == 200, await response.text()
            body: dict[str, Any] = await response.json()
            return body


def webhook_process(name: str, *, cert_dir: Path, env: Mapping[str, str],
                    port: int | None = None) -> WebhookProcess:
    """The webhook's process (not started); `env` says which clusters, Postgres, registration.

    LOCKGATE_WEBHOOK_CLUSTERS should hold the webhook's own kubeconfigs
    (`stack.kubeconfigs_of("webhook")`), not admin's.

    A restarted webhook is given the `port` and `cert_dir` of the one it replaces.
    """
    port = port or free_port()
    health_port = free_port()
    process = ServiceProcess(name, "admission_webhook", {
        "LOCKGATE_WEBHOOK_PORT": str(port),
        "LOCKGATE_WEBHOOK_HTTP_PORT": str(health_port),
        "LOCKGATE_WEBHOOK_CERT_DIR": str(cert_dir),
        **env,
    }, health_port=health_port)
    return WebhookProcess(process, port, cert_dir)


async def fairness_report(health_port: int) -> dict[str, Any]:
    """A fair scheduler's fairness report, from its health endpoint's port."""
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{health_port}{FAIRNESS_PATH}") as response:
        assert response.status == 200
        report: dict[str, Any] = await response.json()
        return report


def scheduler_process(name: str, *, postgres_dsn: str, kafka_bootstrap: str,
                      env: Mapping[str, str] | None = None) -> ServiceProcess:
    """`python -m fair_scheduler` over `postgres_dsn` as the scheduler's own role, with fast
    retries and rounds; its HTTP server (the leader's picture) on a port of its own."""
    port = free_port()
    return ServiceProcess(name, "fair_scheduler", {
        "LOCKGATE_POSTGRES_DSN": service_dsn(postgres_dsn, "fair-scheduler"),
        "LOCKGATE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LOCKGATE_SCHEDULER_INSTANCE_ID": name,
        "LOCKGATE_SCHEDULER_HTTP_PORT": str(port),
        "LOCKGATE_SCHEDULER_RETRY__INITIAL_SECONDS": str(FAST_RETRY.initial_seconds),
        "LOCKGATE_SCHEDULER_RETRY__MAX_SECONDS": str(FAST_RETRY.max_seconds),
        **(env or {})}, health_port=port)


def scheduler_urls(*schedulers: ServiceProcess) -> dict[str, str]:
    """queue-store's setting that points `status`, `explain` and the UI at these schedulers."""
    return {"LOCKGATE_QUEUE_STORE_SCHEDULER_URLS": json.dumps(
        [f"http://127.0.0.1:{s.health_port}" for s in schedulers])}
