"""Services as real OS processes in tests: see devstack.launcher (shared with the demo)."""

from devstack.launcher import Lockgate, ServicePorts, ServiceProcess

__all__ = ["Lockgate", "ServicePorts", "ServiceProcess"]
