"""A job set's own maximum time queued: reading it, and the stricter rule winning."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from builders import a_job, a_node, a_queue, a_state

from helpers.pods import a_pod
from lockgate.jobs import JobState
from lockgate.max_queued import (
    MAX_QUEUED_TIME_ANNOTATION,
    ON_MAX_QUEUED_ANNOTATION,
    InvalidMaxQueuedError,
    JobSetMaxQueued,
    Limit,
    jobset_max_queued,
    read_from_pod,
    stricter,
)
from lockgate.observing import pod_event
from lockgate.queues import MaxQueued
from lockgate.scheduler import NoticeLimits, WaitingPods, explain

LIMITS = NoticeLimits(pod_interval=60, cluster_rate=1, cluster_burst=1)


@pytest.mark.parametrize(("queue", "jobset", "want"), [
    (None, None, None),
    (MaxQueued(seconds=60, action="delete"), None,
     Limit(MaxQueued(seconds=60, action="delete"), "queue")),
    (None, JobSetMaxQueued(seconds=30), Limit(MaxQueued(seconds=30, action="fail"), "jobset")),
    # The job set's deadline is earlier: its action, else the queue's.
    (MaxQueued(seconds=60, action="delete"), JobSetMaxQueued(seconds=30),
     Limit(MaxQueued(seconds=30, action="delete"), "jobset")),
    (MaxQueued(seconds=60, action="delete"), JobSetMaxQueued(seconds=30, action="fail"),
     Limit(MaxQueued(seconds=30, action="fail"), "jobset")),
    # The queue's is earlier, or equal: the queue's rule, whole.
    (MaxQueued(seconds=60), JobSetMaxQueued(seconds=90, action="delete"),
     Limit(MaxQueued(seconds=60, action="fail"), "queue")),
    (MaxQueued(seconds=60), JobSetMaxQueued(seconds=60, action="delete"),
     Limit(MaxQueued(seconds=60, action="fail"), "queue")),
])
def test_the_stricter_rule_wins(queue: MaxQueued | None, jobset: JobSetMaxQueued | None,
                                want: Limit | None) -> None:
    assert stricter(queue, jobset) == want


def test_the_pods_and_the_namespaces_annotations_combine() -> None:
    assert jobset_max_queued({}) is None
    assert jobset_max_queued({MAX_QUEUED_TIME_ANNOTATION: "2h"},
                             {MAX_QUEUED_TIME_ANNOTATION: "30m", ON_MAX_QUEUED_ANNOTATION: "delete"}
                             ) == JobSetMaxQueued(seconds=1800, action="delete")
    assert jobset_max_queued({MAX_QUEUED_TIME_ANNOTATION: "90", ON_MAX_QUEUED_ANNOTATION: "fail"},
                             {MAX_QUEUED_TIME_ANNOTATION: "30m", ON_MAX_QUEUED_ANNOTATION: "delete"}
                             ) == JobSetMaxQueued(seconds=90, action="fail")
    # An action on the pod, the time from its namespace.
    assert jobset_max_queued({ON_MAX_QUEUED_ANNOTATION: "delete"},
                             {MAX_QUEUED_TIME_ANNOTATION: "5m"}
                             ) == JobSetMaxQueued(seconds=300, action="delete")
    with pytest.raises(InvalidMaxQueuedError, match="on namespace team-a is not a duration"):
        jobset_max_queued({}, {MAX_QUEUED_TIME_ANNOTATION: "x"}, namespace="team-a")


def test_the_watcher_reads_the_pods_rule_and_ignores_one_made_unreadable_later() -> None:
    assert read_from_pod({MAX_QUEUED_TIME_ANNOTATION: "1800s"}) == JobSetMaxQueued(seconds=1800)
    assert read_from_pod({MAX_QUEUED_TIME_ANNOTATION: "soon"}) is None
    now = datetime(2026, 1, 1, tzinfo=UTC)
    pod = (a_pod("p").in_namespace("n").with_uid("u").in_queue("q")
           .annotated({MAX_QUEUED_TIME_ANNOTATION: "600s", ON_MAX_QUEUED_ANNOTATION: "delete"})
           .obj())
    event = pod_event(pod, cluster="c", event_id="e", observed_at=now)
    assert event.max_queued == JobSetMaxQueued(seconds=600, action="delete")
    assert type(event).model_validate_json(event.model_dump_json()) == event


def test_a_job_sets_maximum_ends_its_pods_although_their_queue_has_none() -> None:
    pods = WaitingPods(LIMITS)
    own = JobSetMaxQueued(seconds=300)
    strict = replace(a_job("open").created_at(0).build(), max_queued=own)
    later = replace(a_job("open").created_at(100).build(), max_queued=own)
    plain = a_job("open").created_at(0).build()
    for job in (strict, later, plain):
        pods.observe(job, now=0)
    start = strict.created_at

    def no_queue_limit(_: str) -> MaxQueued | None:
        return None

    jobset_rule = Limit(MaxQueued(seconds=300, action="fail"), "jobset")
    assert pods.expired(start + 299, no_queue_limit) == []
    assert pods.expired(start + 300, no_queue_limit) == [(strict.job_id, jobset_rule)]
    assert pods.expired(start + 400, no_queue_limit) == [(later.job_id, jobset_rule)]
    assert pods.expired(start + 10_000, no_queue_limit) == []


def test_each_pod_ends_once_by_the_stricter_of_its_queues_and_its_job_sets_rule() -> None:
    pods = WaitingPods(LIMITS)
    queue_rule = MaxQueued(seconds=600, action="delete")
    looser = replace(a_job("q").created_at(0).build(), max_queued=JobSetMaxQueued(seconds=900))
    tighter = replace(a_job("q").created_at(0).build(),
                      max_queued=JobSetMaxQueued(seconds=120, action="fail"))
    for job in (looser, tighter):
        pods.observe(job, now=0)
    start = looser.created_at
    # Both deadlines long past at the first look: each still ends by its stricter rule.
    found = dict(pods.expired(start + 5000, lambda _: queue_rule))
    assert found == {looser.job_id: Limit(queue_rule, "queue"),
                     tighter.job_id: Limit(MaxQueued(seconds=120, action="fail"), "jobset")}
    assert pods.expired(start + 6000, lambda _: queue_rule) == []


def test_a_rule_learnt_later_counts_and_a_released_pod_never_ends() -> None:
    pods = WaitingPods(LIMITS)
    job = a_job("q").created_at(0).build()
    pods.observe(job, now=0)
    pods.observe(replace(job, max_queued=JobSetMaxQueued(seconds=60)), now=1)
    other = replace(a_job("q").created_at(0).build(), max_queued=JobSetMaxQueued(seconds=60))
    pods.observe(other, now=0)
    pods.observe(replace(other, state=JobState.RELEASED), now=1)
    assert [job_id for job_id, _ in pods.expired(job.created_at + 61, lambda _: None)] == [
        job.job_id]


def test_explain_names_the_job_sets_maximum() -> None:
    job = replace(a_job("q").requesting(cpu="1").created_at(0).build(),
                  max_queued=JobSetMaxQueued(seconds=1800, action="delete"))
    state = a_state().with_queues(a_queue("q")).with_cluster(
        "cluster-a", a_node(cpu="4", memory="8Gi").times(1)).with_jobs(job).build()
    explanation = explain(state, job.job_id, now=job.created_at + 5)
    assert explanation is not None
    assert (explanation.max_queued_seconds, explanation.max_queued_action,
            explanation.max_queued_by) == (1800, "delete", "jobset")
    assert explanation.message.endswith(
        "it is deleted after 30m queued (its job set's maximum)")
