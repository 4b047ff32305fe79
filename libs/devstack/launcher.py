"""Run lockgate's services as local processes against the local stack (demo, e2e tests, bench).

Why a process per service: that is how they run in production, and only a real process can be
killed with SIGKILL to prove nothing is lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from devstack.manifests import (
    WEBHOOK_CONFIGURATION,
    apply_webhook_configuration,
    delete_queue_copies,
    delete_webhook_configuration,
    ensure_queue_crd,
    load,
    render_webhook_configuration,
)
from devstack.ports import ServicePorts
from devstack.procs import terminate
from devstack.roles import prepare_database, service_dsn
from lockgate.events import (
    CLUSTER_CAPACITY,
    CLUSTER_GROWTH,
    CLUSTER_SNAPSHOTS,
    JOBSET_COMMANDS,
    NAMESPACE_COMMANDS,
    POD_EVENTS,
    POD_NOTICES,
    RELEASE_COMMANDS,
    RELEASE_OUTCOMES,
    Topic,
)
from lockgate_adapters.admin_tokens import Role, entry_for, new_token
from lockgate_adapters.kafka import commit_group_at_end
from lockgate_adapters.kube import api_client
from lockgate_adapters.settings import KafkaConfig
from lockgate_adapters.tls import write_atomically

if TYPE_CHECKING:
    from devstack.stack import StackInfo

RUN_LABEL = "lockgate.io/run"
# How long a service process may take to start and be ready. Python alone needs tens of seconds
# to import a service's dependencies on a busy 2-core machine (seen: 60 s under a load of 30+).
STARTUP_SECONDS = 180.0
DEFAULT_CERT_DIR = Path("~/.cache/lockgate/webhook-certs").expanduser()
# Beside the stack's own logs when a stack dir is given (a second stack, e.g. with
# LOCKGATE_STACK_PORT_OFFSET, keeps its services' logs apart).
DEFAULT_LOG_DIR = Path(
    os.environ.get("LOCKGATE_SERVICE_LOG_DIR")
    or (Path(os.environ["LOCKGATE_STACK_DIR"]).expanduser() / "service-logs"
        if os.environ.get("LOCKGATE_STACK_DIR") else None)
    or Path.home() / ".local/state/lockgate/service-logs"
)


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
        return await terminate(self.process, grace_seconds)

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

    async def wait_ready(self, within_seconds: float = STARTUP_SECONDS) -> None:
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
    # 2: a second ungater process ("ungater-2") serving the same clusters in the same consumer
    # group, so the two split the release commands' partitions (scale-out tests).
    ungater_replicas: int = 1
    # Isolates this run from others sharing the stack (tests, an earlier demo): consumer groups
    # of its own that start at the topics' end, Queue objects of its own (labelled and named
    # after the run), and a webhook registration of its own that serves only namespaces
    # labelled `lockgate.io/run=<run_id>`.
    run_id: str | None = None
    # This installation's topic prefix (LOCKGATE_TOPIC_PREFIX; lockgate.installation): "" the
    # plain topic names. Runs that must not read each other's topics at all give each their own.
    topic_prefix: str = ""
    cert_dir: Path = DEFAULT_CERT_DIR
    processes: dict[str, ServiceProcess] = field(default_factory=dict)
    registered_in: list[str] = field(default_factory=list)
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

    @property
    def webhook_configuration_name(self) -> str:
        return f"lockgate-{self.run_id}" if self.run_id else "lockgate"

    @property
    def queue_source(self) -> str:
        """The lockgate.io/queue-source of this run's Queue objects."""
        return self.run_id or "lockgate"

    @property
    def queue_object_prefix(self) -> str:
        return f"{self.run_id}-" if self.run_id else ""

    def queue_object_name(self, queue: str) -> str:
        return f"{self.queue_object_prefix}{queue}"

    def _common_env(self) -> dict[str, str]:
        env = {
            "LOCKGATE_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            # The local stack has one broker (production defaults: 3 replicas, min ISR 2).
            "LOCKGATE_KAFKA_REPLICATION_FACTOR": "1",
            "LOCKGATE_KAFKA_MIN_INSYNC_REPLICAS": "1",
        }
        if self.topic_prefix:
            env["LOCKGATE_TOPIC_PREFIX"] = self.topic_prefix
        if self.run_id:
            env.update({
                "LOCKGATE_QUEUE_STORE_GROUP_ID": f"queue-store-{self.run_id}",
                "LOCKGATE_UNGATER_GROUP_ID": f"ungater-{self.run_id}",
            })
        return {**env, **self.extra_env}

    def consumer_groups(self) -> dict[str, list[Topic[Any]]]:
        """This run's consumer groups (its run_id's) and the topics each reads."""
        if not self.run_id:
            return {}
        return {
            f"queue-store-{self.run_id}": [POD_EVENTS, CLUSTER_SNAPSHOTS, CLUSTER_CAPACITY,
                                           RELEASE_OUTCOMES, CLUSTER_GROWTH],
            f"ungater-{self.run_id}": [RELEASE_COMMANDS],
            f"ungater-{self.run_id}-notices": [POD_NOTICES],
            f"ungater-{self.run_id}-jobsets": [JOBSET_COMMANDS],
            f"queue-store-{self.run_id}-commands": [JOBSET_COMMANDS, NAMESPACE_COMMANDS],
        }

    def groups_reading(self, topic: Topic[Any]) -> list[str]:
        """This run's consumer groups that read `topic`."""
        return [group for group, topics in self.consumer_groups().items() if topic in topics]

    async def _isolate_consumer_groups(self) -> None:
        for group, topics in self.consumer_groups().items():
            await commit_group_at_end(self.kafka, group, topics)

    @property
    def kafka(self) -> KafkaConfig:
        """The stack's Kafka as this run's services use it: one broker, the run's topics."""
        return KafkaConfig(self.kafka_bootstrap, topic_prefix=self.topic_prefix)

    def _namespace_env(self) -> dict[str, str]:
        """Ephemeral namespaces, made as namespace-keeper, carrying this run's label (so its
        webhook registration serves them) and its id in their names."""
        if "namespace-keeper" not in self.identity_kubeconfigs:
            return {}  # a stack set up before that identity existed: no ephemeral namespaces
        return {
            "LOCKGATE_QUEUE_STORE_NAMESPACE_CLUSTERS": self.clusters_as("namespace-keeper"),
            "LOCKGATE_QUEUE_STORE_NAMESPACE_LABELS": json.dumps(self.run_namespace_labels),
            "LOCKGATE_QUEUE_STORE_NAMESPACE_NAME_PREFIX": (
                re.sub(r"[^a-z0-9-]+", "-", self.run_id.lower())[:12].strip("-") + "-"
                if self.run_id else ""),
        }

    def _postgres(self, service: str) -> dict[str, str]:
        return {"LOCKGATE_POSTGRES_DSN": service_dsn(self.postgres_dsn, service)}

    def definitions(self) -> list[tuple[str, str, dict[str, str], int]]:
        p = self.ports
        defs = [
            ("queue-store", "queue_store", {
                **self._postgres("queue-store"),
                # The watcher's clusters: events of any other are another installation's.
                "LOCKGATE_QUEUE_STORE_CLUSTERS": json.dumps(sorted(self.kubeconfigs)),
                "LOCKGATE_QUEUE_STORE_HTTP_PORT": str(p.queue_store_health),
                "LOCKGATE_QUEUE_STORE_ADMIN_PORT": str(p.admin_api),
                "LOCKGATE_QUEUE_STORE_ADMIN_TOKENS": json.dumps(self.admin_token_lines()),
                "LOCKGATE_QUEUE_STORE_QUEUE_SYNC_CLUSTERS": self.clusters_as("queue-sync"),
                "LOCKGATE_QUEUE_STORE_QUEUE_SYNC_SOURCE": self.queue_source,
                "LOCKGATE_QUEUE_STORE_QUEUE_SYNC_NAME_PREFIX": self.queue_object_prefix,
                # status, explain and the web UI ask the scheduler leader's picture.
                "LOCKGATE_QUEUE_STORE_SCHEDULER_URLS": json.dumps(
                    [f"http://127.0.0.1:{p.scheduler_health}"]
                    + ([f"http://127.0.0.1:{p.standby_scheduler_health}"]
                       if self.standby_scheduler else [])),
                **self._namespace_env(),
            }, p.queue_store_health),
            ("admission-webhook", "admission_webhook", {
                "LOCKGATE_WEBHOOK_HTTP_PORT": str(p.webhook_health),
                "LOCKGATE_WEBHOOK_PORT": str(p.webhook),
                "LOCKGATE_WEBHOOK_CLUSTERS": self.clusters_as("webhook"),
                "LOCKGATE_WEBHOOK_CERT_DIR": str(self.cert_dir),
                "LOCKGATE_WEBHOOK_QUEUE_SOURCE": self.queue_source,
            }, p.webhook_health),
            ("cluster-watcher", "cluster_watcher", {
                "LOCKGATE_WATCHER_HTTP_PORT": str(p.watcher_health),
                "LOCKGATE_WATCHER_CLUSTERS": self.clusters_as("cluster-watcher"),
                # Only this run's namespaces, as its webhook registration: runs share clusters.
                "LOCKGATE_WATCHER_NAMESPACE_LABELS": json.dumps(self.run_namespace_labels),
                # A pod whose watch event was skipped is said (and reported) within a minute:
                # the demo once lost one such pod, on a loaded machine, with nothing logged.
                "LOCKGATE_WATCHER_POD_AUDIT_SECONDS": os.environ.get(
                    "LOCKGATE_WATCHER_POD_AUDIT_SECONDS", "60"),
            }, p.watcher_health),
            *self._ungaters(),
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

    def _ungaters(self) -> list[tuple[str, str, dict[str, str], int]]:
        """The ungater, and its replica if asked for: same clusters and group, each with its own
        health port and instance id."""
        if self.ungater_replicas not in (1, 2):
            raise ValueError(f"ungater_replicas must be 1 or 2, not {self.ungater_replicas}")
        ports = [self.ports.ungater_health, self.ports.second_ungater_health]
        return [(("ungater", "ungater-2")[i], "ungater", {
            "LOCKGATE_UNGATER_HTTP_PORT": str(ports[i]),
            "LOCKGATE_UNGATER_CLUSTERS": self.clusters_as("ungater"),
            **({"LOCKGATE_UNGATER_INSTANCE_ID": f"ungater-{i}"} if self.ungater_replicas > 1
               else {}),
        }, ports[i]) for i in range(self.ungater_replicas)]

    async def start(self, only: Sequence[str] | None = None,
                    within_seconds: float = STARTUP_SECONDS) -> None:
        if not self.processes:
            await self._isolate_consumer_groups()
            await prepare_database(self.postgres_dsn)
            # The Queue CRD comes with k8s/base; applied here too, so a run never lacks it.
            await self._each_cluster(lambda api: ensure_queue_crd(api))
        for name, module, env, health in self.definitions():
            if only is not None and name not in only:
                continue
            process = ServiceProcess(name, module, {**self._common_env(), **env},
                                     health_port=health, log_dir=self.log_dir)
            self.processes[name] = process
            if module == "admission_webhook":
                # It needs no database: give it no credentials (not even inherited ones).
                process.env.pop("LOCKGATE_POSTGRES_DSN", None)
            await process.start()
            if name != "fair-scheduler-standby":  # a standby is never "ready" as leader
                await process.wait_ready(within_seconds)
            if module == "admission_webhook":
                await self.register_webhook()

    async def register_webhook(self) -> None:
        """Apply this run's rendering of the static webhook configuration in every cluster."""
        static = load(WEBHOOK_CONFIGURATION)
        ca_pem = (self.cert_dir / "ca.crt").read_bytes()
        for cluster, kubeconfig in self.kubeconfigs.items():
            manifest = render_webhook_configuration(
                static, name=self.webhook_configuration_name,
                url=f"https://127.0.0.1:{self.ports.webhook}/mutate/{cluster}",
                ca_bundle_pem=ca_pem, extra_namespace_labels=self.run_namespace_labels)
            api = await api_client(kubeconfig)
            try:
                await apply_webhook_configuration(api, manifest)
            finally:
                await api.close()
            if cluster not in self.registered_in:
                self.registered_in.append(cluster)

    async def wait_for_queues(self, expected: Mapping[str, Any], *,
                              within_seconds: float = 30.0) -> None:
        """Until the webhook's copy in every cluster shows each queue in `expected` (name →
        its JSON from the admin API, or None for "gone") as the admin API wrote it."""
        url = f"http://127.0.0.1:{self.ports.webhook_health}/api/v1/queues"
        deadline = time.monotonic() + within_seconds
        seen: Any = None
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.get(url) as response:
                    seen = await response.json()
                if all(_copy_matches((seen.get(cluster) or {}).get(name), queue)
                       for cluster in self.kubeconfigs for name, queue in expected.items()):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the webhook's queues did not match after "
                                       f"{within_seconds:.0f}s: {seen}")
                await asyncio.sleep(0.1)

    async def unregister_webhook(self) -> None:
        """Remove this run's webhook configuration: a local run leaves no fail-closed hook."""
        for cluster in list(self.registered_in):
            api = await api_client(self.kubeconfigs[cluster])
            try:
                await delete_webhook_configuration(api, self.webhook_configuration_name)
            finally:
                await api.close()
            self.registered_in.remove(cluster)

    async def stop(self) -> dict[str, int | None]:
        """Stop in reverse order; returns each exit code (0 is a graceful exit)."""
        codes: dict[str, int | None] = {}
        try:
            await self.unregister_webhook()
        finally:
            for name in reversed(list(self.processes)):
                codes[name] = await self.processes[name].stop()
        if self.run_id and "queue-store" in self.processes:
            # A run's Queue objects are its own: leave the clusters as they were.
            source = self.queue_source
            await self._each_cluster(lambda api: _deleting(api, source))
        return codes

    async def _each_cluster(self, action: Callable[[Any], Awaitable[None]]) -> None:
        for kubeconfig in self.kubeconfigs.values():
            api = await api_client(kubeconfig)
            try:
                await action(api)
            finally:
                await api.close()

    def crashed(self) -> list[str]:
        return [name for name, p in self.processes.items() if not p.alive()]


def _copy_matches(copy: Mapping[str, Any] | None, queue: Mapping[str, Any] | None) -> bool:
    if queue is None:
        return copy is None
    return copy is not None and copy["cordoned"] == queue["cordoned"] and (
        copy["namespaces"] == queue["namespaces"])


async def _deleting(api: Any, source: str, within: float = 90.0) -> None:
    """Delete a run's Queue objects, again while the apiserver cannot answer yet (a test that
    restarted it leaves it answering 429 "storage is (re)initializing" for a while)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    deadline = time.monotonic() + within
    while True:
        try:
            await delete_queue_copies(api, source=source)
            return
        except ApiException as error:
            if error.status not in (429, 500, 503, 504) or time.monotonic() > deadline:
                raise
        except (aiohttp.ClientError, OSError, TimeoutError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(1.0)
