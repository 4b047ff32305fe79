"""Liveness, readiness and Prometheus metrics over HTTP, one small server per service.

Readiness is the conjunction of named checks that the service's loops flip: a service whose
Postgres or Kafka is down reports not ready (and says which) while it retries. A service may also
serve small read-only JSON views under /api/ (e.g. the scheduler's fairness report).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


@dataclass
class Readiness:
    """Named conditions that must all hold for the service to be ready."""

    _conditions: dict[str, tuple[bool, str]] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def declare(self, *names: str) -> None:
        for name in names:
            self._conditions.setdefault(name, (False, "starting"))

    def set(self, name: str, ready: bool, detail: str = "") -> None:
        self._conditions[name] = (ready, detail)
        self._changed.set()

    @property
    def ready(self) -> bool:
        return all(ok for ok, _ in self._conditions.values())

    def report(self) -> dict[str, dict[str, object]]:
        return {name: {"ready": ok, "detail": detail}
                for name, (ok, detail) in self._conditions.items()}


class HealthServer:
    """Serves /healthz, /readyz and /metrics on loopback unless configured otherwise."""

    def __init__(self, readiness: Readiness, *, host: str, port: int) -> None:
        self.readiness = readiness
        self._host, self._port = host, port
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        self._json_views: dict[str, Callable[[], object]] = {}

    def add_json_view(self, path: str, view: Callable[[], object]) -> None:
        """Serve `view()` as JSON at GET `path` (which starts with /api/), even once started."""
        if not path.startswith("/api/"):
            raise ValueError(f"JSON views live under /api/, not at {path!r}")
        self._json_views[path] = view

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/{view:.*}", self._json_view)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        for address in self._runner.addresses:
            self.bound_port = int(address[1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def _readyz(self, _: web.Request) -> web.Response:
        status = 200 if self.readiness.ready else 503
        return web.json_response(
            {"ready": self.readiness.ready, "checks": self.readiness.report()}, status=status
        )

    async def _json_view(self, request: web.Request) -> web.Response:
        view = self._json_views.get(request.path)
        if view is None:
            raise web.HTTPNotFound(text=f"no view at {request.path}")
        return web.json_response(view())

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})
