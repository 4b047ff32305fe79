"""The queue tree: how an organisation divides the fleet, level by level (issue 36).

Why it exists: an organisation is a tree (research and production; vision and nlp inside
research; a queue per user inside vision), and a flat list of queues cannot say "adding a queue
under nlp takes nothing from production". The fair targets (lockgate.scheduler.targets,
`hierarchical_fair_targets`) split what each node gets among its children; this module says
what the tree is and refuses trees that cannot be honoured.

Naming: a *parent field*, not a path. Every node keeps one flat name, valid as today's queue
names are (a Kubernetes label value and object name, so it can name the Queue copies in worker
clusters, which cannot hold '/'), unique across the whole tree, and says which node is its
parent (None: a child of the root). Why:
- pods name their queue by label; a leaf's name never changes when a subtree moves, so moving
  `vision` from `research` to `production` relabels no pod and renames no Queue copy;
- Postgres holds it as a nullable `parent` column (a foreign key to the queue's own table), the
  admin API and the CLI as one more field (`parent: research`), the UI as a tree built from it;
- the path (`research/vision/alice`) is derived (`QueueTree.path`) and shown wherever a reader
  needs the context: status --tree, explain, the UI. It is display, never identity.

Rules (`QueueTree.build` raises `QueueTreeError` with the node and the reason):
- names are unique; a parent must exist; no node is its own ancestor (no cycles);
- weights are positive; a limit is at least the node's guarantee, resource by resource;
- the children's guarantees fit in their parent's guarantee, when the parent has one, and in
  the parent's limit, when it has one; the root's children's guarantees fit in the fleet;
- only leaves hold pods (`require_leaf`); an inner node binds no namespace (the caller checks
  with `require_leaf` when binding).

Flat queues are the root's children: `QueueTree.flat(weights)` is today's world, and the fair
targets of a flat tree without guarantees or limits are exactly today's (the same code runs).

Amounts (guarantees, limits, the fleet) are in canonical units per resource, as
`lockgate.resources` gives them. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lockgate.labels import InvalidLabelError, validate_queue_name

if TYPE_CHECKING:
    from lockgate.queues import QueueSpec

# A guarantee may exceed what it must fit in by float rounding, never by more.
_FIT_SLACK = 1e-9


def in_operator_units(resource: str, amount: float) -> str:
    """A canonical amount as an operator writes it: cpu in cores (from millicores),
    memory-like resources in Gi (from bytes), others as they are. For `QueueTree.build`'s
    messages about queue definitions (whose amounts are canonical)."""
    if resource == "cpu":
        return f"{amount / 1000:g}"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        return f"{amount / 2**30:g}Gi"
    return f"{amount:g}"


class QueueTreeError(ValueError):
    """A tree that cannot be honoured; the message names the node and the reason."""


@dataclass(frozen=True, slots=True)
class TreeNode:
    """One node of the queue tree as an operator defines it.

    `parent` None: a child of the root. `weight` divides the parent's share among siblings.
    `guarantee`: resources the node gets when it asks for them (before weights divide the rest).
    `limit`: resources it never holds more of, borrowing included (None: no limit).
    """

    name: str
    parent: str | None = None
    weight: float = 1.0
    guarantee: Mapping[str, float] = field(default_factory=dict)
    limit: Mapping[str, float] | None = None


class QueueTree:
    """A validated queue tree (see the module docstring); build it with `build` or `flat`."""

    __slots__ = ("_children", "_depth", "_nodes")

    def __init__(self, nodes: Mapping[str, TreeNode], children: Mapping[str | None, list[str]],
                 depth: Mapping[str, int]) -> None:
        self._nodes = dict(nodes)
        self._children = {key: list(value) for key, value in children.items()}
        self._depth = dict(depth)

    # ---- building -------------------------------------------------------------------------

    @classmethod
    def flat(cls, weights: Mapping[str, float]) -> QueueTree:
        """Today's queues: every one a child of the root, with its weight, nothing else."""
        return cls.build([TreeNode(name=name, weight=weight) for name, weight in weights.items()])

    @classmethod
    def build(cls, nodes: Iterable[TreeNode], *,
              fleet: Mapping[str, float] | None = None,
              shown: Callable[[str, float], str] = lambda _, amount: f"{amount:g}",
              ) -> QueueTree:
        """Validate `nodes` as a tree (the module docstring's rules). `fleet`: what the pool
        holds per resource; with it, the root's children's guarantees must fit in it.
        `shown`: how a message writes an amount of a resource (`in_operator_units`)."""
        by_name: dict[str, TreeNode] = {}
        for node in nodes:
            try:
                validate_queue_name(node.name)
            except InvalidLabelError as error:
                raise QueueTreeError(str(error)) from error
            if node.name in by_name:
                raise QueueTreeError(f"queue {node.name!r} is defined twice")
            if not node.weight > 0:
                raise QueueTreeError(
                    f"queue {node.name!r}: weight must be positive, got {node.weight}")
            for kind, amounts in (("guarantee", node.guarantee), ("limit", node.limit or {})):
                for resource, amount in amounts.items():
                    if not amount >= 0:
                        raise QueueTreeError(
                            f"queue {node.name!r}: {kind} of {resource} must not be negative, "
                            f"got {amount}")
            if node.limit is not None:
                for resource, amount in node.guarantee.items():
                    if resource in node.limit and node.limit[resource] < amount:
                        raise QueueTreeError(
                            f"queue {node.name!r}: its limit of {resource} "
                            f"({shown(resource, node.limit[resource])}) is below its guarantee "
                            f"({shown(resource, amount)})")
            by_name[node.name] = node
        children: dict[str | None, list[str]] = {None: []}
        for name in sorted(by_name):
            parent = by_name[name].parent
            if parent is not None and parent not in by_name:
                raise QueueTreeError(f"queue {name!r}: its parent {parent!r} is not defined")
            children.setdefault(parent, []).append(name)
        depth: dict[str, int] = {}
        for name in sorted(by_name):
            chain: list[str] = []
            at: str | None = name
            while at is not None and at not in depth:
                if at in chain:
                    cycle = [*chain[chain.index(at):], at]
                    raise QueueTreeError("queues form a cycle: " + " -> ".join(cycle))
                chain.append(at)
                at = by_name[at].parent
            base = 0 if at is None else depth[at] + 1
            for offset, member in enumerate(reversed(chain)):
                depth[member] = base + offset
        tree = cls(by_name, children, depth)
        tree._check_guarantees(fleet, shown)
        return tree

    def _check_guarantees(self, fleet: Mapping[str, float] | None,
                          shown: Callable[[str, float], str]) -> None:
        """Children's guarantees fit in their parent's guarantee and limit; all of them fit in
        the fleet. A node without a guarantee of its own stands for its children's together
        (so guarantees deep under unguaranteed nodes still have to fit in the fleet)."""
        standing: dict[str, dict[str, float]] = {}  # what each node's guarantees add up to
        for parent in [*reversed(self.names), None]:
            kids = self._children.get(parent, []) if parent is not None else self._children[None]
            summed: dict[str, float] = {}
            for kid in kids:
                for resource, amount in standing.get(kid, {}).items():
                    summed[resource] = summed.get(resource, 0.0) + amount
            bounds: list[tuple[str, Mapping[str, float], bool]] = []
            if parent is None:
                if fleet is not None:
                    bounds.append(("the fleet", fleet, True))
                what = "the root's children"
            else:
                node = self._nodes[parent]
                if any(node.guarantee.values()):
                    bounds.append((f"{parent!r}'s guarantee", node.guarantee, True))
                if node.limit is not None:
                    bounds.append((f"{parent!r}'s limit", node.limit, False))
                what = f"the children of {parent!r}"
                own = {r: a for r, a in node.guarantee.items() if a > 0}
                standing[parent] = own if own else summed
            for label, bound, every_resource in bounds:
                for resource, amount in sorted(summed.items()):
                    if amount <= 0:
                        continue
                    room = bound.get(resource)
                    if room is None:
                        if not every_resource:
                            continue  # the limit does not bound this resource
                        room = 0.0
                    if amount > room * (1 + _FIT_SLACK) + _FIT_SLACK:
                        raise QueueTreeError(
                            f"the guarantees of {what} ask for {shown(resource, amount)} "
                            f"{resource}, more than {label} ({shown(resource, room)})")

    # ---- reading --------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def node(self, name: str) -> TreeNode:
        return self._nodes[name]

    @property
    def names(self) -> list[str]:
        """Every node, parents before children, siblings in name order."""
        return sorted(self._nodes, key=lambda name: (self._depth[name], name))

    def children(self, name: str | None) -> list[str]:
        """The children of `name` (None: the root's), in name order."""
        return self._children.get(name, [])

    def parent(self, name: str) -> str | None:
        return self._nodes[name].parent

    def depth(self, name: str) -> int:
        """0 for the root's children."""
        return self._depth[name]

    def is_leaf(self, name: str) -> bool:
        return name in self._nodes and not self._children.get(name)

    @property
    def leaves(self) -> list[str]:
        return sorted(name for name in self._nodes if not self._children.get(name))

    def ancestors(self, name: str) -> list[str]:
        """From the node's parent up to the root's child it hangs from."""
        found: list[str] = []
        at = self._nodes[name].parent
        while at is not None:
            found.append(at)
            at = self._nodes[at].parent
        return found

    def path(self, name: str) -> str:
        """The node's path from the root, for a reader: `research/vision/alice`."""
        return "/".join([*reversed(self.ancestors(name)), name])

    def leaves_under(self, name: str) -> list[str]:
        """The leaves of the subtree rooted at `name` (itself, when it is a leaf)."""
        found: list[str] = []
        stack = [name]
        while stack:
            at = stack.pop()
            kids = self._children.get(at)
            if kids:
                stack.extend(kids)
            else:
                found.append(at)
        return sorted(found)

    @property
    def is_flat(self) -> bool:
        """Today's world: every node a child of the root, with no guarantee and no limit (then
        the fair targets are today's, computed by today's code)."""
        return all(node.parent is None and not any(node.guarantee.values())
                   and node.limit is None for node in self._nodes.values())

    def require_leaf(self, name: str) -> None:
        """Raise unless `name` is a leaf: only leaves hold pods and bind namespaces."""
        if name not in self._nodes:
            raise QueueTreeError(f"queue {name!r} is not defined")
        kids = self._children.get(name)
        if kids:
            raise QueueTreeError(
                f"queue {name!r} has child queues ({', '.join(kids)}): only a leaf holds pods; "
                f"name one of its leaves")

    def with_weights(self, weights: Mapping[str, float]) -> QueueTree:
        """The same tree with some nodes' weights replaced (the history rule's effective
        weights, lockgate.scheduler.costs.effective_weight)."""
        nodes = {name: node if name not in weights else TreeNode(
            name=name, parent=node.parent, weight=weights[name], guarantee=node.guarantee,
            limit=node.limit) for name, node in self._nodes.items()}
        for name, weight in weights.items():
            if name in nodes and not weight > 0:
                raise QueueTreeError(f"queue {name!r}: weight must be positive, got {weight}")
        return QueueTree(nodes, self._children, self._depth)


# ---- the tree of queue definitions (QueueSpec's parent, guarantee and resource_limits) ------


def tree_node_of(spec: QueueSpec) -> TreeNode:
    """A queue definition as a tree node: its weight, its guarantee, and `resource_limits` as
    its limit (the same word for a leaf and an inner node: what it, or its subtree, never
    holds more of), all in canonical units."""
    limits = spec.limits
    return TreeNode(name=spec.name, parent=spec.parent, weight=spec.weight,
                    guarantee={name: float(amount) for name, amount in spec.guaranteed.items()},
                    limit={name: float(amount) for name, amount in limits.items()} or None)


def tree_of_queues(specs: Iterable[QueueSpec], *,
                   fleet: Mapping[str, float] | None = None) -> QueueTree:
    """The queue definitions as a validated tree (`QueueTree.build`'s rules), and one rule of
    their own: a queue with child queues binds no namespace (only leaves hold pods).
    `fleet`: what the pool holds, in canonical units (None: not checked)."""
    specs = list(specs)
    tree = QueueTree.build([tree_node_of(spec) for spec in specs], fleet=fleet,
                           shown=in_operator_units)
    for spec in specs:
        kids = tree.children(spec.name)
        if kids and spec.namespaces:
            raise QueueTreeError(
                f"queue {spec.name!r} has child queues ({', '.join(kids)}) and binds "
                f"namespaces: only a leaf holds pods; bind the namespaces to one of its leaves")
    return tree


def scheduling_tree(specs: Iterable[QueueSpec]) -> QueueTree | None:
    """The tree the fair targets divide by, or None for today's flat path: when every queue
    is a child of the root with no guarantee and no limit that the tree would add (a flat
    queue's `resource_limits` is enforced by the round, as ever, and does not make the tree
    hierarchical). Raises QueueTreeError for definitions that are not a tree."""
    specs = list(specs)
    tree = tree_of_queues(specs)
    if all(spec.parent is None and not any(spec.guaranteed.values())
           and not tree.children(spec.name) for spec in specs):
        return None
    return tree


def check_queue_definitions(specs: Iterable[QueueSpec], *, queues_with_pods: Iterable[str] = (),
                            fleet: Mapping[str, float] | None = None) -> QueueTree:
    """What the admin API checks before writing a queue: `specs` (every queue as it would be
    after the write) form a tree (`tree_of_queues`), and no queue that has child queues still
    has unfinished pods (`queues_with_pods`): only leaves hold pods, so a queue with pods
    cannot become a parent until they end (or move to a leaf)."""
    tree = tree_of_queues(specs, fleet=fleet)
    for name in sorted(set(queues_with_pods)):
        kids = tree.children(name) if name in tree else []
        if kids:
            raise QueueTreeError(
                f"queue {name!r} has unfinished pods, so it cannot be the parent of "
                f"{', '.join(kids)}: only a leaf holds pods; let its pods end, or make the new "
                f"queues children of another queue")
    return tree
