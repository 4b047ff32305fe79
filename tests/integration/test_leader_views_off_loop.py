"""The leader's views answer while its loop runs a round (issue 37, item 8).

A round runs on the leader's event loop and holds it (and the GIL) for its whole length: at
fleet scale 0.2-0.6 s. The fairness answer (`status`, the UI's overview) and an explanation the
last round's picture already gave (a page refreshing, `explain` run again) are served from the
health server's own thread, so they must come back while the round is still running, and be the
last round's; an explanation never given yet waits for the loop, and so does /healthz (a stuck
loop must still fail liveness). The real health server and the leader's report, wired as the
fair scheduler wires them (`fair_scheduler.app.serve_views`), on loopback; the round is stood in
for by a pure-Python busy loop of known length, which holds the loop and the GIL as a round does.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections import Counter
from typing import Any

from fair_scheduler.app import serve_views
from fair_scheduler.reporting import FairnessReport
from lockgate.scheduler import PHASE_OF_STATE, SchedulerState, schedule_round
from lockgate.scheduler.report import ExplainSettings, report_round
from lockgate_adapters.health import HealthServer, Readiness
from unit.builders import a_job, a_node, a_state

ROUND_SECONDS = 2.0
SETTINGS = ExplainSettings(preemption=False, group_reserve_after=None, holds=True)


def _state() -> SchedulerState:
    return (a_state().with_queues("a", "b")
            .with_cluster("c", a_node(cpu="4", memory="8Gi").times(1))
            .with_jobs(a_job("a").requesting(cpu="2", memory="1Gi").times(6),
                       a_job("b").requesting(cpu="2", memory="1Gi").times(6)).build())


def _record(report: FairnessReport, state: SchedulerState, number: int) -> None:
    phases: dict[str, Counter[str]] = {}
    for job in state.job_records.values():
        phase = PHASE_OF_STATE.get(job.state)
        if phase is not None:
            phases.setdefault(job.queue, Counter())[phase] += 1
    now = time.time()
    result = schedule_round(state, max_decisions=1, max_lookback_per_queue=10, now=now)
    report.record_round(report_round(state, result, number=number, at=now, phases=phases,
                                     settings=SETTINGS), seconds=0.01, decisions=1)


def _call(port: int, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method="GET" if body is None else "POST",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.loads(response.read())
    assert isinstance(answer, dict)
    return answer


def _hold_the_loop(seconds: float) -> float:
    """A round's stand-in: Python work that keeps the loop and the GIL; when it ended."""
    end = time.monotonic() + seconds
    spins = 0
    while time.monotonic() < end:
        spins += 1
    return time.monotonic()


async def test_the_picture_and_explanations_given_answer_while_a_round_runs() -> None:
    state = _state()
    queued = sorted(job_id for job_id, job in state.job_records.items()
                    if job.state.value == "queued")
    asked_before, never_asked = queued[-1], queued[-2]
    report = FairnessReport("leader")
    report.set_leader(True)
    health = HealthServer(Readiness(), host="127.0.0.1", port=0, own_thread=True)
    serve_views(health, report)
    await health.start()
    try:
        port = health.bound_port
        assert port is not None
        _record(report, state, number=1)
        asked = {"jobs": [{"id": asked_before, "place": [6, 6]}]}
        # Asked twice (the first answered on the loop, the second off it), then the next
        # round is reported and explains again what was asked again lately, as the leader
        # does after each round.
        await asyncio.to_thread(_call, port, "/api/v1/explain", asked)  # the loop answers
        await asyncio.to_thread(_call, port, "/api/v1/explain", asked)  # asked again
        _record(report, state, number=2)
        assert report.explain_again(now=time.time()) == 1

        finished: dict[str, float] = {}
        answers: dict[str, dict[str, Any]] = {}

        def client() -> None:
            time.sleep(0.3)  # the round is under way
            for name, path, body in (
                    ("fairness", "/api/v1/fairness", None),
                    ("explain_asked_before", "/api/v1/explain", asked),
                    ("explain_never_asked", "/api/v1/explain",
                     {"jobs": [{"id": never_asked, "place": [5, 6]}]}),
                    ("healthz", "/healthz", None)):
                answers[name] = _call(port, path, body)
                finished[name] = time.monotonic()

        thread = threading.Thread(target=client)
        thread.start()
        round_ended = _hold_the_loop(ROUND_SECONDS)
        # The loop answers what waits for it while the client finishes.
        await asyncio.to_thread(thread.join)
    finally:
        await health.stop()

    # Answered during the round, from the last round reported (2), never waiting for it.
    assert finished["fairness"] < round_ended, (finished, round_ended)
    assert finished["explain_asked_before"] < round_ended, (finished, round_ended)
    assert answers["fairness"]["last_round"]["number"] == 2
    assert {q["name"] for q in answers["fairness"]["queues"]} == {"a", "b"}
    said = answers["explain_asked_before"]
    assert said["round"]["number"] == 2
    assert said["explanations"][asked_before]["explanation"]["reason"] is not None
    # Never explained yet: worked out on the loop, once the round let go of it.
    assert finished["explain_never_asked"] >= round_ended
    assert answers["explain_never_asked"]["explanations"][never_asked] is not None
    assert finished["healthz"] >= round_ended and answers["healthz"] == {"alive": True}
