"""The cluster-autoscaler's node groups, as the NodePools lockgate's headroom is worked out from.

Why: the cluster-autoscaler, like Karpenter, ignores gated pods, so a cluster it scales grows only
for pods lockgate releases for growth (docs/autoscaling.md). Unlike Karpenter it publishes no
object that says how far a group may grow: its node groups' minimum and maximum sizes live in the
cloud provider (an AWS Auto Scaling group, a GKE node pool) and in its own flags. So an operator
states each group once, as a fair-scheduler setting, and lockgate reads the group's current size
from the nodes it already watches:

    headroom of a group = (maximum size - current size) x one node's allocatable

which is a NodePool whose limit is `max_size` nodes of that shape and whose use is the nodes that
carry the group's labels. Turning each group into a `NodePoolStatus` lets one rule
(lockgate.scheduler's headroom) serve both autoscalers. Only Karpenter is tested on a real stack
here: the cluster-autoscaler's module cannot be built on this project's machines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lockgate.events import ClusterGrowth, NodePoolStatus
from lockgate.placement import Requirement, Taint
from lockgate.resources import InvalidQuantityError, Resources

# The label Karpenter puts on its nodes; a node group's virtual nodes carry it too, so explain
# and the UI name the group the way they name a NodePool.
NODE_POOL_LABEL = "karpenter.sh/nodepool"
# A picture made from settings is never older than one an autoscaler published.
_STATED = datetime(1970, 1, 1, tzinfo=UTC)


class NodeGroup(BaseModel):
    """One cluster-autoscaler node group of one cluster, as an operator states it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str = Field(min_length=1)
    name: str = Field(min_length=1)
    max_size: int = Field(ge=0, description="the group's maximum number of nodes")
    # One node's allocatable, as Kubernetes quantities (e.g. {"cpu": "7910m", "memory": "29Gi"}),
    # as its Node object reports it; what DaemonSets take of it is the policy's `node_overhead`,
    # subtracted as for every NodePool.
    node_allocatable: dict[str, str] = Field(min_length=1)
    # Labels every node of the group carries (e.g. {"eks.amazonaws.com/nodegroup": "batch"}):
    # they say which existing nodes are the group's, and which pods its new nodes can take.
    node_labels: dict[str, str] = Field(min_length=1)
    node_taints: tuple[Taint, ...] = ()

    @field_validator("node_allocatable")
    @classmethod
    def _quantities(cls, value: dict[str, str]) -> dict[str, str]:
        try:
            amounts = Resources.from_kubernetes(value)
        except InvalidQuantityError as error:
            raise ValueError(f"node_allocatable: {error}") from error
        if not amounts or any(amount <= 0 for amount in amounts.values()):
            raise ValueError("node_allocatable: every amount must be positive, e.g. "
                             '{"cpu": "8", "memory": "32Gi"}')
        return value

    @model_validator(mode="after")
    def _named_once(self) -> NodeGroup:
        if "/" in self.name:
            raise ValueError(f"node group name {self.name!r} may not contain '/'")
        return self

    @property
    def allocatable(self) -> Resources:
        return Resources.from_kubernetes(self.node_allocatable)

    def holds(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with these labels belongs to the group."""
        return all(labels.get(key) == value for key, value in self.node_labels.items())


def check_node_groups(groups: Sequence[NodeGroup]) -> None:
    """Refuse two groups of one name in a cluster: their headrooms would be counted twice."""
    seen: set[tuple[str, str]] = set()
    for group in groups:
        key = (group.cluster, group.name)
        if key in seen:
            raise ValueError(f"node group {group.name!r} of cluster {group.cluster!r} is "
                             "given twice")
        seen.add(key)


def node_group_pool(group: NodeGroup, node_labels: Iterable[Mapping[str, str]]) -> NodePoolStatus:
    """The group as a NodePool: limits of `max_size` nodes, in use its current nodes."""
    one = group.allocatable
    current = sum(1 for labels in node_labels if group.holds(labels))
    return NodePoolStatus(
        name=group.name,
        limits={resource: amount * group.max_size for resource, amount in one.items()},
        in_use={resource: amount * current for resource, amount in one.items()},
        requirements=tuple(Requirement(key=key, operator="In", values=(value,))
                           for key, value in sorted(group.node_labels.items())),
        labels={**group.node_labels, NODE_POOL_LABEL: group.name},
        taints=group.node_taints,
    )


def node_groups_growth(cluster: str, groups: Sequence[NodeGroup],
                       node_labels: Sequence[Mapping[str, str]]) -> ClusterGrowth | None:
    """The cluster's growth picture from its configured node groups; None if it has none."""
    mine = [group for group in groups if group.cluster == cluster]
    if not mine:
        return None
    return ClusterGrowth(cluster=cluster, observed_at=_STATED, autoscaled=True,
                         node_pools=[node_group_pool(group, node_labels) for group in mine])


def in_a_group(cluster: str, groups: Sequence[NodeGroup], labels: Mapping[str, str]) -> bool:
    """Whether a node with these labels counts towards one of the cluster's node groups."""
    return any(group.cluster == cluster and group.holds(labels) for group in groups)
