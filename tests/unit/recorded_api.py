"""The admin API replaced by recorded answers, for the CLI's unit tests: what is tested with it
is how commands parse their arguments, what they send and how they print, never the API (the
integration tests run the CLI against a real queue-store)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from lockgate_cli import root

Answer = Any | Callable[[httpx.Request], Any]


@dataclass
class Sent:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    host: str = ""


@dataclass
class RecordedApi:
    """Answers by (METHOD, path): a JSON body (status 200), an (status, body) tuple, or a
    function of the request. Anything else is a 404, as the API answers."""

    answers: dict[tuple[str, str], Answer] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)

    def on(self, method: str, path: str, answer: Answer) -> RecordedApi:
        self.answers[(method, path)] = answer
        return self

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.sent.append(Sent(request.method, request.url.path, dict(request.url.params), body,
                              request.url.host))
        answer = self.answers.get((request.method, request.url.path))
        if answer is None:
            return httpx.Response(404, json={"error": f"no route {request.url.path}"})
        if callable(answer):
            answer = answer(request)
        status, payload = answer if isinstance(answer, tuple) else (200, answer)
        return httpx.Response(status, json=payload) if payload is not None else \
            httpx.Response(status)

    def run(self, *argv: str, env: Mapping[str, str] | None = None) -> Ran:
        out, err = io.StringIO(), io.StringIO()
        code = root.main(["--api", "http://lockgate.test", *argv], out=out, err=err,
                         transport=httpx.MockTransport(self.handle), env=env or {})
        return Ran(code, out.getvalue(), err.getvalue(), self.sent)

    def bodies(self, method: str) -> list[Any]:
        return [s.body for s in self.sent if s.method == method]


@dataclass
class Ran:
    code: int
    out: str
    err: str
    sent: list[Sent]


CLUSTERS = {"clusters": [{"name": "cluster-a", "nodes": 4, "schedulable_nodes": 4,
                          "capacity": {"cpu": 64000}, "unmanaged": {}, "queues": {}},
                         {"name": "cluster-b", "nodes": 4, "schedulable_nodes": 3,
                          "capacity": {"cpu": 48000}, "unmanaged": {}, "queues": {}}]}


def a_queue(name: str = "q", **fields: Any) -> dict[str, Any]:
    """A queue as the API answers it."""
    queue = {"name": name, "priority_factor": 1.0, "weight": 1.0, "cordoned": False,
             "resource_limits": {}, "namespaces": [], "max_queued": None,
             "group_timeout_seconds": None, "group_timeout_action": "delete",
             "allowed_kinds": ["pods"], "allowed_kinds_default": True,
             "created_at": "2026-12-01T10:00:00+00:00", "updated_at": None}
    queue.update(fields)
    if "priority_factor" in fields and "weight" not in fields:
        queue["weight"] = 1 / fields["priority_factor"]
    return queue
