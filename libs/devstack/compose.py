"""docker compose with docker-compose.local.yml against the local stack's control planes.

Why: docker-compose.yml is what a user runs with the official images; here no registry is
reachable, so the override swaps in locally built images (devstack.images), puts every service on
the host's network (the local apiservers listen on 127.0.0.1, as every server here does) and
points the services at the local stack's kubeconfigs. `make compose-test` drives it through
`ComposeProject`; `python -m devstack images` only builds the images.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from devstack.config import Settings
from devstack.docker import DockerEngine, docker_engine
from devstack.errors import StackError
from devstack.images import REPO, Images, compose_command

COMPOSE_FILES = (REPO / "docker-compose.yml", REPO / "docker-compose.local.yml")
LOCKGATE_SERVICES = ("queue-store", "cluster-watcher", "fair-scheduler", "ungater")
# The engine restarts a service that exits (restart: unless-stopped); this many restarts within
# one `up` is a crash loop, reported at once rather than at the timeout.
CRASH_LOOP_RESTARTS = 3


def _say(msg: str) -> None:
    print(f"[compose] {msg}", file=sys.stderr, flush=True)


def build_images(settings: Settings | None = None,
                 say: Callable[[str], None] = _say) -> dict[str, str]:
    settings = settings or Settings.from_env()
    with docker_engine(settings, say) as engine:
        images = Images(engine, say).all()
        compose_command(engine, say)
        return images


@dataclass
class ComposeProject:
    """One `docker compose -p <project>` of docker-compose.yml + docker-compose.local.yml.

    Works with compose v1 (Debian's docker-compose) and v2 alike: only commands and flags both
    have, and the containers' state is read from the engine (by the project's labels), not from
    `compose ps`, whose output differs between them."""

    engine: DockerEngine
    project: str
    env: Mapping[str, str]  # the variables docker-compose.local.yml reads
    say: Callable[[str], None] = _say
    _argv: list[str] = field(default_factory=list)
    _env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        argv, extra_env = compose_command(self.engine, self.say)
        self._argv = [*argv, "-p", self.project,
                      *[arg for path in COMPOSE_FILES for arg in ("-f", str(path))]]
        self._env = {**os.environ, **self.engine.env(), **extra_env, **self.env}

    @property
    def argv_base(self) -> list[str]:
        """The compose command itself, without project or files."""
        return self._argv[:self._argv.index("-p")]

    @property
    def environment(self) -> dict[str, str]:
        return dict(self._env)

    def run(self, *args: str, check: bool = True, timeout: float = 600,
            capture: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*self._argv, *args], capture_output=capture, text=True,
                              env=self._env, timeout=timeout, check=False, cwd=REPO)
        if check and done.returncode != 0:
            raise StackError(f"docker compose {' '.join(args)} failed ({done.returncode}):\n"
                             f"{(done.stdout or '')[-3000:]}{(done.stderr or '')[-3000:]}")
        return done

    def up(self, *services: str, timeout: float = 300) -> None:
        """`up -d` (dependencies healthy first, as depends_on says), then every container of
        the project healthy (running, for one without a healthcheck) within `timeout`."""
        started = time.monotonic()
        try:
            done = self.run("up", "-d", "--no-build", *services, check=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StackError(f"docker compose up {' '.join(services)} took over {timeout:.0f} s:"
                             f"\n{self.logs(tail=40)}\n{self.state()}") from None
        if done.returncode != 0:
            raise StackError(f"docker compose up {' '.join(services)} failed "
                             f"({done.returncode}):\n{done.stderr[-3000:]}\n"
                             f"{self.logs(tail=40)}\n{self.state()}")
        while True:
            health = self.health()
            waiting = {s: h for s, h in health.items() if h not in ("healthy", "running")}
            if not waiting and (not services or set(services) <= set(health)):
                return
            crashing = {s: n for s, n in self.restarts().items() if n >= CRASH_LOOP_RESTARTS}
            failed = any(h in ("unhealthy", "exited", "dead") for h in waiting.values())
            if failed or crashing or time.monotonic() - started > timeout:
                raise StackError(self.diagnosis(
                    waiting, crashing, time.monotonic() - started))
            time.sleep(1)

    def restarts(self) -> dict[str, int]:
        """service → how often the engine restarted its container (restart: unless-stopped
        hides a crash loop as a container that is only ever "starting" or "restarting")."""
        return {container["Config"]["Labels"]["com.docker.compose.service"]:
                int(container.get("RestartCount") or 0)
                for container in self.containers()
                if container["Config"]["Labels"].get("com.docker.compose.service")}

    def diagnosis(self, waiting: Mapping[str, str], crashing: Mapping[str, int],
                  waited: float) -> str:
        """Why `up` gave up: the services' logs, each waiting container's last health checks,
        and, last (what a truncated report still shows), the verdict."""
        checks: list[str] = []
        for container in self.containers():
            service = container["Config"]["Labels"].get("com.docker.compose.service")
            if service not in waiting and service not in crashing:
                continue
            state = container["State"]
            for probe in ((state.get("Health") or {}).get("Log") or [])[-3:]:
                checks.append(f"  {service} health check exit {probe.get('ExitCode')}: "
                              f"{(probe.get('Output') or '').strip()[-400:]}")
            checks.append(f"  {service}: status {state.get('Status')}, exit code "
                          f"{state.get('ExitCode')}, error {state.get('Error') or '-'}, "
                          f"restarts {container.get('RestartCount')}")
        verdict = (f"not healthy after {waited:.0f} s: {dict(waiting)}"
                   + (f"; crash-looping (restarts): {dict(crashing)}" if crashing else ""))
        return (f"{verdict}\n{self.logs(tail=40)}\nlast health checks:\n"
                + "\n".join(checks) + f"\nall services: {self.state()}\n{verdict}")

    def containers(self) -> list[dict[str, Any]]:
        """`docker inspect` of every container of the project."""
        ids = self.engine.docker("ps", "-a", "-q", "--filter",
                                 f"label=com.docker.compose.project={self.project}").stdout.split()
        if not ids:
            return []
        return list(json.loads(self.engine.docker("inspect", *ids).stdout))

    def health(self) -> dict[str, str]:
        """service → its container's health (healthy, starting, unhealthy), or its state
        (running, exited, ...) without a healthcheck."""
        found: dict[str, str] = {}
        for container in self.containers():
            service = container["Config"]["Labels"].get("com.docker.compose.service")
            if not service:
                continue  # not a compose service (the webhook containers carry the project)
            state = container["State"]
            found[service] = (state.get("Health") or {}).get("Status") or state["Status"]
            if state["Status"] != "running":
                found[service] = state["Status"]
        return found

    def state(self) -> str:
        return ", ".join(f"{s}: {h}" for s, h in sorted(self.health().items()))

    def logs(self, *services: str, tail: int = 200) -> str:
        done = self.run("logs", "--no-color", "--tail", str(tail), *services, check=False)
        return (done.stdout or "") + (done.stderr or "")

    def down(self) -> None:
        self.run("down", "--volumes", "--remove-orphans", "--timeout", "30", timeout=300)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes still labelled with this project."""
        label = f"label=com.docker.compose.project={self.project}"
        found: dict[str, list[str]] = {}
        for kind, args in (("containers", ["ps", "-a", "-q", "--filter", label]),
                           ("networks", ["network", "ls", "-q", "--filter", label]),
                           ("volumes", ["volume", "ls", "-q", "--filter", label])):
            out = self.engine.docker(*args).stdout.split()
            if out:
                found[kind] = out
        return found


@contextmanager
def compose_project(engine: DockerEngine, project: str, env: Mapping[str, str],
                    say: Callable[[str], None] = _say) -> Iterator[ComposeProject]:
    """The project, taken down with its volumes at the end whatever happened."""
    project_ = ComposeProject(engine, project, env, say)
    try:
        yield project_
    finally:
        started = time.monotonic()
        try:
            project_.down()
        finally:
            say(f"compose down in {time.monotonic() - started:.0f} s")
