"""Ungater replicas (issue 19, item 4): two ungater processes serving the same clusters in one
consumer group split the release commands, and one crashing mid-stream loses no release and
releases no pod twice.

A run of lockgate as processes (helpers.runs) over cluster-a and cluster-b, with its real
queue-store, webhook, watcher and fair-scheduler, and two ungaters ("ungater" and "ungater-2",
`ungater_replicas=2`): same clusters, same group `ungater-<run id>`, each with its own health
port and instance id. Release commands are keyed by the pod's uid, so the pods' commands spread
over the topic's partitions, and the group gives each ungater some of them.

Small pods arrive in waves in both clusters. Once each ungater has released pods (its own
/metrics), "ungater-2" is SIGKILLed at a moment its /metrics show an apiserver call in flight,
while the next waves stream in: the group rebalances once its session times out, and the
survivor takes its partitions over, reading from their last committed offsets (so a command the
dead one had taken but not committed is carried out again: harmless, the patch tests the gate
and the outcome consumer keeps the first outcome). The ungaters patch one pod at a time per
cluster, so a round's commands take long enough for the kill to find some taken and not
committed; and the leader's re-publishing of unanswered releases is pushed out past the test,
so it cannot cover up a command the ungaters lost.

How it was seen failing: with the ungater's offsets committed before its batch was handled (a
temporary break of BatchConsumer), the commands of the killed one's last batch never got an
outcome.

Then, from lockgate's point of view, every pod was released exactly once: one release decision
per job, its outcome `ungated` recorded in Postgres, one release attempt per job, no lockgate
gate left on any pod, no failed or pod-gone outcome on the outcomes topic, and no Event from
lockgate on any pod. Commands published after the kill, on every partition of the topic, got
their outcome: the survivor served the dead one's partitions too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devstack.stack import StackInfo
from helpers.kafka import TopicTail, consumer_at_end
from helpers.kube import create_pods_as_a_controller, gates_of
from helpers.pods import a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.events import RELEASE_COMMANDS, RELEASE_OUTCOMES, ReleaseCommand
from lockgate.labels import SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]

WAVES = 6
PER_WAVE = 10  # pods per cluster per wave: 120 pods in all
KILLED = "ungater-2"
SURVIVOR = "ungater"
LAST_KILL_WAVE = 4  # the kill waits for a wave in which it finds the ungater busy, till this
CREATE_CONCURRENCY = 8
CREATE_RETRY_SECONDS = 120  # a loaded machine's webhook may answer 503 for a while


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    # No waiting notices: then any Event lockgate writes on a pod would be about a failure.
    # No re-publishing within the test: the leader's safety net (a release unanswered for a
    # minute is published again) would cover up a command the ungaters lost.
    async with lockgate_run(stack, tmp_path, name="ugrep", clusters=("cluster-a", "cluster-b"),
                            ungater_replicas=2,
                            env={"LOCKGATE_SCHEDULER_WAIT_NOTICES": "false",
                                 "LOCKGATE_SCHEDULER_REPUBLISH_AFTER_SECONDS": "3600",
                                 # One patch at a time per cluster: a round's commands then
                                 # take a while, and the kill finds some taken, uncommitted.
                                 "LOCKGATE_UNGATER_MAX_IN_FLIGHT_PER_CLUSTER": "1"}) as run:
        await run.create_queues([run.name("q")], namespaces=[run.namespace])
        for alias in run.apis:
            await run.create_namespace(alias)
        yield run


@dataclass(frozen=True)
class SeenCommand:
    command: ReleaseCommand
    partition: int
    at: float  # the record's timestamp, seconds since the epoch


class CommandTail:
    """Release commands for the run's clusters, with the partition each landed on."""

    def __init__(self, bootstrap: str, clusters: set[str]) -> None:
        self.bootstrap, self.clusters = bootstrap, clusters
        self.seen: list[SeenCommand] = []
        self.partitions = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> CommandTail:
        self._consumer = await consumer_at_end(self.bootstrap, RELEASE_COMMANDS.name)
        self.partitions = len(self._consumer.partitions_for_topic(RELEASE_COMMANDS.name) or ())
        self._task = asyncio.create_task(self._collect())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._consumer.stop()

    async def _collect(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=100)
            for partition, records in batches.items():
                for record in records:
                    try:
                        command = RELEASE_COMMANDS.decode(record.value or b"")
                    except ValueError:
                        continue  # another version's message on the shared topic
                    if command.cluster in self.clusters:
                        self.seen.append(SeenCommand(command, partition.partition,
                                                     record.timestamp / 1000))


@dataclass(frozen=True)
class Work:
    """An ungater process's counters, from its /metrics."""

    released: float  # releases settled as `ungated`
    in_flight: float  # apiserver calls in flight now


async def work_of(run: LockgateRun, service: str) -> Work:
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{run.health_port(service)}/metrics",
            timeout=aiohttp.ClientTimeout(total=5)) as reply:
        lines = (await reply.text()).splitlines()

    def total(prefix: str, *having: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines
                   if line.startswith(prefix + "{") and all(h in line for h in having))

    return Work(total("lockgate_ungater_releases_total", 'outcome="ungated"'),
                total("lockgate_ungater_apiserver_calls_in_flight"))


async def kill_when_busy(run: LockgateRun, creating: asyncio.Future[Any], *,
                         last_chance: bool) -> tuple[dict[str, Work], bool] | None:
    """SIGKILL KILLED at a moment it has an apiserver call in flight (a command taken, its
    offset not committed), watching while a wave is created and a few seconds after; on the
    last chance, kill it anyway. Each ungater's counters just before, and whether it was busy;
    None if not killed."""
    deadline: float | None = None
    while True:
        now = await work_of(run, KILLED)
        if creating.done() and deadline is None:
            deadline = time.monotonic() + 3
        busy = now.in_flight > 0
        if busy or (deadline is not None and time.monotonic() > deadline):
            if not busy and not last_chance:
                return None
            await run.kill(KILLED)
            return {SURVIVOR: await work_of(run, SURVIVOR), KILLED: now}, busy
        await asyncio.sleep(0.002)


async def create_pods(run: LockgateRun, alias: str, names: list[str], queue: str) -> None:
    pod = (a_pod("member").in_namespace(run.namespace).in_queue(queue)
           .requesting(cpu="10m", memory="16Mi").never_restarted())
    await create_pods_as_a_controller(run.core(alias), run.namespace,
                                      [pod.named(name).manifest() for name in names],
                                      concurrency=CREATE_CONCURRENCY,
                                      retry_seconds=CREATE_RETRY_SECONDS)


async def test_two_ungaters_in_one_group_release_every_pod_once_when_one_dies_mid_stream(
        run: LockgateRun) -> None:
    queue = run.name("q")
    aliases = list(run.apis)
    names = {alias: [run.name(f"w{wave}-{i}") for wave in range(WAVES)
                     for i in range(PER_WAVE)] for alias in aliases}
    total = sum(len(n) for n in names.values())
    async with CommandTail(run.lockgate.kafka_bootstrap, set(aliases)) as commands, \
            TopicTail(run.lockgate.kafka_bootstrap, [RELEASE_OUTCOMES],
                      keep=lambda o: o.cluster in aliases) as outcomes:
        assert commands.partitions >= 2, "one partition: replicas could not split the work"
        killed_at: float | None = None
        before_kill: dict[str, Work] = {}
        busy_at_kill = False
        for wave in range(WAVES):
            counts = ({s: await work_of(run, s) for s in (SURVIVOR, KILLED)}
                      if killed_at is None else {})
            creating = asyncio.ensure_future(asyncio.gather(*(create_pods(
                run, alias, names[alias][wave * PER_WAVE:(wave + 1) * PER_WAVE], queue)
                for alias in aliases)))
            if killed_at is None and wave >= 2 and all(w.released for w in counts.values()):
                # Both have done work: kill the one while it carries out this wave's commands.
                killed = await kill_when_busy(run, creating, last_chance=wave == LAST_KILL_WAVE)
                if killed is not None:
                    (before_kill, busy_at_kill), killed_at = killed, time.time()
            await creating
            await asyncio.sleep(1.0)
        assert killed_at is not None, (
            f"both ungaters never had work before the last wave: {before_kill}\n{run.logs()}")

        async def every_job_released() -> bool:
            settled = await run.pool.fetchval(
                "SELECT count(*) FROM release_decisions WHERE outcome IS NOT NULL")
            return bool(settled >= total)

        try:
            await eventually(every_job_released, within=120, every=1,
                             what=f"outcomes recorded for all {total} pods")
        except AssertionError as failure:
            stuck = await run.pool.fetch(
                "SELECT d.cluster, j.name, d.decision_id, d.published_at FROM release_decisions d"
                " JOIN jobs j USING (cluster, uid) WHERE d.outcome IS NULL LIMIT 5")
            raise AssertionError(f"{failure}; e.g. {[dict(r) for r in stuck]}\n"
                                 f"{run.logs(40)}") from failure
        await outcomes.caught_up()
        survivor = await work_of(run, SURVIVOR)

    # -- Postgres: one decision per job, its outcome `ungated`, one release attempt per job.
    jobs = await run.pool.fetch(
        "SELECT cluster, uid, name, state, release_attempts FROM jobs"
        " WHERE namespace = $1", run.namespace)
    assert sorted((j["cluster"], j["name"]) for j in jobs) == sorted(
        (alias, name) for alias in aliases for name in names[alias])
    assert {j["release_attempts"] for j in jobs} == {1}, [
        dict(j) for j in jobs if j["release_attempts"] != 1][:5]
    decisions = await run.pool.fetch(
        "SELECT decision_id, cluster, uid, outcome, published_at FROM release_decisions")
    per_job = Counter((d["cluster"], d["uid"]) for d in decisions)
    assert set(per_job) == {(j["cluster"], j["uid"]) for j in jobs}
    assert set(per_job.values()) == {1}, [key for key, n in per_job.items() if n > 1][:5]
    assert Counter(d["outcome"] for d in decisions) == {"ungated": total}
    assert all(d["published_at"] is not None for d in decisions)
    assert not {j["state"] for j in jobs} - {"released", "ungated", "bound", "running"}, Counter(
        j["state"] for j in jobs)

    # -- Kafka: every decision's outcomes (one, or more after a redelivery) all say ungated.
    decided = {d["decision_id"] for d in decisions}
    said = Counter((o.decision_id, o.outcome.value) for o in outcomes.events())
    assert {decision for decision, _ in said} == decided
    assert {outcome for _, outcome in said} == {"ungated"}, said
    repeated = sum(n - 1 for n in Counter(o.decision_id for o in outcomes.events()).values())
    already = sum(o.reason == "gate already absent" for o in outcomes.events())

    # -- The apiserver: no pod still carries lockgate's gate, and lockgate wrote no Event.
    for alias in aliases:
        pods = await run.core(alias).list_namespaced_pod(run.namespace)
        assert len(pods.items) == len(names[alias])
        gated = [p.metadata.name for p in pods.items if SCHEDULING_GATE in gates_of(p)]
        assert not gated, f"{alias}: {len(gated)} pods still gated, e.g. {gated[:5]}"
        events = await run.core(alias).list_namespaced_event(
            run.namespace, field_selector="source=lockgate-ungater")
        assert not events.items, [(e.involved_object.name, e.reason, e.message)
                                  for e in events.items][:5]

    # -- Both did work before the kill; after it the survivor served every partition.
    assert all(work.released > 0 for work in before_kill.values()), before_kill
    after_kill = [seen for seen in commands.seen if seen.at > killed_at]
    assert Counter(seen.command.decision_id for seen in commands.seen) == dict.fromkeys(
        decided, 1), "a command was published again: the leader's re-publishing had to step in"
    assert {seen.partition for seen in after_kill} == set(range(commands.partitions)), (
        f"commands after the kill landed on partitions "
        f"{sorted({seen.partition for seen in after_kill})} only: not proof of a takeover")
    print(f"\n{total} pods over {commands.partitions} partitions; before the kill: {before_kill}"
          f" (busy: {busy_at_kill}); {len(after_kill)} commands after it, by the survivor "
          f"alone (it released {survivor.released:.0f} in all); outcomes repeated after the "
          f"rebalance: {repeated}, saying the gate was already absent: {already}; "
          f"at {datetime.now(UTC):%H:%M:%S}")
