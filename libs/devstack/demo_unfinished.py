"""Why the demo's batch work did not finish: what the clusters show, against lockgate's jobs table.

Why: "batch workloads not finished after 420s" said nothing about where the missing work was.
Once, on a loaded machine, one pod of a Job never reached lockgate's jobs table, and by the time
anyone looked the demo had deleted its namespaces: whether the pod existed at all, whether the
webhook had gated it, whether it ran outside lockgate, could no longer be told. So when the batch
part times out, the demo says, before it cleans up, for every Job its status and for every pod of
its namespaces that lockgate does not hold as it should: its uid, when it was created, its phase,
whether it carries lockgate's gate and queue label, and what lockgate's row says (if any).

`unaccounted` is pure (tested in tests/unit/test_demo_unfinished.py); `explain` reads both sides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
from kubernetes_asyncio import client

from lockgate.jobs import TERMINAL_STATES
from lockgate.labels import QUEUE_LABEL, SCHEDULING_GATE

_TERMINAL_ROWS = frozenset(state.value for state in TERMINAL_STATES)


@dataclass(frozen=True)
class SeenPod:
    """A pod as its cluster showed it, reduced to what tells where it went."""

    cluster: str
    namespace: str
    name: str
    uid: str
    created: str
    phase: str
    gated: bool
    queue: str  # its lockgate.io/queue label ("" none)
    node: str
    deleting: bool

    @classmethod
    def of(cls, cluster: str, pod: Mapping[str, Any]) -> SeenPod:
        metadata = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        gates = spec.get("schedulingGates") or ()
        return cls(
            cluster=cluster, namespace=str(metadata.get("namespace", "")),
            name=str(metadata.get("name", "")), uid=str(metadata.get("uid", "")),
            created=str(metadata.get("creationTimestamp", "")),
            phase=str((pod.get("status") or {}).get("phase", "")),
            gated=any(g.get("name") == SCHEDULING_GATE for g in gates),
            queue=str((metadata.get("labels") or {}).get(QUEUE_LABEL, "")),
            node=str(spec.get("nodeName") or ""),
            deleting=bool(metadata.get("deletionTimestamp")),
        )

    @property
    def where(self) -> str:
        return (f"{self.cluster}/{self.namespace}/{self.name} (uid {self.uid}, created "
                f"{self.created}, phase {self.phase or '?'}, "
                f"{'gated' if self.gated else 'not gated'}, "
                f"queue label {self.queue or '(none)'}"
                f"{', node ' + self.node if self.node else ''}"
                f"{', being deleted' if self.deleting else ''})")


def unaccounted(pods: Iterable[SeenPod], rows: Mapping[tuple[str, str], str]) -> list[str]:
    """One line per pod lockgate does not hold as the cluster shows it: no row at all (with
    what that means for a pod gated or not), or a finished row for a pod still gated.
    `rows`: (cluster, uid) → the job's state in lockgate's jobs table."""
    lines = []
    for pod in sorted(pods, key=lambda p: (p.cluster, p.namespace, p.created, p.name)):
        state = rows.get((pod.cluster, pod.uid))
        if state is None:
            if pod.gated and pod.queue:
                why = ("gated by lockgate's webhook but never stored by lockgate: the watcher "
                       "did not report it, or queue-store did not store what it reported")
            elif not pod.gated and not pod.queue:
                why = "never admitted by lockgate's webhook (no gate, no queue label)"
            else:
                why = "no row in lockgate's jobs table"
            lines.append(f"{pod.where}: {why}")
        elif pod.gated and state in _TERMINAL_ROWS and not pod.deleting:
            lines.append(f"{pod.where}: still gated, but lockgate holds it as {state}")
    return lines


def job_status_line(cluster: str, job: Mapping[str, Any]) -> str:
    metadata = job.get("metadata") or {}
    status = job.get("status") or {}
    conditions = [f"{c.get('type')}={c.get('status')}" for c in status.get("conditions") or ()]
    uncounted = status.get("uncountedTerminatedPods") or {}
    return (f"Job {cluster}/{metadata.get('namespace')}/{metadata.get('name')}: "
            f"active {status.get('active', 0)}, ready {status.get('ready', 0)}, "
            f"succeeded {status.get('succeeded', 0)}, failed {status.get('failed', 0)}"
            + (f", uncounted {dict(uncounted)}" if uncounted else "")
            + (f", {', '.join(conditions)}" if conditions else ""))


async def explain(apis: Mapping[str, client.ApiClient], pool: asyncpg.Pool,
                  namespaces: Sequence[tuple[str, str]]) -> list[str]:
    """What the clusters show of `namespaces` ((cluster, namespace) pairs) that lockgate's
    jobs table does not account for, and every Job's status there."""
    lines: list[str] = []
    seen: list[SeenPod] = []
    for cluster, namespace in namespaces:
        core = client.CoreV1Api(apis[cluster])
        batch = client.BatchV1Api(apis[cluster])
        pods = await _raw(await core.list_namespaced_pod(namespace, _preload_content=False))
        seen += [SeenPod.of(cluster, pod) for pod in pods.get("items") or ()]
        jobs = await _raw(await batch.list_namespaced_job(namespace, _preload_content=False))
        lines += [job_status_line(cluster, job) for job in jobs.get("items") or ()]
    records = await pool.fetch(
        "SELECT cluster, uid, state FROM jobs WHERE uid = ANY($1::text[])",
        [pod.uid for pod in seen])
    rows = {(r["cluster"], r["uid"]): str(r["state"]) for r in records}
    return lines + unaccounted(seen, rows)


async def _raw(response: Any) -> dict[str, Any]:
    try:
        body: dict[str, Any] = orjson.loads(await response.read())
    finally:
        response.release()
    return body
