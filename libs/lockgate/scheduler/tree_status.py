"""The queue tree as `lockgate status --tree` and explain say it (issue 36, item 5).

Why it exists: with a tree, a queue's standing is not the whole story. alice may be at her share
of vision while vision is below its share of research and research above its share of the root:
what holds her pod back is the level where her branch is at or above its share while a sibling
branch is below its own. `sshare -l` shows every level; this is lockgate's picture of it, from
the leader's one state (the targets the round used, the allocations after it).

Shares are share units, as the hierarchical targets count them (docs/scheduling.md,
"Hierarchical fair targets"): a leaf's is its dominant share of the pool, a node's the sum of its
leaves'. So a node's fair target and actual share add up from its children's.

Without a tree (every queue a child of the root, no guarantee) the same picture is the flat one:
one level under the root. Pure: reads the state.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lockgate.queue_tree import QueueTree, QueueTreeError, TreeNode, tree_node_of
from lockgate.scheduler.costs import below_target, dominant, within_target
from lockgate.scheduler.state import SchedulerState
from lockgate.scheduler.targets import FairTargets


@dataclass(frozen=True, slots=True)
class TreeNodeStatus:
    """One node of the queue tree after a round."""

    name: str
    path: str  # research/vision/alice: display, never identity
    parent: str | None
    depth: int  # 0: a child of the root
    leaf: bool
    weight: float
    # Its weight over its siblings' (those defined), as sshare's normalised shares.
    weight_among_siblings: float
    guarantee: Mapping[str, str]  # Kubernetes quantities, as defined
    limit: Mapping[str, str]  # resource_limits, as defined
    fair_target: float  # share units: its leaves' targets added
    actual_share: float  # share units: its leaves' dominant shares of what they hold, added
    demand_share: float  # share units: what its leaves ask for (held and queued), added
    # Decayed usage (docs/scheduling.md, "Usage that decays"): None while history is off.
    decayed_usage: float | None = None

    @property
    def standing(self) -> str:
        """"below", "at" or "above" its fair target."""
        return standing(self.actual_share, self.fair_target)


def standing(actual: float, target: float) -> str:
    """Below, at or above a target, by the cost model's one rule (costs.below_target and
    within_target)."""
    if below_target(actual, target):
        return "below"
    if not within_target(actual, target):
        return "above"
    return "at"


# The flat tree each state's definitions make, with the `tree_shape_version` it was built at:
# the leader reports the tree after every round, and building it (and checking it) was half of
# that at 1,000 queues.
_FLAT_TREES: weakref.WeakKeyDictionary[SchedulerState, tuple[int, QueueTree]] = (
    weakref.WeakKeyDictionary())


def tree_of_state(state: SchedulerState) -> QueueTree:
    """The tree the state divides by, or the flat one its defined queues make."""
    if state.queue_tree is not None:
        return state.queue_tree
    version = state.tree_shape_version
    cached = _FLAT_TREES.get(state)
    if cached is not None and cached[0] == version:
        return cached[1]
    specs = [record.spec for record in state.queue_records.values() if record.spec is not None]
    try:
        tree = QueueTree.build([tree_node_of(spec) for spec in specs])
    except QueueTreeError:
        # Definitions that are no tree divide by weight alone (state.queue_tree_problem).
        tree = QueueTree.build([TreeNode(name=spec.name, weight=spec.weight) for spec in specs])
    _FLAT_TREES[state] = (version, tree)
    return tree


def tree_statuses(state: SchedulerState, targets: FairTargets | None = None,
                  ) -> tuple[TreeNodeStatus, ...]:
    """Every defined queue as a node of the tree, parents before children. O(queues x depth).
    `targets`: the fair targets to report (None: the state's latest, the round's)."""
    if targets is None:
        targets = state.fair_targets(latest=True)
    tree = tree_of_state(state)
    inverse = state.fairness_inverse()
    target: dict[str, float] = {}
    actual: dict[str, float] = {}
    demand: dict[str, float] = {}
    for leaf in tree.leaves:
        record = state.queue_records.get(leaf)
        leaf_target = targets.queues.get(leaf)
        held = 0.0 if record is None else dominant(record.allocation, inverse)
        asked = held if record is None or not record.schedulable else dominant(
            [a + d for a, d in zip(record.allocation, record.demand, strict=False)], inverse)
        for node in (leaf, *tree.ancestors(leaf)):
            target[node] = target.get(node, 0.0) + (
                0.0 if leaf_target is None else leaf_target.share)
            actual[node] = actual.get(node, 0.0) + held
            demand[node] = demand.get(node, 0.0) + asked
    statuses: list[TreeNodeStatus] = []
    # Each parent's children's weights, summed once: per node, it was O(siblings), and a flat
    # tree of 1,000 queues took a second of the leader's loop to report.
    names = tree.names
    sibling_weights: dict[str | None, float] = {}
    for name in names:
        parent = tree.parent(name)
        sibling_weights[parent] = sibling_weights.get(parent, 0.0) + tree.node(name).weight
    for name in names:
        record = state.queue_records.get(name)
        spec = None if record is None else record.spec
        parent = tree.parent(name)
        siblings = sibling_weights[parent]
        weight = tree.node(name).weight
        statuses.append(TreeNodeStatus(
            name=name, path=tree.path(name), parent=parent, depth=tree.depth(name),
            leaf=tree.is_leaf(name), weight=weight,
            weight_among_siblings=weight / siblings if siblings > 0 else 0.0,
            guarantee={} if spec is None else dict(spec.guarantee),
            limit={} if spec is None else dict(spec.resource_limits),
            fair_target=target.get(name, 0.0), actual_share=actual.get(name, 0.0),
            demand_share=demand.get(name, 0.0)))
    return tuple(statuses)


def tree_node_json(status: TreeNodeStatus) -> dict[str, Any]:
    """A node as `lockgate status --tree -o json` and the UI read it. `decayed_usage` is null
    while history is off (the history work fills it and may add fields beside it)."""
    return {"name": status.name, "path": status.path, "parent": status.parent,
            "depth": status.depth, "leaf": status.leaf, "weight": status.weight,
            "weight_among_siblings": status.weight_among_siblings,
            "guarantee": dict(status.guarantee), "limit": dict(status.limit),
            "fair_target": status.fair_target, "actual_share": status.actual_share,
            "demand_share": status.demand_share, "standing": status.standing,
            "decayed_usage": status.decayed_usage}


def holding_level(nodes: Mapping[str, TreeNodeStatus], leaf: str) -> str:
    """The sentence explain adds for a pod of `leaf` that waits for its share: each level of
    its branch against its share of its parent, and who is owed the room where the branch
    is held back. "" when the leaf is no node of the tree (or the tree is flat: the queue's
    own standing says it all).

    The level that holds it back is the highest node of its branch that is at or above its
    share of its parent (from there up, the branch has what it is due): its siblings below
    their share are owed the room. When every level is below its share, nothing in the tree
    holds it back: it waits for room (explain's other words say where)."""
    if leaf not in nodes:
        return ""
    branch: list[TreeNodeStatus] = []
    at: str | None = leaf
    while at is not None and at in nodes:
        branch.append(nodes[at])
        at = nodes[at].parent
    if len(branch) == 1:
        return ""
    text = ""
    for index, node in enumerate(branch):
        parent = "the root" if node.parent is None else node.parent
        kind = "queue " if index == 0 else ""
        phrase = f"{kind}{node.name} is {node.standing} its share of {parent}"
        if index == 0:
            text = phrase
        elif branch[index - 1].standing == "below" and node.standing != "below":
            text += f", but {phrase}"  # the branch turns: here it has what it is due
        else:
            text += f"; {phrase}"
    holding = None
    for node in branch:
        if node.standing != "below":
            holding = node  # the highest such node wins: keep going up
    if holding is None:
        return text + ": no level of its branch holds it back"
    owed = sorted(sibling.name for sibling in nodes.values()
                  if sibling.parent == holding.parent and sibling.name != holding.name
                  and sibling.standing == "below"
                  and below_target(sibling.actual_share, sibling.demand_share))
    if owed:
        verb = "is" if len(owed) == 1 else "are"
        return f"{text}, and {', '.join(owed)} {verb} owed this room"
    return f"{text}, so it waits for {holding.name}'s share to grow"
