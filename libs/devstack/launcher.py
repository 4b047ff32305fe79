"""Run lockgate's services as local processes against the local stack (demo, e2e tests, bench).

Why a process per service: that is how they run in production, and only a real process can be
killed with SIGKILL to prove nothing is lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from devstack.roles import prepare_database, service_dsn
from lockgate.events import (
    CLUSTER_CAPACITY,
    CLUSTER_SNAPSHOTS,
    POD_EVENTS,
    RELEASE_COMMANDS,
    RELEASE_OUTCOMES,
)
from lockgate_adapters.admin_tokens import Role, entry_for, new_token
from lockgate_adapters.kafka import commit_group_at_end
from lockgate_adapters.tls import write_atomically

if TYPE_CHECKING:
    from devstack.stack import StackInfo

RUN_LABEL = "lockgate.io/run"
# Beside the stack's own logs when a stack dir is given (a second stack, e.g. with
# LOCKGATE_STACK_PORT_OFFSET, keeps its services' logs apart).
DEFAULT_LOG_DIR = Path(
    os.environ.get("LOCKGATE_SERVICE_LOG_DIR")
    or (Path(os.environ["LOCKGATE_STACK_DIR"]).expanduser() / "service-logs"
        if os.environ.get("LOCKGATE_STACK_DIR") else None)
    or Path.home() / ".local/state/lockgate/service-logs"
)


def free_port() -> int:
    """A loopback port nothing listens on right now (for a service about to start)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServiceProcess:
    """One `python -m <module>` service with its environment; output goes to a log file."""

    def __init__(self, name: str, module: str, env: Mapping[str, str], *,
                 health_port: int | None = None, log_dir: Path = DEFAULT_LOG_DIR) -> None:
        self.name, self.module, self.health_port = name, module, health_port
        self.env = {**os.environ, **env}
        self.process: asyncio.subprocess.Process | None = None
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", self.module, env=self.env, stdout=log, stderr=log,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def kill(self) -> None:
        """SIGKILL: no shutdown hooks run, as in a crash."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()

    async def stop(self, grace_seconds: float = 25.0) -> int | None:
        """SIGTERM, wait for a graceful exit, SIGKILL after the grace; returns the exit code."""
        if self.process is None:
            return None
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), grace_seconds)
            except TimeoutError:
                await self.kill()
        return self.process.returncode

    async def ready(self) -> bool:
        if self.health_port is None:
            return self.alive()
        try:
            async with aiohttp.ClientSession() as session, session.get(
                f"http://127.0.0.1:{self.health_port}/readyz",
                timeout=aiohttp.ClientTimeout(total=2),
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def wait_ready(self, within_seconds: float = 60.0) -> None:
        deadline = time.monotonic() + within_seconds
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.process.returncode if self.process else None
                raise RuntimeError(f"{self.name} exited ({code}); log {self.log_path}:\n"
                                   f"{self.log_tail()}")
            if await self.ready():
                return
            await asyncio.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready after {within_seconds:.0f}s; "
                           f"log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class ServicePorts:
    """Loopback ports of the services' HTTP endpoints."""

    webhook: int = 58443
    admin_api: int = 58080
    queue_store_health: int = 58101
    watcher_health: int = 58102
    scheduler_health: int = 58103
    standby_scheduler_health: int = 58104
    ungater_health: int = 58105
    webhook_health: int = 58106

    @classmethod
    def free(cls) -> ServicePorts:
        """Ports nothing listens on now, for a run beside others on the same machine."""
        return cls(**{name: free_port() for name in cls.__dataclass_fields__})


@dataclass
class Lockgate:
    """All of lockgate's services for one stack, started in dependency order.

    Each service that talks to Kubernetes uses its own identity's kubeconfigs
    (`identity_kubeconfigs`: identity → cluster → kubeconfig, as StackInfo has them), never
    admin's: the admission policies let only the ungater's ServiceAccount remove lockgate's gate.
    Build it with `Lockgate.for_stack(info, ...)`.
    """

    kubeconfigs: Mapping[str, str]
    kafka_bootstrap: str
    postgres_dsn: str  # a superuser's: each service connects as its own role (devstack.roles)
    identity_kubeconfigs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    ports: ServicePorts = field(default_factory=ServicePorts)
    log_dir: Path = DEFAULT_LOG_DIR
    extra_env: Mapping[str, str] = field(default_factory=dict)
    standby_scheduler: bool = True
    # Isolates this run from others sharing the stack (tests, an earlier demo): consumer groups
    # of its own that start at the topics' end, and a webhook registration of its own that
    # serves only namespaces labelled `lockgate.io/run=<run_id>`.
    run_id: str | None = None
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    # Admin API tokens of this run alone, minted fresh: queue-store gets only their hashes.
    admin_token: str = field(default_factory=new_token, repr=False)
    read_only_token: str = field(default_factory=new_token, repr=False)

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.admin_api}"

    @property
    def admin_headers(self) -> dict[str, str]:
        """Headers of an admin API call with this run's admin token."""
        return {"Authorization": f"Bearer {self.admin_token}"}

    def write_token_files(self) -> dict[str, Path]:
        """This run's tokens in files only their owner reads, for `lockgate --token-file`."""
        paths = {"admin": self.log_dir / "admin-token",
                 "read-only": self.log_dir / "read-only-token"}
        for role, token in (("admin", self.admin_token), ("read-only", self.read_only_token)):
            write_atomically(paths[role], (token + "\n").encode(), mode=0o600)
        return paths

    def admin_token_lines(self) -> list[str]:
        return [entry_for("launcher-admin", Role.ADMIN, self.admin_token).line(),
                entry_for("launcher-reader", Role.READ_ONLY, self.read_only_token).line()]

    @classmethod
    def for_stack(cls, info: StackInfo, *, clusters: Mapping[str, str] | None = None,
                  postgres_dsn: str | None = None, **options: Any) -> Lockgate:
        """lockgate for the local stack `info`; `clusters` (name → real cluster) renames or
        selects clusters, `postgres_dsn` replaces the stack's database."""
        names = clusters if clusters is not None else {c: c for c in info.kubeconfigs}
        return cls(
            kubeconfigs={name: info.kubeconfigs[real] for name, real in names.items()},
            kafka_bootstrap=info.kafka_bootstrap,
            postgres_dsn=postgres_dsn or info.postgres_dsn,
            identity_kubeconfigs={identity: info.kubeconfigs_of(identity, names)
                                  for identity in info.identity_kubeconfigs},
            **options,
        )

    def clusters_as(self, identity: str) -> str:
        """LOCKGATE_*_CLUSTERS for a service running as `identity`."""
        own = self.identity_kubeconfigs.get(identity)
        if own is None:
            raise ValueError(
                f"no kubeconfigs for identity {identity!r}: build Lockgate with "
                "Lockgate.for_stack(info) so each service runs with its own ServiceAccount "
                "(admin credentials cannot release pods in managed namespaces)")
        missing = sorted(set(self.kubeconfigs) - set(own))
        if missing:
            raise ValueError(f"identity {identity!r} has no kubeconfig for {missing}")
        return json.dumps({name: own[name] for name in self.kubeconfigs})

    @property
    def run_namespace_labels(self) -> dict[str, str]:
        return {RUN_LABEL: self.run_id} if self.run_id else {}

    def _common_env(self) -> dict[str, str]:
        env = {
            "LOCKGATE_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            # The local stack has one broker (production defaults: 3 replicas, min ISR 2).
            "LOCKGATE_KAFKA_REPLICATION_FACTOR": "1",
            "LOCKGATE_KAFKA_MIN_INSYNC_REPLICAS": "1",
        }
        if self.run_id:
            env.update({
                "LOCKGATE_QUEUE_STORE_GROUP_ID": f"queue-store-{self.run_id}",
                "LOCKGATE_UNGATER_GROUP_ID": f"ungater-{self.run_id}",
                "LOCKGATE_WEBHOOK_CONFIGURATION_NAME": f"lockgate-{self.run_id}",
                "LOCKGATE_WEBHOOK_EXTRA_NAMESPACE_LABELS": json.dumps(self.run_namespace_labels),
            })
        return {**env, **self.extra_env}

    async def _isolate_consumer_groups(self) -> None:
        if not self.run_id:
            return
        await commit_group_at_end(self.kafka_bootstrap, f"queue-store-{self.run_id}", [
            POD_EVENTS, CLUSTER_SNAPSHOTS, CLUSTER_CAPACITY, RELEASE_OUTCOMES])
        await commit_group_at_end(self.kafka_bootstrap, f"ungater-{self.run_id}",
                                  [RELEASE_COMMANDS])

    def _postgres(self, service: str) -> dict[str, str]:
        return {"LOCKGATE_POSTGRES_DSN": service_dsn(self.postgres_dsn, service)}

    def definitions(self) -> list[tuple[str, str, dict[str, str], int]]:
        p = self.ports
        defs = [
            ("queue-store", "queue_store", {
                **self._postgres("queue-store"),
                "LOCKGATE_QUEUE_STORE_HTTP_PORT": str(p.queue_store_health),
                "LOCKGATE_QUEUE_STORE_ADMIN_PORT": str(p.admin_api),
                "LOCKGATE_QUEUE_STORE_ADMIN_TOKENS": json.dumps(self.admin_token_lines()),
            }, p.queue_store_health),
            ("admission-webhook", "admission_webhook", {
                **self._postgres("admission-webhook"),
                "LOCKGATE_WEBHOOK_HTTP_PORT": str(p.webhook_health),
                "LOCKGATE_WEBHOOK_PORT": str(p.webhook),
                "LOCKGATE_WEBHOOK_CLUSTERS": self.clusters_as("webhook"),
                # A local run must not leave a fail-closed registration behind it.
                "LOCKGATE_WEBHOOK_UNREGISTER_ON_SHUTDOWN": "true",
            }, p.webhook_health),
            ("cluster-watcher", "cluster_watcher", {
                "LOCKGATE_WATCHER_HTTP_PORT": str(p.watcher_health),
                "LOCKGATE_WATCHER_CLUSTERS": self.clusters_as("cluster-watcher"),
            }, p.watcher_health),
            ("ungater", "ungater", {
                "LOCKGATE_UNGATER_HTTP_PORT": str(p.ungater_health),
                "LOCKGATE_UNGATER_CLUSTERS": self.clusters_as("ungater"),
            }, p.ungater_health),
            ("fair-scheduler", "fair_scheduler", {
                **self._postgres("fair-scheduler"),
                "LOCKGATE_SCHEDULER_HTTP_PORT": str(p.scheduler_health),
                "LOCKGATE_SCHEDULER_INSTANCE_ID": "scheduler-0",
            }, p.scheduler_health),
        ]
        if self.standby_scheduler:
            defs.append(("fair-scheduler-standby", "fair_scheduler", {
                **self._postgres("fair-scheduler"),
                "LOCKGATE_SCHEDULER_HTTP_PORT": str(p.standby_scheduler_health),
                "LOCKGATE_SCHEDULER_INSTANCE_ID": "scheduler-1",
            }, p.standby_scheduler_health))
        return defs

    async def start(self, only: Sequence[str] | None = None,
                    within_seconds: float = 90.0) -> None:
        if not self.processes:
            await self._isolate_consumer_groups()
            await prepare_database(self.postgres_dsn)
        for name, module, env, health in self.definitions():
            if only is not None and name not in only:
                continue
            process = ServiceProcess(name, module, {**self._common_env(), **env},
                                     health_port=health, log_dir=self.log_dir)
            self.processes[name] = process
            await process.start()
            if name != "fair-scheduler-standby":  # a standby is never "ready" as leader
                await process.wait_ready(within_seconds)

    async def stop(self) -> dict[str, int | None]:
        """Stop in reverse order; returns each exit code (0 is a graceful exit)."""
        codes: dict[str, int | None] = {}
        for name in reversed(list(self.processes)):
            codes[name] = await self.processes[name].stop()
        return codes

    def crashed(self) -> list[str]:
        return [name for name, p in self.processes.items() if not p.alive()]
