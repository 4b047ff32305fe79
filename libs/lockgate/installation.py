"""One installation of lockgate among others on the same Kafka cluster.

Why: people run staging and production (or one lockgate per team) on one Kafka cluster. Two
installations that read each other's topics mix their worlds: each shows the other's clusters
and queues, and counts the other's nodes in its pool. So an installation has a topic prefix, one
setting (LOCKGATE_TOPIC_PREFIX) that every service applies to every topic it creates, writes or
reads, and to its consumer groups; and queue-store folds only the events of the clusters it was
configured for (LOCKGATE_QUEUE_STORE_CLUSTERS), whatever reaches it.

The default prefix is "": an installation without one keeps the topic names it always had.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

# Kafka's legal topic characters are [a-zA-Z0-9._-]; a topic name is at most 249 of them. The
# longest of lockgate's own names is under 40, so a prefix of up to 120 always leaves room.
TOPIC_PREFIX_PATTERN = r"^[A-Za-z0-9._-]{0,120}$"
_TOPIC_PREFIX = re.compile(TOPIC_PREFIX_PATTERN)
MAX_TOPIC_NAME = 249


def installation_name(prefix: str, name: str) -> str:
    """`name` (a topic's or a consumer group's) as the installation with `prefix` uses it."""
    if not _TOPIC_PREFIX.match(prefix):
        raise ValueError(f"topic prefix {prefix!r}: use up to 120 of A-Z a-z 0-9 . _ -")
    prefixed = prefix + name
    if len(prefixed) > MAX_TOPIC_NAME:
        raise ValueError(f"{prefixed!r} is longer than Kafka's {MAX_TOPIC_NAME} characters")
    return prefixed


@dataclass(frozen=True)
class ClusterScope:
    """The clusters an installation serves; `None` (not configured): every cluster."""

    clusters: frozenset[str] | None = None

    @classmethod
    def of(cls, clusters: Collection[str]) -> ClusterScope:
        """Only `clusters`; none given: every cluster (an installation configured before the
        setting existed keeps folding everything it reads)."""
        return cls(frozenset(clusters) if clusters else None)

    def serves(self, cluster: str) -> bool:
        return self.clusters is None or cluster in self.clusters

    def describe(self) -> str:
        return "every cluster" if self.clusters is None else ", ".join(sorted(self.clusters))
