"""A pod's trace for the web UI's pod page, read from the trace store's query API.

Why queue-store reads it rather than the page: the page may load nothing but its own origin
(its Content Security Policy), and Jaeger's own UI is not there to link to when Jaeger is built
from the Go module proxy (`make run`'s, the compose images'): that build serves a placeholder
page. So queue-store asks Jaeger's `GET /api/traces/{id}` for the pod's trace and the traces its
spans link to (its admission review, the round that released it), builds the same waterfall as
`lockgate trace` (`lockgate.pod_traces`), and the page draws it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp

from lockgate.pod_traces import (
    TraceFormatError,
    TraceSpan,
    Waterfall,
    linked_traces,
    spans_from_jaeger,
    waterfall,
)

MAX_LINKED_TRACES = 8  # as `lockgate trace`: a pod links to its admission and its rounds


class TraceStoreError(Exception):
    """The trace store did not answer, or not as Jaeger's query API does."""


class TraceStore:
    """Jaeger's query API at `base_url` (e.g. http://127.0.0.1:16686)."""

    def __init__(self, base_url: str, *, timeout_seconds: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def chart(self, trace_id: str) -> Waterfall:
        """The pod's waterfall; empty when no span of its trace has arrived (yet)."""
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            spans = await self._spans(session, trace_id)
            linked: list[TraceSpan] = []
            for other in linked_traces(spans)[:MAX_LINKED_TRACES]:
                linked += await self._spans(session, other)  # gone (sampled out): shown without
        return waterfall(spans, linked)

    async def _spans(self, session: aiohttp.ClientSession, trace_id: str) -> list[TraceSpan]:
        url = f"{self.base_url}/api/traces/{quote(trace_id, safe='')}"
        try:
            async with session.get(url, headers={"Accept": "application/json"}) as response:
                if response.status == 404:
                    return []
                if response.status != 200:
                    raise TraceStoreError(f"the trace store at {self.base_url} answered HTTP "
                                          f"{response.status} for trace {trace_id}")
                document: Any = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise TraceStoreError(f"the trace store at {self.base_url} did not answer: "
                                  f"{error or type(error).__name__}") from error
        if not isinstance(document, dict):
            raise TraceStoreError(f"the trace store at {self.base_url} did not answer as "
                                  "Jaeger's query API does")
        try:
            return spans_from_jaeger(document)
        except TraceFormatError as error:
            raise TraceStoreError(f"{error} (is {self.base_url} Jaeger's query API?)") from error
