"""A Jaeger of the local stack's own, as a process on loopback, so a `make run` user can follow a
pod's journey in traces.

Why a process and not the compose image: `make run` runs everything as local processes; Jaeger
v2 is one Go binary (the one `make compose-test` already builds into the cache from the Go
module proxy, `devstack.images.JAEGER`). It keeps traces in memory, receives OTLP/HTTP, and serves
its UI and query API; every port is on 127.0.0.1 and moves with LOCKGATE_STACK_PORT_OFFSET.

    python -m devstack.jaeger --build    # build (or find) the cached binary, print its path
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from devstack.config import Settings
from devstack.images import JAEGER, ensure_go_tool
from devstack.procs import terminate

# Beside the services' ports (58080-58107), inside the range the stack reserves for itself.
OTLP_HTTP_PORT = 58318
QUERY_HTTP_PORT = 58686
QUERY_GRPC_PORT = 58685
MAX_TRACES = 50_000


@dataclass(frozen=True)
class JaegerPorts:
    otlp_http: int
    query_http: int
    query_grpc: int

    @classmethod
    def with_offset(cls, offset: int) -> JaegerPorts:
        return cls(OTLP_HTTP_PORT + offset, QUERY_HTTP_PORT + offset, QUERY_GRPC_PORT + offset)

    @property
    def otlp_endpoint(self) -> str:
        """What services take as LOCKGATE_OTLP_ENDPOINT."""
        return f"http://127.0.0.1:{self.otlp_http}"

    @property
    def ui_url(self) -> str:
        """The UI, and the base of the query API (`/api/traces/<id>`)."""
        return f"http://127.0.0.1:{self.query_http}"


def config_yaml(ports: JaegerPorts) -> str:
    """Jaeger v2's configuration: OTLP/HTTP in, memory storage, query on loopback only.

    Its own metrics are off: the collector would otherwise listen on 8888 on every interface.
    """
    return f"""service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: {MAX_TRACES}
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{ports.query_http}
    grpc:
      endpoint: 127.0.0.1:{ports.query_grpc}
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{ports.otlp_http}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback URL
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


class JaegerProcess:
    """One Jaeger, started and stopped by its owner (`make run`); log and config in `directory`."""

    def __init__(self, binary: Path, directory: Path, ports: JaegerPorts) -> None:
        self.binary, self.directory, self.ports = binary, directory, ports
        self.process: asyncio.subprocess.Process | None = None
        self.log_path = directory / "jaeger.log"

    async def start(self, within_seconds: float = 60.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "jaeger.yaml"
        config.write_text(config_yaml(self.ports))
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                str(self.binary), "--config", str(config), stdout=log, stderr=log,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + within_seconds
        services = f"{self.ports.ui_url}/api/services"
        while not await asyncio.to_thread(answers, services):
            if self.process.returncode is not None:
                raise RuntimeError(f"Jaeger exited ({self.process.returncode}); log "
                                   f"{self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Jaeger's query API {services} did not answer within "
                                   f"{within_seconds:.0f}s; log {self.log_path}:\n"
                                   f"{self.log_tail()}")
            await asyncio.sleep(0.25)

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def stop(self, grace_seconds: float = 10.0) -> int | None:
        if self.process is None:
            return None
        return await terminate(self.process, grace_seconds)

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def ensure_binary(settings: Settings, say: Callable[[str], None] | None = None) -> Path:
    return ensure_go_tool(settings, JAEGER, say or (lambda text: print(text, flush=True)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.jaeger", description=__doc__)
    parser.add_argument("--build", action="store_true",
                        help="build Jaeger into the cache if missing and print its path")
    args = parser.parse_args(argv)
    if args.build:
        print(ensure_binary(Settings.from_env(), lambda text: print(text, file=sys.stderr)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
