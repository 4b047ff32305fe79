"""The demo's ephemeral-namespace part: a job in a namespace of its own, cancelled and collected.

Why in the demo: it shows the whole life of a coordinator's job on real clusters, by the paths a
user takes. `lockgate namespace create` asks the admin API, whose namespace keeper (queue-store,
as lockgate-namespace-keeper) records the namespace and makes it with the coordinator's
ServiceAccount and Role; a coordinator creates its workers with nothing but the kubeconfig the
command wrote; `lockgate jobset cancel` deletes the job's pods (gated and running), ends its jobs
as cancelled with the reason, and the collector deletes the namespace and counts it deleted only
once the cluster says so. The record's transitions are printed, each with its time and cause.

`python -m devstack.demo_ephemeral` runs this part alone, with a lockgate of its own, on the
stack the environment names (LOCKGATE_STACK_PORT_OFFSET, LOCKGATE_STACK_DIR).
"""

from __future__ import annotations

import asyncio
import io
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

import devstack
from devstack.launcher import Lockgate
from devstack.ports import ServicePorts
from lockgate.labels import JOBSET_LABEL, QUEUE_LABEL
from lockgate_adapters import namespace_store
from lockgate_adapters.kube import api_client
from lockgate_adapters.postgres import connect_pool, create_database
from lockgate_adapters.settings import RetryPolicy
from lockgate_cli import root as cli

QUEUE = "ephemeral"
PODS = 4


def _lockgate(lockgate: Lockgate, token_file: str, *argv: str) -> tuple[int, str, str]:
    """The `lockgate` command, in-process, against this run's admin API."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--api", lockgate.admin_url, "--token-file", token_file, *argv],
                    out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _worker(index: int) -> dict[str, Any]:
    # No lockgate label: the namespace gives every pod its queue and job set.
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"worker-{index}"},
            "spec": {"containers": [{"name": "main", "image": "registry.invalid/sleep:1",
                                     "resources": {"requests": {"cpu": "1"}}}],
                     "tolerations": [{"operator": "Exists"}],
                     "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 0}}


async def run(lockgate: Lockgate, apis: Mapping[str, client.ApiClient], pool: asyncpg.Pool,
              run_id: str, *, within: float = 120.0) -> list[str]:
    """Create, cancel and collect one ephemeral-namespace job; print its section; returns
    failures (empty when it all happened)."""
    cluster = sorted(apis)[0]
    jobset = f"dask-{run_id}"
    deadline = time.monotonic() + within
    token_file = str(lockgate.write_token_files()["admin"])
    # One cpu for the queue, one cpu per worker: one runs, the rest wait.
    code, _, err = _lockgate(lockgate, token_file, "queue", "create", QUEUE, "--limit", "cpu=1")
    if code != 0:
        return [f"ephemeral demo: lockgate queue create {QUEUE}: {err.strip()}"]
    async with aiohttp.ClientSession() as session, session.get(
            f"{lockgate.admin_url}/api/v1/queues/{QUEUE}",
            headers=lockgate.admin_headers) as response:
        await lockgate.wait_for_queues({QUEUE: await response.json()})
    print("\n=== ephemeral namespace: a job cancelled and collected ===")
    print(f"  lockgate queue create {QUEUE} --limit cpu=1")
    with tempfile.TemporaryDirectory(prefix="lockgate-demo-") as directory:
        kubeconfig = Path(directory) / "coordinator.kubeconfig"
        argv = ["namespace", "create", "--queue", QUEUE, "--jobset", jobset, "--cluster",
                cluster, "--ttl", "1h", "--kubeconfig-out", str(kubeconfig)]
        print(f"  lockgate {' '.join(argv[:-1])} coordinator.kubeconfig", flush=True)
        code, out, err = _lockgate(lockgate, token_file, *argv)
        if code != 0:
            return [f"ephemeral demo: lockgate namespace create: {err.strip()}"]
        print("".join(f"    {line}\n" for line in out.replace(directory + "/", "").splitlines()),
              end="", flush=True)
        name = out.split()[1].split("/", 1)[1]  # "namespace CLUSTER/NAME (active) ..."
        coordinator = await config.new_client_from_config_dict(
            yaml.safe_load(kubeconfig.read_text()))
    try:
        # The coordinator, as its ServiceAccount: it may create pods in its namespace only.
        workers = client.CoreV1Api(coordinator)
        for index in range(PODS):
            await workers.create_namespaced_pod(name, _worker(index))
        print(f"  coordinator (its kubeconfig only): created {PODS} worker pods in {name}",
              flush=True)
    except ApiException as error:
        return [f"ephemeral demo: the coordinator could not create its workers: "
                f"{error.status} {error.reason}: {error.body!r}"]
    finally:
        await coordinator.close()
    while await _states(pool, jobset) != {"queued", "running"}:
        if time.monotonic() > deadline:
            return [f"ephemeral demo: jobs of {jobset} never both running and queued: "
                    f"{await _states(pool, jobset)}"]
        await asyncio.sleep(0.5)

    command = ["jobset", "cancel", QUEUE, jobset, "--reason", "demo: superseded",
               "--wait", str(max(1.0, deadline - time.monotonic()))]
    print(f"  lockgate jobset cancel {QUEUE} {jobset} --reason 'demo: superseded' --wait ...",
          flush=True)
    code, _, err = _lockgate(lockgate, token_file, *command)
    failures = [] if code == 0 else [f"ephemeral demo: cancel failed: {err}"]
    async with pool.acquire() as connection:
        record = await namespace_store.get(connection, cluster, name)
        steps = await namespace_store.transitions(connection, cluster, name)
    jobs = await pool.fetch("SELECT state, last_reason FROM jobs WHERE queue = $1 AND"
                            " jobset = $2", QUEUE, jobset)
    pods = await client.CoreV1Api(apis[cluster]).list_pod_for_all_namespaces(
        label_selector=f"{QUEUE_LABEL}={QUEUE},{JOBSET_LABEL}={jobset}")
    print(f"  {cluster}/{name} (queue {QUEUE}, job set {jobset}): "
          f"{record.state.value if record else 'no record'}; pods left: {len(pods.items)}; "
          f"jobs: {_count(jobs)}")
    for step in steps:
        print(f"  {step.at.strftime('%H:%M:%S.%f')[:-3]}  "
              f"{(step.from_state.value if step.from_state else '-'):>8} -> "
              f"{step.to_state.value:<8}  {step.cause}")
    if record is None or record.state.value != "deleted":
        failures.append(f"ephemeral demo: {cluster}/{name} not deleted")
    if pods.items:
        failures.append(f"ephemeral demo: {len(pods.items)} pods of {jobset} left")
    if len(jobs) != PODS or any(row["state"] != "cancelled" for row in jobs):
        failures.append(f"ephemeral demo: jobs not all cancelled: {_count(jobs)}")
    return failures


async def _states(pool: asyncpg.Pool, jobset: str) -> set[str]:
    rows = await pool.fetch("SELECT DISTINCT state FROM jobs WHERE queue = $1 AND jobset = $2",
                            QUEUE, jobset)
    return {row["state"] for row in rows}


def _count(rows: list[Any]) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        key = f"{row['state']} ({row['last_reason']})" if row["last_reason"] else row["state"]
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} {key}" for key, n in sorted(counts.items())) or "none"


async def _alone() -> int:
    """This part of the demo by itself: a fresh database and a lockgate of its own."""
    info = devstack.ensure_up()
    run_id = uuid.uuid4().hex[:5]
    dsn = await create_database(info.postgres_dsn, "lockgate_demo_ephemeral", replace=True)
    lockgate = Lockgate.for_stack(info, postgres_dsn=dsn, run_id=f"demo-{run_id}",
                                  ports=ServicePorts.free())
    apis = {cluster: await api_client(path) for cluster, path in info.kubeconfigs.items()}
    pool = await connect_pool(dsn, policy=RetryPolicy(), min_size=1, max_size=2)
    try:
        await lockgate.start()
        failures = await run(lockgate, apis, pool, run_id)
    finally:
        codes = await lockgate.stop()
        await pool.close()
        for api in apis.values():
            await api.close()
    failures += [f"{name} did not stop gracefully (exit code {code})"
                 for name, code in codes.items() if code not in (0, None)]
    print("\n" + ("\n".join(f"FAILED: {failure}" for failure in failures) or "ephemeral demo: OK"))
    return 1 if failures else 0


def main() -> None:
    sys.exit(asyncio.run(_alone()))


if __name__ == "__main__":
    main()
