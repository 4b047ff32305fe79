"""Placement: kube-scheduler's node filters, rounds that respect them, and giving up on released
pods kube-scheduler cannot place.

The matching cases follow kube-scheduler's documented behaviour: the "Taints and Tolerations"
and "Assigning Pods to Nodes" pages of kubernetes.io, and `ToleratesTaint` /
`NodeSelectorRequirementsAsSelector` in k8s.io/component-helpers.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from helpers import pods
from lockgate.events import PodEvent
from lockgate.ingest import CurrentRows, fold_batch
from lockgate.jobs import JobState
from lockgate.observing import NodeRoom, pod_event, unschedulable
from lockgate.placement import (
    NodeTraits,
    PodPlacement,
    Requirement,
    SelectorTerm,
    Taint,
    Toleration,
    can_land,
    is_control_plane,
    placement_of_pod,
    tolerates,
    why_not,
)
from lockgate.queues import QueueSpec
from lockgate.resources import Resources
from lockgate.scheduler import (
    NodeInfo,
    SchedJob,
    SchedulerState,
    SkipReason,
    fair_shares,
    schedule_round,
)
from lockgate.unplaceable import UnplaceableWatch, event_message, is_given_up, last_reason

GPU = "nvidia.com/gpu"
GPU_TAINT = Taint(key=GPU, value="present", effect="NoSchedule")
TOLERATE_GPU = Toleration(key=GPU, operator="Exists", effect="NoSchedule")


def node(name: str = "n", labels: dict[str, str] | None = None,
         taints: tuple[Taint, ...] = ()) -> NodeTraits:
    return NodeTraits(name, labels or {}, taints)


def pod(spec: dict[str, Any]) -> PodPlacement | None:
    return placement_of_pod(spec)


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


# ---- taints and tolerations -----------------------------------------------------------------

@pytest.mark.parametrize(("toleration", "taint", "expected"), [
    # operator Exists with an empty key tolerates every taint
    (Toleration(operator="Exists"), GPU_TAINT, True),
    (Toleration(operator="Exists"), Taint(key="x", effect="NoExecute"), True),
    # Exists ignores the value, Equal (the default) needs it equal
    (Toleration(key=GPU, operator="Exists"), GPU_TAINT, True),
    (Toleration(key=GPU, value="present"), GPU_TAINT, True),
    (Toleration(key=GPU, value="absent"), GPU_TAINT, False),
    (Toleration(key=GPU, operator="", value="present"), GPU_TAINT, True),
    # an empty effect matches every effect; a set one must be equal
    (Toleration(key=GPU, operator="Exists", effect="NoExecute"), GPU_TAINT, False),
    (Toleration(key="other", operator="Exists"), GPU_TAINT, False),
    # an operator this code does not know tolerates nothing
    (Toleration(key=GPU, operator="Gt", value="1"), GPU_TAINT, False),
])
def test_a_toleration_matches_a_taint_as_kube_scheduler_matches_it(
        toleration: Toleration, taint: Taint, expected: bool) -> None:
    assert tolerates(toleration, taint) is expected


def test_noschedule_and_noexecute_taints_keep_out_pods_that_do_not_tolerate_them() -> None:
    for effect in ("NoSchedule", "NoExecute"):
        tainted = node(taints=(Taint(key="dedicated", value="ml", effect=effect),))
        assert not can_land(None, tainted)
        assert not can_land(pod({"nodeSelector": {}}), tainted)
        assert can_land(pod({"tolerations": [{"key": "dedicated", "value": "ml"}]}), tainted)
    assert why_not(None, node(taints=(GPU_TAINT,))) == (
        "untolerated taint nvidia.com/gpu=present:NoSchedule")


def test_prefer_no_schedule_filters_nothing() -> None:
    assert can_land(None, node(taints=(Taint(key="soft", effect="PreferNoSchedule"),)))


def test_every_taint_must_be_tolerated() -> None:
    both = node(taints=(GPU_TAINT, Taint(key="zone", value="a", effect="NoExecute")))
    assert not can_land(PodPlacement(tolerations=(TOLERATE_GPU,)), both)
    assert can_land(PodPlacement(tolerations=(TOLERATE_GPU, Toleration(key="zone", value="a"))),
                    both)


# ---- nodeSelector and required node affinity ------------------------------------------------

def test_node_selector_needs_every_pair_as_a_label() -> None:
    placement = pod({"nodeSelector": {"disk": "ssd", "zone": "a"}})
    assert can_land(placement, node(labels={"disk": "ssd", "zone": "a", "extra": "x"}))
    assert not can_land(placement, node(labels={"disk": "ssd"}))
    assert not can_land(placement, node(labels={"disk": "hdd", "zone": "a"}))


@pytest.mark.parametrize(("requirement", "labels", "expected"), [
    (expr("zone", "In", "a", "b"), {"zone": "b"}, True),
    (expr("zone", "In", "a", "b"), {"zone": "c"}, False),
    (expr("zone", "In", "a"), {}, False),
    (expr("zone", "NotIn", "a"), {"zone": "b"}, True),
    (expr("zone", "NotIn", "a"), {}, True),  # an absent label is not in any set
    (expr("zone", "NotIn", "a"), {"zone": "a"}, False),
    (expr("gpu", "Exists"), {"gpu": ""}, True),
    (expr("gpu", "Exists"), {}, False),
    (expr("gpu", "DoesNotExist"), {}, True),
    (expr("gpu", "DoesNotExist"), {"gpu": "x"}, False),
    (expr("cores", "Gt", "8"), {"cores": "16"}, True),
    (expr("cores", "Gt", "8"), {"cores": "8"}, False),
    (expr("cores", "Lt", "8"), {"cores": "4"}, True),
    (expr("cores", "Lt", "8"), {"cores": "many"}, False),  # not an integer: no match
    (expr("cores", "Gt", "8"), {}, False),
    (expr("zone", "Near", "a"), {"zone": "a"}, False),  # unknown operator
])
def test_required_node_affinity_operators(requirement: dict[str, Any], labels: dict[str, str],
                                          expected: bool) -> None:
    assert can_land(pod(affinity(requirement)), node(labels=labels)) is expected


def test_terms_are_ored_requirements_anded_and_an_empty_term_matches_nothing() -> None:
    both = {"matchExpressions": [{"key": "a", "operator": "Exists"},
                                 {"key": "b", "operator": "Exists"}]}
    assert not can_land(pod(affinity(both)), node(labels={"a": "1"}))
    assert can_land(pod(affinity(both)), node(labels={"a": "1", "b": "2"}))
    either = pod(affinity(expr("a", "Exists"), expr("b", "Exists")))
    assert can_land(either, node(labels={"b": "2"}))
    assert not can_land(pod(affinity({})), node(labels={"a": "1"}))


def test_match_fields_select_nodes_by_name() -> None:
    named = pod(affinity({"matchFields": [{"key": "metadata.name", "operator": "In",
                                           "values": ["gpu-1"]}]}))
    assert can_land(named, node("gpu-1"))
    assert not can_land(named, node("gpu-2"))
    other_field = pod(affinity({"matchFields": [{"key": "metadata.uid", "operator": "In",
                                                 "values": ["gpu-1"]}]}))
    assert not can_land(other_field, node("gpu-1"))


def test_a_pod_spec_without_filters_has_no_placement() -> None:
    assert placement_of_pod({"containers": []}) is None
    parsed = placement_of_pod({"tolerations": [{"operator": "Exists"}],
                               **affinity(expr("zone", "In", "a"))})
    assert parsed == PodPlacement(
        tolerations=(Toleration(operator="Exists"),),
        required_terms=(SelectorTerm(match_expressions=(
            Requirement(key="zone", operator="In", values=("a",)),)),))
    assert PodPlacement.model_validate_json(parsed.model_dump_json()) == parsed


def test_control_plane_nodes_are_recognised_by_their_taint() -> None:
    assert is_control_plane((Taint(key="node-role.kubernetes.io/control-plane",
                                   effect="NoSchedule"),))
    assert not is_control_plane((Taint(key="node-role.kubernetes.io/control-plane",
                                       effect="PreferNoSchedule"),))
    assert not is_control_plane((GPU_TAINT,))


# ---- rounds ---------------------------------------------------------------------------------

def a_state(*queues: str, resources: tuple[str, ...] = ("cpu", "memory", GPU)) -> SchedulerState:
    state = SchedulerState(resources)
    for name in queues:
        state.upsert_queue(QueueSpec(name=name))
    return state


def a_node(cpu: int = 4, gpu: int = 0, labels: dict[str, str] | None = None,
           taints: tuple[Taint, ...] = (), **other: int) -> NodeInfo:
    amounts = {"cpu": cpu * 1000, "memory": 16 * 2**30, GPU: gpu, **other}
    return NodeInfo(allocatable=Resources(amounts), labels=labels or {}, taints=taints)


_ids = iter(range(1, 10**9))


def a_job(queue: str, *, cpu: int = 1, gpu: int = 0, placement: PodPlacement | None = None,
          cluster: str = "c", **other: int) -> SchedJob:
    n = next(_ids)
    return SchedJob(job_id=f"{cluster}/j{n}", queue=queue, cluster=cluster,
                    requests=Resources({"cpu": cpu * 1000, GPU: gpu, **other}),
                    created_at=float(n), placement=placement)


def placed(state: SchedulerState, **kwargs: int) -> dict[str, str]:
    result = schedule_round(state, max_decisions=10_000, max_lookback_per_queue=1_000, **kwargs)
    return {d.job_id: d.node_hint for d in result.decisions}


GPU_POOL = {
    "cpu-1": a_node(),
    "gpu-1": a_node(gpu=4, labels={"pool": "gpu"}, taints=(GPU_TAINT,)),
}


def test_pods_that_do_not_tolerate_the_gpu_pool_never_go_there_even_when_it_is_idle() -> None:
    state = a_state("a")
    state.set_cluster("c", GPU_POOL)
    jobs = [a_job("a") for _ in range(8)]
    state.upsert_jobs(jobs)

    decided = placed(state)

    assert sorted(decided.values()) == ["cpu-1"] * 4  # the GPU node's 4 cpus stay unused
    assert schedule_round(state, max_decisions=10, max_lookback_per_queue=10).decisions == ()


def test_gpu_pods_that_tolerate_the_taint_go_to_the_gpu_pool() -> None:
    state = a_state("a")
    state.set_cluster("c", GPU_POOL)
    tolerating = PodPlacement(tolerations=(TOLERATE_GPU,))
    gpu_jobs = [a_job("a", gpu=1, placement=tolerating) for _ in range(5)]
    state.upsert_jobs(gpu_jobs)

    decided = placed(state)

    assert sorted(decided.values()) == ["gpu-1"] * 4  # the fifth waits for a GPU


def test_a_pod_asking_for_a_gpu_without_tolerating_the_pool_is_parked_as_unschedulable() -> None:
    state = a_state("a")
    state.set_cluster("c", GPU_POOL)
    job = a_job("a", gpu=1)
    state.upsert_job(job)

    result = schedule_round(state, max_decisions=10, max_lookback_per_queue=10)

    assert result.decisions == ()
    assert state.queue_usage("a").unschedulable_jobs == 1
    # Parked the moment it arrives, next to jobs no node size can hold; a node it may land on
    # brings it back.
    state.set_node("c", "gpu-2", a_node(gpu=1))
    assert placed(state) == {job.job_id: "gpu-2"}


def test_a_node_selector_sends_pods_only_to_labelled_nodes_and_parks_them_otherwise() -> None:
    state = a_state("a")
    state.set_cluster("c", {"plain-1": a_node(), "ssd-1": a_node(cpu=2, labels={"disk": "ssd"})})
    ssd = pod({"nodeSelector": {"disk": "ssd"}})
    jobs = [a_job("a", placement=ssd) for _ in range(3)]
    state.upsert_jobs(jobs)

    assert sorted(placed(state).values()) == ["ssd-1", "ssd-1"]

    nowhere = a_job("a", placement=pod({"nodeSelector": {"disk": "nvme"}}))
    state.upsert_job(nowhere)
    assert schedule_round(state, max_decisions=10, max_lookback_per_queue=10).decisions == ()
    assert state.queue_usage("a").unschedulable_jobs == 1  # parked on arrival


def test_a_round_reports_a_pod_no_node_lets_in_as_no_matching_node() -> None:
    state = a_state("a")
    job = a_job("a", placement=pod({"nodeSelector": {"disk": "nvme"}}))
    state.upsert_job(job)  # before any node is known: not parked yet
    state.set_cluster("c", {"plain-1": a_node()})

    result = schedule_round(state, max_decisions=10, max_lookback_per_queue=10)

    assert result.skipped_jobs == {job.job_id: SkipReason.NO_MATCHING_NODE}


def test_required_affinity_and_match_fields_steer_the_first_fit() -> None:
    state = a_state("a")
    state.set_cluster("c", {"n-1": a_node(labels={"zone": "a"}),
                            "n-2": a_node(labels={"zone": "b"})})
    zone_b = a_job("a", placement=pod(affinity(expr("zone", "In", "b"))))
    named = a_job("a", placement=pod(affinity(
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n-1"]}]})))
    state.upsert_jobs([zone_b, named])

    assert placed(state) == {zone_b.job_id: "n-2", named.job_id: "n-1"}


def test_a_released_pod_is_charged_only_where_it_may_land() -> None:
    state = a_state("a", "b")
    state.set_cluster("c", {"cpu-1": a_node(cpu=2), "gpu-1": a_node(gpu=1, taints=(GPU_TAINT,))})
    # Released but unbound, aimed (wrongly) at the GPU node: it is charged on a node it may
    # use, so the cpu node has one cpu left, not two.
    held = a_job("a")
    state.upsert_job(SchedJob(**{**_fields(held), "state": JobState.RELEASED}))
    state.upsert_jobs([a_job("b"), a_job("b")])

    assert len(placed(state)) == 1


def _fields(job: SchedJob) -> dict[str, Any]:
    return {name: getattr(job, name) for name in SchedJob.__slots__}


def test_tainted_control_planes_are_not_in_the_pool_but_take_pods_that_tolerate_them() -> None:
    control_plane = Taint(key="node-role.kubernetes.io/control-plane", effect="NoSchedule")
    state = a_state("a")
    state.set_cluster("c", {"cp": a_node(cpu=4, taints=(control_plane,)), "w": a_node(cpu=4)})

    assert state.pool_total()["cpu"] == 4000

    tolerant = PodPlacement(tolerations=(Toleration(key=control_plane.key, operator="Exists"),))
    jobs = [a_job("a", placement=tolerant) for _ in range(6)]
    state.upsert_jobs(jobs)
    assert sorted(placed(state).values()) == ["cp"] * 4 + ["w"] * 2


def test_fair_shares_ignore_resources_outside_the_configured_set() -> None:
    state = a_state("disk", "cpu")
    state.set_cluster("c", {"n": NodeInfo(allocatable=Resources(
        {"cpu": 8000, "memory": 32 * 2**30, "ephemeral-storage": 100 * 2**30}))})
    # A queue asking for a lot of disk and little cpu is not held back by its disk share.
    state.upsert_jobs([a_job("disk", cpu=1, **{"ephemeral-storage": 20 * 2**30})
                       for _ in range(5)])
    state.upsert_jobs([a_job("cpu", cpu=1) for _ in range(5)])

    decided = placed(state)

    assert sum(1 for j in decided if _queue_of(state, j) == "disk") == 4
    assert sum(1 for j in decided if _queue_of(state, j) == "cpu") == 4
    shares = fair_shares(state)
    assert shares["disk"].actual_share == pytest.approx(0.5)

    everything = a_state("disk", "cpu", resources=("cpu", "memory", "ephemeral-storage"))
    everything.set_cluster("c", {"n": NodeInfo(allocatable=Resources(
        {"cpu": 8000, "memory": 32 * 2**30, "ephemeral-storage": 100 * 2**30}))})
    everything.upsert_jobs([a_job("disk", cpu=1, **{"ephemeral-storage": 20 * 2**30})
                            for _ in range(5)])
    everything.upsert_jobs([a_job("cpu", cpu=1) for _ in range(5)])
    decided = placed(everything)
    assert sum(1 for j in decided if _queue_of(everything, j) == "disk") < 4


def _queue_of(state: SchedulerState, job_id: str) -> str:
    job = state.job(job_id)
    assert job is not None
    return job.queue


# ---- giving up on released pods kube-scheduler cannot place ---------------------------------

def stuck_job(since: float | None, state: JobState = JobState.UNGATED, **kw: Any) -> SchedJob:
    return SchedJob(job_id="c/stuck", queue="a", cluster="c", requests=Resources({"cpu": 1000}),
                    state=state, unschedulable_since=since,
                    unschedulable_message="0/2 nodes are available: 2 node(s) had untolerated "
                                          "taint(s).", **kw)


def test_a_released_pod_unschedulable_for_too_long_is_due() -> None:
    watch = UnplaceableWatch(after_seconds=60)
    watch.observe(stuck_job(1000.0))

    assert watch.next_due() == 1060.0
    assert watch.due(1059.0, limit=10) == []
    assert [j.job_id for j in watch.due(1060.0, limit=10)] == ["c/stuck"]


def test_only_released_unbound_unschedulable_pods_are_watched() -> None:
    watch = UnplaceableWatch(after_seconds=60)
    watch.observe(stuck_job(1000.0))
    watch.observe(stuck_job(1000.0, state=JobState.BOUND))  # bound after all: forgotten
    assert len(watch) == 0
    watch.observe(stuck_job(None))
    watch.observe(stuck_job(1000.0, state=JobState.QUEUED))
    watch.observe(stuck_job(1000.0, unplaceable=True))  # already given up on
    assert len(watch) == 0


def test_a_pod_given_up_on_is_not_charged_until_it_binds() -> None:
    assert is_given_up(stuck_job(1.0, unplaceable=True))
    assert not is_given_up(stuck_job(1.0, state=JobState.RUNNING, unplaceable=True))
    job = stuck_job(1000.0)
    assert last_reason(job, 1130.0).startswith(
        "unplaceable: released, but kube-scheduler reported it Unschedulable for 130s: 0/2")
    assert "controller creates a replacement" in event_message(job, 1130.0, deleting=True)
    assert "left alone" in event_message(job, 1130.0, deleting=False)


# ---- what the watcher reports, and how queue-store folds it ---------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def a_replica(conditions: list[dict[str, str]], **spec: Any) -> dict[str, Any]:
    """A ReplicaSet's pod in queue a, with these PodScheduled conditions and spec fields."""
    return (pods.a_pod("p").in_namespace("ns").with_uid("u1").in_queue("a")
            .owned_by({"kind": "ReplicaSet", "name": "rs", "controller": True})
            .with_spec(**spec).with_status(conditions=conditions).obj())


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/4 nodes are available", "lastTransitionTime": "2026-01-01T00:00:00Z"}


def test_the_watcher_reports_placement_the_podscheduled_condition_and_the_controller() -> None:
    gated = {**UNSCHEDULABLE, "reason": "SchedulingGated"}
    assert unschedulable(a_replica([gated]), T0) is None
    event = pod_event(a_replica([UNSCHEDULABLE], nodeSelector={"pool": "gpu"}), cluster="c",
                      event_id="e", observed_at=T0)
    assert event.unschedulable_since == T0
    assert event.unschedulable_message == "0/4 nodes are available"
    assert event.controlled
    assert event.placement == pod({"nodeSelector": {"pool": "gpu"}})
    room = NodeRoom.of({"metadata": {"labels": {"pool": "gpu"}}, "spec": {"taints": [
        {"key": GPU, "value": "present", "effect": "NoSchedule"}]}, "status": {}})
    assert room.taints == (GPU_TAINT,)
    assert room.labels == {"pool": "gpu"}


def _event(at: datetime, *, since: datetime | None) -> PodEvent:
    return PodEvent(event_id=f"e{at.timestamp()}", cluster="c", namespace="ns", name="p",
                    uid="u1", state=JobState.UNGATED, queue="a", jobset="default",
                    created_at=T0, observed_at=at, gated=False, unschedulable_since=since,
                    unschedulable_message="no" if since else "")


def test_queue_store_stores_when_it_first_saw_the_pod_unschedulable() -> None:
    # The condition's lastTransitionTime stays at gating time (PodScheduled was False since
    # SchedulingGated), so the first sighting after the release is what counts.
    first = fold_batch(CurrentRows(), [_event(T0 + timedelta(minutes=5), since=T0)]).jobs[0]
    assert first.unschedulable_since == T0 + timedelta(minutes=5)
    current = CurrentRows(jobs={first.key: first})
    again = fold_batch(current, [_event(T0 + timedelta(minutes=7), since=T0)])
    assert again.jobs == []  # unchanged
    cleared = fold_batch(current, [_event(T0 + timedelta(minutes=8), since=None)]).jobs[0]
    assert cleared.unschedulable_since is None
