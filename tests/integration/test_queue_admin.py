"""Queues before pods: the admin API served by queue-store, and the `lockgate` CLI over it.

queue-store runs as a real process on a fresh database of this module; the API is exercised
over HTTP with aiohttp and the CLI as the installed `lockgate` command. Each test uses queue
names of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from devstack.config import Settings
from helpers.postgres import fresh_database
from helpers.queue_store import QueueStoreUnderTest
from helpers.services import FAST_RETRY
from helpers.waiting import eventually
from lockgate.events import (
    CLUSTER_CAPACITY,
    POD_EVENTS,
    ClusterCapacity,
    NodeCapacity,
    PodEvent,
)
from lockgate.jobs import JobState
from lockgate.queues import DEFAULT_ALLOWED_KINDS
from lockgate_adapters.kafka import make_producer, publish_many
from lockgate_adapters.postgres import CHANGES_CHANNEL, connect_pool

# Generous: each CLI call is a process of its own, slow to start on a loaded machine.
pytestmark = [pytest.mark.timeout(420)]

LOCKGATE_CLI = Path(sys.executable).parent / "lockgate"


@pytest.fixture(scope="module")
async def admin(pg_dsn: str, kafka_bootstrap: str) -> AsyncIterator[QueueStoreUnderTest]:
    async with fresh_database(pg_dsn, prefix="queue_admin_it") as dsn:
        spec = QueueStoreUnderTest(postgres_dsn=dsn, kafka_bootstrap=kafka_bootstrap)
        process = await spec.start(f"queue-store-admin-{spec.group_id}")
        try:
            yield spec
        finally:
            code = await process.stop()
    assert code == 0, process.log_tail()


@pytest.fixture(scope="module")
async def db(admin: QueueStoreUnderTest) -> AsyncIterator[asyncpg.Pool]:
    pool = await connect_pool(admin.postgres_dsn, policy=FAST_RETRY)
    yield pool
    await pool.close()


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


@dataclass
class Reply:
    status: int
    body: Any


async def call(admin: QueueStoreUnderTest, method: str, path: str,
               body: Any = None, *, raw: bytes | None = None,
               token: str | None = "admin") -> Reply:
    """A call with the admin token, the read-only one (`token="read-only"`), none (None) or
    whatever other string `token` is."""
    headers = {"Content-Type": "application/json"}
    bearer = {"admin": admin.admin_token, "read-only": admin.read_only_token}.get(
        token or "", token)
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    async with aiohttp.ClientSession() as session, session.request(
            method, admin.admin_url + path,
            data=raw if raw is not None else (None if body is None else json.dumps(body)),
            headers=headers) as response:
        text = await response.text()
        return Reply(response.status, json.loads(text) if text else None)


# The HTTP API ---------------------------------------------------------------------------------

async def test_create_get_list_update_and_delete_a_queue(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    created = await call(admin, "POST", "/api/v1/queues", {
        "name": queue_name, "priority_factor": 0.5, "resource_limits": {"cpu": "100",
                                                                        "memory": "1Ti"}})
    assert created.status == 201, created.body
    assert created.body["weight"] == 2.0
    assert created.body["resource_limits"] == {"cpu": "100", "memory": "1Ti"}
    assert created.body["cordoned"] is False

    fetched = await call(admin, "GET", f"/api/v1/queues/{queue_name}")
    assert (fetched.status, fetched.body["priority_factor"]) == (200, 0.5)
    listed = await call(admin, "GET", "/api/v1/queues")
    assert queue_name in [q["name"] for q in listed.body["queues"]]

    patched = await call(admin, "PATCH", f"/api/v1/queues/{queue_name}", {
        "cordoned": True, "resource_limits": {"memory": None, "nvidia.com/gpu": "8"}})
    assert patched.status == 200, patched.body
    assert patched.body["cordoned"] is True
    assert patched.body["priority_factor"] == 0.5  # untouched by the patch
    assert patched.body["resource_limits"] == {"cpu": "100", "nvidia.com/gpu": "8"}

    replaced = await call(admin, "PUT", f"/api/v1/queues/{queue_name}",
                          {"priority_factor": 4})
    assert replaced.status == 200, replaced.body
    assert (replaced.body["priority_factor"], replaced.body["weight"],
            replaced.body["cordoned"], replaced.body["resource_limits"]) == (4, 0.25, False, {})

    deleted = await call(admin, "DELETE", f"/api/v1/queues/{queue_name}")
    assert deleted.status == 204
    assert (await call(admin, "GET", f"/api/v1/queues/{queue_name}")).status == 404
    listed = await call(admin, "GET", "/api/v1/queues")
    assert queue_name not in [q["name"] for q in listed.body["queues"]]


async def test_a_call_without_a_token_is_refused_and_told_how_to_authenticate(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    for method, path, body in (("GET", "/api/v1/queues", None),
                               ("GET", "/api/v1/jobs", None),
                               ("POST", "/api/v1/queues", {"name": queue_name})):
        async with aiohttp.ClientSession() as session, session.request(
                method, admin.admin_url + path, json=body) as response:
            assert response.status == 401, (method, path)
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="lockgate"'
            error = (await response.json())["error"]
        assert "Authorization: Bearer <token>" in error and "LOCKGATE_TOKEN" in error
    assert (await call(admin, "GET", f"/api/v1/queues/{queue_name}")).status == 404  # not made


async def test_a_wrong_token_is_refused(admin: QueueStoreUnderTest, queue_name: str) -> None:
    for wrong in ("lgt_not-a-token", admin.admin_token + "x", admin.admin_token[:-1]):
        reply = await call(admin, "POST", "/api/v1/queues", {"name": queue_name}, token=wrong)
        assert reply.status == 401, reply.body
        assert "the token is not valid" in reply.body["error"]
        assert (await call(admin, "GET", "/api/v1/queues", token=wrong)).status == 401
    async with aiohttp.ClientSession() as session, session.get(
            admin.admin_url + "/api/v1/queues",
            headers={"Authorization": f"Basic {admin.admin_token}"}) as response:
        assert response.status == 401  # only the bearer scheme counts
    assert (await call(admin, "GET", f"/api/v1/queues/{queue_name}")).status == 404


async def test_a_read_only_token_reads_but_does_not_write(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    assert (await call(admin, "POST", "/api/v1/queues", {"name": queue_name})).status == 201
    listed = await call(admin, "GET", "/api/v1/queues", token="read-only")
    assert listed.status == 200 and queue_name in [q["name"] for q in listed.body["queues"]]
    assert (await call(admin, "GET", f"/api/v1/queues/{queue_name}",
                       token="read-only")).status == 200
    assert (await call(admin, "GET", "/api/v1/jobs", token="read-only")).status == 200

    for method, path, body in (
            ("POST", "/api/v1/queues", {"name": f"{queue_name}-2"}),
            ("PATCH", f"/api/v1/queues/{queue_name}", {"cordoned": True}),
            ("PUT", f"/api/v1/queues/{queue_name}", {"priority_factor": 3}),
            ("DELETE", f"/api/v1/queues/{queue_name}", None)):
        refused = await call(admin, method, path, body, token="read-only")
        assert refused.status == 403, (method, refused.body)
        assert refused.body["error"] == (f"token 'test-reader' is read-only: {method} {path} "
                                         "needs an admin token")
    unchanged = await call(admin, "GET", f"/api/v1/queues/{queue_name}")
    assert (unchanged.body["cordoned"], unchanged.body["priority_factor"]) == (False, 1)
    assert (await call(admin, "GET", f"/api/v1/queues/{queue_name}-2")).status == 404


async def test_namespace_bindings_default_to_none_are_validated_and_replaced_whole(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    created = await call(admin, "POST", "/api/v1/queues", {"name": queue_name})
    assert (created.status, created.body["namespaces"]) == (201, [])  # usable by no namespace

    bound = await call(admin, "PATCH", f"/api/v1/queues/{queue_name}", {"namespaces": [
        {"cluster": "cluster-a", "names": ["team-a"]},
        {"selector": {"matchExpressions": [{"key": "team", "operator": "In",
                                            "values": ["a"]}]}}]})
    assert bound.status == 200, bound.body
    assert bound.body["namespaces"][0] == {"cluster": "cluster-a", "names": ["team-a"]}
    assert bound.body["namespaces"][1]["cluster"] == "*"

    replaced = await call(admin, "PATCH", f"/api/v1/queues/{queue_name}",
                          {"namespaces": [{"names": ["team-b"]}]})
    assert replaced.body["namespaces"] == [{"cluster": "*", "names": ["team-b"]}]
    fetched = await call(admin, "GET", f"/api/v1/queues/{queue_name}")
    assert fetched.body["namespaces"] == replaced.body["namespaces"]

    for binding, error in (({"cluster": "*"}, "needs names, a selector, or both"),
                           ({"selector": {}}, "an empty selector would match every namespace")):
        refused = await call(admin, "PATCH", f"/api/v1/queues/{queue_name}",
                             {"namespaces": [binding]})
        assert refused.status == 400 and error in refused.body["error"], refused.body


async def test_queue_writes_follow_the_change_feed_rules(
        admin: QueueStoreUnderTest, db: asyncpg.Pool, queue_name: str) -> None:
    notified: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(admin.postgres_dsn)
    try:
        await listener.add_listener(CHANGES_CHANNEL,
                                    lambda *args: notified.put_nowait(str(args[-1])))
        serials = []
        for method, path, body in (
                ("POST", "/api/v1/queues", {"name": queue_name}),
                ("PATCH", f"/api/v1/queues/{queue_name}", {"priority_factor": 3}),
                ("DELETE", f"/api/v1/queues/{queue_name}", None)):
            reply = await call(admin, method, path, body)
            assert reply.status < 300, reply.body
            assert await asyncio.wait_for(notified.get(), timeout=10) == "queues"
            serials.append(await db.fetchval("SELECT serial FROM queues WHERE name = $1",
                                             queue_name))
        assert serials == sorted(set(serials)), "each change takes a new, higher serial"
        tombstone = await db.fetchrow("SELECT deleted FROM queues WHERE name = $1", queue_name)
        assert tombstone["deleted"] is True

        unchanged = await call(admin, "POST", "/api/v1/queues", {"name": queue_name})
        assert unchanged.status == 201, "a deleted queue's name can be used again"
        assert unchanged.body["priority_factor"] == 1.0
    finally:
        await listener.close()


@pytest.mark.parametrize(("body", "message"), [
    ({"priority_factor": 0}, "priority_factor: Input should be greater than 0"),
    ({"priority_factor": -2}, "priority_factor"),
    ({"priority_factor": "fast"}, "priority_factor"),
    ({"resource_limits": {"cpu": "lots"}}, "resource limit cpu: invalid quantity 'lots'"),
    ({"colour": "blue"}, "colour"),
])
async def test_invalid_queues_are_refused_with_a_message(
        admin: QueueStoreUnderTest, queue_name: str, body: dict[str, Any],
        message: str) -> None:
    reply = await call(admin, "POST", "/api/v1/queues", {"name": queue_name, **body})
    assert reply.status == 400, reply.body
    assert message in reply.body["error"], reply.body
    assert (await call(admin, "GET", f"/api/v1/queues/{queue_name}")).status == 404


async def test_bad_names_bodies_duplicates_and_unknown_queues(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    bad_name = await call(admin, "POST", "/api/v1/queues", {"name": "Not_Valid"})
    assert bad_name.status == 400 and "queue name 'Not_Valid' is invalid" in bad_name.body["error"]
    no_name = await call(admin, "POST", "/api/v1/queues", {"priority_factor": 2})
    assert no_name.status == 400 and "name" in no_name.body["error"]
    not_json = await call(admin, "POST", "/api/v1/queues", raw=b"{nope")
    assert not_json.status == 400 and "not valid JSON" in not_json.body["error"]

    assert (await call(admin, "POST", "/api/v1/queues", {"name": queue_name})).status == 201
    duplicate = await call(admin, "POST", "/api/v1/queues", {"name": queue_name})
    assert duplicate.status == 409
    assert duplicate.body["error"] == f"queue '{queue_name}' already exists"
    renamed = await call(admin, "PUT", f"/api/v1/queues/{queue_name}", {"name": "other"})
    assert renamed.status == 400
    bad_patch = await call(admin, "PATCH", f"/api/v1/queues/{queue_name}",
                           {"resource_limits": {"memory": "1Xi"}})
    assert bad_patch.status == 400 and "memory" in bad_patch.body["error"]

    missing = f"{queue_name}-missing"
    for method, body in (("GET", None), ("PUT", {}), ("PATCH", {"cordoned": True}),
                         ("DELETE", None)):
        reply = await call(admin, method, f"/api/v1/queues/{missing}", body)
        assert reply.status == 404, (method, reply.body)
        assert reply.body["error"] == f"queue '{missing}' does not exist"


# Jobs view ------------------------------------------------------------------------------------

async def three_jobs_of(admin: QueueStoreUnderTest, db: asyncpg.Pool, queue_name: str) -> None:
    """pod-0 (running), pod-1 and pod-2 (queued) of `queue_name`, created in that order."""
    cluster = f"admin-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    events = [PodEvent(event_id=uuid.uuid4().hex, cluster=cluster, namespace="team",
                       name=f"pod-{i}", uid=f"{cluster}-{i}",
                       state=JobState.RUNNING if i == 0 else JobState.QUEUED,
                       queue=queue_name, jobset="js", requests={"cpu": 100},
                       created_at=now - timedelta(seconds=10 - i), observed_at=now)
               for i in range(3)]
    producer = make_producer(admin.kafka_bootstrap, client_id="queue-admin-it")
    await producer.start()
    try:
        await publish_many(producer, POD_EVENTS, events)
    finally:
        await producer.stop()

    stored: list[int] = []

    async def all_stored() -> bool:
        stored.append(int(await db.fetchval("SELECT count(*) FROM jobs WHERE queue = $1",
                                            queue_name)))
        return stored[-1] == 3

    await eventually(all_stored, within=30, every=0.1,
                     what=lambda: f"3 jobs stored (have {stored[-1]})")


async def test_jobs_can_be_listed_by_queue_and_state_with_hints(
        admin: QueueStoreUnderTest, db: asyncpg.Pool, queue_name: str) -> None:
    await three_jobs_of(admin, db, queue_name)
    queued = await call(admin, "GET", f"/api/v1/jobs?queue={queue_name}&state=queued")
    assert queued.status == 200
    assert [j["name"] for j in queued.body["jobs"]] == ["pod-1", "pod-2"]
    assert queued.body["hints"] == [
        f"queue '{queue_name}' does not exist: its jobs wait until it is created"]

    await call(admin, "POST", "/api/v1/queues", {"name": queue_name, "cordoned": True})
    everything = await call(admin, "GET", f"/api/v1/jobs?queue={queue_name}&limit=2")
    assert [j["name"] for j in everything.body["jobs"]] == ["pod-0", "pod-1"]
    assert everything.body["total"] == 3  # the page is cut, and says so
    # No fair-scheduler here: the queued jobs' reasons are unavailable, and the answer says so.
    assert "why pods wait is unavailable" in everything.body["reasons_unavailable"]
    assert everything.body["hints"] == [
        f"queue '{queue_name}' is cordoned: none of its jobs are released"]

    bad_state = await call(admin, "GET", "/api/v1/jobs?state=sleeping")
    assert bad_state.status == 400 and "unknown state 'sleeping'" in bad_state.body["error"]


# The CLI --------------------------------------------------------------------------------------

@dataclass
class Ran:
    code: int
    out: str
    err: str


async def lockgate(admin: QueueStoreUnderTest, *args: str,
                   env: dict[str, str] | None = None) -> Ran:
    """The CLI with the admin token in $LOCKGATE_TOKEN, unless `env` says otherwise."""
    assert LOCKGATE_CLI.exists(), f"the lockgate command is not installed at {LOCKGATE_CLI}"
    environment = {"LOCKGATE_API": admin.admin_url, "PATH": "/usr/bin",
                   "LOCKGATE_TOKEN": admin.admin_token,
                   # A checkout run with another's venv (PYTHONPATH=libs:services) tests its own
                   # CLI through the installed command, as its services are its own.
                   **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    process = await asyncio.create_subprocess_exec(
        str(LOCKGATE_CLI), *args,
        env={**environment, **env} if env is not None else environment,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


async def test_the_cli_creates_updates_lists_and_deletes_queues(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    # A cluster this queue-store knows (the CLI refuses bindings to unknown ones): the shared
    # Kafka may already have told it of other tests' clusters, so it must know this one too.
    known = await a_cluster_reported(admin)
    created = await lockgate(admin, "queue", "create", queue_name, "--priority-factor", "0.5",
                             "--limit", "cpu=100", "--limit", "memory=1Ti",
                             "--namespace", "team-a")
    assert created.code == 0, created.err
    assert queue_name in created.out and "cpu=100,memory=1Ti" in created.out

    updated = await lockgate(admin, "queue", "update", queue_name, "--cordon",
                             "--remove-limit", "memory", "--limit", "cpu=200",
                             "--namespace", f"{known}/team-b",
                             "--namespace-selector", "lockgate.io/team=ml", "-o", "json")
    assert updated.code == 0, updated.err
    queue = json.loads(updated.out)
    assert (queue["cordoned"], queue["resource_limits"], queue["weight"]) == (
        True, {"cpu": "200"}, 2.0)
    # Bindings are added to those the queue has.
    assert [(b["cluster"], b["names"], (b.get("selector") or {}).get("matchLabels"))
            for b in queue["namespaces"]] == [
        ("*", ["team-a"], None), (known, ["team-b"], None),
        ("*", [], {"lockgate.io/team": "ml"})]

    listed = await lockgate(admin, "queue", "list", "-o", "json")
    assert listed.code == 0, listed.err
    assert queue_name in [q["name"] for q in json.loads(listed.out)]
    table = await lockgate(admin, "queue", "list")
    header, *rows = table.out.splitlines()
    assert header.split() == ["NAME", "PATH", "WEIGHT", "PRIORITY-FACTOR", "CORDONED",
                              "LIMITS", "GUARANTEE", "MAX-QUEUED", "NAMESPACES",
                              "ALLOWED-KINDS"]
    # A child of the root: its path is its name; no guarantee.
    assert [queue_name, queue_name, "2", "0.5", "yes", "cpu=200", "-", "-",
            f"*/team-a,{known}/team-b,*/lockgate.io/team=ml", "(default)"] in [
        row.split() for row in rows]
    cleared = await lockgate(admin, "queue", "update", queue_name, "--clear-namespaces",
                             "-o", "json")
    assert json.loads(cleared.out)["namespaces"] == []

    got = await lockgate(admin, "queue", "get", queue_name, "-o", "json")
    assert json.loads(got.out)["name"] == queue_name
    uncordoned = await lockgate(admin, "queue", "uncordon", queue_name, "-o", "json")
    assert json.loads(uncordoned.out)["cordoned"] is False
    cordoned = await lockgate(admin, "queue", "cordon", queue_name, "-o", "json")
    assert json.loads(cordoned.out)["cordoned"] is True

    deleted = await lockgate(admin, "queue", "delete", queue_name)
    assert (deleted.code, deleted.out.strip()) == (0, f"queue {queue_name} deleted")
    gone = await lockgate(admin, "queue", "get", queue_name)
    assert gone.code == 1
    assert f"queue '{queue_name}' does not exist (HTTP 404)" in gone.err


async def test_the_cli_reports_validation_errors_and_conflicts(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    bad_factor = await lockgate(admin, "queue", "create", queue_name, "--priority-factor", "0")
    assert bad_factor.code == 2
    assert bad_factor.err.startswith("lockgate queue create: Invalid value for "
                                     "'--priority-factor'"), bad_factor.err
    bad_quantity = await lockgate(admin, "queue", "create", queue_name, "--limit", "cpu=lots")
    assert bad_quantity.code == 1 and "invalid quantity 'lots'" in bad_quantity.err
    bad_limit = await lockgate(admin, "queue", "create", queue_name, "--limit", "cpu")
    assert bad_limit.code == 2 and "RESOURCE=QUANTITY" in bad_limit.err

    assert (await lockgate(admin, "queue", "create", queue_name)).code == 0
    duplicate = await lockgate(admin, "queue", "create", queue_name)
    assert duplicate.code == 1
    assert f"queue '{queue_name}' already exists (HTTP 409)" in duplicate.err
    nothing = await lockgate(admin, "queue", "update", queue_name)
    assert nothing.code == 2 and "lockgate queue update: nothing to update" in nothing.err
    unknown = await lockgate(admin, "queue", "delete", f"{queue_name}-missing")
    assert unknown.code == 1 and "(HTTP 404)" in unknown.err


async def test_the_cli_takes_its_token_from_the_environment_or_a_file(
        admin: QueueStoreUnderTest, queue_name: str, tmp_path: Path) -> None:
    no_token = await lockgate(admin, "queue", "list", env={"LOCKGATE_TOKEN": ""})
    assert no_token.code == 1
    assert "authentication required" in no_token.err and "(HTTP 401)" in no_token.err

    reader_file = tmp_path / "reader-token"
    reader_file.write_text(admin.read_only_token + "\n")
    by_file = {"LOCKGATE_TOKEN": "", "LOCKGATE_TOKEN_FILE": str(reader_file)}
    assert (await lockgate(admin, "queue", "list", env=by_file)).code == 0
    refused = await lockgate(admin, "queue", "create", queue_name, env=by_file)
    assert refused.code == 1
    assert "is read-only" in refused.err and "(HTTP 403)" in refused.err

    admin_file = tmp_path / "admin-token"
    admin_file.write_text(admin.admin_token)
    # --token-file wins over $LOCKGATE_TOKEN (here the read-only token).
    created = await lockgate(admin, "--token-file", str(admin_file), "queue", "create",
                             queue_name, env={"LOCKGATE_TOKEN": admin.read_only_token})
    assert created.code == 0, created.err

    wrong = await lockgate(admin, "queue", "list", env={"LOCKGATE_TOKEN": "lgt_wrong"})
    assert wrong.code == 1 and "the token is not valid" in wrong.err
    missing = await lockgate(admin, "--token-file", str(tmp_path / "nope"), "queue", "list")
    assert missing.code == 1 and "cannot read the token file" in missing.err


async def test_a_minted_token_works_once_its_line_is_configured(
        pg_dsn: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    minted = await lockgate(QueueStoreUnderTest(postgres_dsn=pg_dsn,
                                                kafka_bootstrap=kafka_bootstrap),
                            "token", "new", "alice", "--role", "admin")
    assert minted.code == 0, minted.err
    token = minted.out.splitlines()[0].rsplit(" ", 1)[1]
    line = minted.out.splitlines()[1].split(": ", 1)[1]
    assert line.startswith("alice admin sha256:") and token not in line
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"# who role hash\n{line}\n")
    async with fresh_database(pg_dsn, prefix="queue_admin_tokens") as dsn:
        spec = QueueStoreUnderTest(postgres_dsn=dsn, kafka_bootstrap=kafka_bootstrap)
        process = await spec.start(f"queue-store-tokens-{spec.group_id}", env={
            "LOCKGATE_QUEUE_STORE_ADMIN_TOKENS": "[]",
            "LOCKGATE_QUEUE_STORE_ADMIN_TOKENS_FILE": str(tokens_file)})
        try:
            assert (await call(spec, "POST", "/api/v1/queues", {"name": "minted"},
                               token=token)).status == 201
            assert (await call(spec, "GET", "/api/v1/queues")).status == 401  # not configured
        finally:
            assert await process.stop() == 0, process.log_tail()
    assert "queue minted created (priority factor 1.0) by alice" in process.log_tail(100)


async def test_the_cli_says_where_it_could_not_reach_the_api(
        admin: QueueStoreUnderTest) -> None:
    unreachable = await lockgate(admin, "--api", "http://127.0.0.1:9", "queue", "list")
    assert unreachable.code == 1
    assert unreachable.err.startswith(
        "lockgate queue list: cannot reach the lockgate API at http://127.0.0.1:9"), \
        unreachable.err


async def test_the_cli_lists_jobs_of_a_queue(
        admin: QueueStoreUnderTest, db: asyncpg.Pool, queue_name: str) -> None:
    await three_jobs_of(admin, db, queue_name)
    await call(admin, "POST", "/api/v1/queues", {"name": queue_name, "cordoned": True})
    listed = await lockgate(admin, "jobs", "list", "--queue", queue_name, "--state", "queued")
    assert listed.code == 0, listed.err
    lines = listed.out.splitlines()
    assert lines[0].split()[:6] == ["CLUSTER", "NAMESPACE", "NAME", "QUEUE", "JOBSET", "STATE"]
    assert [line.split()[2] for line in lines[1:3]] == ["pod-1", "pod-2"]
    assert lines[-1] == f"note: queue '{queue_name}' is cordoned: none of its jobs are released"

    cut = await lockgate(admin, "jobs", "list", "--queue", queue_name, "--limit", "1")
    assert cut.code == 0, cut.err
    assert [line.split()[2] for line in cut.out.splitlines()[1:2]] == ["pod-0"]
    assert "note: showing 1 of 3 (--limit for more)" in cut.out.splitlines()

    nothing = await lockgate(admin, "jobs", "list", "--queue", f"{queue_name}-x")
    assert nothing.out.splitlines() == [
        f"no unfinished jobs with queue={queue_name}-x (--all for those that ended)",
        f"note: queue '{queue_name}-x' does not exist: its jobs wait until it is created"]


async def test_allowed_kinds_default_are_validated_patched_and_restored(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    created = await call(admin, "POST", "/api/v1/queues", {"name": queue_name})
    assert created.status == 201, created.body
    assert (created.body["allowed_kinds"], created.body["allowed_kinds_default"]) == (
        list(DEFAULT_ALLOWED_KINDS), True)
    # Patching something else keeps the default a default (it may change with lockgate).
    other = await call(admin, "PATCH", f"/api/v1/queues/{queue_name}", {"cordoned": True})
    assert other.body["allowed_kinds_default"] is True

    narrowed = await call(admin, "PATCH", f"/api/v1/queues/{queue_name}",
                          {"allowed_kinds": ["services", "pods", "jobs.batch"]})
    assert narrowed.status == 200, narrowed.body
    assert (narrowed.body["allowed_kinds"], narrowed.body["allowed_kinds_default"]) == (
        ["jobs.batch", "pods", "services"], False)

    for kinds, error in ((["*"], "no wildcards"), (["pods/exec"], "no subresources"),
                         (["namespaces"], "cluster-scoped"), ([], "at least one")):
        refused = await call(admin, "PATCH", f"/api/v1/queues/{queue_name}",
                             {"allowed_kinds": kinds})
        assert refused.status == 400 and error in refused.body["error"], refused.body

    restored = await call(admin, "PATCH", f"/api/v1/queues/{queue_name}",
                          {"allowed_kinds": None})
    assert restored.body["allowed_kinds_default"] is True


# The CLI's kubectl habits, against the same real queue-store --------------------------------

async def test_the_cli_sets_a_queues_weight_directly_or_as_its_priority_factor(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    created = await lockgate(admin, "queue", "create", queue_name, "--weight", "4", "-o", "json")
    assert created.code == 0, created.err
    stored = await call(admin, "GET", f"/api/v1/queues/{queue_name}")
    assert (stored.body["weight"], stored.body["priority_factor"]) == (4, 0.25)

    updated = await lockgate(admin, "queue", "update", queue_name, "--weight", "0.5")
    assert updated.code == 0, updated.err
    assert (await call(admin, "GET", f"/api/v1/queues/{queue_name}")).body[
        "priority_factor"] == 2
    both = await lockgate(admin, "queue", "update", queue_name, "--weight", "2",
                          "--priority-factor", "0.5")
    assert both.code == 2 and "give --weight or --priority-factor, not both" in both.err
    assert (await call(admin, "GET", f"/api/v1/queues/{queue_name}")).body[
        "priority_factor"] == 2, "a refused command changes nothing"
    listed = await lockgate(admin, "queue", "list", "-o",
                            f"jsonpath={{[?(@.name == '{queue_name}')].weight}}")
    assert listed.out.strip() == "0.5"
    named = await lockgate(admin, "queue", "list", "-o", "name")
    assert f"queue/{queue_name}" in named.out.splitlines()


async def a_cluster_reported(admin: QueueStoreUnderTest) -> str:
    """A cluster queue-store learns of as it does from a cluster-watcher: its capacity, over
    Kafka. Its name is this test's own."""
    cluster = f"known-{uuid.uuid4().hex[:8]}"
    capacity = ClusterCapacity(
        cluster=cluster, observed_at=datetime.now(UTC),
        nodes=[NodeCapacity(name="node-0", allocatable={"cpu": 8000, "memory": 16 << 30})])
    producer = make_producer(admin.kafka_bootstrap, client_id="queue-admin-it")
    await producer.start()
    try:
        await publish_many(producer, CLUSTER_CAPACITY, [capacity])
    finally:
        await producer.stop()

    async def known() -> bool:
        listed = await call(admin, "GET", "/api/v1/clusters")
        assert listed.status == 200, listed.body
        return cluster in [c["name"] for c in listed.body["clusters"]]

    await eventually(known, within=30, every=0.2, what=f"queue-store knows cluster {cluster}")
    return cluster


async def test_the_cli_refuses_an_unknown_cluster_and_lists_the_known_ones(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    cluster = await a_cluster_reported(admin)
    typo = f"{cluster}-z"
    refused = await lockgate(admin, "queue", "create", queue_name, "--namespace", f"{typo}/foo")
    assert refused.code == 1
    first = refused.err.splitlines()[0]
    assert first.startswith(f"lockgate queue create: unknown cluster '{typo}' in the binding "
                            f"{typo}/foo; lockgate knows "), first
    assert cluster in first
    assert (await call(admin, "GET", f"/api/v1/queues/{queue_name}")).status == 404

    created = await lockgate(admin, "queue", "create", queue_name,
                             "--namespace", f"{cluster}/foo")
    assert created.code == 0, created.err
    listing = await lockgate(admin, "cluster", "list")
    assert cluster in [line.split()[0] for line in listing.out.splitlines()[1:]], (
        listing.out + listing.err)
    jobs = await lockgate(admin, "jobs", "list", "--cluster", typo)
    assert jobs.code == 1 and f"unknown cluster '{typo}' in --cluster" in jobs.err


async def test_queue_list_watch_prints_new_queues_until_ctrl_c(
        admin: QueueStoreUnderTest, queue_name: str) -> None:
    process = await asyncio.create_subprocess_exec(
        str(LOCKGATE_CLI), "queue", "list", "--watch", "--interval", "0.2",
        env={"LOCKGATE_API": admin.admin_url, "LOCKGATE_TOKEN": admin.admin_token,
             "PATH": "/usr/bin"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        # Ctrl-C as a terminal delivers it: a test run started in the background (`make test &`
        # from a script) passes SIGINT on ignored, and the CLI would never see it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.stdout is not None and process.stderr is not None
    seen: list[str] = []

    async def line_with(text: str) -> bool:
        assert process.stdout is not None
        while True:
            line = (await asyncio.wait_for(process.stdout.readline(), 90)).decode()
            assert line, f"the watch ended early; printed {seen}"
            seen.append(line.rstrip("\n"))
            if text in line:
                return True

    try:
        assert await line_with("")  # the table now (or "no queues: ..."), whatever it holds
        reply = await call(admin, "POST", "/api/v1/queues", {"name": queue_name,
                                                             "priority_factor": 0.5})
        assert reply.status == 201, reply.body
        assert await line_with(queue_name)
        row = seen[-1].split()
        assert row[:4] == [queue_name, queue_name, "2", "0.5"], seen
        cordoned = await call(admin, "PATCH", f"/api/v1/queues/{queue_name}",
                              {"cordoned": True})
        assert cordoned.status == 200
        assert await line_with(queue_name)
        assert seen[-1].split()[4] == "yes", seen
        # The header, not the empty answer's hint ("lockgate queue create NAME ..."), which
        # is all the first poll shows when the test runs alone.
        assert sum(line.startswith("NAME ") for line in seen) <= 1, "the header prints once"
    finally:
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), 90)
    err = (await process.stderr.read()).decode()
    assert (code, err) == (0, ""), err


def test_a_closed_pipe_ends_the_cli_quietly(admin: QueueStoreUnderTest) -> None:
    env = {"LOCKGATE_API": admin.admin_url, "LOCKGATE_TOKEN": admin.admin_token,
           "PATH": "/usr/bin"}
    # The reader is gone before the CLI writes: its first write fails with EPIPE.
    with subprocess.Popen([str(LOCKGATE_CLI), "status", "-o", "yaml"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        err = process.stderr.read().decode()
        assert (process.wait(timeout=60), err) == (141, "")
    # As a person types it; pipefail reports the CLI's status, whatever head read.
    shell = subprocess.run(["bash", "-o", "pipefail", "-c",
                            f"{LOCKGATE_CLI} status -o yaml | head -1"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert shell.returncode in (0, 141) and "Traceback" not in shell.stderr, shell.stderr
    assert shell.stdout.startswith("at:"), shell.stdout


def test_the_cli_is_a_kubectl_plugin_with_completion_version_and_contexts(
        admin: QueueStoreUnderTest, queue_name: str, tmp_path: Path) -> None:
    venv_bin = LOCKGATE_CLI.parent
    kubectl = Settings.from_env().bin_dir / "kubectl"
    assert kubectl.exists(), f"the stack's kubectl is missing at {kubectl}"
    env = {"LOCKGATE_API": admin.admin_url, "LOCKGATE_TOKEN": admin.admin_token,
           "PATH": f"{venv_bin}:/usr/bin", "HOME": str(tmp_path)}

    def run(*argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env={**env, **extra}, capture_output=True, text=True,
                              timeout=60)

    made = run(str(kubectl), "lockgate", "queue", "create", queue_name, "--weight", "3")
    assert made.returncode == 0, made.stderr
    got = run(str(kubectl), "lockgate", "queue", "get", queue_name, "-o", "json")
    assert json.loads(got.stdout)["weight"] == pytest.approx(3)
    usage = run(str(kubectl), "lockgate", "queue", "create")
    assert usage.returncode == 2
    assert usage.stderr.startswith("kubectl lockgate queue create: Missing argument 'NAME'")
    plugins = run(str(kubectl), "plugin", "list")
    assert str(venv_bin / "kubectl-lockgate") in plugins.stdout, plugins

    # Completion asks the real API for queue names, in bash and through kubectl's plugin hook.
    bash = run(str(LOCKGATE_CLI), _LOCKGATE_COMPLETE="bash_complete",
               COMP_WORDS=f"lockgate queue get {queue_name[:6]}", COMP_CWORD="3")
    assert f"plain,{queue_name}" in bash.stdout.split(), bash
    plugin = run(str(venv_bin / "kubectl_complete-lockgate"), "queue", "get", queue_name[:6])
    assert queue_name in plugin.stdout.splitlines() and plugin.stdout.endswith(":4\n"), plugin
    for shell in ("bash", "zsh", "fish"):
        script = run(str(LOCKGATE_CLI), "completion", shell)
        assert script.returncode == 0 and "_LOCKGATE_COMPLETE" in script.stdout
    sourced = run("bash", "-c", f"source <({LOCKGATE_CLI} completion bash) && "
                  "complete -p lockgate")
    assert sourced.returncode == 0 and "_lockgate_completion" in sourced.stdout, sourced

    version = run(str(LOCKGATE_CLI), "--version")
    assert version.returncode == 0 and version.stdout.startswith("lockgate 0."), version

    # A context of the config file stands in for the environment.
    bare = {"LOCKGATE_API": "", "LOCKGATE_TOKEN": ""}
    token_file = tmp_path / "token"
    token_file.write_text(admin.read_only_token)
    assert run(str(LOCKGATE_CLI), "config", "set-context", "it", "--api", admin.admin_url,
               "--token-file", str(token_file), **bare).returncode == 0
    assert (tmp_path / ".config" / "lockgate" / "config").exists()
    listed = run(str(LOCKGATE_CLI), "queue", "get", queue_name, "-o", "name", **bare)
    assert listed.stdout == f"queue/{queue_name}\n", listed
    refused = run(str(LOCKGATE_CLI), "queue", "delete", queue_name, **bare)
    assert refused.returncode == 1 and "is read-only" in refused.stderr, refused


# The queue tree -------------------------------------------------------------------------------

async def test_the_queue_tree_is_checked_on_every_write(
        admin: QueueStoreUnderTest, db: asyncpg.Pool, queue_name: str) -> None:
    research, vision, alice = (f"{queue_name}-{part}" for part in ("research", "vision", "alice"))

    async def create(name: str, **fields: Any) -> Reply:
        return await call(admin, "POST", "/api/v1/queues", {"name": name, **fields})

    assert (await create(research, priority_factor=1 / 3, guarantee={"cpu": "40"})).status == 201
    made = await create(vision, parent=research, guarantee={"cpu": "24"})
    assert made.status == 201, made.body
    assert (made.body["parent"], made.body["guarantee"]) == (research, {"cpu": "24"})
    assert (await create(alice, parent=vision,
                         namespaces=[{"cluster": "*", "names": ["alice"]}])).status == 201
    stored = await db.fetchrow("SELECT parent, guarantee FROM queues WHERE name = $1", alice)
    assert stored["parent"] == vision

    async def refused(reply: Reply, words: str) -> None:
        assert reply.status == 400, reply.body
        assert reply.body["error"].startswith("invalid queue tree: "), reply.body
        assert words in reply.body["error"], reply.body

    await refused(await create(f"{queue_name}-x", parent=f"{queue_name}-nobody"),
                  f"its parent '{queue_name}-nobody' is not defined")
    await refused(await create(f"{queue_name}-big", parent=research, guarantee={"cpu": "20"}),
                  f"ask for 44 cpu, more than '{research}''s guarantee (40)")
    await refused(await call(admin, "PATCH", f"/api/v1/queues/{research}", {"parent": alice}),
                  "cycle")
    await refused(await call(admin, "PATCH", f"/api/v1/queues/{vision}", {
        "namespaces": [{"cluster": "*", "names": ["vision"]}]}), "only a leaf holds pods")
    await refused(await call(admin, "DELETE", f"/api/v1/queues/{vision}"),
                  f"queue '{vision}' has child queues ({alice})")
    # A queue with unfinished pods cannot become a parent, even once it binds no namespace.
    await three_jobs_of(admin, db, alice)
    await refused(await create(f"{queue_name}-sub", parent=alice), "binds namespaces")
    unbound = await call(admin, "PATCH", f"/api/v1/queues/{alice}", {"namespaces": []})
    assert unbound.status == 200, unbound.body
    await refused(await create(f"{queue_name}-sub", parent=alice), "has unfinished pods")
    # Moving a leaf to the root is fine; the tree is unchanged otherwise.
    moved = await call(admin, "PATCH", f"/api/v1/queues/{alice}", {"parent": None})
    assert (moved.status, moved.body["parent"]) == (200, None)
    listed = {q["name"]: q for q in (await call(admin, "GET", "/api/v1/queues")).body["queues"]}
    assert listed[vision]["parent"] == research and listed[alice]["parent"] is None
