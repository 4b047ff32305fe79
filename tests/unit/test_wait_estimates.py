"""Wait estimates from a queue's recent release rate in a cluster (lockgate.wait_estimates)."""

from __future__ import annotations

import pytest

from lockgate.wait_estimates import ReleaseRates, WaitEstimate, about


def rates_with(*times: float, queue: str = "q", cluster: str = "c") -> ReleaseRates:
    rates = ReleaseRates(window=900, min_releases=3)
    for at in times:
        rates.released(queue, cluster, at)
    return rates


def test_position_over_the_release_rate() -> None:
    # Two releases in each 180 s span of the 900 s window: one per 90 s; the 3rd in line waits
    # about 270 s.
    rates = rates_with(150, 250, 350, 450, 500, 600, 700, 800, 900, 1000)
    estimate = rates.estimate("q", "c", position=3, now=1000)
    assert estimate == WaitEstimate(270)
    assert estimate.text() == ("estimated wait: about 4 minutes, from this queue's release rate "
                               "in this cluster (an estimate, not a promise)")


def test_a_burst_of_releases_is_not_taken_for_a_pace() -> None:
    """Issue 38: 64 pods released in one round a minute ago, then none (the pods ahead of the
    8th in line belong to a Deployment whose pods never end). Over the window that is one per
    14 s, "about 2 minutes" for the 8th; but it is a burst, not a pace."""
    rates = rates_with(*[940.0] * 64)
    estimate = rates.estimate("q", "c", position=8, now=1000)
    assert estimate.seconds is None
    assert estimate.text() == (
        "no wait estimate: this queue's 64 pods released in this cluster in the last 15 minutes "
        "came in only 1 of its 5 3-minute spans, not at a steady pace")


def test_a_burst_on_top_of_a_slow_pace_does_not_speed_it_up() -> None:
    """One release per 180 s span, and a burst of 60 in the last: the pace is the median span's,
    one per 180 s, not 64 per 900 s."""
    rates = rates_with(200, 400, 600, 800, *[990.0] * 60)
    assert rates.estimate("q", "c", position=2, now=1000) == WaitEstimate(360)


def test_too_few_releases_give_no_estimate_and_say_why() -> None:
    rates = rates_with(100, 200, 300, 2000)  # the first three are out of the window by 2000
    estimate = rates.estimate("q", "c", position=1, now=2000)
    assert estimate.seconds is None
    assert estimate.text() == ("no wait estimate: this queue had 1 pod released in this cluster "
                               "in the last 15 minutes, too few to tell a pace")


def test_releases_of_another_queue_or_cluster_do_not_count() -> None:
    rates = rates_with(1, 2, 3, queue="other")
    for at in (1, 2, 3):
        rates.released("q", "elsewhere", at)
    assert rates.estimate("q", "c", position=1, now=10).seconds is None


def test_a_pod_blocked_by_what_releases_do_not_bring_gets_no_estimate() -> None:
    rates = rates_with(1, 2, 3, 4)
    estimate = rates.estimate("q", "c", position=1, now=10, blocked_by="a node it fits on")
    assert estimate.text() == ("no wait estimate: it waits for a node it fits on, which releases "
                               "do not bring")


@pytest.mark.parametrize(("seconds", "want"), [
    (0, "under a minute"), (59, "under a minute"), (60, "about 1 minute"),
    (240, "about 4 minutes"), (89 * 60, "about 89 minutes"), (3 * 3600, "about 3 hours"),
])
def test_about(seconds: float, want: str) -> None:
    assert about(seconds) == want
