"""Observing a cluster: what cluster-watcher reports about its pods and nodes, decided without I/O.

Why pure: the watcher's correctness rests on a few decisions that must be testable without an
apiserver — which pods lockgate manages, which state a pod is in, how much a pod asks for (as
kube-scheduler counts it), how much room pods lockgate does not manage take on each node, and
which changes are worth an event at all. The watcher feeds `ObservedCluster` with what it lists
and watches; `ObservedCluster` answers with the events to publish.

Which pods are lockgate's: a pod is a job of its queue only if it carries the queue label AND
its namespace is managed (`lockgate.io/managed=true`, never kube-system and the like). A label
alone proves nothing: anyone can write it, in any namespace, on a pod bound by `nodeName` too.
Everything else is unmanaged usage (room taken on nodes). The verdict is taken once per pod, when
the watcher first sees it with its namespace known, and kept for the pod's life: relabelling a
namespace later neither orphans its running jobs nor turns its old pods into jobs. A pod whose
namespace is not known yet (the two watches race) waits until the namespace is seen.

Pods that skipped the gate (`skipped_the_gate`): a pod that names a queue (its own label, or
its namespace's, which the webhook would have copied onto it) but that no lockgate webhook ever
gated (no gate, and no `lockgate.io/labels-from` annotation, which the webhook writes on every
pod it gates). It runs outside its queue's turn, and nobody would know:
the webhook does not serve its namespace (under `make run`, a namespace without
`lockgate.io/run=dev`), or it was down and failed open. Such a pod is reported as a job, marked
`skipped_gate` (with its namespace's labels), when its namespace is managed
(`lockgate.io/managed=true`) even if it lacks this installation's own labels: queue-store counts
it as its queue's usage only if the queue binds its namespace, and drops it otherwise (the pod
is then counted nowhere: a known gap, for a pod no lockgate gated, that carries a queue label
no queue binds). The watcher also sends it one notice (`notices_for`), which the ungater writes
as a Warning Event on the pod. A pod bound to a node at creation is never gated either; it is
reported the same way, since nothing on a running pod tells the two apart after a relist.

Pods the autoscaler disrupted (`disrupted_by_autoscaler`): Karpenter disrupts a node
(consolidation, drift, expiry, its NodeClaim deleted) by tainting it `karpenter.sh/disrupted:
NoSchedule` and then evicting the pods that do not tolerate the taint. A managed pod being
deleted on such a node is reported so, and its replacement keeps its place in line
(lockgate.places). What marks it is the node's taint, which a tenant cannot put, as the watcher
last saw it (a node deleted while tainted is remembered, as pod and node watches race); not the
pod's DisruptionTarget condition, which a tenant's own eviction sets too.

Pods and nodes are read in the apiserver's JSON form (camelCase keys, as a watch event's raw
object or a list response's items), not as client models.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lockgate.events import ClusterCapacity, ClusterSnapshot, NodeCapacity, PodEvent, PodNotice
from lockgate.groups import InvalidPodGroupError, pod_group
from lockgate.jobs import JobState
from lockgate.labels import (
    ADMISSION_TRACE_ANNOTATION,
    DEFAULT_JOBSET,
    JOBSET_LABEL,
    LABEL_SOURCE_ANNOTATION,
    NEVER_MANAGED_NAMESPACES,
    PREEMPTIBLE_LABEL,
    QUEUE_LABEL,
    SCHEDULING_GATE,
    is_managed_namespace,
)
from lockgate.max_queued import read_from_pod
from lockgate.noticing import NoticeReason, skipped_gate_message
from lockgate.placement import (
    PodPlacement,
    Taint,
    labels_of_node,
    placement_of_pod,
    taints_of_node,
    tolerates,
)
from lockgate.resources import Resources

KubeObject = Mapping[str, Any]
"""A Kubernetes object as the apiserver serialises it."""

_FINISHED_PHASES: Mapping[str, JobState] = {
    "Succeeded": JobState.SUCCEEDED,
    "Failed": JobState.FAILED,
}


def _metadata(obj: KubeObject) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _spec(obj: KubeObject) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def _status(obj: KubeObject) -> Mapping[str, Any]:
    return obj.get("status") or {}


def is_managed(pod: KubeObject) -> bool:
    """Whether the pod carries a queue label: necessary, not sufficient, to be lockgate's (its
    namespace must be managed too; `ObservedCluster` decides).

    The label, not the gate, is the mark: the gate is gone once lockgate released the pod, but
    the pod stays lockgate's until it finishes.
    """
    labels = _metadata(pod).get("labels") or {}
    return bool(labels.get(QUEUE_LABEL))


def is_gated_by_lockgate(pod: KubeObject) -> bool:
    gates = _spec(pod).get("schedulingGates") or ()
    return any(gate.get("name") == SCHEDULING_GATE for gate in gates)


def never_admitted(pod: KubeObject) -> bool:
    """Whether no lockgate webhook ever gated the pod: it has no gate now and no trace of the
    webhook's answer (the `lockgate.io/labels-from` annotation it writes on every pod it gates,
    kept when the gate is removed)."""
    annotations = _metadata(pod).get("annotations") or {}
    return not is_gated_by_lockgate(pod) and LABEL_SOURCE_ANNOTATION not in annotations


def queue_of(pod: KubeObject, namespace_labels: Mapping[str, str] | None = None) -> str:
    """The queue the pod names: its own label, else its namespace's ("" none)."""
    labels = _metadata(pod).get("labels") or {}
    return str(labels.get(QUEUE_LABEL) or (namespace_labels or {}).get(QUEUE_LABEL) or "")


def skipped_the_gate(pod: KubeObject, namespace_labels: Mapping[str, str] | None = None) -> bool:
    """Whether a pod that names a queue (itself, or by its namespace's label) was never gated
    by lockgate (`never_admitted`)."""
    return bool(queue_of(pod, namespace_labels)) and never_admitted(pod)


def is_being_deleted(pod: KubeObject) -> bool:
    return bool(_metadata(pod).get("deletionTimestamp"))


def observed_state(pod: KubeObject, *, deleted: bool = False) -> JobState:
    """The state a pod is seen in; `deleted` when the watch reported it DELETED.

    A pod that finished keeps its outcome even when it is deleted afterwards: how it ended is
    the more useful fact, and terminal states are final anyway.
    """
    phase = str(_status(pod).get("phase", ""))
    if phase in _FINISHED_PHASES:
        return _FINISHED_PHASES[phase]
    if deleted or is_being_deleted(pod):
        return JobState.DELETED
    if phase == "Running":
        return JobState.RUNNING
    if _spec(pod).get("nodeName"):
        return JobState.BOUND
    if is_gated_by_lockgate(pod):
        return JobState.QUEUED
    return JobState.UNGATED


# Karpenter's taint on a node it disrupts (sigs.k8s.io/karpenter v1 DisruptedNoScheduleTaint):
# set before it evicts the node's pods, by the disruption and termination controllers only.
AUTOSCALER_DISRUPTED_TAINT = Taint(key="karpenter.sh/disrupted", effect="NoSchedule")
# How many nodes deleted while tainted are remembered (a pod's deletion may be seen after its
# node's); the oldest are forgotten first.
_REMEMBERED_DISRUPTED_NODES = 4096


def carries_disrupted_taint(taints: Iterable[Taint]) -> bool:
    return any(taint.key == AUTOSCALER_DISRUPTED_TAINT.key
               and taint.effect == AUTOSCALER_DISRUPTED_TAINT.effect for taint in taints)


def disrupted_by_autoscaler(pod: KubeObject, *, node_disrupted: bool,
                            deleted: bool = False) -> bool:
    """Whether the autoscaler took this pod's node away while it was on it: the pod is being
    deleted (or was), bound to a node that carried Karpenter's disrupted taint
    (`node_disrupted`), and does not tolerate the taint (Karpenter evicts only those that do
    not: one that does was deleted by someone else). Not the DisruptionTarget condition: any
    eviction sets it, a tenant's of their own pod too."""
    if not node_disrupted or not _spec(pod).get("nodeName"):
        return False
    if not (deleted or is_being_deleted(pod)):
        return False
    placement = placement_of_pod(_spec(pod))
    tolerations = () if placement is None else placement.tolerations
    return not any(tolerates(toleration, AUTOSCALER_DISRUPTED_TAINT)
                   for toleration in tolerations)


def _container_requests(container: Mapping[str, Any]) -> Resources:
    return Resources.from_kubernetes((container.get("resources") or {}).get("requests"))


def _max_per_resource(a: Resources, b: Resources) -> Resources:
    return Resources({name: max(a[name], b[name]) for name in {*a, *b}})


def pod_requests(pod: KubeObject) -> Resources:
    """What the pod asks of a node, computed the way kube-scheduler decides whether it fits.

    Regular containers run together, so their requests add up. Init containers run one after
    the other before them, so the pod needs at least the largest one. Sidecars (init containers
    with restartPolicy Always) keep running alongside everything started after them, so they add
    to the regular containers and to every later init container. Pod overhead comes on top.
    Pod-level requests, when set, replace the containers' total for the resources they name.
    """
    spec = _spec(pod)
    running_total = Resources.sum(_container_requests(c) for c in spec.get("containers") or ())
    sidecars_so_far = Resources()
    init_peak = Resources()
    for container in spec.get("initContainers") or ():
        requests = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            running_total = running_total + requests
            sidecars_so_far = sidecars_so_far + requests
            during_init = sidecars_so_far
        else:
            during_init = requests + sidecars_so_far
        init_peak = _max_per_resource(init_peak, during_init)
    effective = _max_per_resource(running_total, init_peak)
    pod_level = Resources.from_kubernetes((spec.get("resources") or {}).get("requests"))
    if pod_level:
        effective = Resources({**effective.as_dict(), **pod_level.as_dict()})
    return effective + Resources.from_kubernetes(spec.get("overhead"))


def _qualified_name(pod: KubeObject) -> str:
    metadata = _metadata(pod)
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def _timestamp(text: str | None, default: datetime) -> datetime:
    if not text:
        return default
    return datetime.fromisoformat(text)


def unschedulable(pod: KubeObject, observed_at: datetime) -> tuple[datetime, str] | None:
    """Since when, and why, kube-scheduler reports the pod Unschedulable (PodScheduled=False
    with reason Unschedulable); None when it does not."""
    for condition in _status(pod).get("conditions") or ():
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"):
            since = _timestamp(condition.get("lastTransitionTime"), observed_at)
            return since, str(condition.get("message") or "")[:1024]
    return None


def has_controller(pod: KubeObject) -> bool:
    """Whether an owner controls the pod (and would create a replacement if it were deleted)."""
    return any(ref.get("controller") for ref in _metadata(pod).get("ownerReferences") or ())


def controller_uid(pod: KubeObject) -> str:
    """The uid of the pod's controlling owner ("" if none): what identifies its controller
    across the pods it creates (a name may be reused by a new object, a uid never)."""
    for ref in _metadata(pod).get("ownerReferences") or ():
        if ref.get("controller") and ref.get("uid"):
            return str(ref["uid"])[:128]
    return ""


def pod_event(
    pod: KubeObject,
    *,
    cluster: str,
    event_id: str,
    observed_at: datetime,
    deleted: bool = False,
    snapshot_id: str | None = None,
    skipped_gate_in: Mapping[str, str] | None = None,
    node_disrupted: bool = False,
) -> PodEvent:
    """The event that reports a managed pod as it is seen now; `skipped_gate_in`: the labels of
    its namespace, for a pod that skipped the gate (see the module docstring)."""
    metadata = _metadata(pod)
    labels = metadata.get("labels") or {}
    if skipped_gate_in is not None:  # the namespace's queue and job set, as the webhook does
        labels = {QUEUE_LABEL: queue_of(pod, skipped_gate_in),
                  JOBSET_LABEL: skipped_gate_in.get(JOBSET_LABEL) or metadata.get("namespace"),
                  **labels}
    spec = _spec(pod)
    stuck = unschedulable(pod, observed_at)
    return PodEvent(
        event_id=event_id,
        cluster=cluster,
        namespace=metadata.get("namespace", ""),
        name=metadata.get("name", ""),
        uid=metadata.get("uid", ""),
        state=observed_state(pod, deleted=deleted),
        queue=labels.get(QUEUE_LABEL, ""),
        jobset=labels.get(JOBSET_LABEL) or DEFAULT_JOBSET,
        priority=int(spec.get("priority") or 0),
        requests=pod_requests(pod).as_dict(),
        node_name=spec.get("nodeName") or None,
        created_at=_timestamp(metadata.get("creationTimestamp"), observed_at),
        observed_at=observed_at,
        resource_version=metadata.get("resourceVersion", ""),
        gated=is_gated_by_lockgate(pod),
        snapshot_id=snapshot_id,
        admission_trace=(metadata.get("annotations") or {}).get(ADMISSION_TRACE_ANNOTATION),
        placement=placement_of_pod(spec),
        unschedulable_since=None if stuck is None else stuck[0],
        unschedulable_message="" if stuck is None else stuck[1],
        controlled=has_controller(pod),
        controller_uid=controller_uid(pod),
        max_queued=read_from_pod(metadata.get("annotations") or {}),
        skipped_gate=skipped_gate_in is not None,
        namespace_labels=dict(skipped_gate_in or {}),
        disrupted_by_autoscaler=disrupted_by_autoscaler(pod, node_disrupted=node_disrupted,
                                                        deleted=deleted),
        **_group_and_preemption(metadata, spec),
    )


def _group_and_preemption(metadata: KubeObject, spec: KubeObject) -> dict[str, Any]:
    """The pod's group (None if it names none or an invalid one, which the webhook refuses at
    admission: such a pod is then scheduled alone) and what makes it preemptible."""
    labels = metadata.get("labels") or {}
    try:
        group = pod_group(labels, metadata.get("annotations") or {})
    except InvalidPodGroupError:
        group = None
    return {
        "group": None if group is None else f"{metadata.get('namespace', '')}/{group.name}",
        "group_size": 0 if group is None else group.size,
        "group_max_size": 0 if group is None else group.max_size,
        "preemptible": labels.get(PREEMPTIBLE_LABEL) == "true",
        "priority_class": str(spec.get("priorityClassName") or ""),
    }


def holds_node_room(pod: KubeObject, *, deleted: bool = False) -> bool:
    """Whether the pod takes room on a node now: bound and not finished or gone.

    A pod being deleted still holds its node until it is gone, as kube-scheduler counts it.
    """
    if deleted or not _spec(pod).get("nodeName"):
        return False
    return _status(pod).get("phase") not in _FINISHED_PHASES


def is_node_schedulable(node: KubeObject) -> bool:
    """Not cordoned, and its kubelet reports Ready."""
    if _spec(node).get("unschedulable"):
        return False
    conditions = _status(node).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass(frozen=True)
class NodeRoom:
    """What lockgate needs to know of a node, without the usage of pods on it."""

    allocatable: Resources
    schedulable: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    @classmethod
    def of(cls, node: KubeObject) -> NodeRoom:
        return cls(
            allocatable=Resources.from_kubernetes(_status(node).get("allocatable")),
            schedulable=is_node_schedulable(node),
            labels=labels_of_node(node),
            taints=taints_of_node(node),
        )


def node_capacity(
    name: str, room: NodeRoom, unmanaged_usage: Mapping[str, int] | None = None
) -> NodeCapacity:
    return NodeCapacity(
        name=name,
        allocatable=room.allocatable.as_dict(),
        schedulable=room.schedulable,
        unmanaged_usage=dict(unmanaged_usage or {}),
        labels=dict(room.labels),
        taints=list(room.taints),
    )


@dataclass(frozen=True)
class _Observation:
    """The part of a managed pod whose change is worth a new event."""

    state: JobState
    node_name: str | None
    gated: bool
    requests: Resources
    placement: PodPlacement | None
    unschedulable_since: datetime | None
    disrupted_by_autoscaler: bool = False

    @classmethod
    def of(cls, event: PodEvent) -> _Observation:
        return cls(event.state, event.node_name, event.gated, Resources(event.requests),
                   event.placement, event.unschedulable_since, event.disrupted_by_autoscaler)


@dataclass(frozen=True)
class Snapshot:
    """What to publish after a (re)list: one event per managed pod, then the snapshot itself.

    `unreadable` names pods that could not be read (with why); a managed one is still listed in
    the snapshot, so it is not taken for vanished.
    """

    pod_events: list[PodEvent]
    cluster_snapshot: ClusterSnapshot
    unreadable: list[str] = field(default_factory=list)


@dataclass
class _PodAudit:
    watched_version: int
    gone: set[str] = field(default_factory=set)  # uids the watch reported deleted meanwhile


@dataclass(frozen=True)
class MissedPod:
    """A pod an audit found that the watch never reported, with the event it should have had
    and how far the watch had come (`ObservedCluster.end_pod_audit`)."""

    event: PodEvent
    watched_version: int


def _version(obj: KubeObject) -> int | None:
    try:
        return int(str(_metadata(obj).get("resourceVersion", "")))
    except ValueError:
        return None


def _new_id() -> str:
    return uuid.uuid4().hex


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ObservedCluster:
    """Everything the watcher knows of one cluster, and the events that changes to it call for.

    Managed pods: the last observation reported for each, so a MODIFIED event that changes
    nothing lockgate cares about (a status condition, an annotation) publishes nothing.
    Unmanaged pods and nodes: the capacity picture, with `capacity_revision` moving whenever the
    picture changes, so the watcher knows when a new ClusterCapacity is due.
    """

    def __init__(
        self,
        cluster: str,
        *,
        managed_namespace_labels: Mapping[str, str] | None = None,
        now: Callable[[], datetime] = _utc_now,
        new_id: Callable[[], str] = _new_id,
    ) -> None:
        self.cluster = cluster
        # Labels a managed namespace must carry too for its pods to be this installation's.
        self._required_labels = dict(managed_namespace_labels or {})
        self._now, self._new_id = now, new_id
        self._managed: dict[str, _Observation] = {}
        # uid -> (node, requests) of unmanaged pods that hold room on a node.
        self._unmanaged: dict[str, tuple[str, Resources]] = {}
        self._usage_by_node: dict[str, Resources] = {}
        self._nodes: dict[str, NodeRoom] = {}
        # Nodes gone while they carried the autoscaler's disrupted taint, oldest first.
        self._gone_disrupted: dict[str, None] = {}
        # Namespace labels, and the verdict on each pod that carries a queue label (kept for its
        # life, across relists): True = lockgate's job.
        self._namespaces: dict[str, Mapping[str, str]] = {}
        self._verdicts: dict[str, bool] = {}
        # Jobs that skipped the gate: uid -> their namespace's labels when judged; and those
        # already sent a notice (`notices_for`).
        self._skipped: dict[str, Mapping[str, str]] = {}
        self._noticed: set[str] = set()
        # The unfinished ones as last seen, for `resend_skipped`.
        self._skipped_pods: dict[str, KubeObject] = {}
        # Pods seen before their namespace, by namespace: judged once it is seen.
        self._pending: dict[str, dict[str, tuple[KubeObject, bool]]] = {}
        # The audit in progress (`begin_pod_audit`), if any.
        self._audit: _PodAudit | None = None
        # The newest pod resourceVersion taken in (list or watch), as a number; -1: none yet.
        self._newest_pod_version = -1
        self.namespaces_listed = False
        self.pods_listed = False
        self.nodes_listed = False
        self.capacity_revision = 0

    # Pods

    def relist_pods(self, pods: Iterable[KubeObject], *,
                    listed_at: datetime | None = None) -> Snapshot:
        """Replace what is known of pods with a fresh list; report every managed pod.

        `listed_at` is when the list *started*: a pod missing from it was gone by then, while a
        pod created during a long, paged list may be missing without being gone.
        """
        snapshot_id = self._new_id()
        listed_at = listed_at or self._now()
        self._audit = None  # what an audit compares with is replaced
        self._managed.clear()
        self._unmanaged.clear()
        self._usage_by_node.clear()
        self._pending.clear()
        pods = list(pods)
        listed_uids = {_metadata(pod).get("uid", "") for pod in pods}
        self._verdicts = {uid: v for uid, v in self._verdicts.items() if uid in listed_uids}
        self._skipped = {uid: v for uid, v in self._skipped.items() if uid in listed_uids}
        self._noticed &= listed_uids
        self._skipped_pods.clear()
        events: list[PodEvent] = []
        unfinished: list[str] = []
        ended: dict[JobState, list[str]] = {}
        unreadable: list[str] = []
        for pod in pods:
            self._note_version(pod)
            try:
                if not self._is_lockgates(pod, deleted=False):
                    self._track_unmanaged(pod, deleted=False)
                    continue
                event = pod_event(pod, cluster=self.cluster, event_id=self._new_id(),
                                  observed_at=listed_at, snapshot_id=snapshot_id,
                                  skipped_gate_in=self._skipped.get(_metadata(pod).get("uid", "")),
                                  node_disrupted=self._node_disrupted(pod))
            except ValueError as error:
                unreadable.append(f"{_qualified_name(pod)}: {error}")
                if self._verdicts.get(_metadata(pod).get("uid", "")):
                    unfinished.append(_metadata(pod).get("uid", ""))
                continue
            self._managed[event.uid] = _Observation.of(event)
            self._keep_if_skipped(event, pod)
            events.append(event)
            if event.state.is_terminal:
                ended.setdefault(event.state, []).append(event.uid)
            else:
                unfinished.append(event.uid)
        # Pods waiting for their namespace are listed too, so none is taken for vanished.
        unfinished += [uid for waiting in self._pending.values() for uid in waiting]
        self.pods_listed = True
        self.capacity_revision += 1
        return Snapshot(
            pod_events=events,
            cluster_snapshot=ClusterSnapshot(snapshot_id=snapshot_id, cluster=self.cluster,
                                             listed_at=listed_at, pod_uids=unfinished,
                                             ended=ended),
            unreadable=unreadable,
        )

    def observe_pod(self, pod: KubeObject, *, deleted: bool = False) -> PodEvent | None:
        """Take in a watch event's pod; the event to publish when a managed pod changed.

        Raises ValueError for a pod it cannot read (which the apiserver's validation should make
        impossible); what was known of the pod before is kept.
        """
        uid = _metadata(pod).get("uid", "")
        self._note_version(pod)
        if deleted and self._audit is not None:
            self._audit.gone.add(uid)
        if not self._is_lockgates(pod, deleted=deleted):
            # A pod relabelled out of lockgate's hands is forgotten as managed.
            self._managed.pop(uid, None)
            self._track_unmanaged(pod, deleted=deleted)
            if deleted:
                self._forget_verdict(uid)
            return None
        event = pod_event(pod, cluster=self.cluster, event_id=self._new_id(),
                          observed_at=self._now(), deleted=deleted,
                          skipped_gate_in=self._skipped.get(uid),
                          node_disrupted=self._node_disrupted(pod))
        self._forget_unmanaged(uid)
        observation = _Observation.of(event)
        previous = self._managed.get(uid)
        if deleted:
            self._managed.pop(uid, None)
            self._forget_verdict(uid)
        else:
            self._managed[uid] = observation
        self._keep_if_skipped(event, pod)
        if previous == observation:
            return None
        return event

    def _forget_verdict(self, uid: str) -> None:
        self._verdicts.pop(uid, None)
        self._skipped.pop(uid, None)
        self._noticed.discard(uid)
        self._skipped_pods.pop(uid, None)

    def _keep_if_skipped(self, event: PodEvent, pod: KubeObject) -> None:
        if event.skipped_gate and not event.state.is_terminal:
            self._skipped_pods[event.uid] = pod
        else:
            self._skipped_pods.pop(event.uid, None)

    def resend_skipped(self) -> list[PodEvent]:
        """A fresh event for every unfinished pod that skipped the gate, to publish again.

        Why: queue-store stores such a pod only once its queue binds its namespace
        (lockgate.ingest), and a running pod may change nothing for hours; an operator who
        binds the namespace after the pod started (or fixes the binding) must not wait for its
        end to see it counted. Harmless when stored already: the same state changes nothing.
        """
        return [pod_event(pod, cluster=self.cluster, event_id=self._new_id(),
                          observed_at=self._now(), skipped_gate_in=self._skipped.get(uid))
                for uid, pod in self._skipped_pods.items() if uid in self._skipped]

    @property
    def managed_pod_count(self) -> int:
        return len(self._managed)

    def notices_for(self, events: Iterable[PodEvent]) -> list[PodNotice]:
        """The notices due for `events` about to be published: one per unfinished pod that
        skipped the gate, once while this watcher knows the pod (a relist may send it again:
        the ungater's Event name makes that harmless)."""
        notices = []
        for event in events:
            if (not event.skipped_gate or event.state.is_terminal
                    or event.uid in self._noticed):
                continue
            self._noticed.add(event.uid)
            missing = {key: value for key, value in self._required_labels.items()
                       if event.namespace_labels.get(key) != value}
            notices.append(PodNotice(
                cluster=self.cluster, namespace=event.namespace, name=event.name, uid=event.uid,
                queue=event.queue, reason=NoticeReason.SKIPPED_GATE.value,
                message=skipped_gate_message(queue=event.queue, namespace=event.namespace,
                                             served_labels=missing and self._required_labels),
                at=event.observed_at))
        return notices

    # Auditing the watch

    def begin_pod_audit(self) -> None:
        """Call just before listing pods for `end_pod_audit`: remembers how far the watch had
        come (the newest pod version taken in), and from now on which pods it reports gone."""
        self._audit = _PodAudit(watched_version=self._newest_pod_version)

    def end_pod_audit(self, pods: Iterable[KubeObject]) -> list[MissedPod]:
        """The pods of a fresh list that are lockgate's but that the watch never reported,
        although it had passed their version before the list began; each is taken in now, and
        comes with the event it should have had.

        Why: a pod event the watch skipped is lost silently (queue-store never hears of the pod,
        which then waits gated forever) until the next relist, which happens only after a 410
        or an outage. A pod whose listed version is no newer than what the watch had reached
        when the list began existed, as listed, at that point of the watch: the watch must
        have reported it. Unless it was deleted since (its DELETED taken in during the audit:
        skipped) or is not judged yet (its namespace unseen, or not lockgate's: skipped).
        Versions are compared as numbers (etcd revisions); a pod whose version is not one is
        skipped, so the audit never reports a pod wrongly, only possibly misses one.
        """
        audit, self._audit = self._audit, None
        if audit is None or audit.watched_version < 0:
            return []
        missed = []
        for pod in pods:
            metadata = _metadata(pod)
            uid = str(metadata.get("uid", ""))
            version = _version(pod)
            if (version is None or version > audit.watched_version or uid in audit.gone
                    or uid in self._managed or not (is_managed(pod) or never_admitted(pod))):
                continue
            namespace = str(metadata.get("namespace", ""))
            labels = self._namespaces.get(namespace)
            verdict = self._verdicts.get(uid)
            if verdict is False or labels is None or not self._judge(pod, namespace, labels):
                continue
            try:
                event = self.observe_pod(pod)
            except ValueError:
                continue  # unreadable: the watcher reports those as it sees them
            if event is not None:
                missed.append(MissedPod(event=event, watched_version=audit.watched_version))
        return missed

    def _note_version(self, pod: KubeObject) -> None:
        version = _version(pod)
        if version is not None and version > self._newest_pod_version:
            self._newest_pod_version = version

    def _is_lockgates(self, pod: KubeObject, *, deleted: bool) -> bool:
        """Whether the pod is one of lockgate's jobs (see the module docstring).

        A labelled (or never admitted) pod whose namespace is not known yet is parked in
        `_pending` (and counted as unmanaged meanwhile); `observe_namespace` judges it once the
        namespace is seen.
        """
        if not is_managed(pod) and not never_admitted(pod):
            return False
        metadata = _metadata(pod)
        uid = metadata.get("uid", "")
        verdict = self._verdicts.get(uid)
        if verdict is not None:
            return verdict
        namespace = str(metadata.get("namespace", ""))
        labels = self._namespaces.get(namespace)
        if labels is None and namespace not in NEVER_MANAGED_NAMESPACES:
            waiting = self._pending.setdefault(namespace, {})
            if deleted:
                waiting.pop(uid, None)
            else:
                waiting[uid] = (pod, deleted)
            return False
        verdict = self._judge(pod, namespace, labels or {})
        self._verdicts[uid] = verdict
        if verdict and skipped_the_gate(pod, labels):
            self._skipped[uid] = dict(labels or {})
        return verdict

    def _judge(self, pod: KubeObject, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether a pod in `namespace` is reported as a job: it carries a queue label and its
        namespace is this installation's, or its namespace is managed and it skipped the
        gate."""
        return ((is_managed(pod) and is_managed_namespace(namespace, labels,
                                                          self._required_labels))
                or (is_managed_namespace(namespace, labels) and skipped_the_gate(pod, labels)))

    # Namespaces

    def relist_namespaces(self, namespaces: Iterable[KubeObject]) -> list[PodEvent]:
        """Replace the namespace labels; the events of pods that were waiting for theirs."""
        self._namespaces = {str(_metadata(ns).get("name", "")):
                            dict(_metadata(ns).get("labels") or {}) for ns in namespaces}
        self.namespaces_listed = True
        return self._judge_pending(list(self._pending))

    def observe_namespace(self, namespace: KubeObject, *, deleted: bool = False) -> list[PodEvent]:
        """Take in a namespace's labels; the events of pods that were waiting for them.

        A namespace's new labels apply to pods seen from now on; pods already judged keep
        their verdict (see the module docstring).
        """
        name = str(_metadata(namespace).get("name", ""))
        if deleted:
            self._namespaces.pop(name, None)
            self._pending.pop(name, None)
            return []
        self._namespaces[name] = dict(_metadata(namespace).get("labels") or {})
        return self._judge_pending([name])

    def _judge_pending(self, namespaces: Iterable[str]) -> list[PodEvent]:
        events = []
        for name in namespaces:
            if name not in self._namespaces:
                continue
            for pod, deleted in (self._pending.pop(name, None) or {}).values():
                event = self.observe_pod(pod, deleted=deleted)
                if event is not None:
                    events.append(event)
        return events

    def _track_unmanaged(self, pod: KubeObject, *, deleted: bool) -> None:
        uid = _metadata(pod).get("uid", "")
        if not holds_node_room(pod, deleted=deleted):
            self._forget_unmanaged(uid)
            return
        node = str(_spec(pod).get("nodeName"))
        requests = pod_requests(pod)
        if self._unmanaged.get(uid) == (node, requests):
            return
        self._forget_unmanaged(uid)
        self._unmanaged[uid] = (node, requests)
        self._usage_by_node[node] = self._usage_by_node.get(node, Resources()) + requests
        self.capacity_revision += 1

    def _forget_unmanaged(self, uid: str) -> None:
        held = self._unmanaged.pop(uid, None)
        if held is None:
            return
        node, requests = held
        remaining = self._usage_by_node.get(node, Resources()) - requests
        if remaining:
            self._usage_by_node[node] = remaining
        else:
            self._usage_by_node.pop(node, None)
        self.capacity_revision += 1

    # Nodes

    def relist_nodes(self, nodes: Iterable[KubeObject]) -> None:
        listed = {_metadata(node).get("name", ""): NodeRoom.of(node) for node in nodes}
        for name, room in self._nodes.items():
            if name not in listed and carries_disrupted_taint(room.taints):
                self._remember_gone_disrupted(name)
        self._nodes = listed
        self.nodes_listed = True
        self.capacity_revision += 1

    def observe_node(self, node: KubeObject, *, deleted: bool = False) -> None:
        name = _metadata(node).get("name", "")
        if deleted:
            gone = self._nodes.pop(name, None)
            if gone is not None:
                self.capacity_revision += 1
            if carries_disrupted_taint(taints_of_node(node)) or (
                    gone is not None and carries_disrupted_taint(gone.taints)):
                self._remember_gone_disrupted(name)
            return
        room = NodeRoom.of(node)
        if self._nodes.get(name) != room:
            self._nodes[name] = room
            self.capacity_revision += 1

    def _remember_gone_disrupted(self, name: str) -> None:
        self._gone_disrupted.pop(name, None)
        self._gone_disrupted[name] = None
        while len(self._gone_disrupted) > _REMEMBERED_DISRUPTED_NODES:
            del self._gone_disrupted[next(iter(self._gone_disrupted))]

    def _node_disrupted(self, pod: KubeObject) -> bool:
        """Whether the pod's node carries (or carried when it went) the disrupted taint."""
        name = str(_spec(pod).get("nodeName") or "")
        if not name:
            return False
        room = self._nodes.get(name)
        if room is not None:
            return carries_disrupted_taint(room.taints)
        return name in self._gone_disrupted

    # Capacity

    @property
    def capacity_known(self) -> bool:
        """Both lists are in: before that, usage or nodes would be reported incomplete."""
        return self.pods_listed and self.nodes_listed

    def unmanaged_usage(self, node: str) -> Resources:
        return self._usage_by_node.get(node, Resources())

    def capacity(self) -> ClusterCapacity:
        return ClusterCapacity(
            cluster=self.cluster,
            observed_at=self._now(),
            nodes=[node_capacity(name, room, self.unmanaged_usage(name).as_dict())
                   for name, room in sorted(self._nodes.items())],
        )
