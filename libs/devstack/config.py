"""Settings of the local stack: versions, ports, paths and sizes, read from the environment."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from devstack.errors import StackError

K8S_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.25.3"
SLF4J_VERSION = "2.0.17"

CLUSTERS = ("cluster-a", "cluster-b")
# Clusters that start with no node and grow with Karpenter (devstack.karpenter), only when asked:
# `python -m devstack up --autoscaled cluster-c` or LOCKGATE_AUTOSCALED_CLUSTERS=cluster-c. The
# fixed-size clusters above never change with them.
AUTOSCALED_CLUSTERS = ("cluster-c", "cluster-d")
# Each autoscaled cluster's ports: a block of its own (the fixed clusters' ports interleave).
_AUTOSCALED_PORTS_BASE = 56470
_AUTOSCALED_PORTS_STEP = 10

PG_DATABASE = "lockgate"
PG_USER = "lockgate"
PG_PASSWORD = "lockgate"  # noqa: S105 - a local test database bound to 127.0.0.1
HOST = "127.0.0.1"


@dataclass(frozen=True)
class ClusterPorts:
    """Loopback ports of one Kubernetes control plane."""

    apiserver: int
    etcd_client: int
    etcd_peer: int
    controller_manager: int
    scheduler: int
    kwok: int
    # Karpenter's metrics and health-probe servers (autoscaled clusters only; 0 otherwise).
    karpenter_metrics: int = 0
    karpenter_health: int = 0


@dataclass(frozen=True)
class Settings:
    """Everything the stack needs to know; `Settings.from_env()` builds it."""

    cache_dir: Path
    stack_dir: Path
    k8s_version: str
    etcd_version: str
    kwok_version: str
    kafka_version: str
    postgres_port: int
    kafka_port: int
    kafka_controller_port: int
    cluster_ports: dict[str, ClusterPorts]
    nodes_per_cluster: int
    node_cpu: str
    node_memory: str
    node_pods: str
    pg_os_user: str
    kafka_heap: str
    timeout: float
    # Autoscaled clusters asked for by LOCKGATE_AUTOSCALED_CLUSTERS (comma-separated).
    autoscaled_requested: tuple[str, ...] = ()

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        home = Path.home()
        offset = _int_env("LOCKGATE_STACK_PORT_OFFSET", 0)
        if not 0 <= offset <= 5000:
            raise StackError("LOCKGATE_STACK_PORT_OFFSET must be between 0 and 5000")
        ports = {
            name: ClusterPorts(
                apiserver=56443 + i + offset,
                etcd_client=52379 + 2 * i + offset,
                etcd_peer=52380 + 2 * i + offset,
                controller_manager=56257 + i + offset,
                scheduler=56259 + i + offset,
                kwok=56261 + i + offset,
            )
            for i, name in enumerate(CLUSTERS)
        }
        for j, name in enumerate(AUTOSCALED_CLUSTERS):
            first = _AUTOSCALED_PORTS_BASE + _AUTOSCALED_PORTS_STEP * j + offset
            ports[name] = ClusterPorts(
                apiserver=first, etcd_client=first + 1, etcd_peer=first + 2,
                controller_manager=first + 3, scheduler=first + 4, kwok=first + 5,
                karpenter_metrics=first + 6, karpenter_health=first + 7)
        nodes = _int_env("LOCKGATE_STACK_NODES", 4)
        if not 1 <= nodes <= 1000:
            raise StackError("LOCKGATE_STACK_NODES must be between 1 and 1000")
        return cls(
            cache_dir=Path(env.get("LOCKGATE_CACHE_DIR") or home / ".cache" / "lockgate")
            .expanduser()
            .absolute(),
            stack_dir=Path(
                env.get("LOCKGATE_STACK_DIR") or home / ".local" / "state" / "lockgate" / "stack"
            )
            .expanduser()
            .absolute(),
            k8s_version=env.get("LOCKGATE_K8S_VERSION", K8S_VERSION),
            etcd_version=env.get("LOCKGATE_ETCD_VERSION", ETCD_VERSION),
            kwok_version=env.get("LOCKGATE_KWOK_VERSION", KWOK_VERSION),
            kafka_version=env.get("LOCKGATE_KAFKA_VERSION", KAFKA_VERSION),
            postgres_port=55432 + offset,
            kafka_port=59092 + offset,
            kafka_controller_port=59093 + offset,
            cluster_ports=ports,
            nodes_per_cluster=nodes,
            node_cpu=env.get("LOCKGATE_STACK_NODE_CPU", "16"),
            node_memory=env.get("LOCKGATE_STACK_NODE_MEMORY", "64Gi"),
            node_pods=env.get("LOCKGATE_STACK_NODE_PODS", "110"),
            pg_os_user=env.get("LOCKGATE_STACK_PG_OS_USER", "lockgate"),
            kafka_heap=env.get("LOCKGATE_STACK_KAFKA_HEAP", "768m"),
            timeout=float(_int_env("LOCKGATE_STACK_TIMEOUT", 180)),
            autoscaled_requested=autoscaled_names(
                env.get("LOCKGATE_AUTOSCALED_CLUSTERS", "").split(","),
                "LOCKGATE_AUTOSCALED_CLUSTERS"),
        )

    # -- cache (shared by every stack, keyed by version) --
    @property
    def bin_dir(self) -> Path:
        key = f"k8s-{self.k8s_version}_etcd-{self.etcd_version}_kwok-{self.kwok_version}"
        return self.cache_dir / "bin" / key

    @property
    def kafka_dist_dir(self) -> Path:
        return self.cache_dir / "kafka" / f"kafka_2.13-{self.kafka_version}_log4j-{LOG4J_VERSION}"

    @property
    def cache_logs_dir(self) -> Path:
        return self.cache_dir / "logs"

    # -- runtime state of this stack --
    @property
    def logs_dir(self) -> Path:
        return self.stack_dir / "logs"

    @property
    def run_dir(self) -> Path:
        return self.stack_dir / "run"

    def cluster_dir(self, cluster: str) -> Path:
        return self.stack_dir / cluster

    def kubeconfig(self, cluster: str) -> Path:
        return self.cluster_dir(cluster) / "kubeconfig"

    @property
    def postgres_dsn(self) -> str:
        return f"postgresql://{PG_USER}:{PG_PASSWORD}@{HOST}:{self.postgres_port}/{PG_DATABASE}"

    @property
    def kafka_bootstrap(self) -> str:
        return f"{HOST}:{self.kafka_port}"


def autoscaled_names(names: Iterable[str], source: str) -> tuple[str, ...]:
    """The autoscaled clusters named (blanks ignored), each checked; StackError names `source`
    for a name that is not one."""
    wanted = [name.strip() for name in names if name.strip()]
    unknown = sorted(set(wanted) - set(AUTOSCALED_CLUSTERS))
    if unknown:
        raise StackError(f"{source}: {', '.join(unknown)} cannot be autoscaled; the autoscaled "
                         f"clusters are {', '.join(AUTOSCALED_CLUSTERS)} (the fixed-size "
                         f"{', '.join(CLUSTERS)} keep their nodes)")
    return tuple(sorted(set(wanted)))


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise StackError(f"{name}={raw!r} is not an integer") from None
