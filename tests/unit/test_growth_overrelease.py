"""Pods released for growth are never promised twice while the nodes made for them arrive.

The e2e test of issue 35 (tests/e2e/test_growth_e2e.py, "grows fairly") saw more pods released
than the NodePool's limits can ever hold. This plays, without I/O, what Karpenter does between
two rounds: NodeClaims for the pods released for growth, their Nodes registering (first with the
`karpenter.sh/unregistered` taint, then without) before kube-scheduler binds the pods, and a
second queue arriving meanwhile. After every round the pods released or bound in the cluster
must fit in what the pool can ever have: its limit, in whole nodes.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from builders import a_job, a_queue, a_state

from lockgate.events import ClusterGrowth, NodeClaimStatus, NodePoolStatus
from lockgate.growth import NODE_POOL_LABEL, GrowthPolicy
from lockgate.jobs import JobState
from lockgate.placement import Requirement, Taint
from lockgate.resources import Resources
from lockgate.scheduler import NodeInfo, SchedJob, SchedulerState, schedule_round

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
NOW = 1_800_000_000.0
KWOK_4X16 = (Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In", values=("4",)),
             Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                         values=("16Gi",)))
NODES_AT_THE_LIMIT = 4
PODS_PER_NODE = 4  # 1-cpu pods on 4-cpu nodes
UNREGISTERED = Taint(key="karpenter.sh/unregistered", value="", effect="NoExecute")


def picture(at: int, claims: list[NodeClaimStatus], in_use_nodes: int) -> ClusterGrowth:
    return ClusterGrowth(
        cluster="b", observed_at=T0 + timedelta(seconds=at), autoscaled=True,
        node_pools=[NodePoolStatus(name="default",
                                   limits={"cpu": NODES_AT_THE_LIMIT * 4000},
                                   in_use={"cpu": in_use_nodes * 4000},
                                   requirements=KWOK_4X16)],
        node_claims=claims)


def a_real_node(*, tainted: bool) -> NodeInfo:
    return NodeInfo(allocatable=Resources.from_kubernetes({"cpu": "4", "memory": "16Gi"}),
                    labels={NODE_POOL_LABEL: "default"},
                    taints=(UNREGISTERED,) if tainted else ())


def held_in_b(state: SchedulerState, jobs: list[SchedJob]) -> int:
    """How many of the jobs the state has released or bound (the pods that want a slot)."""
    return sum(1 for job in jobs
               if (record := state.job(job.job_id)) is not None
               and record.state is not JobState.QUEUED)


def released(state: SchedulerState, now: float) -> list[str]:
    result = schedule_round(state, max_decisions=100, max_lookback_per_queue=50, now=now)
    return [d.job_id for d in result.decisions]


@pytest.mark.parametrize("registers_tainted", [True, False])
def test_nodes_registering_for_released_pods_do_not_free_their_room(
        registers_tainted: bool) -> None:
    slots = NODES_AT_THE_LIMIT * PODS_PER_NODE
    w2 = a_job("w2").in_cluster("b").requesting(cpu="1", memory="64Mi").times(8)
    state = (a_state().with_queues(a_queue("w1"), a_queue("w2").with_weight(2))
             .with_cluster("b", {}).with_jobs(w2).build())
    state.set_growth_policy(GrowthPolicy(wave_wait_seconds=0, gather_seconds=0))
    state.set_growth("b", picture(0, [], 0))
    assert len(released(state, NOW)) == 8  # w2 alone: two nodes' worth, for growth
    # Karpenter makes two NodeClaims for them; the pool counts them.
    claims = [NodeClaimStatus(name=f"c{i}", node_pool="default", created_at=T0)
              for i in (1, 2)]
    state.set_growth("b", picture(5, claims, 2))
    # w1 arrives.
    w1 = a_job("w1").in_cluster("b").requesting(cpu="1", memory="64Mi").times(24)
    state.upsert_jobs(w1)
    released(state, NOW + 1)
    assert held_in_b(state, w1 + w2) <= slots
    # The claims' Nodes register before kube-scheduler binds the pods.
    registered = [c.model_copy(update={"node_name": f"kwok-{c.name}", "registered": True,
                                       "launched": True}) for c in claims]
    for claim in registered:
        state.set_node("b", claim.node_name, a_real_node(tainted=registers_tainted))
    state.set_growth("b", picture(10, registered, 2))
    released(state, NOW + 2)
    assert held_in_b(state, w1 + w2) <= slots
    # Karpenter removes its taint; the claims are initialized (a node now, not in flight).
    for claim in registered:
        state.set_node("b", claim.node_name, a_real_node(tainted=False))
    state.set_growth("b", picture(15, [], 2))
    released(state, NOW + 3)
    assert held_in_b(state, w1 + w2) <= slots, (
        f"{held_in_b(state, w1 + w2)} pods released or bound for {slots} slots")


def test_pods_bound_to_a_node_the_scheduler_does_not_know_yet_keep_their_room() -> None:
    # kube-scheduler binds the pods released for growth to the claims' Nodes; the leader
    # hears of the bindings before it hears of the Nodes (different topics, different lags).
    slots = NODES_AT_THE_LIMIT * PODS_PER_NODE
    w2 = a_job("w2").in_cluster("b").requesting(cpu="1", memory="64Mi").times(8)
    state = (a_state().with_queues(a_queue("w1"), a_queue("w2").with_weight(2))
             .with_cluster("b", {}).with_jobs(w2).build())
    state.set_growth_policy(GrowthPolicy(wave_wait_seconds=0, gather_seconds=0))
    state.set_growth("b", picture(0, [], 0))
    assert len(released(state, NOW)) == 8
    claims = [NodeClaimStatus(name=f"c{i}", node_pool="default", created_at=T0,
                              node_name=f"kwok-c{i}", registered=True, launched=True)
              for i in (1, 2)]
    state.set_growth("b", picture(5, claims, 2))
    for i, job in enumerate(w2):
        state.upsert_job(replace(job, state=JobState.RUNNING, node_name=f"kwok-c{1 + i // 4}"))
    w1 = a_job("w1").in_cluster("b").requesting(cpu="1", memory="64Mi").times(24)
    state.upsert_jobs(w1)
    released(state, NOW + 1)
    assert held_in_b(state, w1 + w2) <= slots, (
        f"{held_in_b(state, w1 + w2)} pods released or bound for {slots} slots")


def test_a_node_known_before_its_claim_names_it_is_not_room_twice() -> None:
    # The Node registered (the leader has it) while the picture still shows its NodeClaim in
    # flight without a node name (Karpenter sets status.nodeName a moment later).
    slots = NODES_AT_THE_LIMIT * PODS_PER_NODE
    w2 = a_job("w2").in_cluster("b").requesting(cpu="1", memory="64Mi").times(16)
    state = (a_state().with_queues(a_queue("w1"), a_queue("w2").with_weight(2))
             .with_cluster("b", {}).with_jobs(w2).build())
    state.set_growth_policy(GrowthPolicy(wave_wait_seconds=0, gather_seconds=0))
    state.set_growth("b", picture(0, [], 0))
    assert len(released(state, NOW)) == 16
    claims = [NodeClaimStatus(name=f"c{i}", node_pool="default", created_at=T0)
              for i in (1, 2, 3, 4)]
    state.set_growth("b", picture(5, claims, 4))
    for i in (1, 2, 3, 4):
        state.set_node("b", f"kwok-c{i}", a_real_node(tainted=False))
    w1 = a_job("w1").in_cluster("b").requesting(cpu="1", memory="64Mi").times(24)
    state.upsert_jobs(w1)
    released(state, NOW + 1)
    assert held_in_b(state, w1 + w2) <= slots, (
        f"{held_in_b(state, w1 + w2)} pods released or bound for {slots} slots")


def test_pods_bound_to_a_claims_node_not_known_yet_at_the_limits_keep_their_room() -> None:
    # The pool at its limits: two NodeClaims named their Nodes, kube-scheduler bound the pods
    # there, and the leader has the bindings before the Nodes.
    w2 = a_job("w2").in_cluster("b").requesting(cpu="1", memory="64Mi").times(8)
    state = (a_state().with_queues(a_queue("w1"), a_queue("w2").with_weight(2))
             .with_cluster("b", {}).with_jobs(w2).build())
    state.set_growth_policy(GrowthPolicy(wave_wait_seconds=0, gather_seconds=0))
    limit = ClusterGrowth(cluster="b", observed_at=T0, autoscaled=True, node_pools=[
        NodePoolStatus(name="default", limits={"cpu": 8000}, in_use={"cpu": 0},
                       requirements=KWOK_4X16)])
    state.set_growth("b", limit)
    assert len(released(state, NOW)) == 8
    claims = [NodeClaimStatus(name=f"c{i}", node_pool="default", created_at=T0,
                              node_name=f"kwok-c{i}", registered=True, launched=True)
              for i in (1, 2)]
    state.set_growth("b", limit.model_copy(update={
        "observed_at": T0 + timedelta(seconds=5), "node_claims": claims,
        "node_pools": [limit.node_pools[0].model_copy(update={"in_use": {"cpu": 8000}})]}))
    for i, job in enumerate(w2):
        state.upsert_job(replace(job, state=JobState.RUNNING, node_name=f"kwok-c{1 + i // 4}"))
    w1 = a_job("w1").in_cluster("b").requesting(cpu="1", memory="64Mi").times(24)
    state.upsert_jobs(w1)
    assert released(state, NOW + 1) == [], "the pool is at its limits, its nodes full"
