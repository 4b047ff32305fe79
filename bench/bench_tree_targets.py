"""Hierarchical fair targets at fleet scale: `hierarchical_fair_targets` for a three-level tree
(10 organisations, 100 teams, LEAVES users) over 50 clusters, every leaf asking in 4 clusters
(hot clusters more often), a third of the organisations with a guarantee; beside `fair_targets`
for the same leaves as flat queues, measured in the same run, in CPU seconds of this process.

    PYTHONPATH=libs python bench/bench_tree_targets.py [--leaves 1000] [--seed 5]
"""

from __future__ import annotations

import argparse
import json
import random
import time

from lockgate.queue_tree import QueueTree, TreeNode
from lockgate.scheduler.targets import Demand, NodeGroup, fair_targets, hierarchical_fair_targets

CLUSTERS = 50
CLUSTER_CPU = 4_800_000.0  # millicores


def fleet(rng: random.Random, leaves: int) -> tuple[QueueTree, list[NodeGroup], list[Demand]]:
    nodes: list[TreeNode] = []
    for org in range(10):
        nodes.append(TreeNode(f"org{org}", weight=rng.choice([1, 2, 3]),
                              guarantee={"cpu": 100_000.0} if org % 3 == 0 else {}))
        for team in range(10):
            nodes.append(TreeNode(f"team{org}-{team}", parent=f"org{org}",
                                  weight=rng.choice([1, 2])))
            nodes += [TreeNode(f"u{org}-{team}-{user}", parent=f"team{org}-{team}")
                      for user in range(max(1, leaves // 100))]
    tree = QueueTree.build(nodes)
    groups = [NodeGroup(f"c{i}", "all", {"cpu": CLUSTER_CPU}) for i in range(CLUSTERS)]
    demands = []
    for leaf in tree.leaves:
        for cluster in rng.sample(range(CLUSTERS), 4):
            cluster = min(cluster, rng.randint(0, CLUSTERS - 1))  # hot: low numbers
            demands.append(Demand(leaf, f"c{cluster}",
                                  {"cpu": round(rng.expovariate(1 / 300_000.0)) + 1000.0}))
    return tree, groups, demands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    tree, groups, demands = fleet(random.Random(args.seed), args.leaves)
    started = time.process_time()
    flat = fair_targets(groups=groups, weights=dict.fromkeys(tree.leaves, 1.0), demands=demands)
    flat_seconds = time.process_time() - started
    started = time.process_time()
    hierarchical = hierarchical_fair_targets(tree=tree, groups=groups, demands=demands)
    tree_seconds = time.process_time() - started
    print(json.dumps({"leaves": len(tree.leaves), "demands": len(demands),
                      "flat_cpu_seconds": round(flat_seconds, 3), "flat_steps": flat.levels,
                      "tree_cpu_seconds": round(tree_seconds, 3),
                      "tree_steps": hierarchical.levels}))


if __name__ == "__main__":
    main()
