"""Karpenter `karpenter.sh/v1` NodePools and NodeClaims as the apiserver returns them.

Shaped after what Karpenter v1.13.0 writes (its kwok provider's objects, read from a cluster):
defaults filled in by the CRD, conditions set by operatorpkg's condition sets, the labels and
annotations Karpenter adds. Builders read like sentences:
`a_node_pool("default").limited_to(cpu="64").using(cpu="8").ready().obj()`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

CREATED = "2026-12-07T12:00:00Z"


def _condition(kind: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason or kind, "message": message,
            "lastTransitionTime": CREATED, "observedGeneration": 1}


@dataclass(frozen=True)
class NodePoolBuilder:
    body: dict[str, Any] = field(default_factory=dict)

    def _with(self, change: Any) -> NodePoolBuilder:
        body = copy.deepcopy(self.body)
        change(body)
        return NodePoolBuilder(body)

    def limited_to(self, **limits: str) -> NodePoolBuilder:
        return self._with(lambda b: b["spec"].__setitem__("limits", dict(limits)))

    def using(self, **resources: str) -> NodePoolBuilder:
        return self._with(lambda b: b.setdefault("status", {}).__setitem__(
            "resources", dict(resources)))

    def weighing(self, weight: int) -> NodePoolBuilder:
        return self._with(lambda b: b["spec"].__setitem__("weight", weight))

    def requiring(self, key: str, operator: str, *values: str) -> NodePoolBuilder:
        item: dict[str, Any] = {"key": key, "operator": operator}
        if values:
            item["values"] = list(values)
        return self._with(lambda b: b["spec"]["template"]["spec"]["requirements"].append(item))

    def labelling(self, **labels: str) -> NodePoolBuilder:
        return self._with(lambda b: b["spec"]["template"].setdefault("metadata", {}).setdefault(
            "labels", {}).update(labels))

    def tainting(self, key: str, effect: str, value: str = "") -> NodePoolBuilder:
        taint = {"key": key, "effect": effect, **({"value": value} if value else {})}
        return self._with(lambda b: b["spec"]["template"]["spec"].setdefault(
            "taints", []).append(taint))

    def with_startup_taint(self, key: str, effect: str) -> NodePoolBuilder:
        return self._with(lambda b: b["spec"]["template"]["spec"].setdefault(
            "startupTaints", []).append({"key": key, "effect": effect}))

    def ready(self) -> NodePoolBuilder:
        return self._conditions([_condition("ValidationSucceeded", "True"),
                                 _condition("NodeClassReady", "True"),
                                 _condition("NodeRegistrationHealthy", "Unknown",
                                            "AwaitingReconciliation",
                                            "object is awaiting reconciliation"),
                                 _condition("Ready", "True")])

    def not_ready(self, reason: str, message: str) -> NodePoolBuilder:
        return self._conditions([_condition("ValidationSucceeded", "True"),
                                 _condition("NodeClassReady", "False", reason, message),
                                 _condition("Ready", "False", "UnhealthyDependents",
                                            "NodeClassReady=False")])

    def reconciling(self) -> NodePoolBuilder:
        """Ready Unknown while a dependent is: a pool Karpenter is still looking at."""
        return self._conditions([_condition("ValidationSucceeded", "True"),
                                 _condition("NodeClassReady", "Unknown",
                                            "AwaitingReconciliation",
                                            "object is awaiting reconciliation"),
                                 _condition("Ready", "Unknown", "ReconcilingDependents",
                                            "NodeClassReady=Unknown")])

    def static(self, replicas: int) -> NodePoolBuilder:
        return self._with(lambda b: b["spec"].__setitem__("replicas", replicas))

    def being_deleted(self) -> NodePoolBuilder:
        return self._with(lambda b: b["metadata"].update(
            {"deletionTimestamp": "2026-12-07T12:05:00Z",
             "finalizers": ["karpenter.sh/termination"]}))

    def _conditions(self, conditions: list[dict[str, Any]]) -> NodePoolBuilder:
        return self._with(lambda b: b.setdefault("status", {}).__setitem__(
            "conditions", conditions))

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self.body)


def a_node_pool(name: str) -> NodePoolBuilder:
    """A NodePool as `kubectl apply` of Karpenter's kwok example leaves it, before Karpenter
    reconciled it (no status yet)."""
    return NodePoolBuilder({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": name, "uid": f"uid-{name}", "generation": 1,
                     "resourceVersion": "1001", "creationTimestamp": CREATED,
                     "annotations": {"karpenter.sh/nodepool-hash": "6821555240594823858",
                                     "karpenter.sh/nodepool-hash-version": "v3"}},
        "spec": {
            "disruption": {"budgets": [{"nodes": "10%"}], "consolidateAfter": "0s",
                           "consolidationPolicy": "WhenEmptyOrUnderutilized"},
            "template": {"spec": {
                "expireAfter": "720h",
                "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                                 "name": "default"},
                "requirements": [],
            }},
        },
    })


@dataclass(frozen=True)
class NodeClaimBuilder:
    body: dict[str, Any] = field(default_factory=dict)

    def _with(self, change: Any) -> NodeClaimBuilder:
        body = copy.deepcopy(self.body)
        change(body)
        return NodeClaimBuilder(body)

    def launched(self, **allocatable: str) -> NodeClaimBuilder:
        def change(b: dict[str, Any]) -> None:
            status = b.setdefault("status", {})
            status.update({"providerID": f"kwok://{b['metadata']['name']}",
                           "imageID": "", "capacity": dict(allocatable),
                           "allocatable": dict(allocatable)})
            self._set(status, _condition("Launched", "True"))
        return self._with(change)

    def registered(self, node: str) -> NodeClaimBuilder:
        def change(b: dict[str, Any]) -> None:
            b["status"]["nodeName"] = node
            self._set(b["status"], _condition("Registered", "True"))
        return self._with(change)

    def initialized(self) -> NodeClaimBuilder:
        return self._with(lambda b: (self._set(b["status"], _condition("Initialized", "True")),
                                     self._set(b["status"], _condition("Ready", "True"))))

    def condition(self, kind: str, status: str, reason: str, message: str) -> NodeClaimBuilder:
        return self._with(lambda b: self._set(b.setdefault("status", {}),
                                              _condition(kind, status, reason, message)))

    def being_deleted(self) -> NodeClaimBuilder:
        return self._with(lambda b: b["metadata"].__setitem__(
            "deletionTimestamp", "2026-12-07T12:06:00Z"))

    def with_last_pod_event(self, at: str) -> NodeClaimBuilder:
        return self._with(lambda b: b.setdefault("status", {}).__setitem__(
            "lastPodEventTime", at))

    @staticmethod
    def _set(status: dict[str, Any], condition: dict[str, Any]) -> None:
        conditions = [c for c in status.setdefault("conditions", [])
                      if c["type"] != condition["type"]]
        status["conditions"] = [*conditions, condition]

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self.body)


def a_node_claim(name: str, pool: str) -> NodeClaimBuilder:
    """A NodeClaim as Karpenter's provisioner creates it, its lifecycle conditions still
    awaiting reconciliation."""
    waiting = [_condition(kind, "Unknown", "AwaitingReconciliation",
                          "object is awaiting reconciliation")
               for kind in ("Launched", "Registered", "Initialized", "Ready")]
    return NodeClaimBuilder({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {
            "name": name, "uid": f"uid-{name}", "generation": 1, "resourceVersion": "2002",
            "creationTimestamp": "2026-12-07T12:01:30Z",
            "finalizers": ["karpenter.sh/termination"],
            "labels": {"karpenter.sh/nodepool": pool, "karpenter.sh/capacity-type": "on-demand",
                       "kubernetes.io/arch": "amd64",
                       "node.kubernetes.io/instance-type": "c-4x-amd64-linux",
                       "topology.kubernetes.io/zone": "test-zone-a"},
            "annotations": {"karpenter.sh/nodepool-hash": "6821555240594823858",
                            "karpenter.sh/nodepool-hash-version": "v3"},
            "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                                 "name": pool, "uid": f"uid-{pool}",
                                 "blockOwnerDeletion": True}],
        },
        "spec": {
            "expireAfter": "720h",
            "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                             "name": "default"},
            "requirements": [{"key": "karpenter.sh/nodepool", "operator": "In",
                              "values": [pool]},
                             {"key": "node.kubernetes.io/instance-type", "operator": "In",
                              "values": ["c-4x-amd64-linux", "c-8x-amd64-linux"]}],
            "resources": {"requests": {"cpu": "3500m", "memory": "1Gi", "pods": "5"}},
        },
        "status": {"conditions": waiting},
    })
