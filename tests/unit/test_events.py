"""Rules the event contracts carry: what a job set's cancel covers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from lockgate.events import JobSetCommand

CANCEL_AT = datetime(2026, 12, 1, 21, 0, 5, 400_000, tzinfo=UTC)


def cancel() -> JobSetCommand:
    return JobSetCommand(command_id="c1", queue="q", jobset="sweep", reason="abandoned",
                         requested_by="alice", at=CANCEL_AT)


def test_a_cancel_covers_the_pods_created_before_it_and_in_its_second() -> None:
    second = CANCEL_AT.replace(microsecond=0)
    assert cancel().covers(second - timedelta(days=3))
    assert cancel().covers(second)  # creationTimestamps are whole seconds: can't tell
    assert not cancel().covers(second + timedelta(seconds=1))
    assert cancel().covers_created_before == second + timedelta(seconds=1)


def test_a_cancel_redelivered_days_later_covers_the_same_pods() -> None:
    later = cancel()
    assert later.covers(CANCEL_AT - timedelta(seconds=10))
    assert not later.covers(CANCEL_AT + timedelta(days=2))
