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

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from devstack.config import Settings
from devstack.errors import StackError
from devstack.gobuild import find_go
from devstack.procs import tail

KUBERAY_VERSION = os.environ.get("LOCKGATE_KUBERAY_VERSION", "v1.5.0")
MODULE = "github.com/ray-project/kuberay/ray-operator"
CRDS_IN_MODULE = Path("config") / "crd" / "bases"
OPERATOR = "ray-operator"
CRD = "ray.io_rayclusters.yaml"
# The operator also starts its RayJob and RayService controllers, which wait for their kinds
# and stop the operator if the apiserver never serves them: all three CRDs are kept.
CRDS = (CRD, "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")


def kuberay_dir(settings: Settings | None = None) -> Path:
    return (settings or Settings.from_env()).cache_dir / "tools" / f"kuberay-{KUBERAY_VERSION}"


def kuberay_ready(home: Path) -> bool:
    return ((home / ".complete").exists() and os.access(home / OPERATOR, os.X_OK)
            and all((home / crd).is_file() for crd in CRDS))


def ensure_kuberay(settings: Settings | None = None,
                   say: Callable[[str], None] = print) -> tuple[Path, float]:
    """The directory holding `ray-operator` and `ray.io_rayclusters.yaml`, built first if
    missing; and the seconds that took (0 when cached)."""
    settings = settings or Settings.from_env()
    home = kuberay_dir(settings)
    started = time.monotonic()
    if kuberay_ready(home):
        return home, 0.0
    home.parent.mkdir(parents=True, exist_ok=True)
    log = settings.cache_logs_dir / f"kuberay-build-{KUBERAY_VERSION}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build; a second caller waits and reuses it
        if kuberay_ready(home):
            return home, time.monotonic() - started
        go = find_go()
        if go is None:
            raise StackError(f"Go is missing: KubeRay's operator {KUBERAY_VERSION} is built from "
                             "its Go module (its go.mod names Go 1.24; Go >= 1.25 as for the "
                             "stack). Install Go and put its bin dir on PATH.")
        say(f"building KubeRay's ray-operator {KUBERAY_VERSION} from the Go module proxy into "
            f"{home} (cold: about 9 minutes on 2 cores); log {log}")
        shutil.rmtree(home, ignore_errors=True)
        build = home.with_name(home.name + ".build")
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir()
        # GOTOOLCHAIN=local: fail clearly rather than download another Go toolchain.
        env = {**os.environ, "PATH": f"{Path(go).parent}:{os.environ.get('PATH', '')}",
               "GOBIN": str(build), "GOTOOLCHAIN": "local", "CGO_ENABLED": "0",
               "GOFLAGS": "-trimpath"}
        with open(log, "ab") as out:
            code = subprocess.call(["nice", "-n", "10", go, "install", "-ldflags", "-s -w",
                                    f"{MODULE}@{KUBERAY_VERSION}"], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        if code != 0 or not os.access(build / OPERATOR, os.X_OK):
            raise StackError(f"building KubeRay {KUBERAY_VERSION} failed (exit {code}); log "
                             f"{log}:\n{tail(log)}")
        # The module `go install` just downloaded holds the CRD; ask go where it is.
        found = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{KUBERAY_VERSION}"],
                               capture_output=True, text=True, env=env, timeout=300,
                               check=False)
        if found.returncode != 0:
            raise StackError(f"cannot locate {MODULE}@{KUBERAY_VERSION} in the module cache: "
                             f"{found.stdout}{found.stderr}")
        bases = Path(json.loads(found.stdout)["Dir"]) / CRDS_IN_MODULE
        for crd in CRDS:
            if not (bases / crd).is_file():
                raise StackError(f"KubeRay {KUBERAY_VERSION} has no CRD {crd} in {bases}")
            shutil.copyfile(bases / crd, build / crd)
        (build / ".complete").write_text(f"{MODULE} {KUBERAY_VERSION}\n")
        build.rename(home)
    seconds = time.monotonic() - started
    say(f"KubeRay {KUBERAY_VERSION} built in {seconds / 60:.1f} min")
    return home, seconds


if __name__ == "__main__":
    where, _ = ensure_kuberay(say=lambda text: print(text, file=sys.stderr, flush=True))
    print(where)
