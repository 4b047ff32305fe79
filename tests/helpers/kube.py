"""Kubernetes for tests: namespaces ready for pods (and removed after), reading or removing
scheduling gates, kubeconfigs through a relay, custom resources of a test's own. Pods themselves
are built with helpers.pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.pod_creation import create_pod_as_a_controller
from lockgate.labels import SCHEDULING_GATE

# ---------------------------------------------------------------- custom resources


@contextlib.asynccontextmanager
async def worker_group_crd(api: client.ApiClient, group: str) -> AsyncIterator[str]:
    """A namespaced custom resource `workergroups.<group>` (kind WorkerGroup, version v1) with a
    `scale` subresource, as the Dask operator's DaskWorkerGroup has; yields its plural once the
    apiserver serves it, and deletes the CRD after. CRDs are cluster-wide: give each test a
    group of its own."""
    extensions = client.ApiextensionsV1Api(api)
    name = f"workergroups.{group}"
    crd: dict[str, Any] = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": "workergroups", "singular": "workergroup",
                      "kind": "WorkerGroup"},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                "subresources": {"scale": {"specReplicasPath": ".spec.replicas",
                                           "statusReplicasPath": ".status.replicas"}},
            }],
        },
    }
    await extensions.create_custom_resource_definition(crd)
    try:
        deadline = time.monotonic() + 30
        while True:
            found = await extensions.read_custom_resource_definition(name)
            if any(c.type == "Established" and c.status == "True"
                   for c in found.status.conditions or []):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not established within 30 s")
            await asyncio.sleep(0.1)
        yield "workergroups"
    finally:
        await _unless_gone(extensions.delete_custom_resource_definition(name))


# ---------------------------------------------------------------- gates


async def create_pods_as_a_controller(core: client.CoreV1Api, namespace: str,
                                      manifests: list[dict[str, Any]], *, concurrency: int,
                                      retry_seconds: float) -> None:
    """Create pods as a controller would: `concurrency` at a time, each again after a 503
    (devstack.pod_creation) for at most `retry_seconds`."""
    slots = asyncio.Semaphore(concurrency)

    async def create(manifest: dict[str, Any]) -> None:
        async with slots:
            await create_pod_as_a_controller(core, namespace, manifest,
                                             retry_seconds=retry_seconds)

    async with asyncio.TaskGroup() as group:
        for manifest in manifests:
            group.create_task(create(manifest))


def gates_of(pod: client.V1Pod) -> list[str]:
    return [gate.name for gate in pod.spec.scheduling_gates or ()]


async def held_by_its_gates(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    """kube-scheduler has seen the pod and holds it for its scheduling gates (its PodScheduled
    condition says SchedulingGated): were it not gated, it would be scheduling it now."""
    pod = await core.read_namespaced_pod(name, namespace)
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "SchedulingGated"
               for c in pod.status.conditions or ())


async def remove_first_gate(core: client.CoreV1Api, namespace: str, name: str,
                            gate: str = SCHEDULING_GATE) -> None:
    """Remove the pod's first scheduling gate, only if it is `gate` (as an ungater would).

    For lockgate's gate in a managed namespace `core` must act as lockgate's ungater (the
    `ungaters` fixture): an admission policy refuses anyone else, admin included.
    """
    patch = [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": gate},
             {"op": "remove", "path": "/spec/schedulingGates/0"}]
    await core.patch_namespaced_pod(name, namespace, patch,
                                    _content_type="application/json-patch+json")


# ---------------------------------------------------------------- namespaces


async def wait_for_default_service_account(core: client.CoreV1Api, namespace: str, *,
                                           within: float = 30.0) -> None:
    """Pods are rejected until kube-controller-manager has made the namespace's `default`
    ServiceAccount: wait for it."""
    deadline = time.monotonic() + within
    while True:
        try:
            await core.read_namespaced_service_account("default", namespace)
            return
        except ApiException as error:
            if error.status != 404 or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


class Namespaces:
    """Namespaces a test makes in its clusters, ready for pods, deleted with their pods after."""

    def __init__(self, apis: Mapping[str, client.ApiClient]) -> None:
        self._apis = apis
        self.created: list[tuple[str, str]] = []  # (cluster, namespace)

    async def create(self, cluster: str, name: str, *,
                     labels: Mapping[str, str] | None = None) -> str:
        core = client.CoreV1Api(self._apis[cluster])
        await core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                     "metadata": {"name": name, "labels": dict(labels or {})}})
        self.created.append((cluster, name))
        await wait_for_default_service_account(core, name)
        return name

    async def delete_all(self, *, pods_gone_within: float = 300.0) -> None:
        """Delete each namespace's controllers, then its pods (at once, grace 0), wait until no
        pod is left, then delete the namespaces (not awaited: no test reuses a name).

        Why wait for the pods: they hold room on the nodes, and the next test may need all of
        it. Why the controllers first: a ReplicaSet or Job would make new pods for the deleted
        ones, ungated once the run's webhook is gone, until the namespace controller got round
        to it.
        """
        for cluster, name in reversed(self.created):
            api = self._apis[cluster]
            await delete_controllers(api, name)
            await delete_pods_until_none(client.CoreV1Api(api), name, within=pods_gone_within)
            await _unless_gone(client.CoreV1Api(api).delete_namespace(name))
        self.created.clear()


async def delete_controllers(api: client.ApiClient, namespace: str) -> None:
    """Every Deployment, ReplicaSet, StatefulSet, DaemonSet and Job in the namespace."""
    apps, batch = client.AppsV1Api(api), client.BatchV1Api(api)
    for delete in (apps.delete_collection_namespaced_deployment,
                   apps.delete_collection_namespaced_replica_set,
                   apps.delete_collection_namespaced_stateful_set,
                   apps.delete_collection_namespaced_daemon_set,
                   batch.delete_collection_namespaced_job):
        await _unless_gone(delete(namespace, propagation_policy="Background"))


async def delete_pods_until_none(core: client.CoreV1Api, namespace: str, *,
                                 within: float) -> None:
    """Delete the namespace's pods at once (grace 0) until none is left (a controller being
    deleted may still make one more)."""
    deadline = time.monotonic() + within
    while True:
        await _unless_gone(core.delete_collection_namespaced_pod(namespace,
                                                                 grace_period_seconds=0))
        try:
            left = (await core.list_namespaced_pod(namespace)).items
        except ApiException as error:
            if error.status == 404:
                return
            raise
        if not left:
            return
        if time.monotonic() > deadline:
            names = sorted(p.metadata.name for p in left)
            raise AssertionError(f"timed out after {within:.0f}s waiting for the pods of "
                                 f"namespace {namespace} to be gone: {names[:10]}")
        await asyncio.sleep(0.2)


async def _unless_gone(call: Awaitable[object]) -> None:
    """Deleting what is gone (404) or already being deleted (409) is done already."""
    try:
        await call
    except ApiException as error:
        if error.status not in (404, 409):
            raise


@contextlib.asynccontextmanager
async def temporary_namespaces(apis: Mapping[str, client.ApiClient]
                               ) -> AsyncIterator[Namespaces]:
    namespaces = Namespaces(apis)
    try:
        yield namespaces
    finally:
        await namespaces.delete_all()


async def until_nodes_hold_no_pods(apis: Mapping[str, client.ApiClient], *,
                                   within: float = 180.0) -> None:
    """Wait until no pod (outside kube-* namespaces) is bound to a node of these clusters, or
    fail naming the pods that stayed.

    Why: a test that fills a cluster sizes its load from the nodes' allocatable. A pod another
    test left behind (a leak, or one whose deletion is still under way) would take room the
    test counts on, and it would time out far from the cause, as would every such test after it.
    Waiting covers a deletion under way; a leak fails here, once per test, with its name.
    """

    async def held() -> list[str]:
        holders = []
        for cluster, api in apis.items():
            for pod in (await client.CoreV1Api(api).list_pod_for_all_namespaces()).items:
                if (pod.spec.node_name and not pod.metadata.namespace.startswith("kube-")
                        and pod.status.phase in ("Pending", "Running")):
                    deleting = " (being deleted)" if pod.metadata.deletion_timestamp else ""
                    holders.append(f"{cluster}/{pod.metadata.namespace}/{pod.metadata.name}"
                                   f" on {pod.spec.node_name}{deleting}")
        return sorted(holders)

    deadline = time.monotonic() + within
    while holders := await held():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{len(holders)} pod(s) of other tests still hold room after {within:.0f}s, and "
                f"this test sizes its load from the nodes' allocatable: {holders[:10]}. An "
                "earlier test left them; delete their namespaces (and find that test's leak)")
        await asyncio.sleep(1.0)


# ---------------------------------------------------------------- kubeconfigs


def server_port(kubeconfig: str) -> int:
    config = yaml.safe_load(Path(kubeconfig).read_text())
    return int(config["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])


def kubeconfig_through(kubeconfig: str, port: int, out: Path) -> str:
    """A copy of `kubeconfig` whose server is 127.0.0.1:`port` (same TLS identity); its path."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    out.write_text(yaml.safe_dump(config))
    return str(out)
