"""What the leader tells pods and removes (lockgate.scheduler.telling), without Kafka or
Postgres: the records and the words a pod's owner reads."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from builders import a_job, a_node, a_queue, a_state

from lockgate.groups import GroupTimeoutAction
from lockgate.jobs import JobKey
from lockgate.max_queued import Limit
from lockgate.noticing import NoticeReason
from lockgate.queues import MaxQueued, QueueSpec
from lockgate.scheduler import Explainer, Feed, FeedPolicy, SchedJob, SchedulerState
from lockgate.scheduler.telling import (
    expiry_message,
    queue_unknown_notices,
    removal_notice,
    timed_out_groups,
    unplaceable_give_ups,
    waiting_notices,
)
from lockgate.wait_estimates import ReleaseRates

T0 = 1_700_000_000.0
AT = datetime.fromtimestamp(T0, UTC)


def a_feed(spec: QueueSpec) -> Feed:
    """Queue `spec` and a node too small for anything: pods wait."""
    feed = Feed(SchedulerState(), FeedPolicy())
    feed.apply_queue(spec.name, spec)
    feed.apply_node("cluster-a", "node-1", a_node(cpu="0").build())
    return feed


def waiting(job_id: str, *, created: float) -> SchedJob:
    return replace(a_job("a").named(job_id).of_pod("team", "pod-1").build(), created_at=created)


# ---- queue unknown ----------------------------------------------------------------------------

def test_a_pod_of_an_undefined_queue_is_told_so_and_one_not_known_is_forgotten() -> None:
    known = {"cluster-a/u1": JobKey.of(cluster="cluster-a", namespace="team", name="pod-1",
                                       uid="u1")}
    notices, gone = queue_unknown_notices(
        [("cluster-a/u1", "ghost"), ("cluster-a/u2", "ghost")], keys=known.get, at=AT)
    [notice] = notices
    assert (notice.cluster, notice.namespace, notice.name, notice.uid, notice.queue) == (
        "cluster-a", "team", "pod-1", "u1", "ghost")
    assert notice.reason == NoticeReason.QUEUE_UNKNOWN.value
    assert notice.message.startswith('lockgate queue "ghost" does not exist')
    assert gone == ["cluster-a/u2"]


# ---- unplaceable ------------------------------------------------------------------------------

def test_an_unplaceable_pod_with_a_controller_is_deleted_and_a_bare_one_left_alone() -> None:
    stuck = replace(a_job("a").named("cluster-a/u1").of_pod("team", "web-1").released()
                    .controlled_by("rs-1").build(),
                    unschedulable_since=T0 - 200, unschedulable_message="0/4 nodes fit")
    bare = replace(stuck, job_id="cluster-a/u2", name="bare", controlled=False, controller="")
    unnamed = replace(stuck, job_id="cluster-a/u3", namespace="", name="")
    deleted, kept, no_row = unplaceable_give_ups([stuck, bare, unnamed], now=T0, at=AT,
                                                 delete_controlled=True)
    assert deleted.deleting and deleted.notice is not None and deleted.notice.delete_pod
    assert (deleted.notice.namespace, deleted.notice.name, deleted.notice.uid) == (
        "team", "web-1", "u1")
    assert deleted.notice.message.endswith(
        "lockgate deletes this pod so that its controller creates a replacement, which is "
        "queued again.")
    assert deleted.reason == ("unplaceable: released, but kube-scheduler reported it "
                              "Unschedulable for 200s: 0/4 nodes fit")
    assert not kept.deleting and kept.notice is not None and "left alone" in kept.notice.message
    # Recorded as given up all the same, but told nothing: its pod is not known.
    assert no_row.notice is None and no_row.reason == deleted.reason


def test_controlled_pods_are_kept_when_deleting_them_is_off() -> None:
    stuck = replace(a_job("a").named("cluster-a/u1").released().controlled_by("rs-1").build(),
                    unschedulable_since=T0 - 200)
    [give_up] = unplaceable_give_ups([stuck], now=T0, at=AT, delete_controlled=False)
    assert not give_up.deleting


# ---- waiting and expired ----------------------------------------------------------------------

def test_a_waiting_pod_is_told_why_first_as_queued_then_as_still_waiting() -> None:
    feed = a_feed(a_queue("a").build())
    feed.apply_job(waiting("cluster-a/u1", created=T0 - 30), now=T0)

    def tell(first: bool, at: datetime) -> str:
        told = waiting_notices(
            feed, due=[("cluster-a/u1", first)], expired=[],
            kept={"cluster-a/u1": "pod-0"}, places={"cluster-a/u1": (1, 1)},
            rates=ReleaseRates(),
            explainer=Explainer(feed.state, now=at.timestamp()), at=at)
        assert told.told == ["cluster-a/u1"] and told.expiries == []
        [notice] = told.waiting
        assert (notice.namespace, notice.name, notice.uid) == ("team", "pod-1", "u1")
        assert (notice.reason == "LockgateQueued") is first
        assert notice.series == ("" if first else str(int(at.timestamp())))
        return notice.message

    first = tell(True, AT)
    assert first.startswith('queued: it kept the place in line of deleted pod "pod-0"')
    assert "estimated wait" in first or "no wait estimate" in first
    later = tell(False, datetime.fromtimestamp(T0 + 60, UTC))
    assert later.startswith("still waiting: ") and "pod-0" not in later


def test_a_pod_whose_name_is_not_known_is_forgotten_not_told() -> None:
    feed = a_feed(a_queue("a").build())
    feed.apply_job(replace(waiting("cluster-a/u1", created=T0 - 30), namespace="", name=""),
                   now=T0)
    told = waiting_notices(feed, due=[("cluster-a/u1", True)], expired=[],
                           kept={}, places={"cluster-a/u1": (1, 1)}, rates=ReleaseRates(),
                           explainer=Explainer(feed.state, now=T0), at=AT)
    assert (told.told, told.waiting) == ([], [])
    assert feed.waiting.due(T0 + 3600, limit=10) == []


def test_a_pod_due_without_a_place_in_line_is_not_told_now_nor_forgotten() -> None:
    """Postgres gives the places; a pod it no longer holds queued (released since) has none:
    it is not told now, and stays on the waiting list until the feed hears of it."""
    feed = a_feed(a_queue("a").build())
    feed.apply_job(waiting("cluster-a/u1", created=T0 - 30), now=T0)
    told = waiting_notices(feed, due=[("cluster-a/u1", True)], expired=[], kept={}, places={},
                           rates=ReleaseRates(), explainer=Explainer(feed.state, now=T0), at=AT)
    assert (told.told, told.waiting) == ([], [])
    assert feed.waiting.due(T0 + 1, limit=10) == [("cluster-a/u1", True)]


def test_a_pod_past_its_maximum_is_told_what_happens_and_leaves_the_state() -> None:
    feed = a_feed(a_queue("a").build().model_copy(
        update={"max_queued": MaxQueued(seconds=60, action="fail")}))
    feed.apply_job(waiting("cluster-a/u1", created=T0 - 90), now=T0 - 90)
    expired = feed.expired_due(T0)
    assert [job_id for job_id, _ in expired] == ["cluster-a/u1"]
    told = waiting_notices(feed, due=[], expired=expired, kept={},
                           places={"cluster-a/u1": (1, 1)}, rates=ReleaseRates(),
                           explainer=Explainer(feed.state, now=T0), at=AT)
    [notice] = told.expiries
    assert (notice.action, notice.reason, notice.event_type) == (
        "fail", "LockgateMaxQueuedTimeExceeded", "Warning")
    assert (notice.namespace, notice.name, notice.uid) == ("team", "pod-1", "u1")
    assert notice.message.startswith(
        'lockgate failed this pod: it waited 1m30s queued, longer than queue "a" allows (1m); '
        "it was waiting: ")
    assert feed.state.job("cluster-a/u1") is None  # no round may release it now


def test_an_expiry_says_whose_maximum_it_was() -> None:
    job = waiting("cluster-a/u1", created=T0 - 7200)
    assert expiry_message(job, Limit(MaxQueued(seconds=3600, action="delete"), "jobset"),
                          now=T0, waiting=None) == (
        "lockgate deleted this pod: it waited 2h queued, longer than its job set allows (1h)")


# ---- removals ---------------------------------------------------------------------------------

def test_the_queued_members_of_a_group_that_did_not_fill_up_are_removed_as_its_queue_says(
) -> None:
    spec = a_queue("a").build().model_copy(update={
        "group_timeout_seconds": 60.0, "group_timeout_action": GroupTimeoutAction.FAIL})
    members = [a_job("a").in_group("ns/g", 3).named(f"cluster-a/m{i}").created_at(i).build()
               for i in range(2)]
    state = (a_state().with_queues(spec.name).with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(members).build())
    state.upsert_queue(spec)
    now = members[0].created_at + 61
    assert timed_out_groups(state, now=now - 2, removing=set()) == []
    removals = timed_out_groups(state, now=now, removing={"cluster-a/m1"})
    assert [(r.job_id, r.action) for r in removals] == [("cluster-a/m0", GroupTimeoutAction.FAIL)]
    assert "did not fill up within 60s: 2 of 3 members exist" in removals[0].message
    assert "marked Failed" in removals[0].message


def test_a_removal_notice_names_its_reason_and_what_the_ungater_does() -> None:
    preempted = removal_notice(cluster="c", namespace="n", name="p", uid="u", queue="q",
                               kind="preempted", action="delete", message="m", at=AT)
    timed_out = removal_notice(cluster="c", namespace="n", name="p", uid="u", queue="q",
                               kind="group_timeout", action="fail", message="m", at=AT)
    assert (preempted.reason, preempted.action) == (NoticeReason.PREEMPTED.value, "delete")
    assert (timed_out.reason, timed_out.action) == (NoticeReason.GROUP_TIMED_OUT.value, "fail")
