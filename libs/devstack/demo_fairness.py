"""How the demo judges fairness: only at moments when every allocation in force was contested.

Why this is not a plain "every queue has pods waiting right now" check: lockgate does not preempt,
so room given to a queue while another had nothing waiting in that cluster stays with it until its
pods finish. A moment at which every queue waits in every cluster can still show that earlier,
legitimate allocation (the demo once failed on a busy machine that way: a Job controller slow to
create replacements left room to another queue). The demo therefore judges a scheduler round only
if every queue has had pods waiting in every cluster without a break since before the oldest
release still holding capacity: then every allocation in force was decided while all queues
competed everywhere, and DRF must have them within a job of their fair shares.

The inputs are facts, not the scheduler's own verdict: when Postgres first held each job, when it
was released and when it finished; and the shares the scheduler reported for that round.
Pure functions, unit-tested in tests/unit/test_demo_fairness.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class JobTimeline:
    """One job as Postgres recorded it."""

    queue: str
    cluster: str
    first_seen_at: datetime
    released_at: datetime | None
    finished_at: datetime | None

    @property
    def waits_until(self) -> datetime | None:
        """When it stopped waiting (released or ended); None while it still waits."""
        ends = [t for t in (self.released_at, self.finished_at) if t is not None]
        return min(ends) if ends else None

    def holds_capacity_at(self, at: datetime, news_lag: timedelta = timedelta(0)) -> bool:
        """Whether the scheduler may still count it at `at`: `finished_at` is when the watcher
        saw the pod end, and the scheduler hears of it up to `news_lag` later."""
        return (self.released_at is not None and self.released_at <= at
                and (self.finished_at is None or self.finished_at + news_lag > at))


def contested_intervals(jobs: Iterable[JobTimeline], queues: Sequence[str],
                        clusters: Sequence[str]) -> list[tuple[datetime, datetime | None]]:
    """The intervals [start, end) during which every queue had a job waiting in every cluster.

    The last interval's end is None if it had not ended when the records were read.
    """
    changes: list[tuple[datetime, int, str, str]] = []  # at, +1 starts / -1 stops waiting
    for job in jobs:
        if job.queue not in queues or job.cluster not in clusters:
            continue
        end = job.waits_until
        if end is not None and end <= job.first_seen_at:
            continue
        changes.append((job.first_seen_at, +1, job.queue, job.cluster))
        if end is not None:
            changes.append((end, -1, job.queue, job.cluster))
    # At equal times, stops apply before starts: a handover at one instant is not contested.
    changes.sort(key=lambda change: (change[0], change[1]))
    waiting = {(q, c): 0 for q in queues for c in clusters}
    intervals: list[tuple[datetime, datetime | None]] = []
    start: datetime | None = None
    for at, delta, queue, cluster in changes:
        waiting[(queue, cluster)] += delta
        everywhere = all(count > 0 for count in waiting.values())
        if everywhere and start is None:
            start = at
        elif not everywhere and start is not None:
            if at > start:
                intervals.append((start, at))
            start = None
    if start is not None:
        intervals.append((start, None))
    return intervals


def contested_since(intervals: Sequence[tuple[datetime, datetime | None]],
                    at: datetime) -> datetime | None:
    """Since when the contest holding at `at` has lasted; None if nothing was contested then."""
    for start, end in intervals:
        if start <= at and (end is None or at < end):
            return start
    return None


def news_lag(created: Sequence[tuple[datetime, datetime]]) -> timedelta:
    """How late news of a pod reaches Postgres: the 95th percentile of (first seen - created),
    plus the second that creation timestamps are rounded to."""
    if not created:
        return timedelta(seconds=1)
    lags = sorted(max(timedelta(0), seen - made) for made, seen in created)
    return lags[min(len(lags) - 1, int(len(lags) * 0.95))] + timedelta(seconds=1)


def judgeable(jobs: Sequence[JobTimeline], intervals: Sequence[tuple[datetime, datetime | None]],
              at: datetime, lag: timedelta = timedelta(0)) -> bool:
    """Whether every allocation the scheduler counted at `at` was decided while all queues
    competed (a job that ended counts until `lag` after, when the scheduler may hear of it)."""
    since = contested_since(intervals, at)
    if since is None:
        return False
    holding = [job.released_at for job in jobs if job.holds_capacity_at(at, lag)]
    return all(released >= since for released in holding if released is not None)


def gaps_in_jobs(queues: Mapping[str, Mapping[str, float]], job_share: float) -> dict[str, float]:
    """Each queue's distance from its adjusted fair share, in jobs (positive: below its share)."""
    return {name: (report.get("adjusted_fair_share", 0.0) - report.get("actual_share", 0.0))
            / job_share for name, report in queues.items()}
