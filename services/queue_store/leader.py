"""The fair-scheduler leader, as queue-store asks it: its picture of the last round.

Why: only the leader holds the real picture (holds, reservations, the round's own reasons), so
`status`, `explain` and the web UI's reasons are its answers, proxied, as Armada's non-leaders
proxy scheduling reports to the leader. Any instance may lead; which one is found by asking each
configured instance's `/api/v1/fairness` (a standby answers `"leader": false`) and remembered
until it stops answering or stops leading. A call that finds no leader returns None, and the
caller answers what Postgres alone can say (`job_views`), saying the reasons are unavailable:
never an old answer kept from an earlier leader.

Each request has a short timeout (`timeout_seconds`): a frozen leader makes a page slower by at
most that, never blocks it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

log = logging.getLogger(__name__)

FAIRNESS_PATH = "/api/v1/fairness"
# The same, each queue with its target and share in every cluster: queues x clusters numbers,
# asked only where they are shown (`status -o wide`/`-o json`, a queue's page).
FAIRNESS_PER_CLUSTER_PATH = "/api/v1/fairness/clusters"
EXPLAIN_PATH = "/api/v1/explain"
NO_LEADER = ("no fair-scheduler leader answers with a picture of the queues (none is "
             "reachable, or a new one is still loading), so why pods wait is unavailable; "
             "Postgres gives the counts and places in line")
NOT_CONFIGURED = ("queue-store knows no fair-scheduler (LOCKGATE_QUEUE_STORE_SCHEDULER_URLS is "
                  "empty), so why pods wait is unavailable")

Place = tuple[int, int] | None


class SchedulerLeader:
    """Finds and asks the leader among the fair-scheduler instances at `urls`."""

    def __init__(self, urls: Sequence[str], *, timeout_seconds: float = 2.0) -> None:
        self.urls = [url.rstrip("/") for url in urls]
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None
        self._leader: str | None = None  # the URL that led when last asked

    @property
    def unavailable(self) -> str:
        """Why there is no answer, when a call returned None."""
        return NO_LEADER if self.urls else NOT_CONFIGURED

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fairness(self, *, per_cluster: bool = False) -> dict[str, Any] | None:
        """The leader's report of every queue after its last round, or None; `per_cluster`:
        each queue with its target and share in every cluster too."""
        path = FAIRNESS_PER_CLUSTER_PATH if per_cluster else FAIRNESS_PATH
        for url in self._candidates():
            body = await self._call("GET", url + path)
            if body is not None and body.get("leader"):
                self._leader = url
                # A leader before its first round has no picture yet: no answer either.
                return body if body.get("last_round") is not None else None
        self._leader = None
        return None

    async def explain(self, jobs: Sequence[tuple[str, Place]]) -> dict[str, Any] | None:
        """The leader's answer for each job id (with its place in line, when known), or None.

        Asks the remembered leader first; if it no longer leads, finds the one that does."""
        payload = {"jobs": [{"id": job_id, "place": None if place is None else list(place)}
                            for job_id, place in jobs]}
        for attempt in range(2):
            url = self._leader
            if url is None:
                if await self.fairness() is None:
                    return None
                url = self._leader
                assert url is not None
            body = await self._call("POST", url + EXPLAIN_PATH, payload)
            if body is not None and body.get("leader"):
                return body if body.get("round") is not None else None
            self._leader = None  # it stopped leading or answering: look again, once
            if attempt:
                break
        return None

    def _candidates(self) -> list[str]:
        known = self._leader
        return ([known] if known else []) + [url for url in self.urls if url != known]

    async def _call(self, method: str, url: str,
                    payload: dict[str, Any] | None = None) -> dict[str, Any] | None:
        try:
            async with self._client().request(method, url, json=payload) as response:
                if response.status != 200:
                    log.debug("%s %s answered %s", method, url, response.status)
                    return None
                # orjson: the fairness answer per cluster holds every queue's share in every
                # cluster (about 100,000 numbers at 1,000 queues and 50 clusters): json
                # decoded it in most of a `status -o wide`'s time.
                body = orjson.loads(await response.read())
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.debug("%s %s failed: %r", method, url, error)
            return None
        return body if isinstance(body, dict) else None
