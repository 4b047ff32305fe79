"""The JupyterHub recipe (docs/integrations/jupyterhub.md) with the real client: KubeSpawner 7,
driven outside a hub as kubespawner's own tests drive it and timed as JupyterHub's User.spawn
times it (tests/recipes/kubespawner_spawn.py, in the recipes' clients venv, as a process of its
own), with the kubeconfig of a non-admin identity: a `hub` ServiceAccount holding Zero to
JupyterHub's hub Role in the notebook namespace. Every lockgate service runs as a process on
the real stack (helpers.runs).

The namespace is bound to a queue; the test has a kwok node of its own (3 cpu, tainted), held
by a filler pod of the same queue, so the spawner's 2-cpu pods wait:
- alice's spawn waits longer than its start_timeout (30 s) and fails; meanwhile its progress
  (what the spawn page shows) carried lockgate's Events: queued at once, still waiting at 15 s;
  `stop()` deleted the gated pod;
- bob's spawn comes meanwhile, after alice's, and waits;
- alice's retried spawn creates her pod again: it keeps her place (its first Event says so);
- when the filler ends, alice's retried pod is released before bob's (her place) and her spawn
  succeeds; when she stops, bob's goes.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.pods import a_pod
from helpers.recipes import clients_python, recipe_script
from helpers.runs import LockgateRun, first_notice, lockgate_run
from helpers.waiting import eventually
from lockgate.labels import QUEUE_LABEL, SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(420)]

START_TIMEOUT = 30  # s: past lockgate's Events at 0 s and 15 s, with room for a loaded machine
HUB_ROLE = [  # Zero to JupyterHub's hub Role (its chart's hub/rbac.yaml)
    {"apiGroups": [""], "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
     "verbs": ["get", "watch", "list", "create", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
]


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path, name="jhub", env={
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "0.5",
            "LOCKGATE_SCHEDULER_WAIT_NOTICE_CHECK_SECONDS": "0.5"}) as running:
        yield running


class Spawns:
    """Spawns (tests/recipes/kubespawner_spawn.py), each a process of its own in the clients
    venv; any still running at the end is killed (a spawn waiting for a gated pod would wait
    out its start_timeout)."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.running: list[asyncio.subprocess.Process] = []

    async def start(self, *argv: str) -> asyncio.Task[dict[str, Any]]:
        process = await asyncio.create_subprocess_exec(
            str(clients_python()), str(recipe_script("kubespawner_spawn.py")), *argv,
            env={**os.environ, "KUBECONFIG": self.kubeconfig},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self.running.append(process)
        return asyncio.create_task(self._answer(process, argv))

    @staticmethod
    async def _answer(process: asyncio.subprocess.Process,
                      argv: tuple[str, ...]) -> dict[str, Any]:
        out, err = await process.communicate()
        assert process.returncode == 0, (
            f"kubespawner_spawn.py {' '.join(argv)} exited {process.returncode}:\n"
            f"{out.decode()[-2000:]}\n{err.decode()[-4000:]}")
        answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        return answer

    async def close(self) -> None:
        for process in self.running:
            if process.returncode is None:
                process.kill()
                await process.wait()


def released(pod: client.V1Pod | None) -> bool:
    return pod is not None and SCHEDULING_GATE not in {
        gate.name for gate in pod.spec.scheduling_gates or ()}


async def queued(run: LockgateRun, name: str) -> client.V1Pod:
    """The pod, once lockgate has it queued."""
    async def found() -> client.V1Pod | None:
        pod = await run.pod(name)
        if pod is None or pod.metadata.deletion_timestamp is not None:
            return None
        row = await run.job(pod.metadata.uid)
        return pod if row is not None and row["state"] == "queued" else None

    return await eventually(found, within=60, every=0.3, what=f"{name} queued by lockgate")


async def test_a_spawn_that_times_out_keeps_its_place_when_retried(
    run: LockgateRun, stack: StackInfo, tmp_path: Path,
) -> None:
    queue = run.name("research")
    # The docs' binding: the notebook namespace may use the queue, and its pods name it.
    await run.create_queues([queue], namespaces=[run.namespace])
    await run.create_namespace()
    kubeconfig = await run.identity_kubeconfig("hub", HUB_ROLE, tmp_path / "hub.kubeconfig")
    node = run.name("jhub")
    await run.add_node(node, allocatable={"cpu": "3", "memory": "8Gi", "pods": "110"},
                       labels={"recipe": node},
                       taints=[{"key": "recipe", "value": node, "effect": "NoSchedule"}])
    where = ["--namespace", run.namespace, "--queue", queue, "--cpu", "2",
             "--node-selector", f"recipe={node}", "--toleration", f"recipe={node}"]

    # The cluster is full for the spawner's pods: a filler of the same queue holds the node.
    filler = await run.create_pod(
        a_pod("filler").in_queue(queue).requesting(cpu="3", memory="64Mi")
        .tolerating(key="recipe", operator="Equal", value=node, effect="NoSchedule")
        .with_spec(nodeSelector={"recipe": node}).manifest())

    async def filler_released() -> bool:
        return released(await run.pod(filler.metadata.name))
    await eventually(filler_released, within=60, every=0.3, what="the filler released")

    spawns = Spawns(kubeconfig)
    try:
        await spawned(run, spawns, queue, where)
    finally:
        await spawns.close()


async def spawned(run: LockgateRun, spawns: Spawns, queue: str, where: list[str]) -> None:
    first = await spawns.start("--user", "alice", "--start-timeout", str(START_TIMEOUT), *where)
    original = await queued(run, "jupyter-alice")
    assert original.metadata.labels[QUEUE_LABEL] == queue
    await asyncio.sleep(1.1)  # creation times are whole seconds: bob's is later
    bob = await spawns.start("--user", "bob", "--start-timeout", "240", *where)
    await queued(run, "jupyter-bob")

    failed = await first
    assert failed["outcome"] == "timeout" and failed["pod"] == "jupyter-alice", failed
    # KubeSpawner's wait for the pod (jupyterhub.utils.exponential_backoff) moves its deadline
    # by a random jitter of up to 10% of start_timeout either way: a timeout may come at 27 s.
    assert failed["seconds"] >= START_TIMEOUT * 0.9 - 0.5, failed
    # lockgate's Events reached the spawn page: queued at once, and still waiting at 15 s.
    # (Other runs on the shared stack do not take this pod: each run's watcher reads only its
    # own run's namespaces, LOCKGATE_WATCHER_NAMESPACE_LABELS. The checks below stay specific
    # anyway: the 15 s Event has a reason and names this run's cluster.)
    progress = failed["progress"]
    shown = "\n".join(progress)
    assert any(line.startswith("LockgateQueued: ") and f'queue "{queue}", position 1'
               in line for line in progress), shown
    assert any(line.startswith("LockgateWaiting") and "still waiting: " in line
               and f'queue "{queue}", position 1' in line and f"cluster {run.alias()}" in line
               for line in progress), shown
    assert await run.pod("jupyter-alice") is None, "stop() left the gated pod"
    row = await run.job(original.metadata.uid)
    assert row is not None and row["state"] == "deleted", row

    # The user clicks "start" again: the spawn creates the pod again, and it keeps its place.
    retry = await spawns.start("--user", "alice", "--start-timeout", "240", *where)
    again = await queued(run, "jupyter-alice")
    assert again.metadata.uid != original.metadata.uid
    row = await run.job(again.metadata.uid)
    assert row is not None and row["kept_place_of"] == "jupyter-alice", row
    # Its first Event says so (`kubectl describe pod`; the spawn page lists the pod's Events),
    # unless another test's lockgate run, which does not know this queue, wrote it first (see
    # above); lockgate's row, just checked, is this run's own answer.
    notice = await first_notice(run, again.metadata.uid)
    assert (notice.startswith('queued: it kept the place in line of deleted pod "jupyter-alice"'
                              " (waiting ") and f"cluster {run.alias()}" in notice) or (
        f'queue "{queue}" does not exist' in notice), notice

    # Room for one of the two: alice's retried pod goes first, and her spawn succeeds.
    await run.core().delete_namespaced_pod("filler", run.namespace, grace_period_seconds=0)
    started = await retry
    assert started["outcome"] == "started", started
    assert released(await run.pod("jupyter-alice"))
    assert not released(await run.pod("jupyter-bob")), "bob's later pod went first"
    # alice stops her server: bob's turn.
    await run.core().delete_namespaced_pod("jupyter-alice", run.namespace,
                                           grace_period_seconds=0)
    bobs = await bob
    assert bobs["outcome"] == "started" and bobs["pod"] == "jupyter-bob", bobs
