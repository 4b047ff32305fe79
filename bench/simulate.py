"""`make simulate`: run fleet scenarios through the real scheduler (devstack.fleet_sim).

    python bench/simulate.py [SCENARIO.yaml ...] [--scale S] [--seed N] [--out DIR]

With no scenario, runs every bench/scenarios/*.yaml at the scale its file gives. Prints one JSON
line per scenario (round p50/p99, memory per job held, utilisation of contested clusters, the
deviation from the independent model's fair allocation, and a verdict per target; with
autoscaled clusters, scenario (d), the NodeClaims made against the fewest nodes the fair
allocation needs, `nodes_provisioned` / `nodes_fewest` / `nodes_provisioned_ratio`; with a
queue tree, scenario (e), the deviation per level of the tree and the guarantee's reclaim time,
`deviation_by_level_saturated_pods`, `guarantee_reclaim_seconds`) and writes
a PNG per scenario to DIR (default bench/results). Exits 1 if a scenario missed a target it is
judged on (targets are judged at scale 1 only), 2 on a scenario file it cannot read.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from devstack.fleet_sim import Scenario, ScenarioError, plot, simulate

SCENARIOS = Path(__file__).resolve().parent / "scenarios"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path)
    parser.add_argument("--scale", type=float, default=None,
                        help="override every scenario's scale (1: the full fleet)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    paths = args.scenarios or sorted(SCENARIOS.glob("*.yaml"))
    if len(paths) > 1:
        # One process per scenario: memory is read from the process's peak RSS.
        passed = [a for a in (argv if argv is not None else sys.argv[1:])
                  if Path(a) not in paths]
        codes = [subprocess.run([sys.executable, __file__, str(path), *passed],
                                check=False).returncode for path in paths]
        return max(codes)
    missed: list[str] = []
    for path in paths:
        try:
            scenario = Scenario.load(path)
            scenario = scenario.scaled(args.scale if args.scale is not None else scenario.scale)
        except ScenarioError as error:
            print(f"simulate: {error}", file=sys.stderr)
            return 2
        report = simulate(scenario, seed=args.seed,
                          progress=lambda line: print(line, file=sys.stderr, flush=True))
        summary = report.summary()
        summary["plot"] = str(plot(report, args.out))
        print(json.dumps(summary), flush=True)
        missed += [f"{scenario.name}: {name}" for name in report.missed]
    if missed:
        print("simulate: targets missed: " + "; ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
