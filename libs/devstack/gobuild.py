"""The Go-built binaries (Kubernetes control plane, etcd, kwok), cached by version."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from devstack.config import Settings
from devstack.errors import StackError
from devstack.procs import cmdline, pid_alive, tail

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)
_SCRIPT = "build-go-binaries.sh"


def binaries_ready(settings: Settings) -> bool:
    d = settings.bin_dir
    return (d / ".complete").exists() and all(os.access(d / b, os.X_OK) for b in BINARIES)


def find_go() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    return str(fallback) if fallback.exists() else None


def _running_build(bin_dir: Path) -> int | None:
    """Pid of a build script already building into bin_dir (started by anyone), if any."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        cmd = cmdline(int(proc.name))
        if not cmd or not any(a.endswith(_SCRIPT) for a in cmd):
            continue
        if any(Path(a) == bin_dir for a in cmd if a.startswith("/")):
            return int(proc.name)
    return None


def ensure_binaries(settings: Settings, say: Callable[[str], None]) -> None:
    if binaries_ready(settings):
        return
    bin_dir = settings.bin_dir
    bin_dir.parent.mkdir(parents=True, exist_ok=True)
    logs = settings.cache_logs_dir
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"gobuild-{bin_dir.name}.log"
    lock_path = bin_dir.parent / f"{bin_dir.name}.lock"
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another devstack is building the binaries (lock {lock_path}); waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        other = _running_build(bin_dir)
        if other is not None:
            say(
                f"a build of the Go binaries is already running (pid {other}) into {bin_dir}; "
                "waiting for it to finish instead of starting a second one"
            )
            while pid_alive(other):
                time.sleep(5)
        if binaries_ready(settings):
            return
        go = find_go()
        if go is None:
            raise StackError(
                "Go is missing: the Kubernetes control plane, etcd and kwok are built from Go "
                "modules (Go >= 1.25). Install Go (for example to /usr/local/go) and put its bin "
                "dir on PATH, then run `python -m devstack up` again."
            )
        script = Path(__file__).with_name("scripts") / _SCRIPT
        env = dict(os.environ)
        env["PATH"] = f"{Path(go).parent}:{env.get('PATH', '')}"
        say(
            f"building Kubernetes {settings.k8s_version}, etcd {settings.etcd_version} and kwok "
            f"{settings.kwok_version} from Go modules into {bin_dir}.\n"
            "  A cold build takes 10-25 minutes on 2 cores (later runs reuse the cache).\n"
            f"  Log: {log}"
        )
        started = time.monotonic()
        with open(log, "ab") as logf:
            proc = subprocess.Popen(
                [
                    "nice",
                    "-n",
                    "10",
                    "bash",
                    str(script),
                    str(bin_dir),
                    settings.k8s_version,
                    settings.etcd_version,
                    settings.kwok_version,
                ],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
            last = started
            while proc.poll() is None:
                time.sleep(2)
                if time.monotonic() - last >= 60:
                    last = time.monotonic()
                    say(f"  still building ({(last - started) / 60:.0f} min); log {log}")
        if proc.returncode != 0:
            raise StackError(
                f"building the Go binaries failed (exit {proc.returncode}); log {log}, "
                f"last lines:\n{tail(log)}\n"
                "Fix the cause (network to the Go module proxy? disk space?) and run "
                "`python -m devstack build` again; binaries already built are kept."
            )
        missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
        if missing:
            raise StackError(f"build finished but {missing} are missing from {bin_dir}; log {log}")
        (bin_dir / ".complete").write_text(
            f"k8s {settings.k8s_version}\netcd {settings.etcd_version}\n"
            f"kwok {settings.kwok_version}\n"
        )
        say(f"binaries built in {(time.monotonic() - started) / 60:.1f} min")
