"""The leader's bookkeeping of usage history (lockgate.scheduler.history): usage advanced from
what queues hold, weights recomputed on a period and only past a tolerance (so the targets
preemption converges to stand still), the words explain uses, the rebuild from run records,
and the state's targets divided by the weights in force. Expected numbers are worked out here
from the rule's formula, weight x 2^(-u / s), not read back from the code under test."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
from builders import a_job, a_node, a_state

from lockgate.decayed_usage import DecayedUsage, HistoryPolicyError
from lockgate.jobs import JobState
from lockgate.queue_tree import QueueTree, TreeNode
from lockgate.scheduler import PreemptionPolicy, SchedulerState, plan_evictions, schedule_round
from lockgate.scheduler.history import (
    RunInterval,
    UsageHistory,
    held_back_words,
    history_json,
    rebuild_usage,
)

HALF_LIFE = 120.0


def history(**kwargs: float) -> UsageHistory:
    settings = {"half_life_seconds": HALF_LIFE, "recompute_seconds": 30.0, "tolerance": 0.05,
                "at": 0.0} | kwargs
    return UsageHistory(**settings)


def test_the_issues_second_test_by_hand() -> None:
    """alice held the whole pool for 5 minutes, bob nothing, weights 1 and 1: alice's usage
    fraction is 1 and her share fraction 1/2, so her weight is 1 x 2^(-1 / 0.5) = 1/4; bob keeps
    1. Both asking, she gets 1/4 / (1/4 + 1) = 20%."""
    tree = QueueTree.flat({"alice": 1.0, "bob": 1.0})
    kept = history()
    for second in range(0, 300, 10):  # once per 10 s "round", holding everything
        kept.observe(now=second + 10.0, shares={"alice": 1.0})
    assert kept.recompute(tree, now=300.0)
    assert kept.weights_in_force == pytest.approx({"alice": 0.25, "bob": 1.0})
    rate = math.log(2) / HALF_LIFE
    assert kept.usage.of_leaf("alice") == pytest.approx((1 - math.exp(-rate * 300)) / rate)
    report = kept.report(tree)
    alice = report.nodes["alice"]
    assert (alice.usage_fraction, alice.share_fraction) == (1.0, 0.5)
    assert alice.times_its_share == 2.0 and alice.factor == 0.25
    assert report.words["alice"].startswith(
        "ranked below its sibling bob: alice used 2.0x its share over the last half-life")
    assert report.words["bob"] == ""
    body = history_json(report)
    assert body["nodes"]["alice"]["effective_weight"] == 0.25  # type: ignore[index]


def test_weights_move_only_on_the_period_and_past_the_tolerance() -> None:
    tree = QueueTree.flat({"alice": 1.0, "bob": 1.0})
    kept = history(recompute_seconds=60.0, tolerance=0.05)
    kept.observe(now=60.0, shares={"alice": 0.6, "bob": 0.4})
    assert kept.recompute(tree, now=60.0)  # the first computation is always adopted
    first = dict(kept.weights_in_force)
    # alice 0.6 of the usage at share 0.5: 2^-1.2; bob 2^-0.8.
    assert first == pytest.approx({"alice": 2 ** -1.2, "bob": 2 ** -0.8})
    kept.observe(now=90.0, shares={"alice": 1.0})
    assert not kept.due(90.0) and not kept.recompute(tree, now=90.0)  # not due: unchanged
    assert kept.weights_in_force == first
    # Due, but the same split since: every weight within the tolerance, so they stand still.
    kept.observe(now=120.0, shares={"alice": 0.6, "bob": 0.4})
    steady = history(recompute_seconds=60.0, tolerance=0.05)
    steady.observe(now=60.0, shares={"alice": 0.6, "bob": 0.4})
    steady.recompute(tree, now=60.0)
    steady.observe(now=120.0, shares={"alice": 0.61, "bob": 0.39})
    assert steady.due(120.0) and not steady.recompute(tree, now=120.0)
    assert steady.weights_in_force == pytest.approx({"alice": 2 ** -1.2, "bob": 2 ** -0.8})
    # A real move (alice alone for a long time) passes the tolerance when due.
    steady.observe(now=600.0, shares={"alice": 1.0})
    assert steady.recompute(tree, now=600.0)
    assert steady.weights_in_force["alice"] < 2 ** -1.2 * 0.95
    # A new queue changes the node set: adopted at the next due time whatever the tolerance.
    wider = QueueTree.flat({"alice": 1.0, "bob": 1.0, "carol": 1.0})
    assert steady.recompute(wider, now=660.0)
    assert set(steady.weights_in_force) == {"alice", "bob", "carol"}


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(HistoryPolicyError, match="positive period"):
        history(recompute_seconds=0.0)
    with pytest.raises(HistoryPolicyError, match="tolerance"):
        history(tolerance=1.5)
    with pytest.raises(HistoryPolicyError, match="half-life"):
        history(half_life_seconds=0.0)


def test_words_name_the_level_that_holds_a_leaf_back() -> None:
    tree = QueueTree.build([
        TreeNode("research", weight=3), TreeNode("vision", parent="research"),
        TreeNode("nlp", parent="research"), TreeNode("alice", parent="vision"),
        TreeNode("bob", parent="vision"), TreeNode("carol", parent="nlp"),
        TreeNode("production", weight=2)])
    kept = history()
    # alice and bob used the same inside vision; vision used everything inside research.
    kept.observe(now=300.0, shares={"alice": 0.3, "bob": 0.3})
    kept.recompute(tree, now=300.0)
    report = kept.report(tree)
    assert report.nodes["alice"].factor == pytest.approx(0.5)  # exactly its share among vision
    assert report.words["alice"].startswith("ranked below vision's sibling nlp: vision used 2.0x")
    # carol is not held back inside research (nlp used nothing), but research is at the root.
    assert report.words["carol"].startswith(
        "ranked below research's sibling production: research used 1.7x")  # 1 / 0.6
    assert report.words["production"] == ""
    # research used everything at the root (share 3/5): 2^(-1 / 0.6) of its weight 3.
    assert report.nodes["research"].effective_weight == pytest.approx(3 * 2 ** (-1 / 0.6))
    assert held_back_words(tree, report.nodes, "nobody") == ""


def test_a_rebuild_from_faithful_records_equals_the_kept_usage() -> None:
    generator = random.Random(36)
    for _ in range(50):
        runs = []
        for _ in range(generator.randint(1, 8)):
            since = generator.uniform(0, 900)
            until = None if generator.random() < 0.3 else since + generator.uniform(0, 600)
            runs.append(RunInterval(leaf=generator.choice("ab"),
                                    share=generator.uniform(0, 0.5), since=since, until=until))
        now = 1000.0
        # The same runs advanced step by step, at every start and end, as a leader would.
        kept = DecayedUsage(half_life_seconds=HALF_LIFE, at=0.0)
        moments = sorted({0.0, now, *(r.since for r in runs),
                          *(r.until for r in runs if r.until is not None and r.until < now)})
        for start, end in itertools.pairwise(moments):
            shares: dict[str, float] = {}
            for run in runs:
                ends = now if run.until is None else run.until
                if run.since <= start and end <= ends:
                    shares[run.leaf] = shares.get(run.leaf, 0.0) + run.share
            kept.advance(now=end, shares=shares)
        rebuilt = rebuild_usage(runs, half_life_seconds=HALF_LIFE, now=now)
        for leaf in "ab":
            assert rebuilt.get(leaf, 0.0) == pytest.approx(kept.of_leaf(leaf), rel=1e-9,
                                                           abs=1e-9)
    with pytest.raises(ValueError, match="share"):
        rebuild_usage([RunInterval("a", -1.0, 0.0, 1.0)], half_life_seconds=HALF_LIFE, now=2.0)


def two_queues_state() -> SchedulerState:
    return (
        a_state()
        .with_queues("alice", "bob")
        .with_cluster("A", a_node(cpu="25", memory="100Gi").times(4, prefix="a"))
        .with_jobs(a_job("alice").in_cluster("A").times(100),
                   a_job("bob").in_cluster("A").times(100))
        .build()
    )


def cpu(state: SchedulerState) -> dict[str, float]:
    return {name: round(target.clusters["A"]["cpu"] / 1000, 6)
            for name, target in state.fair_targets().queues.items()}


def test_the_state_divides_its_targets_by_the_weights_in_force() -> None:
    state = two_queues_state()
    assert cpu(state) == pytest.approx({"alice": 50.0, "bob": 50.0})
    state.use_history_weights({"alice": 0.25, "bob": 1.0})
    assert cpu(state) == pytest.approx({"alice": 20.0, "bob": 80.0})  # 1/4 : 1 of 100 cpu
    problem, _ = state.target_problem()
    assert problem.weights == pytest.approx({"alice": 0.25, "bob": 1.0})
    # The same weights through a tree (what a tree the other half wires gets).
    state.use_queue_tree(QueueTree.flat({"alice": 1.0, "bob": 1.0}))
    assert cpu(state) == pytest.approx({"alice": 20.0, "bob": 80.0})
    state.use_queue_tree(None)
    state.use_history_weights({})
    assert cpu(state) == pytest.approx({"alice": 50.0, "bob": 50.0})
    with pytest.raises(ValueError, match="positive"):
        state.use_history_weights({"alice": 0.0})


def test_dominant_shares_are_what_each_queue_holds_of_the_pool() -> None:
    state = (a_state().with_queues("alice", "bob")
             .with_cluster("A", a_node(cpu="10", memory="10Gi").times(2, prefix="a"))
             .with_jobs(a_job("alice").requesting(cpu="5", memory="1Gi").in_cluster("A")
                        .running_on("a0").times(1))
             .build())
    assert state.dominant_shares() == pytest.approx({"alice": 0.25})  # 5 of 20 cpu


def test_preemption_moves_pods_only_when_the_weights_in_force_change() -> None:
    """A closed system through the real round and planner, as the leader drives them: hog held
    the cluster for 5 minutes, then idle asks as much. History is advanced every (simulated)
    second, the weights recomputed every 10 s and kept within a 5% tolerance. Evictions happen
    only right after the weights in force changed, all from one queue each time (no pod moves
    back and forth while the weights stand still), and the split moves toward even."""
    policy = PreemptionPolicy(preemptible_priority_classes=frozenset())
    hog_pods = [a_job("hog").preemptible().in_cluster("A").running_on(f"node-{1 + i // 4}")
                .build() for i in range(16)]
    state = (a_state().with_queues("hog", "idle")
             .with_cluster("A", a_node(cpu="4").times(4))
             .with_jobs(hog_pods, a_job("hog").preemptible().in_cluster("A").times(16))
             .build())
    tree = QueueTree.flat({"hog": 1.0, "idle": 1.0})
    kept = history(recompute_seconds=10.0, tolerance=0.05)
    replacements = iter(range(10**9))

    def step(now: float) -> tuple[bool, list[str]]:
        kept.observe(now=now, shares=state.dominant_shares())
        changed = kept.recompute(tree, now=now)
        if changed:
            state.use_history_weights(kept.weights_in_force)
        result = schedule_round(state, max_decisions=1000, max_lookback_per_queue=100, now=now)
        for decision in result.decisions:
            job = state.job(decision.job_id)
            assert job is not None
            state.upsert_job(replace(job, state=JobState.RUNNING, node_name=decision.node_hint))
        evictions = plan_evictions(state, result, policy=policy, evicting=())
        for eviction in evictions:
            victim = state.job(eviction.job_id)
            assert victim is not None
            state.upsert_job(replace(victim, state=JobState.DELETED))
            state.upsert_job(replace(victim, job_id=f"A/again-{next(replacements)}",
                                     state=JobState.QUEUED, node_name=None,
                                     created_at=victim.created_at + 10_000))
        return changed, [eviction.queue for eviction in evictions]

    # The cluster is hog's for 5 minutes (idle asks nothing yet).
    for second in range(1, 301):
        changed, evicted = step(float(second))
        assert evicted == []
    assert state.queue_usage("hog").allocated_jobs == 16
    state.upsert_job(a_job("idle").preemptible().in_cluster("A").build())
    for job in a_job("idle").preemptible().in_cluster("A").times(15):
        state.upsert_job(job)
    since_change = 0  # idle's demand moved the targets: the first move is due to it
    moves: list[tuple[float, set[str]]] = []
    held: list[int] = []
    for second in range(301, 901):
        changed, evicted = step(float(second))
        since_change = 0 if changed else since_change + 1
        if evicted:
            # Only in the round the weights changed (or the next, as pods come back queued).
            assert since_change <= 1, (second, evicted)
            moves.append((second, set(evicted)))
        held.append(state.queue_usage("hog").allocated_jobs)
    assert all(len(queues) == 1 for _, queues in moves), moves
    # Right after idle asked: hog at a fifth (1/4 : 1) of 16, rounded by whole pods.
    assert held[5] in (3, 4), held[:10]
    # Then the split moves toward even as hog's usage decays and idle's grows.
    assert held[-1] > held[5] and held[-1] <= 8, held[-20:]
    # A few moves, each at a recomputation that changed the weights in force (10 s apart, most
    # recomputations changing nothing): the targets drifted in steps, not every round.
    assert 3 <= len(moves) <= 10, moves
