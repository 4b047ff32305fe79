"""cluster-watcher's outbox: order kept, capacity coalesced, watchers held back when it is full."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from opentelemetry import trace

from cluster_watcher.publishing import (
    Outbox,
    Outgoing,
    capacity_message,
    growth_message,
    pod_event_message,
    runs_by_topic,
    snapshot_message,
)
from lockgate.events import (
    CLUSTER_CAPACITY,
    CLUSTER_SNAPSHOTS,
    POD_EVENTS,
    ClusterCapacity,
    ClusterGrowth,
    ClusterSnapshot,
    PodEvent,
)
from lockgate.jobs import JobState
from lockgate_adapters.telemetry import pod_trace_parent

T0 = datetime(2026, 1, 2, tzinfo=UTC)
UID = "0b6d3c2e-1f4a-4c1b-9a8e-2d3c4b5a6f70"


def a_pod_event(name: str, state: JobState = JobState.QUEUED) -> Outgoing:
    return pod_event_message(PodEvent(
        event_id=f"e-{name}-{state}", cluster="c", namespace="ns", name=name, uid=f"uid-{name}",
        state=state, queue="q", jobset="js", created_at=T0, observed_at=T0))


def a_capacity(cluster: str = "c") -> Outgoing:
    return capacity_message(ClusterCapacity(cluster=cluster, observed_at=T0, nodes=[]))


def a_snapshot() -> Outgoing:
    return snapshot_message(ClusterSnapshot(snapshot_id="s", cluster="c", listed_at=T0,
                                            pod_uids=[]))


async def test_messages_leave_in_the_order_they_were_seen_and_capacity_comes_last() -> None:
    outbox = Outbox(max_pending=100)
    first, second = a_pod_event("a"), a_pod_event("a", JobState.UNGATED)
    capacity, snapshot = a_capacity(), a_snapshot()
    await outbox.put([first, second])
    outbox.put_capacity(capacity)
    await outbox.put([snapshot])
    assert outbox.peek(10) == [first, second, snapshot, capacity]
    assert outbox.peek(1) == [first, capacity]
    assert [[m.topic for m in run] for run in runs_by_topic(outbox.peek(10))] == [
        [POD_EVENTS, POD_EVENTS], [CLUSTER_SNAPSHOTS], [CLUSTER_CAPACITY]]

    outbox.acknowledge(outbox.peek(1))
    assert outbox.peek(10) == [second, snapshot]
    assert len(outbox) == 2


async def test_only_the_newest_unsent_capacity_of_a_cluster_is_kept() -> None:
    outbox = Outbox(max_pending=100)
    old, other_cluster = a_capacity("c"), a_capacity("d")
    outbox.put_capacity(old)
    outbox.put_capacity(other_cluster)
    in_flight = outbox.peek(10)
    newer = a_capacity("c")
    outbox.put_capacity(newer)  # arrives while the older one is being sent
    outbox.acknowledge(in_flight)
    assert outbox.peek(10) == [newer], "acknowledging the older one must not drop the newer"


def a_growth(cluster: str = "c", *, autoscaled: bool = True) -> Outgoing:
    return growth_message(ClusterGrowth(cluster=cluster, observed_at=T0, autoscaled=autoscaled))


async def test_a_clusters_growth_is_coalesced_apart_from_its_capacity() -> None:
    outbox = Outbox(max_pending=100)
    capacity, old_growth, other = a_capacity("c"), a_growth("c"), a_growth("d")
    outbox.put_capacity(capacity)
    outbox.put_growth(old_growth)
    outbox.put_growth(other)
    in_flight = outbox.peek(10)
    assert in_flight == [capacity, old_growth, other]
    newer = a_growth("c", autoscaled=False)
    outbox.put_growth(newer)  # arrives while the older one is being sent
    outbox.acknowledge(in_flight)
    assert outbox.peek(10) == [newer], "acknowledging the older one must not drop the newer"
    assert len(outbox) == 1


async def test_a_full_outbox_holds_watchers_back_until_kafka_acknowledges() -> None:
    outbox = Outbox(max_pending=2)
    a, b, c = a_pod_event("a"), a_pod_event("b"), a_pod_event("c")
    await outbox.put([a, b])
    blocked = asyncio.create_task(outbox.put([c]))
    await asyncio.sleep(0.01)
    assert not blocked.done()
    outbox.acknowledge(outbox.peek(1))
    await asyncio.wait_for(blocked, 1)
    assert [m.event for m in outbox.peek(10)] == [b.event, c.event]


async def test_a_closed_outbox_wakes_the_publisher() -> None:
    outbox = Outbox(max_pending=2)
    waiting = asyncio.create_task(outbox.wait_for_messages())
    await asyncio.sleep(0)
    outbox.close()
    await asyncio.wait_for(waiting, 1)
    assert outbox.closed and not outbox


def test_a_pods_trace_id_is_its_uid() -> None:
    parent = trace.get_current_span(pod_trace_parent(UID)).get_span_context()
    assert format(parent.trace_id, "032x") == UID.replace("-", "")
    assert parent.span_id != 0 and parent.is_remote
    # Not a UUID: a trace of its own rather than an error.
    assert not trace.get_current_span(pod_trace_parent("x")).get_span_context().is_valid


def test_a_pods_observed_span_links_to_the_admission_that_gated_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from cluster_watcher import publishing
    from helpers.pods import a_pod
    from lockgate.labels import ADMISSION_TRACE_ANNOTATION, SCHEDULING_GATE
    from lockgate.observing import pod_event

    admission = "00-11111111111111111111111111111111-2222222222222222-01"
    pod = (a_pod("p").in_namespace("ns").with_uid(UID).in_queue("q").gated(SCHEDULING_GATE)
           .annotated({ADMISSION_TRACE_ANNOTATION: admission}).obj())
    event = pod_event(pod, cluster="c", event_id="e", observed_at=T0)
    assert event.admission_trace == admission

    monkeypatch.setattr(publishing, "tracer", TracerProvider().get_tracer("test"))
    span = pod_event_message(event).span
    (link,) = span.links  # type: ignore[attr-defined]
    assert format(link.context.trace_id, "032x") == "1" * 32
    assert format(link.context.span_id, "016x") == "2" * 16
    assert format(span.get_span_context().trace_id, "032x") == UID.replace("-", "")
    span.end()
    # A malformed annotation is no link rather than an error.
    assert pod_event_message(event.model_copy(update={"admission_trace": "junk"})).span.links == ()
