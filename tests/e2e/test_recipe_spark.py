"""The Spark recipe (docs/integrations/spark.md) with the real client: a pyspark driver in client
mode, in the recipes' clients venv, run as the non-admin coordinator of an ephemeral namespace
made with lockgate's CLI; its executors are gated, grouped and released by lockgate, judged from
what the apiserver shows.

- static allocation (spark.executor.instances=3, `group-size` 3): with a rival queue holding the
  room, none of the 3 executors goes while only 2 fit; once 3 fit, all 3 go in one round;
  stopping the session deletes them;
- dynamic allocation (minExecutors 2, maxExecutors 4): its first 2 go together in one round; the
  executors Spark asks for once a job's tasks are pending join the same group and queue, and go
  one at a time, in rounds of their own, only while fair share allows: a slot that frees while
  the rival queue holds nothing and waits goes to the rival;
- cluster mode (the real spark-submit): the driver pod is gated as a pod of the queue, out of
  the executors' group, and released alone.

What kwok cannot show: it runs no process, so no executor registers with the driver and no task
runs. Spark sees its executor pods Running but never connected; the test judges admission,
grouping, release and deletion, never Spark's work.

Each test has a kwok node of its own (4 cpu, tainted and labelled for it; executors of 1 cpu
select and tolerate it through spark.kubernetes.executor.podTemplateFile), so what fits is
known whatever other tests run on the stack. Isolation as in every end-to-end test
(helpers.runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client

from devstack.stack import StackInfo
from helpers.pods import KWOK_NODE_ANNOTATION, PodBuilder, a_pod
from helpers.recipes import clients_python, recipe_script
from helpers.runs import LockgateRun, lockgate_run
from helpers.waiting import eventually
from lockgate.groups import GROUP_LABEL
from lockgate.labels import JOBSET_LABEL, QUEUE_LABEL, SCHEDULING_GATE
from lockgate_cli import root as cli

pytestmark = [pytest.mark.stack, pytest.mark.timeout(420)]

NODE_CPU = 4  # executors and rival pods ask 1 cpu each
SESSION_SECONDS = 180  # a JVM and a SparkSession on a busy 2-core machine
SPARK_KINDS = [arg for kind in ("pods", "services", "configmaps", "persistentvolumeclaims",
                                 "networkpolicies.networking.k8s.io")
               for arg in ("--only-kind", kind)]


@pytest.fixture(scope="module")
async def run(stack: StackInfo,
              tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LockgateRun]:
    if "namespace-keeper" not in stack.identity_kubeconfigs:
        pytest.fail("the stack has no namespace-keeper identity, so no ephemeral namespace: "
                    "run `python -m devstack up` again to apply k8s/base")
    async with lockgate_run(stack, tmp_path_factory.mktemp("runs"), name="spark",
                            standby_scheduler=False, env={
            "LOCKGATE_SCHEDULER_SAFETY_ROUND_SECONDS": "0.5"}) as running:
        await running.create_namespace()  # the rival queues' ordinary namespace
        yield running


@dataclass
class Spark:
    """One test's setting: its node, queues, the coordinator's namespace and kubeconfig."""

    run: LockgateRun
    queue: str
    rival: str
    namespace: str  # the ephemeral one
    jobset: str
    kubeconfig: Path
    template: Path
    rival_pod: PodBuilder

    async def executors(self, app: str) -> list[client.V1Pod]:
        listed = await self.run.core().list_namespaced_pod(
            self.namespace, label_selector=f"spark-role=executor,{GROUP_LABEL}={app}")
        return sorted((p for p in listed.items if p.metadata.deletion_timestamp is None),
                      key=lambda p: p.metadata.name)

    async def released(self, app: str) -> tuple[list[str], list[str]]:
        """The executors released and those still gated."""
        pods = await self.executors(app)
        return ([p.metadata.name for p in pods if released(p)],
                [p.metadata.name for p in pods if not released(p)])

    async def until(self, app: str, *, released_: int, gated: int, what: str) -> list[str]:
        async def there() -> list[str] | None:
            out, waiting = await self.released(app)
            return out if (len(out), len(waiting)) == (released_, gated) else None
        return await eventually(there, within=90, every=0.2, what=what)

    async def steady(self, app: str, *, released_: int, gated: int,
                     seconds: float = 4.0) -> None:
        """Nothing moves for several rounds (a safety round every 0.5 s)."""
        for _ in range(int(seconds / 0.5)):
            out, waiting = await self.released(app)
            assert (len(out), len(waiting)) == (released_, gated), (out, waiting)
            await asyncio.sleep(0.5)

    async def rival_released(self, name: str) -> bool:
        pod = await self.run.pod(name)
        return pod is not None and released(pod)

    async def start_rival(self, name: str) -> None:
        await self.run.create_pod(self.rival_pod.named(name).manifest())

    async def rivals_hold(self, prefix: str, count: int) -> None:
        """`count` rival pods, each released (on the node: 1 cpu each) before this returns."""
        for i in range(count):
            await self.start_rival(f"{prefix}-{i}")
        for i in range(count):
            await eventually(lambda i=i: self.rival_released(f"{prefix}-{i}"), within=60,
                             what=f"rival pod {prefix}-{i} released")

    async def delete_rival(self, name: str) -> None:
        await self.run.core().delete_namespaced_pod(name, self.run.namespace,
                                                    grace_period_seconds=0)


def released(pod: client.V1Pod) -> bool:
    return SCHEDULING_GATE not in {gate.name for gate in pod.spec.scheduling_gates or ()}


async def cli_ok(run: LockgateRun, *argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    token_file = run.lockgate.write_token_files()["admin"]
    code = await asyncio.to_thread(cli.main, ["--api", run.lockgate.admin_url, "--token-file",
                                              str(token_file), *argv], out=out, err=err)
    assert code == 0, f"lockgate {' '.join(argv)}: {err.getvalue()}"
    return out.getvalue()


async def webhook_binds(run: LockgateRun, queue: str, namespace: str) -> bool:
    """Whether the webhook's copy of `queue` binds the ephemeral namespace by name."""
    url = f"http://127.0.0.1:{run.lockgate.ports.webhook_health}/api/v1/queues"
    async with aiohttp.ClientSession() as session, session.get(url) as reply:
        seen = await reply.json()
    copy = (seen.get(run.alias()) or {}).get(queue) or {}
    return any(namespace in (b.get("names") or []) for b in copy.get("namespaces") or [])


async def setting(run: LockgateRun, tmp_path: Path, test: str) -> Spark:
    """As an operator does it (docs/integrations/spark.md): a queue for Spark, an ephemeral
    namespace and the coordinator's kubeconfig; plus the test's node and a rival queue."""
    node = run.name(test)
    await run.add_node(node, allocatable={"cpu": str(NODE_CPU), "memory": "16Gi",
                                          "pods": "110"},
                       labels={"spark-recipe": node},
                       taints=[{"key": "spark-recipe", "value": node, "effect": "NoSchedule"}])
    tolerations = [{"key": KWOK_NODE_ANNOTATION, "operator": "Exists"},
                   {"key": "spark-recipe", "operator": "Equal", "value": node,
                    "effect": "NoSchedule"}]
    queue, rival = run.name(f"{test}-spark"), run.name(f"{test}-rival")
    # What Spark creates and deletes (the recipe's list): executor pods, their ConfigMap; on
    # stop, the app's PersistentVolumeClaims (refused without it); in cluster mode the driver's
    # Service and NetworkPolicy.
    await cli_ok(run, "queue", "create", queue, *SPARK_KINDS)
    await run.create_queues([rival], namespaces=[run.namespace])
    jobset = f"{test}-{uuid.uuid4().hex[:4]}"
    kubeconfig = tmp_path / "coordinator.kubeconfig"
    out = await cli_ok(run, "namespace", "create", "--queue", queue, "--jobset", jobset,
                       "--cluster", run.alias(), "--ttl", "1h",
                       "--kubeconfig-out", str(kubeconfig))
    assert "kubeconfig for the coordinator written to" in out, out
    namespace = yaml.safe_load(kubeconfig.read_text())["contexts"][0]["context"]["namespace"]
    run.namespaces.created.append((run.alias(), namespace))  # its pods go with the run
    await eventually(lambda: webhook_binds(run, queue, namespace), within=30,
                     what=f"the webhook's copy of {queue} binding {namespace}")
    template = tmp_path / "executor-template.yaml"
    template.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "spec": {
        "nodeSelector": {"spark-recipe": node}, "tolerations": tolerations}}))
    rival_pod = (a_pod("rival").in_queue(rival).requesting(cpu="1", memory="512Mi")
                 .tolerating_kwok_nodes()
                 .tolerating(key="spark-recipe", operator="Equal", value=node,
                             effect="NoSchedule")
                 .with_spec(nodeSelector={"spark-recipe": node}))
    return Spark(run, queue, rival, namespace, jobset, kubeconfig, template, rival_pod)


class Driver:
    """The recipe's script: a pyspark driver in client mode, as the coordinator."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    async def line(self, starting: str, within: float) -> str:
        assert self.process.stdout is not None
        async with asyncio.timeout(within):
            while True:
                raw = await self.process.stdout.readline()
                if not raw:
                    raise AssertionError(f"the Spark driver exited ({self.process.returncode}) "
                                         f"before printing {starting!r}:\n{self.tail()}")
                if raw.decode().startswith(starting):
                    return raw.decode().strip()

    async def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{command}\n".encode())
        await self.process.stdin.drain()

    async def stop(self) -> None:
        """Close stdin: the script stops its SparkSession, which deletes the executors."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.line("stopped", within=120)
        assert await asyncio.wait_for(self.process.wait(), 60) == 0, self.tail()
        # Everything Spark asked of the apiserver as the coordinator was allowed.
        assert "forbidden" not in self.log.read_text(errors="replace"), self.tail()


@contextlib.asynccontextmanager
async def spark_driver(spark: Spark, app: str, tmp_path: Path,
                       *mode: str) -> AsyncIterator[Driver]:
    log = tmp_path / f"{app}-driver.log"
    env = {**os.environ, "KUBECONFIG": str(spark.kubeconfig), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYTHONPATH", None)  # the clients venv is a world of its own
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            str(clients_python()), str(recipe_script("spark_client.py")), "--app", app, *mode,
            "--pod-template", str(spark.template),
            # Executors never register on kwok: don't hold the session's start for them (a
            # real job raises it instead, see the recipe).
            "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=1s",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
            env=env)
    driver = Driver(process, log)
    try:
        await driver.line("session ", within=SESSION_SECONDS)
        yield driver
    finally:
        if process.returncode is None:
            process.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 60)
            if process.returncode is None:
                process.kill()
                await process.wait()


async def rounds_of(run: LockgateRun, namespace: str, names: list[str]) -> int:
    """In how many distinct rounds these pods were released."""
    return int(await run.pool.fetchval(
        "SELECT count(DISTINCT d.decided_at) FROM release_decisions d JOIN jobs j"
        " ON j.cluster = d.cluster AND j.uid = d.uid"
        " WHERE j.namespace = $1 AND j.name = ANY($2::text[])", namespace, names))


async def stored_group(spark: Spark, app: str, count: int) -> list[dict[str, Any]]:
    """lockgate's rows of the group's executors, once it has `count` of them."""
    async def rows() -> list[dict[str, Any]] | None:
        found = await spark.run.pool.fetch(
            "SELECT name, queue, jobset, pod_group, pod_group_size, pod_group_max_size"
            " FROM jobs WHERE cluster = $1 AND namespace = $2 ORDER BY name",
            spark.run.alias(), spark.namespace)
        return [dict(r) for r in found] if len(found) == count else None
    return await eventually(rows, within=60, what=f"lockgate to store {count} executors")


def assert_gated_member(spark: Spark, pod: client.V1Pod, app: str) -> None:
    labels = pod.metadata.labels or {}
    assert labels.get(QUEUE_LABEL) == spark.queue, labels
    assert labels.get(JOBSET_LABEL) == spark.jobset, labels
    assert labels.get(GROUP_LABEL) == app, labels


async def test_static_allocation_goes_as_one_group(run: LockgateRun, tmp_path: Path) -> None:
    spark = await setting(run, tmp_path, "static")
    # The rival holds 2 of the node's 4 cpu: room for 2 of the 3 executors.
    await spark.rivals_hold("static-rival", 2)
    app = run.name("static")
    async with spark_driver(spark, app, tmp_path, "--static", "3") as driver:
        await spark.until(app, released_=0, gated=3, what="Spark's 3 executors, gated")
        for pod in await spark.executors(app):
            assert_gated_member(spark, pod, app)
        rows = await stored_group(spark, app, 3)
        group = f"{spark.namespace}/{app}"  # lockgate names a group per namespace
        assert {(r["queue"], r["jobset"], r["pod_group"], r["pod_group_size"])
                for r in rows} == {(spark.queue, spark.jobset, group, 3)}, rows
        await spark.steady(app, released_=0, gated=3)  # 2 fit, the group needs 3: none goes
        await spark.delete_rival("static-rival-0")
        out = await spark.until(app, released_=3, gated=0, what="all 3 executors released")
        assert await rounds_of(run, spark.namespace, out) == 1, "released over several rounds"
        await driver.stop()
    assert await spark.executors(app) == [], "stopping the session left executor pods"


async def test_dynamic_allocation_grows_one_executor_at_a_time(run: LockgateRun,
                                                               tmp_path: Path) -> None:
    spark = await setting(run, tmp_path, "dynamic")
    # The rival holds 3 of the node's 4 cpu: room for 1 of the minimum of 2.
    await spark.rivals_hold("dyn-rival", 3)
    app = run.name("dynamic")
    async with spark_driver(spark, app, tmp_path, "--dynamic", "2", "4") as driver:
        await spark.until(app, released_=0, gated=2, what="Spark's first 2 executors, gated")
        rows = await stored_group(spark, app, 2)
        group = f"{spark.namespace}/{app}"
        assert {(r["queue"], r["jobset"], r["pod_group"], r["pod_group_size"],
                 r["pod_group_max_size"]) for r in rows} == {
            (spark.queue, spark.jobset, group, 2, 4)}, rows
        await spark.steady(app, released_=0, gated=2)
        # Room for 2: the minimum goes together.
        await spark.delete_rival("dyn-rival-0")
        first = await spark.until(app, released_=2, gated=0, what="the minimum of 2 released")
        assert await rounds_of(run, spark.namespace, first) == 1

        # A job's pending tasks: Spark asks for executors up to its maximum of 4.
        await driver.send("job 8")
        await driver.line("submitted", within=30)
        await spark.until(app, released_=2, gated=2, what="Spark to ask for 2 more executors")
        rows = await stored_group(spark, app, 4)
        assert {(r["queue"], r["pod_group"]) for r in rows} == {(spark.queue, group)}, rows
        for pod in await spark.executors(app):
            assert_gated_member(spark, pod, app)
        await spark.steady(app, released_=2, gated=2)  # the node is full
        # One slot frees, the rival waits for nothing: one executor goes, alone.
        await spark.delete_rival("dyn-rival-1")
        grown = await spark.until(app, released_=3, gated=1, what="a third executor")
        assert await rounds_of(run, spark.namespace, grown) == 2, "the third went with others"
        # The rival waits and holds nothing once its last pod ends; the group holds 3: the
        # slot that frees is the rival's.
        await spark.start_rival("dyn-rival-3")
        await spark.delete_rival("dyn-rival-2")
        await eventually(lambda: spark.rival_released("dyn-rival-3"), within=60,
                         what="the rival to take the freed slot")
        await spark.steady(app, released_=3, gated=1)
        await driver.stop()
    assert await spark.executors(app) == [], "stopping the session left executor pods"


async def test_cluster_mode_gates_the_driver_as_a_pod_of_the_queue(run: LockgateRun,
                                                                   tmp_path: Path) -> None:
    """spark-submit in cluster mode, as the coordinator: the driver pod is gated, inherits the
    queue and job set, stays out of the executors' group, and is released alone when a slot
    frees. (kwok never runs it, so it never creates an executor.)"""
    spark = await setting(run, tmp_path, "cluster")
    await spark.rivals_hold("cl-rival", NODE_CPU)  # the rival fills the node
    app = run.name("cluster")
    bin_dir = clients_python().parent
    env = {**os.environ, "KUBECONFIG": str(spark.kubeconfig), "SPARK_LOCAL_IP": "127.0.0.1",
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    server = yaml.safe_load(spark.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    conf = {
        "spark.kubernetes.namespace": spark.namespace,
        "spark.kubernetes.authenticate.driver.serviceAccountName": "lockgate-coordinator",
        "spark.kubernetes.container.image": "lockgate.invalid/spark:never-pulled",
        "spark.kubernetes.driver.pod.name": f"{app}-driver",
        "spark.kubernetes.driver.podTemplateFile": str(spark.template),
        "spark.kubernetes.executor.podTemplateFile": str(spark.template),
        "spark.driver.cores": "1", "spark.driver.memory": "512m",
        "spark.kubernetes.executor.label.lockgate.io/group": app,
        "spark.executor.instances": "2",
        "spark.kubernetes.executor.annotation.lockgate.io/group-size": "2",
        "spark.kubernetes.submission.waitAppCompletion": "false",
    }
    args = [str(bin_dir / "spark-submit"), "--master", f"k8s://{server}",
            "--deploy-mode", "cluster", "--name", app,
            *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
            "local:///opt/spark/examples/src/main/python/pi.py"]
    log = tmp_path / "spark-submit.log"
    with log.open("wb") as output:
        submit = await asyncio.create_subprocess_exec(*args, stdout=output, stderr=output,
                                                      env=env)
        code = await asyncio.wait_for(submit.wait(), SESSION_SECONDS)
    text = log.read_text(errors="replace")
    assert code == 0 and "forbidden" not in text, text[-4000:]

    driver = await spark.run.pod(f"{app}-driver", namespace=spark.namespace)
    assert driver is not None, text[-4000:]
    labels = driver.metadata.labels or {}
    assert (labels.get(QUEUE_LABEL), labels.get(JOBSET_LABEL)) == (spark.queue, spark.jobset)
    assert GROUP_LABEL not in labels, labels
    assert labels.get("spark-role") == "driver", labels
    # spark-submit made the driver's Service, ConfigMap and NetworkPolicy as the coordinator.
    core = run.core()
    assert (await core.list_namespaced_service(spark.namespace)).items, "no driver Service"
    maps = (await core.list_namespaced_config_map(spark.namespace)).items
    assert [m for m in maps if m.metadata.name != "kube-root-ca.crt"], "no driver ConfigMap"
    policies = await client.NetworkingV1Api(run.apis[run.alias()]).list_namespaced_network_policy(
        spark.namespace)
    assert policies.items, "no driver NetworkPolicy"

    async def driver_released() -> bool:
        pod = await spark.run.pod(f"{app}-driver", namespace=spark.namespace)
        return pod is not None and released(pod)

    for _ in range(8):  # the node is full: the driver waits, gated, round after round
        assert not await driver_released(), "the driver was released onto a full node"
        await asyncio.sleep(0.5)
    await spark.delete_rival("cl-rival-0")
    await eventually(driver_released, within=60, what="the driver released alone")
    row = await run.job(driver.metadata.uid)
    assert row is not None and (row["queue"], row["pod_group"]) == (spark.queue, None), row
