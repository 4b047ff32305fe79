"""Back-off per controller (lockgate.backoff): the state machine, and how rounds, explanations
and preemption treat the queued pods of a controller that backs off."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from builders import a_job, a_node, a_queue, a_state, released_ids

from lockgate.backoff import BackoffPolicy, ControllerBackoff, ControllerBackoffs
from lockgate.events import PodEvent
from lockgate.ingest import CurrentRows, fold_batch
from lockgate.jobs import JobState
from lockgate.observing import pod_event
from lockgate.scheduler import (
    EVENT_REASONS,
    Explainer,
    PreemptionPolicy,
    SchedJob,
    SchedulerState,
    SkipReason,
    WaitReason,
    fair_shares,
    plan_evictions,
    queue_statuses,
    schedule_round,
)

POLICY = BackoffPolicy(initial_seconds=120, max_seconds=1800, forget_after_seconds=3600)
RS = ("cluster-a", "rs-uid")
T0 = 1_700_000_000.0


def backoffs() -> ControllerBackoffs:
    return ControllerBackoffs(POLICY)


# ---- the state machine ------------------------------------------------------------------------


def test_the_delay_doubles_with_each_consecutive_give_up_up_to_the_cap() -> None:
    assert [POLICY.delay(n) for n in range(1, 7)] == [120, 240, 480, 960, 1800, 1800]
    assert POLICY.delay(10_000) == 1800  # no overflow however long it churned
    with pytest.raises(ValueError, match="attempts"):
        POLICY.delay(0)


@pytest.mark.parametrize(("initial", "maximum", "forget"),
                         [(0, 10, 0), (10, 0, 0), (10, 10, -1)])
def test_a_policy_that_makes_no_sense_is_refused(initial: float, maximum: float,
                                                 forget: float) -> None:
    with pytest.raises(ValueError, match="must"):
        BackoffPolicy(initial, maximum, forget)


def test_a_give_up_starts_a_back_off_and_the_next_one_after_it_doubles_it() -> None:
    book = backoffs()
    first = book.give_up(RS, T0)
    assert first == ControllerBackoff("cluster-a", "rs-uid", 1, T0, T0 + 120)
    assert first.waits(T0 + 119) and not first.waits(T0 + 120)
    # The replacement is released after the wait, fails again and is given up on.
    second = book.give_up(RS, T0 + 300)
    assert second is not None and (second.attempts, second.until) == (2, T0 + 300 + 240)
    third = book.give_up(RS, second.until + 130)
    assert third is not None and third.until - third.given_up_at == 480


def test_a_give_up_while_the_controller_backs_off_is_the_same_attempt() -> None:
    """Two replicas released together and given up on together count once."""
    book = backoffs()
    first = book.give_up(RS, T0)
    assert book.give_up(RS, T0 + 1) is None
    assert book.get(RS) == first


def test_a_pod_created_after_the_give_up_that_binds_resets_the_controller() -> None:
    book = backoffs()
    book.give_up(RS, T0 + 0.7)
    # A replica that ran all along (created before the give-up) resets nothing.
    assert book.bound(RS, created_at=T0 - 1) is None
    assert book.bound(("cluster-a", "other"), created_at=T0 + 10) is None
    # Creation times are whole seconds: a replacement created in the give-up's second counts.
    reset = book.bound(RS, created_at=T0)
    assert reset is not None and reset.attempts == 1
    assert book.get(RS) is None
    # Counting starts afresh.
    again = book.give_up(RS, T0 + 500)
    assert again is not None and again.attempts == 1


def test_a_wait_ends_then_the_record_is_forgotten_without_another_give_up() -> None:
    book = backoffs()
    record = book.give_up(RS, T0)
    assert record is not None
    assert book.next_due() == T0 + 120
    assert book.due(T0 + 119) == ([], [])
    assert book.due(T0 + 120) == ([record], [])
    assert book.get(RS) == record  # kept: a later give-up doubles
    assert book.next_due() == T0 + 120 + 3600
    assert book.due(T0 + 120 + 3599) == ([], [])
    assert book.due(T0 + 120 + 3600) == ([], [record])
    assert book.get(RS) is None and len(book) == 0
    assert book.next_due() == math.inf


def test_a_newer_give_up_makes_the_old_due_times_stale() -> None:
    book = backoffs()
    book.give_up(RS, T0)
    book.due(T0 + 120)
    second = book.give_up(RS, T0 + 200)
    assert second is not None
    # The first record's forget time would have been T0 + 3720: no longer.
    assert book.next_due() == second.until
    assert book.due(second.until) == ([second], [])
    assert book.due(T0 + 3720) == ([], [])
    assert book.get(RS) == second


def test_records_loaded_by_a_new_leader_carry_on() -> None:
    stored = [ControllerBackoff("cluster-a", "rs-uid", 3, T0, T0 + 480),
              ControllerBackoff("cluster-b", "job-uid", 1, T0 - 5000, T0 - 4880)]
    book = backoffs()
    book.load(stored)
    book.load(stored)  # loading again changes nothing
    assert [r.key for r in book.waiting(T0 + 10)] == [RS]
    ended, forgotten = book.due(T0 + 10)
    assert ended == [stored[1]] and forgotten == [stored[1]]
    record = book.give_up(RS, T0 + 600)
    assert record is not None and record.attempts == 4


def test_the_message_says_how_often_and_until_when() -> None:
    record = ControllerBackoff("c", "u", 2, T0, 1_764_548_400.0)
    assert record.message().startswith(
        "backing off after 2 unplaceable attempts; next try after 2025-12-01T00:20:00Z")
    assert "1 unplaceable attempt;" in replace(record, attempts=1).message()


# ---- rounds -----------------------------------------------------------------------------------


def hold(state: SchedulerState, uid: str, *, attempts: int = 1,
         until: float = T0 + 120) -> ControllerBackoff:
    record = ControllerBackoff("cluster-a", uid, attempts, T0, until)
    state.hold_controller(record)
    return record


def test_pods_of_a_controller_that_backs_off_wait_without_blocking_their_queue() -> None:
    backing_off = a_job("a").controlled_by("rs-uid").with_priority(10)
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(backing_off.named("cluster-a/rs-1"), backing_off.named("cluster-a/rs-2"),
                        a_job("a").named("cluster-a/bare"),
                        a_job("a").controlled_by("other-uid").named("cluster-a/other"))
             .build())
    hold(state, "rs-uid")
    # Queued later: held at once, wherever it would sit.
    state.upsert_job(backing_off.named("cluster-a/rs-3").build())

    result = schedule_round(state, max_decisions=100, max_lookback_per_queue=0)

    assert sorted(released_ids(result)) == ["cluster-a/bare", "cluster-a/other"]
    report = result.queues["a"]
    assert report.backing_off == 3
    assert report.skipped == {SkipReason.BACKING_OFF: 3}
    assert result.skipped == {SkipReason.BACKING_OFF: 3}
    assert not {"cluster-a/rs-1", "cluster-a/rs-2", "cluster-a/rs-3"} & set(result.skipped_jobs)
    usage = state.queue_usage("a")
    assert (usage.queued_jobs, usage.backing_off_jobs) == (3, 3)
    assert usage.pending_requests.as_dict() == {}  # not demand
    assert fair_shares(state)["a"].demand_share == pytest.approx(0.5)

    # The back-off ends: they queue again, in their order.
    state.release_controller(("cluster-a", "rs-uid"))
    result = schedule_round(state, max_decisions=100, max_lookback_per_queue=0)
    assert released_ids(result) == ["cluster-a/rs-1", "cluster-a/rs-2"]
    assert result.queues["a"].backing_off == 0
    assert state.queue_usage("a").backing_off_jobs == 0


def test_a_queue_with_only_held_pods_has_nothing_pending() -> None:
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(a_job("a").controlled_by("rs-uid").times(2)).build())
    hold(state, "rs-uid")
    result = schedule_round(state, max_decisions=100, max_lookback_per_queue=10)
    assert result.decisions == ()
    assert result.queues["a"].outcome.value == "nothing_pending"


def test_holds_follow_jobs_through_changes_and_removal() -> None:
    rs = a_job("a").controlled_by("rs-uid")
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(rs.named("cluster-a/rs-1")).build())
    hold(state, "rs-uid")
    hold(state, "rs-uid", attempts=2, until=T0 + 240)  # the newest record is what is told
    held = state.controller_hold("cluster-a/rs-1")
    assert held is not None and held.attempts == 2
    # A change to a held job (its priority) keeps it held, and counted once.
    state.upsert_job(rs.named("cluster-a/rs-1").with_priority(5).build())
    assert state.queue_usage("a").backing_off_jobs == 1
    job = state.job("cluster-a/rs-1")
    assert job is not None and job.controller == "rs-uid"
    # A held job bound after all (its gate removed by hand) is no longer held.
    state.upsert_job(rs.named("cluster-a/rs-1").running_on("node-1").build())
    assert state.controller_hold("cluster-a/rs-1") is None
    assert state.queue_usage("a").backing_off_jobs == 0
    state.upsert_job(rs.named("cluster-a/rs-2").build())
    state.upsert_job(rs.named("cluster-a/rs-2").in_state(JobState.DELETED).build())
    assert state.queue_usage("a").queued_jobs == 0
    state.release_controller(("cluster-a", "rs-uid"))
    state.release_controller(("cluster-a", "rs-uid"))  # twice: nothing to do
    assert state.held_controllers() == []


def test_a_released_job_too_big_for_every_node_is_parked_when_its_hold_ends() -> None:
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(a_job("a").controlled_by("rs-uid").requesting(cpu="64")
                        .named("cluster-a/big")).build())
    schedule_round(state, max_decisions=10, max_lookback_per_queue=10)  # parks it
    assert state.queue_usage("a").unschedulable_jobs == 1
    hold(state, "rs-uid")
    usage = state.queue_usage("a")
    assert (usage.unschedulable_jobs, usage.backing_off_jobs) == (0, 1)
    state.release_controller(("cluster-a", "rs-uid"))
    usage = state.queue_usage("a")
    assert (usage.unschedulable_jobs, usage.backing_off_jobs) == (1, 0)


def test_a_group_with_a_held_member_waits_whole() -> None:
    member = a_job("a").in_group("ns/g", 2)
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(member.controlled_by("job-uid").named("cluster-a/m-1"),
                        member.named("cluster-a/m-2")).build())
    hold(state, "job-uid")
    result = schedule_round(state, max_decisions=10, max_lookback_per_queue=10)
    assert result.decisions == ()
    assert result.skipped_jobs == {"cluster-a/m-2": SkipReason.BACKING_OFF}


def test_held_pods_are_no_demand_that_preempts() -> None:
    running = [a_job("a").preemptible().running_on("node-1").build() for _ in range(4)]
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(running, a_job("b").controlled_by("rs-uid").times(3)).build())
    hold(state, "rs-uid")
    policy = PreemptionPolicy()
    result = schedule_round(state, max_decisions=10, max_lookback_per_queue=10)
    assert plan_evictions(state, result, policy=policy, evicting=()) == []
    # Without the hold, queue b's pods would have had room made for them.
    state.release_controller(("cluster-a", "rs-uid"))
    result = schedule_round(state, max_decisions=10, max_lookback_per_queue=10)
    assert len(plan_evictions(state, result, policy=policy, evicting=())) == 2


# ---- what a waiting pod is told ---------------------------------------------------------------


def test_explain_and_the_waiting_event_say_it_backs_off() -> None:
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(a_job("a").controlled_by("rs-uid").named("cluster-a/rs-1")).build())
    hold(state, "rs-uid", attempts=3, until=1_764_548_400.0)
    explanation = Explainer(state, now=T0).explain("cluster-a/rs-1")
    assert explanation is not None
    assert explanation.reason is WaitReason.BACKING_OFF
    assert (explanation.backoff_attempts, explanation.backoff_until) == (3, 1_764_548_400.0)
    assert ("backing off after 3 unplaceable attempts; next try after 2025-12-01T00:20:00Z"
            in explanation.message)
    assert EVENT_REASONS[WaitReason.BACKING_OFF] == ("LockgateBackingOff", True)
    assert queue_statuses(state)[0].backing_off == 1


def test_a_cordoned_queue_is_said_before_a_back_off() -> None:
    state = SchedulerState()
    state.upsert_queue(a_queue("a").cordoned().build())
    job: SchedJob = a_job("a").controlled_by("rs-uid").named("cluster-a/rs-1").build()
    state.upsert_job(job)
    hold(state, "rs-uid")
    explanation = Explainer(state, now=T0).explain("cluster-a/rs-1")
    assert explanation is not None and explanation.reason is WaitReason.QUEUE_CORDONED


# ---- how a pod's controller gets to the scheduler ---------------------------------------------


def _replica(owners: list[dict[str, object]]) -> dict[str, object]:
    from helpers.pods import a_pod

    pod = a_pod("rs-x").in_namespace("ns").with_uid("pod-uid").in_queue("a")
    for owner in owners:
        pod = pod.owned_by(owner)
    return pod.obj()


def test_the_watcher_reports_the_uid_of_the_controlling_owner_only() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    owners: list[dict[str, object]] = [
        {"kind": "ConfigMap", "name": "c", "uid": "not-a-controller"},
        {"kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True}]
    event = pod_event(_replica(owners), cluster="c", event_id="e", observed_at=at)
    assert (event.controlled, event.controller_uid) == (True, "rs-uid")
    bare = pod_event(_replica(owners[:1]), cluster="c", event_id="e", observed_at=at)
    assert (bare.controlled, bare.controller_uid) == (False, "")
    # queue-store keeps it on the job row, from the newest event.
    row = fold_batch(CurrentRows(), [event]).jobs[0]
    assert row.controller_uid == "rs-uid"
    orphaned = bare.model_copy(update={"event_id": "e2", "observed_at": at + timedelta(seconds=1)})
    assert fold_batch(CurrentRows(jobs={row.key: row}), [orphaned]).jobs[0].controller_uid == ""
    # An event without the field (an older watcher) still decodes.
    older = event.model_dump(mode="json")
    del older["controller_uid"]
    assert PodEvent.model_validate(older).controller_uid == ""
