"""The leader's fairness report: every queue's gauges after a round, and none left behind for a
queue that is gone (each of its share kinds and phases)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from datetime import UTC, datetime

from builders import a_job, a_node, a_state
from prometheus_client import REGISTRY

from fair_scheduler.reporting import PHASES, SHARE_KINDS, FairnessReport
from lockgate.events import ClusterGrowth, NodePoolStatus
from lockgate.growth import GrowthPolicy
from lockgate.placement import Requirement
from lockgate.scheduler import RoundResult, SchedulerState, schedule_round
from lockgate.scheduler.report import ExplainSettings, report_round

SETTINGS = ExplainSettings(preemption=False, group_reserve_after=None, holds=True)


def record(report: FairnessReport, state: SchedulerState, result: RoundResult,
           phases: dict[str, Counter[str]], decisions: int = 0) -> None:
    report.record_round(report_round(state, result, number=1, at=datetime.now(UTC).timestamp(),
                                     phases=phases, settings=SETTINGS),
                        seconds=0.01, decisions=decisions)


def share(queue: str, kind: str) -> float | None:
    return REGISTRY.get_sample_value("lockgate_scheduler_queue_share",
                                     {"queue": queue, "kind": kind})


def jobs(queue: str, phase: str) -> float | None:
    return REGISTRY.get_sample_value("lockgate_scheduler_queue_jobs",
                                     {"queue": queue, "phase": phase})


def test_each_round_sets_every_queues_gauges_and_a_gone_queue_leaves_none() -> None:
    state = (a_state().with_queues("rep-a", "rep-b")
             .with_cluster("cluster-a", a_node(cpu="4", memory="8Gi").times(1))
             .with_jobs(a_job("rep-a").times(2), a_job("rep-b").times(3)).build())
    result = schedule_round(state, max_decisions=100, max_lookback_per_queue=10)
    report = FairnessReport("test")
    phases = {"rep-a": Counter(queued=2), "rep-b": Counter(queued=1, released=2)}
    record(report, state, result, phases, decisions=3)
    record(report, state, result, phases)
    for queue in ("rep-a", "rep-b"):
        fair = result.queues[queue].share
        assert share(queue, "fair") == fair.fair_share
        assert share(queue, "target") == fair.fair_target
        assert share(queue, "actual") == fair.actual_share
    # Released as the leader's tallies count them; queued as the state does (the round
    # released some).
    assert jobs("rep-b", "released") == 2
    assert jobs("rep-a", "queued") == state.queue_usage("rep-a").queued_jobs
    assert jobs("rep-b", "queued") == state.queue_usage("rep-b").queued_jobs > 0

    only_a = dataclasses.replace(result, queues={"rep-a": result.queues["rep-a"]})
    record(report, state, only_a, phases)
    assert [kind for kind in SHARE_KINDS if share("rep-b", kind) is not None] == []
    assert [phase for phase in PHASES if jobs("rep-b", phase) is not None] == []
    assert share("rep-a", "fair") is not None
    report.set_leader(False)
    assert share("rep-a", "fair") is None and jobs("rep-a", "queued") is None


def test_a_round_sets_only_the_gauges_whose_values_changed() -> None:
    state = (a_state().with_queues("rep-c")
             .with_cluster("cluster-a", a_node(cpu="4", memory="8Gi").times(1))
             .with_jobs(a_job("rep-c").times(2)).build())
    result = schedule_round(state, max_decisions=100, max_lookback_per_queue=10)
    report = FairnessReport("test")
    record(report, state, result, {"rep-c": Counter(queued=2)})
    shares, phase_gauges = report._gauges["rep-c"]
    sets: list[float] = []
    for gauge in (*shares, *phase_gauges):
        original = gauge.set
        gauge.set = lambda value, original=original: (sets.append(value), original(value))[1]
    record(report, state, result, {"rep-c": Counter(queued=2)})
    assert sets == []  # nothing changed: nothing set
    record(report, state, result, {"rep-c": Counter(queued=1, released=1)})
    assert sets == [1]  # only the released count changed (queued is the state's)
    assert jobs("rep-c", "released") == 1
    assert share("rep-c", "fair") == result.queues["rep-c"].share.fair_share
    report.set_leader(False)


def test_the_fairness_json_carries_each_autoscaled_clusters_growth_and_none_for_others() -> None:
    jobs_b = a_job("a").in_cluster("b").requesting(cpu="4", memory="1Gi").times(3)
    state = (a_state().with_queues("a")
             .with_cluster("b", {"real": a_node(cpu="4", memory="16Gi").build()})
             .with_cluster("c", {"fixed": a_node(cpu="4", memory="16Gi").build()})
             .with_jobs(jobs_b).build())
    state.set_growth_policy(GrowthPolicy(wave_wait_seconds=0))
    state.set_growth("b", ClusterGrowth(
        cluster="b", observed_at=datetime(2026, 12, 7, tzinfo=UTC), autoscaled=True,
        node_pools=[NodePoolStatus(
            name="default", limits={"cpu": 16000}, in_use={"cpu": 0},
            requirements=(Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In",
                                      values=("4",)),
                          Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                                      values=("16Gi",))))]))
    result = schedule_round(state, max_decisions=10, max_lookback_per_queue=10,
                            now=datetime.now(UTC).timestamp())
    report = FairnessReport(instance_id="leader-1")
    report.set_leader(True)
    record(report, state, result, {"a": Counter(queued=3)}, decisions=len(result.decisions))
    growth = report.as_json()["growth"]
    # Only the autoscaled cluster b: one real node; 4 nodes of headroom, 2 of them taken by
    # the pods just released for growth (charged to their nodes until they bind).
    assert [entry["cluster"] for entry in growth] == ["b"]
    (b,) = growth
    assert (b["nodes"], b["capacity"]["cpu"]) == (1, 4000)
    assert b["released_unbound"] == 2
    (pool,) = b["node_pools"]
    assert (pool["name"], pool["headroom_nodes"], pool["headroom"]) == (
        "default", 4, {"cpu": 16000})
    assert b["stalled"] == "" and b["waiting"] == ""
    assert json.loads(report.encoded())["growth"] == growth
    # A standby says nothing of it.
    report.set_leader(False)
    assert report.as_json()["growth"] == []
