"""Running a service: its long-lived loops in one TaskGroup, stopped gracefully on SIGTERM.

Why: every lockgate service has the same life: start telemetry and the health server, run a few
loops until SIGTERM/SIGINT, then let them finish their in-flight work (commit, flush) within the
grace period, and cancel whatever still hangs after it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from lockgate_adapters.dependencies import DependencyMonitor
from lockgate_adapters.health import HealthServer, Readiness
from lockgate_adapters.settings import ServiceSettings
from lockgate_adapters.telemetry import setup_logging, setup_tracing

log = logging.getLogger(__name__)

Loop = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


class ServiceContext:
    """What a composition root gets: the stop flag, the readiness it reports, and the monitor
    of the dependencies it declares (`ctx.dependencies.kafka(bootstrap)`, ...)."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.stopping = asyncio.Event()
        self.readiness = Readiness()
        self.health = HealthServer(self.readiness, host=settings.http_host,
                                   port=settings.http_port,
                                   own_thread=settings.health_own_thread)
        self.dependencies = DependencyMonitor(self.readiness, settings.dependency_checks)


async def run_service(
    settings: ServiceSettings,
    compose: Callable[[ServiceContext], Awaitable[list[Loop]]],
    *,
    install_signal_handlers: bool = True,
    context: ServiceContext | None = None,
) -> None:
    """Build the service with `compose`, run its loops, and shut down on a signal or a crash."""
    ctx = context or ServiceContext(settings)
    loop = asyncio.get_running_loop()
    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, ctx.stopping.set)
    # Not ready until the service has built its clients and declared its own checks.
    ctx.readiness.set("started", False, "composing")
    await ctx.health.start()
    log.info("%s started; health on %s:%s", settings.service_name, settings.http_host,
             ctx.health.bound_port)
    # Probes run from the start: a composition root waiting for a dependency already says which.
    monitor = asyncio.create_task(ctx.dependencies.run(ctx.stopping), name="dependency probes")
    try:
        loops = await compose(ctx)
        ctx.readiness.set("started", True, "running")
        async with asyncio.TaskGroup() as group:
            tasks: list[asyncio.Task[None]] = [
                group.create_task(run(ctx.stopping)) for run in loops
            ]
            group.create_task(_cancel_after_grace(ctx.stopping, tasks,
                                                  settings.shutdown_grace_seconds))
    finally:
        monitor.cancel()
        await asyncio.gather(monitor, return_exceptions=True)
        await ctx.health.stop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        log.info("%s stopped", settings.service_name)


async def _cancel_after_grace(
    stopping: asyncio.Event, tasks: list[asyncio.Task[None]], grace: float
) -> None:
    await stopping.wait()
    _, pending = await asyncio.wait(tasks, timeout=grace)
    for task in pending:
        log.warning("cancelling %s: still running after the %.0fs grace period",
                    task.get_name(), grace)
        task.cancel()


def main_for(
    settings_type: type[ServiceSettings],
    compose: Callable[[ServiceContext], Awaitable[list[Loop]]],
) -> None:
    """The whole of a service's `main`: settings, logging, tracing, run."""
    settings = settings_type()
    setup_logging(settings.log_level)
    setup_tracing(settings.service_name, otlp_endpoint=settings.otlp_endpoint,
                  console=settings.trace_console)
    asyncio.run(run_service(settings, compose))
