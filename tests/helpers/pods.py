"""Pods and Deployments for tests, built like sentences: the one way to build a pod, in every tier.

    a_pod("worker").in_queue(queue).gated().requesting(cpu="1", memory="1Gi").manifest()
    a_pod("p").in_namespace("team-a").on_node("n1").in_phase("Running").obj()
    a_deployment("web").labelled({QUEUE_LABEL: queue}).with_replicas(2).of(a_pod("web"))

Why one set: unit tests (admission, observing, releasing), integration tests (webhook, watcher,
ungater) and end-to-end tests all need pods; four private builders drifted apart (one mutable,
one with keyword arguments, two with their own defaults). This module is pure (no client, no
stack), so tests/unit may import it as it imports helpers.progressive_filling.

Builders are immutable: every call returns a new builder, so one can serve as a template.
- `manifest()` is what a test sends to the apiserver: no uid, status or resourceVersion.
- `obj()` is a pod as the apiserver returns it (JSON): a uid ("uid-<name>" unless `with_uid`),
  a creation timestamp, a resourceVersion and a status phase, for code that reads pods.
Pods stop at once when deleted (grace period 0) and mount no service-account token: nothing runs
in them (kwok only pretends), and a test's cleanup should not wait for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from lockgate.labels import JOBSET_LABEL, QUEUE_LABEL, SCHEDULING_GATE

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# kwok's stages for the stack's pods: a pod with this annotation completes after the duration,
# and fails instead if it also carries FAIL_ANNOTATION.
COMPLETE_ANNOTATION = "lockgate.io/complete-after"
FAIL_ANNOTATION = "lockgate.io/fail"
CREATED_AT = "2026-01-02T03:00:00Z"  # obj()'s creation timestamp
DELETING_SINCE = "2026-01-02T03:05:00Z"  # obj()'s deletion timestamp, once being_deleted()


@dataclass(frozen=True)
class Container:
    name: str
    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)
    restart_policy: str | None = None  # "Always" makes an init container a sidecar
    image: str = "registry.invalid/sleep:1"

    def manifest(self) -> dict[str, Any]:
        container: dict[str, Any] = {"name": self.name, "image": self.image}
        if self.requests or self.limits:
            container["resources"] = {"requests": dict(self.requests),
                                      "limits": dict(self.limits)}
        if self.restart_policy:
            container["restartPolicy"] = self.restart_policy
        return container


@dataclass(frozen=True)
class PodBuilder:
    name: str
    namespace: str | None = None
    uid: str | None = None
    # None: the manifest has no such field at all (a webhook patch must then create it).
    labels: Mapping[str, str] | None = None
    annotations: Mapping[str, str] | None = None
    gates: tuple[str, ...] | None = None
    containers: tuple[Container, ...] = (Container("main"),)
    init_containers: tuple[Container, ...] = ()
    node: str | None = None
    tolerations: tuple[Mapping[str, str], ...] = ()
    restart_policy: str | None = None
    owners: tuple[Mapping[str, Any], ...] = ()
    extra_spec: Mapping[str, Any] = field(default_factory=dict)
    phase: str = "Pending"
    status: Mapping[str, Any] = field(default_factory=dict)  # beside the phase
    deleting: bool = False
    resource_version: str = "1"

    # ------------------------------------------------------------ who it is, where

    def named(self, name: str) -> PodBuilder:
        return replace(self, name=name)

    def in_namespace(self, namespace: str) -> PodBuilder:
        return replace(self, namespace=namespace)

    def with_uid(self, uid: str) -> PodBuilder:
        return replace(self, uid=uid)

    def labelled(self, labels: Mapping[str, str] | None = None, **more: str) -> PodBuilder:
        return replace(self, labels={**(self.labels or {}), **(labels or {}), **more})

    def in_queue(self, queue: str, jobset: str | None = None) -> PodBuilder:
        labelled = self.labelled({QUEUE_LABEL: queue})
        return labelled if jobset is None else labelled.in_jobset(jobset)

    def in_jobset(self, jobset: str) -> PodBuilder:
        return self.labelled({JOBSET_LABEL: jobset})

    def annotated(self, annotations: Mapping[str, str] | None = None, **more: str) -> PodBuilder:
        return replace(self, annotations={**(self.annotations or {}), **(annotations or {}),
                                          **more})

    def owned_by(self, reference: Mapping[str, Any]) -> PodBuilder:
        return replace(self, owners=(*self.owners, reference))

    # ------------------------------------------------------------ what it asks for

    def gated(self, *gates: str) -> PodBuilder:
        """With these scheduling gates, in this order (lockgate's gate when none is named)."""
        return replace(self, gates=gates or (SCHEDULING_GATE,))

    def with_gates(self, *gates: str) -> PodBuilder:
        """Exactly these scheduling gates: none at all is an empty list in the spec."""
        return replace(self, gates=gates)

    def requesting(self, **quantities: str) -> PodBuilder:
        """Requests of the main container, e.g. requesting(cpu="250m", memory="64Mi")."""
        main, *others = self.containers
        return replace(self, containers=(
            replace(main, requests={**main.requests, **quantities}), *others))

    def limited_to(self, **quantities: str) -> PodBuilder:
        main, *others = self.containers
        return replace(self, containers=(
            replace(main, limits={**main.limits, **quantities}), *others))

    def with_container(self, **requests: str) -> PodBuilder:
        """Another regular container, requesting `requests`."""
        added = Container(f"c{len(self.containers)}", requests=requests)
        return replace(self, containers=(*self.containers, added))

    def with_init(self, *, sidecar: bool = False, **requests: str) -> PodBuilder:
        """An init container (run in the order added); a sidecar keeps running."""
        added = Container(f"i{len(self.init_containers)}", requests=requests,
                          restart_policy="Always" if sidecar else None)
        return replace(self, init_containers=(*self.init_containers, added))

    def with_spec(self, **spec: Any) -> PodBuilder:
        """Other spec fields as they are (overhead, priority, affinity, nodeSelector, ...)."""
        return replace(self, extra_spec={**self.extra_spec, **spec})

    def on_node(self, node: str) -> PodBuilder:
        """Bound directly to `node`, bypassing the scheduler (as unmanaged pods may be)."""
        return replace(self, node=node)

    def tolerating_kwok_nodes(self) -> PodBuilder:
        return replace(self, tolerations=(
            *self.tolerations, {"key": KWOK_NODE_ANNOTATION, "operator": "Exists"}))

    def tolerating(self, **toleration: str) -> PodBuilder:
        """A toleration as the API spells it: tolerating(key=..., operator="Exists", ...)."""
        return replace(self, tolerations=(*self.tolerations, dict(toleration)))

    def never_restarted(self) -> PodBuilder:
        return replace(self, restart_policy="Never")

    def completing_after(self, duration: str, *, failing: bool = False) -> PodBuilder:
        """kwok ends the pod `duration` after it starts running: Succeeded, or Failed."""
        ending = {COMPLETE_ANNOTATION: duration, **({FAIL_ANNOTATION: "true"} if failing else {})}
        return self.annotated(ending)

    # ------------------------------------------------------------ as read back (obj() only)

    def in_phase(self, phase: str) -> PodBuilder:
        return replace(self, phase=phase)

    def with_status(self, **status: Any) -> PodBuilder:
        """Other status fields as they are, e.g. with_status(conditions=[...])."""
        return replace(self, status={**self.status, **status})

    def being_deleted(self) -> PodBuilder:
        return replace(self, deleting=True)

    def at_version(self, resource_version: str) -> PodBuilder:
        return replace(self, resource_version=resource_version)

    # ------------------------------------------------------------ built

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "containers": [c.manifest() for c in self.containers],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
        }
        if self.init_containers:
            spec["initContainers"] = [c.manifest() for c in self.init_containers]
        if self.gates is not None:
            spec["schedulingGates"] = [{"name": gate} for gate in self.gates]
        if self.node:
            spec["nodeName"] = self.node
        if self.tolerations:
            spec["tolerations"] = [dict(t) for t in self.tolerations]
        if self.restart_policy:
            spec["restartPolicy"] = self.restart_policy
        return {**spec, **self.extra_spec}

    def metadata(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name}
        if self.namespace:
            metadata["namespace"] = self.namespace
        if self.labels is not None:
            metadata["labels"] = dict(self.labels)
        if self.annotations is not None:
            metadata["annotations"] = dict(self.annotations)
        if self.owners:
            metadata["ownerReferences"] = [dict(o) for o in self.owners]
        return metadata

    def manifest(self) -> dict[str, Any]:
        """What a test creates through the API."""
        return {"apiVersion": "v1", "kind": "Pod", "metadata": self.metadata(),
                "spec": self.spec()}

    def obj(self) -> dict[str, Any]:
        """The pod as the apiserver returns it (JSON), for code that reads pods."""
        metadata = {**self.metadata(), "uid": self.uid or f"uid-{self.name}",
                    "creationTimestamp": CREATED_AT, "resourceVersion": self.resource_version}
        if self.deleting:
            metadata["deletionTimestamp"] = DELETING_SINCE
        status = {"phase": self.phase, **self.status}
        return {**self.manifest(), "metadata": metadata, "status": status}

    def template(self) -> dict[str, Any]:
        """As a controller's pod template: its labels and spec (no name, no namespace)."""
        metadata: dict[str, Any] = {"labels": dict(self.labels or {})}
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        return {"metadata": metadata, "spec": self.spec()}


def a_pod(name: str) -> PodBuilder:
    return PodBuilder(name)


@dataclass(frozen=True)
class DeploymentBuilder:
    """A Deployment selecting its pods by `app=<name>`."""

    name: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    replicas: int = 1
    pod: PodBuilder = field(default_factory=lambda: PodBuilder("unused"))

    def in_namespace(self, namespace: str) -> DeploymentBuilder:
        return replace(self, namespace=namespace)

    def labelled(self, labels: Mapping[str, str]) -> DeploymentBuilder:
        return replace(self, labels={**self.labels, **labels})

    def with_replicas(self, replicas: int) -> DeploymentBuilder:
        return replace(self, replicas=replicas)

    def of(self, pod: PodBuilder) -> DeploymentBuilder:
        """Replicas made from `pod`: its labels, annotations and spec (not its name)."""
        return replace(self, pod=pod)

    def manifest(self) -> dict[str, Any]:
        selector = {"app": self.name}
        template = self.pod.labelled(selector).template()
        metadata: dict[str, Any] = {"name": self.name, "labels": dict(self.labels)}
        if self.namespace:
            metadata["namespace"] = self.namespace
        return {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
            "spec": {"replicas": self.replicas, "selector": {"matchLabels": selector},
                     "template": template},
        }


def a_deployment(name: str) -> DeploymentBuilder:
    return DeploymentBuilder(name)
