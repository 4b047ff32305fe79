"""Karpenter with its kwok cloud provider, built once from the Go module proxy into the cache with
the CRDs it needs beside it, and run as a process against one local control plane (the stack's
autoscaled clusters, `python -m devstack up --autoscaled cluster-c`).
`python -m devstack.karpenter` builds it and prints the directory.

What is built: the main package `sigs.k8s.io/karpenter/kwok` (Karpenter's core controllers with
the kwok cloud provider: a NodeClaim becomes a Node object that carries the annotation
kwok.x-k8s.io/node=fake, which the stack's kwok then marks Ready). v1.13.0, because later
versions need a newer Go than the machine's (GOTOOLCHAIN=local: no toolchain is downloaded).

One edit of a copy of the module before the build: Karpenter binds its metrics and health-probe
servers to ":<port>" (every address; pkg/operator/operator.go), and its flags take only a port.
The stack's servers bind 127.0.0.1 only, so the copy binds "127.0.0.1:<port>". The edit fails
the build if the line moved (another version).

The CRDs: NodePool and NodeClaim from pkg/apis/crds, KWOKNodeClass from kwok/apis/crds (the
chart's copy is a symlink that module zips drop).

Running it outside a cluster (checked in pkg/operator/options/options.go, kwok/options and
pkg/operator/operator.go of v1.13.0; an unknown flag is fatal):
- KUBECONFIG=<the cluster's kubeconfig> (controller-runtime's GetConfigOrDie reads it; there is
  no --kubeconfig flag);
- --disable-leader-election=true (otherwise it waits for a Lease in a namespace it would have to
  be told, and a lone process needs none);
- --metrics-port=<p> and --health-probe-port=<q>: distinct per cluster (defaults 8080 and
  8081); on 127.0.0.1 through the edit above; /healthz and /readyz on the health port (readyz
  waits for the caches and for the NodePool and NodeClaim CRDs);
- --batch-idle-duration / --batch-max-duration: the provisioning batch window (defaults 1s
  and 10s, the values issue 35 assumes); LOCKGATE_KARPENTER_BATCH_IDLE and
  LOCKGATE_KARPENTER_BATCH_MAX change them for the stack;
- --log-level=info (debug, info or error);
- --feature-gates left at their defaults (NodeOverlay=false, so no NodeOverlay CRD is needed);
- no system namespace, service name or webhook: v1.13's kwok provider reads none.
Consolidation needs no flag: it is the NodePool's `spec.disruption` (consolidationPolicy
WhenEmpty or WhenEmptyOrUnderutilized, consolidateAfter e.g. "5s"), set by whoever makes the
NodePool (tests/helpers/karpenter.py). A KWOKNodeClass is Ready only once its status says so
(Karpenter's kwok provider has no controller for it), and a NodePool whose NodeClass is not
Ready provisions nothing: whoever applies one also sets its status condition Ready=True.
The kwok provider sizes a node by its NodeClaim's pod requests; the autoscaled cluster's kwok
gives it its instance type's capacity instead (devstack.kube.instance_sized_stages), so the
NodePool's limits count what a real node would.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from devstack.config import HOST, Settings
from devstack.errors import StackError
from devstack.gobuild import GoTool, SourceEdit, ensure_go_tool
from devstack.procs import Component, http_ok

KARPENTER_VERSION = os.environ.get("LOCKGATE_KARPENTER_VERSION", "v1.13.0")
MODULE = "sigs.k8s.io/karpenter"
BINARY = "karpenter-kwok"
CRDS = {
    "karpenter.sh_nodepools.yaml": "pkg/apis/crds/karpenter.sh_nodepools.yaml",
    "karpenter.sh_nodeclaims.yaml": "pkg/apis/crds/karpenter.sh_nodeclaims.yaml",
    "karpenter.kwok.sh_kwoknodeclasses.yaml":
        "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
}
_OPERATOR = "pkg/operator/operator.go"
TOOL = GoTool(
    title=f"Karpenter's kwok provider {KARPENTER_VERSION}", module=MODULE,
    version=KARPENTER_VERSION, package="kwok", binary=BINARY,
    files=tuple((inside, name) for name, inside in CRDS.items()),
    edits=(
        SourceEdit(_OPERATOR, 'fmt.Sprintf(":%d", options.FromContext(ctx).MetricsPort)',
                   f'fmt.Sprintf("{HOST}:%d", options.FromContext(ctx).MetricsPort)'),
        SourceEdit(_OPERATOR, 'fmt.Sprintf(":%d", options.FromContext(ctx).HealthProbePort)',
                   f'fmt.Sprintf("{HOST}:%d", options.FromContext(ctx).HealthProbePort)'),
    ),
    cold_build="about 2 minutes with a warm Go cache, 10 or more on 2 cold cores")


def karpenter_dir(settings: Settings | None = None) -> Path:
    return (settings or Settings.from_env()).cache_dir / "tools" / f"karpenter-{KARPENTER_VERSION}"


def ensure_karpenter(settings: Settings | None = None,
                     say: Callable[[str], None] = print) -> tuple[Path, float]:
    """The directory holding `karpenter-kwok` and the three CRDs, built first if missing; and
    the seconds that took (0 when cached)."""
    settings = settings or Settings.from_env()
    return ensure_go_tool(TOOL, karpenter_dir(settings),
                          settings.cache_logs_dir / f"karpenter-build-{KARPENTER_VERSION}.log",
                          say)


def batch_window(env: dict[str, str] | None = None) -> tuple[str, str]:
    """(idle, max) of Karpenter's provisioning batch window, as Go durations."""
    source = os.environ if env is None else env
    return (source.get("LOCKGATE_KARPENTER_BATCH_IDLE") or "1s",
            source.get("LOCKGATE_KARPENTER_BATCH_MAX") or "10s")


def karpenter_component(*, cluster: str, home: Path, kubeconfig: Path, workdir: Path,
                        metrics_port: int, health_port: int) -> Component:
    """Karpenter for one cluster, as a stack component (`<cluster>/karpenter`)."""
    idle, longest = batch_window()
    return Component(
        name=f"{cluster}/karpenter",
        argv=[
            str(home / BINARY),
            "--disable-leader-election=true",
            f"--metrics-port={metrics_port}",
            f"--health-probe-port={health_port}",
            f"--batch-idle-duration={idle}",
            f"--batch-max-duration={longest}",
            "--log-level=info",
        ],
        cwd=workdir,
        ports=[metrics_port, health_port],
        endpoint=f"http://{HOST}:{health_port}",
        # /readyz answers 200 once its caches synced and its CRDs are served.
        health=lambda: http_ok(health_port, "/readyz"),
        env={"KUBECONFIG": str(kubeconfig)},
    )


def main() -> int:
    try:
        where, _ = ensure_karpenter(say=lambda text: print(text, file=sys.stderr, flush=True))
    except StackError as exc:
        print(f"devstack.karpenter: error: {exc}", file=sys.stderr)
        return 1
    print(where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
