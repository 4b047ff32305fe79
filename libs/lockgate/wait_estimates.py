"""Estimating how long a queued pod will still wait, from its queue's recent release rate.

Why: a user watching a spawner's progress page (KubeSpawner shows the pod's Events) decides
whether to wait or give up; "position 7 of 9" says little without a pace. The estimate is the
pod's position divided by how fast its queue's pods were released in its cluster lately, and
only from a steady pace: the window is cut into slices, and the pace is the median slice's count,
so a burst (a round that filled a freed node, then nothing behind pods that never end) is one
slice and moves it little. It is an estimate and says so: the rate changes as other queues come
and go, pods end sooner or later, and a position counts the queue's pods in every cluster. When
the rate says nothing (too few releases lately, releases in too few slices to be a pace, or the
pod waits for something releases do not bring: a node it fits on, a cordon), no estimate is
given, and the text says why.

Pure: the scheduler leader records the releases it decides (`ReleaseRates.released`) and asks
for the text of each notice; a new leader starts with no history, so its first notices have no
estimate until releases come.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from lockgate.scheduler.explain import Explanation, WaitReason

WINDOW_SECONDS = 15 * 60.0
SLICES = 5  # of 3 minutes each: a pace needs releases in more than half of them
MIN_RELEASES = 3


# What a pod may wait for that releases of its queue do not bring nearer.
_NOT_BY_RELEASES = {
    WaitReason.NODE_FIT: "a node it fits on",
    WaitReason.NO_NODES: "a schedulable node in its cluster",
    WaitReason.QUEUE_CORDONED: "its queue to be uncordoned",
    WaitReason.QUEUE_UNKNOWN: "its queue to exist",
    WaitReason.BACKING_OFF: "its controller's back-off to end",
    WaitReason.GROUP_INCOMPLETE: "the rest of its pod group to arrive",
}


@dataclass(frozen=True, slots=True)
class WaitEstimate:
    seconds: float | None  # None: no estimate, see `why_none`
    why_none: str = ""

    def text(self) -> str:
        """The words a notice ends with."""
        if self.seconds is None:
            return f"no wait estimate: {self.why_none}"
        return (f"estimated wait: {about(self.seconds)}, from this queue's release rate in this "
                "cluster (an estimate, not a promise)")


def about(seconds: float) -> str:
    """A rough duration: "under a minute", "about 4 minutes", "about 2 hours"."""
    if seconds < 60:
        return "under a minute"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"about {minutes} minute{'s' if minutes != 1 else ''}"
    hours = round(seconds / 3600)
    return f"about {hours} hours"


@dataclass
class ReleaseRates:
    """When each (queue, cluster) had pods released, over the last `window` seconds."""

    window: float = WINDOW_SECONDS
    slices: int = SLICES
    min_releases: int = MIN_RELEASES
    _times: dict[tuple[str, str], deque[float]] = field(default_factory=dict)

    def released(self, queue: str, cluster: str, at: float) -> None:
        times = self._times.setdefault((queue, cluster), deque())
        times.append(at)
        self._trim(times, at)

    def _trim(self, times: deque[float], now: float) -> None:
        while times and times[0] <= now - self.window:
            times.popleft()

    def estimate_for(self, explanation: Explanation, *, now: float) -> WaitEstimate:
        """The estimate for an explained queued pod."""
        if explanation.reason is WaitReason.NEXT_ROUND:
            return WaitEstimate(0.0)
        return self.estimate(explanation.queue, explanation.cluster,
                             position=explanation.position, now=now,
                             blocked_by=None if explanation.reason is None
                             else _NOT_BY_RELEASES.get(explanation.reason))

    def estimate(self, queue: str, cluster: str, *, position: int, now: float,
                 blocked_by: str | None = None) -> WaitEstimate:
        """How long the pod at `position` (1-based) in `queue` may still wait in `cluster`;
        `blocked_by`: what it waits for that releases do not bring, if anything."""
        if blocked_by is not None:
            return WaitEstimate(None, f"it waits for {blocked_by}, which releases do not bring")
        if position < 1:
            return WaitEstimate(None, "its position in the queue is not known")
        times = self._times.get((queue, cluster))
        if times is not None:
            self._trim(times, now)
        count = 0 if times is None else len(times)
        window = f"{round(self.window / 60)} minutes"
        if count < self.min_releases:
            return WaitEstimate(None, f"this queue had {count} pod"
                                f"{'s' if count != 1 else ''} released in this cluster in the "
                                f"last {window}, too few to tell a pace")
        # The median slice's count, not the window's: a burst fills one slice, and a pace needs
        # releases in more than half of them. This errs towards longer waits.
        slice_seconds = self.window / self.slices
        start = now - self.window
        counts = [0] * self.slices
        for at in times or ():
            counts[min(self.slices - 1, int((at - start) // slice_seconds))] += 1
        median = sorted(counts)[self.slices // 2]
        if median == 0:
            busy = sum(1 for n in counts if n)
            return WaitEstimate(None, f"this queue's {count} pods released in this cluster in the "
                                f"last {window} came in only {busy} of its {self.slices} "
                                f"{_span(slice_seconds)} spans, not at a steady pace")
        return WaitEstimate(math.ceil(position * slice_seconds / median))


def _span(seconds: float) -> str:
    return f"{round(seconds / 60)}-minute"
