"""Carrying out release commands: settle each one against its cluster, then publish the outcome.

Why this shape: one batch of commands from Kafka fans out into one task per pod (commands for
the same pod stay in order), bounded per cluster so a busy apiserver sees a steady number of
requests in flight. Each command ends in exactly one outcome, published before the batch's
offsets are committed; a crash in between redelivers the commands, which are idempotent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer
from opentelemetry import trace
from prometheus_client import Counter, Gauge, Histogram

from lockgate.events import RELEASE_OUTCOMES, ReleaseCommand, ReleaseOutcomeKind
from lockgate.noticing import event_for, growth_release_notice, not_narrowed_notice
from lockgate.releasing import (
    FailureKind,
    JsonPatch,
    PatchNeeded,
    PodGates,
    Settled,
    classify_failure,
    describe_requirements,
    narrowing_was_refused,
    outcome_of,
    plan_release,
    ungate_patch,
)
from lockgate_adapters.kafka import Received, publish
from lockgate_adapters.retrying import Backoff, retry
from lockgate_adapters.settings import RetryPolicy
from ungater.pods import KubeCallError, PodGateClient

log = logging.getLogger(__name__)
tracer = trace.get_tracer("lockgate.ungater")

RELEASES = Counter("lockgate_ungater_releases", "Release commands settled, by outcome",
                   ["cluster", "outcome"])
RELEASE_SECONDS = Histogram(
    "lockgate_ungater_release_duration_seconds",
    "Seconds from receiving a release command to its outcome",
    ["cluster"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
)
DECISION_TO_OUTCOME_SECONDS = Histogram(
    "lockgate_ungater_decision_to_outcome_seconds",
    "Seconds from the scheduler's decision to the release's outcome",
    ["cluster"], buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
)
APISERVER_FAILURES = Counter("lockgate_ungater_apiserver_failures",
                             "Failed apiserver calls, by how they were handled",
                             ["cluster", "kind"])
IN_FLIGHT = Gauge("lockgate_ungater_apiserver_calls_in_flight",
                  "Apiserver calls currently in flight (count)", ["cluster"])
GROWTH_EVENTS = Counter("lockgate_ungater_growth_events",
                        "Events on pods released for growth, by cluster and result",
                        ["cluster", "result"])
NARROWING_REFUSED = Counter(
    "lockgate_ungater_narrowing_refused",
    "Pods released without the node affinity their command asked for (the apiserver refused "
    "it), by cluster", ["cluster"])
SKIPPED = Counter("lockgate_ungater_commands_skipped",
                  "Commands for clusters this ungater does not serve")


class ClusterReleaser:
    """Settles release commands for one cluster: patch, re-read, retry, or give up."""

    def __init__(
        self,
        *,
        cluster: str,
        pods: PodGateClient,
        retry_policy: RetryPolicy,
        give_up_after: float,
        max_in_flight: int,
        max_rereads: int,
        optimistic_first_patch: bool,
        on_ready: Callable[[bool, str], None] = lambda ready, detail: None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.cluster = cluster
        self._pods = pods
        self._policy = retry_policy
        self._give_up_after = give_up_after
        self._slots = asyncio.Semaphore(max_in_flight)
        self._max_rereads = max_rereads
        self._optimistic = optimistic_first_patch
        self._on_ready = on_ready
        self._monotonic = monotonic
        self._sleep = sleep
        self._reachable = True

    async def settle(self, command: ReleaseCommand) -> Settled:
        """Remove lockgate's gate from the command's pod (narrowing its node affinity first when
        the command asks, in the same patch), or say why that is not possible."""
        rereads = 0
        narrowing = command.node_requirements
        # Guessing index 0 saves the read in the common case; the patch's tests make a wrong
        # guess fail harmlessly (422), and then the pod is read. A narrowing needs the pod's
        # affinity, so it is always read first.
        plan: PatchNeeded | None = (
            PatchNeeded(ungate_patch(uid=command.uid, index=0))
            if self._optimistic and not narrowing else None
        )
        refused = ""  # why the apiserver refused the narrowing ("": it did not)

        async def attempt() -> Settled:
            """Settled, or a retryable KubeCallError (the apiserver down or busy)."""
            nonlocal plan, rereads, refused
            while True:
                try:
                    if plan is None:
                        planned = plan_release(uid=command.uid, pod=await self._read(command),
                                               requirements=narrowing,
                                               narrowing_refused=bool(refused))
                        if isinstance(planned, Settled):
                            return planned
                        plan = planned
                    await self._patch(command, plan.patch)
                    if refused:
                        await self.tell_not_narrowed(command, refused=refused,
                                                     at=datetime.now(UTC))
                        return Settled(ReleaseOutcomeKind.UNGATED,
                                       f"gate removed; node affinity not narrowed: {refused}")
                    return Settled(ReleaseOutcomeKind.UNGATED,
                                   "gate removed, node affinity narrowed" if plan.narrows_at
                                   else "gate removed")
                except KubeCallError as error:
                    kind = classify_failure(error.status, reading=error.reading)
                    APISERVER_FAILURES.labels(self.cluster, kind.value).inc()
                    if kind is FailureKind.POD_GONE:
                        return Settled(ReleaseOutcomeKind.POD_GONE, "pod not found")
                    if kind is FailureKind.PERMANENT:
                        return Settled(ReleaseOutcomeKind.FAILED, f"apiserver refused: {error}")
                    if kind is FailureKind.REREAD:
                        rereads += 1
                        if rereads > self._max_rereads:
                            return Settled(ReleaseOutcomeKind.FAILED,
                                           f"patch rejected {rereads} times; last: {error}")
                        if plan is not None and plan.narrows_at and not refused:
                            pod = await self._read(command)
                            if narrowing_was_refused(plan, uid=command.uid, pod=pod):
                                # The pod is as planned from: the narrowing itself was
                                # refused. Release it anyway; the pod goes as it came.
                                refused = error.detail
                                NARROWING_REFUSED.labels(self.cluster).inc()
                                log.warning(
                                    "%s: %s/%s: node affinity not narrowed (%s), releasing "
                                    "without it: %s", self.cluster, command.namespace,
                                    command.name, describe_requirements(narrowing), error)
                        plan = None
                        continue
                    # Retryable. Keep the same patch: if the lost attempt did apply, the retry
                    # fails its test and the re-read finds the gate gone.
                    raise

        backoff = Backoff(self._policy, give_up_after=self._give_up_after,
                          clock=self._monotonic, sleep=self._sleep)
        try:
            return await retry(
                attempt, backoff=backoff,
                retryable=lambda error: isinstance(error, KubeCallError),
                on_failure=lambda error: self._mark_reachable(False, str(error)),
                retry_after=lambda error: (error.retry_after
                                           if isinstance(error, KubeCallError) else None),
                what=f"{self.cluster}: releasing {command.namespace}/{command.name}",
                dependency=f"apiserver:{self.cluster}")
        except KubeCallError as error:
            return Settled(ReleaseOutcomeKind.FAILED,
                           f"gave up after {self._give_up_after:.0f}s: {error}")

    async def _read(self, command: ReleaseCommand) -> PodGates | None:
        async with self._slots:
            IN_FLIGHT.labels(self.cluster).inc()
            try:
                pod = await self._pods.read(namespace=command.namespace, name=command.name)
            finally:
                IN_FLIGHT.labels(self.cluster).dec()
        self._mark_reachable(True, "apiserver answering")
        return pod

    async def _patch(self, command: ReleaseCommand, patch: JsonPatch) -> None:
        async with self._slots:
            IN_FLIGHT.labels(self.cluster).inc()
            try:
                await self._pods.patch(namespace=command.namespace, name=command.name,
                                       patch=patch)
            finally:
                IN_FLIGHT.labels(self.cluster).dec()
        self._mark_reachable(True, "apiserver answering")

    async def tell_not_narrowed(self, command: ReleaseCommand, *, refused: str,
                                at: datetime) -> None:
        """A Warning Event on a pod released without the node affinity its command asked for.
        Best effort, like the growth Event: the release is done whatever becomes of it."""
        notice = not_narrowed_notice(command, refused=refused, at=at)
        try:
            async with self._slots:
                await self._pods.create_event(namespace=command.namespace,
                                              body=event_for(notice))
        except KubeCallError as error:
            log.info("no Event on %s/%s/%s: %s", command.cluster, command.namespace,
                     command.name, error)

    async def tell_growth(self, command: ReleaseCommand, *, at: datetime) -> None:
        """Write a release for growth's words on its pod (a Normal Event), once it is ungated.

        Best effort: the release is done whatever becomes of the Event, so a failure is counted
        and logged, never retried (`lockgate explain` says the same words while it waits)."""
        notice = growth_release_notice(command, at=at)
        if notice is None:
            return
        try:
            async with self._slots:
                await self._pods.create_event(namespace=command.namespace,
                                              body=event_for(notice))
        except KubeCallError as error:
            GROWTH_EVENTS.labels(self.cluster, "failed").inc()
            log.info("no growth Event on %s/%s/%s: %s", command.cluster, command.namespace,
                     command.name, error)
            return
        GROWTH_EVENTS.labels(self.cluster, "written").inc()

    def _mark_reachable(self, reachable: bool, detail: str) -> None:
        if reachable != self._reachable:
            self._reachable = reachable
            self._on_ready(reachable, detail)


class Ungater:
    """Handles batches of release commands for the clusters it serves."""

    def __init__(
        self,
        *,
        releasers: dict[str, ClusterReleaser],
        producer: AIOKafkaProducer,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._releasers = releasers
        self._producer = producer
        self._now = now

    async def handle(
        self,
        batch: list[Received[ReleaseCommand]],
        reject: Callable[[Received[ReleaseCommand], str], Awaitable[None]],
    ) -> None:
        """Settle every served command of the batch and publish its outcome; return when all are
        published (the consumer commits the batch's offsets after that)."""
        per_pod: dict[tuple[str, str], list[Received[ReleaseCommand]]] = {}
        for item in batch:
            if item.event.cluster not in self._releasers:
                SKIPPED.inc()
                continue
            per_pod.setdefault((item.event.cluster, item.event.uid), []).append(item)
        if not per_pod:
            return
        async with asyncio.TaskGroup() as group:
            for items in per_pod.values():
                group.create_task(self._release_in_order(items))

    async def _release_in_order(self, items: list[Received[ReleaseCommand]]) -> None:
        for item in items:
            await self.release(item)

    async def release(self, item: Received[ReleaseCommand]) -> None:
        command = item.event
        releaser = self._releasers[command.cluster]
        started = time.monotonic()
        with tracer.start_as_current_span(
            "ungate",
            context=item.trace_context,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "lockgate.cluster": command.cluster,
                "lockgate.namespace": command.namespace,
                "lockgate.pod": command.name,
                "lockgate.uid": command.uid,
                "lockgate.decision_id": command.decision_id,
                "lockgate.queue": command.queue,
            },
        ) as span:
            settled = await releaser.settle(command)
            span.set_attribute("lockgate.outcome", settled.outcome.value)
            span.set_attribute("lockgate.reason", settled.reason)
            outcome = outcome_of(command, settled, at=self._now())
            if settled.outcome is ReleaseOutcomeKind.UNGATED:
                await releaser.tell_growth(command, at=outcome.at)
            # Inside the span, so the outcome's headers continue this trace and the log record
            # carries the pod's trace id.
            await publish(self._producer, RELEASE_OUTCOMES, outcome)
            log.log(logging.DEBUG if settled.outcome is ReleaseOutcomeKind.UNGATED
                    else logging.INFO, "release %s of %s/%s/%s: %s (%s)", command.decision_id,
                    command.cluster, command.namespace, command.name, settled.outcome.value,
                    settled.reason)
        RELEASES.labels(command.cluster, settled.outcome.value).inc()
        RELEASE_SECONDS.labels(command.cluster).observe(time.monotonic() - started)
        DECISION_TO_OUTCOME_SECONDS.labels(command.cluster).observe(
            max(0.0, (outcome.at - command.decided_at).total_seconds()))
