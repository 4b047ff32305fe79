"""Starting, finding and stopping the stack's processes through pid files.

A process is the stack's own only if its pid file exists, the pid is alive and its command line is
exactly the one recorded when it was started; anything else is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import http.client
import json
import os
import pwd
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from devstack.config import HOST
from devstack.errors import StackError

HealthCheck = Callable[[], "str | None"]
"""Returns None when healthy, else a short reason."""

_LOG_ROTATE_BYTES = 64 * 1024 * 1024

# Started by `python -c`: starts the real process in a new session as a grandchild of the caller,
# writes its pid to the given fd and exits, so the caller never owns (nor reaps) the process.
_SPAWNER = """
import os, pwd, subprocess, sys
fd, user, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
kw = {}
if user:
    pw = pwd.getpwnam(user)
    kw = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, **kw)
os.write(fd, str(p.pid).encode())
os._exit(0)
"""


@dataclass
class Component:
    """One long-running process of the stack."""

    name: str
    argv: list[str]
    cwd: Path
    ports: list[int]
    endpoint: str
    health: HealthCheck
    user: str | None = None
    env: dict[str, str] | None = None
    stop_signal: signal.Signals = signal.SIGTERM
    stop_timeout: float = 20.0

    @property
    def file_name(self) -> str:
        return self.name.replace("/", "-")


@dataclass(frozen=True)
class PidRecord:
    pid: int
    argv: list[str]
    started_at: float


@dataclass(frozen=True)
class ProcState:
    """What the pid file says about a component: running, stopped, or stale."""

    state: str
    pid: int | None
    detail: str = ""


class Processes:
    """Pid files in `run_dir`, logs in `logs_dir`."""

    def __init__(self, run_dir: Path, logs_dir: Path) -> None:
        self.run_dir = run_dir
        self.logs_dir = logs_dir

    def pid_path(self, comp: Component) -> Path:
        return self.run_dir / f"{comp.file_name}.pid"

    def log_path(self, comp: Component) -> Path:
        return self.logs_dir / f"{comp.file_name}.log"

    def read(self, comp: Component) -> PidRecord | None:
        path = self.pid_path(comp)
        try:
            data = json.loads(path.read_text())
            return PidRecord(int(data["pid"]), [str(a) for a in data["argv"]], data["started_at"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return PidRecord(-1, [], 0.0)

    def inspect(self, comp: Component) -> ProcState:
        rec = self.read(comp)
        if rec is None:
            return ProcState("stopped", None)
        if rec.pid <= 0:
            return ProcState("stale", None, f"unreadable pid file {self.pid_path(comp)}")
        if not pid_alive(rec.pid):
            return ProcState("stale", rec.pid, f"pid {rec.pid} is not running")
        cmd = cmdline(rec.pid)
        if cmd != rec.argv:
            shown = " ".join(cmd or [])[:120]
            return ProcState("stale", rec.pid, f"pid {rec.pid} is now another process: {shown}")
        return ProcState("running", rec.pid)

    def clear_stale(self, comp: Component, say: Callable[[str], None]) -> None:
        st = self.inspect(comp)
        if st.state == "stale":
            say(f"{comp.name}: stale pid file {self.pid_path(comp)} ({st.detail}); removed")
            self.pid_path(comp).unlink(missing_ok=True)

    def start(self, comp: Component) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path(comp)
        if log.exists() and log.stat().st_size > _LOG_ROTATE_BYTES:
            log.replace(log.with_suffix(".log.1"))
        env = dict(os.environ)
        if comp.env:
            env.update(comp.env)
        user = comp.user if (comp.user and os.geteuid() == 0) else ""
        read_fd, write_fd = os.pipe()
        try:
            with open(log, "ab", buffering=0) as logf:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                logf.write(f"\n=== {stamp} devstack starts: {' '.join(comp.argv)}\n".encode())
                proc = subprocess.Popen(
                    [sys.executable, "-c", _SPAWNER, str(write_fd), user, *comp.argv],
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    cwd=comp.cwd,
                    env=env,
                    pass_fds=(write_fd,),
                    start_new_session=True,
                    close_fds=True,
                )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        with os.fdopen(read_fd, "rb") as rf:
            raw = rf.read()
        rc = proc.wait(timeout=30)
        if rc != 0 or not raw.strip().isdigit():
            raise StackError(
                f"{comp.name}: could not start {comp.argv[0]} (exit {rc}); see {log}\n" + tail(log)
            )
        pid = int(raw)
        rec = {"pid": pid, "argv": comp.argv, "started_at": time.time()}
        tmp = self.pid_path(comp).with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(self.pid_path(comp))
        return pid

    def stop(self, comp: Component, say: Callable[[str], None]) -> bool:
        """Signals the component if it is ours; returns True if a process was signalled."""
        st = self.inspect(comp)
        if st.state == "stopped":
            return False
        if st.state == "stale" or st.pid is None:
            say(f"{comp.name}: stale pid file {self.pid_path(comp)} ({st.detail}); removed")
            self.pid_path(comp).unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(st.pid, comp.stop_signal)
        return True

    def wait_stopped(self, comp: Component, deadline: float, say: Callable[[str], None]) -> None:
        rec = self.read(comp)
        if rec is None or rec.pid <= 0:
            return
        while pid_alive(rec.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(rec.pid) and cmdline(rec.pid) == rec.argv:
            say(f"{comp.name}: pid {rec.pid} ignored {comp.stop_signal.name}; sending SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec.pid, signal.SIGKILL)
            end = time.monotonic() + 10
            while pid_alive(rec.pid) and time.monotonic() < end:
                time.sleep(0.1)
        self.pid_path(comp).unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """True if the pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return False
        raise
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if not raw:
        return None
    return raw.rstrip(b"\0").decode(errors="replace").split("\0")


def port_busy(port: int, host: str = "127.0.0.1") -> bool:
    """True if something listens on the port (on host or on every address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _sockets_on_port(port: int) -> tuple[set[str], set[str]]:
    """Inodes of listening sockets, and of other sockets, whose local port is `port`."""
    listening: set[str] = set()
    other: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and int(parts[1].rsplit(":", 1)[1], 16) == port:
                (listening if parts[3] == "0A" else other).add(parts[9])
    return listening, other


def _pid_of_socket(inodes: set[str]) -> str | None:
    targets = {f"socket:[{i}]" for i in inodes if i != "0"}
    if not targets:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in targets:
                    cmd = " ".join(cmdline(int(proc.name)) or ["?"])
                    try:
                        owner = pwd.getpwuid(proc.stat().st_uid).pw_name
                    except KeyError:
                        owner = str(proc.stat().st_uid)
                    return f"pid {proc.name} (user {owner}): {cmd[:160]}"
        except OSError:
            continue
    return None


def port_owner(port: int) -> str:
    """Best-effort description of what holds a TCP port."""
    listening, other = _sockets_on_port(port)
    if listening:
        return _pid_of_socket(listening) or "a process this user cannot see"
    if other:
        who = _pid_of_socket(other) or "a process this user cannot see"
        return (
            f"the local end of an outgoing connection of {who} (the kernel picked the port from "
            "its ephemeral range; it is free again once that connection closes)"
        )
    return "an unknown process"


def wait_while_only_connections_hold(port: int, within: float,
                                     say: Callable[[str], None]) -> bool:
    """Waits up to `within` seconds for a port held only by connections (no listener) to be
    free; returns whether it is. A client connection that took the port from the ephemeral
    range before it was reserved (`reserve_ports`) closes, and its TIME_WAIT does not keep a
    listener with SO_REUSEADDR out; a listener, or a holder this user cannot see at all, is
    not waited for."""
    deadline = time.monotonic() + within
    told = False
    while port_busy(port):
        listening, other = _sockets_on_port(port)
        if listening or not other or time.monotonic() > deadline:
            return False
        if not told:
            say(f"port {port} is held by {port_owner(port)}; waiting up to {within:.0f}s")
            told = True
        time.sleep(0.5)
    return True


def reserve_ports(ports: list[int]) -> bool:
    """Keeps the kernel from handing these ports to outgoing connections (root only).

    The stack's ports lie inside Linux's default ephemeral range (32768-60999), so a client
    connection could otherwise occupy one of them while the stack is down. Adds them to
    net.ipv4.ip_local_reserved_ports (until reboot); returns True if anything was added.
    """
    path = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
    if os.geteuid() != 0:
        return False
    try:
        current = path.read_text().strip()
    except OSError:
        return False
    have: set[int] = set()
    for part in filter(None, current.split(",")):
        lo, _, hi = part.partition("-")
        have.update(range(int(lo), int(hi or lo) + 1))
    missing = sorted(set(ports) - have)
    if not missing:
        return False
    try:
        path.write_text(",".join(filter(None, [current, *map(str, missing)])) + "\n")
    except OSError:
        return False
    return True


def tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode(errors="replace").splitlines()
    except OSError:
        return f"    (no log at {path})"
    return "\n".join("    | " + line for line in data[-lines:])


_EXITED_SECONDS = 2.0


def wait_healthy(
    comps: list[Component],
    procs: Processes,
    timeout: float,
    extra: dict[str, HealthCheck] | None = None,
    interval: float = 0.25,
) -> None:
    """Polls until every component (and extra named check) is healthy.

    Fails fast when a component's process dies; on timeout names each laggard with its log tail.
    """
    pending: dict[str, tuple[Component | None, HealthCheck]] = {
        c.name: (c, c.health) for c in comps
    }
    for name, check in (extra or {}).items():
        pending[name] = (None, check)
    reasons: dict[str, str] = {}
    # Not running at two looks _EXITED_SECONDS apart: one look once misjudged an apiserver
    # started a moment before on a loaded machine (it ran on), and failed a test for nothing.
    not_running_since: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while pending:
        for name, (comp, check) in list(pending.items()):
            if comp is not None:
                state = procs.inspect(comp)
                if state.state != "running":
                    since = not_running_since.setdefault(name, time.monotonic())
                    if time.monotonic() - since < _EXITED_SECONDS:
                        reasons[name] = f"{state.state}: {state.detail}"
                        continue
                    log = procs.log_path(comp)
                    raise StackError(
                        f"{comp.name} exited during startup ({state.state}: {state.detail}); "
                        f"last lines of {log}:\n{tail(log)}\n"
                        f"Fix the cause, then run `python -m devstack up` again."
                    )
                not_running_since.pop(name, None)
            try:
                reason = check()
            except Exception as exc:  # noqa: BLE001 - any failure of a probe means "not yet"
                reason = f"{type(exc).__name__}: {exc}"
            if reason is None:
                del pending[name]
            else:
                reasons[name] = reason
        if not pending:
            return
        if time.monotonic() > deadline:
            parts = []
            for name, (comp, _) in pending.items():
                msg = f"- {name}: not healthy after {timeout:.0f}s ({reasons.get(name, '?')})"
                if comp is not None:
                    log = procs.log_path(comp)
                    msg += f"\n  log {log}, last lines:\n{tail(log)}"
                parts.append(msg)
            raise StackError(
                "components did not become healthy in time:\n"
                + "\n".join(parts)
                + "\nSee the logs above; `python -m devstack down` then `up` retries"
                " (LOCKGATE_STACK_TIMEOUT raises the wait)."
            )
        time.sleep(interval)


@contextlib.contextmanager
def exclusive(lock_path: Path, say: Callable[[str], None], waiting: str) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` for the block, one holder at a time across
    processes (devstacks, a fresh-check beside them); says `waiting` once if it must wait."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"{waiting} (lock {lock_path}); waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


async def terminate(process: asyncio.subprocess.Process, grace_seconds: float) -> int | None:
    """SIGTERM, wait up to `grace_seconds` for a graceful exit, then SIGKILL; the exit code."""
    # A process that has exited but is not reaped yet makes a signal raise ProcessLookupError
    # (make run's Jaeger, once, as its grace ran out): it is gone, which is what was wanted.
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_seconds)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return process.returncode


def http_ok(port: int, path: str, *, tls: ssl.SSLContext | None = None) -> str | None:
    """None once GET `path` on a loopback port answers 200 (over TLS with `tls`); else what
    went wrong."""
    conn = (http.client.HTTPConnection(HOST, port, timeout=2.0) if tls is None
            else http.client.HTTPSConnection(HOST, port, context=tls, timeout=2.0))
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
    except (OSError, http.client.HTTPException) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return None if resp.status == 200 else f"{path} -> {resp.status}"
