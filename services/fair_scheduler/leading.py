"""What the leader does while it leads: keep the state current, run rounds, record, publish.

Why this shape: a round must start within milliseconds of a change that could release something
(a pod queued, capacity freed, a queue changed), not at the next periodic tick. The leader LISTENs
on `lockgate_changes` on its own connection; a notification wakes it, it waits a few
milliseconds for more, fetches only the rows changed since its last read (`FeedCursor`), applies
them through the hold-out feed (`lockgate.scheduler.feed`: what is expired, backing off, given up or
held for its controller stays out of the line) to the in-memory `SchedulerState` and runs a
round. Everything it decides without I/O is the feed's (unit-tested there); this module reads,
records and publishes. A periodic round is the safety net for lost
notifications; now and then the leader also re-publishes releases that went unanswered.

Every decision is recorded (leader connection, one transaction) before its command is published.
If anything about the leader's connection fails, `run` raises and the caller steps down: the
in-memory state is thrown away with the leadership, and the next leader loads afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

import asyncpg
from aiokafka import AIOKafkaProducer
from opentelemetry import trace
from prometheus_client import Counter as MetricCounter

from fair_scheduler.reporting import FairnessReport
from fair_scheduler.settings import SchedulerSettings
from lockgate import jobs
from lockgate.change_feed import START
from lockgate.events import POD_NOTICES, RELEASE_COMMANDS, PodNotice, ReleaseCommand
from lockgate.noticing import NoticeReason
from lockgate.placement import Requirement
from lockgate.queue_tree import QueueTree
from lockgate.scheduler import (
    Explainer,
    Feed,
    PreemptionPolicy,
    RoundResult,
    SchedulerState,
    TargetProblem,
    TargetsKey,
    plan_evictions,
    schedule_round,
)
from lockgate.scheduler.collection import RoundCollector
from lockgate.scheduler.history import HistoryReport, RunInterval, UsageHistory, rebuild_usage
from lockgate.scheduler.report import ExplainSettings, report_round
from lockgate.scheduler.telling import (
    queue_unknown_notices,
    removal_notice,
    timed_out_groups,
    unplaceable_give_ups,
    waiting_notices,
)
from lockgate.wait_estimates import ReleaseRates
from lockgate_adapters import eviction_store, job_views, usage_store
from lockgate_adapters import scheduler_store as store
from lockgate_adapters.health import Readiness
from lockgate_adapters.kafka import is_retryable_kafka_error, publish_many
from lockgate_adapters.postgres import CHANGES_CHANNEL
from lockgate_adapters.quieting import quiet
from lockgate_adapters.retrying import Backoff, Stopped, retry
from lockgate_adapters.targets_worker import TargetsWorker
from lockgate_adapters.telemetry import inject_headers, pod_trace_parent

log = logging.getLogger(__name__)
tracer = trace.get_tracer("lockgate.fair_scheduler")

DECISIONS = MetricCounter("lockgate_scheduler_decisions",
                          "Releases recorded and published, by queue", ["queue"])
DROPPED_DECISIONS = MetricCounter(
    "lockgate_scheduler_dropped_decisions",
    "Decisions not recorded because the job was no longer queued in Postgres")
REPUBLISHED = MetricCounter("lockgate_scheduler_republished",
                            "Release commands published again (unpublished or unanswered)")
NOTICES = MetricCounter("lockgate_scheduler_pod_notices",
                        "Pod notices published (why a pod stays gated), by reason", ["reason"])
ROUNDS = MetricCounter("lockgate_scheduler_rounds", "Scheduling rounds run, by trigger",
                       ["trigger"])
TARGETS_SOLVED = MetricCounter("lockgate_scheduler_targets_solved_in_worker",
                               "Fair targets solved in the worker process and adopted")
TARGETS_SOLVE_SECONDS = MetricCounter(
    "lockgate_scheduler_targets_worker_seconds",
    "Seconds the worker process spent solving fair targets (with _solved: the mean)")
REMOVALS = MetricCounter("lockgate_scheduler_pod_removals",
                         "Pods recorded for removal, by kind (preempted, group_timeout) and queue",
                         ["kind", "queue"])


# How stale the decayed usage in status may be (the weights in force are always current).
HISTORY_REPORT_EVERY_SECONDS = 2.0


# Pods told why they wait per turn of the loop (`_tell_waiting`): each is explained, and a
# first `explain` waits for the loop's turn.
TELL_SLICE = 20


class LeadershipLostError(Exception):
    """The leader's connection (and with it the leader lock) is gone."""


def _release_span_headers(command: ReleaseCommand) -> list[tuple[str, bytes]]:
    """A "release decided" span in the pod's own trace, linked to the round that decided it.

    The ungater continues this trace, so one trace shows the pod observed, stored, released and
    ungated.
    """
    round_link = trace.Link(trace.get_current_span().get_span_context())
    with tracer.start_as_current_span(
        "release decided", context=pod_trace_parent(command.uid), links=[round_link],
        attributes={"lockgate.cluster": command.cluster, "lockgate.namespace": command.namespace,
                    "lockgate.pod": command.name, "lockgate.uid": command.uid,
                    "lockgate.queue": command.queue, "lockgate.decision_id": command.decision_id},
    ):
        return inject_headers()


class Leader:
    """One term of leadership, from loading the state to stepping down."""

    def __init__(
        self,
        *,
        settings: SchedulerSettings,
        connection: asyncpg.Connection,
        producer: AIOKafkaProducer,
        report: FairnessReport,
        readiness: Readiness,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        new_decision_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self._settings = settings
        self._connection = connection
        self._producer = producer
        self._report = report
        self._readiness = readiness
        self._now = now
        self._new_decision_id = new_decision_id
        # The state and every row applied to it through the hold-out policy (expired, backing
        # off, given up, controller holds): all the leader decides that needs no I/O.
        self._feed = Feed(SchedulerState(settings.fairness_resources), settings.feed_policy())
        self._feed.state.set_growth_policy(settings.growth_policy())
        self._release_rates = ReleaseRates()  # for the wait estimates of notices
        report.release_rates = self._release_rates  # and of explain, from the same pace
        feed = self._feed
        report.held_out = lambda job_id: (feed.held_out(job_id), feed.retry_due(job_id))
        self._rounds = 0  # of this term, numbering the reports
        self._explain_settings = ExplainSettings(
            preemption=settings.preemption_enabled,
            group_reserve_after=settings.group_reserve_after_seconds,
            holds=settings.room_hold_seconds > 0)
        self._state = self._feed.state
        self._unsent_expiries: list[PodNotice] = []
        self._preemption = PreemptionPolicy(
            preemptible_priority_classes=frozenset(settings.preemptible_priority_classes),
            max_evictions_per_round=settings.max_evictions_per_round)
        # Collects after each round what the round left (lockgate.scheduler.collection).
        self._collector = RoundCollector(settings.gc_full_collection_seconds)
        self._cursor = START
        self._next_check_in = 0.0  # during the first load (`_check_in`)
        self._paced = False  # the last round left a cluster waiting for its ungaters
        # Fair targets solved beside the event loop at scale (docs/scheduling.md, "Fair targets
        # off the round's path"): the worker, started when first needed; the solve under way;
        # whether targets came since the last round (they may change its order).
        self._targets_worker: TargetsWorker | None = None
        self._solving: asyncio.Task[None] | None = None
        self._targets_arrived = False
        self._wake = asyncio.Event()
        self._lost = asyncio.Event()
        self._stopping = asyncio.Event()
        # Usage that decays (docs/scheduling.md, "Usage that decays"), when history is on:
        # restored or rebuilt at load, advanced every round, stored on a period and at the end.
        self._history: UsageHistory | None = None
        self._history_report: HistoryReport | None = None
        self._flat_tree: tuple[dict[str, float], QueueTree] | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        """Lead until `stopping` is set; raises LeadershipLostError or a Postgres error."""
        self._stopping = stopping
        self._connection.add_termination_listener(self._on_leader_connection_lost)
        watcher = asyncio.create_task(self._wake_on(stopping), name="wake-on-stop")
        listener: asyncpg.Connection | None = None
        try:
            # Listen before loading, so no change between the two goes unnoticed.
            listener = await self._listen(None)
            await self._load()
            await self._republish(include_unpublished=True)
            await self._republish_removals()
            await self._serve(stopping, listener)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await self._save_history_at_step_down()
            await self._stop_targets_worker()
            self._connection.remove_termination_listener(self._on_leader_connection_lost)
            if listener is not None:
                await _close_quietly(listener)

    async def _serve(self, stopping: asyncio.Event, listener: asyncpg.Connection | None) -> None:
        settings = self._settings
        more_to_do = True  # the first round runs at once
        next_safety_round = time.monotonic() + settings.safety_round_seconds
        # Finding unanswered releases scans the unfinished jobs: not every safety round.
        republish_every = settings.republish_after_seconds / 2
        next_republish = time.monotonic() + republish_every
        next_check = time.monotonic() + settings.leader_check_interval_seconds
        next_waiting_check = time.monotonic()  # after the first round
        next_history_save = time.monotonic() + settings.history_save_seconds
        last_round_ended = -math.inf
        while not stopping.is_set():
            if not more_to_do:
                wall = self._now().timestamp()
                feed_due = time.monotonic() + (self._feed.next_due() - wall)
                timeout = max(0.0, min(next_safety_round, next_republish, next_check,
                                       next_waiting_check, feed_due, next_history_save)
                              - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                if stopping.is_set():
                    return
                paced_wait = last_round_ended + settings.paced_round_seconds - time.monotonic()
                if self._wake.is_set() and self._paced and paced_wait > 0:
                    # The answers that reopen the window arrive one by one: take several.
                    await asyncio.sleep(paced_wait)
                elif self._wake.is_set() and settings.debounce_seconds and (
                        time.monotonic() - last_round_ended < settings.busy_seconds):
                    # Changes stream in: wait a moment so one round takes several. An idle
                    # scheduler answers the first change at once (release latency).
                    await asyncio.sleep(settings.debounce_seconds)
            self._check_leadership()
            if time.monotonic() >= next_check:
                await self._check_connection_answers()
                next_check = time.monotonic() + settings.leader_check_interval_seconds
            self._wake.clear()
            listener = await self._listen(listener)
            changed = self._apply(await store.changes_since(self._connection, self._cursor))
            changed = self._feed.end_due(self._now().timestamp()) or changed
            await self._forget_backoffs()
            changed = await self._give_up_unplaceable() or changed
            now = time.monotonic()
            safety_due = now >= next_safety_round
            if safety_due:
                next_safety_round = now + settings.safety_round_seconds
            if now >= next_republish:
                next_republish = now + republish_every
                await self._republish(include_unpublished=False)
                await self._republish_removals()
            targets_arrived, self._targets_arrived = self._targets_arrived, False
            if changed or more_to_do or safety_due or targets_arrived:
                trigger = ("more" if more_to_do else "change" if changed
                           else "targets" if targets_arrived else "periodic")
                more_to_do = await self._round(trigger)
                last_round_ended = time.monotonic()
                await self._notice()
            if time.monotonic() >= next_waiting_check:
                next_waiting_check = time.monotonic() + settings.wait_notice_check_seconds
                await self._tell_waiting()
            if time.monotonic() >= next_history_save:
                next_history_save = time.monotonic() + settings.history_save_seconds
                await self._save_history()

    # ---- state ----------------------------------------------------------------------------

    async def _load(self) -> None:
        """Load every live row, checking in with Postgres meanwhile.

        At a million jobs, turning rows into jobs and applying them takes longer than the
        leader's session may stay idle (leader_idle_session_timeout_seconds): Postgres ended
        the session, and with it the lock, right after every load, and no leader came up. So
        the work goes in chunks, and between them the connection answers a check whenever one
        is due (which also proves it alive)."""
        started = time.monotonic()
        self._next_check_in = time.monotonic() + self._settings.leader_check_interval_seconds
        everything = await store.load_everything(self._connection, keep_alive=self._check_in)
        self._feed.load_backoffs(everything.backoffs, self._now().timestamp())
        if everything.backoffs:
            log.info("loaded %d controller back-offs", len(everything.backoffs))
        jobs, everything.jobs = everything.jobs, []
        self._apply(everything)  # queues, nodes and the cursor first
        now = self._now().timestamp()
        returned = {job_id: (releases, at.timestamp())
                    for job_id, (releases, at) in everything.returned.items()}
        for start in range(0, len(jobs), store.LOAD_CHUNK):
            self._feed.apply_jobs(jobs[start:start + store.LOAD_CHUNK], now=now,
                                  returned=returned)
            await self._check_in()
        log.info("loaded %d queues, %d nodes, %d unfinished jobs, the growth of %d clusters as "
                 "of %s in %.2fs", len(everything.queues), len(everything.nodes), len(jobs),
                 len(everything.growth), everything.cursor, time.monotonic() - started)
        if self._settings.history_enabled:
            await self._load_history()

    async def _check_in(self) -> None:
        """During a long load: prove the connection alive when a check is due."""
        if time.monotonic() >= self._next_check_in:
            await self._check_connection_answers()
            self._next_check_in = time.monotonic() + self._settings.leader_check_interval_seconds

    def _apply(self, changes: store.Changes) -> bool:
        """Apply changed rows; returns whether any could let a round release something new."""
        feed = self._feed
        changed = bool(changes.queues or changes.nodes or changes.growth)
        for queue in changes.queues:
            feed.apply_queue(queue.name, queue.spec)
        if changes.queues and feed.state.refresh_queue_tree():
            tree = feed.state.queue_tree
            log.info("fair targets divide by %s", "each queue's weight (no queue tree)"
                     if tree is None else f"a queue tree of {len(tree)} queues")
        if changes.queues and (problem := feed.state.queue_tree_problem()) is not None:
            log.warning("queue tree: %s", problem)
        for node in changes.nodes:
            feed.apply_node(node.cluster, node.node, node.info)
        # What each cluster's autoscaler may still add: capacity the fair targets count. Rare
        # (a picture reaches the feed only when it changed), so each is said.
        for cluster, growth in changes.growth.items():
            self._state.set_growth(cluster, growth)
            log.info("%s: growth picture as of %s: %s", cluster, growth.observed_at.isoformat(),
                     f"{len(growth.node_pools)} NodePools, {len(growth.node_claims)} NodeClaims "
                     "in flight" if growth.autoscaled else "not autoscaled")
        returned = {job_id: (releases, at.timestamp())
                    for job_id, (releases, at) in changes.returned.items()}
        changed = feed.apply_jobs(changes.jobs, now=self._now().timestamp(),
                                  returned=returned) or changed
        self._cursor = changes.cursor  # each read's snapshot is later than the last
        vanished = self._feed.after_read()
        if vanished:
            log.info("%d jobs whose release was dropped have no row any more: forgotten",
                     len(vanished))
        return changed or bool(vanished)

    async def _forget_backoffs(self) -> None:
        """Delete the controller back-offs that are over, or were reset by a bind."""
        gone = self._feed.backoffs_to_forget()
        if gone:
            await store.forget_backoffs(self._connection, gone)
            log.info("controller back-offs over or reset by a bound pod: %s",
                     ", ".join(f"{r.controller_uid} in {r.cluster}" for r in gone))

    # ---- rounds ---------------------------------------------------------------------------

    async def _round(self, trigger: str) -> bool:
        """Run one round; returns whether it stopped at its decision limit (more may fit)."""
        settings = self._settings
        started = time.perf_counter()
        ROUNDS.labels(trigger).inc()
        with tracer.start_as_current_span("schedule-round") as span:
            decided_at = self._now()
            self._keep_history(decided_at.timestamp())
            # The round's releases stand once recorded: it works through a transaction,
            # committed below with the releases Postgres took.
            transaction = self._state.begin_round()
            try:
                result = schedule_round(
                    self._state, max_decisions=settings.max_decisions_per_round,
                    max_lookback_per_queue=settings.max_lookback_per_queue,
                    now=decided_at.timestamp(),
                    group_reserve_after_seconds=settings.group_reserve_after_seconds,
                    room_hold_seconds=settings.room_hold_seconds or None,
                    room_holds_per_queue=settings.room_holds_per_queue,
                    targets_max_age=settings.targets_max_age_seconds,
                    adopted_targets_max_age=settings.targets_worker_max_age_seconds,
                    release_budget=self._release_budget(), transaction=transaction)
                planned: list[tuple[str, str, str]] = []
                for decision in result.decisions:
                    cluster, uid = jobs.split_job_id(decision.job_id)
                    planned.append((self._new_decision_id(), cluster, uid))
                recorded = await store.record_releases(
                    self._connection, decisions=planned, decided_at=decided_at,
                    decided_by=settings.instance_id)
            except BaseException:
                transaction.rollback()
                raise
            kept = {jobs.job_id(release.cluster, release.uid) for release in recorded}
            taken_back = transaction.commit(kept=kept)
            for decision in result.decisions:
                if decision.job_id in kept:
                    self._feed.released(decision.queue)
            self._paced = any(report.paced for report in result.queues.values())
            span.set_attribute("lockgate.decisions", len(recorded))
            span.set_attribute("lockgate.trigger", trigger)
            if taken_back:
                # Each job queues again as before; the next read brings its row as it is now,
                # and the feed removes those it does not bring (their row is gone).
                self._feed.taken_back(taken_back)
                DROPPED_DECISIONS.inc(len(taken_back))
                log.info("%d decisions dropped: their jobs were no longer queued",
                         len(taken_back))
            if recorded:
                for release in recorded:
                    self._release_rates.released(release.queue, release.cluster,
                                                 decided_at.timestamp())
                # A release for growth carries its words to the ungater, which writes them on
                # the pod (docs/autoscaling.md, "Words").
                growth = {decision.job_id: decision.growth.words(decision.cluster)
                          for decision in result.decisions if decision.growth is not None}
                # And the node affinity that makes the pool make the size of node counted.
                narrowing = {decision.job_id: (decision.growth.avoid,)
                             for decision in result.decisions
                             if decision.growth is not None and decision.growth.avoid is not None}
                await self._publish(recorded, growth=growth, narrowing=narrowing)
            await self._remove(result, decided_at)
            seconds = time.perf_counter() - started
            # Inside the span, so the record carries the round's trace and span ids.
            if recorded:
                log.info("round (%s): released %d of %d decided in %.1f ms", trigger,
                         len(recorded), len(planned), seconds * 1000)
            else:
                log.debug("round (%s): nothing to release (%.1f ms)", trigger, seconds * 1000)
        self._rounds += 1
        self._report.record_round(
            report_round(self._state, result, number=self._rounds,
                         at=decided_at.timestamp(), phases=self._feed.phases,
                         settings=self._explain_settings, history=self._history_report),
            seconds=seconds, decisions=len(recorded))
        # The loop is given back between the steps after a round (here and below): a first
        # `explain` waits for the loop's turn, and is answered from the new picture at once.
        await asyncio.sleep(0)
        # The pods asked about lately, explained from the new picture at once: asked again,
        # they are answered without waiting for the next round (reporting.answered).
        self._report.explain_again(now=self._now().timestamp())
        await asyncio.sleep(0)
        self._collector.after_round()
        self._hand_over_targets()
        return len(result.decisions) >= settings.max_decisions_per_round

    # ---- usage that decays ----------------------------------------------------------------

    async def _load_history(self) -> None:
        """Restore the decayed usage the last leader stored; rebuild it from the jobs' records
        when none is stored or it was kept with another half-life (it cannot be converted)."""
        settings = self._settings
        half_life = settings.history_half_life_seconds
        assert half_life is not None  # the settings refuse history on without one
        now = self._now().timestamp()
        stored = await usage_store.load_usage(self._connection)
        if stored is not None and stored.half_life_seconds == half_life:
            # What happened since it was stored is covered by the first round's observation
            # (what queues hold now, over the gap).
            at = min(stored.as_of.timestamp(), now)
            restored = dict(stored.leaves)
            log.info("restored the decayed usage of %d queues stored by %s as of %s",
                     len(restored), stored.saved_by, stored.as_of.isoformat())
        else:
            since = datetime.fromtimestamp(now - usage_store.REBUILD_HALF_LIVES * half_life, UTC)
            runs = await usage_store.runs_since(self._connection, since)
            state = self._state
            intervals = [RunInterval(leaf=run.queue, share=state.dominant_share_of(run.requests),
                                     since=run.since.timestamp(),
                                     until=None if run.until is None else run.until.timestamp())
                         for run in runs]
            # The runs still going are what queues hold now: the first round counts them on.
            restored = rebuild_usage(intervals, half_life_seconds=half_life, now=now)
            at = now
            log.warning("rebuilt the decayed usage of %d queues from %d runs in the jobs' records "
                        "(%s)", len(restored), len(runs),
                        "none was stored" if stored is None else
                        f"it was stored with a half-life of {stored.half_life_seconds:g}s, "
                        f"now {half_life:g}s")
        self._history = UsageHistory(
            half_life_seconds=half_life, recompute_seconds=settings.history_recompute_seconds,
            tolerance=settings.history_weight_tolerance, at=at, restored=restored)

    def _history_tree(self) -> QueueTree:
        """The tree history is kept over: the queue tree when one divides the targets, else
        every defined queue a child of the root."""
        tree = self._state.queue_tree
        if tree is not None:
            return tree
        weights = {name: spec.weight for name, record in self._state.queue_records.items()
                   if (spec := record.spec) is not None}
        cached = self._flat_tree
        if cached is None or cached[0] != weights:  # built (and validated) once per change
            cached = self._flat_tree = (weights, QueueTree.flat(weights))
        return cached[1]

    def _keep_history(self, now: float) -> None:
        """Before a round: add what each queue held since the last, and on the period
        recompute the history weights the targets divide by (they change only past the
        tolerance, so preemption's targets stand still in between)."""
        history = self._history
        if history is None:
            return
        # A wall clock stepped back (NTP) must not stop the leader: count no time instead.
        now = max(now, history.usage.at)
        history.observe(now=now, shares=self._state.dominant_shares())
        tree = self._history_tree()
        changed = history.recompute(tree, now=now)
        if changed:
            self._state.use_history_weights(history.weights_in_force)
            log.info("history weights now %s", ", ".join(
                f"{name} {weight:.3g}" for name, weight in sorted(
                    history.weights_in_force.items())))
        # The report costs O(nodes) (milliseconds at 1,000 queues): not every round, but when
        # the weights or the tree changed, and otherwise every few seconds for the usage.
        last = self._history_report
        if (changed or last is None or last.tree is not tree
                or now - last.usage_at >= HISTORY_REPORT_EVERY_SECONDS):
            self._history_report = history.report(tree)

    async def _save_history(self) -> None:
        """Store every leaf's decayed usage, brought up to now."""
        history = self._history
        if history is None:
            return
        at = self._now()
        history.observe(now=max(at.timestamp(), history.usage.at),
                        shares=self._state.dominant_shares())
        await usage_store.save_usage(
            self._connection, leaves=history.leaves(),
            half_life_seconds=history.half_life_seconds,
            as_of=datetime.fromtimestamp(history.usage.at, UTC),
            saved_by=self._settings.instance_id)

    async def _save_history_at_step_down(self) -> None:
        """The last save of this term; a leader whose connection is gone cannot write (the
        next leader then restores the last periodic save and covers the gap)."""
        if self._history is None or self._connection.is_closed():
            return
        try:
            await self._save_history()
            log.info("stored the decayed usage at step-down")
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            log.warning("could not store the decayed usage at step-down (%s); the next leader "
                        "restores the last periodic save", error)

    # ---- fair targets in the worker -------------------------------------------------------

    def _hand_over_targets(self) -> None:
        """After a round, at scale: have the worker solve the targets for the state as it is
        now, unless it is solving already (the next round after its answer hands over again)
        or the last targets were solved from these very inputs."""
        if self._solving is not None and not self._solving.done():
            return
        taken = self._now().timestamp()
        handed = self._state.hand_over_targets(
            at=taken, min_demands=self._settings.targets_worker_min_demands)
        if handed is None:
            return
        if self._targets_worker is None:
            self._targets_worker = TargetsWorker()
        self._solving = asyncio.create_task(
            self._solve(self._targets_worker, *handed, taken), name="fair-targets")

    async def _solve(self, worker: TargetsWorker, problem: TargetProblem, key: TargetsKey,
                     taken: float) -> None:
        answer = await worker.solve_async(problem)
        if answer is None:  # logged; the next round hands over again
            return
        targets, seconds = answer
        self._state.adopt_targets(key, targets, at=taken)
        TARGETS_SOLVED.inc()
        TARGETS_SOLVE_SECONDS.inc(seconds)
        self._targets_arrived = True
        self._wake.set()

    async def _stop_targets_worker(self) -> None:
        solving, self._solving = self._solving, None
        if solving is not None:
            solving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await solving
        worker, self._targets_worker = self._targets_worker, None
        if worker is not None:
            await asyncio.to_thread(worker.close)

    def _release_budget(self) -> dict[str, int] | None:
        """What each cluster's ungater backlog may still grow by (None: no cap)."""
        window = self._settings.max_releases_in_flight_per_cluster
        if not window:
            return None
        return {name: max(0, window - cluster.releasing)
                for name, cluster in self._state.cluster_records.items()}

    # ---- removals: preemption and timed-out groups ----------------------------------------

    async def _remove(self, result: RoundResult, at: datetime) -> None:
        """Record, then publish, the pods to remove after this round: evictions to fair share
        (when enabled) and the members of pod groups that timed out."""
        planned: list[eviction_store.PlannedRemoval] = []
        if self._settings.preemption_enabled:
            for eviction in plan_evictions(self._state, result, policy=self._preemption,
                                           evicting=self._feed.removing):
                cluster, uid = jobs.split_job_id(eviction.job_id)
                planned.append(eviction_store.PlannedRemoval(
                    eviction_id=self._new_decision_id(), cluster=cluster, uid=uid,
                    kind="preempted", action="delete", message=eviction.message,
                    for_queue=eviction.for_queue,
                    for_uid=jobs.split_job_id(eviction.for_job)[1]))
        planned += self._timed_out_groups(at)
        if not planned:
            return
        self._feed.removing.update(jobs.job_id(p.cluster, p.uid) for p in planned)
        recorded = await eviction_store.record_removals(
            self._connection, planned, decided_at=at, decided_by=self._settings.instance_id)
        for removal in recorded:
            REMOVALS.labels(removal.kind, removal.queue).inc()
            log.info("removing pod %s/%s/%s of queue %s (%s, %s): %s", removal.cluster,
                     removal.namespace, removal.name, removal.queue, removal.kind,
                     removal.action, removal.message)
        await self._publish_removals(recorded)

    def _timed_out_groups(self, at: datetime) -> list[eviction_store.PlannedRemoval]:
        planned = []
        for removal in timed_out_groups(self._state, now=at.timestamp(),
                                        removing=self._feed.removing):
            cluster, uid = jobs.split_job_id(removal.job_id)
            planned.append(eviction_store.PlannedRemoval(
                eviction_id=self._new_decision_id(), cluster=cluster, uid=uid,
                kind="group_timeout", action=removal.action.value, message=removal.message))
        return planned

    async def _publish_removals(self, removals: list[eviction_store.RecordedRemoval]) -> None:
        """Publish the notices that make the ungater remove the pods. A failed publish is only
        logged: the removals stay unpublished in Postgres and go out again later."""
        if not removals:
            return
        notices = [removal_notice(cluster=r.cluster, namespace=r.namespace, name=r.name,
                                  uid=r.uid, queue=r.queue, kind=r.kind, action=r.action,
                                  message=r.message, at=r.decided_at)
                   for r in removals]
        if not await self._publish_notices(notices, "pod removals",
                                           then="they go out again later"):
            return
        await eviction_store.mark_removals_published(
            self._connection, [r.eviction_id for r in removals], self._now())

    async def _republish_removals(self) -> None:
        """Removals recorded but not published (a leader died in between), or published long
        ago while the pod is still there (the notice went missing)."""
        now = self._now()
        after = timedelta(seconds=self._settings.republish_after_seconds)
        in_flight = await eviction_store.removals_in_flight(self._connection)
        self._feed.removing.update(jobs.job_id(r.cluster, r.uid) for r, _ in in_flight)
        due = [r for r, published in in_flight
               if eviction_store.due_again(published, now=now, after=after)]
        if due:
            log.warning("re-publishing %d pod removals (unpublished or not carried out)",
                        len(due))
            await self._publish_removals(due)

    # ---- notices --------------------------------------------------------------------------

    async def _notice(self) -> None:
        """Tell pods queued for a queue nobody defined, on the pod, why they stay gated.

        At most max_notices_per_round per round, each job once this term; the rest follow
        after later rounds. A failed publish is only logged: those jobs are due again next round.
        """
        limit = self._settings.max_notices_per_round
        notices_due = self._feed.notices
        if limit == 0 or not len(notices_due):
            return
        # A defined queue always stays in the state, so a queue the state does not hold (a
        # job's that is backing off) is undefined too.
        due = notices_due.due(is_undefined=lambda q: self._state.queue_spec(q) is None,
                              limit=limit)
        if not due:
            return
        notices, gone = queue_unknown_notices(due, keys=self._feed.key_of, at=self._now())
        for job_id in gone:  # the job is gone: nothing to tell
            notices_due.forget(job_id)
        if notices:
            if not await self._publish_notices(notices, "pod notices"):
                return
            NOTICES.labels(NoticeReason.QUEUE_UNKNOWN.value).inc(len(notices))
            log.info("noticed %d queued pods that their queue does not exist", len(notices))
        notices_due.noticed([job_id for job_id, _ in due])

    # ---- released pods kube-scheduler cannot place ---------------------------------------

    async def _give_up_unplaceable(self) -> bool:
        """Stop charging released pods kube-scheduler has reported Unschedulable for too long:
        tell each (an Event, deleting it if a controller owns it), record why in Postgres, and
        take it out of the state. Returns whether any was given up on (room may be free)."""
        settings = self._settings
        now = self._now().timestamp()
        due = self._feed.unplaceable_due(now, limit=max(1, settings.max_notices_per_round))
        if not due:
            return False
        at = self._now()
        give_ups = unplaceable_give_ups(
            due, now=now, at=at, delete_controlled=settings.delete_unplaceable_controlled)
        notices = [give_up.notice for give_up in give_ups if give_up.notice is not None]
        if notices:
            # Told before recorded: once recorded, the job is not due again.
            if not await self._publish_notices(notices, "unplaceable notices"):
                return False
            NOTICES.labels(NoticeReason.UNPLACEABLE.value).inc(len(notices))
        # Their controllers back off (lockgate.backoff), recorded with the give-up.
        backoffs = []
        for give_up in give_ups:
            if give_up.notice is None or not give_up.deleting:
                continue
            record = self._feed.give_up_controller(give_up.job, now)
            if record is not None:
                namespace, pod = give_up.notice.namespace, give_up.notice.name
                log.warning("controller %s of pod %s/%s in %s backs off for %.0fs: %s",
                            record.controller_uid, namespace, pod, record.cluster,
                            record.until - now, record.message())
                backoffs.append(store.BackoffRow(record, namespace, pod))
        await store.record_unplaceable(
            self._connection, keys=[jobs.split_job_id(job.job_id) for job in due],
            reasons=[give_up.reason for give_up in give_ups], at=at, backoffs=backoffs)
        self._feed.given_up(due)
        log.warning("gave up on %d released pods kube-scheduler kept reporting Unschedulable "
                    "(%d to be deleted for their controllers to replace)", len(due),
                    sum(n.delete_pod for n in notices))
        return True
    async def _tell_waiting(self) -> None:
        """Tell queued pods why they wait (Events, at a bounded rate), and have the ungater fail
        or delete those past their queue's maximum time queued.

        Both ride on lockgate.pod-notices.v1. A pod past its maximum leaves the state at once,
        so no round releases it while the ungater acts. A failed publish is only logged: the
        waiting notices are due again, the expiries are sent again, after a later round.
        """
        settings = self._settings
        waiting = self._feed.waiting
        at = self._now()
        now = at.timestamp()
        expired = self._feed.expired_due(now)
        due = (waiting.due(now, limit=settings.max_notices_per_round)
               if settings.wait_notices and settings.max_notices_per_round else [])
        if not expired and not due and not self._unsent_expiries:
            return
        kept = await store.kept_places(
            self._connection, [jobs.split_job_id(told) for told, first in due if first])
        # Each pod's place in line as `explain` gives it, from Postgres's index of the line
        # (not a pass over every job the leader holds).
        in_line = await job_views.queued_places(
            self._connection, [jobs.split_job_id(job_id)
                               for job_id in [*(told for told, _ in due),
                                              *(job_id for job_id, _ in expired)]])
        places = {jobs.job_id(cluster, uid): place for (cluster, uid), place in in_line.items()}
        kept_by_job = {jobs.job_id(cluster, uid): pod for (cluster, uid), pod in kept.items()}
        # The last round's picture: what the Events say is what status and explain say.
        picture = self._report.picture
        explainer = (picture.explainer(now=now) if picture is not None else Explainer(
            self._state, now=now, preemption=settings.preemption_enabled,
            group_reserve_after=settings.group_reserve_after_seconds,
            holds=settings.room_hold_seconds > 0))
        told: list[str] = []
        notices: list[PodNotice] = []
        expiries = self._unsent_expiries
        self._unsent_expiries = []
        # A slice at a time, giving the loop back in between: explaining pods of many clusters
        # costs each cluster's room and ranks, and a first `explain` waits for the loop.
        for start in range(0, max(len(due), 1), TELL_SLICE):
            decided = waiting_notices(
                self._feed, due=due[start:start + TELL_SLICE],
                expired=expired if start == 0 else [],
                kept=kept_by_job, places=places, rates=self._release_rates,
                explainer=explainer, at=at)
            told += decided.told
            notices += decided.waiting
            expiries += decided.expiries
            await asyncio.sleep(0)
        notices += expiries
        if not await self._publish_notices(notices, "pod notices"):
            waiting.untold(told, now)
            self._unsent_expiries = expiries
            return
        waiting.told(told, now)
        for notice in notices:
            NOTICES.labels(notice.reason).inc()
        if expiries:
            log.info("%d queued pods waited past their maximum time queued: told the ungater to "
                     "fail or delete them", len(expiries))

    # ---- publishing -----------------------------------------------------------------------

    async def _publish_notices(self, notices: list[PodNotice], what: str, *,
                               then: str = "retrying after a later round") -> bool:
        """Publish pod notices once; whether Kafka took them. A retryable failure is only
        logged (the caller keeps them due); any other is raised."""
        try:
            await publish_many(self._producer, POD_NOTICES, notices)
        except Exception as error:
            if not is_retryable_kafka_error(error):
                raise
            log.warning("publishing %d %s failed (%s); %s", len(notices), what, error, then,
                        extra=quiet("kafka"))
            return False
        return True

    async def _publish(self, releases: list[store.RecordedRelease], *,
                       growth: Mapping[str, str] | None = None,
                       narrowing: Mapping[str, tuple[Requirement, ...]] | None = None) -> None:
        """Publish release commands, retrying while Kafka is down; then note them published.
        `growth`: the words of the releases for growth, by job id (a command published again
        has none: only the round that decided knows them); `narrowing`: the node affinity
        requirements the ungater adds to those pods, by job id (likewise only this round's).

        If we stop (or lose the lead) before Kafka takes them, they stay unpublished in
        Postgres and the next leader publishes them.
        """
        commands = [
            ReleaseCommand(decision_id=r.decision_id, cluster=r.cluster, namespace=r.namespace,
                           name=r.name, uid=r.uid, queue=r.queue, decided_at=r.decided_at,
                           growth=(growth or {}).get(jobs.job_id(r.cluster, r.uid), ""),
                           node_requirements=(narrowing or {}).get(
                               jobs.job_id(r.cluster, r.uid), ()))
            for r in releases
        ]
        headers = [_release_span_headers(command) for command in commands]

        async def publish() -> None:
            self._check_leadership()
            await publish_many(self._producer, RELEASE_COMMANDS, commands,
                               headers_per_event=headers)

        try:
            await retry(publish, backoff=Backoff(self._settings.retry, stopping=self._stopping),
                        retryable=is_retryable_kafka_error,
                        on_failure=lambda error: self._readiness.set(
                            "kafka", False, f"publishing: {error}"),
                        what=f"publishing {len(commands)} release commands", dependency="kafka")
        except Stopped:
            return
        self._readiness.set("kafka", True, "publishing")
        for release in releases:
            DECISIONS.labels(release.queue).inc()
        await store.mark_published(self._connection, [r.decision_id for r in releases],
                                   self._now())

    async def _republish(self, *, include_unpublished: bool) -> None:
        stale = await store.decisions_to_republish(
            self._connection,
            unanswered_for=timedelta(seconds=self._settings.republish_after_seconds),
            now=self._now(), include_unpublished=include_unpublished)
        if stale:
            log.warning("re-publishing %d release commands (unpublished or unanswered)",
                        len(stale))
            REPUBLISHED.inc(len(stale))
            await self._publish(stale)

    # ---- leadership and wake-ups ----------------------------------------------------------

    async def _listen(self, listener: asyncpg.Connection | None) -> asyncpg.Connection | None:
        """The LISTEN connection, (re)connected if needed; None while that fails (the periodic
        round then keeps the state current)."""
        if listener is not None and not listener.is_closed():
            return listener
        try:
            listener = await store.connect(self._settings.postgres_dsn)
            await listener.add_listener(CHANGES_CHANNEL, self._on_notification)
            listener.add_termination_listener(self._on_listener_lost)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            log.warning("cannot LISTEN for changes (%s); relying on periodic rounds", error)
            return None
        self._wake.set()  # notifications may have been missed while not listening
        return listener

    def _on_notification(self, *_: object) -> None:
        self._wake.set()

    def _on_listener_lost(self, _: object) -> None:
        self._wake.set()

    def _on_leader_connection_lost(self, _: object) -> None:
        self._lost.set()
        self._wake.set()

    async def _check_connection_answers(self) -> None:
        """Step down (raise) if the leader connection no longer answers: it may have died
        silently, and then the lock is as good as lost (Postgres ends that session once it has
        been idle for leader_idle_session_timeout_seconds)."""
        timeout = self._settings.leader_check_timeout_seconds
        try:
            await store.check_alive(self._connection, within_seconds=timeout)
        except TimeoutError as error:
            raise LeadershipLostError(
                f"the leader connection did not answer within {timeout:g}s") from error

    def _check_leadership(self) -> None:
        if self._lost.is_set() or self._connection.is_closed():
            raise LeadershipLostError("the leader connection closed")

    async def _wake_on(self, stopping: asyncio.Event) -> None:
        await stopping.wait()
        self._wake.set()


async def _close_quietly(connection: asyncpg.Connection) -> None:
    try:
        await connection.close(timeout=2)
    except Exception:  # noqa: BLE001 - a connection that cannot close cleanly is terminated
        connection.terminate()
