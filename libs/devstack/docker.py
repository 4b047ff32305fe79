"""A Docker engine for the compose test and the image builds: the one running, or one of our own.

Why our own daemon: lockgate's development machines have Debian's docker.io but no running
engine. `dockerd` then runs with its own socket, exec root and pid file, and a data root in the
cache (so built images survive between runs), and is stopped again by whoever started it. It runs
without a bridge and without iptables rules: every container of the compose test uses the host's
network (the local apiservers listen on 127.0.0.1), builds run with `--network host`, so the
daemon leaves no docker0 bridge and no nft tables behind. Should it create them anyway (another
dockerd version, other flags), `stop` removes what was not there before it started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from devstack.config import Settings
from devstack.errors import StackError
from devstack.procs import exclusive, pid_alive, tail

# Short paths: a unix socket path is limited to 108 bytes, and containerd's sockets live under
# the exec root.
RUN_DIR = Path("/run/lockgate-docker")
SYSTEM_SOCKET = Path("/var/run/docker.sock")
DOCKER_TABLES = ("ip nat", "ip filter", "ip6 nat", "ip6 filter")
BRIDGE = "docker0"


# Debian package → a program it brings: what the compose test needs on the host.
HOST_PACKAGES = {"docker.io": "dockerd", "debootstrap": "debootstrap", "nftables": "nft",
                 "docker-compose": "docker-compose"}


def _which(program: str) -> str | None:
    return shutil.which(program) or next(
        (str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d, program)).exists()), None)


def ensure_host_tools(settings: Settings, say: Callable[[str], None]) -> None:
    """Install Debian's docker.io, docker-compose, debootstrap and nftables where missing (as
    root with apt), as devstack installs PostgreSQL; otherwise say what to install."""
    missing = [pkg for pkg, program in HOST_PACKAGES.items() if _which(program) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(f"missing: {', '.join(missing)} (Debian packages; e.g. "
                         f"`apt-get install {' '.join(missing)}`)")
    log = settings.cache_logs_dir / "apt-compose-tools.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"installing {', '.join(missing)} with apt-get (log {log})")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    with open(log, "ab") as logf:
        rc = subprocess.call(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                             stdin=subprocess.DEVNULL)
        if rc != 0:
            subprocess.call(["apt-get", "update"], stdout=logf, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
            rc = subprocess.call(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                 stdin=subprocess.DEVNULL)
    if rc != 0:
        raise StackError(f"installing {', '.join(missing)} failed; log {log}:\n{tail(log)}")


def docker_cli() -> str:
    found = shutil.which("docker")
    if not found:
        raise StackError("the docker CLI is missing: `apt-get install docker.io` (Debian) or "
                         "install Docker Engine")
    return found


def _answers(host: str) -> bool:
    try:
        done = subprocess.run([docker_cli(), "-H", host, "version", "--format",
                               "{{.Server.Version}}"], capture_output=True, timeout=15,
                              check=False)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def nft_tables() -> set[str]:
    """`family name` of every nft table now, or an empty set without the nft tool."""
    nft = shutil.which("nft")
    if not nft:
        return set()
    done = subprocess.run([nft, "list", "tables"], capture_output=True, text=True, check=False)
    return {line.removeprefix("table ").strip() for line in done.stdout.splitlines()
            if line.startswith("table ")}


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below `directory`, outermost first (from /proc/self/mounts)."""
    prefix = str(directory)
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        # Spaces in paths are escaped as \040 there; ours have none.
        point = line.split()[1]
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(found, key=len)


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


@dataclass
class DockerEngine:
    """Where the engine listens, and whether this process started it (then `stop` ends it)."""

    host: str
    settings: Settings
    say: Callable[[str], None]
    pid: int | None = None
    # Kept so that it is waited for: a Popen dropped while its process runs is a ResourceWarning.
    proc: subprocess.Popen[bytes] | None = None
    _tables_before: set[str] = field(default_factory=set)
    _bridge_before: bool = True

    @property
    def started_here(self) -> bool:
        return self.pid is not None

    def env(self) -> dict[str, str]:
        """Environment for `docker` and `docker compose` against this engine."""
        return {
            "DOCKER_HOST": self.host,
            # Debian's client has no buildx: the classic builder.
            "DOCKER_BUILDKIT": "0",
            "COMPOSE_DOCKER_CLI_BUILD": "0",
        }

    def docker(self, *args: str, check: bool = True, capture: bool = True,
               timeout: float | None = 600) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([docker_cli(), *args], capture_output=capture, text=True,
                              env={**os.environ, **self.env()}, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise StackError(f"docker {' '.join(args[:3])} failed ({done.returncode}): "
                             f"{(done.stderr or '').strip()[-2000:]}")
        return done

    def stop(self) -> None:
        """Stop the daemon if this process started it, and remove what it left behind."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 40
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(pid):
            self.say(f"dockerd (pid {pid}) did not stop within 40 s; SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
            self.proc = None
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        # Its exec root, pid file and socket: state of a daemon that no longer runs. dockerd
        # leaves its default network namespace mounted there (nsfs), and its data root bound
        # onto itself (made a private mount): unmount them first.
        data_root = self.settings.cache_dir / "docker" / "data-root"
        for mount in reversed(mounts_under(RUN_DIR) + mounts_under(data_root)):
            subprocess.run(["umount", "--lazy", mount], check=False)
        shutil.rmtree(RUN_DIR, ignore_errors=True)
        if not self._bridge_before and link_exists(BRIDGE):
            subprocess.run(["ip", "link", "delete", BRIDGE], check=False)
        for table in sorted(nft_tables() - self._tables_before):
            if table in DOCKER_TABLES or table.endswith(" DOCKER"):
                family, name = table.split()
                subprocess.run(["nft", "delete", "table", family, name], check=False)


def _start_dockerd(settings: Settings, say: Callable[[str], None], *,
                   detached: bool = False) -> DockerEngine:
    dockerd = _which("dockerd")
    if dockerd is None:
        raise StackError("no Docker engine answers and dockerd is missing: install Debian's "
                         "docker.io (`apt-get install docker.io`) or start Docker Engine")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    data_root = settings.cache_dir / "docker" / "data-root"
    data_root.mkdir(parents=True, exist_ok=True)
    socket_path = RUN_DIR / "docker.sock"
    host = f"unix://{socket_path}"
    engine = DockerEngine(host=host, settings=settings, say=say,
                          _tables_before=nft_tables(), _bridge_before=link_exists(BRIDGE))
    log = settings.cache_logs_dir / "dockerd.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        dockerd,
        f"--data-root={data_root}",
        f"--exec-root={RUN_DIR / 'exec'}",
        f"--pidfile={RUN_DIR / 'dockerd.pid'}",
        f"--host={host}",
        # Host networking only: no bridge, no NAT, no firewall rules, no sysctl changes.
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-forward=false",
        "--ip-masq=false",
        "--storage-driver=overlay2",
        "--exec-opt=native.cgroupdriver=cgroupfs",
    ]
    if detached:
        return _start_detached(engine, argv, log, say)
    with open(log, "ab") as logf:
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    engine.pid, engine.proc = proc.pid, proc
    deadline = time.monotonic() + 60
    while not _answers(host):
        if proc.poll() is not None or time.monotonic() > deadline:
            engine.stop()
            raise StackError(f"dockerd did not start (exit {proc.returncode}); log {log}:\n"
                             f"{tail(log)}")
        time.sleep(0.3)
    say(f"started dockerd (pid {proc.pid}) on {host}, data root {data_root}")
    return engine


def _start_detached(engine: DockerEngine, argv: list[str], log: Path,
                    say: Callable[[str], None]) -> DockerEngine:
    """dockerd as nobody's child (`setsid -f`), to outlive this process; its pid from its pid
    file."""
    with open(log, "ab") as logf:
        subprocess.run(["setsid", "-f", *argv], stdout=logf, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL, check=True)
    pid_file = RUN_DIR / "dockerd.pid"
    deadline = time.monotonic() + 60
    while not _answers(engine.host):
        if time.monotonic() > deadline:
            raise StackError(f"dockerd did not start within 60 s; log {log}:\n{tail(log)}")
        time.sleep(0.3)
    engine.pid = int(pid_file.read_text().strip())
    say(f"started dockerd (pid {engine.pid}) on {engine.host}; it runs on until "
        "`make compose-down`")
    return engine


KEPT_MARKER = RUN_DIR / "kept"  # lockgate's dockerd runs on after its starter (compose-up)


def _running_engine() -> str | None:
    """The host of an engine that answers and that someone else stops, if there is one."""
    configured = os.environ.get("DOCKER_HOST")
    if configured:
        if not _answers(configured):
            raise StackError(f"DOCKER_HOST={configured} does not answer `docker version`")
        return configured
    if SYSTEM_SOCKET.exists() and _answers(f"unix://{SYSTEM_SOCKET}"):
        return f"unix://{SYSTEM_SOCKET}"
    own = f"unix://{RUN_DIR / 'docker.sock'}"
    if KEPT_MARKER.exists() and _answers(own):
        return own
    return None


def _engine_lock(settings: Settings) -> Path:
    return settings.cache_dir / "docker" / "engine.lock"


def kept_engine(settings: Settings, say: Callable[[str], None]) -> tuple[DockerEngine,
                                                                       int | None]:
    """An engine that stays up after this process: the running one, else lockgate's dockerd,
    started and marked as kept (docker_engine's users then leave it running). Returns the
    engine and, if it was started here, its pid, for whoever stops it later."""
    ensure_host_tools(settings, say)
    host = _running_engine()
    if host is not None:
        return DockerEngine(host=host, settings=settings, say=say), None
    with exclusive(_engine_lock(settings), say, "another run uses lockgate's dockerd"):
        engine = _start_dockerd(settings, say, detached=True)
        KEPT_MARKER.write_text(f"{engine.pid}\n")
        return engine, engine.pid


@contextlib.contextmanager
def docker_engine(settings: Settings, say: Callable[[str], None]) -> Iterator[DockerEngine]:
    """The engine at DOCKER_HOST, the system socket or a kept lockgate dockerd if one answers,
    else a dockerd of our own for the duration (one at a time: a lock in the cache serialises
    concurrent users)."""
    ensure_host_tools(settings, say)
    host = _running_engine()
    if host is not None:
        yield DockerEngine(host=host, settings=settings, say=say)
        return
    with exclusive(_engine_lock(settings), say, "another run uses lockgate's dockerd"):
        engine = _start_dockerd(settings, say)
        try:
            yield engine
        finally:
            engine.stop()
