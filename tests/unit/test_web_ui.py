"""The web UI's server side without a database: public files, the token rules, pure helpers."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from lockgate.ingest import JobRow
from lockgate.jobs import JobState
from lockgate_adapters.admin_tokens import Role, entry_for, new_token
from queue_store import web_ui
from queue_store.app import admin_api
from queue_store.namespaces import NamespaceKeeper
from queue_store.settings import QueueStoreSettings
from queue_store.ui_api import FairnessSampler, inner_node_samples, journey, trace_id_of

ADMIN, READER = new_token(), new_token()


async def _no_publish(_: Any, __: Any) -> None:
    raise AssertionError("a refused call must publish nothing")


@pytest.fixture
async def client() -> Any:
    settings = QueueStoreSettings(
        admin_tokens=[entry_for("ui-admin", Role.ADMIN, ADMIN).line(),
                      entry_for("ui-reader", Role.READ_ONLY, READER).line()],
        postgres_dsn="postgresql://unused@127.0.0.1:1/unused", kafka_bootstrap="127.0.0.1:1")
    keeper = NamespaceKeeper(apis={}, extra_labels={}, token_seconds=3600, create_any=True)
    admin, *_ = admin_api(cast(asyncpg.Pool, None), settings, publish=_no_publish,
                         keeper=keeper)
    async with TestClient(TestServer(admin.app())) as test_client:
        yield test_client


async def test_files_are_public_and_locked_down(client: TestClient[Any, Any]) -> None:
    root = await client.get("/", allow_redirects=False)
    assert root.status == 302 and root.headers["Location"] == "/ui/"
    for name in web_ui.FILES:
        answer = await client.get(f"/ui/{name}")
        assert answer.status == 200, name
        assert "script-src 'self'" in answer.headers["Content-Security-Policy"]
        assert answer.headers["X-Frame-Options"] == "DENY"
    page = await (await client.get("/ui/")).text()
    assert "<script src=\"app.js\"" in page and "http" not in page.split("<body>")[0].replace(
        'http-equiv', '')  # no asset from another origin
    # Only the listed files: nothing else of the package is reachable under /ui/.
    assert (await client.get("/ui/ui_api.py")).status == 404
    assert (await client.get("/ui/%2e%2e%2fsettings.py")).status == 404


async def test_every_datum_needs_a_token(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/api/v1/whoami")).status == 401
    answer = await client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {READER}"})
    assert answer.status == 200
    assert await answer.json() == {"name": "ui-reader", "role": "read-only", "may_act": False}
    assert answer.headers["Cache-Control"] == "no-store"
    admin = await client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {ADMIN}"})
    assert (await admin.json())["may_act"] is True
    assert (await client.get("/api/v1/openapi.json")).status == 200  # its shape, no data


async def test_a_read_only_token_cannot_act_and_is_never_logged(
        client: TestClient[Any, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for method, path in (("POST", "/api/v1/jobsets/q/js/cancel"),
                         ("DELETE", "/api/v1/namespaces/c/n"), ("DELETE", "/api/v1/queues/q"),
                         ("POST", "/api/v1/queues")):
        answer = await client.request(method, path, headers={"Authorization": f"Bearer {READER}"},
                                      json={"reason": "x"})
        assert answer.status == 403, (method, path)
        assert "needs an admin token" in (await answer.json())["error"]
    # A token in the query string is not a credential: still 401.
    assert (await client.get(f"/api/v1/whoami?token={READER}")).status == 401
    # The test server logs access lines; queue-store runs its server with access_log=None.
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name != "aiohttp.access")
    assert "refused to read-only token 'ui-reader'" in logged
    assert READER not in logged and ADMIN not in logged


def _row(state: JobState, **times: datetime | None) -> JobRow:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return JobRow(cluster="c", uid="0b6c5f4e-1d2a-4b3c-9d8e-7f6a5b4c3d2e", namespace="ns",
                  name="p", queue="q", jobset="js", priority=0, requests={"cpu": 500},
                  state=state, node_name=None, created_at=at,
                  state_changed_at=at + timedelta(seconds=9), **cast(Any, times))


def test_journey_of_a_queued_pod_stops_at_queued() -> None:
    steps = {s["step"]: s for s in journey(_row(JobState.QUEUED))}
    assert [s for s, v in steps.items() if v["reached"]] == ["created", "queued"]
    assert steps["queued"]["current"] and not steps["released"]["reached"]


def test_journey_of_a_finished_pod_has_every_step() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    row = _row(JobState.SUCCEEDED, released_at=at + timedelta(seconds=1),
               ungated_at=at + timedelta(seconds=2), running_at=at + timedelta(seconds=3),
               finished_at=at + timedelta(seconds=8))
    steps = journey(row)
    assert all(s["reached"] for s in steps)
    assert [s["step"] for s in steps if s["current"]] == ["ended"]
    assert steps[-1]["detail"] == "succeeded"
    assert steps[3]["at"] == (at + timedelta(seconds=3)).isoformat()


def test_journey_of_a_cancelled_queued_pod_skips_release() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    steps = {s["step"]: s for s in journey(_row(JobState.CANCELLED, finished_at=at))}
    assert not steps["released"]["reached"] and not steps["bound"]["reached"]
    assert steps["ended"]["reached"] and steps["ended"]["detail"] == "cancelled"


def test_trace_id_is_the_uid_bits() -> None:
    assert trace_id_of("0B6C5F4E-1D2A-4B3C-9D8E-7F6A5B4C3D2E") == "0b6c5f4e1d2a4b3c9d8e7f6a5b4c3d2e"
    assert trace_id_of("not-a-uid") is None
    assert trace_id_of("00000000-0000-0000-0000-000000000000") is None


def test_the_unfinished_predicate_names_every_terminal_state() -> None:
    from lockgate.jobs import TERMINAL_STATES
    from lockgate_adapters import job_views

    spelled = set(re.findall(r"'(\w+)'", job_views._UNFINISHED))
    assert spelled == {s.value for s in TERMINAL_STATES}
    migration = (Path(job_views.__file__).parent / "migrations" / "016_ui_indexes.sql").read_text()
    assert job_views._UNFINISHED.format(alias="").removeprefix(" AND ") in migration


class _Leader:
    """A leader answering one report: the sampler's only collaborator."""

    def __init__(self, report: dict[str, Any] | None) -> None:
        self.report = report

    async def fairness(self) -> dict[str, Any] | None:
        return self.report


async def test_a_sample_keeps_the_inner_nodes_of_the_leaders_tree() -> None:
    """The overview charts a picked node's children over time: leaves from `queues`, inner
    nodes from `nodes`, each as the leader's tree gives it (no share computed here)."""
    leaf = {"name": "alice", "parent": "vision", "leaf": True, "fair_target": 0.1,
            "actual_share": 0.05, "decayed_usage": None}
    vision = {"name": "vision", "parent": "research", "leaf": False, "fair_target": 0.25,
              "actual_share": 0.2, "decayed_usage": 3.5}
    report = {"queues": [{"name": "alice", "fair_target": 0.1, "actual_share": 0.05}],
              "tree": [vision, leaf]}
    sampler = FairnessSampler(leader=cast(Any, _Leader(report)), interval_seconds=1, keep=5)
    await sampler.sample()
    (sample,) = sampler.history
    assert sample["queues"]["alice"]["actual"] == 0.05
    assert sample["nodes"] == {"vision": {"target": 0.25, "actual": 0.2, "decayed_usage": 3.5}}


def test_a_flat_or_missing_tree_has_no_inner_node_samples() -> None:
    flat = [{"name": "a", "parent": None, "leaf": True, "fair_target": 0.5}]
    assert inner_node_samples(flat) == {}
    assert inner_node_samples(None) == {}
    assert inner_node_samples([{"leaf": False}, "junk"]) == {}, "entries without a name"


async def test_no_leader_no_sample() -> None:
    sampler = FairnessSampler(leader=cast(Any, _Leader(None)), interval_seconds=1, keep=5)
    await sampler.sample()
    assert not sampler.history
