"""A job's identity (lockgate.jobs.JobKey and the job id), made once and carried: the feed and
the state keep who each job is, so the leader tells a pod without reading its name again."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import a_job, a_node, a_queue

from lockgate.jobs import JobKey, job_id, split_job_id
from lockgate.queues import MaxQueued
from lockgate.scheduler import Feed, FeedPolicy, SchedulerState

T0 = 1_700_000_000.0


def test_a_job_id_is_made_and_read_one_way() -> None:
    assert job_id("cluster-a", "0b1c") == "cluster-a/0b1c"
    assert split_job_id("cluster-a/0b1c") == ("cluster-a", "0b1c")


@pytest.mark.parametrize("value", ["cluster-a", "/0b1c", "cluster-a/", ""])
def test_what_is_not_a_job_id_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="not a job id"):
        split_job_id(value)


def test_a_key_names_the_pod_and_its_job() -> None:
    key = JobKey.from_id("cluster-a/0b1c", namespace="team", name="web-1")
    assert (key.cluster, key.namespace, key.name, key.uid) == ("cluster-a", "team", "web-1",
                                                              "0b1c")
    assert key.job_id == "cluster-a/0b1c" and key.pod == "team/web-1"
    # A million jobs share a few clusters and namespaces: one string each.
    other = JobKey.of(cluster="".join(["cluster-", "a"]), namespace="".join(["te", "am"]),
                      name="web-2", uid="2")
    assert other.cluster is key.cluster and other.namespace is key.namespace


def test_the_state_keeps_who_each_job_is_through_changes() -> None:
    state = SchedulerState()
    state.upsert_queue(a_queue("a").build())
    job = a_job("a").named("cluster-a/u1").of_pod("team", "web-1").build()
    state.upsert_job(job)
    state.upsert_job(replace(job, priority=5))  # a change keeps it
    assert state.job_key("cluster-a/u1") == JobKey.of(cluster="cluster-a", namespace="team",
                                                       name="web-1", uid="u1")
    assert state.job("cluster-a/u1") == replace(job, priority=5)
    assert state.job_key("cluster-a/nobody") is None


def test_a_row_that_names_its_pod_late_is_kept_and_no_name_is_not_a_key() -> None:
    state = SchedulerState()
    state.upsert_queue(a_queue("a").build())
    unnamed = a_job("a").named("cluster-a/u1").of_pod("", "").build()
    state.upsert_job(unnamed)
    assert state.job_key("cluster-a/u1") is None
    state.upsert_job(replace(unnamed, namespace="team", name="web-1"))
    key = state.job_key("cluster-a/u1")
    assert key is not None and key.pod == "team/web-1"


def test_the_feed_knows_who_a_job_is_while_it_waits_out_of_the_state() -> None:
    feed = Feed(SchedulerState(), FeedPolicy())
    feed.apply_queue("a", a_queue("a").build().model_copy(
        update={"max_queued": MaxQueued(seconds=60, action="fail")}))
    feed.apply_node("cluster-a", "node-1", a_node(cpu="0").build())
    retrying = a_job("a").named("cluster-a/r").of_pod("team", "retry-me").build()
    feed.apply_job(retrying, now=T0, returned=(1, T0))  # its release failed: it waits
    assert feed.state.job("cluster-a/r") is None
    key = feed.key_of("cluster-a/r")
    assert key is not None and key.pod == "team/retry-me"
    late = replace(a_job("a").named("cluster-a/x").of_pod("team", "late").build(),
                   created_at=T0 - 90)
    feed.apply_job(late, now=T0)
    [(expired, _)] = feed.expired_due(T0)
    feed.expire(expired)
    key = feed.key_of("cluster-a/x")
    assert key is not None and key.pod == "team/late"
    assert feed.key_of("cluster-a/never") is None
