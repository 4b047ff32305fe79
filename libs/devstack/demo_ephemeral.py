"""The demo's ephemeral-namespace part: a job in a namespace of its own, cancelled and collected.

Why in the demo: it shows the whole end of a job's life on real clusters: `lockgate jobset
cancel` deletes the job's pods (gated and running), ends its jobs as cancelled with the reason,
and the collector deletes its namespace and counts it deleted only once the cluster says so. The
record's transitions are printed, each with its time and cause.

The namespace and its record are stood up the way namespace creation leaves them (an active
record with its "created" transition, a namespace labelled with the queue and job set).
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import asyncpg
from kubernetes_asyncio import client

from devstack.launcher import Lockgate
from lockgate.labels import JOBSET_LABEL, MANAGED_NAMESPACE_LABEL, QUEUE_LABEL
from lockgate_adapters import cli, namespace_store

QUEUE = "ephemeral"
PODS = 4


async def run(lockgate: Lockgate, apis: Mapping[str, client.ApiClient], pool: asyncpg.Pool,
              run_id: str, *, within: float = 120.0) -> list[str]:
    """Create, cancel and collect one ephemeral-namespace job; print its section; returns
    failures (empty when it all happened)."""
    cluster = sorted(apis)[0]
    jobset, name = f"dask-{run_id}", f"demo-{run_id}-eph"
    binding = {"cluster": "*", "selector": {"matchLabels": {"lockgate.io/demo": run_id}}}
    async with aiohttp.ClientSession() as session, session.post(
            f"{lockgate.admin_url}/api/v1/queues", headers=lockgate.admin_headers,
            json={"name": QUEUE, "namespaces": [binding],
                  "resource_limits": {"cpu": "1"}}) as response:
        if response.status != 201:
            return [f"ephemeral demo: queue {QUEUE}: {await response.text()}"]
        created = await response.json()
    await lockgate.wait_for_queues({QUEUE: created})
    core = client.CoreV1Api(apis[cluster])
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": {MANAGED_NAMESPACE_LABEL: "true", QUEUE_LABEL: QUEUE,
                                 JOBSET_LABEL: jobset, "lockgate.io/demo": run_id,
                                 **lockgate.run_namespace_labels}}})
    async with pool.acquire() as connection:
        await namespace_store.insert_active(connection, cluster=cluster, name=name, queue=QUEUE,
                                            jobset=jobset, service_account="coordinator",
                                            ttl_seconds=3600)
    await _wait_for_default_account(core, name)
    for i in range(PODS):  # one cpu each, one cpu for the queue: one runs, the rest wait
        await core.create_namespaced_pod(name, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"worker-{i}"},
            "spec": {"containers": [{"name": "main", "image": "registry.invalid/sleep:1",
                                     "resources": {"requests": {"cpu": "1"}}}],
                     "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 0}})
    deadline = time.monotonic() + within
    while await _states(pool, jobset) != {"queued", "running"}:
        if time.monotonic() > deadline:
            return [f"ephemeral demo: jobs of {jobset} never both running and queued: "
                    f"{await _states(pool, jobset)}"]
        await asyncio.sleep(0.5)

    token_file = str(lockgate.write_token_files()["admin"])
    out, err = io.StringIO(), io.StringIO()
    command = ["jobset", "cancel", QUEUE, jobset, "--reason", "demo: superseded",
               "--wait", str(max(1.0, deadline - time.monotonic()))]
    print(f"  lockgate jobset cancel {QUEUE} {jobset} --reason 'demo: superseded' --wait ...",
          flush=True)
    code = cli.main(["--api", lockgate.admin_url, "--token-file", token_file, *command],
                    out=out, err=err)
    failures = [] if code == 0 else [f"ephemeral demo: cancel failed: {err.getvalue()}"]
    async with pool.acquire() as connection:
        record = await namespace_store.get(connection, cluster, name)
        steps = await namespace_store.transitions(connection, cluster, name)
    jobs = await pool.fetch("SELECT state, last_reason FROM jobs WHERE queue = $1 AND"
                            " jobset = $2", QUEUE, jobset)
    pods = await core.list_pod_for_all_namespaces(
        label_selector=f"{QUEUE_LABEL}={QUEUE},{JOBSET_LABEL}={jobset}")
    print("\n=== ephemeral namespace: a job cancelled and collected ===")
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
    if any(row["state"] != "cancelled" for row in jobs):
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


async def _wait_for_default_account(core: client.CoreV1Api, namespace: str) -> None:
    for _ in range(300):
        accounts = await core.list_namespaced_service_account(namespace)
        if any(a.metadata.name == "default" for a in accounts.items):
            return
        await asyncio.sleep(0.1)
