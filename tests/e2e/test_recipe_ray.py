"""The Ray recipe (docs/integrations/ray.md) on the real stack: KubeRay's operator makes a
RayCluster's head and workers directly, in an ephemeral namespace; lockgate gates them and
releases the head and `minReplicas` workers as one elastic group, then further workers one at
a time as room allows, and the group shrinks when workers are removed.

What runs: every lockgate service as a process (helpers.runs), KubeRay's real ray-operator
(v1.5.0, built from the Go module proxy and cached: devstack.kuberay) as a process against
cluster-a's apiserver, kube-scheduler and kwok. The test has a kwok node of its own (4 cpu,
tainted and labelled for it) that its pods select and tolerate, so other tests on the shared
stack never take its room. The RayCluster is created, scaled and deleted with the coordinator's
kubeconfig of the ephemeral namespace only (not as an admin), as a Ray user or Ray's autoscaler
would; everything is judged from what the apiserver shows (and, for "one round", lockgate's
recorded release decisions).

What it cannot show: kwok runs no processes, so no Ray head answers, no worker joins the Ray
cluster, and no real Ray autoscaler runs: the test patches `replicas` and
`scaleStrategy.workersToDelete` as the autoscaler does (enableInTreeAutoscaling is false, so
KubeRay itself runs no autoscaler sidecar). Whether Ray tolerates a head that waits in a queue
(its timeouts) is for docs/integrations/ray.md, not this test.
"""

from __future__ import annotations

import asyncio
import io
import json
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.kuberay import CRDS, KUBERAY_VERSION, OPERATOR, kuberay_dir, kuberay_ready
from devstack.ports import free_port
from devstack.stack import StackInfo
from helpers.network import answers_ok
from helpers.pods import KWOK_NODE_ANNOTATION, a_pod
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.groups import GROUP_LABEL, GROUP_MAX_SIZE_KEY, GROUP_MIN_SIZE_KEY
from lockgate.labels import JOBSET_LABEL, LABEL_SOURCE_ANNOTATION, QUEUE_LABEL, SCHEDULING_GATE
from lockgate.namespace_access import DEFAULT_ALLOWED_KINDS
from lockgate_cli import root as cli

pytestmark = [pytest.mark.stack, pytest.mark.timeout(420)]

RAY_GROUP, RAY_VERSION, PLURAL = "ray.io", "v1", "rayclusters"
CLUSTER = "raycluster"  # the RayCluster's name
JOBSET = "ray-train-1"
MIN_WORKERS, MAX_WORKERS = 2, 5
KWOK_TOLERATION = {"key": KWOK_NODE_ANNOTATION, "operator": "Exists"}  # as a_pod's


@dataclass
class Ray:
    run: LockgateRun
    queue: str
    rival: str
    namespace: str  # the ephemeral namespace
    coordinator: client.ApiClient  # its coordinator's kubeconfig, nothing else
    node: str
    operator_log: Path

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.coordinator)


def lockgate(run: LockgateRun, token_file: str, *argv: str) -> str:
    """The `lockgate` command in-process against this run's admin API; its stdout."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--api", run.lockgate.admin_url, "--token-file", token_file, *argv],
                    out=out, err=err)
    assert code == 0, f"lockgate {' '.join(argv)} exited {code}: {err.getvalue()}"
    return out.getvalue()


async def install_crds(admin: client.ApiClient, home: Path) -> None:
    """KubeRay's CRDs, if missing (cluster-wide, shared with other runs: never deleted)."""
    extensions = client.ApiextensionsV1Api(admin)
    for crd_file in CRDS:
        crd = yaml.safe_load((home / crd_file).read_text())
        name = crd["metadata"]["name"]
        try:
            await extensions.create_custom_resource_definition(crd)
        except ApiException as error:
            if error.status != 409:
                raise

        async def established(name: str = name) -> bool:
            found = await extensions.read_custom_resource_definition(name)
            return any(c.type == "Established" and c.status == "True"
                       for c in found.status.conditions or ())
        await eventually(established, within=30, every=0.2, what=f"CRD {name} established")


@pytest.fixture
def operator_home() -> Path:
    """The cached KubeRay build. `make test` builds it before the stack tests; a cold build
    (about 9 minutes on 2 cores) would not fit this test's time limit, so a missing one fails
    at once, saying how to build it (never a skip)."""
    home = kuberay_dir()
    if not kuberay_ready(home):
        pytest.fail(f"KubeRay {KUBERAY_VERSION} is not built in {home}: run "
                    "`.venv/bin/python -m devstack.kuberay` (make test does) and run the test "
                    "again")
    return home


class Operator:
    """KubeRay's operator as a process of the test's own, watching one namespace; its servers
    bind to loopback only."""

    def __init__(self, home: Path, kubeconfig: str, namespace: str, log: Path) -> None:
        self.probe_port = free_port()
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(home / OPERATOR), "--kubeconfig", kubeconfig,
                 "--enable-leader-election=false", "--metrics-addr", "127.0.0.1:0",
                 "--health-probe-bind-address", f"127.0.0.1:{self.probe_port}",
                 "--watch-namespace", namespace, "--log-stdout-encoder", "console"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    async def until_ready(self) -> None:
        async def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"KubeRay's operator exited ({self.process.returncode}); "
                                     f"log {self.log}:\n{self.tail()}")
            return await answers_ok(f"http://127.0.0.1:{self.probe_port}/readyz")
        await eventually(ready, within=60, every=0.5, what="KubeRay's operator ready")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture
async def run(stack: StackInfo, tmp_path: Path) -> AsyncIterator[LockgateRun]:
    async with lockgate_run(stack, tmp_path, name="ray", standby_scheduler=False, env={
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "0.5"}) as running:
        yield running


def template(node: str, kind: str) -> dict[str, Any]:
    """A pod template of the RayCluster: the recipe's group label and annotations (min = 1 +
    minReplicas, max = 1 + maxReplicas), and the test's own node."""
    return {
        "metadata": {"labels": {GROUP_LABEL: CLUSTER},
                     "annotations": {GROUP_MIN_SIZE_KEY: str(1 + MIN_WORKERS),
                                     GROUP_MAX_SIZE_KEY: str(1 + MAX_WORKERS)}},
        "spec": {
            "containers": [{"name": f"ray-{kind}", "image": "rayproject/ray:2.41.0",
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                          "limits": {"cpu": "1", "memory": "1Gi"}}}],
            "tolerations": [KWOK_TOLERATION, {"key": "ray", "operator": "Equal", "value": node,
                                              "effect": "NoSchedule"}],
            "nodeSelector": {"ray": node},
        },
    }


def ray_cluster(node: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{RAY_GROUP}/{RAY_VERSION}", "kind": "RayCluster",
        "metadata": {"name": CLUSTER},
        "spec": {
            "rayVersion": "2.41.0",
            "enableInTreeAutoscaling": False,
            "headGroupSpec": {"rayStartParams": {}, "template": template(node, "head")},
            "workerGroupSpecs": [{
                "groupName": "workers", "replicas": MIN_WORKERS, "minReplicas": MIN_WORKERS,
                "maxReplicas": MAX_WORKERS, "rayStartParams": {},
                "template": template(node, "worker")}],
        },
    }


def released(pod: client.V1Pod) -> bool:
    return SCHEDULING_GATE not in {gate.name for gate in pod.spec.scheduling_gates or ()}


async def ray_pods(ray: Ray) -> list[client.V1Pod]:
    """The RayCluster's live pods, head first, then workers by creation."""
    listed = (await ray.run.core().list_namespaced_pod(
        ray.namespace, label_selector=f"ray.io/cluster={CLUSTER}")).items
    live = [p for p in listed if p.metadata.deletion_timestamp is None]
    return sorted(live, key=lambda p: (p.metadata.labels.get("ray.io/node-type") != "head",
                                       p.metadata.creation_timestamp, p.metadata.name))


async def until_pods(ray: Ray, count: int, released_count: int, what: str
                     ) -> list[client.V1Pod]:
    async def there() -> list[client.V1Pod] | None:
        pods = await ray_pods(ray)
        done = len(pods) == count and sum(map(released, pods)) == released_count
        return pods if done else None
    pods: list[client.V1Pod] = await eventually(there, within=90, every=0.2, what=lambda: (
        f"{what}; operator log:\n{ray.operator_log.read_text(errors='replace')[-3000:]}"))
    return pods


async def steady(ray: Ray, count: int, released_count: int, seconds: float = 4.0) -> None:
    """Nothing moves for several scheduler rounds (a safety round every 0.5 s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pods = await ray_pods(ray)
        assert (len(pods), sum(map(released, pods))) == (count, released_count), [
            (p.metadata.name, released(p)) for p in pods]
        await asyncio.sleep(0.3)


async def rounds_of(ray: Ray, names: list[str]) -> int:
    """In how many distinct scheduler rounds these pods were released."""
    return int(await ray.run.pool.fetchval(
        "SELECT count(DISTINCT d.decided_at) FROM release_decisions d JOIN jobs j"
        " ON j.cluster = d.cluster AND j.uid = d.uid"
        " WHERE j.namespace = $1 AND j.name = ANY($2::text[])", ray.namespace, names))


async def until_stored_members(ray: Ray, names: list[str], what: str) -> None:
    """lockgate holds these pods as members of the group (named per namespace), min 3 max 6."""
    seen: list[Any] = []

    async def stored() -> bool:
        rows = await ray.run.pool.fetch(
            "SELECT name, pod_group, pod_group_size, pod_group_max_size FROM jobs"
            " WHERE cluster = $1 AND namespace = $2 AND name = ANY($3::text[])",
            ray.run.alias(), ray.namespace, names)
        seen[:] = [dict(row) for row in rows]
        return len(rows) == len(names) and all(
            (row["pod_group"], row["pod_group_size"], row["pod_group_max_size"]) == (
                f"{ray.namespace}/{CLUSTER}", 1 + MIN_WORKERS, 1 + MAX_WORKERS) for row in rows)
    await eventually(stored, within=60, every=0.2, what=lambda: f"{what}; stored: {seen}")


async def scale(ray: Ray, replicas: int, workers_to_delete: list[str] | None = None) -> None:
    """As Ray's autoscaler scales a worker group: a JSON patch of `replicas` (and, scaling
    down, `scaleStrategy.workersToDelete`), as the coordinator."""
    patch: list[dict[str, Any]] = [
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": replicas}]
    if workers_to_delete is not None:
        patch.append({"op": "add", "path": "/spec/workerGroupSpecs/0/scaleStrategy",
                      "value": {"workersToDelete": workers_to_delete}})
    await ray.custom.patch_namespaced_custom_object(
        RAY_GROUP, RAY_VERSION, ray.namespace, PLURAL, CLUSTER, patch,
        _content_type="application/json-patch+json")


async def until_bound_in_webhook(run: LockgateRun, queue: str, namespace: str) -> None:
    """The webhook's copy of the queue binds the new ephemeral namespace (else its pods would
    be refused, and KubeRay would retry them with a growing back-off)."""
    url = f"http://127.0.0.1:{run.lockgate.ports.webhook_health}/api/v1/queues"

    async def bound() -> bool:
        async with aiohttp.ClientSession() as session, session.get(url) as reply:
            seen = await reply.json()
        return namespace in json.dumps((seen.get(run.alias()) or {}).get(queue))
    await eventually(bound, within=60, every=0.2,
                     what=f"the webhook's queue {queue} to bind namespace {namespace}")


@pytest.fixture
async def ray(run: LockgateRun, operator_home: Path, stack: StackInfo,
              tmp_path: Path) -> AsyncIterator[Ray]:
    queue, rival = run.name("ray"), run.name("rival")
    token_file = str(run.lockgate.write_token_files()["admin"])
    # The recipe: the queue may also create RayClusters in its namespaces.
    lockgate(run, token_file, "queue", "create", queue, "--allow-kind",
             f"{PLURAL}.{RAY_GROUP}")
    described = json.loads(lockgate(run, token_file, "queue", "get", queue, "-o", "json"))
    assert sorted(described["allowed_kinds"]) == sorted(
        [*DEFAULT_ALLOWED_KINDS, f"{PLURAL}.{RAY_GROUP}"]), described
    await run.create_queue(rival, namespaces=[run.namespace])
    await run.create_namespace()
    node = run.name("ray")
    await run.add_node(node, allocatable={"cpu": "4", "memory": "16Gi", "pods": "110"},
                       labels={"ray": node},
                       taints=[{"key": "ray", "value": node, "effect": "NoSchedule"}])
    await install_crds(run.apis[run.alias()], operator_home)
    created = json.loads(lockgate(
        run, token_file, "namespace", "create", "--queue", queue, "--jobset", JOBSET,
        "--cluster", run.alias(), "--ttl", "1h", "--kubeconfig-out",
        str(tmp_path / "coordinator.kubeconfig"), "-o", "json"))
    namespace = created["namespace"]["name"]
    coordinator = await config.new_client_from_config_dict(
        yaml.safe_load((tmp_path / "coordinator.kubeconfig").read_text()))
    operator = Operator(operator_home, stack.kubeconfigs["cluster-a"], namespace,
                        tmp_path / "ray-operator.log")
    try:
        await until_bound_in_webhook(run, queue, namespace)
        await operator.until_ready()
        yield Ray(run, queue, rival, namespace, coordinator, node, operator.log)
    finally:
        operator.stop()
        await coordinator.close()
        # The run deletes only the namespaces it made itself; pods first (they hold the node).
        with_pods = await run.core().list_namespaced_pod(namespace)
        for pod in with_pods.items:
            await _gone(run.core().delete_namespaced_pod(pod.metadata.name, namespace,
                                                         grace_period_seconds=0))
        await _gone(run.core().delete_namespace(namespace, propagation_policy="Background"))


async def _gone(call: Any) -> None:
    try:
        await call
    except ApiException as error:
        if error.status != 404:
            raise


async def test_a_ray_cluster_goes_as_one_elastic_group_and_grows_one_worker_at_a_time(
    ray: Ray,
) -> None:
    run = ray.run
    # A filler of a competing queue holds 2 of the node's 4 cpu: room for 2 of the 3 pods of
    # the group's minimum (head and 2 workers, 1 cpu each).
    filler = (a_pod("filler").in_queue(ray.rival).tolerating_kwok_nodes()
              .tolerating(key="ray", operator="Equal", value=ray.node, effect="NoSchedule")
              .with_spec(nodeSelector={"ray": ray.node}).requesting(cpu="2", memory="64Mi"))
    await run.create_pod(filler.manifest())

    async def filler_released() -> bool:
        pod = await run.pod("filler")
        return pod is not None and released(pod)
    await eventually(filler_released, within=60, every=0.2, what="the filler released")

    # The coordinator (its kubeconfig only) creates the RayCluster; KubeRay makes the pods.
    await ray.custom.create_namespaced_custom_object(
        RAY_GROUP, RAY_VERSION, ray.namespace, PLURAL, ray_cluster(ray.node))
    pods = await until_pods(ray, 3, 0, "KubeRay to create the head and 2 workers, all gated")
    head, *workers = pods
    assert head.metadata.labels["ray.io/node-type"] == "head"
    for pod in pods:
        # Gated at admission, with the ephemeral namespace's queue and job set: the webhook
        # may not read the RayCluster owner, so both come from the namespace.
        assert pod.metadata.labels[QUEUE_LABEL] == ray.queue, pod.metadata.labels
        assert pod.metadata.labels[JOBSET_LABEL] == JOBSET, pod.metadata.labels
        assert pod.metadata.labels[GROUP_LABEL] == CLUSTER
        assert pod.metadata.annotations[GROUP_MIN_SIZE_KEY] == "3"
        assert pod.metadata.annotations[GROUP_MAX_SIZE_KEY] == "6"
        source = json.loads(pod.metadata.annotations[LABEL_SOURCE_ANNOTATION])
        assert source == {"queue": f"namespace/{ray.namespace}",
                          "jobset": f"namespace/{ray.namespace}"}, source
        assert pod.metadata.owner_references[0].kind == "RayCluster"
    names = [p.metadata.name for p in pods]
    await until_stored_members(ray, names, "lockgate to store head and workers as one group")
    # Said once in the webhook's log, with the rule to grant (docs/admission.md).
    webhook_log = run.lockgate.processes["admission-webhook"].log_path

    async def said() -> bool:
        return "may not read RayCluster objects" in webhook_log.read_text(errors="replace")
    await eventually(said, within=30, every=0.5, what="the webhook to say it may not read "
                     "RayCluster owners")
    # Room for 2 of 3: none goes.
    await steady(ray, 3, 0)

    # Room for all 3: they go together, in one round.
    await run.core().delete_namespaced_pod("filler", run.namespace, grace_period_seconds=0)
    pods = await until_pods(ray, 3, 3, "the head and 2 workers released together")
    assert await rounds_of(ray, names) == 1, "the group's minimum went over several rounds"

    # Ray's autoscaler asks for 2 more workers: they join the group; room for one (1 cpu free).
    await scale(ray, 4)
    pods = await until_pods(ray, 5, 4, "2 more workers, one of them released")
    added = [p.metadata.name for p in pods if p.metadata.name not in names]
    assert len(added) == 2, added
    await until_stored_members(ray, [*names, *added], "the 2 new workers stored in the group")
    await steady(ray, 5, 4)
    (first_added,) = [p.metadata.name for p in pods if p.metadata.name in added and released(p)]
    (waiting,) = [p.metadata.name for p in pods if not released(p)]
    assert await rounds_of(ray, [*names, first_added]) == 2, "the 4th went with the minimum?"

    # The autoscaler removes an idle worker of the first ones: KubeRay deletes it, and the
    # waiting worker takes its room, alone.
    gone = workers[0].metadata.name
    await scale(ray, 3, [gone])
    pods = await until_pods(ray, 4, 4, f"{gone} deleted and {waiting} released")
    assert gone not in {p.metadata.name for p in pods}
    assert await rounds_of(ray, [head.metadata.name, workers[1].metadata.name, first_added,
                                 waiting]) == 3

    # Back to minReplicas, naming the worker that waited: the group shrinks to head + 2.
    await scale(ray, MIN_WORKERS, [waiting])
    pods = await until_pods(ray, 3, 3, "the group back to the head and 2 workers")
    assert {p.metadata.name for p in pods} == {head.metadata.name, workers[1].metadata.name,
                                               first_added}

    async def ended_in_lockgate() -> bool:
        count = await run.pool.fetchval(
            "SELECT count(*) FROM jobs WHERE cluster = $1 AND namespace = $2"
            " AND name = ANY($3::text[]) AND state = 'deleted'", run.alias(), ray.namespace,
            [gone, waiting])
        return bool(count == 2)
    await eventually(ended_in_lockgate, within=60, every=0.2,
                     what="the 2 removed workers recorded as deleted")

    # Deleting the RayCluster removes its pods.
    await ray.custom.delete_namespaced_custom_object(RAY_GROUP, RAY_VERSION, ray.namespace,
                                                     PLURAL, CLUSTER)
    await until_pods(ray, 0, 0, "the RayCluster's pods gone")
