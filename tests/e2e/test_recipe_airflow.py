"""The Airflow recipe (docs/integrations/airflow.md) with the real client: a DAG run of one
KubernetesPodOperator task (apache-airflow 3.3.2, cncf-kubernetes provider 10.25.0), run by
`dag.test()` with a SQLite metadata DB (tests/recipes/airflow_kpo.py, in the Airflow venv, as a
process of its own), with the kubeconfig of a non-admin identity: an `airflow-worker`
ServiceAccount whose Role holds what the operator uses in the namespace. Every lockgate service
runs as a process on the real stack (helpers.runs).

The namespace is bound to a queue; the test has a kwok node of its own (3 cpu, tainted), held
by a filler pod of the same queue, so the task's 2-cpu pod waits:
- the task's first try waits longer than its schedule_timeout_seconds (30 s), its log showing
  lockgate's Events meanwhile: the operator raises PodLaunchTimeoutException, deletes the gated
  pod, and Airflow marks the try for retry;
- a pod of another client comes meanwhile, after the task's first pod, and waits;
- the retry (retry_delay 3 s) creates the pod again, of the same name (random_name_suffix=False):
  it keeps the first pod's place (lockgate's row says so, and its first Event);
- when the filler ends, the retry's pod is released before the other client's (its place), runs
  (kwok), succeeds, and the task and its DAG run succeed; then the other client's pod goes.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.pods import a_pod
from helpers.recipes import airflow_python, recipe_script
from helpers.runs import LockgateRun, first_notice, lockgate_run
from helpers.waiting import eventually
from lockgate.labels import QUEUE_LABEL, SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(420)]

SCHEDULE_TIMEOUT = 30  # s: the first try gives up while the filler holds the node
RETRY_DELAY = 3  # s: well within lockgate's grace period (600 s)
STARTUP = 180  # s: Airflow's start (db migrate, DAG parse, the task runner) on a loaded machine
# What KubernetesPodOperator does with pods and their Events in its namespace (create, read,
# watch its start, patch its `already_checked` label, delete; read Events while it waits).
WORKER_ROLE = [
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["get", "watch", "list", "create", "delete", "patch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
]


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path, name="kpo", env={
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "0.5",
            "LOCKGATE_SCHEDULER_WAIT_NOTICE_CHECK_SECONDS": "0.5"}) as running:
        yield running


class DagRun:
    """tests/recipes/airflow_kpo.py as a process of its own in the Airflow venv: its report
    lines (JSON, stdout) as they come; Airflow's logs in a file, for failure messages."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log
        self.lines: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, workdir: Path, *argv: str) -> DagRun:
        log = workdir / "airflow.log"
        with log.open("wb") as err:
            process = await asyncio.create_subprocess_exec(
                str(airflow_python()), str(recipe_script("airflow_kpo.py")), *argv,
                "--home", str(workdir / "airflow-home"),
                env={**os.environ}, stdout=asyncio.subprocess.PIPE, stderr=err)
        return cls(process, log)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            try:
                self.lines.append(json.loads(raw.decode()))
            except ValueError:
                self.lines.append({"not-json": raw.decode(errors="replace").rstrip()})
        await self.process.wait()

    def told(self) -> str:
        tail = self.log.read_text(errors="replace")[-6000:] if self.log.exists() else ""
        return (f"airflow_kpo.py (exit {self.process.returncode}) reported:\n"
                + "\n".join(json.dumps(line) for line in self.lines)
                + f"\n--- its Airflow log's tail ({self.log}):\n{tail}")

    async def line(self, what: str, *, within: float, **fields: Any) -> dict[str, Any]:
        """The first report line holding `fields` (e.g. event="retry"; `outcome=ANY` for any
        value), once it came."""
        def matches(line: dict[str, Any]) -> bool:
            return all(key in line and (value is ANY or line[key] == value)
                       for key, value in fields.items())

        async def came() -> dict[str, Any] | None:
            found = next((line for line in self.lines if matches(line)), None)
            if found is None and self.reader.done():
                raise AssertionError(f"{what}: no such line before it ended; {self.told()}")
            return found

        return await eventually(came, within=within, every=0.3,
                                what=lambda: f"{what} from the DAG run; {self.told()}")

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


def released(pod: client.V1Pod | None) -> bool:
    return pod is not None and SCHEDULING_GATE not in {
        gate.name for gate in pod.spec.scheduling_gates or ()}


async def queued(run: LockgateRun, name: str, *, within: float = 60,
                 not_uid: str | None = None) -> client.V1Pod:
    """The pod (not the one of uid `not_uid`), once lockgate has it queued."""
    async def found() -> client.V1Pod | None:
        pod = await run.pod(name)
        if pod is None or pod.metadata.deletion_timestamp is not None \
                or pod.metadata.uid == not_uid:
            return None
        row = await run.job(pod.metadata.uid)
        return pod if row is not None and row["state"] == "queued" else None

    return await eventually(found, within=within, every=0.3, what=f"{name} queued by lockgate")


async def test_a_task_whose_pod_times_out_keeps_its_place_when_retried(
    run: LockgateRun, stack: StackInfo, tmp_path: Path,
) -> None:
    queue = run.name("pipelines")
    # The docs' binding: the namespace may use the queue, and the task's pods name it.
    await run.create_queues([queue], namespaces=[run.namespace])
    await run.create_namespace()
    kubeconfig = await run.identity_kubeconfig("airflow-worker", WORKER_ROLE,
                                               tmp_path / "airflow.kubeconfig")
    node = run.name("kpo")
    await run.add_node(node, allocatable={"cpu": "3", "memory": "8Gi", "pods": "110"},
                       labels={"recipe": node},
                       taints=[{"key": "recipe", "value": node, "effect": "NoSchedule"}])

    def on_the_node(name: str, cpu: str) -> dict[str, Any]:
        return (a_pod(name).in_queue(queue).requesting(cpu=cpu, memory="64Mi")
                .tolerating(key="recipe", operator="Equal", value=node, effect="NoSchedule")
                .with_spec(nodeSelector={"recipe": node}).manifest())

    # The cluster is full for the task's pod: a filler of the same queue holds the node.
    filler = await run.create_pod(on_the_node("filler", "3"))

    async def filler_released() -> bool:
        return released(await run.pod(filler.metadata.name))
    await eventually(filler_released, within=60, every=0.3, what="the filler released")

    pod_name = run.name("etl-extract")
    dag_run = await DagRun.start(
        tmp_path, "--kubeconfig", kubeconfig, "--namespace", run.namespace, "--queue", queue,
        "--name", pod_name, "--cpu", "2", "--schedule-timeout", str(SCHEDULE_TIMEOUT),
        "--retry-delay", str(RETRY_DELAY), "--complete-after", "10s",
        "--node-selector", f"recipe={node}", "--toleration", f"recipe={node}")
    try:
        await retried(run, dag_run, queue, pod_name, on_the_node)
    finally:
        await dag_run.close()


async def retried(run: LockgateRun, dag_run: DagRun, queue: str, pod_name: str,
                  on_the_node: Any) -> None:
    first = await dag_run.line("the first try's pod created", within=STARTUP,
                               event="created")
    assert first["try"] == 1 and first["pod"] == pod_name, dag_run.told()
    original = await queued(run, pod_name)
    assert original.metadata.uid == first["uid"], dag_run.told()
    assert original.metadata.labels[QUEUE_LABEL] == queue
    await asyncio.sleep(1.1)  # creation times are whole seconds: the other client's is later
    later = await run.create_pod(on_the_node(run.name("later"), "2"))
    await queued(run, later.metadata.name)

    # The first try gives up after schedule_timeout_seconds and deletes its gated pod.
    retry = await dag_run.line("the first try failed, to be retried",
                               within=SCHEDULE_TIMEOUT + 60, event="retry")
    assert retry["try"] == 1 and retry["gone"] is True, dag_run.told()
    assert any(e.startswith("PodLaunchTimeoutException: ") for e in retry["exceptions"]), (
        dag_run.told())
    row = await run.job(original.metadata.uid)
    assert row is not None and row["state"] == "deleted", row
    # Meanwhile the task's log showed lockgate's Events (the operator logs the pod's Events while
    # it waits for it to start): the 15 s one names this run's queue, position and cluster.
    # (The first may be another test's lockgate run's, as in test_recipe_kubespawner.)
    task_log = dag_run.log.read_text(errors="replace")
    assert any("The Pod has an Event: still waiting: " in line
               and f'queue "{queue}", position 1 of ' in line and f"cluster {run.alias()}" in line
               for line in task_log.splitlines()), dag_run.told()

    # Airflow's retry creates the pod again, of the same name: it keeps the first one's place.
    second = await dag_run.line("the retry's pod created", within=RETRY_DELAY + 90,
                                event="created", **{"try": 2})
    assert second["pod"] == pod_name, dag_run.told()
    again = await queued(run, pod_name, not_uid=original.metadata.uid)
    assert again.metadata.uid == second["uid"], dag_run.told()
    row = await run.job(again.metadata.uid)
    assert row is not None and row["kept_place_of"] == pod_name, row
    # Its first Event says so (`kubectl describe pod`), unless another test's lockgate run,
    # which does not know this queue, wrote it first (as in test_recipe_kubespawner); lockgate's
    # row, just checked, is this run's own answer.
    notice = await first_notice(run, again.metadata.uid)
    assert (notice.startswith(f'queued: it kept the place in line of deleted pod "{pod_name}"'
                              " (waiting ") and f"cluster {run.alias()}" in notice) or (
        f'queue "{queue}" does not exist' in notice), notice

    # Room for one of the two: the retry's pod goes first (its place), runs for 10 s (kwok) ...
    await run.core().delete_namespaced_pod("filler", run.namespace, grace_period_seconds=0)

    async def retry_released() -> bool:
        return released(await run.pod(pod_name))
    await eventually(retry_released, within=60, every=0.3,
                     what=lambda: f"the retry's pod released; {dag_run.told()}")
    assert not released(await run.pod(later.metadata.name)), "the later pod went first"
    # ... succeeds, and so do the task and its DAG run.
    outcome = await dag_run.line("the DAG run's outcome", within=120, outcome=ANY)
    assert outcome["outcome"] == "success", dag_run.told()
    assert [t["try"] for t in outcome["tries"]] == [1, 2], dag_run.told()
    assert outcome["tries"][-1]["state"] == "success", dag_run.told()
    await asyncio.wait_for(dag_run.process.wait(), 30)
    assert dag_run.process.returncode == 0, dag_run.told()

    # The task's pod is done (and deleted by the operator): the other client's turn.
    async def later_released() -> bool:
        return released(await run.pod(later.metadata.name))
    await eventually(later_released, within=60, every=0.3, what="the later pod released")
