"""Tilt, built from the Go module proxy and cached by version (as the Kubernetes binaries are),
for the Tiltfile's `local` mode and its test. `python -m devstack.tilt` builds it and prints
its path.

Why build it: no release binary can be downloaded here, and Tilt is a Go module; see
scripts/build-tilt.sh for why it is not a plain `go install`.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from devstack.config import Settings
from devstack.errors import StackError
from devstack.gobuild import find_go
from devstack.procs import tail

TILT_VERSION = os.environ.get("LOCKGATE_TILT_VERSION", "v0.34.0")
# Bumped when build-tilt.sh changes what it builds, so a cached binary of an older recipe is
# rebuilt rather than reused.
RECIPE = 2
_SCRIPT = Path(__file__).with_name("scripts") / "build-tilt.sh"


def tilt_path(settings: Settings | None = None) -> Path:
    settings = settings or Settings.from_env()
    return settings.cache_dir / "tools" / f"tilt-{TILT_VERSION}-r{RECIPE}" / "tilt"


def ensure_tilt(settings: Settings | None = None,
                say: Callable[[str], None] = print) -> tuple[Path, float]:
    """The cached tilt binary, built first if missing; and the seconds that took."""
    settings = settings or Settings.from_env()
    binary = tilt_path(settings)
    started = time.monotonic()
    if os.access(binary, os.X_OK):
        return binary, 0.0
    binary.parent.mkdir(parents=True, exist_ok=True)
    log = settings.cache_logs_dir / f"tilt-build-{TILT_VERSION}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(binary.parent.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(binary, os.X_OK):
            return binary, time.monotonic() - started
        go = find_go()
        if go is None:
            raise StackError("Go is missing: tilt is built from its Go module (Go >= 1.23)")
        say(f"building tilt {TILT_VERSION} from the Go module proxy into {binary.parent} "
            f"(cold: 10-20 minutes on 2 cores; log {log})")
        env = {**os.environ, "PATH": f"{Path(go).parent}:{os.environ.get('PATH', '')}"}
        with open(log, "ab") as out:
            code = subprocess.call(["nice", "-n", "10", "bash", str(_SCRIPT),
                                    str(binary.parent), TILT_VERSION], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        if code != 0 or not os.access(binary, os.X_OK):
            raise StackError(f"building tilt {TILT_VERSION} failed (exit {code}); log {log}:\n"
                             f"{tail(log)}")
    seconds = time.monotonic() - started
    say(f"tilt {TILT_VERSION} built in {seconds / 60:.1f} min")
    return binary, seconds


SHIM = """#!/bin/sh
# Written by `python -m devstack.tilt`: the cached Tilt build, as `tilt` on PATH.
# Its web UI is a placeholder (the build has no Node), so `up` and `ci` default to
# --web-mode=prod; a source build would otherwise look for a web dev server and fail at once.
tilt={binary}
case "$1" in
  up|ci)
    sub="$1"; shift
    case " $* " in *" --web-mode"*) exec "$tilt" "$sub" "$@" ;; esac
    exec "$tilt" "$sub" --web-mode=prod "$@" ;;
esac
exec "$tilt" "$@"
"""


def install_shim(binary: Path, bin_dir: Path) -> Path:
    """`tilt` in `bin_dir` (the venv's bin, on PATH after `source env.sh` or venv activation),
    running the cached build with the flags this build needs."""
    shim = bin_dir / "tilt"
    text = SHIM.format(binary=binary)
    if not shim.exists() or shim.read_text() != text:
        shim.write_text(text)
        shim.chmod(0o755)
    return shim


if __name__ == "__main__":
    path, _ = ensure_tilt(say=lambda text: print(text, file=sys.stderr))
    shim = install_shim(path, Path(sys.executable).parent)
    print(f"{path} (as `tilt`: {shim})", file=sys.stderr)
    print(path)
