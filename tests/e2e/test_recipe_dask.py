"""The Dask operator recipe (docs/integrations/dask.md) with the real clients: dask-kubernetes'
operator run with `kopf run`, as its users run it (cluster-admin, as an installed operator is),
and a user who has nothing but the coordinator kubeconfig of a lockgate ephemeral namespace,
creating and scaling a DaskCluster with dask-kubernetes' own code (tests/recipes/dask_user.py).
Both run in the recipes' clients venv, as separate processes. Every lockgate service runs as a
process on the real stack (helpers.runs).

Judged from what the apiserver shows, on a kwok node of the test's own (6 cpu, tainted; pods of
1 cpu, so the node holds 6) shared with a rival queue whose pods are as large:
- the scheduler and worker pods the operator makes are gated, carry the namespace's queue and
  job set and the DaskCluster's elastic group (minimum 1 + workers, maximum 1 + max workers);
- with room for 1 of its minimum of 2, none goes; with room for 2, both go in one round;
- scaled up by the user (what KubeCluster.scale does), the new workers go one at a time, each
  in a round of its own, only while the group is below its fair share: a slot that frees when
  it holds 3 of 6 goes to the rival;
- scaled down through the `scale` subresource (as `kubectl scale` or an autoscaler running as
  the coordinator): allowed by the coordinator's Role, and the worker group's replicas change.
  The operator then asks the Dask scheduler which worker to retire; on kwok no scheduler
  answers, so the test deletes a running worker's Deployment itself, as the operator would
  next: the room goes to the group's waiting worker (the group is below its fair share), not
  to the rival's waiting pod;
- deleting the DaskCluster removes every pod (owner references: DaskCluster -> worker group
  and Deployments -> pods).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from devstack.stack import StackInfo
from helpers.pods import a_pod
from helpers.recipes import clients_python, recipe_script
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.groups import GROUP_LABEL, GROUP_MAX_SIZE_KEY, GROUP_MIN_SIZE_KEY
from lockgate.labels import JOBSET_LABEL, QUEUE_LABEL, SCHEDULING_GATE
from lockgate_cli import root as cli

pytestmark = [pytest.mark.stack, pytest.mark.timeout(420)]

DASK_KINDS = ("daskclusters", "daskworkergroups", "daskjobs", "daskautoscalers")
NODE_CPU = 6  # pods ask 1 cpu: the node holds 6, and each queue's fair share is 3
CLUSTER = "dc"  # the DaskCluster's name (also its group's name)


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path, name="dask", env={
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "0.5"}) as running:
        yield running


def lockgate(run: LockgateRun, *argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    token_file = str(run.lockgate.write_token_files()["admin"])
    code = cli.main(["--api", run.lockgate.admin_url, "--token-file", token_file, *argv],
                    out=out, err=err)
    assert code == 0, f"lockgate {' '.join(argv)} exited {code}: {err.getvalue()}"
    return out.getvalue()


def clients(script: str, *argv: str, kubeconfig: str) -> dict[str, Any]:
    """A recipe script in the clients venv, as its own process; its JSON answer."""
    done = subprocess.run([str(clients_python()), str(recipe_script(script)), *argv],
                          env={**os.environ, "KUBECONFIG": kubeconfig}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, (f"{script} {' '.join(argv)} exited {done.returncode}:\n"
                                  f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    if script == "dask_crds.py":
        return {"crds": done.stdout.split()}
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def released(pod: client.V1Pod) -> bool:
    return SCHEDULING_GATE not in {gate.name for gate in pod.spec.scheduling_gates or ()}


class Look:
    """The pods of the Dask cluster and of the rival queue, as the apiserver shows them."""

    def __init__(self, run: LockgateRun, namespace: str) -> None:
        self.run, self.namespace = run, namespace

    async def dask(self) -> list[client.V1Pod]:
        listed = await self.run.core().list_namespaced_pod(
            self.namespace, label_selector=f"dask.org/cluster-name={CLUSTER}")
        return [p for p in listed.items if p.metadata.deletion_timestamp is None]

    async def counts(self) -> tuple[list[str], int, int, int]:
        """Released Dask pods (names), Dask pods waiting, released and waiting rival pods."""
        dask = await self.dask()
        rivals = [p for p in (await self.run.core().list_namespaced_pod(
            self.run.namespace)).items if p.metadata.deletion_timestamp is None]
        return (sorted(p.metadata.name for p in dask if released(p)),
                sum(1 for p in dask if not released(p)),
                sum(1 for p in rivals if released(p)),
                sum(1 for p in rivals if not released(p)))

    async def until(self, dask: int, dask_waiting: int, rivals: int, what: str) -> list[str]:
        async def there() -> list[str] | None:
            names, waiting, rival, _ = await self.counts()
            return names if (len(names), waiting, rival) == (dask, dask_waiting, rivals) else None

        try:
            return await eventually(there, within=90, every=0.3, what=what)
        except AssertionError as error:
            raise AssertionError(f"{error}; now {await self.counts()}\n"
                                 f"{self.run.logs(8)}") from None

    async def steady(self, dask: int, dask_waiting: int, rivals: int,
                     seconds: float = 4.0) -> None:
        """Nothing moves for a few rounds (a safety round comes every 0.5 s)."""
        for _ in range(int(seconds / 0.5)):
            names, waiting, rival, _ = await self.counts()
            assert (len(names), waiting, rival) == (dask, dask_waiting, rivals), (
                names, waiting, rival)
            await asyncio.sleep(0.5)


async def rounds_of(run: LockgateRun, namespace: str, names: list[str]) -> int:
    """In how many distinct rounds these pods were released."""
    return int(await run.pool.fetchval(
        "SELECT count(DISTINCT d.decided_at) FROM release_decisions d JOIN jobs j"
        " ON j.cluster = d.cluster AND j.uid = d.uid"
        " WHERE j.namespace = $1 AND j.name = ANY($2::text[])", namespace, names))


def deployment_of(pod: client.V1Pod) -> str:
    """A Dask worker's Deployment: the operator gives its name to the worker (DASK_WORKER_NAME)."""
    env = {e.name: e.value for e in pod.spec.containers[0].env or ()}
    return str(env["DASK_WORKER_NAME"])


async def release_finalizers(run: LockgateRun, namespace: str) -> None:
    """After a failure the operator may be gone before it removed kopf's finalizers from its
    objects; as an admin does after removing an operator, drop them so the namespace goes."""
    custom = client.CustomObjectsApi(run.apis[run.alias()])
    for kind in DASK_KINDS:
        listed = await custom.list_namespaced_custom_object("kubernetes.dask.org", "v1",
                                                            namespace, kind)
        for item in listed["items"]:
            if item["metadata"].get("finalizers"):
                await custom.patch_namespaced_custom_object(
                    "kubernetes.dask.org", "v1", namespace, kind, item["metadata"]["name"],
                    [{"op": "remove", "path": "/metadata/finalizers"}])


def start_operator(kubeconfig: str, namespace: str, log: Path) -> subprocess.Popen[bytes]:
    """dask-kubernetes' operator as its image runs it (`kopf run -m
    dask_kubernetes.operator.controller`), watching the test's namespace only; standalone:
    no peering objects (one operator)."""
    kopf = clients_python().parent / "kopf"
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(kopf), "run", "-m", "dask_kubernetes.operator.controller", "--standalone",
             "--verbose", "--namespace", namespace],
            env={**os.environ, "KUBECONFIG": kubeconfig}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


async def test_a_dask_cluster_of_the_operator_runs_as_an_elastic_group(
    run: LockgateRun, stack: StackInfo, tmp_path: Path,
) -> None:
    admin_kubeconfig = stack.kubeconfigs["cluster-a"]
    crds = (await asyncio.to_thread(clients, "dask_crds.py", kubeconfig=admin_kubeconfig))["crds"]
    assert sorted(crds) == sorted(f"{kind}.kubernetes.dask.org" for kind in DASK_KINDS)

    # A node of the test's own; both queues' pods fit only there.
    node = run.name("dask")
    await run.add_node(node, allocatable={"cpu": str(NODE_CPU), "memory": "16Gi",
                                          "pods": "110"},
                       labels={"recipe": node},
                       taints=[{"key": "recipe", "value": node, "effect": "NoSchedule"}])

    # The operator's commands from docs/integrations/dask.md.
    queue, rival, jobset = run.name("dask"), run.name("rival"), run.name("analysis")
    lockgate(run, "queue", "create", queue,
             *[arg for kind in DASK_KINDS for arg in ("--allow-kind",
                                                      f"{kind}.kubernetes.dask.org")])
    await run.create_queues([rival], namespaces=[run.namespace])
    await run.create_namespace()
    made = json.loads(lockgate(run, "namespace", "create", "--queue", queue, "--jobset", jobset,
                               "--cluster", run.alias(), "--ttl", "1h", "--kubeconfig-out",
                               str(tmp_path / "coordinator.kubeconfig"), "-o", "json"))
    namespace = made["namespace"]["name"]
    coordinator = str(tmp_path / "coordinator.kubeconfig")
    kinds = json.loads(lockgate(run, "queue", "get", queue, "-o", "json"))["allowed_kinds"]
    assert "deployments.apps" in kinds and "daskclusters.kubernetes.dask.org" in kinds, kinds

    operator = start_operator(admin_kubeconfig, namespace, tmp_path / "operator.log")
    look = Look(run, namespace)
    try:
        rival_pod = (a_pod("rival").in_queue(rival).requesting(cpu="1", memory="256Mi")
                     .tolerating(key="recipe", operator="Equal", value=node,
                                 effect="NoSchedule")
                     .with_spec(nodeSelector={"recipe": node}))
        for i in range(5):
            await run.create_pod(rival_pod.named(f"rival-{i}").manifest())
        await look.until(0, 0, 5, "the rival's 5 pods to be released")

        # The user: a DaskCluster of a scheduler and 1 worker (its group's minimum, 2), up to
        # 3 workers (its maximum, 4), as the coordinator.
        created = await asyncio.to_thread(
            clients, "dask_user.py", "create", CLUSTER, "--workers", "1", "--max-workers", "3",
            "--cpu", "1", "--node-selector", f"recipe={node}", "--toleration", f"recipe={node}",
            kubeconfig=coordinator)
        assert created["namespace"] == namespace, created

        async def both_made() -> list[client.V1Pod] | None:
            pods = await look.dask()
            return pods if len(pods) == 2 else None

        try:
            pods = await eventually(both_made, within=90, every=0.5,
                                    what="the operator to make the scheduler and 1 worker pod")
        except AssertionError as error:
            raise AssertionError(f"{error}\noperator log:\n"
                                 f"{(tmp_path / 'operator.log').read_text()[-4000:]}") from None
        components = sorted(p.metadata.labels["dask.org/component"] for p in pods)
        assert components == ["scheduler", "worker"], components
        for pod in pods:
            assert not released(pod), pod.metadata.name
            labels, annotations = pod.metadata.labels, pod.metadata.annotations or {}
            assert labels[QUEUE_LABEL] == queue and labels[JOBSET_LABEL] == jobset, labels
            assert labels[GROUP_LABEL] == CLUSTER, labels
            assert annotations[GROUP_MIN_SIZE_KEY] == "2", annotations
            assert annotations[GROUP_MAX_SIZE_KEY] == "4", annotations

        async def stored() -> bool:
            count = await run.pool.fetchval(
                "SELECT count(*) FROM jobs WHERE namespace = $1 AND queue = $2"
                " AND pod_group_size = 2 AND pod_group_max_size = 4 AND state = 'queued'",
                namespace, queue)
            return bool(count == 2)
        await eventually(stored, within=60, what="lockgate to queue both pods, min 2 max 4")
        # Room for 1 of its minimum of 2: neither goes.
        await look.steady(0, 2, 5)
        await run.core().delete_namespaced_pod("rival-0", run.namespace, grace_period_seconds=0)
        first = await look.until(2, 0, 4, "the scheduler and its worker to be released")
        assert await rounds_of(run, namespace, first) == 1, "the minimum went in several rounds"

        # Scale up to 3 workers, as KubeCluster.scale(3) does, while the rival waits too.
        for i in range(5, 7):
            await run.create_pod(rival_pod.named(f"rival-{i}").manifest())
        scaled = await asyncio.to_thread(clients, "dask_user.py", "scale", CLUSTER, "3",
                                         kubeconfig=coordinator)
        assert scaled == {"scaled": f"{CLUSTER}-default", "replicas": 3}, scaled
        await look.until(2, 2, 4, "the operator to make 2 more worker pods, gated")

        await look.steady(2, 2, 4)
        # A slot frees: the group (2 of its fair 3) is the cheaper unit and takes one worker,
        # alone, in a round of its own.
        await run.core().delete_namespaced_pod("rival-1", run.namespace, grace_period_seconds=0)
        grown = await look.until(3, 1, 3, "one more worker, released alone")
        (third,) = set(grown) - set(first)
        assert await rounds_of(run, namespace, [*first, third]) == 2
        # Another slot frees: the group holds its fair share, so the rival gets it.
        await run.core().delete_namespaced_pod("rival-2", run.namespace, grace_period_seconds=0)
        await look.until(3, 1, 3, "the rival to take the freed slot")
        await look.steady(3, 1, 3)

        # Scale down through the scale subresource, as the coordinator (kubectl scale, or an
        # autoscaler running as it): allowed by its Role, and the worker group's replicas
        # change. The operator then asks the Dask scheduler which worker to retire; on kwok no
        # scheduler answers, so no worker goes (docs/integrations/dask.md says so).
        api = await config.new_client_from_config(coordinator)
        try:
            custom = client.CustomObjectsApi(api)
            await custom.patch_namespaced_custom_object_scale(
                "kubernetes.dask.org", "v1", namespace, "daskworkergroups",
                f"{CLUSTER}-default", [{"op": "replace", "path": "/spec/replicas", "value": 2}])
            group = await custom.get_namespaced_custom_object(
                "kubernetes.dask.org", "v1", namespace, "daskworkergroups", f"{CLUSTER}-default")
            assert group["spec"]["worker"]["replicas"] == 2, group["spec"]
        finally:
            await api.close()

        # What the operator does once the scheduler named the worker to retire: delete that
        # worker's Deployment (the coordinator may delete Deployments too). The group then
        # holds 2, below its fair 3, so the freed slot goes to its waiting worker, not to the
        # rival's waiting pod: a group shrinks as its members end.
        workers = sorted((p for p in await look.dask()
                          if p.metadata.labels["dask.org/component"] == "worker"),
                         key=lambda p: (released(p), p.metadata.name))
        waiting, retired = workers[0], workers[-1]
        assert not released(waiting) and released(retired)
        await run.apps().delete_namespaced_deployment(
            deployment_of(retired), namespace, propagation_policy="Foreground")
        now = await look.until(3, 0, 3, "the waiting worker to take the retired one's slot")
        assert waiting.metadata.name in now and retired.metadata.name not in now, now

        # The user deletes the DaskCluster: owner references take everything with it.
        deleted = await asyncio.to_thread(clients, "dask_user.py", "delete", CLUSTER,
                                          kubeconfig=coordinator)
        assert deleted == {"deleted": CLUSTER}

        async def gone() -> bool:
            return not (await run.core().list_namespaced_pod(namespace)).items
        await eventually(gone, within=90, every=0.5, what="every Dask pod gone")
        custom = client.CustomObjectsApi(run.apis[run.alias()])

        async def cluster_gone() -> bool:  # once the operator has removed its finalizer
            return not (await custom.list_namespaced_custom_object(
                "kubernetes.dask.org", "v1", namespace, "daskclusters"))["items"]
        try:
            await eventually(cluster_gone, within=60, every=0.5, what="the DaskCluster gone")
        except AssertionError as error:
            raise AssertionError(f"{error}\noperator log:\n"
                                 f"{(tmp_path / 'operator.log').read_text()[-6000:]}") from None
        deployments = await run.apps().list_namespaced_deployment(namespace)
        assert not deployments.items, [d.metadata.name for d in deployments.items]
        # The job is over: cancelling its job set collects the namespace.
        lockgate(run, "jobset", "cancel", queue, jobset, "--reason", "done", "--wait", "60")

        async def collected() -> bool:
            try:
                found = await run.core().read_namespace(namespace)
            except client.ApiException as error:
                return error.status == 404
            return found.metadata.deletion_timestamp is not None
        await eventually(collected, within=60, every=0.5, what=f"namespace {namespace} deleted")
    finally:
        stop(operator)
        try:
            await release_finalizers(run, namespace)
            await run.core().delete_namespace(namespace, propagation_policy="Background")
        except client.ApiException as error:
            if error.status != 404:  # gone already: collected by the cancel
                raise
