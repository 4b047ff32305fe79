"""Fair targets at fleet scale: `fair_targets` for 1,000 queues over 50 clusters.

Three fleets, each beside a baseline measured in the same run (the pool-wide adjusted fair
shares of the same queues, the computation the targets replace):
- pinned: every queue asks in one cluster, most queues in a few hot ones (the network falls
  apart into one part per cluster);
- flexible: every queue may run in 3 random clusters, everything contested (one network);
- incremental: the pinned fleet with one queue's demand changed, as the state sees it between
  two rounds (the state keeps the last result while only amounts change, for
  LOCKGATE_SCHEDULER_TARGETS_MAX_AGE_SECONDS; this is what a recomputation costs when it does
  run).
"""

from __future__ import annotations

import argparse
import json
import random
import time

from lockgate.scheduler.costs import adjusted_fair_shares
from lockgate.scheduler.targets import Demand, NodeGroup, fair_targets

NODES_PER_CLUSTER = 400
NODE_CPU = 64_000  # millicores
NODE_MEMORY = 256 * 2**30


def fleet(rng: random.Random, queues: int, clusters: int, spread: int
          ) -> tuple[list[NodeGroup], dict[str, float], list[Demand]]:
    groups = [NodeGroup(f"c{i:02d}", "all", {"cpu": float(NODES_PER_CLUSTER * NODE_CPU),
                                              "memory": float(NODES_PER_CLUSTER * NODE_MEMORY)})
              for i in range(clusters)]
    weights = {f"q{i:04d}": rng.choice((0.5, 1.0, 1.0, 2.0)) for i in range(queues)}
    demands = []
    for name in weights:
        where = (rng.sample(range(clusters), spread) if spread
                 else [min(int(rng.expovariate(0.15)), clusters - 1)])
        for cluster in where:
            cpu = rng.randint(1, 2000) * 80_000.0
            demands.append(Demand(name, f"c{cluster:02d}", {"cpu": cpu, "memory": cpu * 4e6},
                                  held={"cpu": cpu / 2, "memory": cpu * 2e6}))
    return groups, weights, demands


def timed(groups: list[NodeGroup], weights: dict[str, float], demands: list[Demand]
          ) -> tuple[float, int]:
    started = time.perf_counter()
    result = fair_targets(groups=groups, weights=weights, demands=demands)
    return time.perf_counter() - started, result.levels


def baseline(weights: dict[str, float], demands: list[Demand]) -> float:
    total = sum(d.amount["cpu"] for d in demands) or 1.0
    asked: dict[str, float] = {}
    for d in demands:
        asked[d.queue] = asked.get(d.queue, 0.0) + d.amount["cpu"] / total
    started = time.perf_counter()
    adjusted_fair_shares(weights, asked)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=1_000)
    parser.add_argument("--clusters", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for name, spread in (("pinned", 0), ("flexible", 3)):
        groups, weights, demands = fleet(rng, args.queues, args.clusters, spread)
        seconds, levels = timed(groups, weights, demands)
        base = baseline(weights, demands)
        print(json.dumps({"name": f"targets_{name}", "queues": args.queues,
                          "clusters": args.clusters, "demands": len(demands),
                          "seconds": round(seconds, 4), "filling_steps": levels,
                          "baseline_adjusted_fair_shares_seconds": round(base, 6),
                          "ratio_to_baseline": round(seconds / base, 1) if base else None}),
              flush=True)
        if name == "pinned":
            changed = list(demands)
            first = changed[0]
            changed[0] = Demand(first.queue, first.cluster,
                                {k: v * 1.01 for k, v in first.amount.items()}, first.held)
            seconds, levels = timed(groups, weights, changed)
            print(json.dumps({"name": "targets_pinned_recomputed", "seconds": round(seconds, 4),
                              "filling_steps": levels}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
