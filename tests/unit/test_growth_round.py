"""Rounds in a cluster that can grow (issue 35; docs/autoscaling.md, "Guarantees").

Cluster "b" has real nodes and a Karpenter NodePool "default" of 4-core, 16Gi nodes; what it may
still add are virtual nodes (`lockgate.growth`). The round uses the real nodes' room first,
releases a pod onto a node that may exist only while its queue is below its fair target there,
keeps each such pod charged to its virtual node until it binds, releases a gang for growth in
one round, waits for the last wave's NodeClaims, and stops when growth stalls. The conftest
checks the state's invariants (the growth accounting among them) after every change, round and
commit.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from builders import a_job, a_node, a_queue, a_state

from lockgate.events import ClusterGrowth, NodeClaimStatus, NodePoolStatus
from lockgate.growth import GrowthPolicy
from lockgate.jobs import JobState
from lockgate.placement import Label, PodPlacement, Requirement
from lockgate.scheduler import RoundResult, SchedulerState, schedule_round
from lockgate.scheduler.explain import OVER_SHARE_FOR_GROWTH, GrowthStanding
from lockgate.scheduler.report import ExplainSettings, growth_json, report_round, short_reason
from lockgate.scheduler.round import SkipReason, growth_gate
from lockgate.scheduler.state import SchedJob

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
NOW = 1_800_000_000.0
KWOK_4X16 = (Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In", values=("4",)),
             Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                         values=("16Gi",)))
NO_PACING = GrowthPolicy(wave_wait_seconds=0)


def a_picture(*, cpu_limit: int, cpu_in_use: int = 0, at: datetime = T0,
              claims: tuple[NodeClaimStatus, ...] = ()) -> ClusterGrowth:
    """Cluster b's NodePool "default" of 4-core nodes, limited to `cpu_limit` millicores."""
    return ClusterGrowth(cluster="b", observed_at=at, autoscaled=True, node_pools=[
        NodePoolStatus(name="default", limits={"cpu": cpu_limit}, in_use={"cpu": cpu_in_use},
                       requirements=KWOK_4X16)], node_claims=list(claims))


def a_claim(name: str, *, failure: str = "") -> NodeClaimStatus:
    return NodeClaimStatus(name=name, node_pool="default", created_at=T0, failure=failure)


def run(state: SchedulerState, *, now: float = NOW, max_decisions: int = 100) -> RoundResult:
    return schedule_round(state, max_decisions=max_decisions, max_lookback_per_queue=50, now=now)


def grown(result: RoundResult) -> list[str]:
    return [d.job_id for d in result.decisions if d.growth is not None]


def test_the_real_nodes_room_goes_first_then_nodes_that_may_exist() -> None:
    jobs = a_job("a").in_cluster("b").requesting(cpu="4", memory="1Gi").times(4)
    state = (a_state().with_queues("a")
             .with_cluster("b", {"real": a_node(cpu="4", memory="16Gi").build()})
             .with_jobs(jobs).build())
    state.set_growth_policy(NO_PACING)
    state.set_growth("b", a_picture(cpu_limit=8000))
    result = run(state)
    by_job = {d.job_id: d for d in result.decisions}
    assert by_job[jobs[0].job_id].node_hint == "real"
    assert by_job[jobs[0].job_id].growth is None
    # 8 cores of headroom: two 4-core nodes, one pod each; the fourth pod waits.
    assert [by_job[j.job_id].node_hint for j in jobs[1:3]] == ["growth:default/0",
                                                                "growth:default/1"]
    note = by_job[jobs[1].job_id].growth
    assert note is not None and note.pool == "default" and note.claim == ""
    assert note.words("b") == "released so that b grows (NodePool default: headroom cpu=8)"
    assert jobs[3].job_id not in by_job
    # Its kind found no room on either: the cluster is set aside for the queue this round.
    assert result.queues["a"].set_aside == ("b",)


def test_a_cluster_without_an_autoscaler_releases_as_before() -> None:
    jobs = a_job("a").in_cluster("b").requesting(cpu="4").times(2)
    state = (a_state().with_queues("a").with_cluster("b", {"real": a_node(cpu="4").build()})
             .with_jobs(jobs).build())
    state.set_growth("b", ClusterGrowth(cluster="b", observed_at=T0, autoscaled=False))
    result = run(state)
    assert [d.job_id for d in result.decisions] == [jobs[0].job_id]
    assert grown(result) == []
    assert state.cluster_records["b"].order == ["real"]
    assert state.growth_plan("b") is None


def test_a_queue_at_its_share_is_never_released_for_growth() -> None:
    # Cluster a: 20 cores, all held by queue x; cluster b: one real 4-core node, held by x too,
    # and 4 nodes of headroom (16 cores). Pool 40 cores; x and y weigh the same. y asks for 24
    # cores in b, of which b can give it 16: its target; x's is the 24 it holds. y may use only
    # 8 (its queue's limit), so 8 cores of headroom stay free, and still the cluster must not
    # grow for x, which is at its share.
    held = a_job("x").in_cluster("a").requesting(cpu="4").running_on("a-1").times(5)
    held_in_b = a_job("x").in_cluster("b").requesting(cpu="4").running_on("real").build()
    x_waiting = a_job("x").in_cluster("b").requesting(cpu="2").times(6)
    y_waiting = a_job("y").in_cluster("b").requesting(cpu="4").times(6)
    state = (a_state().with_queues(a_queue("x"), a_queue("y").limited_to(cpu="8"))
             .with_cluster("a", {"a-1": a_node(cpu="20").build()})
             .with_cluster("b", {"real": a_node(cpu="4").build()})
             .with_jobs(held, held_in_b, x_waiting, y_waiting).build())
    state.set_growth_policy(NO_PACING)
    state.set_growth("b", a_picture(cpu_limit=16_000))
    result = run(state)
    assert [d.queue for d in result.decisions] == ["y", "y"]
    assert len(grown(result)) == 2
    # Its first pod is looked at and told why; the rest of its kind are set aside with it.
    assert result.skipped_jobs[x_waiting[0].job_id] is SkipReason.OVER_SHARE_FOR_GROWTH
    assert result.queues["x"].set_aside == ("b",)
    # Room on a real node is another matter: x may take what nobody is owed there.
    state.set_node("b", "real-2", a_node(cpu="4").build())
    on_real = run(state, now=NOW + 1).decisions
    assert [(d.queue, d.node_hint, d.growth) for d in on_real] == [("x", "real-2", None)] * 2


def test_a_released_pod_not_yet_bound_keeps_its_room_on_the_node_that_may_exist() -> None:
    first = a_job("a").in_cluster("b").requesting(cpu="4").times(2)
    state = (a_state().with_queues("a").with_cluster("b", {}).with_jobs(first).build())
    state.set_growth_policy(NO_PACING)
    state.set_growth("b", a_picture(cpu_limit=8000))
    assert len(grown(run(state))) == 2
    later = a_job("a").in_cluster("b").requesting(cpu="4").times(2)
    state.upsert_jobs(later)
    # Released, not bound: the two nodes' room is theirs, not promised again.
    assert run(state, now=NOW + 1).decisions == ()
    # The autoscaler makes a NodeClaim for one of them: in_use grows by a node, headroom
    # shrinks by one, the claim is a node of its own. Still two nodes' room in all, taken.
    state.set_growth("b", a_picture(cpu_limit=8000, cpu_in_use=4000, at=T0 + timedelta(seconds=5),
                                    claims=(a_claim("default-x1"),)))
    assert sorted(state.cluster_records["b"].order) == ["growth:default/0",
                                                         "growth:default/claim/default-x1"]
    assert run(state, now=NOW + 2).decisions == ()
    # One binds to the claim's node, registered now: that room is the node's; none is free.
    state.upsert_job(replace(first[0], state=JobState.RUNNING, node_name="kwok-1"))
    assert first[0].job_id not in state.growth_releases
    assert set(state.growth_releases) == {first[1].job_id}


def test_a_gang_of_eight_is_released_for_growth_in_one_round() -> None:
    gang = a_job("a").in_cluster("b").requesting(cpu="4").in_group("train", 8).times(8)
    state = (a_state().with_queues("a").with_cluster("b", {"real": a_node(cpu="4").build()})
             .with_jobs(gang).build())
    state.set_growth("b", a_picture(cpu_limit=64_000))
    result = run(state)
    assert sorted(d.job_id for d in result.decisions) == sorted(j.job_id for j in gang)
    assert len(grown(result)) == 7  # one on the real node's room, seven on nodes to come
    assert len({state.growth_releases[j].round for j in grown(result)}) == 1


def test_a_next_wave_waits_for_the_last_waves_node_claims_at_most_the_bound() -> None:
    policy = GrowthPolicy(wave_wait_seconds=60)
    first = a_job("a").in_cluster("b").requesting(cpu="4").times(2)
    state = a_state().with_queues("a").with_cluster("b", {}).with_jobs(first).build()
    state.set_growth_policy(policy)
    state.set_growth("b", a_picture(cpu_limit=64_000))
    assert len(grown(run(state))) == 2
    later = a_job("a").in_cluster("b").requesting(cpu="4").times(2)
    state.upsert_jobs(later)
    waiting = run(state, now=NOW + 10)
    assert waiting.decisions == ()
    assert waiting.skipped_jobs[later[0].job_id] is SkipReason.WAITING_FOR_GROWTH
    assert growth_gate(state, "b", now=NOW + 10).waiting.startswith(
        "waiting for the NodeClaims of the last wave")
    # The claims appear: the next wave goes.
    state.set_growth("b", a_picture(cpu_limit=64_000, cpu_in_use=8000,
                                    at=T0 + timedelta(seconds=20),
                                    claims=(a_claim("c1"), a_claim("c2"))))
    assert len(grown(run(state, now=NOW + 20))) == 2
    # Without an answer, the wait ends at the bound.
    third = a_job("a").in_cluster("b").requesting(cpu="4").times(1)
    state.upsert_jobs(third)
    assert run(state, now=NOW + 30).decisions == ()
    assert grown(run(state, now=NOW + 20 + 61)) == [third[0].job_id]


def test_growth_stalls_on_a_failed_claim_or_a_pod_unbound_past_the_deadline() -> None:
    jobs = a_job("a").in_cluster("b").requesting(cpu="4").times(3)
    state = a_state().with_queues("a").with_cluster("b", {}).with_jobs(jobs[:1]).build()
    state.set_growth_policy(GrowthPolicy(wave_wait_seconds=0, stall_after_seconds=300))
    state.set_growth("b", a_picture(cpu_limit=64_000, claims=(
        a_claim("c1", failure="InsufficientCapacity: no offering"),)))
    result = run(state)
    assert result.decisions == ()
    assert growth_gate(state, "b", now=NOW).stalled == (
        "growth stalled: NodeClaim c1: InsufficientCapacity: no offering")
    # The failed claim goes: growth resumes; a pod released then and never bound stalls it.
    state.set_growth("b", a_picture(cpu_limit=64_000, at=T0 + timedelta(seconds=1)))
    assert grown(run(state)) == [jobs[0].job_id]
    state.upsert_jobs(jobs[1:])
    assert len(grown(run(state, now=NOW + 299))) == 2
    assert run(state, now=NOW + 301).decisions == ()
    stalled = growth_gate(state, "b", now=NOW + 301).stalled
    assert stalled.startswith(f"growth stalled: pod default/{jobs[0].name}, released for "
                              "growth 301s ago, is still on no node")


def test_a_round_taken_back_forgets_its_releases_for_growth() -> None:
    jobs = a_job("a").in_cluster("b").requesting(cpu="4").times(2)
    state = a_state().with_queues("a").with_cluster("b", {}).with_jobs(jobs).build()
    state.set_growth("b", a_picture(cpu_limit=64_000))
    transaction = state.begin_round()
    result = schedule_round(state, max_decisions=10, max_lookback_per_queue=10, now=NOW,
                            transaction=transaction)
    assert set(state.growth_releases) == {j.job_id for j in jobs}
    transaction.commit(kept=[result.decisions[0].job_id])
    assert set(state.growth_releases) == {result.decisions[0].job_id}
    assert state.job_records[result.decisions[1].job_id].state is JobState.QUEUED


def test_explain_and_the_round_report_say_how_the_cluster_grows() -> None:
    held = a_job("x").in_cluster("a").requesting(cpu="4").running_on("a-1").times(5)
    held_in_b = a_job("x").in_cluster("b").requesting(cpu="4").running_on("real").build()
    x_waiting = a_job("x").in_cluster("b").requesting(cpu="4").times(2)
    y_waiting = a_job("y").in_cluster("b").requesting(cpu="4").times(4)
    state = (a_state().with_queues(a_queue("x"), a_queue("y").limited_to(cpu="8"))
             .with_cluster("a", {"a-1": a_node(cpu="20").build()})
             .with_cluster("b", {"real": a_node(cpu="4").build()})
             .with_jobs(held, held_in_b, x_waiting, y_waiting).build())
    # 16 cores of limit, 4 in use by a claim in flight: the claim's node and 3 nodes more.
    state.set_growth("b", a_picture(cpu_limit=16_000, cpu_in_use=4000,
                                    claims=(a_claim("default-c1"),)))
    result = run(state)
    released = grown(result)
    assert len(released) == 2
    report = report_round(state, result, number=1, at=NOW, phases={},
                          settings=ExplainSettings(preemption=False, group_reserve_after=None,
                                                   holds=True))
    said = report.explain([(j, None) for j in (released[0], released[1],
                                               x_waiting[0].job_id)], now=NOW)
    on_claim, on_headroom, over = (said[released[0]], said[released[1]],
                                   said[x_waiting[0].job_id])
    assert on_claim is not None and on_headroom is not None and over is not None
    assert on_claim.growth_standing == GrowthStanding.RELEASED
    assert on_claim.message.endswith(
        "released so that b grows (NodePool default: headroom cpu=12); waiting for a node "
        "(NodeClaim default-c1)")
    assert on_headroom.growth.endswith("waiting for a node (NodeClaims in flight: default-c1)")
    assert short_reason(on_claim) == "released so that b grows"
    assert over.growth == OVER_SHARE_FOR_GROWTH
    assert OVER_SHARE_FOR_GROWTH in over.message
    assert short_reason(over) == "over its share: b will not grow for it"
    # The room it is shown is that of the nodes that exist: one, full.
    assert (over.cluster_nodes, dict(over.cluster_free)) == (1, {"cpu": 0})
    status = report.growth["b"]
    assert (status.nodes, dict(status.capacity)) == (1, {"cpu": 4000})
    assert status.claims_in_flight == ("default-c1",)
    assert [(p.pool, p.nodes, dict(p.remaining)) for p in status.pools] == [
        ("default", 3, {"cpu": 12_000})]
    assert status.released_unbound == 2 and status.stalled == ""
    assert growth_json(status)["node_pools"][0]["headroom"] == {"cpu": 12_000}
    assert "a" not in report.growth  # not autoscaled: nothing to say
    # A claim fails: the cluster's growth stalls, and every pod waiting for it says why.
    state.set_growth("b", a_picture(cpu_limit=16_000, cpu_in_use=4000,
                                    at=T0 + timedelta(seconds=1), claims=(
        a_claim("default-c1", failure="InsufficientCapacity: no offering"),)))
    newcomer = a_job("z").in_cluster("b").requesting(cpu="4").build()
    state.upsert_queue(a_queue("z").build())
    state.upsert_job(newcomer)
    stalled = report_round(state, run(state, now=NOW + 1), number=2, at=NOW + 1, phases={},
                           settings=ExplainSettings(preemption=False, group_reserve_after=None,
                                                    holds=True))
    reason = "growth stalled: NodeClaim default-c1: InsufficientCapacity: no offering"
    assert stalled.growth["b"].stalled == reason
    said = stalled.explain([(newcomer.job_id, None), (released[0], None)], now=NOW + 1)
    assert said[newcomer.job_id] is not None and said[newcomer.job_id].growth == reason
    assert short_reason(said[newcomer.job_id]) == "growth stalled in b"
    assert said[released[0]] is not None and said[released[0]].growth.endswith(reason)


KWOK_16X64 = (Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In", values=("16",)),
              Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                          values=("64Gi",)))


# Gathering is for pools whose size lockgate cannot name to Karpenter: their requirements
# name no instance size, and lockgate's setting says what one node holds.
GATHERING = GrowthPolicy(wave_wait_seconds=0, gather_seconds=12, instance_shapes={
    "default": {"cpu": 16_000, "memory": 64 * (1 << 30)}})


def a_big_picture(*, cpu_limit: int,
                  requirements: tuple[Requirement, ...] = ()) -> ClusterGrowth:
    """Cluster b's NodePool "default" of 16-core, 64Gi nodes (by `GATHERING`'s setting; with
    `requirements`, as they say)."""
    return ClusterGrowth(cluster="b", observed_at=T0, autoscaled=True, node_pools=[
        NodePoolStatus(name="default", limits={"cpu": cpu_limit}, in_use={},
                       requirements=requirements)], node_claims=[])


def explained(state: SchedulerState, result: RoundResult, job_id: str, now: float) -> str:
    report = report_round(state, result, number=1, at=now, phases={},
                          settings=ExplainSettings(preemption=False, group_reserve_after=None,
                                                   holds=True))
    said = report.explain([(job_id, None)], now=now)[job_id]
    assert said is not None
    assert said.growth_standing == GrowthStanding.GATHERING
    assert short_reason(said) == "gathering a node's worth to grow b"
    assert said.growth in said.message
    return said.growth



def gathering_state(jobs: list[SchedJob], **picture: Any) -> SchedulerState:
    """Queue a's jobs in cluster b, which grows under a pool of 64 cpu (a big picture), with
    releases for growth gathered into a node's worth."""
    state = a_state().with_queues("a").with_cluster("b", {}).with_jobs(jobs).build()
    state.set_growth_policy(GATHERING)
    state.set_growth("b", a_big_picture(cpu_limit=64_000, **picture))
    return state

def test_releases_for_growth_are_gathered_until_they_fill_a_node_of_the_pool() -> None:
    first = a_job("a").in_cluster("b").requesting(cpu="4").times(1)
    state = gathering_state(first)
    held = run(state)
    # 4 of 16 cores owed: held, owed, still queued, and said so.
    assert held.decisions == ()
    assert held.skipped_jobs[first[0].job_id] is SkipReason.GATHERING_FOR_GROWTH
    assert first[0].job_id not in state.growth_releases
    assert state.job_records[first[0].job_id].state is JobState.QUEUED
    assert explained(state, held, first[0].job_id, NOW).startswith(
        "waiting to fill a node of the pool (NodePool default): 4 of 16 cpu owed")
    # Three more arrive: 16 of 16 owed, a node's worth, all four go in one wave, oldest first.
    more = a_job("a").in_cluster("b").requesting(cpu="4").times(3)
    state.upsert_jobs(more)
    wave = run(state, now=NOW + 2)
    assert [d.job_id for d in wave.decisions] == [j.job_id for j in (*first, *more)]
    assert len(grown(wave)) == 4
    assert "b" not in state.growth_gathering


def test_gathered_releases_go_once_the_bound_passes_whatever_is_owed() -> None:
    jobs = a_job("a").in_cluster("b").requesting(cpu="4").times(2)
    state = gathering_state(jobs)
    assert run(state).decisions == ()
    assert run(state, now=NOW + 11).decisions == ()  # the clock runs from the first hold
    assert len(grown(run(state, now=NOW + 12))) == 2


def test_without_gathering_or_a_clock_releases_for_growth_go_at_once() -> None:
    for policy, now in ((replace(GATHERING, gather_seconds=0), NOW), (GATHERING, None)):
        jobs = a_job("a").in_cluster("b").requesting(cpu="4").times(1)
        state = a_state().with_queues("a").with_cluster("b", {}).with_jobs(jobs).build()
        state.set_growth_policy(policy)
        state.set_growth("b", a_big_picture(cpu_limit=64_000))
        result = schedule_round(state, max_decisions=10, max_lookback_per_queue=50, now=now)
        assert len(grown(result)) == 1
        assert not state.growth_gathering


def test_a_gang_gathered_for_growth_waits_whole_on_the_real_nodes_too() -> None:
    gang = a_job("a").in_cluster("b").requesting(cpu="4").in_group("train", 2).times(2)
    state = (a_state().with_queues("a").with_cluster("b", {"real": a_node(cpu="4").build()})
             .with_jobs(gang).build())
    state.set_growth_policy(GATHERING)
    state.set_growth("b", a_big_picture(cpu_limit=64_000))
    held = run(state)
    # One member fit the real node, one needed growth (4 of 16 cpu): both wait.
    assert held.decisions == ()
    assert {held.skipped_jobs[j.job_id] for j in gang} == {SkipReason.GATHERING_FOR_GROWTH}
    assert not state.growth_releases
    assert all(state.job_records[j.job_id].state is JobState.QUEUED for j in gang)
    released = run(state, now=NOW + 12)
    assert sorted(d.job_id for d in released.decisions) == sorted(j.job_id for j in gang)
    assert len(grown(released)) == 1


def test_releases_onto_node_claims_in_flight_are_never_gathered() -> None:
    jobs = a_job("a").in_cluster("b").requesting(cpu="4").times(1)
    state = a_state().with_queues("a").with_cluster("b", {}).with_jobs(jobs).build()
    state.set_growth_policy(GATHERING)
    claim = NodeClaimStatus(name="c1", node_pool="default", created_at=T0,
                            allocatable={"cpu": 16_000, "memory": 64 * (1 << 30)})
    state.set_growth("b", ClusterGrowth(
        cluster="b", observed_at=T0, autoscaled=True, node_claims=[claim],
        node_pools=[NodePoolStatus(name="default", limits={"cpu": 64_000},
                                   in_use={"cpu": 16_000}, requirements=KWOK_16X64)]))
    result = run(state)
    assert [d.growth.claim for d in result.decisions if d.growth is not None] == ["c1"]


def test_releases_onto_a_size_karpenter_will_make_are_never_gathered() -> None:
    # A pool that names its sizes: one size (16 cpu), or several (4, 8, 16) of which the pod
    # is told to avoid the smaller. Karpenter makes the node counted for the first pod owed
    # room, and the next go onto its claim: gathering 16 cpu first would make the same node
    # later, so one 4-cpu pod goes at once, gathering on.
    for requirements in (KWOK_16X64, KWOK_M_FAMILY):
        jobs = a_job("a").in_cluster("b").requesting(cpu="4").times(1)
        state = gathering_state(jobs, requirements=requirements)
        result = run(state)
        notes = [d.growth for d in result.decisions if d.growth is not None]
        assert len(notes) == 1 and notes[0].size_named, requirements
        assert notes[0].node == "growth:default/0"
        assert not state.growth_gathering
    # The same pool with its size from lockgate's setting alone (not on its requirements):
    # Karpenter chooses the size, so the pod is held to gather.
    jobs = a_job("a").in_cluster("b").requesting(cpu="4").times(1)
    state = gathering_state(jobs)
    held = run(state)
    assert held.decisions == ()
    assert held.skipped_jobs[jobs[0].job_id] is SkipReason.GATHERING_FOR_GROWTH


def test_whole_nodes_worth_go_and_the_remainder_is_gathered_anew() -> None:
    # 5 pods of 4 cores: 20 of 16 owed -> one node's worth (the first four) goes, the fifth
    # (4 of 16) waits for more, its clock starting now.
    jobs = a_job("a").in_cluster("b").requesting(cpu="4").times(5)
    state = gathering_state(jobs)
    result = run(state)
    assert [d.job_id for d in result.decisions] == [j.job_id for j in jobs[:4]]
    assert result.skipped_jobs[jobs[4].job_id] is SkipReason.GATHERING_FOR_GROWTH
    assert state.growth_gathering["b"].since == NOW
    assert explained(state, result, jobs[4].job_id, NOW).startswith(
        "waiting to fill a node of the pool (NodePool default): 4 of 16 cpu owed")
    assert [d.job_id for d in run(state, now=NOW + 12).decisions] == [jobs[4].job_id]


def test_explain_says_why_a_cluster_with_no_node_cannot_grow_for_a_pod() -> None:
    # Cluster b has no node yet, and its pool names no instance size (no policy shape, no node
    # of its own to read it from): nothing may exist there, and explain says why, not merely
    # "no schedulable node".
    waiting = a_job("a").in_cluster("b").requesting(cpu="4").build()
    state = a_state().with_queues("a").with_cluster("b", {}).with_jobs(waiting).build()
    state.set_growth("b", ClusterGrowth(cluster="b", observed_at=T0, autoscaled=True,
                                        node_pools=[NodePoolStatus(name="default",
                                                                   limits={"cpu": 16_000})]))
    result = run(state)
    assert not result.decisions
    report = report_round(state, result, number=1, at=NOW, phases={},
                          settings=ExplainSettings(preemption=False, group_reserve_after=None,
                                                   holds=True))
    said = report.explain([(waiting.job_id, None)], now=NOW)[waiting.job_id]
    assert said is not None
    assert "its cluster cannot grow for it: NodePool default: the size of its nodes is unknown" \
        in said.message, said.message


KWOK_M_FAMILY = (Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In",
                             values=("4", "8", "16")),
                 Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                             values=("16Gi", "32Gi", "64Gi")))


def test_a_release_onto_headroom_says_which_smaller_types_its_pod_must_avoid() -> None:
    # 24 cpu of headroom in 4, 8 and 16-cpu types: one 16 and one 8. A 1-cpu pod goes onto the
    # 16 and is told to avoid 4 and 8, so that Karpenter makes the 16 lockgate counted.
    plain = a_job("a").in_cluster("b").requesting(cpu="1", memory="1Gi").build()
    # A pod that asks for the 8-cpu size itself lands on the 8, and avoids only the 4.
    on_eight = replace(
        a_job("a").in_cluster("b").requesting(cpu="1", memory="1Gi").named("eight").build(),
        placement=PodPlacement(node_selector=(
            Label(key="karpenter.kwok.sh/instance-cpu", value="8"),)))
    state = (a_state().with_queues("a").with_cluster("b", {})
             .with_jobs([plain, on_eight]).build())
    state.set_growth_policy(replace(NO_PACING, gather_seconds=0))
    state.set_growth("b", ClusterGrowth(cluster="b", observed_at=T0, autoscaled=True,
                                        node_pools=[NodePoolStatus(
                                            name="default", limits={"cpu": 24_000},
                                            requirements=KWOK_M_FAMILY)]))
    result = run(state)
    notes = {d.job_id: (d.node_hint, d.growth) for d in result.decisions}
    hint, note = notes[plain.job_id]
    assert hint == "growth:default/0" and note is not None
    assert note.avoid == Requirement(key="karpenter.kwok.sh/instance-cpu", operator="NotIn",
                                     values=("4", "8"))
    hint, note = notes["eight"]
    assert hint == "growth:default/1" and note is not None
    assert note.avoid == Requirement(key="karpenter.kwok.sh/instance-cpu", operator="NotIn",
                                     values=("4",))
