"""Building dead letters that always fit in a Kafka message, whatever the dead message held.

Why: a consumer that cannot process a message must still get it off its partition; if the
letter describing it cannot be published, the consumer re-reads the same message forever and
everything behind it on that partition waits. A letter that copied the message's bytes (as
lossy text, as v1 did) was larger than the message itself, so a message near Kafka's size limit
made a letter over it. Here every variable part of a letter has a byte budget (`LetterLimits`),
so `LetterLimits.max_letter_bytes` bounds the encoded letter for any input. The message's key
and value keep their size and sha256 always, and as many of their first bytes as fit: as text
when they are valid UTF-8, else base64, whichever keeps more of them.
"""

from __future__ import annotations

import base64
import hashlib
from bisect import bisect_right
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate

from lockgate.events import DeadLetter, PayloadEncoding, PayloadExcerpt

# JSON writes these as two characters; other control characters as six (\u00XX).
_SHORT_ESCAPES = frozenset('"\\\b\f\n\r\t')
_TRUNCATED = "…"  # appended to reasons and names that were cut
# Everything but the budgeted strings: field names, quotes, numbers, digests, the timestamp.
_ENVELOPE_BYTES = 1024
_NAMES = 4  # budgeted names: source topic, consumer, group, instance


@dataclass(frozen=True)
class LetterLimits:
    """Byte budgets of a letter's variable parts, as written in its JSON."""

    value_bytes: int = 64 * 1024
    key_bytes: int = 1024
    reason_bytes: int = 8 * 1024
    name_bytes: int = 256  # the source topic's, consumer's, group's and instance's names, each

    def __post_init__(self) -> None:
        budgets = (self.value_bytes, self.key_bytes, self.reason_bytes, self.name_bytes)
        if min(budgets) < 0:
            raise ValueError(f"letter budgets must not be negative: {self}")

    @property
    def max_letter_bytes(self) -> int:
        """No encoded letter built with these limits is larger."""
        return (self.value_bytes + self.key_bytes + self.reason_bytes
                + _NAMES * self.name_bytes + _ENVELOPE_BYTES)


def dead_letter(*, source_topic: str, partition: int, offset: int, key: bytes | None,
                value: bytes | None, reason: str, consumer: str, group: str, instance: str,
                at: datetime, limits: LetterLimits | None = None) -> DeadLetter:
    """The letter of one message, written by `consumer` of consumer group `group` in process
    `instance`, encoded in at most `limits.max_letter_bytes`."""
    limits = limits or LetterLimits()
    return DeadLetter(
        source_topic=_text_within(source_topic, limits.name_bytes),
        partition=partition,
        offset=offset,
        key=None if key is None else excerpt(key, limits.key_bytes),
        value=None if value is None else excerpt(value, limits.value_bytes),
        reason=_text_within(reason, limits.reason_bytes),
        consumer=_text_within(consumer, limits.name_bytes),
        at=at,
        group=_text_within(group, limits.name_bytes),
        instance=_text_within(instance, limits.name_bytes),
    )


def excerpt(raw: bytes, budget: int) -> PayloadExcerpt:
    """`raw`'s size, digest, and its longest prefix whose JSON string takes at most `budget`
    bytes: as text if it is valid UTF-8 there, else base64, whichever keeps more bytes."""
    text = _utf8_prefix(raw, budget)
    if text is not None:
        text = _json_prefix(text, budget)
    kept_as_text = len(text.encode()) if text is not None else -1
    kept_as_base64 = min(len(raw), budget // 4 * 3)
    if text is not None and kept_as_text >= kept_as_base64:
        encoding, data, kept = PayloadEncoding.UTF8, text, kept_as_text
    else:
        encoding = PayloadEncoding.BASE64
        data, kept = base64.b64encode(raw[:kept_as_base64]).decode(), kept_as_base64
    return PayloadExcerpt(size=len(raw), sha256=hashlib.sha256(raw).hexdigest(),
                          encoding=encoding, data=data, complete=kept == len(raw))


def _utf8_prefix(raw: bytes, budget: int) -> str | None:
    """The first `budget` bytes of `raw` as text (less a character the cut split), or None if
    they are not valid UTF-8."""
    cut = raw[:budget]
    # A cut may split one character: drop up to three trailing bytes of it, never more.
    for drop in range(min(4, len(cut) + 1) if len(cut) < len(raw) else 1):
        try:
            return cut[:len(cut) - drop].decode()
        except UnicodeDecodeError:
            continue
    return None


def _json_size(character: str) -> int:
    if character in _SHORT_ESCAPES:
        return 2
    if character < " ":
        return 6
    return len(character.encode())


def _json_prefix(text: str, budget: int) -> str:
    """The longest prefix of `text` whose characters take at most `budget` bytes in JSON."""
    head = text[:budget]  # every character takes at least one byte
    sizes = list(accumulate(map(_json_size, head)))
    return head[:bisect_right(sizes, budget)]


def _text_within(text: str, budget: int) -> str:
    """`text`, or its start and a mark, in at most `budget` bytes of JSON (never a surrogate)."""
    text = text.encode(errors="replace").decode()  # a lone surrogate cannot be encoded
    whole = _json_prefix(text, budget)
    if len(whole) == len(text):
        return text
    mark_bytes = len(_TRUNCATED.encode())
    if budget < mark_bytes:
        return whole
    return _json_prefix(text, budget - mark_bytes) + _TRUNCATED
