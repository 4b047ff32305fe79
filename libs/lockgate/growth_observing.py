"""Observing an autoscaler: Karpenter's NodePools and NodeClaims as one ClusterGrowth, no I/O.

Why pure: what a cluster may still grow by is read from two kinds of object the apiserver serves
(`karpenter.sh/v1` NodePool and NodeClaim) in the shape Karpenter writes them, and the reading
holds the decisions worth testing without an apiserver: which amounts a pool caps and has, what
every node it makes carries, whether Karpenter provisions from it at all, and when a NodeClaim
has failed. The watcher lists and watches both kinds and feeds them to `ObservedGrowth`, which
answers with the picture to publish and says when it changed.

What is read, checked against Karpenter v1.13.0 (`pkg/apis/v1`, the condition sets of
github.com/awslabs/operatorpkg `status`, `pkg/controllers/nodeclaim/lifecycle`, and the
provisioner):

- NodePool: `spec.limits` (a resource not named is unbounded; `nodes` caps the node count) and
  `status.resources` (what the pool has, NodeClaims in flight included, and `nodes`), in
  canonical units; `spec.template.spec.requirements` (`minValues` is not kept: it constrains
  how many instance types Karpenter must consider, not where a pod may land), the template's
  labels plus `karpenter.sh/nodepool=<name>` (Karpenter writes it on every node it makes, and
  pods select pools by it), its taints (`startupTaints` are not kept: they go before pods land,
  and Karpenter ignores them when provisioning), and `spec.weight`.
- Whether Karpenter provisions from a pool: its provisioner skips a pool whose Ready condition
  is not True, a pool being deleted and a static pool (`spec.replicas` set, a fixed node count
  that pods do not move). Each is reported as `ready=False` with why (for Ready, the reason and
  message of the dependent condition that is False, ValidationSucceeded or NodeClassReady, else
  Ready's own); a pool that has no Ready condition yet has not been reconciled by Karpenter (is
  it running?).
- NodeClaim: its pool (label `karpenter.sh/nodepool`), `status.allocatable` (else
  `status.capacity`), `status.nodeName`, and the conditions Launched, Registered and
  Initialized. A claim has failed when Launched is False, or Unknown with a reason other than
  the initial AwaitingReconciliation (Karpenter v1.13 leaves a failed launch Unknown with the
  cloud provider's reason, or "LaunchFailed", and retries it), or when Registered or Initialized
  is False (e.g. MultipleNodesFound). Waiting reasons (NodeNotFound, RegistrationHookPending,
  NodeNotReady, StartupTaintsExist, ...) are Unknown, not failures. A claim that failed for lack
  of capacity (InsufficientCapacity) is deleted by Karpenter at once: it shows as `deleting`
  while its finalizer runs, then it is gone, and the pool's Ready or NodeRegistrationHealthy
  conditions say the rest.
- Which NodeClaims are published: those in flight, i.e. not yet Initialized, failed, or being
  deleted. An initialized claim is a node like any other, in the cluster's ClusterCapacity (and
  already in its pool's `status.resources`); leaving those out keeps the message small in a
  large cluster.

Malformed objects (a quantity that does not parse, a taint without a key, no name) raise
`MalformedObjectError`, which names the object: the watcher logs it and leaves the object out
of the picture, and goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from lockgate.events import ClusterGrowth, NodeClaimStatus, NodePoolStatus
from lockgate.placement import Requirement, Taint
from lockgate.resources import InvalidQuantityError, canonical_amount

KubeObject = Mapping[str, Any]

KARPENTER_GROUP = "karpenter.sh"
KARPENTER_VERSION = "v1"
NODE_POOLS = "nodepools"
NODE_CLAIMS = "nodeclaims"
NODE_POOL_LABEL = "karpenter.sh/nodepool"

# operatorpkg's `SetUnknown`: the reason of a condition nobody has worked on yet.
_AWAITING = "AwaitingReconciliation"
# What a NodePool's Ready condition is made of (Karpenter's NodePool ready set).
_POOL_READY_SET = ("ValidationSucceeded", "NodeClassReady")
# Claim conditions whose False means the claim failed (Karpenter's NodeClaim ready set).
_LIFECYCLE = ("Launched", "Registered", "Initialized")


class MalformedObjectError(ValueError):
    """A NodePool or NodeClaim that cannot be read; the message names it and what is wrong."""


def _describe(kind: str, obj: KubeObject) -> str:
    name = (obj.get("metadata") or {}).get("name") if isinstance(obj, Mapping) else None
    return f"{kind} {name!r}" if name else f"{kind} without a name"


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} is a {type(value).__name__}, not an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"{where} is a {type(value).__name__}, not a list")
    return value


def _amounts(quantities: Any, where: str) -> dict[str, int]:
    amounts = {str(name): canonical_amount(str(name), quantity)
               for name, quantity in _mapping(quantities, where).items()}
    negative = sorted(name for name, amount in amounts.items() if amount < 0)
    if negative:
        raise ValueError(f"{where} has negative amounts of {', '.join(negative)}")
    return amounts


def _conditions(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found = {}
    for index, condition in enumerate(_list(status.get("conditions"), "status.conditions")):
        condition = _mapping(condition, f"status.conditions[{index}]")
        found[str(condition.get("type", ""))] = condition
    return found


def _because(condition: Mapping[str, Any]) -> str:
    reason, message = str(condition.get("reason") or ""), str(condition.get("message") or "")
    return f"{reason}: {message}" if reason and message else reason or message


def _taint(item: Any, where: str) -> Taint:
    item = _mapping(item, where)
    if not item.get("key") or not item.get("effect"):
        raise ValueError(f"{where} needs a key and an effect")
    return Taint(key=str(item["key"]), value=str(item.get("value") or ""),
                 effect=str(item["effect"]))


def _requirement(item: Any, where: str) -> Requirement:
    item = _mapping(item, where)
    if not item.get("key") or not item.get("operator"):
        raise ValueError(f"{where} needs a key and an operator")
    return Requirement(key=str(item["key"]), operator=str(item["operator"]),
                       values=tuple(str(v) for v in _list(item.get("values"), f"{where}.values")))


def _reading(kind: str, obj: KubeObject, read: Callable[[], Any]) -> Any:
    """`read()`, its failures turned into one error naming the object."""
    try:
        if not isinstance(obj, Mapping):
            raise TypeError(f"is a {type(obj).__name__}, not an object")
        return read()
    except (InvalidQuantityError, ValidationError, ValueError, TypeError, KeyError) as error:
        raise MalformedObjectError(f"{_describe(kind, obj)}: {error}") from error


def node_pool_status(pool: KubeObject) -> NodePoolStatus:
    """One NodePool as lockgate reads it (see the module docstring)."""
    def read() -> NodePoolStatus:
        metadata = _mapping(pool.get("metadata"), "metadata")
        name = str(metadata.get("name") or "")
        if not name:
            raise ValueError("metadata.name is missing")
        spec = _mapping(pool.get("spec"), "spec")
        status = _mapping(pool.get("status"), "status")
        template = _mapping(spec.get("template"), "spec.template")
        template_spec = _mapping(template.get("spec"), "spec.template.spec")
        labels = {str(k): str(v) for k, v in _mapping(
            _mapping(template.get("metadata"), "spec.template.metadata").get("labels"),
            "spec.template.metadata.labels").items()}
        labels[NODE_POOL_LABEL] = name
        weight = spec.get("weight")
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int)):
            raise ValueError(f"spec.weight {weight!r} is not an integer")
        ready, why = _provisions(metadata, spec, _conditions(status))
        return NodePoolStatus(
            name=name,
            limits=_amounts(spec.get("limits"), "spec.limits"),
            in_use=_amounts(status.get("resources"), "status.resources"),
            requirements=tuple(
                _requirement(item, f"spec.template.spec.requirements[{i}]")
                for i, item in enumerate(_list(template_spec.get("requirements"),
                                               "spec.template.spec.requirements"))),
            labels=labels,
            taints=tuple(_taint(item, f"spec.template.spec.taints[{i}]") for i, item in
                         enumerate(_list(template_spec.get("taints"),
                                         "spec.template.spec.taints"))),
            ready=ready,
            not_ready_reason=why,
            weight=weight or 0,
        )

    result: NodePoolStatus = _reading("NodePool", pool, read)
    return result


def _provisions(metadata: Mapping[str, Any], spec: Mapping[str, Any],
                conditions: Mapping[str, Mapping[str, Any]]) -> tuple[bool, str]:
    """Whether Karpenter's provisioner makes nodes from this pool for pods, and if not why."""
    if metadata.get("deletionTimestamp"):
        return False, "being deleted: Karpenter makes no more nodes for it"
    if spec.get("replicas") is not None:
        return False, ("static (spec.replicas): Karpenter keeps its node count fixed and does "
                       "not provision for pods")
    ready = conditions.get("Ready")
    if ready is None:
        return False, "no Ready condition yet: Karpenter has not reconciled it (is it running?)"
    if ready.get("status") == "True":
        return True, ""
    # Ready's own message only lists its dependents ("NodeClassReady=False"): say the first
    # unhealthy dependent's reason instead, which names the cause.
    for kind in _POOL_READY_SET:
        dependent = conditions.get(kind)
        if dependent is not None and dependent.get("status") == "False":
            return False, f"{kind}: {_because(dependent)}"
    return False, _because(ready) or f"Ready is {ready.get('status')}"


def node_claim_status(claim: KubeObject) -> NodeClaimStatus:
    """One NodeClaim as lockgate reads it (see the module docstring)."""
    def read() -> NodeClaimStatus:
        metadata = _mapping(claim.get("metadata"), "metadata")
        name = str(metadata.get("name") or "")
        if not name:
            raise ValueError("metadata.name is missing")
        labels = _mapping(metadata.get("labels"), "metadata.labels")
        pool = str(labels.get(NODE_POOL_LABEL) or "")
        if not pool:
            raise ValueError(f"it has no {NODE_POOL_LABEL} label: no NodePool made it")
        created = metadata.get("creationTimestamp")
        if not created:
            raise ValueError("metadata.creationTimestamp is missing")
        status = _mapping(claim.get("status"), "status")
        conditions = _conditions(status)
        allocatable = status.get("allocatable")
        return NodeClaimStatus(
            name=name,
            node_pool=pool,
            created_at=_timestamp(str(created)),
            allocatable=(_amounts(allocatable, "status.allocatable") if allocatable
                         else _amounts(status.get("capacity"), "status.capacity")),
            node_name=str(status.get("nodeName") or ""),
            launched=_is_true(conditions, "Launched"),
            registered=_is_true(conditions, "Registered"),
            initialized=_is_true(conditions, "Initialized"),
            failure=claim_failure(conditions),
            deleting=bool(metadata.get("deletionTimestamp")),
        )

    result: NodeClaimStatus = _reading("NodeClaim", claim, read)
    return result


def _is_true(conditions: Mapping[str, Mapping[str, Any]], kind: str) -> bool:
    return (conditions.get(kind) or {}).get("status") == "True"


def claim_failure(conditions: Mapping[str, Mapping[str, Any]]) -> str:
    """Why a NodeClaim failed, "Launched: reason: message", or "" (see the module docstring)."""
    launched = conditions.get("Launched")
    if launched is not None and (
            launched.get("status") == "False"
            or (launched.get("status") == "Unknown"
                and str(launched.get("reason") or _AWAITING) != _AWAITING)):
        return f"Launched: {_because(launched)}"
    for kind in _LIFECYCLE[1:]:
        condition = conditions.get(kind)
        if condition is not None and condition.get("status") == "False":
            return f"{kind}: {_because(condition)}"
    return ""


def _timestamp(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def in_flight(claim: NodeClaimStatus) -> bool:
    """Not yet a node like any other: not initialized, failed, or being deleted."""
    return not claim.initialized or bool(claim.failure) or claim.deleting


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ObservedGrowth:
    """One cluster's NodePools and NodeClaims as listed and watched, and the picture of them.

    `revision` grows whenever what would be published changes (a status update that changes
    nothing lockgate reads, such as a claim's lastPodEventTime, leaves it alone), so the watcher
    knows when a new ClusterGrowth is due. `unreadable` keeps, per kind and name, why an object
    could not be read, for the watcher to report; such an object is left out of the picture.
    """

    def __init__(self, cluster: str, *, now: Callable[[], datetime] = _utc_now) -> None:
        self.cluster = cluster
        self._now = now
        self._pools: dict[str, NodePoolStatus] = {}
        self._claims: dict[str, NodeClaimStatus] = {}
        self.pools_listed = False
        self.claims_listed = False
        # None: not known yet; False: the cluster serves no NodePool kind (no Karpenter).
        self.served: bool | None = None
        self.revision = 0
        self.unreadable: dict[tuple[str, str], str] = {}

    @property
    def known(self) -> bool:
        """Whether a picture can be published: both kinds listed, or neither served."""
        return self.served is False or (self.pools_listed and self.claims_listed)

    def not_served(self) -> bool:
        """The cluster serves no NodePool or NodeClaim kind (its CRDs are absent), or the
        watcher may not see them: forget what was seen, the cluster counts as not autoscaled.
        True if that is news."""
        news = self.served is not False
        self.served = False
        self._pools.clear()
        self._claims.clear()
        self.pools_listed = self.claims_listed = False
        self.unreadable.clear()
        if news:
            self.revision += 1
        return news

    def relist_pools(self, pools: Iterable[KubeObject]) -> list[MalformedObjectError]:
        """Replace the NodePools with a full list; the objects that could not be read."""
        read, problems = _read_all(pools, node_pool_status, "NodePool", self.unreadable)
        self._replace(self._pools, read)
        self.pools_listed = True
        self._now_served()
        return problems

    def relist_claims(self, claims: Iterable[KubeObject]) -> list[MalformedObjectError]:
        """Replace the NodeClaims with a full list; the objects that could not be read."""
        read, problems = _read_all(claims, node_claim_status, "NodeClaim", self.unreadable)
        self._replace(self._claims, read)
        self.claims_listed = True
        self._now_served()
        return problems

    def observe_pool(self, pool: KubeObject, *, deleted: bool = False) -> None:
        """Take in one NodePool's change; raises MalformedObjectError (the pool is then left
        out) when it cannot be read."""
        self._observe(self._pools, pool, node_pool_status, "NodePool", deleted=deleted)

    def observe_claim(self, claim: KubeObject, *, deleted: bool = False) -> None:
        """Take in one NodeClaim's change; raises MalformedObjectError (the claim is then left
        out) when it cannot be read."""
        self._observe(self._claims, claim, node_claim_status, "NodeClaim", deleted=deleted)

    def growth(self) -> ClusterGrowth:
        """The whole picture now: pools by name, the claims in flight by name."""
        if self.served is False:
            return ClusterGrowth(cluster=self.cluster, observed_at=self._now(), autoscaled=False)
        return ClusterGrowth(
            cluster=self.cluster, observed_at=self._now(), autoscaled=True,
            node_pools=[self._pools[name] for name in sorted(self._pools)],
            node_claims=[self._claims[name] for name in sorted(self._claims)
                         if in_flight(self._claims[name])])

    def _now_served(self) -> None:
        if self.served is not True:
            self.served = True
            self.revision += 1

    def _replace(self, kept: dict[str, Any], read: dict[str, Any]) -> None:
        if kept != read:
            kept.clear()
            kept.update(read)
            self.revision += 1

    def _observe(self, kept: dict[str, Any], obj: KubeObject,
                 parse: Callable[[KubeObject], Any], kind: str, *, deleted: bool) -> None:
        name = str(((obj.get("metadata") if isinstance(obj, Mapping) else None) or {})
                   .get("name") or "")
        if deleted:
            self.unreadable.pop((kind, name), None)
            if kept.pop(name, None) is not None:
                self.revision += 1
            return
        try:
            status = parse(obj)
        except MalformedObjectError as error:
            self.unreadable[(kind, name)] = str(error)
            if kept.pop(name, None) is not None:
                self.revision += 1
            raise
        self.unreadable.pop((kind, name), None)
        if kept.get(name) != status:
            kept[name] = status
            self.revision += 1


def _read_all(objects: Iterable[KubeObject], parse: Callable[[KubeObject], Any], kind: str,
              unreadable: dict[tuple[str, str], str]
              ) -> tuple[dict[str, Any], list[MalformedObjectError]]:
    read: dict[str, Any] = {}
    problems: list[MalformedObjectError] = []
    for key in [key for key in unreadable if key[0] == kind]:
        del unreadable[key]
    for obj in objects:
        try:
            status = parse(obj)
        except MalformedObjectError as error:
            name = str(((obj.get("metadata") if isinstance(obj, Mapping) else None) or {})
                       .get("name") or "")
            unreadable[(kind, name)] = str(error)
            problems.append(error)
            continue
        read[status.name] = status
    return read, problems


# ---- checking a picture before it is stored (queue-store) ----------------------------------

def growth_problem(growth: ClusterGrowth) -> str | None:
    """Why a well-formed ClusterGrowth cannot be stored (it goes to the dead letters), or None.

    Also keeps out what Postgres would refuse (a NUL character anywhere: jsonb has none).
    """
    if not growth.cluster.strip():
        return "cluster must not be empty"
    if growth.observed_at.tzinfo is None:
        return "observed_at has no time zone"
    if "\\u0000" in growth.model_dump_json():
        return "contains a NUL character"
    if not growth.autoscaled and (growth.node_pools or growth.node_claims):
        return "a cluster that is not autoscaled lists NodePools or NodeClaims"
    pools: set[str] = set()
    for pool in growth.node_pools:
        if not pool.name.strip():
            return "a NodePool has no name"
        if pool.name in pools:
            return f"NodePool {pool.name!r} is listed twice"
        pools.add(pool.name)
        if problem := (_amounts_problem(f"NodePool {pool.name} limits", pool.limits)
                       or _amounts_problem(f"NodePool {pool.name} in_use", pool.in_use)):
            return problem
    claims: set[str] = set()
    for claim in growth.node_claims:
        if not claim.name.strip():
            return "a NodeClaim has no name"
        if claim.name in claims:
            return f"NodeClaim {claim.name!r} is listed twice"
        claims.add(claim.name)
        if claim.created_at.tzinfo is None:
            return f"NodeClaim {claim.name} created_at has no time zone"
        if problem := _amounts_problem(f"NodeClaim {claim.name} allocatable", claim.allocatable):
            return problem
    return None


def _amounts_problem(what: str, amounts: Mapping[str, int]) -> str | None:
    for resource, amount in amounts.items():
        if not resource.strip():
            return f"{what}: blank resource name"
        if amount < 0:
            return f"{what}: {resource} is negative ({amount})"
    return None
