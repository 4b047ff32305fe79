"""The recipes' real clients (pyspark, the dask-kubernetes operator, KubeSpawner; Airflow's
KubernetesPodOperator apart, its pins conflicting with theirs): venvs of their own, cached
(devstack.clients), and the client scripts under tests/recipes/ run in them as separate
processes, as their users run them."""

from __future__ import annotations

import functools
from pathlib import Path

from devstack.clients import ensure_clients

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"


@functools.cache
def clients_python() -> Path:
    """The clients venv's python; built (once, cached by version) if missing, so a test fails
    with pip's own message rather than skipping when a client cannot be installed."""
    python, _ = ensure_clients()
    return python


@functools.cache
def airflow_python() -> Path:
    """The Airflow venv's python (tests/recipes/requirements-airflow.txt), likewise."""
    python, _ = ensure_clients(name="airflow")
    return python


def recipe_script(name: str) -> Path:
    script = RECIPES_DIR / name
    if not script.exists():
        raise FileNotFoundError(f"no recipe script {script}")
    return script
