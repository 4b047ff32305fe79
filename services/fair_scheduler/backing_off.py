"""The leader's side of the back-off per controller (lockgate.backoff): keep the records, the
holds in the scheduler's state and the rows in Postgres in step.

Why a module of its own: the leader calls it at four points (loading, each changed job row,
each give-up, each loop turn), and the rules live in `lockgate.backoff`; keeping the glue here
keeps `leading` readable. Records are written with the give-up that starts them (one
transaction, `scheduler_store.record_unplaceable`), so a new leader holds the same controllers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import asyncpg

from lockgate.backoff import BackoffPolicy, ControllerBackoff, ControllerBackoffs
from lockgate.scheduler import SchedJob, SchedulerState
from lockgate_adapters import scheduler_store as store

log = logging.getLogger(__name__)


class ControllerBackoffKeeper:
    """Back-offs of one leadership term; `enabled=False` starts none (stored ones still end)."""

    def __init__(self, state: SchedulerState, policy: BackoffPolicy, *, enabled: bool) -> None:
        self._state = state
        self._book = ControllerBackoffs(policy)
        self._enabled = enabled
        self._to_forget: list[ControllerBackoff] = []  # reset by a bind, not deleted yet

    def load(self, records: Iterable[ControllerBackoff], now: float) -> None:
        """Take the stored records (before the jobs, so binds seen while loading reset)."""
        records = list(records)
        self._book.load(records)
        for record in self._book.waiting(now):
            self._state.hold_controller(record)
        if records:
            log.info("loaded %d controller back-offs (%d waiting)", len(records),
                     len(self._book.waiting(now)))

    def observe(self, job: SchedJob) -> bool:
        """A job's current row; returns whether it reset its controller (its pods may go)."""
        if not job.controller or job.node_name is None:
            return False
        reset = self._book.bound((job.cluster, job.controller), job.created_at)
        if reset is None:
            return False
        self._state.release_controller(reset.key)
        self._to_forget.append(reset)
        log.info("controller %s in %s reset its back-off after %d attempts: its pod %s bound",
                 reset.controller_uid, reset.cluster, reset.attempts, job.job_id)
        return True

    def give_up(self, job: SchedJob, *, namespace: str, pod: str,
                now: float) -> store.BackoffRow | None:
        """The leader gave up on `job` and has it deleted: its controller backs off (unless it
        already does). Returns the row to store with the give-up."""
        if not self._enabled or not job.controller:
            return None
        record = self._book.give_up((job.cluster, job.controller), now)
        if record is None:
            return None
        self._state.hold_controller(record)
        log.warning("controller %s of pod %s/%s in %s backs off for %.0fs: %s",
                    record.controller_uid, namespace, pod, record.cluster,
                    record.until - now, record.message())
        return store.BackoffRow(record, namespace, pod)

    async def end_due(self, connection: asyncpg.Connection, now: float) -> bool:
        """Let the pods of controllers whose wait ended go, and delete records that are over;
        returns whether any pods may go."""
        ended, forgotten = self._book.due(now)
        for record in ended:
            self._state.release_controller(record.key)
        gone = forgotten + self._to_forget
        if gone:
            await store.forget_backoffs(connection, gone)
            self._to_forget = []
        return bool(ended)

    def next_due(self) -> float:
        """When (epoch seconds) `end_due` next has something to do."""
        return self._book.next_due()
