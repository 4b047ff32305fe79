"""Liveness, readiness and Prometheus metrics over HTTP, one small server per service.

Readiness is the conjunction of named checks that the service's loops and its dependency probes
(`dependencies`) flip: a service whose Postgres, Kafka or apiserver is down reports not ready
(and says which, e.g. `kafka`, `postgres`, `apiserver:cluster-a`) while it retries. A service
may also serve small read-only JSON views under /api/ (e.g. the scheduler's fairness report).

A server may run on a thread of its own (`own_thread`), for a service whose event loop holds on
to long stretches of work (the fair scheduler's rounds): views registered `off_loop` are then
answered there at once, while everything else (/healthz, /readyz, /metrics, the other views and
the queries) still runs on the service's loop, so a stuck loop still fails its probes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

_T = TypeVar("_T")


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

    def __init__(self, readiness: Readiness, *, host: str, port: int,
                 own_thread: bool = False) -> None:
        self.readiness = readiness
        self._host, self._port = host, port
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        self._json_views: dict[str, Callable[[], object]] = {}
        self._off_loop: set[str] = set()  # views answered on the server's own thread
        self._json_queries: dict[str, Callable[[object], object]] = {}
        self._off_loop_queries: dict[str, Callable[[object], object | None]] = {}
        self._own_thread = own_thread
        self._thread: threading.Thread | None = None
        self._server_loop: asyncio.AbstractEventLoop | None = None
        self._service_loop: asyncio.AbstractEventLoop | None = None  # set while threaded

    def add_json_view(self, path: str, view: Callable[[], object], *,
                      off_loop: bool = False) -> None:
        """Serve `view()` as JSON at GET `path` (which starts with /api/), even once started;
        a view may return the JSON encoded, as bytes. `off_loop`: on a server with a thread
        of its own, `view` is called on that thread, never waiting for the service's loop; it
        must then read only what the loop replaces whole (one attribute assigned), never
        what the loop changes in place."""
        if not path.startswith("/api/"):
            raise ValueError(f"JSON views live under /api/, not at {path!r}")
        self._json_views[path] = view
        if off_loop:
            self._off_loop.add(path)
        else:
            self._off_loop.discard(path)

    def add_json_query(self, path: str, query: Callable[[object], object], *,
                       off_loop: Callable[[object], object | None] | None = None) -> None:
        """Serve `query(body)` as JSON at POST `path` (under /api/), `body` the request's JSON.
        A `ValueError` it raises is the caller's mistake: a 400 with its message.
        `off_loop`: on a server with a thread of its own, asked first on that thread (the
        same rules as an `off_loop` view); its answer, unless None, is served without the
        service's loop, and None asks `query` on the loop."""
        if not path.startswith("/api/"):
            raise ValueError(f"JSON queries live under /api/, not at {path!r}")
        self._json_queries[path] = query
        if off_loop is None:
            self._off_loop_queries.pop(path, None)
        else:
            self._off_loop_queries[path] = off_loop

    async def start(self) -> None:
        if not self._own_thread:
            await self._start_site()
            return
        self._service_loop = asyncio.get_running_loop()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(started,),
                                        name="health-server", daemon=True)
        self._thread.start()
        await asyncio.wrap_future(started)

    def _serve(self, started: concurrent.futures.Future[None]) -> None:
        """The server's own thread: its loop, until `stop`."""
        loop = self._server_loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start_site())
        except BaseException as error:  # noqa: BLE001 - handed to `start`, which raises it
            started.set_exception(error)
            loop.close()
            return
        started.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._cleanup())
            loop.close()

    async def _on_service_loop(self, work: Callable[[], _T]) -> _T:
        """`work()` run on the service's loop (at once when the server runs there)."""
        service = self._service_loop
        if service is None:
            return work()

        async def call() -> _T:
            return work()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), service))

    async def _start_site(self) -> None:
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
        thread, loop = self._thread, self._server_loop
        if thread is not None and loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            # The handlers finishing meanwhile may need this loop: wait without blocking it.
            await asyncio.to_thread(thread.join)
            self._thread = self._server_loop = self._service_loop = None
            return
        await self._cleanup()

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, _: web.Request) -> web.Response:
        # Answered by the service's loop even when served from a thread: a stuck loop is
        # what liveness must see.
        await self._on_service_loop(lambda: None)
        return web.json_response({"alive": True})

    async def _readyz(self, _: web.Request) -> web.Response:
        ready, checks = await self._on_service_loop(
            lambda: (self.readiness.ready, self.readiness.report()))
        return web.json_response({"ready": ready, "checks": checks},
                                 status=200 if ready else 503)

    async def _json_view(self, request: web.Request) -> web.Response:
        view = self._json_views.get(request.path)
        if view is None:
            raise web.HTTPNotFound(text=f"no view at {request.path}")
        body = view() if request.path in self._off_loop else await self._on_service_loop(view)
        if isinstance(body, bytes):  # encoded already (e.g. kept until what it says changes)
            return web.Response(body=body, content_type="application/json")
        return web.json_response(body)

    async def _json_query(self, request: web.Request) -> web.Response:
        query = self._json_queries.get(request.path)
        if query is None:
            raise web.HTTPNotFound(text=f"no query at {request.path}")
        off_loop = self._off_loop_queries.get(request.path) if self._own_thread else None
        try:
            body = json.loads(await request.read() or b"null")
            answer = None if off_loop is None else off_loop(body)
            if answer is None:
                answer = await self._on_service_loop(lambda: query(body))
            return web.json_response(answer)
        except ValueError as error:  # JSONDecodeError included
            return web.json_response({"error": str(error)}, status=400)

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=await self._on_service_loop(generate_latest),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})
