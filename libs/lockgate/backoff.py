"""Back-off per controller for pods lockgate keeps giving up on (`lockgate.unplaceable`).

Why this exists: when kube-scheduler keeps a released pod Unschedulable, the leader gives up on
it and, if a controller owns it, has it deleted so the controller creates a gated replacement.
If lockgate's model is wrong for that workload for good (a constraint it does not model, such as
inter-pod anti-affinity or a topology spread constraint), the replacement is released the same
way, fails the same way and is deleted again: a ReplicaSet would churn every
`unplaceable_after_seconds`, each time holding room in the model and writing Events. So, like
kube-scheduler's own pod back-off and a Job's backoffLimit delays, a controller whose pod was
given up on gets a back-off: its queued pods wait, not released, for a delay that doubles with
each consecutive give-up, up to a cap.

The rule (docs/scheduling.md, "Released pods that cannot be placed"):
- a give-up of a pod of controller C while C is not backing off starts a back-off of
  `initial * 2**(attempts - 1)` seconds, at most `max_seconds`, where `attempts` counts C's
  consecutive give-ups; a give-up while C still backs off changes nothing (that pod was released
  before the back-off began: the same attempt, e.g. two replicas released together);
- a pod of C created after C's last give-up (to the second: creation times have no more) that
  gets bound resets C (the model fits again);
- when the delay ends C's pods go again; C's record is forgotten `forget_after_seconds` after
  that without another give-up, so counting starts afresh and the records stay bounded.

Pure: the clock is passed in as epoch seconds; the leader keeps the records in Postgres.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

# A controller: (cluster, uid of its controlling ownerReference); uids are per cluster.
ControllerKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """How long a controller's pods wait after consecutive give-ups."""

    initial_seconds: float
    max_seconds: float
    forget_after_seconds: float

    def __post_init__(self) -> None:
        if not self.initial_seconds > 0 or not self.max_seconds > 0:
            raise ValueError("initial_seconds and max_seconds must be positive")
        if self.forget_after_seconds < 0:
            raise ValueError("forget_after_seconds must not be negative")

    def delay(self, attempts: int) -> float:
        """The wait after the `attempts`-th consecutive give-up (1-based)."""
        if attempts < 1:
            raise ValueError("attempts counts from 1")
        # min() before the power would overflow a float after ~1000 doublings.
        doublings = min(attempts - 1, 64)
        return min(self.max_seconds, self.initial_seconds * 2.0 ** doublings)


@dataclass(frozen=True, slots=True)
class ControllerBackoff:
    """One controller's back-off: its pods wait until `until` (epoch seconds)."""

    cluster: str
    controller_uid: str
    attempts: int  # consecutive give-ups
    given_up_at: float  # the last one that counted
    until: float

    @property
    def key(self) -> ControllerKey:
        return (self.cluster, self.controller_uid)

    def waits(self, now: float) -> bool:
        return now < self.until

    def message(self) -> str:
        """What `lockgate explain` and the waiting Events say of its pods."""
        return backing_off_message(self.attempts, self.until)


def backing_off_message(attempts: int, until: float) -> str:
    tries = "attempt" if attempts == 1 else "attempts"
    then = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"backing off after {attempts} unplaceable {tries}; next try after {then}: "
            "kube-scheduler kept refusing this controller's pods that lockgate released "
            "(a constraint lockgate does not model, such as pod anti-affinity or topology "
            "spread?)")


class ControllerBackoffs:
    """Every controller's back-off record, and when each next needs the leader's attention.

    Operations are O(log n) in the number of records (a heap of due times, lazily deleted).
    """

    def __init__(self, policy: BackoffPolicy) -> None:
        self.policy = policy
        self._records: dict[ControllerKey, ControllerBackoff] = {}
        # (when, key): a wait that ends, or a record to forget; stale entries are skipped.
        self._due: list[tuple[float, ControllerKey]] = []

    def load(self, records: Iterable[ControllerBackoff]) -> None:
        """Take records as stored (a new leader); replaces any with the same key."""
        for record in records:
            self._set(record)

    def get(self, key: ControllerKey) -> ControllerBackoff | None:
        return self._records.get(key)

    def waiting(self, now: float) -> list[ControllerBackoff]:
        """The records whose pods must wait at `now`."""
        return [record for record in self._records.values() if record.waits(now)]

    def give_up(self, key: ControllerKey, now: float) -> ControllerBackoff | None:
        """A pod of this controller was given up on at `now`: the new record, or None when it
        still backs off (nothing changes)."""
        old = self._records.get(key)
        if old is not None and old.waits(now):
            return None
        attempts = 1 if old is None else old.attempts + 1
        record = ControllerBackoff(key[0], key[1], attempts, now,
                                   now + self.policy.delay(attempts))
        self._set(record)
        return record

    def bound(self, key: ControllerKey, created_at: float) -> ControllerBackoff | None:
        """A pod of this controller, created at `created_at`, is bound: returns the record it
        resets (now forgotten), or None. Pods created before the second of the last give-up
        (replicas that ran all along) reset nothing: creation times have whole seconds only,
        so a replacement created in that second must count."""
        record = self._records.get(key)
        if record is None or created_at < math.floor(record.given_up_at):
            return None
        del self._records[key]
        return record

    def due(self, now: float) -> tuple[list[ControllerBackoff], list[ControllerBackoff]]:
        """Records whose wait ended by `now` (their pods may go), and records to forget (kept
        `forget_after_seconds` past their wait without another give-up; dropped here)."""
        ended: list[ControllerBackoff] = []
        forgotten: list[ControllerBackoff] = []
        while self._due and self._due[0][0] <= now:
            at, key = heapq.heappop(self._due)
            record = self._records.get(key)
            if record is None:
                continue
            if at == record.until:
                ended.append(record)
                forget_at = record.until + self.policy.forget_after_seconds
                if forget_at > now:
                    heapq.heappush(self._due, (forget_at, key))
                    continue
            elif at != record.until + self.policy.forget_after_seconds:
                continue  # stale: the record changed since
            del self._records[key]
            forgotten.append(record)
        return ended, forgotten

    def next_due(self) -> float:
        """When (epoch seconds) `due` next has something; infinity when never."""
        while self._due:
            at, key = self._due[0]
            record = self._records.get(key)
            if record is not None and at in (
                    record.until, record.until + self.policy.forget_after_seconds):
                return at
            heapq.heappop(self._due)
        return math.inf

    def __len__(self) -> int:
        return len(self._records)

    def _set(self, record: ControllerBackoff) -> None:
        if self._records.get(record.key) == record:
            return  # already due when it says
        self._records[record.key] = record
        heapq.heappush(self._due, (record.until, record.key))
