"""The fair targets' worker process (lockgate_adapters.targets_worker), for real: it solves what
a state hands over to the same targets, survives its process being killed, and carries the
fleet simulator's rounds (which then never solve targets themselves)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.fleet_sim import Scenario, simulate
from lockgate.queues import QueueSpec
from lockgate.resources import Resources
from lockgate.scheduler import NodeInfo, SchedJob, SchedulerState

# The state's fair-target inputs solve the targets where the state would (scheduler.target_inputs).
from lockgate.scheduler import target_inputs as state_module
from lockgate_adapters.targets_worker import TargetsWorker

SCENARIOS = Path(__file__).resolve().parents[2] / "bench" / "scenarios"


@pytest.fixture
def worker() -> Iterator[TargetsWorker]:
    worker = TargetsWorker()
    yield worker
    worker.close()


def a_pinned_fleet() -> SchedulerState:
    """Cluster A (2 nodes) and B (1 node) of 10 cpu each; q1 asks in both, q2 (weight 2) in
    A, q3 in B, all more than there is."""
    state = SchedulerState()
    for name, factor in (("q1", 1.0), ("q2", 0.5), ("q3", 1.0)):
        state.upsert_queue(QueueSpec(name=name, priority_factor=factor))
    node = NodeInfo(allocatable=Resources({"cpu": 10_000, "memory": 64 * 2**30}))
    state.set_cluster("A", {"a-1": node, "a-2": node})
    state.set_cluster("B", {"b-1": node})
    count = 0
    for queue, cluster, pods in (("q1", "A", 12), ("q1", "B", 6), ("q2", "A", 15),
                                 ("q3", "B", 9)):
        for _ in range(pods):
            count += 1
            state.upsert_job(SchedJob(
                job_id=f"{cluster}/j{count}", queue=queue, cluster=cluster,
                created_at=float(count), requests=Resources({"cpu": 1000, "memory": 2**30})))
    return state


async def test_the_worker_solves_what_the_state_would(worker: TargetsWorker) -> None:
    state = a_pinned_fleet()
    problem, key = state.target_problem()
    answer = await worker.solve_async(problem)
    assert answer is not None
    targets, seconds = answer
    assert targets == state.fair_targets()
    assert {name for name, target in targets.queues.items() if target.share > 0} == {
        "q1", "q2", "q3"}
    assert seconds >= 0
    state.adopt_targets(key, targets, at=0.0)
    assert state.targets_current(key)


async def test_a_killed_worker_is_replaced(worker: TargetsWorker) -> None:
    state = a_pinned_fleet()
    problem, _ = state.target_problem()
    assert await worker.solve_async(problem) is not None
    expected = state.fair_targets()
    killed = set(worker._executor()._processes)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    # The first solve after the kill may find the pool broken: it reports that (None), it does
    # not hang or answer wrong; the next one gets a new process and the right answer.
    first = await worker.solve_async(problem)
    assert first is None or first[0] == expected
    second = await worker.solve_async(problem)
    assert second is not None and second[0] == expected
    assert not killed & set(worker._executor()._processes)


def test_the_simulator_hands_the_targets_to_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # The day that drains: every pod has run by its end, so both runs can be compared pod for pod.
    data = yaml.safe_load((SCENARIOS / "a_fleet_day_drain.yaml").read_text())
    in_round = simulate(Scenario.from_mapping(data).scaled(0.002)).summary()
    # Targets solved in this process from here on (the worker's process is another).
    solved_here: list[int] = []
    solve = state_module.fair_targets

    def counted(**inputs: Any) -> Any:
        solved_here.append(1)
        return solve(**inputs)

    monkeypatch.setattr(state_module, "fair_targets", counted)
    in_worker = simulate(Scenario.from_mapping(
        {**data, "targets_worker_min_demands": 0}).scaled(0.002)).summary()
    assert in_round["rounds_with_worker_targets"] == 0, in_round
    # Only the first round with demand solves them itself (nothing adopted yet).
    assert len(solved_here) <= 1, (len(solved_here), in_worker)
    assert in_worker["rounds_with_worker_targets"] > in_worker["rounds"] / 2, in_worker
    assert in_worker["worker_solve_ms_p50"] is not None
    # Targets a round late change who waits, not what the fleet does: every pod runs, the
    # contested clusters stay used, and queues stay about as near the fair allocation.
    assert in_worker["released"] == in_worker["created"] == in_round["released"], (
        in_round, in_worker)
    assert in_worker["contested_utilisation_min"] >= in_round["contested_utilisation_min"] - 0.02
    assert in_worker["deviation_pods_max"] <= in_round["deviation_pods_max"] + 5, (
        in_round, in_worker)


def test_the_worker_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    # A leader killed outright leaves no orphan holding the worker's memory.
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys, time\n"
        "from lockgate_adapters.targets_worker import TargetsWorker\n"
        "from lockgate.scheduler import TargetProblem\n"
        "if __name__ == '__main__':\n"
        "    worker = TargetsWorker()\n"
        "    worker.submit(TargetProblem(groups=(), weights={}, demands=(), pool={})).result()\n"
        "    print(*worker._executor()._processes, flush=True)\n"
        "    time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(Path(__file__).resolve().parents[2] / part) for part in ("libs", "services"))}
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                          env=env) as parent:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)  # polling for the orphan's exit
    os.kill(child, signal.SIGKILL)
    raise AssertionError(f"the worker {child} outlived its parent by 10 s")
