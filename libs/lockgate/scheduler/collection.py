"""How often Python's cyclic garbage collector runs in a process that holds the scheduler's state.

Why it exists: the state keeps a few long-lived objects per job, millions at fleet scale, and the
collector's default thresholds (700, 10, 10) make it scan all of them again and again while the
state grows: in the fleet simulator at scale 1 (2 million jobs over a day) 131 full collections
in the first three simulated hours, 103 s in all, one of them 3.3 s inside a round, each
collecting nothing (the state's objects are freed by reference counting, not by the collector).
Raising the first threshold makes full collections about 30 times rarer; young garbage is still
collected, only later, and cycles are still found by the full collections that remain.
"""

from __future__ import annotations

import gc

# gen0 collects after this many more allocations than deallocations; gen1 after 10 gen0
# collections and gen2 after 10 gen1 (and only once it would scan 25% more long-lived objects).
LARGE_STATE_THRESHOLDS = (20_000, 10, 10)


def collect_for_large_state(first_threshold: int = LARGE_STATE_THRESHOLDS[0]) -> tuple[int, ...]:
    """Set the collector's thresholds for a process holding a large scheduler state (the
    first one given, the others as in `LARGE_STATE_THRESHOLDS`); returns the ones it had."""
    before = gc.get_threshold()
    gc.set_threshold(first_threshold, *LARGE_STATE_THRESHOLDS[1:])
    return before
