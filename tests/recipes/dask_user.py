"""A Dask user's side of docs/integrations/dask.md, with dask-kubernetes' own code: run with the
recipes' clients python and KUBECONFIG set to the coordinator's kubeconfig of a lockgate
ephemeral namespace (`lockgate namespace create ... --kubeconfig-out`), its only credentials.

    python dask_user.py create NAME --workers 2 --max-workers 4 [--cpu 1] [--memory 256Mi]
                               [--node-selector k=v] [--toleration k=v]
    python dask_user.py scale NAME N          # what KubeCluster.scale(N) does
    python dask_user.py adapt NAME MIN MAX    # what KubeCluster.adapt(MIN, MAX) does
    python dask_user.py delete NAME           # what KubeCluster.close() does

Why not `KubeCluster(custom_cluster_spec=spec)` itself: after creating the DaskCluster it waits
for the scheduler to answer (port-forwarding to it from outside the cluster), and on kwok no
process runs, so it would wait for ever. These commands are the calls it makes up to there
(make_cluster_spec, DaskCluster(...).create()) and the ones its scale/adapt/close make.
Each prints what it did as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import kr8s
from dask_kubernetes.operator import make_cluster_spec
from dask_kubernetes.operator._objects import DaskAutoscaler, DaskCluster, DaskWorkerGroup

GROUP_LABEL = "lockgate.io/group"
GROUP_MIN = "lockgate.io/group-min-size"
GROUP_MAX = "lockgate.io/group-max-size"


def lockgate_cluster_spec(name: str, *, workers: int, max_workers: int, cpu: str, memory: str,
                          node_selector: dict[str, str],
                          tolerations: list[dict[str, str]]) -> dict[str, Any]:
    """dask-kubernetes' own DaskCluster spec, with lockgate's elastic group on its metadata:
    the operator copies the DaskCluster's labels and annotations onto the scheduler's pod and,
    through the default DaskWorkerGroup, onto every worker's. The group's minimum is the
    scheduler and the initial workers; its maximum the scheduler and the most workers."""
    resources = {"requests": {"cpu": cpu, "memory": memory},
                 "limits": {"cpu": cpu, "memory": memory}}
    spec: dict[str, Any] = make_cluster_spec(name=name, n_workers=workers, resources=resources)
    spec["metadata"]["labels"] = {GROUP_LABEL: name}
    spec["metadata"]["annotations"] = {GROUP_MIN: str(1 + workers),
                                       GROUP_MAX: str(1 + max_workers)}
    for part in (spec["spec"]["scheduler"], spec["spec"]["worker"]):
        if node_selector:
            part["spec"]["nodeSelector"] = node_selector
        if tolerations:
            part["spec"]["tolerations"] = tolerations
    return spec


def pairs(values: list[str]) -> dict[str, str]:
    return dict(value.split("=", 1) for value in values)


async def namespace() -> str:
    api = await kr8s.asyncio.api()  # the kubeconfig's context namespace: the coordinator's
    return str(api.namespace)


async def create(args: argparse.Namespace) -> dict[str, Any]:
    spec = lockgate_cluster_spec(
        args.name, workers=args.workers, max_workers=args.max_workers, cpu=args.cpu,
        memory=args.memory, node_selector=pairs(args.node_selector),
        tolerations=[{"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}
                     for key, value in pairs(args.toleration).items()])
    cluster = await DaskCluster(spec, namespace=await namespace())
    await cluster.create()  # as KubeCluster._create_cluster does
    return {"created": cluster.name, "namespace": cluster.namespace,
            "labels": spec["metadata"]["labels"],
            "annotations": spec["metadata"]["annotations"]}


async def scale(args: argparse.Namespace) -> dict[str, Any]:
    where = await namespace()
    # KubeCluster._scale: turn adaptivity off, then scale the default worker group.
    try:
        autoscaler = await DaskAutoscaler.get(args.name, namespace=where)
        await autoscaler.delete()
    except kr8s.NotFoundError:
        pass
    group = await DaskWorkerGroup(f"{args.name}-default", namespace=where)
    await group.scale(args.workers)
    return {"scaled": group.name, "replicas": args.workers}


async def adapt(args: argparse.Namespace) -> dict[str, Any]:
    where = await namespace()
    # KubeCluster._adapt: a DaskAutoscaler the operator adopts and follows.
    autoscaler = await DaskAutoscaler({
        "apiVersion": "kubernetes.dask.org/v1", "kind": "DaskAutoscaler",
        "metadata": {"name": args.name},
        "spec": {"cluster": args.name, "minimum": args.minimum, "maximum": args.maximum}},
        namespace=where)
    try:
        await autoscaler.patch({"spec": {"minimum": args.minimum, "maximum": args.maximum}})
    except kr8s.NotFoundError:
        await autoscaler.create()
    return {"adapt": args.name, "minimum": args.minimum, "maximum": args.maximum}


async def delete(args: argparse.Namespace) -> dict[str, Any]:
    cluster = await DaskCluster.get(args.name, namespace=await namespace())
    await cluster.delete()  # KubeCluster._close with shutdown_on_close
    return {"deleted": args.name}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("create")
    made.add_argument("name")
    made.add_argument("--workers", type=int, required=True)
    made.add_argument("--max-workers", type=int, required=True)
    made.add_argument("--cpu", default="1")
    made.add_argument("--memory", default="256Mi")
    made.add_argument("--node-selector", action="append", default=[])
    made.add_argument("--toleration", action="append", default=[])
    scaled = commands.add_parser("scale")
    scaled.add_argument("name")
    scaled.add_argument("workers", type=int)
    adapted = commands.add_parser("adapt")
    adapted.add_argument("name")
    adapted.add_argument("minimum", type=int)
    adapted.add_argument("maximum", type=int)
    deleted = commands.add_parser("delete")
    deleted.add_argument("name")
    args = parser.parse_args()
    action = {"create": create, "scale": scale, "adapt": adapt, "delete": delete}[args.command]
    print(json.dumps(asyncio.run(action(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
