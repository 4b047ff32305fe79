"""How an outage reads: readiness transitions, the outage's log lines, and the client-log limiter.

The policies are pure (time is passed in), so these tests step a fake clock instead of sleeping.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka.errors import KafkaConnectionError, NodeNotReadyError, TopicAuthorizationFailedError

from lockgate_adapters.dependencies import (
    Change,
    DependencyMonitor,
    PostgresProbe,
    Reachability,
    describe,
)
from lockgate_adapters.health import Readiness
from lockgate_adapters.quieting import OutageLogFilter, RateLimiter, classify, quiet
from lockgate_adapters.settings import DependencyChecks

# ---------------------------------------------------------------- the rate limiter


def test_the_first_event_of_a_window_passes_and_the_rest_are_counted() -> None:
    limiter = RateLimiter(window_seconds=30, burst=1)
    assert limiter.admit("k", now=0.0, dependency="kafka") == 0
    assert [limiter.admit("k", now=t, dependency="kafka") for t in (0.1, 5.0, 29.9)] == [None] * 3
    # The next window's first event passes and says how many the last one hid.
    assert limiter.admit("k", now=30.0, dependency="kafka") == 3
    assert limiter.admit("k", now=31.0, dependency="kafka") is None
    assert limiter.take_suppressed("kafka") == 4
    assert limiter.take_suppressed("kafka") == 0


def test_keys_are_limited_separately_and_a_burst_passes_whole() -> None:
    limiter = RateLimiter(window_seconds=10, burst=2)
    assert limiter.admit("a", now=0) == 0
    assert limiter.admit("a", now=1) == 0
    assert limiter.admit("a", now=2) is None
    assert limiter.admit("b", now=2) == 0
    assert limiter.take_suppressed("kafka") == 0  # counted against no dependency


# ---------------------------------------------------------------- which records are limited


def record(name: str, msg: str, *args: object, level: int = logging.ERROR,
           **extra: object) -> logging.LogRecord:
    made = logging.LogRecord(name, level, __file__, 1, msg, args, None)
    made.__dict__.update(extra)
    return made


@pytest.mark.parametrize("made", [
    record("aiokafka.client", 'Unable connect to "%s:%s": %s', "127.0.0.1", 9092,
           ConnectionRefusedError(111, "refused")),
    record("aiokafka.client", "Unable to update metadata from %s", [1]),
    record("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1,
           NodeNotReadyError("not ready")),
    record("aiokafka.consumer.group_coordinator", "Some new message about %s",
           KafkaConnectionError("gone"), level=logging.WARNING),
], ids=["connect", "metadata", "fetch", "any retriable error"])
def test_kafka_client_connection_messages_are_limited_and_counted_for_kafka(
        made: logging.LogRecord) -> None:
    assert classify(made) == (True, "kafka")


@pytest.mark.parametrize("made", [
    record("aiokafka.cluster", "Topic %s is not authorized for this client", "t"),
    record("aiokafka.consumer.group_coordinator", "Unexpected error: %s",
           TopicAuthorizationFailedError()),
    record("aiokafka.client", "Unable connect to node", level=logging.INFO),
    record("queue_store.ingesting", "Unable connect to node"),
], ids=["authorization", "non-retriable error", "below warning", "another logger"])
def test_real_errors_and_other_loggers_pass_untouched(made: logging.LogRecord) -> None:
    assert classify(made) == (False, None)


def test_our_retry_loops_mark_their_warnings() -> None:
    assert classify(record("x", "retrying", level=logging.WARNING, **quiet("postgres"))) == (
        True, "postgres")
    assert classify(record("x", "retrying", level=logging.WARNING, **quiet())) == (True, None)


def test_the_filter_passes_the_first_line_then_one_summary_per_window() -> None:
    now = [0.0]
    quieted = OutageLogFilter(RateLimiter(window_seconds=30), clock=lambda: now[0])
    connect = 'Unable connect to "%s:%s": %s'
    passed = []
    for step in range(1000):  # 100 lines a second for 10 s
        now[0] = step / 100
        made = record("aiokafka.client", connect, "127.0.0.1", 9092, OSError("refused"))
        if quieted.filter(made):
            passed.append(made.getMessage())
    real = record("aiokafka.cluster", "Topic %s is not authorized for this client", "t")
    assert quieted.filter(real)
    now[0] = 31.0
    last = record("aiokafka.client", connect, "127.0.0.1", 9092, OSError("refused"))
    assert quieted.filter(last)
    assert passed == ['Unable connect to "127.0.0.1:9092": refused']
    assert last.getMessage() == ('Unable connect to "127.0.0.1:9092": refused '
                                 "[999 similar message(s) suppressed in the previous 30s]")
    assert quieted.take_suppressed("kafka") == 999


# ---------------------------------------------------------------- reachability transitions


def test_an_outage_is_one_line_a_summary_per_interval_and_one_line_at_the_end() -> None:
    kafka = Reachability("kafka", "127.0.0.1:9092", failures_to_unready=2, summary_every=30)
    notices = [kafka.observe(ok=True, now=0.0)]
    for step in range(1, 51):  # probes every 2 s; down from t=10 to t=80
        t = step * 2.0
        notices.append(kafka.observe(ok=not 10 <= t < 80, error="refused", now=t))
    changes = [(n.change, round(n.down_for)) for n in notices if n is not None]
    assert changes == [
        (Change.FIRST_UP, 0),
        (Change.DOWN, 0),  # the second failed probe, at t=12
        (Change.STILL_DOWN, 30),  # t=42
        (Change.STILL_DOWN, 60),  # t=72
        (Change.BACK, 68),  # t=80
    ]


def test_one_failed_probe_of_a_ready_dependency_is_not_an_outage() -> None:
    kafka = Reachability("kafka", "k:9092", failures_to_unready=2)
    kafka.observe(ok=True, now=0)
    assert kafka.observe(ok=False, error="slow", now=2) is None
    assert kafka.ready
    assert "1 probe(s) just failed: slow" in kafka.detail(2)
    assert kafka.observe(ok=True, now=4) is None


def test_a_dependency_down_from_the_start_is_reported_at_the_first_failure() -> None:
    postgres = Reachability("postgres", "127.0.0.1:5432/db", failures_to_unready=3)
    notice = postgres.observe(ok=False, error="ConnectionRefusedError: refused", now=0)
    assert notice is not None and notice.change is Change.DOWN
    assert notice.level == logging.ERROR
    assert notice.message(0) == ("postgres unreachable: ConnectionRefusedError: refused "
                                 "(127.0.0.1:5432/db)")
    assert not postgres.ready
    assert postgres.detail(12) == ("unreachable for 12s: ConnectionRefusedError: refused "
                                   "(127.0.0.1:5432/db)")
    back = postgres.observe(ok=True, now=36)
    assert back is not None and back.change is Change.BACK
    assert back.message(412) == ("postgres reachable again after 36s (127.0.0.1:5432/db); "
                                 "412 client log message(s) about it suppressed")


# ---------------------------------------------------------------- readiness with sources


def test_a_condition_holds_only_while_every_source_says_so() -> None:
    readiness = Readiness()
    readiness.declare("kafka")
    readiness.declare("kafka", source="probe")
    readiness.set("kafka", True, "consuming")
    assert not readiness.ready
    readiness.set("kafka", False, "unreachable for 3s", source="probe")
    report = readiness.report()["kafka"]
    assert report["ready"] is False
    assert report["detail"] == "probe: unreachable for 3s"
    readiness.set("kafka", True, "reachable", source="probe")
    assert readiness.ready
    assert readiness.report()["kafka"]["sources"] == {
        "loop": {"ready": True, "detail": "consuming"},
        "probe": {"ready": True, "detail": "reachable"}}


# ---------------------------------------------------------------- the monitor, with a fake probe


class FlakyProbe:
    """Answers as `up` says; no I/O."""

    def __init__(self, name: str) -> None:
        self.name, self.target = name, "nowhere:1"
        self.up = True
        self.answered: asyncio.Queue[bool] = asyncio.Queue()
        self.closed = False

    async def check(self) -> None:
        self.answered.put_nowait(self.up)
        if not self.up:
            raise ConnectionRefusedError(111, "Connection refused")

    async def close(self) -> None:
        self.closed = True


async def test_the_monitor_flips_readiness_and_logs_each_transition_once(
        caplog: pytest.LogCaptureFixture) -> None:
    readiness = Readiness()
    monitor = DependencyMonitor(
        readiness, DependencyChecks(interval_seconds=0.01, timeout_seconds=1,
                                    failures_to_unready=1, summary_every_seconds=3600),
        suppressed=lambda name: 7, quieten=lambda name, down: quietened.append((name, down)))
    quietened: list[tuple[str, bool]] = []
    probe = FlakyProbe("kafka")
    stopping = asyncio.Event()
    caplog.set_level(logging.INFO, logger="lockgate_adapters.dependencies")

    async def checked(count: int) -> None:
        for _ in range(count):
            await asyncio.wait_for(probe.answered.get(), 5)

    running = asyncio.create_task(monitor.run(stopping))
    monitor.add(probe)  # declared after the monitor started, as composition roots do
    await checked(2)
    assert readiness.holds("kafka")
    probe.up = False
    await checked(3)
    assert not readiness.holds("kafka")
    assert "Connection refused" in str(readiness.report()["kafka"]["detail"])
    probe.up = True
    await checked(2)
    assert readiness.holds("kafka")
    stopping.set()
    await running
    assert probe.closed
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "kafka reachable (nowhere:1)",
        "kafka unreachable: ConnectionRefusedError: [Errno 111] Connection refused (nowhere:1)",
        lines[2],
    ]
    assert lines[2].startswith("kafka reachable again after ")
    assert lines[2].endswith("14 client log message(s) about it suppressed")
    # Its clients' messages are only counted from the outage's first line to its last.
    assert quietened == [("kafka", False), ("kafka", True), ("kafka", False), ("kafka", False)]


def test_while_a_dependency_is_reported_down_its_messages_are_only_counted() -> None:
    limiter = RateLimiter(window_seconds=30)
    assert limiter.admit("connect", now=0, dependency="kafka") == 0
    limiter.dependency_down("kafka", True)
    assert [limiter.admit(key, now=t, dependency="kafka")
            for key, t in (("connect", 40), ("metadata", 41), ("connect", 90))] == [None] * 3
    assert limiter.admit("other", now=90, dependency="postgres") == 0
    assert limiter.take_suppressed("kafka") == 3
    limiter.dependency_down("kafka", False)
    # Back to one per window; what was counted while down is not reported twice.
    assert limiter.admit("connect", now=91, dependency="kafka") == 0


def test_an_error_is_described_once_with_its_kind() -> None:
    assert describe(KafkaConnectionError("Unable to bootstrap"), 3) == (
        "KafkaConnectionError: Unable to bootstrap")
    assert describe(OSError("refused"), 3) == "OSError: refused"
    assert describe(TimeoutError(), 2.5) == "no answer within 2.5s"


def test_asyncpg_connection_failures_are_counted_for_postgres() -> None:
    try:
        raise ConnectionRefusedError(111, "Connect call failed")
    except ConnectionRefusedError as error:
        failed = logging.LogRecord("asyncpg.pool", logging.WARNING, __file__, 1,
                                   "Failed to restore the pool connection floor; retrying", (),
                                   (type(error), error, error.__traceback__))
    assert classify(failed) == (True, "postgres")
    assert classify(record("asyncpg.pool", "some other problem", level=logging.WARNING)) == (
        False, None)


def test_the_postgres_target_never_shows_the_password() -> None:
    probe = PostgresProbe("postgresql://lockgate:s3cret@db.example:5432/lockgate", timeout=1)
    assert probe.target == "db.example:5432/lockgate"
    assert PostgresProbe("postgresql://u:p@db/x", timeout=1).target == "db/x"
