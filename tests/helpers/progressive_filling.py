"""An independent model of one fair-scheduling round, for judging the real scheduler from outside.

Why it exists: the end-to-end fairness test compares what lockgate released against what dominant
resource fairness says it should have released. That verdict must not come from the code under
test, so this is written from the semantics alone (docs/scheduling.md, Armada's DRF), and shares
no code with `lockgate.scheduler`. It is small and slow on purpose
(quadratic in pods): it only has to be obviously right for a few hundred pods.

The semantics, step by step (progressive filling, as Armada runs it):
- A queue's *share* is the largest, over the fairness resources, of what it holds divided by the
  pool's total (allocatable of every node of every cluster); its *cost* is share / weight.
- Each queue offers its pods in its own release order (priority, then age: the caller's order).
- At each step every queue names its next pod, and the queue whose cost *after* taking that pod
  is lowest goes (equal costs: the queue whose name sorts first). The pod goes on the first node,
  in name order, of its own cluster that has room for all of it.
- If no node there has room, the pod is passed over for the round, and so is every later pod
  asking for exactly the same in the same cluster (Armada's "unfeasible scheduling key"): room
  only shrinks during a round. A queue's next pod is never one of those kinds.
- The round ends when no queue has a pod left to offer.

A queue is ranked by its next pod even when that pod no longer fits (it learns so only when it
is tried); a max-min ideal that looked ahead would rank it by its next pod that fits. The two
can differ by a few pods at the end of a round when a queue's pods of different sizes arrive in
the same instant; docs/scheduling.md says which one lockgate runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

FAIRNESS_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")
# Costs closer than this are equal: weights like 1/3 make the same cost differ in the last bit.
_COST_EPSILON = 1e-12


@dataclass(frozen=True)
class Node:
    """A node as a round sees it: `allocatable` counts towards the pool, `used` is taken already
    (by pods the scheduler does not manage)."""

    name: str
    cluster: str
    allocatable: Mapping[str, int]
    used: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Pod:
    """A waiting pod; `shape` names its kind of request, for counting (e.g. "small")."""

    name: str
    queue: str
    cluster: str
    requests: Mapping[str, int]
    shape: str = ""


@dataclass(frozen=True)
class Filling:
    """Where the round put each pod it released, and the queues' dominant shares after it."""

    placed: Mapping[str, str]  # pod name -> node name, in release order
    released: Mapping[str, Counter[str]]  # queue -> shape -> pods released
    shares: Mapping[str, float]  # queue -> dominant share of the pool
    free: Mapping[str, Mapping[str, int]]  # node name -> room left
    passed_over: tuple[str, ...] = ()  # pods tried that no node had room for, in order


def progressive_filling(
    *,
    weights: Mapping[str, float],
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    resources: Sequence[str] = FAIRNESS_RESOURCES,
) -> Filling:
    """Fill the nodes with `pods` (each queue's in its release order) by DRF progressive filling.

    `weights` holds every queue that may release; pods of other queues are an error.
    """
    unknown = {pod.queue for pod in pods} - set(weights)
    if unknown:
        raise ValueError(f"pods of queues without a weight: {sorted(unknown)}")
    if any(weight <= 0 for weight in weights.values()):
        raise ValueError(f"weights must be positive: {dict(weights)}")
    total = {r: sum(node.allocatable.get(r, 0) for node in nodes) for r in resources}
    free = {node.name: _minus(node.allocatable, node.used) for node in nodes}
    in_cluster: dict[str, list[str]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        in_cluster.setdefault(node.cluster, []).append(node.name)
    held = {queue: dict.fromkeys(resources, 0) for queue in weights}
    waiting = {queue: [pod for pod in pods if pod.queue == queue] for queue in weights}
    placed: dict[str, str] = {}
    passed_over: list[str] = []  # tried, and no node had room
    unfeasible: set[tuple[str, frozenset[tuple[str, int]]]] = set()  # (cluster, requests)
    released = {queue: Counter[str]() for queue in weights}

    def first_node_with_room(pod: Pod) -> str | None:
        return next((name for name in in_cluster.get(pod.cluster, ())
                     if _fits(pod.requests, free[name])), None)

    def cost_after(queue: str, pod: Pod) -> float:
        share = max((held[queue][r] + pod.requests.get(r, 0)) / total[r]
                    for r in resources if total[r] > 0)
        return share / weights[queue]

    while True:
        offers: list[tuple[float, str, Pod]] = []
        for queue, line in waiting.items():
            while line and _kind(line[0]) in unfeasible:
                line.pop(0)
            if line:
                offers.append((cost_after(queue, line[0]), queue, line[0]))
        if not offers:
            break
        lowest = min(cost for cost, _, _ in offers)
        _, queue, pod = min((o for o in offers if o[0] <= lowest + _COST_EPSILON),
                            key=lambda o: o[1])
        waiting[queue].pop(0)
        node = first_node_with_room(pod)
        if node is None:
            unfeasible.add(_kind(pod))
            passed_over.append(pod.name)
            continue
        free[node] = _minus(free[node], pod.requests)
        for r in resources:
            held[queue][r] += pod.requests.get(r, 0)
        placed[pod.name] = node
        released[queue][pod.shape] += 1

    shares = {queue: max((held[queue][r] / total[r] for r in resources if total[r] > 0),
                         default=0.0) for queue in weights}
    return Filling(placed=placed, released=released, shares=shares, free=free,
                   passed_over=tuple(passed_over))


def _kind(pod: Pod) -> tuple[str, frozenset[tuple[str, int]]]:
    return pod.cluster, frozenset(pod.requests.items())


def _fits(requests: Mapping[str, int], room: Mapping[str, int]) -> bool:
    return all(amount <= room.get(resource, 0) for resource, amount in requests.items())


def _minus(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    result = dict(a)
    for resource, amount in b.items():
        result[resource] = result.get(resource, 0) - amount
    return result
