"""cluster-watcher's pod audit: a fresh list finds the pods of lockgate's that the watch passed
without reporting, and only those (never a pod the watch has not reached yet, nor one deleted
meanwhile, nor anyone else's)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from helpers import pods
from helpers.pods import PodBuilder
from lockgate.jobs import JobState
from lockgate.labels import MANAGED_NAMESPACE_LABEL
from lockgate.observing import ObservedCluster

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def a_pod(name: str, version: int, *, namespace: str = "team-a") -> PodBuilder:
    return (pods.a_pod(name).in_namespace(namespace).with_uid(f"uid-{name}").in_queue("q")
            .gated().requesting(cpu="1").at_version(str(version)))


def a_namespace(name: str, *, managed: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name,
                         "labels": {MANAGED_NAMESPACE_LABEL: "true"} if managed else {}}}


def a_cluster() -> ObservedCluster:
    ticks, ids = itertools.count(), itertools.count()
    cluster = ObservedCluster("cluster-b", now=lambda: T0 + timedelta(seconds=next(ticks)),
                              new_id=lambda: f"id-{next(ids)}")
    cluster.relist_namespaces([a_namespace("team-a"), a_namespace("free", managed=False)])
    cluster.relist_pods([])
    return cluster


def test_a_pod_the_watch_passed_without_reporting_is_found_once_with_its_event() -> None:
    cluster = a_cluster()
    seen, skipped = a_pod("etl-1", 10), a_pod("etl-2", 11)
    assert cluster.observe_pod(seen.obj()) is not None
    assert cluster.observe_pod(a_pod("etl-3", 12).obj()) is not None  # the watch is at 12
    cluster.begin_pod_audit()
    missed = cluster.end_pod_audit([seen.obj(), skipped.obj(), a_pod("etl-3", 12).obj()])
    assert [(m.event.name, m.event.uid, m.event.state, m.watched_version) for m in missed] == [
        ("etl-2", "uid-etl-2", JobState.QUEUED, 12)]
    # Taken in: the next audit, and the watch's late event for it, report nothing new.
    cluster.begin_pod_audit()
    assert cluster.end_pod_audit([seen.obj(), skipped.obj()]) == []
    assert cluster.observe_pod(skipped.obj()) is None


def test_a_pod_newer_than_the_watch_is_left_to_the_watch() -> None:
    cluster = a_cluster()
    cluster.observe_pod(a_pod("etl-1", 10).obj())
    cluster.begin_pod_audit()
    assert cluster.end_pod_audit([a_pod("etl-1", 10).obj(), a_pod("etl-2", 11).obj()]) == []


def test_a_pod_the_watch_reported_gone_during_the_list_is_not_missed() -> None:
    cluster = a_cluster()
    pod = a_pod("etl-1", 10)
    cluster.observe_pod(pod.obj())
    cluster.observe_pod(a_pod("other", 20).obj())
    cluster.begin_pod_audit()
    cluster.observe_pod(pod.at_version("21").obj(), deleted=True)  # while the list ran
    assert cluster.end_pod_audit([pod.obj()]) == []


def test_pods_that_are_not_lockgates_or_not_judged_yet_are_not_missed() -> None:
    cluster = a_cluster()
    cluster.observe_pod(a_pod("watched", 50).obj())
    elsewhere = a_pod("x", 5, namespace="free")  # labelled, but its namespace is not managed
    unseen_namespace = a_pod("y", 6, namespace="team-new")
    unlabelled = pods.a_pod("z").in_namespace("team-a").with_uid("uid-z").at_version("7")
    cluster.begin_pod_audit()
    assert cluster.end_pod_audit([elsewhere.obj(), unseen_namespace.obj(),
                                  unlabelled.obj()]) == []


def test_without_an_audit_begun_or_after_a_relist_nothing_is_missed() -> None:
    cluster = a_cluster()
    cluster.observe_pod(a_pod("watched", 50).obj())
    skipped = a_pod("etl-2", 11)
    assert cluster.end_pod_audit([skipped.obj()]) == []
    cluster.begin_pod_audit()
    cluster.relist_pods([a_pod("watched", 50).obj()])  # a relist replaces what it compares
    assert cluster.end_pod_audit([skipped.obj()]) == []
