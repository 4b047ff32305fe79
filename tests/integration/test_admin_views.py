"""The admin API's read-only views (status, explain, job sets) and a queue's maximum time queued,
served by a real queue-store process over a fresh database of this module, beside a real
fair-scheduler process whose picture `status` and `explain` ask.

Job rows are written straight into Postgres (what queue-store would have folded from pod events):
these views only read them, and the scheduler reads them through its change feed. Each test uses
names of its own. The last test stops the scheduler: the views must then say the reasons are
unavailable, never give an old one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import pytest

from devstack.launcher import ServiceProcess
from helpers.postgres import fresh_database
from helpers.queue_store import QueueStoreUnderTest
from helpers.services import scheduler_process, scheduler_urls
from helpers.waiting import eventually

pytestmark = [pytest.mark.timeout(180)]


@dataclass
class Served:
    store: QueueStoreUnderTest
    scheduler: ServiceProcess


@pytest.fixture(scope="module")
async def served(pg_dsn: str, kafka_bootstrap: str) -> AsyncIterator[Served]:
    async with fresh_database(pg_dsn, prefix="admin_views_it") as dsn:
        spec = QueueStoreUnderTest(postgres_dsn=dsn, kafka_bootstrap=kafka_bootstrap)
        scheduler = scheduler_process(f"fair-scheduler-views-{spec.group_id}",
                                      postgres_dsn=dsn, kafka_bootstrap=kafka_bootstrap)
        process = await spec.start(f"queue-store-views-{spec.group_id}",
                                   scheduler_urls(scheduler))
        await scheduler.start()
        try:
            await scheduler.wait_ready()  # ready only while leading
            yield Served(spec, scheduler)
        finally:
            scheduler_code = await scheduler.stop()
            code = await process.stop()
    assert code == 0, process.log_tail()
    assert scheduler_code in (0, None, -9), scheduler.log_tail()


@pytest.fixture
def admin(served: Served) -> QueueStoreUnderTest:
    return served.store


@dataclass
class Reply:
    status: int
    body: Any


async def call(admin: QueueStoreUnderTest, method: str, path: str, body: Any = None) -> Reply:
    headers = {"Content-Type": "application/json",
               "Authorization": f"Bearer {admin.admin_token}"}
    async with aiohttp.ClientSession() as session, session.request(
            method, admin.admin_url + path, headers=headers,
            data=None if body is None else json.dumps(body)) as response:
        text = await response.text()
        return Reply(response.status, json.loads(text) if text else None)


async def add_jobs(dsn: str, *rows: tuple[str, str, str, str, str]) -> None:
    """(cluster, name, queue, jobset, state) each, created a minute apart, oldest first."""
    connection = await asyncpg.connect(dsn)
    start = datetime.now(UTC) - timedelta(hours=1)
    try:
        await connection.executemany(
            "INSERT INTO jobs (cluster, uid, namespace, name, queue, jobset, requests, state,"
            " created_at) VALUES ($1, $2, 'ns', $3, $4, $5, '{\"cpu\": 1000}', $6, $7)",
            [(cluster, uuid.uuid4().hex, name, queue, jobset, state,
              start + timedelta(minutes=i))
             for i, (cluster, name, queue, jobset, state) in enumerate(rows)])
    finally:
        await connection.close()


async def test_a_queues_maximum_time_queued_is_set_changed_and_removed(
        admin: QueueStoreUnderTest) -> None:
    name = f"q-{uuid.uuid4().hex[:8]}"
    created = await call(admin, "POST", "/api/v1/queues",
                         {"name": name, "max_queued": {"seconds": 600}})
    assert created.status == 201, created.body
    assert created.body["max_queued"] == {"seconds": 600.0, "action": "fail"}
    patched = await call(admin, "PATCH", f"/api/v1/queues/{name}",
                         {"max_queued": {"action": "delete"}})
    assert patched.body["max_queued"] == {"seconds": 600.0, "action": "delete"}
    refused = await call(admin, "PATCH", f"/api/v1/queues/{name}",
                         {"max_queued": {"seconds": -1}})
    assert refused.status == 400 and "max_queued.seconds" in refused.body["error"]
    removed = await call(admin, "PATCH", f"/api/v1/queues/{name}", {"max_queued": None})
    assert removed.body["max_queued"] is None
    assert (await call(admin, "GET", f"/api/v1/queues/{name}")).body["max_queued"] is None


async def test_job_sets_are_listed_with_their_pods_by_state_and_described(
        admin: QueueStoreUnderTest) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    await add_jobs(admin.postgres_dsn,
                   ("c1", "a-0", queue, "alive", "queued"),
                   ("c2", "a-1", queue, "alive", "running"),
                   ("c1", "a-2", queue, "alive", "succeeded"),
                   ("c1", "d-0", queue, "done", "succeeded"))
    listed = await call(admin, "GET", f"/api/v1/jobsets?queue={queue}")
    assert listed.status == 200, listed.body
    (alive,) = listed.body["jobsets"]
    assert alive["jobset"] == "alive" and alive["clusters"] == ["c1", "c2"]
    assert alive["by_state"] == {"queued": 1, "running": 1, "succeeded": 1}
    assert (alive["pods"], alive["unfinished"]) == (3, 2)
    assert alive["oldest_queued_at"] is not None
    everything = await call(admin, "GET", f"/api/v1/jobsets?queue={queue}&all=true")
    assert [s["jobset"] for s in everything.body["jobsets"]] == ["alive", "done"]

    described = await call(admin, "GET", f"/api/v1/jobsets/{queue}/alive")
    assert [j["name"] for j in described.body["jobs"]] == ["a-0", "a-1", "a-2"]
    missing = await call(admin, "GET", f"/api/v1/jobsets/{queue}/nope")
    assert missing.status == 404 and "lockgate jobset list --queue" in missing.body["error"]


async def test_explain_and_status_are_the_leaders_picture(admin: QueueStoreUnderTest) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    assert (await call(admin, "POST", "/api/v1/queues", {"name": queue})).status == 201
    cluster = f"c-{uuid.uuid4().hex[:6]}"  # no node ever seen there
    await add_jobs(admin.postgres_dsn, (cluster, "w-0", queue, "js", "queued"),
                   (cluster, "w-1", queue, "js", "queued"))

    async def explained() -> Reply | None:
        answer = await call(admin, "GET", f"/api/v1/explain/{cluster}/ns/w-1")
        assert answer.status == 200, answer.body
        return answer if answer.body["explanation"] is not None else None
    # The leader reads the new rows through its change feed and runs a round on them.
    answer = await eventually(explained, within=30, every=0.2, what="the leader's reason")
    explanation = answer.body["explanation"]
    assert explanation["reason"] == "no_nodes"
    assert (explanation["position"], explanation["queued_in_queue"]) == (2, 2)
    assert (answer.body["position"], answer.body["queued_in_queue"]) == (2, 2)  # Postgres's
    assert answer.body["message"].startswith(f'queue "{queue}", position 2 of 2')
    assert answer.body["leader"]["round"]["number"] >= 1

    async def status_with_queue() -> dict[str, Any] | None:
        status = await call(admin, "GET", "/api/v1/status")
        return next((q for q in status.body["queues"] if q["queue"] == queue
                     and q["queued"] == 2), None)
    mine = await eventually(status_with_queue, within=30, every=0.2, what="the queue's status")
    assert (mine["queued"], mine["running"], mine["weight"]) == (2, 0, 1.0)
    assert mine["fair_share"] is not None and "outcome_last_round" in mine  # the round's own
    assert mine["oldest_wait_seconds"] >= 3600 - 120
    # ISO 8601, as every other time the API gives (issue 38: it was epoch seconds).
    assert datetime.fromisoformat(mine["oldest_queued_at"]) < datetime.now(UTC)

    missing = await call(admin, "GET", f"/api/v1/explain/{cluster}/ns/nobody")
    assert missing.status == 404 and "lockgate.io/queue" in missing.body["error"]


async def test_jobs_list_unfinished_jobs_with_the_leaders_reason_and_a_total(
        admin: QueueStoreUnderTest) -> None:
    """Issue 38, item 4: ended jobs only with all=true, a total beyond the limit, and REASON the
    leader's for a queued job (not an empty last_reason)."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    assert (await call(admin, "POST", "/api/v1/queues", {"name": queue})).status == 201
    cluster = f"c-{uuid.uuid4().hex[:6]}"  # no node ever seen there
    await add_jobs(admin.postgres_dsn, (cluster, "done-0", queue, "js", "succeeded"),
                   (cluster, "wait-0", queue, "js", "queued"),
                   (cluster, "run-0", queue, "js", "running"))

    async def listed() -> Reply | None:
        answer = await call(admin, "GET", f"/api/v1/jobs?queue={queue}")
        assert answer.status == 200, answer.body
        return answer if answer.body["jobs"][0]["reason"] is not None else None
    answer = await eventually(listed, within=30, every=0.2, what="the leader's reason")
    assert [(j["name"], j["reason"]) for j in answer.body["jobs"]] == [
        ("wait-0", "no_nodes"), ("run-0", None)]
    assert answer.body["jobs"][0]["last_reason"] == ""
    assert (answer.body["total"], answer.body["reasons_unavailable"]) == (2, None)
    cut = await call(admin, "GET", f"/api/v1/jobs?queue={queue}&limit=1")
    assert ([j["name"] for j in cut.body["jobs"]], cut.body["total"]) == (["wait-0"], 2)
    everything = await call(admin, "GET", f"/api/v1/jobs?queue={queue}&all=true")
    assert [j["name"] for j in everything.body["jobs"]] == ["done-0", "wait-0", "run-0"]
    assert everything.body["total"] == 3
    ended = await call(admin, "GET", f"/api/v1/jobs?queue={queue}&state=succeeded")
    assert [j["name"] for j in ended.body["jobs"]] == ["done-0"]
    # Issue 38, item 7: "not waiting: the pod is succeeded".
    done = await call(admin, "GET", f"/api/v1/explain/{cluster}/ns/done-0")
    assert done.body["message"] == "not waiting: the pod succeeded", done.body


async def test_with_the_leader_stopped_the_views_say_no_leader_never_an_old_reason(
        served: Served) -> None:
    """Stop the scheduler mid-run: status, explain and the UI's pages must say the reasons are
    unavailable (with Postgres's counts and places), not keep the last leader's answer."""
    admin = served.store
    queue = f"q-{uuid.uuid4().hex[:8]}"
    assert (await call(admin, "POST", "/api/v1/queues", {"name": queue})).status == 201
    cluster = f"c-{uuid.uuid4().hex[:6]}"
    await add_jobs(admin.postgres_dsn, *[(cluster, f"s-{i}", queue, "js", "queued")
                                         for i in range(3)])

    async def led() -> Reply | None:
        answer = await call(admin, "GET", f"/api/v1/explain/{cluster}/ns/s-2")
        return answer if answer.body["explanation"] is not None else None
    await eventually(led, within=30, every=0.2, what="the leader's reason")
    await served.scheduler.kill()  # mid-run, as a crash: nothing said goodbye

    explained = await call(admin, "GET", f"/api/v1/explain/{cluster}/ns/s-2")
    assert explained.status == 200
    assert explained.body["explanation"] is None and explained.body["leader"] is None
    assert explained.body["reasons_unavailable"]
    assert (explained.body["position"], explained.body["queued_in_queue"]) == (3, 3)
    assert "why it waits is unavailable" in explained.body["message"]
    assert "no fair-scheduler leader" in explained.body["message"]

    status = await call(admin, "GET", "/api/v1/status")
    assert status.body["leader"] is None and "no fair-scheduler leader" in status.body[
        "reasons_unavailable"]
    mine = next(q for q in status.body["queues"] if q["queue"] == queue)
    assert (mine["queued"], mine["fair_share"], mine["actual_share"]) == (3, None, None)

    page = await call(admin, "GET", f"/api/v1/queues/{queue}/waiting")
    assert page.body["leader"] is None and page.body["reasons_unavailable"]
    assert [p["position"] for p in page.body["pods"]] == [1, 2, 3]
    assert all(p["reason"] is None and "unavailable" in p["message"]
               for p in page.body["pods"])
    pod = await call(admin, "GET", f"/api/v1/pods/{cluster}/ns/s-0")
    assert pod.body["explanation"] is None and pod.body["reasons_unavailable"]
    fairness = await call(admin, "GET", "/api/v1/fairness")
    assert fairness.body["source"] == "postgres" and fairness.body["leader"] is None
    assert all(q["fair_share"] is None for q in fairness.body["report"]["queues"])
