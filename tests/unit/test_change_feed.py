"""The change feed's cursor (lockgate.change_feed): which writers a snapshot had not seen."""

from __future__ import annotations

import pytest

from lockgate.change_feed import START, FeedCursor


def test_a_snapshot_with_transactions_in_progress() -> None:
    cursor = FeedCursor.from_snapshot("100:105:100,103")
    assert cursor == FeedCursor(105, (100, 103))
    # Committed before the snapshot: seen; in progress or begun after it: unseen.
    assert [xid for xid in range(98, 108) if cursor.unseen(xid)] == [100, 103, 105, 106, 107]


def test_a_quiet_snapshot() -> None:
    cursor = FeedCursor.from_snapshot("742:742:")
    assert cursor == FeedCursor(742)
    assert not cursor.unseen(741)
    assert cursor.unseen(742)


def test_before_any_read_everything_is_unseen() -> None:
    assert START.unseen(0)
    assert START.unseen(2**62)


@pytest.mark.parametrize("text", ["", "1:2", "5:3:", "1:5:7", "1:5:0", "a:b:"])
def test_what_is_not_a_snapshot_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        FeedCursor.from_snapshot(text)
