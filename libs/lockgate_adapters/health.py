"""Liveness, readiness and Prometheus metrics over HTTP, one small server per service.

Readiness is the conjunction of named checks that the service's loops and its dependency probes
(`dependencies`) flip: a service whose Postgres, Kafka or apiserver is down reports not ready
(and says which, e.g. `kafka`, `postgres`, `apiserver:cluster-a`) while it retries. A service
may also serve small read-only JSON views under /api/ (e.g. the scheduler's fairness report).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


@dataclass
class Readiness:
    """Named conditions that must all hold for the service to be ready.

    A condition may have several reporters (`source`): the loop that uses Kafka says "kafka" is
    fine as long as it consumes, and the dependency monitor's probe says whether Kafka answers
    at all. The condition holds only while every source says so; the report names the sources
    that do not.
    """

    _conditions: dict[str, dict[str, tuple[bool, str]]] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def declare(self, *names: str, source: str = "") -> None:
        for name in names:
            self._conditions.setdefault(name, {}).setdefault(source, (False, "starting"))

    def set(self, name: str, ready: bool, detail: str = "", *, source: str = "") -> None:
        self._conditions.setdefault(name, {})[source] = (ready, detail)
        self._changed.set()

    def holds(self, name: str) -> bool:
        """True if the condition is declared and every source of it is ready."""
        sources = self._conditions.get(name) or {}
        return bool(sources) and all(ok for ok, _ in sources.values())

    @property
    def ready(self) -> bool:
        return all(self.holds(name) for name in self._conditions)

    def report(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        for name, sources in self._conditions.items():
            ok = self.holds(name)
            shown = [(source, detail) for source, (ready, detail) in sources.items()
                     if ready == ok]
            entry: dict[str, object] = {
                "ready": ok,
                "detail": "; ".join(f"{source}: {detail}" if source and len(sources) > 1
                                    else detail for source, detail in shown),
            }
            if len(sources) > 1:
                entry["sources"] = {source or "loop": {"ready": ready, "detail": detail}
                                    for source, (ready, detail) in sources.items()}
            out[name] = entry
        return out


class HealthServer:
    """Serves /healthz, /readyz and /metrics on loopback unless configured otherwise."""

    def __init__(self, readiness: Readiness, *, host: str, port: int) -> None:
        self.readiness = readiness
        self._host, self._port = host, port
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        self._json_views: dict[str, Callable[[], object]] = {}
        self._json_queries: dict[str, Callable[[object], object]] = {}

    def add_json_view(self, path: str, view: Callable[[], object]) -> None:
        """Serve `view()` as JSON at GET `path` (which starts with /api/), even once started;
        a view may return the JSON encoded, as bytes."""
        if not path.startswith("/api/"):
            raise ValueError(f"JSON views live under /api/, not at {path!r}")
        self._json_views[path] = view

    def add_json_query(self, path: str, query: Callable[[object], object]) -> None:
        """Serve `query(body)` as JSON at POST `path` (under /api/), `body` the request's JSON.
        A `ValueError` it raises is the caller's mistake: a 400 with its message."""
        if not path.startswith("/api/"):
            raise ValueError(f"JSON queries live under /api/, not at {path!r}")
        self._json_queries[path] = query

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/{view:.*}", self._json_view)
        app.router.add_post("/api/{view:.*}", self._json_query)
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
        body = view()
        if isinstance(body, bytes):  # encoded already (e.g. kept until what it says changes)
            return web.Response(body=body, content_type="application/json")
        return web.json_response(body)

    async def _json_query(self, request: web.Request) -> web.Response:
        query = self._json_queries.get(request.path)
        if query is None:
            raise web.HTTPNotFound(text=f"no query at {request.path}")
        try:
            body = json.loads(await request.read() or b"null")
            return web.json_response(query(body))
        except ValueError as error:  # JSONDecodeError included
            return web.json_response({"error": str(error)}, status=400)

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})
