"""The fair scheduler against real Postgres and Kafka.

Each test gets a fresh database, cloned from a template this module migrates once, and writes
queues, nodes and jobs into it the way queue-store does (new serial and writer_xid per changed row,
NOTIFY). Cluster names are unique to this module, so the release commands it makes cannot
be mistaken for (or acted on as) another test's; assertions read them back from Kafka.
Schedulers run in this process (or, to be SIGKILLed, as a subprocess).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import pytest

from devstack.launcher import ServiceProcess
from devstack.ports import free_port
from devstack.roles import service_dsn
from fair_scheduler.app import compose
from fair_scheduler.settings import SchedulerSettings
from helpers.kafka import Published, TopicTail
from helpers.network import TcpRelay
from helpers.postgres import fresh_database
from helpers.services import FAST_RETRY, fairness_report, service_in_process
from helpers.waiting import eventually, until
from lockgate.events import RELEASE_COMMANDS, ClusterGrowth, NodePoolStatus
from lockgate_adapters import growth_store, scheduler_store
from lockgate_adapters.postgres import CHANGES_CHANNEL, LEADER_LOCK
from lockgate_adapters.scheduler_store import SessionLiveness
from lockgate_adapters.service import ServiceContext
from lockgate_adapters.settings import RetryPolicy

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]

SUFFIX = uuid.uuid4().hex[:8]
CPU = 1000  # millicores
GIB = 2**30
# A Postgres Sync message (ends an extended query): a relay that stops before it leaves the
# session active, waiting for the rest of the command.
SYNC = b"S\x00\x00\x00\x04"
# Long enough that every release a test sees was triggered by a change, not by the safety net.
SAFETY_ROUND_SECONDS = 60.0


# ---------------------------------------------------------------- a database per test


@pytest.fixture(scope="module")
async def template_database(pg_dsn: str) -> AsyncIterator[str]:
    """A migrated database, cloned for each test (much faster than migrating each); its DSN."""
    async with fresh_database(pg_dsn, prefix=f"lg_sched_tmpl_{SUFFIX}", migrated=True) as dsn:
        yield dsn


@dataclass
class Store:
    """Writes rows as queue-store would, and reads what the scheduler wrote."""

    dsn: str
    pool: asyncpg.Pool
    cluster_prefix: str

    def cluster(self, name: str) -> str:
        return f"{self.cluster_prefix}-{name}"

    async def _write(self, statement: str, *args: Any) -> list[asyncpg.Record]:
        async with self.pool.acquire() as connection, connection.transaction():
            rows: list[asyncpg.Record] = await connection.fetch(statement, *args)
            await connection.execute("SELECT pg_notify($1, 'test')", CHANGES_CHANNEL)
            return rows

    async def queue(self, name: str, *, priority_factor: float = 1.0) -> None:
        await self._write("INSERT INTO queues (name, priority_factor) VALUES ($1, $2)",
                          name, priority_factor)

    async def node(self, cluster: str, node: str, *, cpu: int = 4 * CPU,
                   memory: int = 16 * GIB) -> None:
        await self._write(
            "INSERT INTO cluster_nodes (cluster, node, allocatable, observed_at)"
            " VALUES ($1, $2, $3::text::jsonb, now())"
            " ON CONFLICT (cluster, node) DO UPDATE SET allocatable = EXCLUDED.allocatable,"
            " present = true, serial = nextval('change_serial'),"
            " writer_xid = pg_current_xact_id()::text::bigint",
            cluster, node, json.dumps({"cpu": cpu, "memory": memory}))

    async def jobs(self, cluster: str, queue: str, count: int, *, cpu: int = CPU,
                   memory: int = GIB) -> list[str]:
        """`count` queued jobs; returns their uids, oldest first."""
        uids = [str(uuid.uuid4()) for _ in range(count)]
        now = time.time()
        await self._write(
            "INSERT INTO jobs (cluster, uid, namespace, name, queue, jobset, requests, state,"
            " created_at)"
            " SELECT $1, u, 'ns', 'pod-' || u, $2, 'js', $3::text::jsonb, 'queued',"
            " to_timestamp($4 + i * 0.001)"
            " FROM unnest($5::text[]) WITH ORDINALITY AS t(u, i)",
            cluster, queue, json.dumps({"cpu": cpu, "memory": memory}), now, uids)
        return uids

    async def set_state(self, cluster: str, uids: list[str], state: str) -> None:
        await self._write(
            "UPDATE jobs SET state = $3, state_changed_at = now(),"
            " serial = nextval('change_serial'), writer_xid = pg_current_xact_id()::text::bigint"
            " WHERE cluster = $1 AND uid = ANY($2::text[])",
            cluster, uids, state)

    async def states(self, cluster: str) -> dict[str, str]:
        rows = await self.pool.fetch("SELECT uid, state FROM jobs WHERE cluster = $1", cluster)
        return {row["uid"]: row["state"] for row in rows}

    async def released(self, cluster: str) -> set[str]:
        return {uid for uid, state in (await self.states(cluster)).items()
                if state == "released"}

    async def decisions_per_job(self) -> dict[tuple[str, str], int]:
        rows = await self.pool.fetch(
            "SELECT cluster, uid, count(*) AS n FROM release_decisions GROUP BY cluster, uid")
        return {(row["cluster"], row["uid"]): row["n"] for row in rows}

    async def leader_backend(self) -> int | None:
        pid = await self.pool.fetchval(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND classid = 0 AND objid = $1 AND objsubid = 1", LEADER_LOCK)
        return None if pid is None else int(pid)


@pytest.fixture
async def store(pg_dsn: str, template_database: str) -> AsyncIterator[Store]:
    async with fresh_database(pg_dsn, prefix="lg_sched", template=template_database) as dsn:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
        try:
            yield Store(dsn, pool, f"fs-{SUFFIX}-{uuid.uuid4().hex[:4]}")
        finally:
            await pool.close()


# ---------------------------------------------------------------- release commands from Kafka


class CommandTail(TopicTail):
    """Release commands for one test's clusters, from the moment the tail started; notes for
    each whether its decision was already recorded in Postgres when the command arrived."""

    def __init__(self, bootstrap: str, store: Store) -> None:
        super().__init__(bootstrap, [RELEASE_COMMANDS],
                         keep=lambda command: command.cluster.startswith(store.cluster_prefix))
        self.store = store
        self.recorded_first: dict[str, bool] = {}

    async def accept(self, message: Published) -> bool:
        if not await super().accept(message):
            return False
        command = message.event
        recorded = await self.store.pool.fetchval(
            "SELECT count(*) FROM release_decisions d JOIN jobs j"
            " ON j.decision_id = d.decision_id AND j.state <> 'queued'"
            " WHERE d.decision_id = $1", command.decision_id)
        self.recorded_first[command.decision_id] = recorded == 1
        return True

    @property
    def commands(self) -> list[Any]:
        return self.events()

    def uids(self) -> list[str]:
        return [command.uid for command in self.commands]


@pytest.fixture
async def commands(kafka_bootstrap: str, store: Store) -> AsyncIterator[CommandTail]:
    async with CommandTail(kafka_bootstrap, store) as tail:
        yield tail


# ---------------------------------------------------------------- running schedulers


def scheduler_settings(store: Store, kafka_bootstrap: str, instance_id: str,
                       **overrides: Any) -> SchedulerSettings:
    values: dict[str, Any] = {
        # The scheduler's own role: these tests prove its grants suffice.
        "postgres_dsn": service_dsn(store.dsn, "fair-scheduler"),
        "kafka_bootstrap": kafka_bootstrap,
        "instance_id": instance_id, "http_port": 0, "retry": FAST_RETRY,
        "safety_round_seconds": SAFETY_ROUND_SECONDS, "standby_retry_seconds": 0.2,
        **overrides,
    }
    return SchedulerSettings(**values)


@contextlib.asynccontextmanager
async def running_scheduler(settings: SchedulerSettings) -> AsyncIterator[ServiceContext]:
    async with service_in_process(settings, compose, name=f"scheduler-{settings.instance_id}",
                                  ready=lambda ctx: "leader" in ctx.readiness.report(),
                                  within=30) as ctx:
        yield ctx


def leading(ctx: ServiceContext) -> bool:
    return ctx.readiness.report().get("leader", {}).get("ready") is True


def standing_by(ctx: ServiceContext) -> bool:
    """It tried to take the lead and found another instance holding it."""
    return ctx.readiness.report().get("leader", {}).get("detail") == "standby"


async def round_finished(ctx: ServiceContext, *, releasing: int) -> dict[str, Any]:
    """Until the leader reports a finished round that released `releasing` jobs; its report.

    The report is written after the round has published every command, so nothing more of
    that round may come; and no other round runs without a change (safety rounds are rare).
    """
    seen: list[Any] = [None]

    async def finished() -> dict[str, Any] | None:
        report = await fairness_report(ctx.health.bound_port)
        seen[0] = report.get("last_round")
        return report if seen[0] and seen[0]["decisions"] == releasing else None

    found: dict[str, Any] = await eventually(
        finished, within=30, what=lambda: f"a round releasing {releasing} (last: {seen[0]})")
    return found


async def prometheus_text(ctx: ServiceContext) -> str:
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{ctx.health.bound_port}/metrics") as response:
        assert response.status == 200
        return await response.text()


# ---------------------------------------------------------------- tests


async def test_releases_within_capacity_recording_each_decision_before_publishing(
        store: Store, commands: CommandTail, kafka_bootstrap: str) -> None:
    cluster = store.cluster("a")
    await store.queue("q1")
    await store.node(cluster, "n1", cpu=4 * CPU)
    await store.node(cluster, "n2", cpu=4 * CPU)
    uids = await store.jobs(cluster, "q1", 12)

    async with running_scheduler(scheduler_settings(store, kafka_bootstrap, "s1")) as ctx:
        await until(lambda: leading(ctx), within=30, what="leadership")
        await commands.wait_for_count(8)
        await round_finished(ctx, releasing=8)  # the pool holds 8 such jobs: nothing more

    assert len(commands.commands) == 8
    assert all(commands.recorded_first.values()), commands.recorded_first
    # The oldest jobs first, and exactly the jobs marked released in Postgres.
    assert set(commands.uids()) == set(uids[:8]) == await store.released(cluster)
    assert set(await store.decisions_per_job()) == {(cluster, uid) for uid in uids[:8]}
    assert all(n == 1 for n in (await store.decisions_per_job()).values())
    unpublished = await store.pool.fetchval(
        "SELECT count(*) FROM release_decisions WHERE published_at IS NULL")
    assert unpublished == 0
    for command in commands.commands:
        assert (command.cluster, command.namespace, command.name, command.queue) == (
            cluster, "ns", f"pod-{command.uid}", "q1")


async def test_the_leader_takes_each_clusters_growth_picture_at_load_and_on_change(
        store: Store, commands: CommandTail, kafka_bootstrap: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """What a cluster's autoscaler may still add reaches the leader's state as queue-store
    stores it (lockgate_adapters.growth_store): loaded with the rest, then through the change
    feed when it changes."""
    cluster = store.cluster("grows")
    await store.queue("q1")
    await store.node(cluster, "n1", cpu=4 * CPU)

    async def store_picture(at: datetime, cpu_limit: int) -> None:
        async with store.pool.acquire() as connection, connection.transaction():
            changed = await growth_store.store_growth(connection, [ClusterGrowth(
                cluster=cluster, observed_at=at, autoscaled=True,
                node_pools=[NodePoolStatus(name="default", limits={"cpu": cpu_limit})])])
            assert changed == [cluster]
            await connection.execute("SELECT pg_notify($1, 'cluster_growth')", CHANGES_CHANNEL)

    started = datetime.now(UTC)
    await store_picture(started, 64 * CPU)
    with caplog.at_level(logging.INFO, logger="fair_scheduler"):
        async with running_scheduler(scheduler_settings(store, kafka_bootstrap, "g1")) as ctx:
            await until(lambda: leading(ctx), within=30, what="leadership")
            await until(lambda: "the growth of 1 clusters" in caplog.text, within=10,
                        what="the load of the growth picture")
            assert f"{cluster}: growth picture as of {started.isoformat()}: 1 NodePools" in (
                caplog.text)
            changed_at = started + timedelta(seconds=5)
            await store_picture(changed_at, 8 * CPU)
            await until(lambda: f"growth picture as of {changed_at.isoformat()}" in caplog.text,
                        within=10, what="the changed picture through the change feed")


async def test_a_leader_whose_load_outlasts_an_idle_session_keeps_the_lead(
        store: Store, commands: CommandTail, kafka_bootstrap: str,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Turning a million rows into jobs took longer than the leader's session may stay idle:
    Postgres ended the session, and with it the lock, after every load, and no leader ever
    ran a round. Here 100,000 rows against an idle limit of 1 s: the leader must check in
    while it loads, keep the lead and release."""
    monkeypatch.setattr(scheduler_store, "LOAD_CHUNK", 2_000)
    cluster = store.cluster("a")
    await store.queue("q1")
    await store.node(cluster, "n1", cpu=4 * CPU)
    await store.jobs(cluster, "q1", 100_000)
    settings = scheduler_settings(store, kafka_bootstrap, "big",
                                  leader_check_interval_seconds=0.2,
                                  leader_check_timeout_seconds=0.5,
                                  leader_idle_session_timeout_seconds=1.0)
    with caplog.at_level(logging.INFO, logger="fair_scheduler"):
        async with running_scheduler(settings) as ctx:
            await until(lambda: leading(ctx), within=30, what="leadership")
            await round_finished(ctx, releasing=4)
    # One term from the load to the stop, the session never ended under it.
    assert caplog.text.count("big is the leader") == 1 and "postgres trouble" not in caplog.text
    assert "100000 unfinished jobs" in caplog.text


async def test_rounds_follow_changes_not_the_periodic_round(
        store: Store, commands: CommandTail, kafka_bootstrap: str) -> None:
    cluster = store.cluster("a")
    await store.queue("q1")
    await store.node(cluster, "n1", cpu=2 * CPU)
    first = await store.jobs(cluster, "q1", 3)

    async with running_scheduler(scheduler_settings(store, kafka_bootstrap, "s1")) as ctx:
        await until(lambda: leading(ctx), within=30, what="leadership")
        await commands.wait_for_count(2)
        assert set(commands.uids()) == set(first[:2])

        # A job completes: its capacity goes to the next queued job, long before a safety round.
        await store.set_state(cluster, [first[0]], "succeeded")
        freed_at = time.monotonic()
        await commands.wait_for_count(3, within=5)
        assert commands.commands[2].uid == first[2]
        assert commands.messages[2].received_at - freed_at < 2.0

        # New capacity and a new queued job: released at once as well.
        await store.node(cluster, "n2", cpu=1 * CPU)
        late = await store.jobs(cluster, "q1", 1)
        queued_at = time.monotonic()
        await commands.wait_for_count(4, within=5)
        assert commands.commands[3].uid == late[0]
        assert commands.messages[3].received_at - queued_at < 2.0

    assert all(n == 1 for n in (await store.decisions_per_job()).values())


async def test_weights_and_the_fairness_report(
        store: Store, commands: CommandTail, kafka_bootstrap: str) -> None:
    cluster = store.cluster("a")
    await store.queue("light", priority_factor=1.0)
    await store.queue("heavy", priority_factor=0.5)  # weight 2
    await store.node(cluster, "n1", cpu=6 * CPU, memory=64 * GIB)
    await store.jobs(cluster, "light", 10)
    await store.jobs(cluster, "heavy", 10)

    async with running_scheduler(scheduler_settings(store, kafka_bootstrap, "s1")) as ctx:
        await until(lambda: leading(ctx), within=30, what="leadership")
        await commands.wait_for_count(6)
        report = await round_finished(ctx, releasing=6)
        metrics = await prometheus_text(ctx)

    by_queue = {p.queue: 0 for p in commands.commands}
    for command in commands.commands:
        by_queue[command.queue] += 1
    assert by_queue == {"light": 2, "heavy": 4}
    assert report["leader"] is True and report["instance_id"] == "s1"
    queues = {q["name"]: q for q in report["queues"]}
    assert queues["light"]["fair_share"] == pytest.approx(1 / 3)
    assert queues["heavy"]["fair_share"] == pytest.approx(2 / 3)
    assert queues["light"]["actual_share"] == pytest.approx(2 / 6)
    assert queues["heavy"]["actual_share"] == pytest.approx(4 / 6)
    assert (queues["light"]["queued"], queues["light"]["released"]) == (8, 2)
    assert (queues["heavy"]["queued"], queues["heavy"]["released"]) == (6, 4)
    # The pool is full: the report says why the waiting jobs were not released.
    for name in ("light", "heavy"):
        assert queues[name]["skipped_last_round"] or queues[name][
            "clusters_set_aside_last_round"], queues[name]
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in metrics.splitlines() if line.startswith("lockgate_scheduler_queue")}
    assert samples['lockgate_scheduler_queue_share{kind="fair",queue="heavy"}'] == \
        pytest.approx(2 / 3)
    assert samples['lockgate_scheduler_queue_share{kind="actual",queue="light"}'] == \
        pytest.approx(2 / 6)
    assert samples['lockgate_scheduler_queue_jobs{phase="queued",queue="light"}'] == 8


async def test_unpublished_decisions_are_published_by_the_next_leader(
        store: Store, commands: CommandTail, kafka_bootstrap: str) -> None:
    cluster = store.cluster("a")
    await store.queue("q1")
    # A previous leader recorded this release and died before publishing it.
    (uid,) = await store.jobs(cluster, "q1", 1)
    await store.set_state(cluster, [uid], "released")
    await store.pool.execute(
        "INSERT INTO release_decisions (decision_id, cluster, uid, queue, decided_at, decided_by)"
        " VALUES ('d-orphan', $1, $2, 'q1', now(), 'gone')", cluster, uid)
    await store.pool.execute("UPDATE jobs SET decision_id = 'd-orphan' WHERE uid = $1", uid)

    async with running_scheduler(scheduler_settings(store, kafka_bootstrap, "s1")) as ctx:
        await until(lambda: leading(ctx), within=30, what="leadership")
        await commands.wait_for_count(1)
        await eventually(lambda: store.pool.fetchval(
            "SELECT published_at IS NOT NULL FROM release_decisions"
            " WHERE decision_id = 'd-orphan'"), within=10, what="published_at")

    assert [p.decision_id for p in commands.commands] == ["d-orphan"]
    assert await store.decisions_per_job() == {(cluster, uid): 1}


async def test_a_release_left_unanswered_is_published_again(
        store: Store, commands: CommandTail, kafka_bootstrap: str) -> None:
    cluster = store.cluster("a")
    await store.queue("q1")
    answered, unanswered = await store.jobs(cluster, "q1", 2)
    await store.set_state(cluster, [unanswered], "released")
    await store.set_state(cluster, [answered], "ungated")
    for decision, uid in (("d-unanswered", unanswered), ("d-answered", answered)):
        await store.pool.execute(
            "INSERT INTO release_decisions (decision_id, cluster, uid, queue, decided_at,"
            " decided_by, published_at) VALUES ($1, $2, $3, 'q1', now() - interval '1 hour',"
            " 'earlier', now() - interval '1 hour')", decision, cluster, uid)
        await store.pool.execute("UPDATE jobs SET decision_id = $1 WHERE uid = $2",
                                 decision, uid)

    settings = scheduler_settings(store, kafka_bootstrap, "s1", republish_after_seconds=1.0)
    async with running_scheduler(settings) as ctx:
        await until(lambda: leading(ctx), within=30, what="leadership")
        # Once on taking over, then every republish interval: the answered one never.
        await commands.wait_for_count(3, within=10)

    assert {p.decision_id for p in commands.commands} == {"d-unanswered"}
    assert await store.decisions_per_job() == {(cluster, unanswered): 1, (cluster, answered): 1}


async def test_a_standby_takes_over_when_the_leaders_connection_dies(
        store: Store, commands: CommandTail, kafka_bootstrap: str) -> None:
    cluster = store.cluster("a")
    await store.queue("q1")
    await store.node(cluster, "n1", cpu=4 * CPU)
    first = await store.jobs(cluster, "q1", 6)

    # The first leader, once thrown out, waits before it contests again: the standby wins.
    slow_to_return = RetryPolicy(initial_seconds=5, max_seconds=5)
    async with running_scheduler(scheduler_settings(store, kafka_bootstrap, "one",
                                                    retry=slow_to_return)) as one:
        await until(lambda: leading(one), within=30, what="the first leader")
        async with running_scheduler(scheduler_settings(store, kafka_bootstrap, "two")) as two:
            await commands.wait_for_count(4)
            await until(lambda: standing_by(two), within=30, what="two to try and stand by")
            assert not leading(two), "two leaders at once"
            assert {p.uid for p in commands.commands} == set(first[:4])

            backend = await store.leader_backend()
            assert backend is not None
            await store.pool.execute("SELECT pg_terminate_backend($1)", backend)
            await until(lambda: leading(two), within=15, what="the standby to lead")
            # The lock is freed before the old leader's socket closes: it may report leading
            # a moment longer, but cannot write (its connection is the fence).
            await until(lambda: not leading(one), within=5, what="the old leader to step down")
            await eventually(lambda: _leader_changed(store, backend), within=15,
                              what="a new leader backend")

            # The new leader carries on: freed capacity goes to the queued jobs.
            await store.set_state(cluster, first[:2], "succeeded")
            await commands.wait_for_count(6, within=10)
            await round_finished(two, releasing=2)

    assert sorted(commands.uids()) == sorted(first)
    assert len(commands.commands) == 6
    assert all(n == 1 for n in (await store.decisions_per_job()).values())
    decided_by = dict(await store.pool.fetch("SELECT uid, decided_by FROM release_decisions"))
    assert [decided_by[uid] for uid in first] == ["one"] * 4 + ["two"] * 2


@pytest.mark.parametrize("midway", [False, True], ids=["between-messages", "mid-message"])
async def test_a_leader_whose_connection_freezes_steps_down_and_a_standby_takes_over(
        store: Store, commands: CommandTail, kafka_bootstrap: str, midway: bool) -> None:
    """A connection that dies silently (frozen: no bytes, no FIN) ends the leadership in
    bounded time on both ends: the leader steps down within check interval + check timeout,
    and Postgres ends the idle session (freeing the lock) after the idle-session timeout.
    Frozen in the middle of a command (the leader's next query arrives without its Sync), the
    session is not idle and Postgres never ends it: the standby does, as soon
    (`SessionLiveness.stuck_after` is 4 s here too)."""
    cluster = store.cluster("a")
    await store.queue("q1")
    await store.node(cluster, "n1", cpu=4 * CPU)
    first = await store.jobs(cluster, "q1", 6)
    # A query in flight when the connection freezes ends at the command timeout: then the bound
    # is check interval + check timeout + command timeout (docs/security.md).
    liveness = {"leader_check_interval_seconds": 0.5, "leader_check_timeout_seconds": 1.0,
                "leader_command_timeout_seconds": 2.0,
                "leader_idle_session_timeout_seconds": 4.0}
    steps_down_within = 0.5 + 1.0 + 2.0
    relay, relayed = await _relay_to(store.dsn)
    try:
        async with running_scheduler(scheduler_settings(
                store, kafka_bootstrap, "frozen", **liveness,
                postgres_dsn=service_dsn(relayed, "fair-scheduler"))) as frozen:
            await until(lambda: leading(frozen), within=30, what="the first leader")
            async with running_scheduler(scheduler_settings(store, kafka_bootstrap, "standby",
                                                            **liveness)) as standby:
                await commands.wait_for_count(4)
                assert not leading(standby), "two leaders at once"
                backend = await store.leader_backend()

                if midway:
                    relay.freeze_before(SYNC)
                else:
                    relay.freeze()
                frozen_at = time.monotonic()
                await until(lambda: not leading(frozen), within=steps_down_within + 5,
                            what="the leader on the frozen connection to step down")
                stepped_down = time.monotonic() - frozen_at
                try:
                    await until(lambda: leading(standby), within=4.0 + 10,
                                what="the standby to take over once Postgres ends the idle "
                                     "session")
                except AssertionError as error:
                    # What kept the old leader's session from ending, if it lives.
                    session = await store.pool.fetchrow(
                        "SELECT state, wait_event_type, wait_event, xact_start, state_change,"
                        " query FROM pg_stat_activity WHERE pid = $1", backend)
                    raise AssertionError(f"{error}; the old leader's session {backend}: "
                                         f"{dict(session) if session else 'gone'}") from error
                took_over = time.monotonic() - frozen_at
                assert not leading(frozen)
                assert await store.leader_backend() not in (None, backend)
                # The stepping down is bounded by the checks; the taking over waits for
                # Postgres to end the dead session (never before the idle timeout).
                assert stepped_down < steps_down_within + 5 and took_over >= 4.0 - 0.5, (
                    stepped_down, took_over)

                await store.set_state(cluster, first[:2], "succeeded")
                await commands.wait_for_count(6, within=10)
                await round_finished(standby, releasing=2)
    finally:
        relay.thaw()
        await relay.sever()

    assert sorted(commands.uids()) == sorted(first)
    assert len(commands.commands) == 6
    assert all(n == 1 for n in (await store.decisions_per_job()).values())
    decided_by = dict(await store.pool.fetch("SELECT uid, decided_by FROM release_decisions"))
    assert [decided_by[uid] for uid in first] == ["frozen"] * 4 + ["standby"] * 2


async def test_a_standby_ends_a_leader_session_frozen_in_the_middle_of_a_command(
        store: Store) -> None:
    """A connection that freezes halfway through a command leaves the session "active",
    waiting for the rest: Postgres's idle timeouts never end it, so the lock would be held
    for ever. A standby ends it once it has been stuck past the leader's own bound for
    stepping down, and takes the lead; it never ends a leader that is idle."""
    relay, relayed = await _relay_to(store.dsn)
    liveness = SessionLiveness(check_interval=0.5, check_timeout=1.0, command_timeout=2.0,
                               idle_session_timeout=30.0)
    leader = await scheduler_store.connect(service_dsn(relayed, "fair-scheduler"),
                                           liveness=liveness)
    standby = await scheduler_store.connect(service_dsn(store.dsn, "fair-scheduler"))
    stuck: asyncio.Task[object] | None = None
    try:
        assert await scheduler_store.try_lead(leader)
        assert not await scheduler_store.try_lead(standby)
        backend = await store.leader_backend()
        # Idle or between commands, the leader is never ended, however short the bound.
        assert await scheduler_store.end_stuck_leader(standby, stuck_for_seconds=0.0) is None

        await leader.fetchval("SELECT 1")  # prepared: the next call is Bind, Execute, Sync
        relay.freeze_before(SYNC)  # the server runs the query, then waits for the Sync
        stuck = asyncio.create_task(leader.fetchval("SELECT 1", timeout=60))
        await eventually(lambda: _stuck_mid_command(store, backend), within=10,
                         what="the leader's session active, waiting for the rest of a message")
        assert await scheduler_store.end_stuck_leader(standby, stuck_for_seconds=60.0) is None
        assert not await scheduler_store.try_lead(standby)

        await asyncio.sleep(liveness.stuck_after)
        assert await _stuck_mid_command(store, backend), "Postgres ended it on its own"
        assert await scheduler_store.end_stuck_leader(
            standby, stuck_for_seconds=liveness.stuck_after) == backend
        await eventually(lambda: scheduler_store.try_lead(standby), within=10,
                         what="the standby to take the lock once the stuck session ended")
        assert await store.leader_backend() not in (None, backend)
    finally:
        relay.thaw()
        if stuck is not None:
            stuck.cancel()
            await asyncio.gather(stuck, return_exceptions=True)
        leader.terminate()
        await standby.close()
        await relay.sever()


async def _relay_to(dsn: str) -> tuple[TcpRelay, str]:
    """A started relay to the Postgres of `dsn`, and `dsn` through it."""
    postgres = urlsplit(dsn)
    assert postgres.hostname is not None and postgres.port is not None
    relay = TcpRelay(postgres.hostname, postgres.port)
    await relay.start()
    return relay, urlunsplit(postgres._replace(
        netloc=postgres.netloc.rpartition("@")[0] + f"@127.0.0.1:{relay.port}"))


async def _stuck_mid_command(store: Store, backend: int | None) -> bool:
    row = await store.pool.fetchrow(
        "SELECT state, wait_event FROM pg_stat_activity WHERE pid = $1", backend)
    return row is not None and row["state"] == "active" and row["wait_event"] == "ClientRead"


async def _waiting_for_a_lock(store: Store, backend: int | None) -> bool:
    kind = await store.pool.fetchval(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", backend)
    return bool(kind == "Lock")


async def _leader_changed(store: Store, old_backend: int) -> bool:
    backend = await store.leader_backend()
    return backend is not None and backend != old_backend


async def test_a_standby_takes_over_from_a_killed_leader_process(
        store: Store, commands: CommandTail, kafka_bootstrap: str,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    cluster = store.cluster("a")
    await store.queue("q1")
    await store.node(cluster, "n1", cpu=3 * CPU)
    first = await store.jobs(cluster, "q1", 5)
    env: Mapping[str, str] = {
        "LOCKGATE_POSTGRES_DSN": service_dsn(store.dsn, "fair-scheduler"),
        "LOCKGATE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LOCKGATE_SCHEDULER_INSTANCE_ID": "process",
        "LOCKGATE_SCHEDULER_HTTP_PORT": str(free_port()),
        "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": str(SAFETY_ROUND_SECONDS),
    }
    process = ServiceProcess("fair-scheduler-test", "fair_scheduler", env,
                             health_port=int(env["LOCKGATE_SCHEDULER_HTTP_PORT"]),
                             log_dir=tmp_path_factory.mktemp("logs"))
    await process.start()
    try:
        await process.wait_ready()
        await commands.wait_for_count(3)
        async with running_scheduler(scheduler_settings(store, kafka_bootstrap, "standby")) as ctx:
            await until(lambda: standing_by(ctx), within=30, what="the standby to stand by")
            assert not leading(ctx)
            await process.kill()
            await until(lambda: leading(ctx), within=15, what="the standby to lead")
            await store.set_state(cluster, first[:2], "succeeded")
            await commands.wait_for_count(5, within=10)
            await round_finished(ctx, releasing=2)
    finally:
        await process.kill()

    assert sorted(commands.uids()) == sorted(first)
    decided_by = dict(await store.pool.fetch(
        "SELECT uid, decided_by FROM release_decisions"))
    assert {decided_by[uid] for uid in first[:3]} == {"process"}
    assert {decided_by[uid] for uid in first[3:]} == {"standby"}
    assert all(n == 1 for n in (await store.decisions_per_job()).values())


async def test_a_decision_on_a_job_gone_meanwhile_frees_its_room_again(
        store: Store, commands: CommandTail, kafka_bootstrap: str) -> None:
    """The round decides on a job that another writer deleted in a transaction still open; the
    write then finds it not queued, and the scheduler must not go on counting it as released.

    To make the race certain, the node that lets the round decide is committed while the
    deletion is still open: the round sees the node and the job still queued, and its write
    waits for the job's row lock. (The feed delivers the deletion later too, since its writer was
    in progress at that read; re-reading the dropped job repairs the state at once.)
    """
    cluster = store.cluster("a")
    await store.queue("q1")
    (doomed,) = await store.jobs(cluster, "q1", 1)

    async with running_scheduler(scheduler_settings(store, kafka_bootstrap, "s1")) as ctx:
        await until(lambda: leading(ctx), within=30, what="leadership")
        # Loaded, and a first round run: the job waits, its cluster has no node yet.
        await round_finished(ctx, releasing=0)
        async with store.pool.acquire() as deleting:
            deleting_transaction = deleting.transaction()
            await deleting_transaction.start()
            try:
                await deleting.execute(
                    "UPDATE jobs SET state = 'deleted', serial = nextval('change_serial'),"
                    " writer_xid = pg_current_xact_id()::text::bigint WHERE uid = $1", doomed)
                await store.pool.execute(
                    "INSERT INTO cluster_nodes (cluster, node, allocatable, observed_at)"
                    " VALUES ($1, 'n1', $2::text::jsonb, now())",
                    cluster, json.dumps({"cpu": CPU, "memory": 16 * GIB}))
                await store.pool.execute("SELECT pg_notify($1, 'node')", CHANGES_CHANNEL)
                # The round decided, and its write waits for the lock.
                backend = await store.leader_backend()
                await eventually(lambda: _waiting_for_a_lock(store, backend), within=30,
                                 what="the leader's write to wait for the job's row lock")
            finally:
                await deleting_transaction.commit()
        # The room the doomed job would have taken goes to the next job.
        (successor,) = await store.jobs(cluster, "q1", 1)
        await commands.wait_for_count(1, within=10)

    assert commands.uids() == [successor]
    assert await store.decisions_per_job() == {(cluster, successor): 1}


async def test_a_job_changed_since_the_round_is_not_released(
        store: Store, kafka_bootstrap: str) -> None:
    """The write releases only jobs still queued in Postgres (here: one deleted meanwhile)."""
    from lockgate_adapters import scheduler_store

    cluster = store.cluster("a")
    await store.queue("q1")
    kept, deleted = await store.jobs(cluster, "q1", 2)
    await store.set_state(cluster, [deleted], "deleted")
    connection = await scheduler_store.connect(store.dsn)
    try:
        recorded = await scheduler_store.record_releases(
            connection, decisions=[("d-kept", cluster, kept), ("d-deleted", cluster, deleted)],
            decided_at=datetime.now(UTC), decided_by="test")
        again = await scheduler_store.record_releases(
            connection, decisions=[("d-kept-again", cluster, kept)],
            decided_at=datetime.now(UTC), decided_by="test")
    finally:
        await connection.close()
    assert [r.decision_id for r in recorded] == ["d-kept"]
    assert again == []
    assert await store.decisions_per_job() == {(cluster, kept): 1}
    assert await store.states(cluster) == {kept: "released", deleted: "deleted"}


async def test_a_job_whose_release_failed_waits_its_backoff_before_the_next_release(
        store: Store, commands: CommandTail, kafka_bootstrap: str) -> None:
    """A release that keeps failing (say, a patch the apiserver forbids) must not spin."""
    cluster = store.cluster("a")
    await store.queue("q1")
    await store.node(cluster, "n1", cpu=4 * CPU)
    (uid,) = await store.jobs(cluster, "q1", 1)
    backoff = 1.5
    settings = scheduler_settings(store, kafka_bootstrap, "s1",
                                  release_retry_initial_seconds=backoff)

    async with running_scheduler(settings) as ctx:
        await until(lambda: leading(ctx), within=30, what="leadership")
        await commands.wait_for_count(1)
        # The ungater reported FAILED: queue-store puts the job back in its queue.
        await store.set_state(cluster, [uid], "queued")
        returned_at = time.monotonic()
        await commands.wait_for_count(2, within=10)
        second_after = commands.messages[1].received_at - returned_at
        # Failing again doubles the wait.
        await store.set_state(cluster, [uid], "queued")
        returned_at = time.monotonic()
        await commands.wait_for_count(3, within=15)
        third_after = commands.messages[2].received_at - returned_at

    assert backoff * 0.9 <= second_after < backoff + 2.0
    assert 2 * backoff * 0.9 <= third_after < 2 * backoff + 2.0
    assert commands.uids() == [uid, uid, uid]
    assert (await store.decisions_per_job())[(cluster, uid)] == 3
