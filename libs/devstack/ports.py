"""The loopback ports lockgate's local runs bind beside the stack, in one leaf module.

Why a module of its own: the stack reserves these ports when it starts (`stack.launcher_ports`),
and the runs that bind them — `make run` and the tests (`launcher`), Tilt (`serve`) and `make
compose-up` (`compose_up`) — start the stack. Each of those imports this module and the stack
imports it too, so neither needs the other: the import circle launcher → stack → serve → launcher
ends here. It imports nothing of devstack.
"""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass, fields
from pathlib import Path

# Tilt's services (devstack.serve): `make run`'s ports shifted by this, so both run side by side.
TILT_PORT_SHIFT = 20
# docker-compose.local.yml's defaults (plus LOCKGATE_STACK_PORT_OFFSET), and the webhooks'
# (webhook, health) that `make compose-up` runs in each cluster.
COMPOSE_PORTS = {
    "POSTGRES": 55532, "KAFKA": 59192, "KAFKA_CONTROLLER": 59193, "OTLP": 54318,
    "JAEGER_QUERY": 56686, "JAEGER_GRPC": 56685, "JAEGER_HEALTH": 53133, "ADMIN": 58180,
    "QUEUE_STORE_HEALTH": 58201, "WATCHER_HEALTH": 58202, "SCHEDULER_HEALTH": 58203,
    "UNGATER_HEALTH": 58205,
}
COMPOSE_WEBHOOK_PORTS = {"cluster-a": (58243, 58206), "cluster-b": (58244, 58207)}

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on right now, for a service about to start.

    Taken below the kernel's ephemeral range: a port from `bind(0)` is ephemeral, and any
    outgoing connection (to Kafka, Postgres, an apiserver) may take it before the service binds
    it, which a busy machine once did. Never the same port twice in one process.
    """
    low, high = _below_ephemeral_ports()
    for _ in range(500):
        port = random.randint(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free loopback port between {low} and {high}")


def _below_ephemeral_ports() -> tuple[int, int]:
    try:
        first_ephemeral = int(
            Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32768  # Linux's default
    high = max(first_ephemeral - 1, 2048)
    return max(1024, high - 12000), high


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
    second_ungater_health: int = 58107  # only with Lockgate(ungater_replicas=2)

    @classmethod
    def free(cls) -> ServicePorts:
        """Ports nothing listens on now, for a run beside others on the same machine."""
        return cls(**{f.name: free_port() for f in fields(cls)})

    @classmethod
    def shifted(cls, offset: int) -> ServicePorts:
        """The default ports plus `offset` (LOCKGATE_STACK_PORT_OFFSET, and Tilt's shift)."""
        defaults = cls()
        return cls(**{f.name: getattr(defaults, f.name) + offset for f in fields(cls)})

    def all(self) -> list[int]:
        return [getattr(self, f.name) for f in fields(self)]
