"""The hold-out feed (lockgate.scheduler.feed): which job rows the scheduler state holds.

The fair-scheduler leader applies every row through `Feed` and does only I/O around it, and
queue-store loads its `status`/`explain` snapshot through it: these tests are the leader's
hold-out policy, tested without Postgres or Kafka.
"""

from __future__ import annotations

from dataclasses import replace

from builders import a_job, a_node, a_queue

from lockgate.backoff import BackoffPolicy, ControllerBackoff
from lockgate.jobs import JobState
from lockgate.queues import MaxQueued, QueueSpec
from lockgate.scheduler import (
    Feed,
    FeedPolicy,
    SchedJob,
    SchedulerState,
    SkipReason,
    WaitReason,
    explain,
    queue_statuses,
    schedule_round,
)

T0 = 1_700_000_000.0
POLICY = FeedPolicy(release_retry_initial_seconds=2.0, release_retry_max_seconds=10.0,
                    unplaceable_after_seconds=120.0,
                    controller_backoff=BackoffPolicy(initial_seconds=60.0, max_seconds=600.0,
                                                     forget_after_seconds=300.0))


def a_feed(*queues: QueueSpec, policy: FeedPolicy = POLICY, cpu: str = "4") -> Feed:
    feed = Feed(SchedulerState(), policy)
    for spec in queues or (a_queue("a").build(),):
        feed.apply_queue(spec.name, spec)
    feed.apply_node("cluster-a", "node-1", a_node(cpu=cpu).build())
    return feed


def queued(job_id: str, *, queue: str = "a", created: float = T0, **more: object) -> SchedJob:
    job = a_job(queue).named(job_id).build()
    return replace(job, created_at=created, **more)  # type: ignore[arg-type]


def run_round(feed: Feed) -> list[str]:
    result = schedule_round(feed.state, max_decisions=100, max_lookback_per_queue=100)
    for decision in result.decisions:
        feed.released(decision.queue)
    return [decision.job_id for decision in result.decisions]


# ---- expired: past the maximum time queued -----------------------------------------------------

def test_a_pod_past_its_maximum_leaves_the_state_until_its_row_is_no_longer_queued() -> None:
    feed = a_feed(a_queue("a").build().model_copy(
        update={"max_queued": MaxQueued(seconds=60, action="fail")}), cpu="0")
    job = queued("cluster-a/old")
    feed.apply_job(job, now=T0)
    assert feed.expired_due(T0 + 59) == []
    [(job_id, limit)] = feed.expired_due(T0 + 61)
    assert job_id == "cluster-a/old" and limit.action == "fail"
    assert feed.expire(job_id) == job
    assert feed.state.job(job_id) is None and feed.held_out(job_id) == "expired"
    # The same queued row again (nothing carried out yet): it stays out, no round sees it.
    assert feed.apply_job(job, now=T0 + 62) is False
    assert feed.state.job(job_id) is None
    feed.apply_node("cluster-a", "node-1", a_node(cpu="4").build())
    assert run_round(feed) == []
    # The ungater failed it: the row leaves the queue, and the feed forgets it.
    feed.apply_job(replace(job, state=JobState.FAILED), now=T0 + 63)
    assert feed.held_out(job_id) is None and feed.state.job(job_id) is None


def test_a_snapshot_expires_every_pod_due() -> None:
    feed = a_feed(a_queue("a").build().model_copy(
        update={"max_queued": MaxQueued(seconds=60, action="delete")}))
    feed.apply_jobs([queued("cluster-a/old"), queued("cluster-a/new", created=T0 + 100)],
                    now=T0 + 120)
    feed.expire_all_due(T0 + 120)
    assert feed.held_out("cluster-a/old") == "expired"
    assert feed.state.job("cluster-a/new") is not None
    assert [s.queued for s in queue_statuses(feed.state)] == [1]


# ---- backing off: a release that failed ------------------------------------------------------

def test_a_job_whose_release_failed_waits_out_of_the_state_doubling_to_the_maximum() -> None:
    feed = a_feed()
    job = queued("cluster-a/j")
    # Back after its first release: waits 2 s from when it came back.
    assert feed.apply_job(job, now=T0 + 0.5, returned=(1, T0)) is True
    assert feed.state.job(job.job_id) is None and feed.held_out(job.job_id) == "backing_off"
    assert feed.retry_due(job.job_id) == T0 + 2
    assert feed.next_due() == T0 + 2
    assert feed.apply_job(job, now=T0 + 1, returned=(1, T0)) is False  # the same row again
    assert run_round(feed) == []
    assert feed.end_due(T0 + 1.9) is False
    assert feed.end_due(T0 + 2) is True
    assert run_round(feed) == ["cluster-a/j"]
    # Back after its third release: 2 * 2^2 = 8 s; after its tenth, capped at 10 s.
    feed.apply_job(job, now=T0 + 10, returned=(3, T0 + 10))
    assert feed.retry_due(job.job_id) == T0 + 18
    feed.apply_job(replace(job, priority=1), now=T0 + 20, returned=(10, T0 + 20))
    assert feed.retry_due(job.job_id) == T0 + 30


def test_a_job_that_waited_its_retry_out_already_goes_at_once() -> None:
    feed = a_feed()
    job = queued("cluster-a/j")
    feed.apply_job(job, now=T0 + 5, returned=(1, T0))  # came back 5 s ago: 2 s are over
    assert feed.held_out(job.job_id) is None
    assert run_round(feed) == ["cluster-a/j"]


# ---- given up: released pods kube-scheduler keeps refusing -----------------------------------

def test_a_pod_given_up_on_is_not_charged_until_it_binds() -> None:
    feed = a_feed(cpu="2")
    stuck = replace(queued("cluster-a/stuck"), state=JobState.RELEASED,
                    unschedulable_since=T0, controlled=True, controller="rs-1")
    feed.apply_job(stuck, now=T0)
    assert feed.state.queue_usage("a").allocated_jobs == 1
    assert feed.unplaceable_due(T0 + 119, limit=10) == []
    [due] = feed.unplaceable_due(T0 + 120, limit=10)
    record = feed.give_up_controller(due, T0 + 120)
    assert record is not None and record.until == T0 + 180
    feed.given_up([due])
    assert feed.state.queue_usage("a").allocated_jobs == 0
    # Its row now says it was given up on: still not charged, the room is the others'.
    feed.apply_job(replace(stuck, unplaceable=True), now=T0 + 121)
    assert feed.state.job(stuck.job_id) is None
    # A replacement from the same controller waits out the controller's back-off...
    replacement = queued("cluster-a/replacement", created=T0 + 121, controller="rs-1")
    feed.apply_job(replacement, now=T0 + 121)
    result = schedule_round(feed.state, max_decisions=10, max_lookback_per_queue=10)
    assert result.skipped[SkipReason.BACKING_OFF] == 1
    why = explain(feed.state, replacement.job_id, now=T0 + 122)
    assert why is not None and why.reason is WaitReason.BACKING_OFF
    assert feed.next_due() == T0 + 180
    assert feed.end_due(T0 + 180) is True
    assert run_round(feed) == ["cluster-a/replacement"]
    # ...and kube-scheduler bound the first one after all: charged again.
    feed.apply_job(replace(stuck, unplaceable=True, state=JobState.BOUND, node_name="node-1"),
                   now=T0 + 200)
    assert feed.state.queue_usage("a").allocated_jobs == 2


def test_controller_back_off_can_be_off() -> None:
    feed = a_feed(policy=replace(POLICY, controller_backoff_enabled=False))
    stuck = replace(queued("cluster-a/stuck"), state=JobState.RELEASED, controller="rs-1")
    assert feed.give_up_controller(stuck, T0) is None


# ---- controller holds -------------------------------------------------------------------------

def test_stored_back_offs_hold_queued_pods_and_a_bound_pod_resets_them() -> None:
    feed = a_feed()
    record = ControllerBackoff("cluster-a", "rs-1", 2, T0 - 10, T0 + 100)
    over = ControllerBackoff("cluster-a", "rs-2", 1, T0 - 1000, T0 - 900)
    feed.load_backoffs([record, over], T0)
    feed.apply_job(queued("cluster-a/p1", controller="rs-1"), now=T0)
    feed.apply_job(queued("cluster-a/p2", controller="rs-2"), now=T0)
    assert run_round(feed) == ["cluster-a/p2"]  # rs-2's wait is over
    assert feed.state.queue_usage("a").backing_off_jobs == 1
    # A pod of rs-1 created after its last give-up binds: the back-off resets.
    bound = replace(queued("cluster-a/p3", created=T0 - 5, controller="rs-1"),
                    state=JobState.BOUND, node_name="node-1")
    assert feed.apply_job(bound, now=T0 + 1) is True
    assert feed.backoffs_to_forget() == [record]
    assert feed.backoffs_to_forget() == []  # once
    assert run_round(feed) == ["cluster-a/p1"]
    # rs-2's record is forgotten once it has been over for forget_after_seconds.
    feed.end_due(T0 - 900 + 300)
    assert feed.backoffs_to_forget() == [over]


# ---- what the leader does after a round -------------------------------------------------------

def test_a_dropped_decision_queues_again_and_the_next_read_brings_its_row_or_it_vanished(
        ) -> None:
    """The leader's round: released through a transaction, committed with what Postgres
    recorded. Here it recorded neither release: one job's row is gone (deleted outright), the
    other's is running now. Both queue again as before; the next read brings the running row,
    and the job it did not bring (no row any more) leaves the state."""
    feed = a_feed()
    feed.apply_jobs([queued("cluster-a/gone"), queued("cluster-a/bound")], now=T0)
    transaction = feed.state.begin_round()
    result = schedule_round(feed.state, max_decisions=100, max_lookback_per_queue=100,
                            transaction=transaction)
    assert sorted(d.job_id for d in result.decisions) == ["cluster-a/bound", "cluster-a/gone"]
    taken_back = transaction.commit(kept=set())
    feed.taken_back(taken_back)
    assert sorted(taken_back) == ["cluster-a/bound", "cluster-a/gone"]
    assert feed.state.job("cluster-a/gone") == queued("cluster-a/gone")  # as before the round
    assert feed.phases["a"] == {"queued": 2}
    # The next read of changed rows (taken after the write) brings only the running one.
    now_bound = replace(queued("cluster-a/bound"), state=JobState.RUNNING, node_name="node-1")
    feed.apply_jobs([now_bound], now=T0 + 1)
    assert feed.after_read() == ["cluster-a/gone"]
    assert feed.state.job("cluster-a/gone") is None
    assert feed.state.job("cluster-a/bound") == now_bound
    assert feed.phases["a"] == {"queued": 0, "running": 1}  # never counted as released
    assert feed.after_read() == []  # once: later reads remove nothing


def test_a_job_taken_back_whose_row_is_queued_again_stays() -> None:
    """Between the write and the read, the job's row may have changed more than once (here:
    queued again, as a pod returned for retry is): the read brings it, so it is not gone."""
    feed = a_feed()
    feed.apply_jobs([queued("cluster-a/p1")], now=T0)
    transaction = feed.state.begin_round()
    schedule_round(feed.state, max_decisions=100, max_lookback_per_queue=100,
                   transaction=transaction)
    feed.taken_back(transaction.commit(kept=()))
    feed.apply_jobs([queued("cluster-a/p1", created=T0 + 0.5)], now=T0 + 1)
    assert feed.after_read() == []
    assert feed.state.job("cluster-a/p1") == queued("cluster-a/p1", created=T0 + 0.5)


def test_phases_count_every_job_the_feed_holds_or_holds_out() -> None:
    feed = a_feed(cpu="1")
    feed.apply_jobs([queued("cluster-a/1"), queued("cluster-a/2")], now=T0)
    feed.apply_job(queued("cluster-a/3"), now=T0 + 0.5, returned=(1, T0))  # backing off
    run_round(feed)
    assert feed.phases["a"] == {"queued": 2, "released": 1}
    # cluster-a/1 went (the oldest); cluster-a/2's row again is not news.
    assert feed.apply_job(queued("cluster-a/2"), now=T0 + 1) is False


def test_removals_in_flight_are_forgotten_when_their_pods_finish() -> None:
    feed = a_feed()
    running = replace(queued("cluster-a/victim"), state=JobState.RUNNING, node_name="node-1")
    feed.apply_job(running, now=T0)
    feed.removing.add(running.job_id)
    feed.apply_job(replace(running, state=JobState.DELETED), now=T0 + 1)
    assert feed.removing == set()
