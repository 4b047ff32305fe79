"""lockgate's local stack: PostgreSQL, Kafka and two Kubernetes control planes with kwok nodes.

Run it as `python -m devstack up | down | status | env | build`, or from Python::

    info = devstack.ensure_up()      # reuse a healthy stack, or start it
    info.kubeconfigs["cluster-a"], info.kafka_bootstrap, info.postgres_dsn
    info.kubeconfigs_of("ungater")   # {"cluster-a": ..., "cluster-b": ...}: its own token
"""

from devstack.errors import StackError
from devstack.stack import StackInfo, ensure_up, install_cluster_objects, stack_info

__all__ = ["StackError", "StackInfo", "ensure_up", "install_cluster_objects", "stack_info"]
