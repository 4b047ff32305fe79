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
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import asyncpg
from aiokafka import AIOKafkaProducer
from opentelemetry import trace
from prometheus_client import Counter as MetricCounter

from fair_scheduler.reporting import FairnessReport
from fair_scheduler.settings import SchedulerSettings
from lockgate.change_feed import START
from lockgate.events import POD_NOTICES, RELEASE_COMMANDS, PodNotice, ReleaseCommand
from lockgate.groups import GroupTimeoutAction
from lockgate.noticing import NoticeReason, queue_unknown_message
from lockgate.places import kept_place_note
from lockgate.scheduler import (
    EVENT_REASONS,
    MAX_QUEUED_EVENT_REASON,
    QUEUED_EVENT_REASON,
    Explainer,
    Feed,
    PreemptionPolicy,
    RoundResult,
    SchedJob,
    SchedulerState,
    TargetProblem,
    TargetsKey,
    format_duration,
    plan_evictions,
    positions,
    schedule_round,
    timed_out,
    timeout_message,
)
from lockgate.scheduler.collection import RoundCollector
from lockgate.unplaceable import event_message, last_reason
from lockgate.wait_estimates import ReleaseRates
from lockgate_adapters import eviction_store
from lockgate_adapters import scheduler_store as store
from lockgate_adapters.health import Readiness
from lockgate_adapters.kafka import is_retryable_kafka_error, publish_many
from lockgate_adapters.postgres import CHANGES_CHANNEL
from lockgate_adapters.quieting import quiet
from lockgate_adapters.retrying import BackoffIterator, sleep_unless_stopped
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
        self._release_rates = ReleaseRates()  # for the wait estimates of notices
        self._state = self._feed.state
        self._unsent_expiries: list[PodNotice] = []
        self._preemption = PreemptionPolicy(
            preemptible_priority_classes=frozenset(settings.preemptible_priority_classes),
            max_evictions_per_round=settings.max_evictions_per_round)
        # Collects after each round what the round left (lockgate.scheduler.collection).
        self._collector = RoundCollector(settings.gc_full_collection_seconds)
        self._cursor = START
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
        last_round_ended = -math.inf
        while not stopping.is_set():
            if not more_to_do:
                wall = self._now().timestamp()
                feed_due = time.monotonic() + (self._feed.next_due() - wall)
                timeout = max(0.0, min(next_safety_round, next_republish, next_check,
                                       next_waiting_check, feed_due)
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

    # ---- state ----------------------------------------------------------------------------

    async def _load(self) -> None:
        started = time.monotonic()
        everything = await store.load_everything(self._connection)
        self._feed.load_backoffs(everything.backoffs, self._now().timestamp())
        if everything.backoffs:
            log.info("loaded %d controller back-offs", len(everything.backoffs))
        self._apply(everything)
        log.info("loaded %d queues, %d nodes, %d unfinished jobs as of %s in %.2fs",
                 len(everything.queues), len(everything.nodes), len(everything.jobs),
                 everything.cursor, time.monotonic() - started)

    def _apply(self, changes: store.Changes) -> bool:
        """Apply changed rows; returns whether any could let a round release something new."""
        feed = self._feed
        changed = bool(changes.queues or changes.nodes)
        for queue in changes.queues:
            feed.apply_queue(queue.name, queue.spec)
        for node in changes.nodes:
            feed.apply_node(node.cluster, node.node, node.info)
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
                    cluster, uid = store.split_job_id(decision.job_id)
                    planned.append((self._new_decision_id(), cluster, uid))
                recorded = await store.record_releases(
                    self._connection, decisions=planned, decided_at=decided_at,
                    decided_by=settings.instance_id)
            except BaseException:
                transaction.rollback()
                raise
            kept = {store.job_id(release.cluster, release.uid) for release in recorded}
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
                await self._publish(recorded)
            await self._remove(result, decided_at)
            seconds = time.perf_counter() - started
            # Inside the span, so the record carries the round's trace and span ids.
            if recorded:
                log.info("round (%s): released %d of %d decided in %.1f ms", trigger,
                         len(recorded), len(planned), seconds * 1000)
            else:
                log.debug("round (%s): nothing to release (%.1f ms)", trigger, seconds * 1000)
        self._report.record_round(result, phases=self._feed.phases, at=decided_at,
                                  seconds=seconds,
                                  decisions=len(recorded))
        self._collector.after_round()
        self._hand_over_targets()
        return len(result.decisions) >= settings.max_decisions_per_round

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
                cluster, uid = store.split_job_id(eviction.job_id)
                planned.append(eviction_store.PlannedRemoval(
                    eviction_id=self._new_decision_id(), cluster=cluster, uid=uid,
                    kind="preempted", action="delete", message=eviction.message,
                    for_queue=eviction.for_queue,
                    for_uid=store.split_job_id(eviction.for_job)[1]))
        planned += self._timed_out_groups(at)
        if not planned:
            return
        self._feed.removing.update(store.job_id(p.cluster, p.uid) for p in planned)
        recorded = await eviction_store.record_removals(
            self._connection, planned, decided_at=at, decided_by=self._settings.instance_id)
        for removal in recorded:
            REMOVALS.labels(removal.kind, removal.queue).inc()
            log.info("removing pod %s/%s/%s of queue %s (%s, %s): %s", removal.cluster,
                     removal.namespace, removal.name, removal.queue, removal.kind,
                     removal.action, removal.message)
        await self._publish_removals(recorded)

    def _timed_out_groups(self, at: datetime) -> list[eviction_store.PlannedRemoval]:
        state = self._state
        timeouts: dict[str, float | None] = {}
        actions: dict[str, GroupTimeoutAction] = {}
        for name in state.queue_names():
            spec = state.queue_spec(name)
            if spec is not None:
                timeouts[name] = spec.group_timeout_seconds
                actions[name] = spec.group_timeout_action
        planned = []
        groups = state.groups()
        for status in timed_out(groups, now=at.timestamp(), timeout_of=timeouts):
            queue = status.key[1]
            timeout = timeouts[queue]
            assert timeout is not None
            message = timeout_message(status, timeout=timeout, action=actions[queue])
            for job_id in groups.queued_members(status.key):
                if job_id in self._feed.removing:
                    continue
                cluster, uid = store.split_job_id(job_id)
                planned.append(eviction_store.PlannedRemoval(
                    eviction_id=self._new_decision_id(), cluster=cluster, uid=uid,
                    kind="group_timeout", action=actions[queue].value, message=message))
        return planned

    async def _publish_removals(self, removals: list[eviction_store.RecordedRemoval]) -> None:
        """Publish the notices that make the ungater remove the pods. A failed publish is only
        logged: the removals stay unpublished in Postgres and go out again later."""
        if not removals:
            return
        reasons = {"preempted": NoticeReason.PREEMPTED,
                   "group_timeout": NoticeReason.GROUP_TIMED_OUT}
        notices = [PodNotice(cluster=r.cluster, namespace=r.namespace, name=r.name, uid=r.uid,
                             queue=r.queue, reason=reasons[r.kind].value, message=r.message,
                             at=r.decided_at, action="delete" if r.action == "delete" else "fail")
                   for r in removals]
        try:
            await publish_many(self._producer, POD_NOTICES, notices)
        except Exception as error:
            if not is_retryable_kafka_error(error):
                raise
            log.warning("publishing %d pod removals failed (%s); they go out again later",
                        len(notices), error, extra=quiet("kafka"))
            return
        await eviction_store.mark_removals_published(
            self._connection, [r.eviction_id for r in removals], self._now())

    async def _republish_removals(self) -> None:
        """Removals recorded but not published (a leader died in between), or published long
        ago while the pod is still there (the notice went missing)."""
        now = self._now()
        after = timedelta(seconds=self._settings.republish_after_seconds)
        in_flight = await eviction_store.removals_in_flight(self._connection)
        self._feed.removing.update(store.job_id(r.cluster, r.uid) for r, _ in in_flight)
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
        keys = [store.split_job_id(job_id) for job_id, _ in due]
        names = await store.pod_names(self._connection, keys)
        at = self._now()
        notices = []
        for (job_id, queue), (cluster, uid) in zip(due, keys, strict=True):
            found = names.get((cluster, uid))
            if found is None:  # the row is gone: nothing to tell
                notices_due.forget(job_id)
                continue
            notices.append(PodNotice(
                cluster=cluster, namespace=found[0], name=found[1], uid=uid, queue=queue,
                reason=NoticeReason.QUEUE_UNKNOWN.value, message=queue_unknown_message(queue),
                at=at))
        if notices:
            try:
                await publish_many(self._producer, POD_NOTICES, notices)
            except Exception as error:
                if not is_retryable_kafka_error(error):
                    raise
                log.warning("publishing %d pod notices failed (%s); retrying after a later "
                            "round", len(notices), error, extra=quiet("kafka"))
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
        keys = [store.split_job_id(job.job_id) for job in due]
        names = await store.pod_names(self._connection, keys)
        at = self._now()
        notices = []
        deleted: list[tuple[SchedJob, str, str]] = []
        for job, (cluster, uid) in zip(due, keys, strict=True):
            found = names.get((cluster, uid))
            if found is None:
                continue
            deleting = job.controlled and settings.delete_unplaceable_controlled
            if deleting:
                deleted.append((job, found[0], found[1]))
            notices.append(PodNotice(
                cluster=cluster, namespace=found[0], name=found[1], uid=uid, queue=job.queue,
                reason=NoticeReason.UNPLACEABLE.value,
                message=event_message(job, now, deleting=deleting), at=at,
                delete_pod=deleting))
        if notices:
            # Told before recorded: once recorded, the job is not due again.
            try:
                await publish_many(self._producer, POD_NOTICES, notices)
            except Exception as error:
                if not is_retryable_kafka_error(error):
                    raise
                log.warning("publishing %d unplaceable notices failed (%s); retrying after a "
                            "later round", len(notices), error, extra=quiet("kafka"))
                return False
            NOTICES.labels(NoticeReason.UNPLACEABLE.value).inc(len(notices))
        # Their controllers back off (lockgate.backoff), recorded with the give-up.
        backoffs = []
        for job, namespace, pod in deleted:
            record = self._feed.give_up_controller(job, now)
            if record is not None:
                log.warning("controller %s of pod %s/%s in %s backs off for %.0fs: %s",
                            record.controller_uid, namespace, pod, record.cluster,
                            record.until - now, record.message())
                backoffs.append(store.BackoffRow(record, namespace, pod))
        await store.record_unplaceable(
            self._connection, keys=keys, reasons=[last_reason(job, now) for job in due], at=at,
            backoffs=backoffs)
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
        state = self._state
        waiting = self._feed.waiting
        at = self._now()
        now = at.timestamp()
        expired = self._feed.expired_due(now)
        due = (waiting.due(now, limit=settings.max_notices_per_round)
               if settings.wait_notices and settings.max_notices_per_round else [])
        if not expired and not due and not self._unsent_expiries:
            return
        ids = [job_id for job_id, _ in due] + [job_id for job_id, _ in expired]
        keys = [store.split_job_id(job_id) for job_id in ids]
        names = await store.pod_names(self._connection, keys)
        kept = await store.kept_places(
            self._connection, [store.split_job_id(job_id) for job_id, first in due if first])
        places = positions(state, ids)
        explainer = Explainer(state, now=now, preemption=self._settings.preemption_enabled,
                              group_reserve_after=settings.group_reserve_after_seconds,
                              holds=settings.room_hold_seconds > 0)
        told: list[str] = []
        waiting_notices: list[PodNotice] = []
        for job_id, first in due:
            cluster, uid = store.split_job_id(job_id)
            found = names.get((cluster, uid))
            explanation = explainer.explain(job_id, places.get(job_id))
            if found is None or explanation is None or explanation.reason is None:
                waiting.forget(job_id)
                continue
            reason, warning = EVENT_REASONS[explanation.reason]
            waiting_notices.append(PodNotice(
                cluster=cluster, namespace=found[0], name=found[1], uid=uid,
                queue=explanation.queue, reason=QUEUED_EVENT_REASON if first else reason,
                message=("queued: " if first else "still waiting: ")
                + (kept_place_note(deleted_pod=kept[(cluster, uid)],
                                   waited=format_duration(explanation.waited_seconds))
                   if first and (cluster, uid) in kept else "")
                + explanation.message + "; "
                + self._release_rates.estimate_for(explanation, now=now).text(),
                at=at, event_type="Warning" if warning else "Normal",
                series="" if first else str(int(now))))
            told.append(job_id)
        expiries = self._unsent_expiries
        self._unsent_expiries = []
        for job_id, limit in expired:
            cluster, uid = store.split_job_id(job_id)
            found = names.get((cluster, uid))
            if found is None:
                continue
            explanation = explainer.explain(job_id, places.get(job_id))
            # Out of the state: no round may release it while the ungater acts.
            job = self._feed.expire(job_id)
            if job is None:
                continue
            waited = format_duration(now - job.created_at)
            why = "" if explanation is None else f"; it was waiting: {explanation.message}"
            done = "failed" if limit.action == "fail" else "deleted"
            whose = f'queue "{job.queue}"' if limit.by == "queue" else "its job set"
            expiries.append(PodNotice(
                cluster=cluster, namespace=found[0], name=found[1], uid=uid, queue=job.queue,
                reason=MAX_QUEUED_EVENT_REASON, event_type="Warning", action=limit.action, at=at,
                message=(f"lockgate {done} this pod: it waited {waited} queued, longer than "
                         f"{whose} allows ({format_duration(limit.seconds)}){why}")))
        notices = waiting_notices + expiries
        try:
            await publish_many(self._producer, POD_NOTICES, notices)
        except Exception as error:
            if not is_retryable_kafka_error(error):
                raise
            log.warning("publishing %d pod notices failed (%s); retrying after a later round",
                        len(notices), error, extra=quiet("kafka"))
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

    async def _publish(self, releases: list[store.RecordedRelease]) -> None:
        """Publish release commands, retrying while Kafka is down; then note them published.

        If we stop (or lose the lead) before Kafka takes them, they stay unpublished in
        Postgres and the next leader publishes them.
        """
        commands = [
            ReleaseCommand(decision_id=r.decision_id, cluster=r.cluster, namespace=r.namespace,
                           name=r.name, uid=r.uid, queue=r.queue, decided_at=r.decided_at)
            for r in releases
        ]
        headers = [_release_span_headers(command) for command in commands]
        delays = BackoffIterator(self._settings.retry)
        while True:
            self._check_leadership()
            try:
                await publish_many(self._producer, RELEASE_COMMANDS, commands,
                                   headers_per_event=headers)
                break
            except Exception as error:
                if not is_retryable_kafka_error(error):
                    raise
                delay = next(delays, self._settings.retry.max_seconds)
                self._readiness.set("kafka", False, f"publishing: {error}")
                log.warning("publishing %d release commands failed (%s); retrying in %.1fs",
                            len(commands), error, delay, extra=quiet("kafka"))
                await sleep_unless_stopped(self._stopping, delay)
                if self._stopping.is_set():
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
