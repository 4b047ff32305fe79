"""Helm, built once from the Go module proxy into the cache (as Jaeger and Tilt are), for the
chart's test (tests/integration/test_helm_chart.py) and for you: `python -m devstack.helm`
builds it and prints its path.

Why build it: no release binary can be downloaded here, and Helm is a Go module.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from devstack.config import Settings
from devstack.images import GoTool, ensure_go_tool

HELM_VERSION = os.environ.get("LOCKGATE_HELM_VERSION", "v3.22.0")
HELM = GoTool("helm", "helm.sh/helm/v3", HELM_VERSION, "./cmd/helm")


def ensure_helm(settings: Settings | None = None) -> Path:
    return ensure_go_tool(settings or Settings.from_env(), HELM,
                          lambda text: print(text, file=sys.stderr, flush=True))


if __name__ == "__main__":
    print(ensure_helm())
