"""Kubernetes objects for tests: pods and deployments built like sentences, namespaces ready
for pods, and reading or removing scheduling gates.

    a_pod("worker").in_queue(queue).gated().requesting(cpu="1", memory="1Gi").manifest()
    a_deployment("web").labelled({QUEUE_LABEL: queue}).with_replicas(2).of(a_pod("web"))

Builders are immutable: every call returns a new builder, so one can serve as a template. Pods
stop at once when deleted (grace period 0) and mount no service-account token: nothing runs in
them (kwok only pretends), and a test's cleanup should not wait for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from lockgate.labels import JOBSET_LABEL, QUEUE_LABEL, SCHEDULING_GATE

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# kwok's stages for the stack's pods: a pod with this annotation completes after the duration,
# and fails instead if it also carries FAIL_ANNOTATION.
COMPLETE_ANNOTATION = "lockgate.io/complete-after"
FAIL_ANNOTATION = "lockgate.io/fail"


# ---------------------------------------------------------------- pods


@dataclass(frozen=True)
class PodBuilder:
    name: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    gates: tuple[str, ...] = ()
    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)
    node: str | None = None
    tolerations: tuple[Mapping[str, str], ...] = ()
    restart_policy: str | None = None
    owners: tuple[Mapping[str, Any], ...] = ()
    image: str = "registry.invalid/sleep:1"

    def named(self, name: str) -> PodBuilder:
        return replace(self, name=name)

    def in_namespace(self, namespace: str) -> PodBuilder:
        return replace(self, namespace=namespace)

    def labelled(self, labels: Mapping[str, str] | None = None, **more: str) -> PodBuilder:
        return replace(self, labels={**self.labels, **(labels or {}), **more})

    def in_queue(self, queue: str) -> PodBuilder:
        return self.labelled({QUEUE_LABEL: queue})

    def in_jobset(self, jobset: str) -> PodBuilder:
        return self.labelled({JOBSET_LABEL: jobset})

    def annotated(self, annotations: Mapping[str, str]) -> PodBuilder:
        return replace(self, annotations={**self.annotations, **annotations})

    def gated(self, *gates: str) -> PodBuilder:
        """With these scheduling gates, in this order (lockgate's gate when none is named)."""
        return replace(self, gates=gates or (SCHEDULING_GATE,))

    def requesting(self, **quantities: str) -> PodBuilder:
        """Resource requests, e.g. requesting(cpu="250m", memory="64Mi")."""
        return replace(self, requests={**self.requests, **quantities})

    def limited_to(self, **quantities: str) -> PodBuilder:
        return replace(self, limits={**self.limits, **quantities})

    def on_node(self, node: str) -> PodBuilder:
        """Bound directly to `node`, bypassing the scheduler (as unmanaged pods may be)."""
        return replace(self, node=node)

    def tolerating_kwok_nodes(self) -> PodBuilder:
        return replace(self, tolerations=(
            *self.tolerations, {"key": KWOK_NODE_ANNOTATION, "operator": "Exists"}))

    def never_restarted(self) -> PodBuilder:
        return replace(self, restart_policy="Never")

    def completing_after(self, duration: str, *, failing: bool = False) -> PodBuilder:
        """kwok ends the pod `duration` after it starts running: Succeeded, or Failed."""
        ending = {COMPLETE_ANNOTATION: duration, **({FAIL_ANNOTATION: "true"} if failing else {})}
        return self.annotated(ending)

    def owned_by(self, reference: Mapping[str, Any]) -> PodBuilder:
        return replace(self, owners=(*self.owners, reference))

    def spec(self) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": self.image}
        if self.requests or self.limits:
            container["resources"] = {"requests": dict(self.requests),
                                      "limits": dict(self.limits)}
        spec: dict[str, Any] = {
            "containers": [container],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
        }
        if self.gates:
            spec["schedulingGates"] = [{"name": gate} for gate in self.gates]
        if self.node:
            spec["nodeName"] = self.node
        if self.tolerations:
            spec["tolerations"] = [dict(t) for t in self.tolerations]
        if self.restart_policy:
            spec["restartPolicy"] = self.restart_policy
        return spec

    def metadata(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "labels": dict(self.labels)}
        if self.namespace:
            metadata["namespace"] = self.namespace
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        if self.owners:
            metadata["ownerReferences"] = [dict(o) for o in self.owners]
        return metadata

    def manifest(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": self.metadata(),
                "spec": self.spec()}


def a_pod(name: str) -> PodBuilder:
    return PodBuilder(name)


@dataclass(frozen=True)
class DeploymentBuilder:
    """A Deployment selecting its pods by `app=<name>`."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    replicas: int = 1
    pod: PodBuilder = field(default_factory=lambda: PodBuilder("unused"))

    def labelled(self, labels: Mapping[str, str]) -> DeploymentBuilder:
        return replace(self, labels={**self.labels, **labels})

    def with_replicas(self, replicas: int) -> DeploymentBuilder:
        return replace(self, replicas=replicas)

    def of(self, pod: PodBuilder) -> DeploymentBuilder:
        """Replicas made from `pod`: its labels and spec (its name is not used)."""
        return replace(self, pod=pod)

    def manifest(self) -> dict[str, Any]:
        selector = {"app": self.name}
        return {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": self.name, "labels": dict(self.labels)},
            "spec": {
                "replicas": self.replicas,
                "selector": {"matchLabels": selector},
                "template": {"metadata": {"labels": {**selector, **self.pod.labels}},
                             "spec": self.pod.spec()},
            },
        }


def a_deployment(name: str) -> DeploymentBuilder:
    return DeploymentBuilder(name)


# ---------------------------------------------------------------- gates


def gates_of(pod: client.V1Pod) -> list[str]:
    return [gate.name for gate in pod.spec.scheduling_gates or ()]


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

    async def delete_all(self) -> None:
        """Delete the pods first, at once (grace 0), then the namespaces; no waiting for either."""
        for cluster, name in reversed(self.created):
            core = client.CoreV1Api(self._apis[cluster])
            await _unless_gone(core.delete_collection_namespaced_pod(
                name, grace_period_seconds=0))
            await _unless_gone(core.delete_namespace(name))
        self.created.clear()


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
