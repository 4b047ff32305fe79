"""What cluster-watcher makes of pods and nodes: states, requests, dedupe, capacity."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from helpers import pods
from helpers.pods import PodBuilder
from lockgate.jobs import JobState
from lockgate.labels import LABEL_SOURCE_ANNOTATION, MANAGED_NAMESPACE_LABEL, SCHEDULING_GATE
from lockgate.noticing import NoticeReason
from lockgate.observing import (
    ObservedCluster,
    holds_node_room,
    is_managed,
    is_node_schedulable,
    observed_state,
    pod_event,
    pod_requests,
    skipped_the_gate,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def a_pod(name: str) -> PodBuilder:
    """A pod in team-a, the namespace `a_cluster` manages."""
    return pods.a_pod(name).in_namespace("team-a")


def a_node(name: str, *, cpu: str = "8", memory: str = "32Gi", ready: bool = True,
           cordoned: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def a_namespace(name: str, *, managed: bool = True, **labels: str) -> dict[str, Any]:
    if managed:
        labels[MANAGED_NAMESPACE_LABEL] = "true"
    return {"metadata": {"name": name, "labels": labels}}


def a_cluster(name: str = "cluster-a") -> ObservedCluster:
    """A cluster whose namespace team-a (where pods are built) is managed."""
    ticks = itertools.count()
    ids = itertools.count()
    cluster = ObservedCluster(name, now=lambda: T0 + timedelta(seconds=next(ticks)),
                              new_id=lambda: f"id-{next(ids)}")
    cluster.relist_namespaces([a_namespace("team-a"), a_namespace("free", managed=False),
                               a_namespace("kube-system", managed=False)])
    return cluster


# Which pods are lockgate's, and in which state


def test_a_pod_is_managed_when_it_carries_the_queue_label_even_after_release() -> None:
    assert is_managed(a_pod("p").in_queue("q").gated().obj())
    assert is_managed(a_pod("p").in_queue("q").obj())
    assert not is_managed(a_pod("p").gated().obj())


@pytest.mark.parametrize(
    ("pod", "deleted", "want"),
    [
        (a_pod("p").in_queue("q").gated(), False, JobState.QUEUED),
        (a_pod("p").in_queue("q").gated("other.io/gate", SCHEDULING_GATE), False, JobState.QUEUED),
        (a_pod("p").in_queue("q").gated("other.io/gate"), False, JobState.UNGATED),
        (a_pod("p").in_queue("q"), False, JobState.UNGATED),
        (a_pod("p").in_queue("q").on_node("n1"), False, JobState.BOUND),
        (a_pod("p").in_queue("q").on_node("n1").in_phase("Running"), False, JobState.RUNNING),
        (a_pod("p").in_queue("q").on_node("n1").in_phase("Succeeded"), False, JobState.SUCCEEDED),
        (a_pod("p").in_queue("q").on_node("n1").in_phase("Failed"), False, JobState.FAILED),
        (a_pod("p").in_queue("q").gated(), True, JobState.DELETED),
        (a_pod("p").in_queue("q").on_node("n1").in_phase("Running").being_deleted(), False,
         JobState.DELETED),
        # How a pod ended is kept when it is deleted afterwards.
        (a_pod("p").in_queue("q").on_node("n1").in_phase("Succeeded"), True, JobState.SUCCEEDED),
    ],
)
def test_observed_state(pod: PodBuilder, deleted: bool, want: JobState) -> None:
    assert observed_state(pod.obj(), deleted=deleted) is want


# Requests as kube-scheduler counts them


def test_requests_of_regular_containers_add_up_in_canonical_units() -> None:
    pod = a_pod("p").requesting(cpu="500m", memory="1Gi").with_container(cpu="1", memory="512Mi")
    assert pod_requests(pod.obj()) == {"cpu": 1500, "memory": 1536 * 2**20}


def test_the_largest_init_container_wins_per_resource_when_above_the_running_total() -> None:
    pod = (a_pod("p").requesting(cpu="1", memory="1Gi")
           .with_init(cpu="2", memory="256Mi").with_init(cpu="500m", memory="2Gi"))
    assert pod_requests(pod.obj()) == {"cpu": 2000, "memory": 2 * 2**30}


def test_sidecars_add_to_the_running_containers_and_to_later_init_containers() -> None:
    pod = (a_pod("p").requesting(cpu="1")
           .with_init(sidecar=True, cpu="200m")
           .with_init(cpu="3"))
    # Running: 1 + 0.2; during the second init container: 3 + 0.2 (the sidecar runs alongside).
    assert pod_requests(pod.obj()) == {"cpu": 3200}
    early_init = a_pod("p").requesting(cpu="1").with_init(cpu="3").with_init(sidecar=True,
                                                                            cpu="200m")
    # The init container that runs before the sidecar starts does not overlap it.
    assert pod_requests(early_init.obj()) == {"cpu": 3000}


def test_overhead_comes_on_top_and_pod_level_requests_replace_the_containers_total() -> None:
    with_overhead = a_pod("p").requesting(cpu="1").with_spec(overhead={"cpu": "250m"})
    assert pod_requests(with_overhead.obj()) == {"cpu": 1250}
    pod_level = (a_pod("p").requesting(cpu="1", memory="1Gi")
                 .with_spec(resources={"requests": {"cpu": "4"}}))
    assert pod_requests(pod_level.obj()) == {"cpu": 4000, "memory": 2**30}


def test_a_pod_without_requests_asks_for_nothing() -> None:
    assert pod_requests(a_pod("p").obj()) == {}


# The event for a managed pod


def test_pod_event_carries_queue_jobset_priority_requests_and_gate() -> None:
    pod = (a_pod("p").in_queue("research", "sweep-1").gated().requesting(cpu="2", memory="1Gi")
           .with_spec(priority=7).at_version("42").obj())
    event = pod_event(pod, cluster="cluster-a", event_id="e1", observed_at=T0)
    assert (event.cluster, event.namespace, event.name, event.uid) == (
        "cluster-a", "team-a", "p", "uid-p")
    assert (event.state, event.queue, event.jobset, event.priority) == (
        JobState.QUEUED, "research", "sweep-1", 7)
    assert event.requests == {"cpu": 2000, "memory": 2**30}
    assert event.gated and event.node_name is None and event.snapshot_id is None
    assert event.created_at == datetime(2026, 1, 2, 3, 0, tzinfo=UTC)
    assert event.resource_version == "42"


def test_pod_event_defaults_jobset_and_priority() -> None:
    event = pod_event(a_pod("p").in_queue("q").obj(), cluster="c", event_id="e", observed_at=T0)
    assert (event.jobset, event.priority) == ("default", 0)


# Nodes


def test_a_node_is_schedulable_when_ready_and_not_cordoned() -> None:
    assert is_node_schedulable(a_node("n"))
    assert not is_node_schedulable(a_node("n", ready=False))
    assert not is_node_schedulable(a_node("n", cordoned=True))
    assert not is_node_schedulable({"metadata": {"name": "n"}})


def test_pods_hold_node_room_while_bound_and_unfinished() -> None:
    assert holds_node_room(a_pod("p").on_node("n").in_phase("Running").obj())
    assert holds_node_room(a_pod("p").on_node("n").in_phase("Running").being_deleted().obj())
    assert not holds_node_room(a_pod("p").on_node("n").in_phase("Succeeded").obj())
    assert not holds_node_room(a_pod("p").obj())
    assert not holds_node_room(a_pod("p").on_node("n").obj(), deleted=True)


# ObservedCluster: snapshots, dedupe, capacity


def test_relist_reports_every_managed_pod_and_lists_each_with_how_it_ended() -> None:
    cluster = a_cluster()
    snapshot = cluster.relist_pods([
        a_pod("queued").in_queue("q").gated().obj(),
        a_pod("done").in_queue("q").on_node("n1").in_phase("Succeeded").obj(),
        a_pod("broke").in_queue("q").on_node("n1").in_phase("Failed").obj(),
        a_pod("unmanaged").on_node("n1").in_phase("Running").requesting(cpu="1").obj(),
    ])
    assert [e.name for e in snapshot.pod_events] == ["queued", "done", "broke"]
    sid = snapshot.cluster_snapshot.snapshot_id
    assert all(e.snapshot_id == sid for e in snapshot.pod_events)
    assert snapshot.cluster_snapshot.pod_uids == ["uid-queued"]
    # Finished pods are listed too, with their outcome: the snapshot may be stored before
    # their events, and must not pass them for vanished.
    assert snapshot.cluster_snapshot.ended_by_uid() == {"uid-done": JobState.SUCCEEDED,
                                                        "uid-broke": JobState.FAILED}
    assert snapshot.cluster_snapshot.cluster == "cluster-a"
    # Events carry distinct ids, and none reuses the snapshot's.
    assert len({sid, *(e.event_id for e in snapshot.pod_events)}) == 4


def test_only_changes_of_a_managed_pods_observation_are_reported() -> None:
    cluster = a_cluster()
    cluster.relist_pods([])
    gated = a_pod("p").in_queue("q").gated().requesting(cpu="1")
    first = cluster.observe_pod(gated.obj())
    assert first is not None and first.state is JobState.QUEUED
    # A MODIFIED event that changes nothing lockgate cares about (a new resourceVersion).
    assert cluster.observe_pod(gated.at_version("2").obj()) is None
    released = a_pod("p").in_queue("q").requesting(cpu="1")
    states = [cluster.observe_pod(released.obj()),
              cluster.observe_pod(released.on_node("n1").obj()),
              cluster.observe_pod(released.in_phase("Running").obj()),
              cluster.observe_pod(released.in_phase("Running").obj()),
              cluster.observe_pod(released.obj(), deleted=True)]
    assert [s.state if s else None for s in states] == [
        JobState.UNGATED, JobState.BOUND, JobState.RUNNING, None, JobState.DELETED]
    assert cluster.managed_pod_count == 0


def test_unmanaged_pods_report_nothing_but_count_towards_their_nodes_usage() -> None:
    cluster = a_cluster()
    cluster.relist_nodes([a_node("n1"), a_node("n2", cpu="4", ready=False)])
    cluster.relist_pods([a_pod("a").on_node("n1").in_phase("Running").requesting(cpu="1").obj()])
    revision = cluster.capacity_revision
    assert cluster.observe_pod(
        a_pod("b").on_node("n1").requesting(cpu="500m", memory="1Gi").obj()) is None
    assert cluster.observe_pod(a_pod("pending").requesting(cpu="9").obj()) is None
    assert cluster.capacity_revision > revision

    capacity = cluster.capacity()
    assert capacity.cluster == "cluster-a"
    by_name = {node.name: node for node in capacity.nodes}
    assert by_name["n1"].unmanaged_usage == {"cpu": 1500, "memory": 2**30}
    assert by_name["n1"].allocatable == {"cpu": 8000, "memory": 32 * 2**30, "pods": 110}
    assert by_name["n1"].schedulable
    assert by_name["n2"].unmanaged_usage == {} and not by_name["n2"].schedulable

    # Finishing and deleting give the room back.
    cluster.observe_pod(a_pod("a").on_node("n1").in_phase("Succeeded").requesting(cpu="1").obj())
    cluster.observe_pod(a_pod("b").on_node("n1").requesting(cpu="500m", memory="1Gi").obj(),
                        deleted=True)
    assert cluster.unmanaged_usage("n1") == {}


def test_managed_pods_never_count_as_unmanaged_usage() -> None:
    cluster = a_cluster()
    cluster.relist_nodes([a_node("n1")])
    cluster.relist_pods([])
    cluster.observe_pod(a_pod("m").in_queue("q").on_node("n1").requesting(cpu="2").obj())
    assert cluster.unmanaged_usage("n1") == {}


def test_capacity_moves_only_when_nodes_change_in_what_lockgate_reads() -> None:
    cluster = a_cluster()
    cluster.relist_pods([])
    assert not cluster.capacity_known
    cluster.relist_nodes([a_node("n1")])
    assert cluster.capacity_known
    revision = cluster.capacity_revision
    cluster.observe_node(a_node("n1"))  # a heartbeat: same allocatable, still ready
    assert cluster.capacity_revision == revision
    cluster.observe_node(a_node("n1", cordoned=True))
    assert cluster.capacity_revision == revision + 1
    cluster.observe_node(a_node("n1"), deleted=True)
    assert cluster.capacity().nodes == []


def test_relist_forgets_pods_that_vanished_while_nobody_watched() -> None:
    cluster = a_cluster()
    cluster.relist_nodes([a_node("n1")])
    cluster.relist_pods([a_pod("gone").on_node("n1").requesting(cpu="1").obj(),
                         a_pod("m").in_queue("q").gated().obj()])
    snapshot = cluster.relist_pods([])
    assert snapshot.pod_events == [] and snapshot.cluster_snapshot.pod_uids == []
    assert cluster.unmanaged_usage("n1") == {} and cluster.managed_pod_count == 0
    # After a relist the next change of a managed pod is reported again.
    assert cluster.observe_pod(a_pod("m").in_queue("q").gated().obj()) is not None


def test_an_unreadable_pod_is_skipped_but_a_managed_one_is_not_taken_for_vanished() -> None:
    cluster = a_cluster()
    broken = a_pod("broken").in_queue("q").gated().requesting(cpu="lots").obj()
    snapshot = cluster.relist_pods([broken, a_pod("fine").in_queue("q").gated().obj()])
    assert [e.name for e in snapshot.pod_events] == ["fine"]
    assert snapshot.cluster_snapshot.pod_uids == ["uid-broken", "uid-fine"]
    assert len(snapshot.unreadable) == 1 and "team-a/broken" in snapshot.unreadable[0]
    with pytest.raises(ValueError, match="lots"):
        cluster.observe_pod(broken)


# Only pods of managed namespaces are lockgate's jobs


def pod_in(namespace: str, name: str) -> PodBuilder:
    return pods.a_pod(name).in_namespace(namespace)


@pytest.mark.parametrize("pod", [
    pod_in("free", "labelled").in_queue("victim").on_node("n1").in_phase("Running"),
    pod_in("kube-system", "system").in_queue("victim").on_node("n1").in_phase("Running"),
    pod_in("free", "bound-at-creation").in_queue("victim").on_node("n1"),
    pod_in("free", "self-gated").in_queue("victim").gated(),
], ids=lambda pod: pod.name)
def test_a_queue_label_outside_managed_namespaces_is_unmanaged_usage(pod: PodBuilder) -> None:
    cluster = a_cluster()
    cluster.relist_nodes([a_node("n1")])
    snapshot = cluster.relist_pods([pod.requesting(cpu="1").obj()])
    assert snapshot.pod_events == [] and snapshot.cluster_snapshot.pod_uids == []
    assert cluster.observe_pod(pod.at_version("2").obj()) is None
    assert cluster.managed_pod_count == 0
    held = {"cpu": 1000} if pod.extra_spec.get("nodeName") else {}
    assert cluster.unmanaged_usage("n1") == held


def test_with_required_labels_only_this_installations_namespaces_hold_jobs() -> None:
    """Two installations share a cluster, each webhook registered for its own run label: a
    managed namespace of the other is not ours; its running pods only take room."""
    cluster = ObservedCluster("cluster-a", managed_namespace_labels={"lockgate.io/run": "ours"})
    cluster.relist_namespaces([a_namespace("mine", **{"lockgate.io/run": "ours"}),
                               a_namespace("theirs", **{"lockgate.io/run": "other"}),
                               a_namespace("unlabelled")])
    cluster.relist_nodes([a_node("n1")])
    snapshot = cluster.relist_pods([
        pod_in("mine", "job").in_queue("q").gated().requesting(cpu="1").obj(),
        pod_in("theirs", "gated").in_queue("q").gated().requesting(cpu="1").obj(),
        # Released by the other installation's webhook, whose answer it still carries.
        pod_in("theirs", "running").in_queue("q").on_node("n1").in_phase("Running")
        .annotated(**{LABEL_SOURCE_ANNOTATION: '{"queue":"pod"}'}).requesting(cpu="2").obj(),
        pod_in("unlabelled", "gated").in_queue("q").gated().requesting(cpu="1").obj(),
    ])
    assert [event.name for event in snapshot.pod_events] == ["job"]
    assert cluster.managed_pod_count == 1
    assert cluster.unmanaged_usage("n1") == {"cpu": 2000}


def test_a_pod_seen_before_its_namespace_is_judged_once_the_namespace_is_seen() -> None:
    cluster = a_cluster()
    cluster.relist_nodes([a_node("n1")])
    snapshot = cluster.relist_pods([pod_in("new-team", "early").in_queue("q").gated().obj()])
    # Not reported yet, but not taken for vanished either.
    assert snapshot.pod_events == [] and snapshot.cluster_snapshot.pod_uids == ["uid-early"]
    assert cluster.observe_pod(pod_in("new-team", "late").in_queue("q").gated().obj()) is None

    events = cluster.observe_namespace(a_namespace("new-team"))

    assert sorted(e.name for e in events) == ["early", "late"]
    assert cluster.managed_pod_count == 2
    # An unmanaged namespace seen later: its waiting pods are unmanaged usage.
    cluster.observe_pod(pod_in("other", "x").in_queue("q").on_node("n1").requesting(cpu="1").obj())
    assert cluster.observe_namespace(a_namespace("other", managed=False)) == []
    assert cluster.unmanaged_usage("n1") == {"cpu": 1000}


def test_a_namespace_losing_its_label_keeps_its_jobs_until_they_end() -> None:
    cluster = a_cluster()
    cluster.relist_pods([])
    job = a_pod("job").in_queue("q").gated().requesting(cpu="1")
    assert cluster.observe_pod(job.obj()) is not None

    assert cluster.observe_namespace(a_namespace("team-a", managed=False)) == []

    # The job is still reported, across a relist too, until it is deleted.
    released = cluster.observe_pod(a_pod("job").in_queue("q").on_node("n1").obj())
    assert released is not None and released.state is JobState.BOUND
    assert [e.name for e in cluster.relist_pods([job.obj()]).pod_events] == ["job"]
    gone = cluster.observe_pod(job.obj(), deleted=True)
    assert gone is not None and gone.state is JobState.DELETED
    # A pod created there from now on is not lockgate's.
    assert cluster.observe_pod(a_pod("new").in_queue("q").on_node("n1").obj()) is None


def test_a_namespace_gaining_the_label_does_not_turn_its_old_pods_into_jobs() -> None:
    cluster = a_cluster()
    cluster.relist_nodes([a_node("n1")])
    old = pod_in("free", "old").in_queue("q").on_node("n1").in_phase("Running").requesting(cpu="1")
    cluster.relist_pods([old.obj()])

    cluster.observe_namespace(a_namespace("free"))

    assert cluster.observe_pod(old.at_version("2").obj()) is None
    assert cluster.unmanaged_usage("n1") == {"cpu": 1000}
    new = cluster.observe_pod(pod_in("free", "new").in_queue("q").gated().obj())
    assert new is not None and new.queue == "q"


# Pods that skipped the gate --------------------------------------------------------------------

ADMITTED = {LABEL_SOURCE_ANNOTATION: '{"queue":"pod","jobset":"default"}'}


@pytest.mark.parametrize(("pod", "skipped"), [
    (pod_in("ns", "never-gated").in_queue("q"), True),
    (pod_in("ns", "never-gated-running").in_queue("q").on_node("n1").in_phase("Running"), True),
    (pod_in("ns", "gated").in_queue("q").gated(), False),
    # Released: the gate is gone, the webhook's annotation stays.
    (pod_in("ns", "released").in_queue("q").on_node("n1").in_phase("Running")
     .annotated(ADMITTED), False),
    (pod_in("ns", "no-queue-label").on_node("n1").in_phase("Running"), False),
])
def test_a_pod_skipped_the_gate_when_it_carries_a_queue_label_and_no_trace_of_the_webhook(
        pod: PodBuilder, skipped: bool) -> None:
    assert skipped_the_gate(pod.obj()) is skipped


def ours_and_unserved() -> ObservedCluster:
    """Under `make run`: this installation's webhook serves namespaces labelled
    lockgate.io/run=dev; jhub is managed but lacks it, as the JupyterHub recipe left it."""
    ids = itertools.count()
    cluster = ObservedCluster("cluster-a", managed_namespace_labels={"lockgate.io/run": "dev"},
                              now=lambda: T0, new_id=lambda: f"id-{next(ids)}")
    cluster.relist_namespaces([a_namespace("mine", **{"lockgate.io/run": "dev"}),
                               a_namespace("jhub", **{"lockgate.io/queue": "research"}),
                               a_namespace("free", managed=False)])
    cluster.relist_nodes([a_node("n1")])
    return cluster


def test_a_never_gated_pod_in_a_managed_namespace_the_webhook_does_not_serve_is_reported() -> None:
    cluster = ours_and_unserved()
    cluster.relist_pods([])
    pod = pod_in("jhub", "jupyter-ann").in_queue("research").requesting(cpu="2")

    created = cluster.observe_pod(pod.obj())
    running = cluster.observe_pod(pod.on_node("n1").in_phase("Running").at_version("2").obj())

    assert created is not None and created.skipped_gate and created.state is JobState.UNGATED
    assert created.namespace_labels == {MANAGED_NAMESPACE_LABEL: "true",
                                        "lockgate.io/queue": "research"}
    assert running is not None and running.skipped_gate and running.state is JobState.RUNNING
    # A job, so its room is the queue's, not unmanaged usage.
    assert cluster.managed_pod_count == 1 and cluster.unmanaged_usage("n1") == {}


def test_a_gated_pod_of_another_installation_and_any_pod_of_an_unmanaged_namespace_are_not(
        ) -> None:
    cluster = ours_and_unserved()
    snapshot = cluster.relist_pods([
        pod_in("jhub", "theirs").in_queue("research").gated().obj(),
        pod_in("jhub", "theirs-released").in_queue("research").annotated(ADMITTED)
        .on_node("n1").in_phase("Running").requesting(cpu="1").obj(),
        pod_in("free", "unmanaged").in_queue("research").on_node("n1").in_phase("Running")
        .requesting(cpu="2").obj(),
    ])
    assert snapshot.pod_events == []
    assert cluster.unmanaged_usage("n1") == {"cpu": 3000}


def test_in_a_served_namespace_a_never_gated_pod_is_a_job_marked_as_skipped() -> None:
    cluster = ours_and_unserved()
    snapshot = cluster.relist_pods([
        pod_in("mine", "gated").in_queue("q").gated().obj(),
        pod_in("mine", "failed-open").in_queue("q").on_node("n1").in_phase("Running").obj(),
    ])
    assert {e.name: e.skipped_gate for e in snapshot.pod_events} == {
        "gated": False, "failed-open": True}


def test_the_verdict_survives_a_relist_so_the_job_is_not_taken_for_vanished() -> None:
    cluster = ours_and_unserved()
    cluster.relist_pods([])
    pod = pod_in("jhub", "jupyter-ann").in_queue("research")
    cluster.observe_pod(pod.obj())

    snapshot = cluster.relist_pods([pod.on_node("n1").in_phase("Running").obj()])

    assert [(e.name, e.skipped_gate) for e in snapshot.pod_events] == [("jupyter-ann", True)]
    assert snapshot.cluster_snapshot.pod_uids == ["uid-jupyter-ann"]


def test_a_pod_that_skipped_the_gate_gets_one_warning_notice_that_says_why() -> None:
    cluster = ours_and_unserved()
    cluster.relist_pods([])
    pod = pod_in("jhub", "jupyter-ann").in_queue("research")
    first = cluster.observe_pod(pod.obj())
    later = cluster.observe_pod(pod.on_node("n1").in_phase("Running").at_version("2").obj())
    assert first is not None and later is not None

    notices = cluster.notices_for([first])

    assert [(n.name, n.uid, n.queue, n.reason, n.event_type) for n in notices] == [
        ("jupyter-ann", "uid-jupyter-ann", "research", NoticeReason.SKIPPED_GATE.value,
         "Warning")]
    assert "lockgate.io/run=dev" in notices[0].message
    assert "does not serve namespace jhub" in notices[0].message
    assert cluster.notices_for([later]) == []  # once


def test_no_notice_for_jobs_that_were_gated_or_pods_that_already_ended() -> None:
    cluster = ours_and_unserved()
    snapshot = cluster.relist_pods([
        pod_in("mine", "gated").in_queue("q").gated().obj(),
        pod_in("jhub", "done").in_queue("research").on_node("n1").in_phase("Succeeded").obj(),
    ])
    assert [e.name for e in snapshot.pod_events] == ["gated", "done"]
    assert cluster.notices_for(snapshot.pod_events) == []


def test_a_pod_that_names_its_queue_only_through_its_namespace_label_is_reported_too() -> None:
    """The JupyterHub recipe names the queue on the namespace; the webhook would have copied it
    onto the pod, but no webhook served the namespace."""
    cluster = ours_and_unserved()
    cluster.relist_pods([])

    event = cluster.observe_pod(pod_in("jhub", "jupyter-bob").requesting(cpu="1").obj())

    assert event is not None and event.skipped_gate
    assert (event.queue, event.jobset) == ("research", "jhub")


def test_pods_that_name_no_queue_or_live_in_an_unmanaged_namespace_stay_unmanaged() -> None:
    cluster = ours_and_unserved()
    cluster.observe_namespace(a_namespace("labelled-only", managed=False,
                                          **{"lockgate.io/queue": "research"}))
    snapshot = cluster.relist_pods([
        pod_in("mine", "no-queue").on_node("n1").in_phase("Running").requesting(cpu="1").obj(),
        pod_in("labelled-only", "x").on_node("n1").in_phase("Running").requesting(cpu="2").obj(),
        pod_in("kube-system", "dns").in_queue("research").on_node("n1").in_phase("Running")
        .requesting(cpu="4").obj(),
    ])
    assert snapshot.pod_events == []
    assert cluster.unmanaged_usage("n1") == {"cpu": 7000}


def test_unfinished_pods_that_skipped_the_gate_are_sent_again_as_last_seen() -> None:
    """Their queue may bind their namespace only after they started (lockgate.ingest stores
    them only then): each resend is a chance to be counted before the pod ends."""
    cluster = ours_and_unserved()
    cluster.relist_pods([pod_in("jhub", "listed").in_queue("research").on_node("n1")
                         .in_phase("Running").obj(),
                         pod_in("mine", "gated").in_queue("q").gated().obj()])
    pod = pod_in("jhub", "watched").in_queue("research")
    cluster.observe_pod(pod.obj())
    cluster.observe_pod(pod.on_node("n1").in_phase("Running").at_version("2").obj())
    cluster.observe_pod(pod_in("jhub", "done").in_queue("research").in_phase("Succeeded").obj())

    resent = cluster.resend_skipped()

    assert sorted((e.name, e.state, e.skipped_gate) for e in resent) == [
        ("listed", JobState.RUNNING, True), ("watched", JobState.RUNNING, True)]
    cluster.observe_pod(pod.on_node("n1").in_phase("Succeeded").at_version("3").obj())
    cluster.observe_pod(pod_in("jhub", "listed").in_queue("research").on_node("n1")
                        .in_phase("Running").obj(), deleted=True)
    assert cluster.resend_skipped() == []
