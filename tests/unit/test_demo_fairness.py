"""The demo's fairness judgement: which rounds may be held to fair share, and the gap in jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from devstack.demo_fairness import (
    JobTimeline,
    contested_intervals,
    contested_since,
    gaps_in_jobs,
    judgeable,
    news_lag,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
QUEUES = ("a", "b")
CLUSTERS = ("x", "y")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(queue: str, cluster: str, seen: float, released: float | None = None,
        finished: float | None = None) -> JobTimeline:
    return JobTimeline(queue, cluster, at(seen), None if released is None else at(released),
                       None if finished is None else at(finished))


def waiting_everywhere(since: float, until: float | None = None) -> list[JobTimeline]:
    return [job(q, c, since, until) for q in QUEUES for c in CLUSTERS]


def test_contested_only_while_every_queue_waits_in_every_cluster() -> None:
    jobs = [*waiting_everywhere(10, 50), job("a", "x", 0, 30)]
    assert contested_intervals(jobs, QUEUES, CLUSTERS) == [(at(10), at(50))]


def test_one_queue_missing_in_one_cluster_is_not_contested() -> None:
    jobs = [job("a", "x", 0), job("a", "y", 0), job("b", "x", 0)]
    assert contested_intervals(jobs, QUEUES, CLUSTERS) == []


def test_a_break_ends_the_contest_and_a_new_one_starts_later() -> None:
    jobs = [*waiting_everywhere(0), job("b", "y", 0, 20), job("b", "y", 25)]
    jobs = [j for j in jobs if not (j.queue == "b" and j.cluster == "y" and j.released_at is None
                                    and j.first_seen_at == at(0))]
    assert contested_intervals(jobs, QUEUES, CLUSTERS) == [(at(0), at(20)), (at(25), None)]


def test_a_handover_at_one_instant_leaves_no_gap_but_a_finished_wait_does() -> None:
    handover = [*waiting_everywhere(0), job("a", "x", 0, 20), job("a", "x", 20)]
    handover = [j for j in handover if not (j.queue == "a" and j.cluster == "x"
                                            and j.released_at is None and j.first_seen_at == at(0))]
    assert contested_intervals(handover, QUEUES, CLUSTERS) == [(at(0), at(20)), (at(20), None)]
    # A job deleted while it waited stops waiting when it finished.
    deleted = [*waiting_everywhere(0)[1:], job("a", "x", 0, finished=15)]
    assert contested_intervals(deleted, QUEUES, CLUSTERS) == [(at(0), at(15))]


def test_a_round_is_judged_only_if_every_allocation_in_force_was_contested() -> None:
    jobs = [*waiting_everywhere(10),
            job("a", "x", 0, released=5, finished=40),    # taken before the contest began
            job("b", "x", 11, released=12, finished=60)]  # taken while contested
    intervals = contested_intervals(jobs, QUEUES, CLUSTERS)
    assert contested_since(intervals, at(20)) == at(10)
    assert not judgeable(jobs, intervals, at(20))  # the job released at 5 still holds room
    assert judgeable(jobs, intervals, at(45))       # it finished at 40
    assert not judgeable(jobs, intervals, at(5))    # nothing was contested yet


def test_gaps_are_in_jobs_and_positive_below_the_share() -> None:
    gaps = gaps_in_jobs({"a": {"adjusted_fair_share": 0.5, "actual_share": 0.25},
                         "b": {"adjusted_fair_share": 0.25, "actual_share": 0.5}}, 0.125)
    assert gaps == {"a": 2.0, "b": -2.0}


def test_an_ended_job_counts_until_the_scheduler_can_have_heard_of_it() -> None:
    jobs = [*waiting_everywhere(10), job("a", "x", 0, released=5, finished=40)]
    intervals = contested_intervals(jobs, QUEUES, CLUSTERS)
    assert judgeable(jobs, intervals, at(41))
    assert not judgeable(jobs, intervals, at(41), lag=timedelta(seconds=2))
    assert judgeable(jobs, intervals, at(42.5), lag=timedelta(seconds=2))


def test_news_lag_is_the_95th_percentile_plus_the_rounding_second() -> None:
    created = [(at(0), at(0.1 * i)) for i in range(100)]
    assert news_lag(created) == timedelta(seconds=9.5 + 1)
    assert news_lag([]) == timedelta(seconds=1)
