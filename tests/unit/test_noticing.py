"""Which queued pods are told that their queue does not exist, how often, and what they read."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from builders import a_job

from lockgate.events import POD_NOTICES, PodNotice, ReleaseCommand
from lockgate.jobs import JobState
from lockgate.noticing import (
    NoticeReason,
    UndefinedQueueNotices,
    event_for,
    event_name,
    growth_release_notice,
    queue_unknown_message,
)

# A DNS subdomain, as Kubernetes checks object names.
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def undefined(*queues: str) -> Callable[[str], bool]:
    return lambda queue: queue in queues


def test_only_queued_jobs_of_undefined_queues_are_due_oldest_seen_first() -> None:
    notices = UndefinedQueueNotices()
    first, second = a_job("gone").times(2)
    for job in (first, a_job("defined").build(), second,
                a_job("gone").released().build()):
        notices.observe(job)

    due = notices.due(is_undefined=undefined("gone"), limit=10)

    assert due == [(first.job_id, "gone"), (second.job_id, "gone")]


def test_at_most_limit_per_round_and_the_rest_in_later_rounds() -> None:
    notices = UndefinedQueueNotices()
    jobs = a_job("gone").times(5) + a_job("also-gone").times(2)
    for job in jobs:
        notices.observe(job)
    is_undefined = undefined("gone", "also-gone")

    rounds = []
    while due := notices.due(is_undefined=is_undefined, limit=3):
        rounds.append(due)
        notices.noticed([job_id for job_id, _ in due])

    assert [len(r) for r in rounds] == [3, 3, 1]
    assert sorted(j for r in rounds for j, _ in r) == sorted(j.job_id for j in jobs)


def test_a_noticed_job_is_not_due_again_until_it_leaves_the_queue_and_comes_back() -> None:
    notices = UndefinedQueueNotices()
    job = a_job("gone").build()
    notices.observe(job)
    notices.noticed([job.job_id])
    notices.observe(job)  # the same row again (e.g. the change feed repeats it)
    assert notices.due(is_undefined=undefined("gone"), limit=10) == []

    notices.observe(a_job("gone").named(job.job_id).released().build())
    assert len(notices) == 0
    notices.observe(job)  # queued again (its release failed)
    assert notices.due(is_undefined=undefined("gone"), limit=10) == [(job.job_id, "gone")]


def test_a_job_moved_to_another_queue_is_due_for_the_new_one() -> None:
    notices = UndefinedQueueNotices()
    job = a_job("gone").build()
    notices.observe(job)
    notices.noticed([job.job_id])
    notices.observe(a_job("other-gone").named(job.job_id).build())

    assert notices.due(is_undefined=undefined("gone", "other-gone"), limit=10) == [
        (job.job_id, "other-gone")]


def test_finished_or_forgotten_jobs_are_not_due() -> None:
    notices = UndefinedQueueNotices()
    done, vanished, waiting = a_job("gone").times(3)
    for job in (done, vanished, waiting):
        notices.observe(job)
    notices.observe(a_job("gone").named(done.job_id).in_state(JobState.SUCCEEDED).build())
    notices.forget(vanished.job_id)

    assert notices.due(is_undefined=undefined("gone"), limit=10) == [(waiting.job_id, "gone")]
    assert len(notices) == 1


def test_a_queue_defined_again_has_nothing_due_and_no_limit_sends_nothing() -> None:
    notices = UndefinedQueueNotices()
    notices.observe(a_job("back").build())
    assert notices.due(is_undefined=undefined(), limit=10) == []
    assert notices.due(is_undefined=undefined("back"), limit=0) == []


def test_the_message_names_the_queue_and_what_to_do() -> None:
    assert queue_unknown_message("q") == (
        'lockgate queue "q" does not exist (it was deleted, or never created): this pod stays '
        "gated until the queue exists again or the pod is deleted; "
        "see `lockgate jobs list --queue q`")


def test_the_event_name_is_one_per_pod_uid_and_reason_and_a_valid_object_name() -> None:
    name = event_name(pod_name="web-0", reason=NoticeReason.QUEUE_UNKNOWN,
                      uid="3F2A9C1E-0000-4000-8000-000000000000")
    assert name == "web-0.lockgate-queue-unknown-3f2a9c1e"

    long = event_name(pod_name="a" * 250 + ".b", reason=NoticeReason.QUEUE_UNKNOWN,
                      uid="0123456789")
    assert len(long) == 253
    assert long.endswith(".lockgate-queue-unknown-01234567")
    assert DNS_SUBDOMAIN.match(long)

    # A cut that would end the pod's part on '.' or '-' drops it.
    cut = event_name(pod_name="a" * 220 + "-b" * 20, reason=NoticeReason.QUEUE_UNKNOWN,
                     uid="0123456789")
    assert cut == "a" * 220 + ".lockgate-queue-unknown-01234567"

    unknown = event_name(pod_name="p", reason="SomeNewReason!", uid="abcdef0123")
    assert unknown == "p.lockgate-somenewreason-abcdef01"


def test_the_event_is_a_warning_on_the_pod() -> None:
    notice = PodNotice(cluster="cluster-a", namespace="team", name="web-0", uid="u-1234567890",
                       queue="q", reason=NoticeReason.QUEUE_UNKNOWN.value,
                       message=queue_unknown_message("q"),
                       at=datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=UTC))

    event = event_for(notice)

    assert event["metadata"]["name"] == "web-0.lockgate-queue-unknown-u-123456"
    assert event["metadata"]["namespace"] == "team"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team",
                                       "name": "web-0", "uid": "u-1234567890"}
    assert (event["type"], event["reason"]) == ("Warning", "LockgateQueueUnknown")
    assert event["message"] == notice.message
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-01-02T03:04:05Z"


def test_pod_notices_are_keyed_by_pod_and_reject_unknown_fields() -> None:
    notice = PodNotice(cluster="c", namespace="n", name="p", uid="u-9", queue="q",
                       reason="LockgateQueueUnknown", message="m",
                       at=datetime(2026, 1, 1, tzinfo=UTC))
    assert POD_NOTICES.key_bytes(notice) == b"u-9"
    assert POD_NOTICES.decode(POD_NOTICES.encode(notice)) == notice
    with pytest.raises(ValueError, match="extra"):
        POD_NOTICES.decode(POD_NOTICES.encode(notice).replace(b'"v":1', b'"v":1,"x":1'))


def test_a_release_for_growth_is_told_in_its_words_once_per_decision() -> None:
    at = datetime(2026, 12, 7, 16, 0, tzinfo=UTC)
    words = "released so that cluster-b grows (NodePool default: headroom cpu=48)"
    command = ReleaseCommand(decision_id="d-0f3c9a", cluster="cluster-b", namespace="team",
                             name="train-0", uid="1234abcd-0000", queue="alpha",
                             decided_at=at, growth=words)
    notice = growth_release_notice(command, at=at)
    assert notice is not None
    event = event_for(notice)
    assert (event["type"], event["reason"], event["message"]) == (
        "Normal", NoticeReason.RELEASED_FOR_GROWTH.value, words)
    assert event["involvedObject"]["uid"] == "1234abcd-0000"
    assert event["metadata"]["name"] == "train-0.lockgate-released-for-growth-1234abcd-d0f3c9a"
    assert DNS_SUBDOMAIN.match(event["metadata"]["name"])
    again = growth_release_notice(command.model_copy(update={"decision_id": "d-77"}), at=at)
    assert again is not None and event_for(again)["metadata"]["name"] != event["metadata"]["name"]
    # Any other release says nothing.
    assert growth_release_notice(command.model_copy(update={"growth": ""}), at=at) is None
