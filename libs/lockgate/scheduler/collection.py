"""How often Python's cyclic garbage collector runs in a process that holds the scheduler's state.

Why it exists: the state keeps a few long-lived objects per job, millions at fleet scale, and the
collector's default thresholds (700, 10, 10) make it scan all of them again and again while the
state grows: in the fleet simulator at scale 1 (2 million jobs over a day) 131 full collections
in the first three simulated hours, 103 s in all, one of them 3.3 s inside a round, each
collecting nothing (the state's objects are freed by reference counting, not by the collector).
Raising the first threshold makes full collections about 30 times rarer; young garbage is still
collected, only later. While the state grows, the collector still runs a full collection each
time the long-lived objects grew by a quarter (15 in the first 4 simulated hours at scale 1, up
to 1.7 s each), so `RoundCollector` also takes what survived a round out of the collector's
sight (`gc.freeze`), and looks for cycles among all of it once an interval instead.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

# gen0 collects after this many more allocations than deallocations; gen1 after 10 gen0
# collections and gen2 after 10 gen1 (and only once it would scan 25% more long-lived objects).
LARGE_STATE_THRESHOLDS = (20_000, 10, 10)


def collect_for_large_state(first_threshold: int = LARGE_STATE_THRESHOLDS[0]) -> tuple[int, ...]:
    """Set the collector's thresholds for a process holding a large scheduler state (the
    first one given, the others as in `LARGE_STATE_THRESHOLDS`); returns the ones it had."""
    before = gc.get_threshold()
    gc.set_threshold(first_threshold, *LARGE_STATE_THRESHOLDS[1:])
    return before


class RoundCollector:
    """Collects after each round, not in the middle of the next.

    `after_round` runs a young collection (what the round made and dropped) and freezes what
    survived (`gc.freeze`): frozen objects are still freed by reference counting, but the
    collector no longer scans them, so no full collection of a state of millions of objects
    lands inside a round. Cyclic garbage among frozen objects (a few thousand objects over 6
    simulated hours at scale 0.2, against 1.5 million frozen) waits for the full collection
    that every `full_every_seconds` (by `clock`) runs after a round instead of freezing. Six
    hours by default: at scale 1 hourly ones found 0-10 objects each in the first 9 simulated
    hours and took up to 2.4 s each (1.1-1.4 million jobs held).
    """

    def __init__(self, full_every_seconds: float = 6 * 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.full_every_seconds = full_every_seconds
        self.clock = clock
        self.last_full = clock()
        self.full_collections = 0

    def after_round(self) -> None:
        now = self.clock()
        if now - self.last_full >= self.full_every_seconds:
            gc.unfreeze()
            gc.collect()
            self.last_full = now
            self.full_collections += 1
        else:
            gc.collect(1)
        gc.freeze()
