"""The real clients of the integration recipes in venvs of their own, one per requirements file
of tests/recipes/, each cached by the hash of its file:

- `requirements.txt` (name "clients"): pyspark, the dask-kubernetes operator, KubeSpawner;
- `requirements-<name>.txt` (name "<name>"): a client whose pins conflict with those, e.g.
  `requirements-airflow.txt`, Airflow's KubernetesPodOperator.

`python -m devstack.clients` builds every one ahead of the tests and prints their pythons, one a
line (the "clients" venv's first); `python -m devstack.clients NAME` builds that one alone.

Why venvs of their own: the clients pull about 1 GB (Spark's jars) and pins of their own; the
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

RECIPES_DIR = Path(__file__).resolve().parents[2] / "tests" / "recipes"
REQUIREMENTS = RECIPES_DIR / "requirements.txt"
DEFAULT = "clients"  # requirements.txt's venv; the others are named by their file


def requirements(name: str = DEFAULT) -> Path:
    """The requirements file of the venv NAME: requirements.txt for "clients", else
    requirements-NAME.txt."""
    path = REQUIREMENTS if name == DEFAULT else RECIPES_DIR / f"requirements-{name}.txt"
    if not path.exists():
        raise FileNotFoundError(f"no clients venv {name!r}: {path} does not exist "
                                f"(there are: {', '.join(names())})")
    return path


def names() -> list[str]:
    """Every clients venv, "clients" first: one per requirements file of tests/recipes/."""
    others = sorted(path.name.removeprefix("requirements-").removesuffix(".txt")
                    for path in RECIPES_DIR.glob("requirements-*.txt"))
    return [DEFAULT, *others]


def clients_dir(settings: Settings | None = None, name: str = DEFAULT) -> Path:
    """Where the venv NAME lives: `<cache>/clients/venv-<hash>` for requirements.txt (as it
    always was), `<cache>/clients/<name>-venv-<hash>` for the others."""
    digest = hashlib.sha256(requirements(name).read_bytes()).hexdigest()[:12]
    prefix = "" if name == DEFAULT else f"{name}-"
    return (settings or Settings.from_env()).cache_dir / "clients" / f"{prefix}venv-{digest}"


def ensure_clients(settings: Settings | None = None,
                   name: str = DEFAULT) -> tuple[Path, float]:
    """The python of the clients venv NAME, and the seconds it took to have it (built, once,
    when missing; a file lock keeps two builders of one venv apart)."""
    started = time.monotonic()
    wanted = requirements(name)
    home = clients_dir(settings, name)
    home.parent.mkdir(parents=True, exist_ok=True)
    python = home / "bin" / "python"
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / ".complete").exists():
            shutil.rmtree(home, ignore_errors=True)
            made = subprocess.run([sys.executable, "-m", "venv", str(home)],
                                  capture_output=True, text=True, timeout=300, check=False)
            if made.returncode != 0:
                raise RuntimeError(f"making the clients venv {name!r} failed:\n"
                                   f"{made.stderr[-2000:]}")
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "-r", str(wanted)],
                capture_output=True, text=True, timeout=1800, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"installing the recipes' clients ({wanted}) failed "
                                   f"(pip exit {done.returncode}):\n{done.stdout[-2000:]}"
                                   f"{done.stderr[-3000:]}")
            (home / ".complete").write_text(wanted.read_text())
    return python, time.monotonic() - started


def main(argv: list[str]) -> int:
    for name in argv or names():
        where, took = ensure_clients(name=name)
        print(f"recipes' clients {name!r} in {where.parent.parent} ({took:.1f}s)",
              file=sys.stderr)
        print(where, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
