"""Fair targets solved in a process of their own, so that a round never waits for them.

Why: at fleet scale (1,000 queues asking in 50 clusters) the constrained fair targets cost a
few hundred milliseconds to a second each time demand changes, which is every round; the round
itself needs a fraction of that. Here they are solved in one worker process, beside the
leader's event loop, while rounds go on with the last targets solved (docs/scheduling.md, "Fair
targets off the round's path"). Pure Python holds the GIL, so a thread would only slow the
round down.

The worker is started with "spawn": a fork of a leader holding millions of jobs (and an event
loop with threads) would copy what the worker never uses. It imports only the pure targets
module; each problem is a few thousand demands, pickled in milliseconds.

Used by the fair-scheduler's leader (asyncio, `solve_async`) and by the fleet simulator
(`submit`). A worker that dies is replaced on the next problem; the caller meanwhile computes
targets in the round (the state does when the last adopted ones are too old).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures.process import BrokenProcessPool

from lockgate.scheduler import FairTargets, TargetProblem, solve_problem

log = logging.getLogger(__name__)


def _exit_with(parent: int) -> None:
    """In the worker: end when the process that started it is gone (killed, say), instead of
    living on as an orphan holding its memory."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def solve_timed(problem: TargetProblem) -> tuple[FairTargets, float]:
    """The targets for `problem`, and the seconds the worker spent solving it."""
    started = time.perf_counter()
    targets = solve_problem(problem)
    return targets, time.perf_counter() - started


class TargetsWorker:
    """One worker process that solves `TargetProblem`s, one at a time, in order."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                initializer=_exit_with, initargs=(os.getpid(),))
        return self._pool

    def submit(self, problem: TargetProblem,
               ) -> concurrent.futures.Future[tuple[FairTargets, float]]:
        """Start solving `problem`; its future gives the targets and the seconds solving took
        (or the worker's error)."""
        try:
            return self._executor().submit(solve_timed, problem)
        except BrokenProcessPool:
            self._replace()
            return self._executor().submit(solve_timed, problem)

    async def solve_async(self, problem: TargetProblem) -> tuple[FairTargets, float] | None:
        """The targets for `problem`, solved in the worker, and the seconds that took; None if
        the worker failed (it is replaced, and logged): the caller tries again with a later
        problem."""
        try:
            return await asyncio.wrap_future(self.submit(problem))
        except BrokenProcessPool:
            log.warning("the fair targets' worker process died; starting another")
            self._replace()
            return None
        except Exception:
            log.exception("solving the fair targets in the worker failed")
            return None

    def _replace(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the worker (a problem being solved is abandoned)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
