"""Usage that decays: what each node of the queue tree has held lately (issue 36 item 3).

Why it exists: fairness judged at one instant forgets that a queue held half the fleet all
morning. Each node of the queue tree keeps its *decayed usage*: the integral over time of its
dominant share of the pool, each moment weighed by 2^(-age / half-life). Its unit is
share x seconds (a node that held the whole pool for one half-life, long ago, has about
half-life / ln 2 of it, decaying). The cost model turns it into an effective weight
(lockgate.scheduler.costs.effective_weight); this module only keeps the numbers.

Incremental: `advance` decays every node by the time elapsed and adds what each leaf held
since the last call, assuming its share stayed what the caller says it was over that interval
(callers advance at every change of allocation, or once per round: the error is one round's).
An inner node's usage is the sum of its leaves' (decay is linear), so only leaves are kept and
inner nodes are summed on read.

`HistoryPolicy` says whether history counts at all. It is off by default (today's semantics:
fairness is instantaneous). On without a half-life is an error, never a silent no-op (Kueue's
half-life defaulting to 0 turned its feature off without a word: kueue #11134).

Pure: no I/O, no clock (the caller passes the time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from lockgate.queue_tree import QueueTree


class HistoryPolicyError(ValueError):
    """A history policy that cannot be honoured (on without a half-life, a half-life <= 0)."""


@dataclass(frozen=True, slots=True)
class HistoryPolicy:
    """Whether decayed usage weighs on the fair targets, and how fast it is forgotten."""

    enabled: bool = False
    half_life_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.half_life_seconds is not None and not (
                self.half_life_seconds > 0 and math.isfinite(self.half_life_seconds)):
            raise HistoryPolicyError(
                f"the usage half-life must be a positive number of seconds, "
                f"got {self.half_life_seconds}")
        if self.enabled and self.half_life_seconds is None:
            raise HistoryPolicyError(
                "usage history is on but has no half-life: set one (say 7 days); "
                "without it history would silently not count")


class DecayedUsage:
    """Each leaf's decayed usage (share x seconds), with inner nodes summed from it."""

    __slots__ = ("_at", "_decay_rate", "_half_life", "_leaves")

    def __init__(self, *, half_life_seconds: float, at: float,
                 restored: Mapping[str, float] | None = None) -> None:
        """`restored`: leaves' usage as last recorded at `at` (after a failover, or rebuilt
        from the records); without it every leaf starts at none."""
        HistoryPolicy(enabled=True, half_life_seconds=half_life_seconds)  # validates it
        for name, value in (restored or {}).items():
            if not (value >= 0 and math.isfinite(value)):
                raise HistoryPolicyError(f"decayed usage of {name!r} must be >= 0, got {value}")
        self._half_life = half_life_seconds
        self._decay_rate = math.log(2) / half_life_seconds
        self._at = at
        self._leaves: dict[str, float] = dict(restored or {})

    @property
    def at(self) -> float:
        """When the usage was last brought up to date."""
        return self._at

    @property
    def half_life_seconds(self) -> float:
        return self._half_life

    def advance(self, *, now: float, shares: Mapping[str, float]) -> None:
        """Bring every leaf's usage to `now`: decay what it had, and add what it held since
        the last call, `shares[leaf]` (its dominant share of the pool) all along."""
        elapsed = now - self._at
        if elapsed < 0:
            raise ValueError(f"decayed usage cannot go back in time ({now} < {self._at})")
        for name, share in shares.items():
            if not (share >= 0 and math.isfinite(share)):
                raise ValueError(f"share of {name!r} must be >= 0, got {share}")
        if elapsed == 0:
            return
        keep = math.exp(-self._decay_rate * elapsed)
        # The integral of a constant share s over the interval, each moment decayed to now:
        # s * (1 - keep) / rate (exact, so advancing in many small steps or one equals).
        gained = (1.0 - keep) / self._decay_rate
        for name in self._leaves:
            self._leaves[name] *= keep
        for name, share in shares.items():
            if share > 0:
                self._leaves[name] = self._leaves.get(name, 0.0) + share * gained
        self._at = now

    def of_leaf(self, name: str) -> float:
        return self._leaves.get(name, 0.0)

    def leaves(self) -> dict[str, float]:
        """Every leaf's usage (what to store durably)."""
        return dict(sorted(self._leaves.items()))

    def of_tree(self, tree: QueueTree) -> dict[str, float]:
        """Every node's usage: a leaf's own, an inner node's the sum of its leaves'."""
        usage = dict.fromkeys(tree.names, 0.0)
        for name, value in self._leaves.items():
            if name in tree:
                for node in (name, *tree.ancestors(name)):
                    usage[node] += value
        return usage
