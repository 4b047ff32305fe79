"""Why a queued pod waits, when it is told, and when it has waited too long (lockgate.scheduler)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import a_job, a_node, a_queue, a_state

from lockgate.events import POD_NOTICES, PodNotice
from lockgate.jobs import JobState
from lockgate.max_queued import Limit
from lockgate.noticing import event_for, event_name
from lockgate.queues import MaxQueued, QueueSpec
from lockgate.scheduler import (
    NoticeLimits,
    TokenBucket,
    WaitFacts,
    WaitingPods,
    WaitReason,
    choose_reason,
    explain,
    format_amount,
    format_duration,
    queue_statuses,
    schedule_round,
)

WAITING = WaitFacts(queue_defined=True, cordoned=False, cluster_has_nodes=True,
                    fits_some_node=True, over_queue_limit=False, fits_free_room=False,
                    at_fair_share=False, others_below_share_waiting=False)


@pytest.mark.parametrize(("change", "want"), [
    ({}, WaitReason.CLUSTER_ROOM),
    ({"fits_free_room": True}, WaitReason.NEXT_ROUND),
    ({"at_fair_share": True, "others_below_share_waiting": True}, WaitReason.FAIR_SHARE),
    # At its share but nobody else waits: it is room it lacks, not fairness.
    ({"at_fair_share": True}, WaitReason.CLUSTER_ROOM),
    ({"fits_some_node": False}, WaitReason.NODE_FIT),
    ({"cluster_has_nodes": False, "fits_some_node": False}, WaitReason.NO_NODES),
    ({"over_queue_limit": True}, WaitReason.QUEUE_LIMIT),
    # The most blocking reason wins: a cordoned queue releases nothing, whatever the room.
    ({"cordoned": True, "fits_some_node": False}, WaitReason.QUEUE_CORDONED),
    ({"queue_defined": False, "cordoned": True}, WaitReason.QUEUE_UNKNOWN),
    # Its controller backs off: released at the earliest when that ends, whatever the room.
    ({"backing_off": True, "fits_some_node": False}, WaitReason.BACKING_OFF),
    ({"backing_off": True, "cordoned": True}, WaitReason.QUEUE_CORDONED),
    # A pod group short of members: neither limits nor room can be judged until it is whole.
    ({"group_incomplete": True, "over_queue_limit": True}, WaitReason.GROUP_INCOMPLETE),
    ({"group_incomplete": True, "fits_free_room": True}, WaitReason.GROUP_INCOMPLETE),
    ({"group_incomplete": True, "fits_some_node": False}, WaitReason.NODE_FIT),
])
def test_the_reason_is_the_most_blocking_one(change: dict[str, bool], want: WaitReason) -> None:
    assert choose_reason(replace(WAITING, **change)) is want


def full_cluster() -> tuple[list, object]:
    """cluster-a: two 4-cpu nodes, both held by queue `full`, which has one more waiting."""
    nodes = a_node(cpu="4", memory="16Gi").times(2)
    running = [a_job("full").running_on(node).requesting(cpu="4").build() for node in nodes]
    return running, nodes


def test_explain_names_room_fair_share_node_fit_and_cordon_with_numbers() -> None:
    running, nodes = full_cluster()
    waiting = a_job("full").requesting(cpu="4").named("cluster-a/full-extra").build()
    alone = a_state().with_queues("full").with_cluster("cluster-a", nodes) \
        .with_jobs(*running, waiting).build()
    room = explain(alone, waiting.job_id, now=waiting.created_at + 75)
    assert room is not None and room.reason is WaitReason.CLUSTER_ROOM
    assert (room.position, room.queued_in_queue, room.waited_seconds) == (1, 1, 75)
    assert room.cluster_free == {"cpu": 0, "memory": 32 << 30}
    assert "position 1 of 1" in room.message and "waiting for room in cluster" in room.message

    late = a_job("late").requesting(cpu="4").named("cluster-a/late-0").build()
    big = a_job("big").requesting(cpu="5").named("cluster-a/big-0").build()
    shut = a_job("shut").requesting(cpu="1").named("cluster-a/shut-0").build()
    state = a_state().with_queues("full", "late", "big", a_queue("shut").cordoned()) \
        .with_cluster("cluster-a", nodes).with_jobs(*running, waiting, late, big, shut).build()
    schedule_round(state, max_decisions=10, max_lookback_per_queue=10)

    fair = explain(state, waiting.job_id, now=0)
    assert fair is not None and fair.reason is WaitReason.FAIR_SHARE
    assert fair.competing_queues == ("late",)
    assert fair.actual_share == 1.0 and fair.adjusted_fair_share < 1.0
    assert explain(state, late.job_id, now=0).reason is WaitReason.CLUSTER_ROOM  # type: ignore[union-attr]
    fits = explain(state, big.job_id, now=0)
    assert fits is not None and fits.reason is WaitReason.NODE_FIT
    assert fits.largest_node == {"cpu": 4000, "memory": 16 << 30}
    assert "cpu 5" in fits.message and "largest node offers cpu 4" in fits.message
    cordoned = explain(state, shut.job_id, now=0)
    assert cordoned is not None and cordoned.reason is WaitReason.QUEUE_CORDONED
    assert "lockgate queue uncordon shut" in cordoned.message


def test_the_message_says_what_becomes_of_a_pod_past_its_maximum() -> None:
    for action, done in (("delete", "deleted"), ("fail", "failed")):
        queue = QueueSpec(name="q", max_queued=MaxQueued(seconds=5400, action=action))
        job = a_job("q").build()
        state = a_state().with_cluster("cluster-a", a_node(cpu="4").times(1)).with_jobs(job) \
            .build()
        state.upsert_queue(queue)
        answer = explain(state, job.job_id, now=0)
        assert answer is not None and answer.message.endswith(f"it is {done} after 1h30m queued")


def test_a_running_pod_is_not_waiting_and_an_unknown_one_has_no_explanation() -> None:
    running, nodes = full_cluster()
    state = a_state().with_queues("full").with_cluster("cluster-a", nodes) \
        .with_jobs(*running).build()
    answer = explain(state, running[0].job_id, now=0)
    assert answer is not None and answer.reason is None and answer.position == 0
    assert explain(state, "cluster-a/nobody", now=0) is None


def test_places_follow_release_order_priority_then_age() -> None:
    old, young = a_job("q").named("c/old").build(), a_job("q").named("c/young").build()
    urgent = a_job("q").with_priority(5).named("c/urgent").build()
    other = a_job("r").named("c/other").build()
    state = a_state().with_queues("q", "r").with_jobs(old, young, urgent, other).build()
    places = {job_id: explain(state, job_id, now=0).position  # type: ignore[union-attr]
              for job_id in ("c/urgent", "c/old", "c/young", "c/other")}
    assert places == {"c/urgent": 1, "c/old": 2, "c/young": 3, "c/other": 1}


def test_a_queued_pod_is_told_at_once_then_at_most_every_interval() -> None:
    pods = WaitingPods(NoticeLimits(pod_interval=60, cluster_rate=100, cluster_burst=100))
    job = a_job("q").build()
    pods.observe(job, now=1000)
    assert pods.due(1000, limit=10) == [(job.job_id, True)]
    pods.told([job.job_id], 1000)
    assert pods.due(1059, limit=10) == []
    pods.observe(job, now=1030)  # the same row again changes nothing
    assert pods.due(1060, limit=10) == [(job.job_id, False)]


def told_at(pods: WaitingPods, job_id: str, *, until: float, every: float = 1.0) -> list[float]:
    """When a pod is told, checking every `every` seconds from 0 to `until`."""
    times: list[float] = []
    for tick in range(int(until / every) + 1):
        now = tick * every
        due = pods.due(now, limit=10)
        pods.told([found for found, _ in due], now)
        times += [now for found, _ in due if found == job_id]
    return times


def test_the_first_notices_come_quickly_then_back_off_to_the_interval() -> None:
    # The schedule: at 0 s, 15 s, 45 s, then every 5 minutes.
    pods = WaitingPods(NoticeLimits(pod_interval=300, cluster_rate=100, cluster_burst=100,
                                    early=(15, 45)))
    job = a_job("q").build()
    pods.observe(job, now=0)
    assert told_at(pods, job.job_id, until=1000) == [0, 15, 45, 345, 645, 945]


def test_only_the_first_notice_says_queued() -> None:
    pods = WaitingPods(NoticeLimits(pod_interval=300, cluster_rate=100, cluster_burst=100,
                                    early=(15,)))
    job = a_job("q").build()
    pods.observe(job, now=0)
    firsts = []
    for now in (0, 15, 315):
        due = pods.due(now, limit=10)
        firsts += [first for _, first in due]
        pods.told([found for found, _ in due], now)
    assert firsts == [True, False, False]


def test_a_notice_that_goes_out_late_keeps_the_gaps_to_the_next_ones() -> None:
    # Looked at every 20 s (or held back by its cluster's bucket): the next notices keep their
    # gaps from when it went out, rather than coming in a burst to catch up.
    pods = WaitingPods(NoticeLimits(pod_interval=300, cluster_rate=100, cluster_burst=100,
                                    early=(15, 45)))
    job = a_job("q").build()
    pods.observe(job, now=0)
    assert told_at(pods, job.job_id, until=400, every=20) == [0, 20, 60, 360]


def test_a_pod_queued_again_starts_its_early_notices_again() -> None:
    pods = WaitingPods(NoticeLimits(pod_interval=300, cluster_rate=100, cluster_burst=100,
                                    early=(15, 45)))
    job = a_job("q").build()
    pods.observe(job, now=0)
    assert told_at(pods, job.job_id, until=100) == [0, 15, 45]
    pods.observe(replace(job, state=JobState.RELEASED), now=100)
    pods.observe(job, now=100)
    assert [pods.due(100, limit=10)] == [[(job.job_id, True)]]
    pods.told([job.job_id], 100)
    assert pods.due(114, limit=10) == [] and pods.due(115, limit=10) == [(job.job_id, False)]


def test_a_pod_that_took_a_place_late_is_told_again_and_its_maximum_counts_from_the_place(
        ) -> None:
    """A replacement stored before the deletion whose place it takes (lockgate.places)."""
    pods = WaitingPods(NoticeLimits(pod_interval=300, cluster_rate=100, cluster_burst=100,
                                    early=(15, 45)))
    job = a_job("q").created_at(100).build()
    pods.observe(job, now=100)
    assert told_at(pods, job.job_id, until=101) == [100]
    moved = replace(job, created_at=10)
    pods.observe(moved, now=101)
    assert pods.due(101, limit=10) == [(job.job_id, True)]
    assert pods.expired(129, lambda queue: MaxQueued(seconds=120)) == []
    assert [found for found, _ in pods.expired(131, lambda queue: MaxQueued(seconds=120))] == [
        job.job_id]


@pytest.mark.parametrize(("early", "told", "gap"), [
    ((), 1, 300), ((), 7, 300), ((15, 45), 1, 15), ((15, 45), 2, 30), ((15, 45), 3, 300),
    ((5, 15, 45), 3, 30), ((5, 15, 45), 4, 300)])
def test_the_gap_after_each_notice(early: tuple[float, ...], told: int, gap: float) -> None:
    limits = NoticeLimits(pod_interval=300, cluster_rate=1, cluster_burst=1, early=early)
    assert limits.gap_after(told) == gap


@pytest.mark.parametrize("early", [(0,), (-5, 10), (15, 15), (45, 15)])
def test_early_notice_times_must_be_positive_and_increasing(early: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="must be positive and increasing"):
        NoticeLimits(pod_interval=300, cluster_rate=1, cluster_burst=1, early=early)


def test_a_pod_that_leaves_the_queue_is_not_told_and_is_told_afresh_when_back() -> None:
    pods = WaitingPods(NoticeLimits(pod_interval=60, cluster_rate=100, cluster_burst=100))
    job = a_job("q").build()
    pods.observe(job, now=0)
    pods.observe(replace(job, state=JobState.RELEASED), now=1)
    assert pods.due(100, limit=10) == [] and len(pods) == 0
    pods.observe(job, now=200)
    assert pods.due(200, limit=10) == [(job.job_id, True)]


def test_notices_that_did_not_go_out_are_due_again() -> None:
    pods = WaitingPods(NoticeLimits(pod_interval=60, cluster_rate=100, cluster_burst=100))
    job = a_job("q").build()
    pods.observe(job, now=0)
    assert pods.due(0, limit=10) == [(job.job_id, True)]
    pods.untold([job.job_id], 5)
    assert pods.due(5, limit=10) == [(job.job_id, True)]


def test_each_cluster_is_told_no_faster_than_its_bucket_whatever_the_backlog() -> None:
    pods = WaitingPods(NoticeLimits(pod_interval=1, cluster_rate=2, cluster_burst=5))
    busy = a_job("q").in_cluster("busy").times(100)
    quiet = a_job("q").in_cluster("quiet").times(3)
    for job in busy + quiet:
        pods.observe(job, now=0)
    told_busy = 0
    for tick in range(0, 21):  # 10 seconds, a check every half second
        now = tick / 2
        due = pods.due(now, limit=1000)
        pods.told([job_id for job_id, _ in due], now)
        told_busy += sum(1 for job_id, _ in due if job_id.startswith("busy/"))
        if tick == 0:  # the quiet cluster is not starved by the busy one
            assert sum(1 for job_id, _ in due if job_id.startswith("quiet/")) == 3
    assert told_busy == 5 + 2 * 10  # the burst, then the rate


def test_the_limit_per_call_holds_across_clusters() -> None:
    pods = WaitingPods(NoticeLimits(pod_interval=1, cluster_rate=100, cluster_burst=100))
    for job in a_job("q").in_cluster("a").times(5) + a_job("q").in_cluster("b").times(5):
        pods.observe(job, now=0)
    assert len(pods.due(0, limit=4)) == 4
    assert len(pods.due(0, limit=100)) == 6


def test_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    bucket = TokenBucket(rate=1, burst=2)
    assert [bucket.take(0) for _ in range(3)] == [True, True, False]
    assert bucket.take(0.5) is False and bucket.take(1.0) is True
    assert [bucket.take(100) for _ in range(3)] == [True, True, False]


def test_pods_past_their_queues_maximum_are_found_once_and_only_theirs() -> None:
    pods = WaitingPods(NoticeLimits(pod_interval=60, cluster_rate=1, cluster_burst=1))
    limit = MaxQueued(seconds=600, action="delete")
    old, young = a_job("strict").created_at(0).build(), a_job("strict").created_at(500).build()
    relaxed = a_job("relaxed").created_at(0).build()
    for job in (old, young, relaxed):
        pods.observe(job, now=0)

    def limits(queue: str) -> MaxQueued | None:
        return limit if queue == "strict" else None

    start = old.created_at
    assert pods.expired(start + 599, limits) == []
    assert pods.expired(start + 600, limits) == [(old.job_id, Limit(limit, "queue"))]
    assert pods.expired(start + 1099, limits) == []
    assert pods.expired(start + 1100, limits) == [(young.job_id, Limit(limit, "queue"))]
    assert pods.expired(start + 5000, limits) == []


def test_a_pod_released_before_its_maximum_is_not_expired() -> None:
    pods = WaitingPods(NoticeLimits(pod_interval=60, cluster_rate=1, cluster_burst=1))
    job = a_job("strict").created_at(0).build()
    pods.observe(job, now=0)
    pods.observe(replace(job, state=JobState.RELEASED), now=1)
    limit = MaxQueued(seconds=1)
    assert pods.expired(job.created_at + 100, lambda _: limit) == []


def test_status_counts_each_queue_by_phase_with_its_oldest_wait() -> None:
    running, nodes = full_cluster()
    waiting = a_job("full").requesting(cpu="4").created_at(-50).build()
    state = a_state().with_queues("full", "idle").with_cluster("cluster-a", nodes) \
        .with_jobs(*running, waiting, a_job("full").released()).build()
    by_queue = {s.queue: s for s in queue_statuses(state)}
    full = by_queue["full"]
    assert (full.queued, full.released, full.running) == (1, 1, 2)
    assert full.oldest_queued_at == waiting.created_at and full.actual_share > 1.0 - 1e-9
    assert by_queue["idle"].oldest_queued_at is None


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (45, "45s"), (192, "3m12s"), (180, "3m"), (7500, "2h5m"), (7200, "2h"),
    (356400, "4d3h"), (-3, "0s"),
])
def test_durations_read_as_kubectl_ages(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("resource", "amount", "text"), [
    ("cpu", 16000, "16"), ("cpu", 250, "0.25"), ("memory", 64 << 20, "64Mi"),
    ("memory", 3 << 30, "3Gi"), ("memory", 1536 << 20, "1.5Gi"), ("nvidia.com/gpu", 2, "2"),
])
def test_amounts_read_in_human_units(resource: str, amount: int, text: str) -> None:
    assert format_amount(resource, amount) == text


def test_repeated_notices_are_distinct_events_and_each_is_idempotent() -> None:
    first = event_name(pod_name="w", reason="LockgateWaitingForRoom", uid="ABCDEF1234",
                       series="1700000000")
    again = event_name(pod_name="w", reason="LockgateWaitingForRoom", uid="ABCDEF1234",
                       series="1700000300")
    assert first != again and first.endswith("-abcdef12-1700000000")
    notice = PodNotice(cluster="c", namespace="n", name="w", uid="u" * 36, queue="q",
                       reason="LockgateWaitingForRoom", message="m", at="2026-01-01T00:00:00Z",
                       event_type="Normal", series="1")
    event = event_for(notice)
    assert event["type"] == "Normal" and event["metadata"]["name"].endswith("-1")


def test_an_older_schedulers_notice_still_decodes_as_a_warning_without_action() -> None:
    old = (b'{"v":1,"cluster":"c","namespace":"n","name":"p","uid":"u","queue":"q",'
           b'"reason":"LockgateQueueUnknown","message":"m","at":"2026-01-01T00:00:00Z"}')
    notice = POD_NOTICES.decode(old)
    assert (notice.event_type, notice.series, notice.action) == ("Warning", "", "")


def test_a_queue_may_set_a_maximum_time_queued() -> None:
    spec = QueueSpec.model_validate({"name": "q", "max_queued": {"seconds": 60}})
    assert spec.max_queued == MaxQueued(seconds=60, action="fail")
    with pytest.raises(ValueError, match="action"):
        QueueSpec.model_validate({"name": "q", "max_queued": {"seconds": 1, "action": "evict"}})
    with pytest.raises(ValueError, match="greater than 0"):
        QueueSpec.model_validate({"name": "q", "max_queued": {"seconds": 0}})


def test_the_schedulers_settings_give_the_early_notices_and_refuse_bad_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from fair_scheduler.settings import SchedulerSettings

    assert SchedulerSettings().feed_policy().notices.early == (15, 45)
    monkeypatch.setenv("LOCKGATE_SCHEDULER_WAIT_NOTICE_EARLY_SECONDS", "[10, 30, 90]")
    assert SchedulerSettings().feed_policy().notices.early == (10, 30, 90)
    monkeypatch.setenv("LOCKGATE_SCHEDULER_WAIT_NOTICE_EARLY_SECONDS", "[]")
    assert SchedulerSettings().feed_policy().notices.early == ()
    monkeypatch.setenv("LOCKGATE_SCHEDULER_WAIT_NOTICE_EARLY_SECONDS", "[45, 15]")
    with pytest.raises(ValidationError, match="wait_notice_early_seconds: early notice times"):
        SchedulerSettings()
