"""Container images for docker compose built without a registry, each cached by version.

Why: no image registry is reachable from lockgate's development machines, yet docker compose
should run there exactly as a user runs it with the official images. Every image is built from
what is reachable: a Debian base made with debootstrap, Debian's packages, Kafka's jars from
Maven Central (devstack's own download), Jaeger v2 from the Go module proxy (built once into
the cache), and lockgate's own Dockerfile on a Debian Python base.

An image's tag carries its version and a hash of its recipe (deploy/images/<name>/), lockgate's
a hash of its sources: a tag that exists is never built again. Each image is also tagged with
the plain name docker-compose.local.yml uses (e.g. localhost/lockgate-postgres:15).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from devstack.config import Settings
from devstack.docker import DockerEngine
from devstack.errors import StackError
from devstack.gobuild import find_go
from devstack.kafka import Kafka
from devstack.procs import tail

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "deploy" / "images"
GO_TOOL_SCRIPT = Path(__file__).with_name("scripts") / "build-go-tool.sh"

DEBIAN_SUITE = "bookworm"
DEBIAN_IMAGE = f"localhost/debian:{DEBIAN_SUITE}"
PG_MAJOR = "15"  # bookworm's PostgreSQL
JAEGER_MODULE_VERSION = "v1.76.0"  # the module's tag of Jaeger v2.13.0
JAEGER_VERSION = "2.13.0"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass(frozen=True)
class GoTool:
    """One command of a Go module, built once per version into the cache."""

    name: str
    module: str
    version: str
    package: str
    ldflags: str = ""

    def path(self, settings: Settings) -> Path:
        return settings.cache_dir / "tools" / f"{self.name}-{self.version}" / self.name


JAEGER = GoTool("jaeger", "github.com/jaegertracing/jaeger", JAEGER_MODULE_VERSION,
                "./cmd/jaeger")


def ensure_go_tool(settings: Settings, tool: GoTool, say: Callable[[str], None]) -> Path:
    """The tool's cached binary, built from the Go module proxy if missing (minutes, once)."""
    out = tool.path(settings)
    if os.access(out, os.X_OK):
        return out
    go = find_go()
    if go is None:
        raise StackError(f"Go is missing: {tool.name} {tool.version} is built from Go modules "
                         "(Go >= 1.25). Install Go and put its bin dir on PATH.")
    out.parent.mkdir(parents=True, exist_ok=True)
    log = settings.cache_logs_dir / f"gotool-{tool.name}-{tool.version}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per tool; a second caller waits for it
        if os.access(out, os.X_OK):
            return out
        say(f"building {tool.name} {tool.version} from the Go module proxy (a cold build takes "
            f"about 10 minutes on 2 cores; later runs reuse {out}); log {log}")
        started = time.monotonic()
        env = {**os.environ, "PATH": f"{Path(go).parent}:{os.environ.get('PATH', '')}"}
        with open(log, "ab") as logf:
            rc = subprocess.call(
                ["nice", "-n", "10", "bash", str(GO_TOOL_SCRIPT), str(out), tool.module,
                 tool.version, tool.package, tool.ldflags],
                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        if rc != 0 or not os.access(out, os.X_OK):
            raise StackError(f"building {tool.name} {tool.version} failed (exit {rc}); log {log}:"
                             f"\n{tail(log)}")
        say(f"built {tool.name} in {(time.monotonic() - started) / 60:.1f} min")
    return out


def compose_command(engine: DockerEngine, say: Callable[[str], None]) -> tuple[list[str],
                                                                             dict[str, str]]:
    """(argv, extra env) of compose: the `docker compose` v2 plugin if installed, else Debian's
    docker-compose 1.29 (devstack.docker installs it with apt). The compose files use no syntax
    of v2 only, so either runs them; v1 comes from apt in seconds, where building v2 from the Go
    module proxy takes about 10 minutes cold."""
    if engine.docker("compose", "version", check=False).returncode == 0:
        return ["docker", "compose"], {}
    v1 = shutil.which("docker-compose")
    if v1 is None:
        raise StackError("neither `docker compose` (v2 plugin) nor docker-compose (v1) is "
                         "installed: `apt-get install docker-compose` (Debian) or install "
                         "Docker's compose plugin")
    say(f"compose: {v1} (v1)")
    return [v1], {}


def _digest(paths: Iterable[tuple[str, Path]], *extra: str) -> str:
    """A hash of (name, file content) pairs and extra strings, for cache tags."""
    h = hashlib.sha256()
    for name, path in sorted(paths):
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    for item in extra:
        h.update(item.encode() + b"\0")
    return h.hexdigest()[:12]


def _recipe_files(name: str) -> list[tuple[str, Path]]:
    root = RECIPES / name
    return [(str(p.relative_to(root)), p) for p in root.rglob("*") if p.is_file()]


# The folders the repo's Dockerfile copies into the service image: what the services run, and
# nothing else (not devstack, the CLI, tests or benchmarks). The same as its COPY lines.
IMAGE_SOURCES = ("libs/lockgate", "libs/lockgate_adapters", "services")


def lockgate_sources() -> list[tuple[str, Path]]:
    """The build context of the repo's Dockerfile: itself, pyproject, README and the folders of
    IMAGE_SOURCES (no caches). Nothing else is sent, so changing devstack, the CLI or the tests
    rebuilds nothing."""
    files = [("Dockerfile", REPO / "Dockerfile"), ("pyproject.toml", REPO / "pyproject.toml"),
             ("README.md", REPO / "README.md")]
    for top in IMAGE_SOURCES:
        for path in sorted((REPO / top).rglob("*")):
            rel = path.relative_to(REPO)
            if path.is_file() and not any(
                    part == "__pycache__" or part.endswith(".egg-info") for part in rel.parts):
                files.append((str(rel), path))
    return files


@dataclass
class Images:
    """Builds (or finds cached) every image docker-compose.local.yml needs."""

    engine: DockerEngine
    say: Callable[[str], None]

    @property
    def settings(self) -> Settings:
        return self.engine.settings

    def exists(self, tag: str) -> bool:
        return self.engine.docker("image", "inspect", tag, check=False).returncode == 0

    def _tag(self, tag: str, *aliases: str) -> None:
        for alias in aliases:
            self.engine.docker("tag", tag, alias)

    def _build(self, tag: str, context: Path, *, build_args: dict[str, str] | None = None,
               dockerfile: Path | None = None) -> None:
        log = self.settings.cache_logs_dir / f"image-{re.sub(r'[^A-Za-z0-9.-]+', '_', tag)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = ["build", "--network", "host", "--force-rm", "-t", tag]
        for key, value in (build_args or {}).items():
            argv += ["--build-arg", f"{key}={value}"]
        if dockerfile is not None:
            argv += ["-f", str(dockerfile)]
        started = time.monotonic()
        self.say(f"building image {tag} (log {log})")
        done = self.engine.docker(*argv, str(context), check=False, timeout=1800)
        log.write_text((done.stdout or "") + (done.stderr or ""))
        if done.returncode != 0:
            raise StackError(f"building {tag} failed; log {log}:\n{tail(log)}")
        self.say(f"built {tag} in {time.monotonic() - started:.0f} s")

    def debian(self) -> str:
        """localhost/debian:bookworm from debootstrap (minbase, Debian's own mirror)."""
        if self.exists(DEBIAN_IMAGE):
            return DEBIAN_IMAGE
        debootstrap = shutil.which("debootstrap") or (
            "/usr/sbin/debootstrap" if Path("/usr/sbin/debootstrap").exists() else None)
        if debootstrap is None:
            raise StackError("debootstrap is missing (`apt-get install debootstrap`): it makes "
                             f"the {DEBIAN_IMAGE} base image without a registry")
        log = self.settings.cache_logs_dir / "debootstrap.log"
        started = time.monotonic()
        self.say(f"making {DEBIAN_IMAGE} with debootstrap (about a minute; log {log})")
        with tempfile.TemporaryDirectory(prefix="lockgate-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            with open(log, "wb") as logf:
                rc = subprocess.call([debootstrap, "--variant=minbase", DEBIAN_SUITE,
                                      str(rootfs), debian_mirror()],
                                     stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
            if rc != 0:
                raise StackError(f"debootstrap failed (exit {rc}); log {log}:\n{tail(log)}")
            # The archive's ordinary sources, so `apt-get update` works inside builds.
            # The context manager closes our end of the pipe (an unclosed one is a
            # ResourceWarning, an error under pytest) and waits for tar.
            with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."],
                                  stdout=subprocess.PIPE) as tar:
                done = subprocess.run(
                    ["docker", "import", "-", DEBIAN_IMAGE], stdin=tar.stdout,
                    capture_output=True, text=True, env={**os.environ, **self.engine.env()},
                    check=False)
            if done.returncode != 0 or tar.returncode != 0:
                raise StackError(f"docker import of the Debian rootfs failed: {done.stderr}")
        self.say(f"made {DEBIAN_IMAGE} in {time.monotonic() - started:.0f} s")
        return DEBIAN_IMAGE

    def _recipe_image(self, name: str, version: str, *,
                      context_files: dict[str, Path] | None = None,
                      build_args: dict[str, str] | None = None) -> str:
        """localhost/lockgate-<name>:<version>-<recipe hash>, built from deploy/images/<name>
        plus `context_files` (name in the context → file or directory on the host)."""
        base = self.debian()
        extra = sorted(f"{k}={v}" for k, v in (build_args or {}).items())
        key = _digest(_recipe_files(name), version, base, *extra,
                      *sorted(f"{k}:{_path_key(p)}" for k, p in (context_files or {}).items()))
        tag = f"localhost/lockgate-{name}:{version}-{key}"
        plain = f"localhost/lockgate-{name}:{version}"
        if not self.exists(tag):
            with tempfile.TemporaryDirectory(prefix=f"lockgate-image-{name}-") as tmp:
                context = Path(tmp) / "context"
                shutil.copytree(RECIPES / name, context)
                for dest, src in (context_files or {}).items():
                    if src.is_dir():
                        shutil.copytree(src, context / dest)
                    else:
                        shutil.copy2(src, context / dest)
                self._build(tag, context, build_args={"DEBIAN_IMAGE": base, **(build_args or {})})
        self._tag(tag, plain)
        return tag

    def postgres(self) -> str:
        return self._recipe_image("postgres", PG_MAJOR, build_args={"PG_MAJOR": PG_MAJOR})

    def kafka(self) -> str:
        kafka = Kafka(self.settings)
        kafka.ensure_installed(self.say)
        return self._recipe_image("kafka", self.settings.kafka_version,
                                  context_files={"jars": kafka.jars})

    def jaeger(self) -> str:
        binary = ensure_go_tool(self.settings, JAEGER, self.say)
        return self._recipe_image("jaeger", JAEGER_VERSION, context_files={"jaeger": binary})

    def python(self) -> str:
        return self._recipe_image("python", "3.11")

    def lockgate(self) -> str:
        """The repo's Dockerfile on the Debian Python base; tagged by a hash of its sources."""
        base = self.python()
        sources = lockgate_sources()
        ca = HOST_CA_BUNDLE if HOST_CA_BUNDLE.exists() else None
        key = _digest(sources, base, _path_key(ca) if ca else "")
        tag = f"localhost/lockgate:src-{key}"
        if not self.exists(tag):
            with tempfile.TemporaryDirectory(prefix="lockgate-image-lockgate-") as tmp:
                context = Path(tmp) / "context"
                for rel, path in sources:
                    (context / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, context / rel)
                if ca is not None:
                    shutil.copy2(ca, context / "extra-ca.crt")
                self._build(tag, context, build_args={"BASE": base})
        self._tag(tag, "localhost/lockgate:dev")
        return tag

    def all(self) -> dict[str, str]:
        """Every image of docker-compose.local.yml: name → its cached tag."""
        return {"postgres": self.postgres(), "kafka": self.kafka(), "jaeger": self.jaeger(),
                "lockgate": self.lockgate()}


def _path_key(path: Path) -> str:
    """A cheap identity of a file or directory for cache keys: names, sizes, mtimes."""
    if path.is_file():
        st = path.stat()
        return f"{path.name}:{st.st_size}:{int(st.st_mtime)}"
    return ";".join(f"{p.relative_to(path)}:{p.stat().st_size}"
                    for p in sorted(path.rglob("*")) if p.is_file())


def debian_mirror() -> str:
    """The Debian archive this host's apt uses (deb822 or one-line sources)."""
    candidates = [Path("/etc/apt/sources.list"),
                  *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in candidates:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for url in re.findall(r"(?:URIs:\s*|^deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M):
            if "debian" in url and "security" not in url:
                return str(url)
    return "http://deb.debian.org/debian"
