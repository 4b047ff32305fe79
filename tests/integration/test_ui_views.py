"""The web UI's paged views, served by a real queue-store process over a fresh database, with a
real fair-scheduler leader whose picture gives the waiting reasons.

Job, node and eviction rows are written straight into Postgres (what queue-store and the
scheduler would have written); the views only read them. Every answer is checked against a
model the test computes from the rows it wrote: release order, pages, counts, sums.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import pytest

from helpers.postgres import fresh_database
from helpers.queue_store import QueueStoreUnderTest
from helpers.services import scheduler_process, scheduler_urls
from helpers.waiting import eventually
from lockgate_adapters import job_views

pytestmark = [pytest.mark.timeout(180)]

QUEUE, OTHER = "ui-q", "ui-other"
CLUSTERS = ("ui-c1", "ui-c2")
START = datetime(2026, 1, 1, tzinfo=UTC)


def _uid(i: int) -> str:
    return str(uuid.UUID(int=i + 1))


# (cluster, uid, name, queue, jobset, priority, state, created_at, cpu millicores)
ROWS: list[tuple[str, str, str, str, str, int, str, datetime, int]] = (
    [(CLUSTERS[i % 2], _uid(i), f"w-{i}", QUEUE, f"js-{i % 7}", 5 if i % 5 == 0 else 0,
      "queued", START + timedelta(seconds=(i * 37) % 211), 500) for i in range(130)]
    + [(CLUSTERS[i % 2], _uid(1000 + i), f"r-{i}", (QUEUE, OTHER)[i % 2], f"js-{i % 7}", 0,
        "running", START, 2000) for i in range(10)]
    + [(CLUSTERS[0], _uid(2000 + i), f"done-{i}", QUEUE, "js-finished", 0, "succeeded", START,
        100) for i in range(4)]
)
# Replacements that kept a deleted pod's place (lockgate.places): they are in line from the
# place's time, earlier than their own creation, and the scheduler orders them from it.
KEPT_PLACES = {f"w-{i}": START - timedelta(seconds=i) for i in range(3, 130, 11)}


@pytest.fixture(scope="module")
async def served(pg_dsn: str, kafka_bootstrap: str) -> AsyncIterator[QueueStoreUnderTest]:
    async with fresh_database(pg_dsn, prefix="ui_views_it") as dsn:
        spec = QueueStoreUnderTest(postgres_dsn=dsn, kafka_bootstrap=kafka_bootstrap)
        # Preemption stays off: it would evict the rows' running pods for the queued ones.
        scheduler = scheduler_process(f"fair-scheduler-ui-{spec.group_id}", postgres_dsn=dsn,
                                      kafka_bootstrap=kafka_bootstrap)
        process = await spec.start(f"queue-store-ui-{spec.group_id}", {
            **scheduler_urls(scheduler), "LOCKGATE_QUEUE_STORE_UI__SAMPLE_SECONDS": "0.5"})
        connection = await asyncpg.connect(dsn)
        try:
            await connection.executemany(
                "INSERT INTO jobs (cluster, uid, namespace, name, queue, jobset, priority,"
                " requests, state, created_at, node_name, running_at, queued_since) VALUES"
                " ($1, $2, 'ns', $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12)",
                [(c, u, n, q, js, p, json.dumps({"cpu": cpu}), s, at,
                  "node-0" if s == "running" else None, at if s == "running" else None,
                  KEPT_PLACES.get(n))
                 for c, u, n, q, js, p, s, at, cpu in ROWS])
            for i, cluster in enumerate((*CLUSTERS, CLUSTERS[0])):
                await connection.execute(
                    "INSERT INTO cluster_nodes (cluster, node, allocatable, unmanaged_usage,"
                    " schedulable, present, observed_at, labels, taints) VALUES ($1, $2,"
                    " $3::jsonb, '{\"cpu\": 250}'::jsonb, true, true, now(), '{}', '[]')",
                    cluster, f"node-{i}", json.dumps({"cpu": 16000, "memory": 2**36}))
            for i in range(3):
                await connection.execute(
                    "INSERT INTO evictions (eviction_id, cluster, uid, namespace, name, queue,"
                    " kind, action, for_queue, message, decided_at, decided_by) VALUES ($1,"
                    " $2, $3, 'ns', $4, $5, 'preempted', 'delete', $6, $7, $8, 'test')",
                    f"ev-{i}", CLUSTERS[i % 2], _uid(1000 + i), f"r-{i}", (QUEUE, OTHER)[i % 2],
                    OTHER, f"preempted for {OTHER} ({i})", START + timedelta(minutes=i))
            for name in (QUEUE, OTHER):
                await connection.execute(
                    # Cordoned: the leader explains the rows but releases none of them, so
                    # the model of what is queued stays true.
                    "INSERT INTO queues (name, namespaces, cordoned) VALUES ($1, '[]'::jsonb,"
                    " true)", name)
        finally:
            await connection.close()
        await scheduler.start()
        try:
            await scheduler.wait_ready()
            yield spec
        finally:
            scheduler_code = await scheduler.stop()
            code = await process.stop()
    assert code == 0, process.log_tail()
    assert scheduler_code == 0, scheduler.log_tail()


async def get(served: QueueStoreUnderTest, path: str, *, token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token or served.admin_token}"}
    async with aiohttp.ClientSession() as session, session.get(
            served.admin_url + path, headers=headers) as response:
        assert response.status == 200, (path, response.status, await response.text())
        return await response.json()


def release_order() -> list[str]:
    """The model: the queue's queued pods by priority (high first), then time in line (a kept
    place's, else its own creation), then key."""
    queued = [r for r in ROWS if r[3] == QUEUE and r[6] == "queued"]
    queued.sort(key=lambda r: (-r[5], KEPT_PLACES.get(r[2], r[7]), r[0], r[1]))
    return [r[2] for r in queued]


async def test_waiting_pages_walk_the_queue_in_release_order(
        served: QueueStoreUnderTest) -> None:
    expected = release_order()
    seen: list[str] = []
    for offset in range(0, len(expected), 50):
        page = await get(served, f"/api/v1/queues/{QUEUE}/waiting?offset={offset}&limit=50")
        assert page["total"] == len(expected) == page["queued_in_queue"]
        assert [p["position"] for p in page["pods"]] == list(
            range(offset + 1, offset + 1 + len(page["pods"])))
        seen += [p["name"] for p in page["pods"]]
    assert seen == expected
    # A filtered page keeps the positions of the whole queue; its reasons are the scheduler
    # leader's, once it has run a round over the rows.
    positions = {name: i + 1 for i, name in enumerate(expected)}

    async def filtered() -> Any:
        page = await get(served, f"/api/v1/queues/{QUEUE}/waiting?cluster={CLUSTERS[1]}"
                                 "&offset=10&limit=20")
        return page if page["leader"] and all(p["reason"] for p in page["pods"]) else None
    page = await eventually(filtered, within=30, every=0.2, what="a filtered page with reasons")
    ours = [n for n in expected if ROWS[int(n.split("-")[1])][0] == CLUSTERS[1]]
    assert page["total"] == len(ours)
    assert [p["name"] for p in page["pods"]] == ours[10:30]
    assert [p["position"] for p in page["pods"]] == [positions[n] for n in ours[10:30]]
    assert {p["reason"] for p in page["pods"]} == {"queue_cordoned"}, page["pods"][0]
    assert all(p["message"] for p in page["pods"])


async def test_job_sets_page_by_page_and_a_job_sets_pods(served: QueueStoreUnderTest) -> None:
    unfinished = sorted({r[4] for r in ROWS if r[3] == QUEUE and r[6] != "succeeded"})
    pages = [await get(served, f"/api/v1/jobsets?queue={QUEUE}&limit=3&offset={o}")
             for o in range(0, 9, 3)]
    names = [j["jobset"] for page in pages for j in page["jobsets"]]
    assert names == unfinished  # js-finished has none left: not listed
    everything = await get(served, f"/api/v1/jobsets?queue={QUEUE}&all=true&limit=100")
    assert [j["jobset"] for j in everything["jobsets"]] == sorted([*unfinished, "js-finished"])
    js3 = next(j for j in everything["jobsets"] if j["jobset"] == "js-3")
    model = [r for r in ROWS if r[3] == QUEUE and r[4] == "js-3"]
    assert js3["pods"] == len(model)
    assert js3["by_state"] == {s: sum(1 for r in model if r[6] == s) for s in {r[6] for r in model}}
    body = await get(served, f"/api/v1/jobsets/{QUEUE}/js-3/pods?state=queued&limit=5&offset=5")
    queued = sorted((r for r in model if r[6] == "queued"), key=lambda r: (r[7], r[0], r[1]))
    assert body["total"] == len(queued)
    assert [p["name"] for p in body["pods"]] == [r[2] for r in queued[5:10]]
    for cluster in CLUSTERS:
        assert body["counts"][cluster] == {
            s: n for s in ("queued", "running")
            if (n := sum(1 for r in model if r[0] == cluster and r[6] == s))}


async def test_clusters_sum_capacity_and_what_each_queue_holds(
        served: QueueStoreUnderTest) -> None:
    found = {c["name"]: c for c in (await get(served, "/api/v1/clusters"))["clusters"]}
    assert found[CLUSTERS[0]]["nodes"] == 2 and found[CLUSTERS[1]]["nodes"] == 1
    assert found[CLUSTERS[0]]["capacity"] == {"cpu": 32000, "memory": 2 * 2**36}
    assert found[CLUSTERS[0]]["unmanaged"] == {"cpu": 500}
    for cluster in CLUSTERS:
        for entry in found[cluster]["queues"]:
            rows = [r for r in ROWS if r[0] == cluster and r[3] == entry["queue"]]
            assert entry["pods"] == sum(1 for r in rows if r[6] == "running")
            assert entry["queued"] == sum(1 for r in rows if r[6] == "queued")
            assert entry["holding"].get("cpu", 0) == sum(r[8] for r in rows
                                                         if r[6] == "running")


async def test_evictions_newest_first_and_a_pods_journey(served: QueueStoreUnderTest) -> None:
    body = await get(served, "/api/v1/evictions?limit=2")
    assert body["total"] == 3
    assert [e["eviction_id"] for e in body["evictions"]] == ["ev-2", "ev-1"]
    ours = await get(served, f"/api/v1/evictions?queue={QUEUE}")
    assert [e["eviction_id"] for e in ours["evictions"]] == ["ev-2", "ev-0"]
    pod = await get(served, f"/api/v1/pods/{CLUSTERS[0]}/ns/r-0")
    assert [s["step"] for s in pod["journey"] if s["reached"]] == ["created", "queued", "bound"]
    assert pod["eviction"]["eviction_id"] == "ev-0"
    assert pod["trace_id"] == _uid(1000).replace("-", "")
    assert pod["message"].startswith("not waiting")


async def test_a_read_only_token_reads_every_list(served: QueueStoreUnderTest) -> None:
    reader = served.read_only_token
    assert (await get(served, "/api/v1/whoami", token=reader))["role"] == "read-only"
    spec = await get(served, "/api/v1/openapi.json")
    lists = [path for path, ops in spec["paths"].items() if "get" in ops and "{" not in path]
    assert "/api/v1/evictions" in lists and "/api/v1/clusters" in lists

    async def sampled() -> bool:
        async with aiohttp.ClientSession() as session, session.get(
                served.admin_url + "/api/v1/fairness",
                headers={"Authorization": f"Bearer {reader}"}) as response:
            return response.status == 200
    await eventually(sampled, within=30, what="the first fairness sample")
    for path in lists:
        await get(served, path, token=reader)  # every list answers a read-only token


async def test_the_overview_leaves_out_each_queues_clusters_and_a_queues_page_asks_for_its_own(
        served: QueueStoreUnderTest) -> None:
    """Every queue in every cluster is queues x clusters numbers (100,000 at fleet scale): the
    overview and `status` carry each queue's own figures; `?clusters=1` (`status -o wide`, a
    queue's page with `?queue=`) adds its target and share in each cluster, the leader's."""
    async def from_leader() -> Any:
        answer = await get(served, "/api/v1/fairness")
        return answer if answer["source"] == "leader" else None
    overview = await eventually(from_leader, within=30, every=0.2, what="the leader's report")
    per_cluster_keys = {"cluster_targets", "cluster_shares", "clusters"}
    queues = overview["report"]["queues"]
    assert QUEUE in {q["queue"] for q in queues}
    assert all(not per_cluster_keys & set(q) for q in queues), queues[0]
    status = await get(served, "/api/v1/status")
    assert all(not per_cluster_keys & set(q) for q in status["queues"])

    page = await get(served, f"/api/v1/fairness?clusters=1&queue={QUEUE}")
    (mine,) = page["report"]["queues"]
    assert mine["queue"] == QUEUE and {"cluster_targets", "cluster_shares"} <= set(mine)
    wide = await get(served, "/api/v1/status?clusters=1")
    assert all({"cluster_targets", "cluster_shares"} <= set(q) for q in wide["queues"])
    # Otherwise the same standing.
    assert {q["queue"]: q["weight"] for q in wide["queues"]} == {
        q["queue"]: q["weight"] for q in status["queues"]}


async def test_places_asked_many_at_once_are_each_pods_place_in_release_order(
        served: QueueStoreUnderTest) -> None:
    """`job_views.queued_places` (the leader's places for the pods it tells why they wait)
    against the model and against `queued_place`, which `explain` and the pod page read: one
    place in line, whoever asks. Pods not queued are missing."""
    expected = release_order()
    by_name = {r[2]: r for r in ROWS}
    asked = [by_name[name] for name in expected[::7]] + [
        r for r in ROWS if r[6] != "queued"][:5]
    connection = await asyncpg.connect(served.postgres_dsn)
    try:
        places = await job_views.queued_places(
            connection, [(r[0], r[1]) for r in asked] + [(CLUSTERS[0], "no-such-uid")])
        assert places == {(r[0], r[1]): (expected.index(r[2]) + 1, len(expected))
                          for r in asked if r[6] == "queued"}
        for r in asked[:6]:
            row = await job_views.find_job(connection, cluster=r[0], namespace="ns", name=r[2])
            assert row is not None
            assert await job_views.queued_place(connection, row) == places[(r[0], r[1])]
    finally:
        await connection.close()
