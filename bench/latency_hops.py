"""Where a released pod's latency goes, hop by hop, from its trace (issue 19, release latency).

    python bench/latency_hops.py [--pods 60] [--gap 0.1]

Starts Jaeger (the build `make run` uses) and lockgate on the local stack with tracing on,
creates pods one at a time with room to spare, and reads each pod's trace back: the admission
review, "pod observed" (cluster-watcher), queue-store's spans, "release decided" (the round)
and "ungate" (the ungater's patch). Prints one JSON object: per step, the median and p90 of the
time from the admission review's start to that step's start and end, and of each step's own
duration; and the same latency the release benchmark measures (creation to gate seen gone) for
these pods, so the hops can be set against it. Tracing costs CPU of its own: read the
proportions, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path

import aiohttp
from kubernetes_asyncio import client

import devstack
from bench_release import (
    GateWatcher,
    create_namespace,
    create_queues,
    delete_namespace,
    latency_record,
    pod_body,
)
from devstack.config import Settings
from devstack.demo import fresh_database
from devstack.images import JAEGER, ensure_go_tool
from devstack.launcher import Lockgate
from devstack.ports import ServicePorts, free_port
from lockgate.labels import MANAGED_NAMESPACE_LABEL, QUEUE_LABEL
from lockgate.pod_traces import TraceSpan, linked_traces, spans_from_jaeger, trace_id_of_uid
from lockgate_adapters.kube import api_client

REPO = Path(__file__).resolve().parents[1]


async def start_jaeger(log: Path) -> tuple[asyncio.subprocess.Process, str, str]:
    binary = await asyncio.to_thread(ensure_go_tool, Settings.from_env(), JAEGER,
                                     lambda text: print(text, file=sys.stderr, flush=True))
    ports = {name: free_port() for name in ("JAEGER_QUERY_PORT", "JAEGER_QUERY_GRPC_PORT",
                                            "JAEGER_HEALTH_PORT", "JAEGER_OTLP_HTTP_PORT")}
    output = log.open("wb")
    process = await asyncio.create_subprocess_exec(
        str(binary), "--config", str(REPO / "deploy/images/jaeger/loopback.yaml"),
        env={**os.environ, **{k: str(v) for k, v in ports.items()}},
        stdout=output, stderr=output, stdin=asyncio.subprocess.DEVNULL)
    query = f"http://127.0.0.1:{ports['JAEGER_QUERY_PORT']}"
    async with aiohttp.ClientSession() as session:
        for _ in range(240):
            if process.returncode is not None:
                raise RuntimeError(f"Jaeger exited; its log: {log}")
            try:
                async with session.get(f"{query}/api/services") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
        else:
            raise RuntimeError(f"Jaeger's query API never answered; log {log}")
    return process, f"http://127.0.0.1:{ports['JAEGER_OTLP_HTTP_PORT']}", query


async def trace_of(session: aiohttp.ClientSession, query: str,
                   trace_id: str) -> list[TraceSpan]:
    async with session.get(f"{query}/api/traces/{trace_id}") as response:
        if response.status != 200:
            return []
        return spans_from_jaeger(await response.json())


def steps_of(own: list[TraceSpan], linked: list[TraceSpan]) -> dict[str, tuple[int, int]]:
    """Per step (service: span name), its first start and end, in µs since the epoch."""
    steps: dict[str, tuple[int, int]] = {}
    for span in sorted(own + linked, key=lambda s: s.start_us):
        key = f"{span.service}: {span.name}"
        if key not in steps:
            steps[key] = (span.start_us, span.end_us)
    return steps


def summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"p50_ms": round(statistics.median(values), 1),
            "p90_ms": round(values[int(0.9 * (len(values) - 1))], 1), "n": len(values)}


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=60)
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between creations")
    parser.add_argument("--queues", type=int, default=100,
                        help="the pods go to these queues in turn, as in bench_release.py")
    args = parser.parse_args(argv)

    info = devstack.ensure_up()
    work = Path(f"/tmp/lockgate-latency-hops-{uuid.uuid4().hex[:6]}")
    await asyncio.to_thread(work.mkdir, parents=True)
    jaeger, otlp, query = await start_jaeger(work / "jaeger.log")
    dsn = await fresh_database(info.postgres_dsn, "lockgate_hops")
    lockgate = Lockgate.for_stack(info, postgres_dsn=dsn, standby_scheduler=False,
                                  run_id=f"hops-{uuid.uuid4().hex[:5]}",
                                  ports=ServicePorts.free(),
                                  extra_env={"LOCKGATE_OTLP_ENDPOINT": otlp})
    apis = {cluster: await api_client(path) for cluster, path in info.kubeconfigs.items()}
    cluster, api = next(iter(apis.items()))
    namespace = f"hops-{uuid.uuid4().hex[:6]}"
    queues = [f"{namespace}-q{i}" for i in range(args.queues)]
    try:
        await lockgate.start()
        await create_queues(lockgate.admin_url, queues, namespace,
                            headers=lockgate.admin_headers)
        await lockgate.wait_for_queues({queue: {"cordoned": False, "namespaces": [
            {"cluster": "*", "names": [namespace]}]} for queue in queues})
        await create_namespace(api, namespace, {MANAGED_NAMESPACE_LABEL: "true",
                                                QUEUE_LABEL: queues[0],
                                                **lockgate.run_namespace_labels})
        watcher = GateWatcher()
        watching = asyncio.create_task(watcher.run(api, namespace, cluster))
        created_at: dict[str, float] = {}
        uids: dict[str, str] = {}
        core = client.CoreV1Api(api)
        for i in range(args.pods):
            name = f"hop-{i}"
            created_at[f"{cluster}/{name}"] = time.perf_counter()
            pod = await core.create_namespaced_pod(namespace, pod_body(
                name, gated=False, queue=queues[i % len(queues)]))
            uids[name] = pod.metadata.uid
            await asyncio.sleep(args.gap)
        complete = await watcher.wait_for(args.pods, time.perf_counter() + 120)
        watching.cancel()
        await asyncio.sleep(8)  # the services export their spans in batches
        from_start: dict[str, list[float]] = {}
        to_end: dict[str, list[float]] = {}
        own_time: dict[str, list[float]] = {}
        async with aiohttp.ClientSession() as session:
            for uid in uids.values():
                own = await trace_of(session, query, trace_id_of_uid(uid))
                linked: list[TraceSpan] = []
                for trace_id in linked_traces(own):
                    linked += [s for s in await trace_of(session, query, trace_id)
                               if s.name in ("admission review", "schedule-round")]
                steps = steps_of(own, linked)
                origin = next((start for key, (start, _) in steps.items()
                               if key.endswith(": admission review")), None)
                if origin is None:
                    continue
                for key, (start, end) in steps.items():
                    from_start.setdefault(key, []).append((start - origin) / 1000)
                    to_end.setdefault(key, []).append((end - origin) / 1000)
                    own_time.setdefault(key, []).append((end - start) / 1000)
        order = sorted(from_start, key=lambda k: statistics.median(from_start[k]))
        print(json.dumps({
            "name": "release_latency_hops", "pods": args.pods, "queues": len(queues),
            "latency": latency_record("release_latency", watcher, created_at, complete),
            "steps": [{"step": key, "starts": summary(from_start[key]),
                       "ends": summary(to_end[key]), "own": summary(own_time[key])}
                      for key in order],
        }, indent=1))
    finally:
        await lockgate.stop()
        await delete_namespace(api, namespace)
        for each in apis.values():
            await each.close()
        if jaeger.returncode is None:
            jaeger.send_signal(signal.SIGTERM)
            await jaeger.wait()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
