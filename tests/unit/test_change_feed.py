"""The change feed's cursor (lockgate.change_feed): which writers a snapshot had not seen."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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


# Every writer of the followed tables stamps the rows it changes --------------------------------

_SOURCES = Path(__file__).resolve().parents[2]
_UPDATES = re.compile(r"\bUPDATE (jobs|queues|cluster_nodes|cluster_growth)\b")
_UPSERTS = re.compile(r"\bINSERT INTO (jobs|queues|cluster_nodes|cluster_growth)\b.*\bDO UPDATE\b",
                      re.DOTALL)


def _statements(path: Path) -> list[str]:
    """The string literals of a module (adjacent literals are one), f-strings' text included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            found.append("".join(part.value for part in node.values
                                 if isinstance(part, ast.Constant) and isinstance(part.value, str)))
    return found


def test_every_statement_changing_a_followed_row_sets_its_writer() -> None:
    """A row changed without `writer_xid` would be invisible to the change feed's readers (an
    INSERT takes it from the column's default)."""
    checked = 0
    paths = [*(_SOURCES / "libs").rglob("*.py"), *(_SOURCES / "services").rglob("*.py")]
    for path in sorted(paths):
        for statement in _statements(path):
            if _UPDATES.search(statement) or _UPSERTS.search(statement):
                checked += 1
                assert "writer_xid" in statement, f"{path.name}: {statement[:120]}"
    assert checked >= 6
    from lockgate_adapters.job_store import _MERGE_STAGED_JOBS  # built from several pieces

    assert "writer_xid = EXCLUDED.writer_xid" in _MERGE_STAGED_JOBS
