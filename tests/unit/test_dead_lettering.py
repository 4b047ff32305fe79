"""Dead letters: every letter fits its bound whatever the message, and says what the message was.

The letter is what a consumer publishes to get a bad message off its partition; if it could be
larger than Kafka accepts, one message would stall the partition forever (issue 7: ~900 KB of
random bytes made a 2.1 MB letter).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import ConsumerRecord
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotEnoughReplicasError,
    TopicAuthorizationFailedError,
)
from prometheus_client import REGISTRY
from pydantic import ValidationError

from lockgate.dead_lettering import LetterLimits, dead_letter, excerpt
from lockgate.events import DEAD_LETTERS, POD_EVENTS, DeadLetter, PayloadEncoding, PayloadExcerpt
from lockgate_adapters.kafka import (
    MAX_REQUEST_BYTES,
    BatchConsumer,
    is_transient_publish_error,
)
from lockgate_adapters.retrying import Stopped
from lockgate_adapters.settings import KafkaConfig, RetryPolicy

AT = datetime(2026, 11, 30, 18, 0, tzinfo=UTC)
MB = 1024 * 1024
EMOJI = "🦀".encode()  # four bytes: a cut can split it three ways


def letter_of(value: bytes | None, *, key: bytes | None = b"uid-1", reason: str = "bad",
              limits: LetterLimits | None = None, source_topic: str = POD_EVENTS.name,
              consumer: str = "queue-store:" + POD_EVENTS.name, group: str = "queue-store",
              instance: str = "queue-store-7d9f-x2k4") -> DeadLetter:
    return dead_letter(source_topic=source_topic, partition=3, offset=2**63 - 1, key=key,
                       value=value, reason=reason, consumer=consumer, group=group,
                       instance=instance, at=AT, limits=limits)


def assert_describes(payload: PayloadExcerpt | None, raw: bytes | None) -> None:
    """The excerpt has the original's size and digest, and a true prefix of it."""
    if raw is None:
        assert payload is None
        return
    assert payload is not None
    assert payload.size == len(raw)
    assert payload.sha256 == hashlib.sha256(raw).hexdigest()
    kept = payload.kept()
    assert raw.startswith(kept)
    assert payload.complete == (kept == raw)


# Inputs a consumer may meet: what a producer sent by mistake or malice.
BAD_VALUES: dict[str, bytes] = {
    "empty": b"",
    "random bytes near the broker's limit": random.Random(7).randbytes(MB),
    "random bytes twice the limit": random.Random(8).randbytes(2 * MB),
    "valid JSON over the budget": b'{"v": 1, "uid": "' + b"u" * MB + b'"}',
    "quotes (two bytes each in JSON)": b'"' * MB,
    "control characters (six bytes each in JSON)": b"\x01" * MB,
    "four-byte characters": EMOJI * (MB // 4 + 1),
    "text then garbage": b'{"v": 1}' * 20000 + b"\xff\xfe" * 1000,
    "garbage then text": b"\xc3\x28" + b"a" * MB,
    "invalid UTF-8, small": b"\xff\xfe\xfd not text \x80",
    "truncated multibyte character": "é".encode()[:1],
}


@pytest.mark.parametrize("value", BAD_VALUES.values(), ids=BAD_VALUES.keys())
@pytest.mark.parametrize("limits", [LetterLimits(), LetterLimits(value_bytes=5, key_bytes=3,
                                                                 reason_bytes=2, name_bytes=1),
                                    LetterLimits(value_bytes=900 * 1024)],
                         ids=["default", "tiny", "large"])
def test_a_letter_fits_its_bound_and_describes_the_message_whatever_it_held(
        value: bytes, limits: LetterLimits) -> None:
    key = value[:5000]  # keys are arbitrary bytes too
    reason = "invalid PodEvent: \x00\ud800 " + value[:20000].decode(errors="replace") * 3
    letter = letter_of(value, key=key, reason=reason, limits=limits,
                       source_topic="t" * 300, consumer="c\n" * 300, group="g\x00" * 300,
                       instance="🦀" * 300)
    encoded = DEAD_LETTERS.encode(letter)
    assert len(encoded) <= limits.max_letter_bytes
    assert DEAD_LETTERS.decode(encoded) == letter
    assert_describes(letter.value, value)
    assert_describes(letter.key, key)
    assert (letter.partition, letter.offset) == (3, 2**63 - 1)


def test_random_messages_under_random_budgets_fit_and_keep_a_true_prefix() -> None:
    rng = random.Random(2026)
    alphabet = [b"a", b'"', b"\\", b"\n", b"\x00", b"\x1f", b"\x7f", b"\xff", "é".encode(),
                "€".encode(), EMOJI, "\u2028".encode()]
    for _ in range(300):
        value = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 3000)))
        limits = LetterLimits(value_bytes=rng.randrange(0, 4000), key_bytes=rng.randrange(0, 50),
                              reason_bytes=rng.randrange(0, 100), name_bytes=rng.randrange(0, 20))
        letter = letter_of(value, key=value[:100], reason=value.decode(errors="replace"),
                           limits=limits)
        assert len(DEAD_LETTERS.encode(letter)) <= limits.max_letter_bytes
        assert_describes(letter.value, value)
        assert_describes(letter.key, value[:100])


def test_default_letters_fit_in_a_producer_request() -> None:
    assert LetterLimits().max_letter_bytes <= MAX_REQUEST_BYTES


@pytest.mark.parametrize(("value", "encoding"), [
    (b'{"v": 1, "uid": ', PayloadEncoding.UTF8),
    ("ünïcode ✓ 🦀".encode(), PayloadEncoding.UTF8),
    (b"\xff\xfe\x00binary", PayloadEncoding.BASE64),
    (b"", PayloadEncoding.UTF8),
])
def test_a_small_message_is_kept_whole_and_round_trips(value: bytes,
                                                       encoding: PayloadEncoding) -> None:
    letter = letter_of(value, reason="invalid PodEvent: EOF")
    assert letter.value is not None
    assert (letter.value.encoding, letter.value.complete) == (encoding, True)
    assert letter.value.kept() == value
    assert letter.reason == "invalid PodEvent: EOF"
    assert DEAD_LETTERS.decode(DEAD_LETTERS.encode(letter)) == letter


def test_a_large_text_message_keeps_its_start_as_text() -> None:
    value = b'{"v": 1, "uid": "' + b"u" * MB + b'"}'
    payload = excerpt(value, 1000)
    assert (payload.encoding, payload.complete) == (PayloadEncoding.UTF8, False)
    assert payload.data.startswith('{"v": 1, "uid": "uuu')
    assert len(payload.kept()) > 990  # all but what the quotes' escapes took


def test_a_prefix_never_splits_a_character() -> None:
    for budget in range(1, 12):
        payload = excerpt(EMOJI * 10, budget)
        assert payload.encoding is PayloadEncoding.UTF8 or budget < 4
        assert payload.kept() == EMOJI * (len(payload.kept()) // 4)


def test_text_that_escapes_badly_is_kept_as_base64_which_keeps_more() -> None:
    payload = excerpt(b"\x01" * 10_000, 4000)
    assert (payload.encoding, payload.complete) == (PayloadEncoding.BASE64, False)
    assert payload.kept() == b"\x01" * 3000
    assert base64.b64decode(payload.data) == payload.kept()


def test_a_cut_reason_says_so() -> None:
    letter = letter_of(b"x", reason="r" * 100, limits=LetterLimits(reason_bytes=20))
    assert letter.reason == "r" * 17 + "…"


@pytest.mark.parametrize(("key", "letter_key", "source_key"), [
    (b"pod-uid-1", b"pod-uid-1", "pod-uid-1"),
    (None, b"", None),
    (b"\xff\xfe", hashlib.sha256(b"\xff\xfe").hexdigest().encode(), None),
    (b"k" * 5000, hashlib.sha256(b"k" * 5000).hexdigest().encode(), None),  # cut
])
def test_letters_are_keyed_by_the_text_key_else_its_digest(
        key: bytes | None, letter_key: bytes, source_key: str | None) -> None:
    letter = letter_of(b"{}", key=key)
    assert DEAD_LETTERS.key_bytes(letter) == letter_key
    assert letter.source_key == source_key


def test_the_reference_names_the_message_and_its_digests() -> None:
    value = b"\xff" * 10
    letter = letter_of(value, key=b"uid-1")
    assert letter.reference() == (
        f"{POD_EVENTS.name}[3]@{2**63 - 1}, "
        f"key 5 bytes sha256 {hashlib.sha256(b'uid-1').hexdigest()}, "
        f"value 10 bytes sha256 {hashlib.sha256(value).hexdigest()}")


def test_negative_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        LetterLimits(value_bytes=-1)


# What the consumer does when the letter cannot be published -----------------------------------

@pytest.mark.parametrize(("error", "transient"), [
    (KafkaConnectionError("down"), True),
    (KafkaTimeoutError(), True),
    (NotEnoughReplicasError(), True),
    (TimeoutError(), True),
    (MessageSizeTooLargeError("too large"), False),
    (TopicAuthorizationFailedError(), False),
])
def test_publish_errors_are_split_into_transient_and_permanent(error: Exception,
                                                               transient: bool) -> None:
    assert is_transient_publish_error(error) is transient


@dataclass
class RefusingProducer:
    """Stands in for a producer: raises `errors` in turn, then accepts (no Kafka is involved;
    the real stack's tests cover publishing)."""

    errors: list[Exception]
    sent: list[bytes] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)  # where each of `sent` went
    kafka: KafkaConfig = field(default_factory=lambda: KafkaConfig("127.0.0.1:1"))

    async def send_and_wait(self, topic: str, value: bytes, **_: Any) -> None:
        if self.errors:
            raise self.errors.pop(0)
        self.sent.append(value)
        self.topics.append(topic)


def consumer_with(producer: RefusingProducer,
                  readiness: list[tuple[bool, str]]) -> BatchConsumer[Any]:
    async def handle(*_: Any) -> None:
        return None

    consumer: BatchConsumer[Any] = BatchConsumer(
        bootstrap=producer.kafka, topic=POD_EVENTS, group_id="queue-store-eu", consumer_name="unit",
        handle=handle, retry_policy=RetryPolicy(initial_seconds=0.001, max_seconds=0.002),
        on_ready=lambda ready, detail: readiness.append((ready, detail)),
        instance="queue-store-5c4b9-abcde")
    consumer._producer = producer  # type: ignore[assignment]
    return consumer


def record(value: bytes) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic=POD_EVENTS.name, partition=1, offset=42, timestamp=0,
                          timestamp_type=0, key=b"k", value=value, checksum=None,
                          serialized_key_size=1, serialized_value_size=len(value), headers=())


def counted(outcome: str) -> Callable[[], float]:
    """Reads `lockgate_dead_letters_total` of pod events with `outcome`."""
    return lambda: REGISTRY.get_sample_value(
        "lockgate_dead_letters_total", {"topic": POD_EVENTS.name, "outcome": outcome}) or 0.0


async def test_a_letter_kafka_refuses_for_good_is_counted_lost_and_the_message_skipped(
        caplog: pytest.LogCaptureFixture) -> None:
    producer = RefusingProducer([MessageSizeTooLargeError("too large")])
    lost_before = counted("lost")()
    await consumer_with(producer, [])._dead_letter(record(b"\xff" * 10), "invalid PodEvent")
    assert producer.sent == []
    assert counted("lost")() == lost_before + 1
    (logged,) = [r.getMessage() for r in caplog.records if "LOST" in r.getMessage()]
    assert f"{POD_EVENTS.name}[1]@42" in logged
    assert hashlib.sha256(b"\xff" * 10).hexdigest() in logged
    assert "invalid PodEvent" in logged


async def test_a_letter_is_retried_while_kafka_is_unreachable_and_then_published() -> None:
    producer = RefusingProducer([KafkaConnectionError("down"), KafkaTimeoutError()])
    readiness: list[tuple[bool, str]] = []
    published_before = counted("published")()
    await consumer_with(producer, readiness)._dead_letter(record(b"\xff"), "invalid PodEvent")
    (sent,) = producer.sent
    assert DEAD_LETTERS.decode(sent).value == excerpt(b"\xff", 64 * 1024)
    assert counted("published")() == published_before + 1
    assert [ready for ready, _ in readiness] == [False, False, True]


async def test_a_stopping_consumer_gives_up_retrying_without_skipping() -> None:
    producer = RefusingProducer([KafkaConnectionError("down")] * 100)
    consumer = consumer_with(producer, [])
    consumer._stopping.set()
    lost_before = counted("lost")()
    with pytest.raises(Stopped) as stopped:
        await asyncio.wait_for(consumer._dead_letter(record(b"x"), "bad"), 5)
    assert isinstance(stopped.value.__cause__, KafkaConnectionError)
    assert len(producer.errors) == 99  # one attempt, none after stopping
    assert counted("lost")() == lost_before  # not skipped: its batch stays unhandled


def test_a_consumer_refuses_letter_limits_over_a_request() -> None:
    with pytest.raises(ValueError, match="would not fit"):
        BatchConsumer(bootstrap="127.0.0.1:1", topic=POD_EVENTS, group_id="g",
                      consumer_name="unit", handle=lambda *_: asyncio.sleep(0),
                      letter_limits=LetterLimits(value_bytes=MAX_REQUEST_BYTES))


async def test_an_undecodable_message_near_the_size_limit_leaves_as_a_letter_that_fits() -> None:
    """Issue 7: ~900 KB of random bytes; its letter used to be 2.1 MB and was refused."""
    producer = RefusingProducer([])
    value = random.Random(9).randbytes(MAX_REQUEST_BYTES)
    assert await consumer_with(producer, [])._decode(record(value)) is None
    (sent,) = producer.sent
    assert len(sent) <= LetterLimits().max_letter_bytes
    letter = DEAD_LETTERS.decode(sent)
    assert letter.reason.startswith("invalid PodEvent")
    assert_describes(letter.value, value)


async def test_a_header_without_a_value_is_read_as_empty() -> None:
    event = POD_EVENTS.model.model_validate({
        "event_id": "e", "cluster": "c", "namespace": "n", "name": "p", "uid": "u",
        "state": "queued", "queue": "q", "jobset": "j", "created_at": AT, "observed_at": AT})
    message = dataclasses.replace(record(POD_EVENTS.encode(event)),
                                  headers=(("traceparent", None),))
    received = await consumer_with(RefusingProducer([]), [])._decode(message)
    assert received is not None and received.event == event


async def test_a_letter_names_the_group_and_instance_that_wrote_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """Two deployments on one Kafka share the dead-letter topic: the letter says which one."""
    producer = RefusingProducer([])
    await consumer_with(producer, [])._dead_letter(record(b"{"), "invalid PodEvent")
    (sent,) = producer.sent
    letter = DEAD_LETTERS.decode(sent)
    assert (letter.consumer, letter.group, letter.instance) == (
        "unit", "queue-store-eu", "queue-store-5c4b9-abcde")
    (logged,) = [r.getMessage() for r in caplog.records if "dead-lettering" in r.getMessage()]
    assert "queue-store-eu" in logged and "queue-store-5c4b9-abcde" in logged


async def test_an_installations_letter_goes_to_its_own_dead_letter_topic() -> None:
    """With a topic prefix, the letter names the group as Kafka knows it and goes to the
    installation's dead-letter topic, not to another installation's."""
    producer = RefusingProducer([], kafka=KafkaConfig("127.0.0.1:1", topic_prefix="staging."))
    await consumer_with(producer, [])._dead_letter(record(b"{"), "invalid PodEvent")
    (sent,) = producer.sent
    assert producer.topics == ["staging." + DEAD_LETTERS.name]
    assert DEAD_LETTERS.decode(sent).group == "staging.queue-store-eu"


def test_a_consumer_is_named_by_its_host_and_pid_unless_told_otherwise() -> None:
    consumer = BatchConsumer[Any](bootstrap="127.0.0.1:1", topic=POD_EVENTS, group_id="g",
                                  consumer_name="unit", handle=lambda *_: asyncio.sleep(0))
    assert consumer.instance == f"{socket.gethostname()}-{os.getpid()}"


def test_a_letter_without_group_or_instance_still_decodes() -> None:
    """Letters written before they named their writer (the fields were added in place)."""
    older = (b'{"v":2,"source_topic":"t","partition":0,"offset":1,"key":null,"value":null,'
             b'"reason":"r","consumer":"c","at":"2026-11-30T18:00:00Z"}')
    letter = DEAD_LETTERS.decode(older)
    assert (letter.group, letter.instance) == ("", "")


def test_a_v1_letter_is_not_mistaken_for_a_v2_one() -> None:
    """v2 changed what key and value hold; a reader of v2 refuses v1 rather than misread it."""
    v1 = (b'{"v":1,"source_topic":"t","partition":0,"offset":1,"key":"k","value":"x",'
          b'"reason":"r","consumer":"c","at":"2026-11-30T18:00:00Z"}')
    with pytest.raises(ValidationError):
        DEAD_LETTERS.decode(v1)
