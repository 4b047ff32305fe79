"""KubeRay's operator (ray-operator), built once from the Go module proxy into the cache, with
its CRDs beside it (RayCluster, and the RayJob and RayService kinds it also watches), for the
Ray recipe's test (tests/e2e/test_recipe_ray.py) and for you: `python -m devstack.kuberay`
builds it and prints the directory.

Why build it: no release binary or image can be downloaded here, and the operator is a Go
module (`go install github.com/ray-project/kuberay/ray-operator@<version>`: its go.mod has no
replace directive, so a plain `go install` works). A cold build took 8.8 minutes on 2
busy cores; `make test` runs it before the stack tests, so no test's time limit covers it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from devstack.config import Settings
from devstack.gobuild import GoTool, ensure_go_tool

KUBERAY_VERSION = os.environ.get("LOCKGATE_KUBERAY_VERSION", "v1.5.0")
MODULE = "github.com/ray-project/kuberay/ray-operator"
CRDS_IN_MODULE = Path("config") / "crd" / "bases"
OPERATOR = "ray-operator"
CRD = "ray.io_rayclusters.yaml"
# The operator also starts its RayJob and RayService controllers, which wait for their kinds
# and stop the operator if the apiserver never serves them: all three CRDs are kept.
CRDS = (CRD, "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")
TOOL = GoTool(
    title=f"KubeRay's ray-operator {KUBERAY_VERSION}", module=MODULE, version=KUBERAY_VERSION,
    package="", binary=OPERATOR, files=tuple((str(CRDS_IN_MODULE / crd), crd) for crd in CRDS),
    cold_build="about 9 minutes on 2 cores")


def kuberay_dir(settings: Settings | None = None) -> Path:
    return (settings or Settings.from_env()).cache_dir / "tools" / f"kuberay-{KUBERAY_VERSION}"


def kuberay_ready(home: Path) -> bool:
    return TOOL.ready(home)


def ensure_kuberay(settings: Settings | None = None,
                   say: Callable[[str], None] = print) -> tuple[Path, float]:
    """The directory holding `ray-operator` and `ray.io_rayclusters.yaml`, built first if
    missing; and the seconds that took (0 when cached)."""
    settings = settings or Settings.from_env()
    return ensure_go_tool(TOOL, kuberay_dir(settings),
                          settings.cache_logs_dir / f"kuberay-build-{KUBERAY_VERSION}.log", say)


if __name__ == "__main__":
    where, _ = ensure_kuberay(say=lambda text: print(text, file=sys.stderr, flush=True))
    print(where)
