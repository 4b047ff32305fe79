"""The Go-built binaries (Kubernetes control plane, etcd, kwok), cached by version; and the
tools built from one Go module each (KubeRay's operator, Karpenter), `ensure_go_tool`."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
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


# ---------------------------------------------------------------- tools built from one module


@dataclass(frozen=True)
class SourceEdit:
    """One exact text replacement in a module's file before it is built (a build-time patch of
    a copy, never of the module cache). Its `old` text must occur exactly `count` times, so a
    new version that moved the code fails the build clearly instead of building unpatched."""

    path: str  # inside the module
    old: str
    new: str
    count: int = 1


@dataclass(frozen=True)
class GoTool:
    """A program built once from a Go module at a version into a cache directory, with files of
    that module (CRDs) copied beside it."""

    title: str  # for messages, e.g. "KubeRay's ray-operator v1.5.0"
    module: str
    version: str
    package: str  # the main package to build, inside the module ("" for the module's root)
    binary: str  # the program's name in the cache directory
    files: tuple[tuple[str, str], ...] = ()  # (path inside the module, name in the directory)
    edits: tuple[SourceEdit, ...] = ()
    cold_build: str = "a few minutes"  # how long a cold build takes, for the message

    def ready(self, home: Path) -> bool:
        return ((home / ".complete").exists() and os.access(home / self.binary, os.X_OK)
                and all((home / name).is_file() for _, name in self.files))


def ensure_go_tool(tool: GoTool, home: Path, log: Path,
                   say: Callable[[str], None]) -> tuple[Path, float]:
    """`home` holding `tool`'s binary and files, built first if missing; and the seconds that
    took (0 when cached). One build at a time (a lock beside `home`; a second caller waits and
    reuses it); the build happens in `<home>.build` and is renamed into place when complete, so
    a failed or interrupted build never leaves a directory that looks done."""
    started = time.monotonic()
    if tool.ready(home):
        return home, 0.0
    home.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tool.ready(home):
            return home, time.monotonic() - started
        go = find_go()
        if go is None:
            raise StackError(f"Go is missing: {tool.title} is built from its Go module "
                             f"{tool.module} (Go >= 1.25, as for the stack). Install Go and put "
                             "its bin dir on PATH.")
        say(f"building {tool.title} from the Go module proxy into {home} (cold: "
            f"{tool.cold_build}); log {log}")
        shutil.rmtree(home, ignore_errors=True)
        build = home.with_name(home.name + ".build")
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir()
        # GOTOOLCHAIN=local: fail clearly rather than download another Go toolchain.
        env = {**os.environ, "PATH": f"{Path(go).parent}:{os.environ.get('PATH', '')}",
               "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-trimpath"}
        module_dir = _download_module(go, tool, env, log)
        _build(go, tool, module_dir, build, env, log)
        for inside, name in tool.files:
            if not (module_dir / inside).is_file():
                raise StackError(f"{tool.module}@{tool.version} has no file {inside} "
                                 f"(in {module_dir})")
            shutil.copyfile(module_dir / inside, build / name)
        (build / ".complete").write_text(f"{tool.module} {tool.version}\n")
        build.rename(home)
    seconds = time.monotonic() - started
    say(f"{tool.title} built in {seconds / 60:.1f} min")
    return home, seconds


def _download_module(go: str, tool: GoTool, env: dict[str, str], log: Path) -> Path:
    """The module's directory in the module cache (downloaded first if missing)."""
    target = f"{tool.module}@{tool.version}"
    with open(log, "ab") as out:
        out.write(f"\n=== go mod download {target}\n".encode())
    found = subprocess.run([go, "mod", "download", "-json", target], capture_output=True,
                           text=True, env=env, timeout=600, check=False,
                           cwd=tempfile.gettempdir())
    if found.returncode != 0:
        raise StackError(f"downloading {target} from the Go module proxy failed: "
                         f"{found.stdout}{found.stderr}".rstrip())
    try:
        return Path(json.loads(found.stdout)["Dir"])
    except (ValueError, KeyError) as exc:
        raise StackError(f"`go mod download -json {target}` said no Dir: "
                         f"{found.stdout[:300]}") from exc


def _build(go: str, tool: GoTool, module_dir: Path, build: Path, env: dict[str, str],
           log: Path) -> None:
    """`go install <package>@<version>` into `build`; with source edits, `go build` of an edited
    copy of the module instead (go refuses overlays of files in the module cache)."""
    package = f"{tool.module}/{tool.package}" if tool.package else tool.module
    source: Path | None = None
    if tool.edits:
        source = build / "src"
        shutil.copytree(module_dir, source)
        for path in [source, *source.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
        for edit in tool.edits:
            _apply_edit(source, edit, tool)
        argv = [go, "build", "-ldflags", "-s -w", "-o", str(build / tool.binary),
                f"./{tool.package}" if tool.package else "."]
        cwd = source
    else:
        argv = [go, "install", "-ldflags", "-s -w", f"{package}@{tool.version}"]
        cwd = Path(tempfile.gettempdir())
    with open(log, "ab") as out:
        out.write(f"=== {' '.join(argv)} (in {cwd})\n".encode())
        out.flush()
        code = subprocess.call(["nice", "-n", "10", *argv], stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, cwd=cwd,
                               env={**env, "GOBIN": str(build)})
    if source is not None:
        shutil.rmtree(source, ignore_errors=True)
    installed = build / package.rsplit("/", 1)[-1]
    if not tool.edits and installed != build / tool.binary and installed.exists():
        installed.rename(build / tool.binary)
    if code != 0 or not os.access(build / tool.binary, os.X_OK):
        raise StackError(f"building {tool.title} failed (exit {code}); log {log}, last "
                         f"lines:\n{tail(log)}")


def _apply_edit(source: Path, edit: SourceEdit, tool: GoTool) -> None:
    path = source / edit.path
    try:
        text = path.read_text()
    except OSError as exc:
        raise StackError(f"{tool.title}: cannot read {edit.path} to edit it: {exc}") from exc
    found = text.count(edit.old)
    if found != edit.count:
        raise StackError(f"{tool.title}: {edit.path} holds {found} (not {edit.count}) "
                         f"occurrences of {edit.old!r}; the edit was made for another version")
    path.write_text(text.replace(edit.old, edit.new))
