"""The real clients of the integration recipes (pyspark, the dask-kubernetes operator, KubeSpawner)
in a venv of their own, cached by the hash of tests/recipes/requirements.txt.
`python -m devstack.clients` builds it ahead of the tests and prints its python.

Why a venv of its own: the clients pull about 1 GB (Spark's jars) and pins of their own; the
recipes run them as their users do, as separate processes, so lockgate's venv stays as it is.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

from devstack.config import Settings

REQUIREMENTS = Path(__file__).resolve().parents[2] / "tests" / "recipes" / "requirements.txt"


def clients_dir(settings: Settings | None = None) -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    return (settings or Settings.from_env()).cache_dir / "clients" / f"venv-{digest}"


def ensure_clients(settings: Settings | None = None) -> tuple[Path, float]:
    """The clients venv's python, and the seconds it took to have it."""
    started = time.monotonic()
    home = clients_dir(settings)
    home.parent.mkdir(parents=True, exist_ok=True)
    python = home / "bin" / "python"
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / ".complete").exists():
            shutil.rmtree(home, ignore_errors=True)
            made = subprocess.run([sys.executable, "-m", "venv", str(home)],
                                  capture_output=True, text=True, timeout=300, check=False)
            if made.returncode != 0:
                raise RuntimeError(f"making the clients venv failed:\n{made.stderr[-2000:]}")
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "-r", str(REQUIREMENTS)],
                capture_output=True, text=True, timeout=1800, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"installing the recipes' clients ({REQUIREMENTS}) failed "
                                   f"(pip exit {done.returncode}):\n{done.stdout[-2000:]}"
                                   f"{done.stderr[-3000:]}")
            (home / ".complete").write_text(REQUIREMENTS.read_text())
    return python, time.monotonic() - started


if __name__ == "__main__":
    where, took = ensure_clients()
    print(f"recipes' clients in {where.parent.parent} ({took:.1f}s)", file=sys.stderr)
    print(where)
