"""How the demo judges fairness: what the apiservers show, against an independent model.

Why this way: the demo must judge the natural case (workloads that arrive one after another
while the fair-scheduler already runs, preemption on for preemptible pods) and must not judge
the scheduler by its own numbers. So the demo looks at the apiservers itself (which pods of each
queue are bound to a node), computes each queue's fair allocation with `devstack.fair_model`
(linear programs that share no code with the scheduler) from the demand it created and the
capacity the apiservers report, and asks of what it saw:

- reached: every queue's bound pods, summed over clusters, within `tolerance` pods of the
  model's fair allocation (pods of the queue's most common shape: pods are whole, the model is
  fluid; the split across clusters need not be unique, the totals are);
- settled: after that, for `window` seconds, no queue left the tolerance and no bound pod
  changed (no eviction, no new binding: the workloads' pods never end, so any change is a move);
- how often it moved after first reaching the targets (a thrash shows as many restarts).

Pure: the demo feeds it looks in time order. Unit-tested in tests/unit/test_demo_fairness.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Look:
    """What the apiservers showed at one moment: each queue's bound pods."""

    at: float  # seconds since the judged phase started
    bound: Mapping[str, frozenset[str]]  # queue -> its bound pods' identities (cluster/ns/name)

    def counts(self) -> dict[str, int]:
        return {queue: len(pods) for queue, pods in self.bound.items()}


@dataclass
class SettleJudge:
    """Fed `Look`s in time order; see the module docstring for reached and settled."""

    targets: Mapping[str, float]  # queue -> fair allocation in pods (the model's, fluid)
    tolerance: float  # pods either way
    window: float  # seconds that must pass without a move once the targets are reached
    reached_at: float | None = None  # first look within tolerance
    settled_at: float | None = None  # end of the first full window
    moves: list[str] = field(default_factory=list)  # why a window restarted, in order
    _window_start: Look | None = None

    def off(self, look: Look) -> dict[str, float]:
        """Queues outside the tolerance: holding less target (positive: above its target)."""
        counts = look.counts()
        gaps = {queue: counts.get(queue, 0) - target for queue, target in self.targets.items()}
        return {queue: gap for queue, gap in gaps.items() if abs(gap) > self.tolerance + 1e-9}

    def see(self, look: Look) -> None:
        if self.settled_at is not None:
            return
        off = self.off(look)
        start = self._window_start
        if off:
            if start is not None:
                self.moves.append(f"t={look.at:.0f}s left the targets: " + ", ".join(
                    f"{queue} {gap:+.1f} pods" for queue, gap in sorted(off.items())))
            self._window_start = None
            return
        if self.reached_at is None:
            self.reached_at = look.at
        if start is None:
            self._window_start = look
            return
        changed = sorted(queue for queue in self.targets
                         if look.bound.get(queue, frozenset()) != start.bound.get(queue,
                                                                                    frozenset()))
        if changed:
            self.moves.append(f"t={look.at:.0f}s bound pods changed: {', '.join(changed)}")
            self._window_start = look
            return
        if look.at - start.at >= self.window:
            self.settled_at = look.at

    def verdict(self) -> list[str]:
        """What failed, in words; empty when it settled."""
        if self.settled_at is not None:
            return []
        if self.reached_at is None:
            return ["the queues never came within "
                    f"{self.tolerance:g} pod(s) of the model's fair allocation"]
        return [f"reached the model's fair allocation at t={self.reached_at:.0f}s but did not "
                f"hold it for {self.window:.0f}s: " + "; ".join(self.moves[-3:])]
