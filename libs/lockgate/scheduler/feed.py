"""Between the job rows in Postgres and the scheduler state: which rows the state holds.

Why it exists: not every unfinished job in Postgres may be in the state a round decides on. The
hold-out policy keeps four kinds out of their queue's line, and the fair-scheduler leader (for
its rounds) and queue-store (for `lockgate status` and `lockgate explain`) must apply the same
one, or the view says what the scheduler does not do:

- **expired**: a pod past its maximum time queued (its queue's or its job set's, whichever is
  stricter, `lockgate.max_queued`) leaves the state at once, so no round releases it while the
  ungater fails or deletes it; it stays out until its row is no longer queued;
- **backing off**: a job whose release failed (the ungater returned it) waits out of the state
  `release_retry_initial_seconds`, doubling with each failure up to the maximum, so a release
  that keeps failing does not spin;
- **given up**: a released pod kube-scheduler kept refusing (`lockgate.unplaceable`) is no longer
  charged while it is unbound;
- **controller holds**: the queued pods of a controller that backs off after such a give-up
  (`lockgate.backoff`) are held in the state, out of their queue's line and demand.

`Feed` applies every row through that policy, and also keeps what the leader decides from the
same rows (who is due a wait notice, which queue nobody defined, who is stuck Unschedulable, the
phase counts per queue). It is pure: the leader does the I/O around it (reads rows, records,
publishes) and queue-store loads its snapshot through it. Times are epoch seconds, passed in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from lockgate.backoff import BackoffPolicy, ControllerBackoff, ControllerBackoffs
from lockgate.jobs import JobKey, JobState
from lockgate.max_queued import Limit
from lockgate.noticing import UndefinedQueueNotices
from lockgate.queues import MaxQueued, QueueSpec
from lockgate.scheduler.room_caches import NodeInfo
from lockgate.scheduler.state import SchedJob, SchedulerState
from lockgate.scheduler.waiting import NoticeLimits, WaitingPods
from lockgate.unplaceable import UnplaceableWatch, is_given_up

# The phase each state counts as, per queue (`Feed.phases`, the leader's report).
PHASE_OF_STATE: dict[JobState, str] = {
    JobState.QUEUED: "queued",
    JobState.RELEASED: "released",
    JobState.UNGATED: "released",
    JobState.BOUND: "running",
    JobState.RUNNING: "running",
}
PHASES = ("queued", "released", "running")


@dataclass(frozen=True, slots=True)
class FeedPolicy:
    """The hold-out policy's settings (the fair-scheduler's, which queue-store mirrors)."""

    release_retry_initial_seconds: float = 2.0
    release_retry_max_seconds: float = 300.0
    unplaceable_after_seconds: float = 120.0
    controller_backoff: BackoffPolicy = field(default_factory=lambda: BackoffPolicy(
        initial_seconds=120.0, max_seconds=1800.0, forget_after_seconds=3600.0))
    # False: no controller starts backing off (records already stored still end).
    controller_backoff_enabled: bool = True
    notices: NoticeLimits = field(default_factory=lambda: NoticeLimits(
        pod_interval=300.0, cluster_rate=5.0, cluster_burst=50.0, early=(15.0, 45.0)))

    def release_retry_seconds(self, releases: int) -> float:
        """How long a job whose release failed after `releases` releases waits."""
        return min(self.release_retry_max_seconds,
                   self.release_retry_initial_seconds * 2.0 ** max(0, releases - 1))


class Feed:
    """The state, and every job row applied to it through the hold-out policy."""

    def __init__(self, state: SchedulerState, policy: FeedPolicy) -> None:
        self.state = state
        self.policy = policy
        # Queued jobs whose queue may turn out undefined, and which of them were noticed.
        self.notices = UndefinedQueueNotices()
        # Released pods kube-scheduler reports Unschedulable, until they are given up on.
        self.unplaceable = UnplaceableWatch(policy.unplaceable_after_seconds)
        # Queued pods: when each is next told why it waits, and which waited too long.
        self.waiting = WaitingPods(policy.notices)
        # Jobs recorded for removal (evicted, or of a timed-out group) and not finished yet:
        # they hold what they hold, but are as good as gone for preemption planning.
        self.removing: set[str] = set()
        # Phase counts per queue of the jobs the feed holds (in the state or held out).
        self.phases: dict[str, Counter[str]] = {}
        self._expired: dict[str, SchedJob] = {}
        self._retrying: dict[str, tuple[float, SchedJob]] = {}  # job id -> (due, job)
        self._controllers = ControllerBackoffs(policy.controller_backoff)
        self._to_forget: list[ControllerBackoff] = []  # reset by a bind, not deleted yet
        # Jobs whose release a round decided and the leader could not record, taken back, until
        # the next read of rows (`taken_back`, `after_read`).
        self._unrecorded: set[str] = set()

    # ---- rows in ---------------------------------------------------------------------------

    def apply_queue(self, name: str, spec: QueueSpec | None) -> None:
        if spec is None:
            self.state.remove_queue(name)
        else:
            self.state.upsert_queue(spec)

    def apply_node(self, cluster: str, node: str, info: NodeInfo | None) -> None:
        self.state.set_node(cluster, node, info)

    def load_backoffs(self, records: Iterable[ControllerBackoff], now: float) -> None:
        """Take the stored controller back-offs (before the jobs, so binds seen while loading
        reset them)."""
        self._controllers.load(records)
        for record in self._controllers.waiting(now):
            self.state.hold_controller(record)

    def apply_job(self, job: SchedJob, *, now: float,
                  returned: tuple[int, float] | None = None) -> bool:
        """Take a job's current row; returns whether a round could release something new.

        `returned`: (releases so far, when it came back) for a queued job whose release failed.
        """
        state = self.state
        self._unrecorded.discard(job.job_id)  # its row is still there
        self.notices.observe(job)
        self.unplaceable.observe(job)
        self.waiting.observe(job, now)
        changed = self._observe_controller(job)
        if job.state.is_terminal:
            self.removing.discard(job.job_id)
        if job.job_id in self._expired:
            if job.state is JobState.QUEUED:
                return changed  # still waiting for the ungater to fail or delete it
            del self._expired[job.job_id]
        retrying = self._retrying.get(job.job_id)
        old = state.job(job.job_id) if retrying is None else retrying[1]
        if old is None and job.state.is_terminal:
            return changed
        if retrying is None and is_given_up(job):
            # Given up on while unbound: not charged (until it binds after all).
            if old is not None:
                self._count(old, -1)
                state.remove_job(job.job_id)
                changed = True
            return changed
        if returned is not None:
            if retrying is not None and retrying[1] == job:
                return changed  # the same row again: still backing off
            due = returned[1] + self.policy.release_retry_seconds(returned[0])
            if due > now:
                self._count(old, -1)
                self._count(job, +1)
                if state.job(job.job_id) is not None:
                    state.remove_job(job.job_id)  # its room is free again meanwhile
                self._retrying[job.job_id] = (due, job)
                return True
        if retrying is not None:  # back from its backoff, changed or not
            del self._retrying[job.job_id]
            self._count(old, -1)
            self._count(job, +1)
            state.upsert_job(job)
            return True
        # Our own decisions come back through the feed unchanged: not news.
        if old != job:
            self._count(old, -1)
            self._count(job, +1)
            state.upsert_job(job)
            return True
        return changed

    def apply_jobs(self, jobs: Iterable[SchedJob], *, now: float,
                   returned: dict[str, tuple[int, float]] | None = None) -> bool:
        changed = False
        for job in jobs:
            found = None if returned is None else returned.get(job.job_id)
            changed = self.apply_job(job, now=now, returned=found) or changed
        return changed

    def released(self, queue: str) -> None:
        """A round released one of the queue's jobs (the state holds it as released)."""
        phases = self.phases.setdefault(queue, Counter())
        phases["queued"] -= 1
        phases["released"] += 1

    def taken_back(self, job_ids: Iterable[str]) -> None:
        """Releases a round decided that the leader could not record, which the round's
        transaction took back (each job queued again as it was before the round).

        Postgres had each of these jobs other than queued, or not at all, when the leader wrote:
        the job's row changed after what the state was built from, or it is gone. So the next
        read of changed rows, taken after that write, brings the row of each one still there
        (`apply_job`), and `after_read` removes the rest."""
        self._unrecorded.update(job_ids)

    def after_read(self) -> list[str]:
        """After a read of changed rows is applied: the jobs taken back (`taken_back`) before
        it that it did not bring have no row any more, and leave the state; returns them."""
        vanished = sorted(self._unrecorded)
        self._unrecorded.clear()
        for job_id in vanished:
            self._count(self.state.job(job_id), -1)
            self.state.remove_job(job_id)
            self.notices.forget(job_id)
            self.waiting.forget(job_id)
        return vanished

    def key_of(self, job_id: str) -> JobKey | None:
        """Who a job the feed holds is: in the state, waiting to retry, or expired (None: it
        holds no such job, or does not know its pod)."""
        key = self.state.job_key(job_id)
        if key is not None:
            return key
        retrying = self._retrying.get(job_id)
        job = retrying[1] if retrying is not None else self._expired.get(job_id)
        return None if job is None or not job.name else job.key

    # ---- time ------------------------------------------------------------------------------

    def end_due(self, now: float) -> bool:
        """Let jobs whose retry wait or controller wait ended go; returns whether any may.
        Controller records now over are then in `backoffs_to_forget`."""
        due = [job for at, job in self._retrying.values() if at <= now]
        for job in due:
            del self._retrying[job.job_id]
            self.state.upsert_job(job)
            self.waiting.observe(job, now)  # told again while it waits anew
        ended, forgotten = self._controllers.due(now)
        for record in ended:
            self.state.release_controller(record.key)
        self._to_forget += forgotten
        return bool(due or ended)

    def next_due(self) -> float:
        """When (epoch seconds) `end_due` or `unplaceable_due` next has something to do."""
        return min(min((at for at, _ in self._retrying.values()), default=float("inf")),
                   self._controllers.next_due(), self.unplaceable.next_due())

    def backoffs_to_forget(self) -> list[ControllerBackoff]:
        """Controller records over, or reset by a bind, to delete from Postgres (once)."""
        gone, self._to_forget = self._to_forget, []
        return gone

    # ---- pods past their maximum time queued -----------------------------------------------

    def max_queued_of(self, queue: str) -> MaxQueued | None:
        spec = self.state.queue_spec(queue)
        return None if spec is None else spec.max_queued

    def expired_due(self, now: float) -> list[tuple[str, Limit]]:
        """Pods queued past their maximum, each returned once (see `WaitingPods.expired`);
        `expire` takes each out."""
        return self.waiting.expired(now, self.max_queued_of)

    def expire(self, job_id: str) -> SchedJob | None:
        """Take a pod past its maximum out of the state (and of a retry wait) until its row
        says it is no longer queued; returns the job as it was, None if the feed holds none."""
        retrying = self._retrying.pop(job_id, None)
        job = self.state.job(job_id) or (None if retrying is None else retrying[1])
        if job is None:
            return None
        self._count(job, -1)
        if self.state.job(job_id) is not None:
            self.state.remove_job(job_id)
        self._expired[job_id] = job
        return job

    def expire_all_due(self, now: float) -> None:
        """`expire` every pod past its maximum (for a snapshot: queue-store's views)."""
        for job_id, _ in self.expired_due(now):
            self.expire(job_id)

    # ---- released pods kube-scheduler keeps refusing ---------------------------------------

    def unplaceable_due(self, now: float, *, limit: int) -> list[SchedJob]:
        return self.unplaceable.due(now, limit=limit)

    def give_up_controller(self, job: SchedJob, now: float) -> ControllerBackoff | None:
        """The leader gave up on `job` and has it deleted: its controller backs off (unless
        it already does, or back-off is off). Returns the record to store with the give-up."""
        if not self.policy.controller_backoff_enabled or not job.controller:
            return None
        record = self._controllers.give_up((job.cluster, job.controller), now)
        if record is not None:
            self.state.hold_controller(record)
        return record

    def given_up(self, jobs: Iterable[SchedJob]) -> None:
        """The give-ups are recorded: stop charging each while it is unbound."""
        for job in jobs:
            self.unplaceable.forget(job.job_id)
            current = self.state.job(job.job_id)
            if current is not None and current.node_name is None:
                self._count(current, -1)
                self.state.remove_job(job.job_id)

    # ---- what is held out ------------------------------------------------------------------

    def held_out(self, job_id: str) -> str | None:
        """Why the feed holds a job out of the state ("expired", "backing_off"), or None."""
        if job_id in self._expired:
            return "expired"
        if job_id in self._retrying:
            return "backing_off"
        return None

    def retry_due(self, job_id: str) -> float | None:
        """When (epoch seconds) a job whose release failed may go again, if it waits."""
        retrying = self._retrying.get(job_id)
        return None if retrying is None else retrying[0]

    # ---- internals -------------------------------------------------------------------------

    def _observe_controller(self, job: SchedJob) -> bool:
        """A bound pod of a controller backing off resets it: its queued pods may go."""
        if not job.controller or job.node_name is None:
            return False
        reset = self._controllers.bound((job.cluster, job.controller), job.created_at)
        if reset is None:
            return False
        self.state.release_controller(reset.key)
        self._to_forget.append(reset)
        return True

    def _count(self, job: SchedJob | None, delta: int) -> None:
        if job is None:
            return
        phase = PHASE_OF_STATE.get(job.state)
        if phase is not None:
            self.phases.setdefault(job.queue, Counter())[phase] += delta
