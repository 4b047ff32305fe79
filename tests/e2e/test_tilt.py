"""The Tiltfile's `local` mode, run the way CI runs Tilt: `tilt ci -- --mode=local` brings the
local stack and every lockgate service up as Tilt local_resources and exits 0 once all are
ready (each one's /readyz), or fails with the resource that did not come up.

tilt is built from the Go module proxy and cached by version (devstack.tilt; `make test` builds
it before pytest, so this test's time limit does not cover a cold build).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack import StackInfo
from devstack.ports import free_port
from devstack.tilt import ensure_tilt, install_shim

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = ["stack", "lockgate-setup", "queue-store", "admission-webhook", "cluster-watcher",
             "ungater", "fair-scheduler", "webhook-registration"]


@pytest.mark.timeout(1200)
def test_tilt_ci_brings_every_service_up_in_local_mode(stack: StackInfo) -> None:
    binary, _ = ensure_tilt()
    # The `tilt` a person runs (docs/deploying.md): the venv's shim of the cached build.
    tilt = install_shim(binary, Path(sys.executable).parent)
    env = {**os.environ, "KUBECONFIG": stack.kubeconfigs["cluster-a"],
           "TILT_DISABLE_ANALYTICS": "1"}
    try:
        done = subprocess.run(
            # As the README says it, with no --web-mode: the shim adds --web-mode=prod.
            [str(tilt), "ci", "--port", str(free_port()), "--timeout", "15m",
             "--",
             "--mode=local"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1100,
            check=False)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-8000:]
        for resource in RESOURCES:
            # Tilt prefixes each line with the resource's name, cut to 12 characters.
            assert resource[:12] in out, f"{resource} missing:\n{out[-8000:]}"
        assert "SUCCESS. All workloads are healthy." in out, out[-3000:]
        assert "registered lockgate-tilt in cluster-a, cluster-b" in out
    finally:
        # The per-run webhook registration (namespaces labelled lockgate.io/run=tilt only).
        subprocess.run([sys.executable, "-m", "devstack.serve", "unregister"], cwd=ROOT,
                       env=env, capture_output=True, timeout=120, check=False)
