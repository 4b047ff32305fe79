"""The fair scheduler's pure core: shares, progressive filling, fit, limits, the state's books."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest
from builders import (
    a_job,
    a_node,
    a_queue,
    a_state,
    released_ids,
    released_per_queue,
)

from lockgate.jobs import JobState
from lockgate.queues import QueueSpec
from lockgate.resources import Resources
from lockgate.scheduler import (
    NodeInfo,
    QueueOutcome,
    RoundResult,
    SchedJob,
    SchedulerState,
    SkipReason,
    adjusted_fair_shares,
    fair_shares,
    schedule_round,
)
from lockgate.scheduler.room import BEST_FIT_WINDOW
from lockgate.scheduler.targets import FairTargets

GI = 2**30
GPU = "nvidia.com/gpu"


def run_round(
    state: SchedulerState, *, max_decisions: int = 10_000, lookback: int = 1_000
) -> RoundResult:
    return schedule_round(state, max_decisions=max_decisions, max_lookback_per_queue=lookback)


# ---- dividing the pool ---------------------------------------------------------------------


def test_equal_weights_split_the_pool_evenly() -> None:
    state = (
        a_state()
        .with_queues("a", "b")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(2))
        .with_jobs(a_job("a").times(10), a_job("b").times(10))
        .build()
    )

    result = run_round(state)

    assert released_per_queue(result) == {"a": 4, "b": 4}
    assert result.queues["a"].share.actual_share == pytest.approx(0.5)
    assert result.queues["b"].share.actual_share == pytest.approx(0.5)


def test_weights_one_one_two_give_quarter_quarter_half_when_saturated() -> None:
    state = (
        a_state()
        .with_queues("a", "b", a_queue("c").with_priority_factor(0.5))
        .with_cluster("cluster-a", a_node(cpu="8", memory="64Gi").times(5))
        .with_jobs(a_job("a").times(40), a_job("b").times(40), a_job("c").times(40))
        .build()
    )

    result = run_round(state)

    released = released_per_queue(result)
    assert sum(released.values()) == 40
    assert released["a"] == pytest.approx(10, abs=1)
    assert released["b"] == pytest.approx(10, abs=1)
    assert released["c"] == pytest.approx(20, abs=1)
    shares = {name: report.share.fair_share for name, report in result.queues.items()}
    assert shares == pytest.approx({"a": 0.25, "b": 0.25, "c": 0.5})


def test_the_dominant_resource_decides_the_share() -> None:
    # The DRF paper's example: 9 cpu and 18Gi; a asks <1 cpu, 4Gi> (memory-dominant), b asks
    # <3 cpu, 1Gi> (cpu-dominant). DRF gives a 3 jobs and b 2, both at a dominant share of 2/3,
    # and then the cpu is gone.
    state = (
        a_state()
        .with_queues("a", "b")
        .with_cluster("cluster-a", a_node(cpu="9", memory="18Gi").times(1))
        .with_jobs(
            a_job("a").requesting(cpu="1", memory="4Gi").times(8),
            a_job("b").requesting(cpu="3", memory="1Gi").times(8),
        )
        .build()
    )

    result = run_round(state)

    assert released_per_queue(result) == {"a": 3, "b": 2}
    assert state.queue_usage("a").allocation == {"cpu": 3000, "memory": 12 * GI}
    assert state.queue_usage("b").allocation == {"cpu": 6000, "memory": 2 * GI}
    assert result.queues["a"].share.actual_share == pytest.approx(2 / 3)
    assert result.queues["b"].share.actual_share == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("weights", "demands", "want"),
    [
        pytest.param(
            {"a": 1, "b": 1}, {"a": 1.0, "b": 1.0}, {"a": 0.5, "b": 0.5}, id="both-saturated"
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 1},
            {"a": 0.1, "b": 1.0, "c": 1.0},
            {"a": 0.1, "b": 0.45, "c": 0.45},
            id="small-demand-redistributed",
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 2},
            {"a": 0.05, "b": 1.0, "c": 1.0},
            {"a": 0.05, "b": 0.95 / 3, "c": 0.95 * 2 / 3},
            id="redistributed-by-weight",
        ),
        pytest.param(
            {"a": 1, "b": 1},
            {"a": 0.1, "b": 0.2},
            {"a": 0.1, "b": 0.2},
            id="nobody-can-use-the-rest",
        ),
        pytest.param(
            {"a": 1, "b": 1, "c": 1},
            {"a": 0.2, "b": 0.3, "c": 1.0},
            {"a": 0.2, "b": 0.3, "c": 0.5},
            id="cascading-caps",
        ),
    ],
)
def test_adjusted_fair_share_gives_what_others_cannot_use_to_the_rest(
    weights: dict[str, float], demands: dict[str, float], want: dict[str, float]
) -> None:
    assert adjusted_fair_shares(weights, demands) == pytest.approx(want, abs=0.01)


def test_fair_shares_count_only_active_queues_and_cap_small_demand() -> None:
    state = (
        a_state()
        .with_queues("small", "big", "idle")
        .with_cluster("cluster-a", a_node(cpu="10", memory="100Gi").times(1))
        .with_jobs(
            a_job("small").requesting(cpu="1", memory="1Gi"),
            a_job("big").requesting(cpu="1", memory="1Gi").times(20),
        )
        .build()
    )

    shares = fair_shares(state)

    assert shares["idle"].fair_share == 0.0
    assert shares["small"].fair_share == pytest.approx(0.5)
    assert shares["small"].demand_share == pytest.approx(0.1)
    assert shares["small"].adjusted_fair_share == pytest.approx(0.1)
    assert shares["big"].adjusted_fair_share == pytest.approx(0.9)


def test_freed_capacity_goes_to_the_most_under_served_queue() -> None:
    running_a = a_job("a").running_on("node-1").times(3)
    state = (
        a_state()
        .with_queues("a", "b")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .with_jobs(running_a, a_job("b").running_on("node-1"))
        .with_jobs(a_job("a").times(5), a_job("b").times(5))
        .build()
    )
    assert run_round(state).decisions == ()

    state.upsert_job(replace(running_a[0], state=JobState.SUCCEEDED))
    result = run_round(state)

    assert released_per_queue(result) == {"b": 1}


# ---- where a job may go ------------------------------------------------------------------


def test_a_job_too_big_for_every_node_does_not_block_its_queue() -> None:
    big = a_job("a").requesting(cpu="64").with_priority(10).named("cluster-a/big").build()
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="8", memory="32Gi").times(2))
        .with_jobs(big, a_job("a").times(3))
        .build()
    )

    result = run_round(state, lookback=0)

    assert released_per_queue(result) == {"a": 3}
    assert result.queues["a"].unschedulable == 1
    assert state.queue_usage("a").unschedulable_jobs == 1
    # Parked: later rounds do not look at it again...
    assert "cluster-a/big" not in run_round(state).skipped_jobs
    # ...until the cluster gains a node of a new size.
    state.set_node("cluster-a", "huge", a_node(cpu="96", memory="256Gi").build())
    assert released_ids(run_round(state)) == ["cluster-a/big"]
    assert state.queue_usage("a").unschedulable_jobs == 0


def test_a_too_big_job_is_parked_wherever_it_sits_in_its_queue() -> None:
    """Even behind jobs that fill the cluster, so that rounds set the cluster aside unread."""
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="2", memory="8Gi").times(1))
        .with_jobs(a_job("a").requesting(cpu="1", memory="1Gi").times(4),
                   a_job("a").requesting(cpu="64").created_at(3600).named("cluster-a/big"))
        .build()
    )
    assert state.queue_usage("a").unschedulable_jobs == 1
    result = run_round(state)
    assert released_per_queue(result) == {"a": 2}
    assert result.queues["a"].unschedulable == 1
    # Demand is the small jobs alone (4 cpu of a 2-cpu pool), not 34x the pool.
    assert fair_shares(state)["a"].demand_share == pytest.approx(2.0)
    # Only when a node that could hold it appears does it wait like any other job.
    state.set_node("cluster-a", "huge", a_node(cpu="96", memory="256Gi").build())
    assert state.queue_usage("a").unschedulable_jobs == 0


def test_a_node_size_that_only_comes_back_leaves_too_big_jobs_parked() -> None:
    big = a_job("a").requesting(cpu="64").named("cluster-a/big").build()
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="8", memory="32Gi").times(1))
        .with_jobs(big, a_job("a").requesting(cpu="8", memory="1Gi").times(2))
        .build()
    )
    assert released_per_queue(run_round(state)) == {"a": 1}
    assert state.queue_usage("a").unschedulable_jobs == 1

    # The only node flaps NotReady and back: its size "reappears" but fits the big job no more.
    state.set_node("cluster-a", "node-1",
                   replace(a_node(cpu="8", memory="32Gi").build(), schedulable=False))
    state.set_node("cluster-a", "node-1", a_node(cpu="8", memory="32Gi").build())
    assert state.queue_usage("a").unschedulable_jobs == 1  # still parked, before any round
    result = run_round(state)
    assert state.queue_usage("a").unschedulable_jobs == 1
    assert result.queues["a"].unschedulable == 1
    # A node of a size that does fit it brings it back.
    state.set_node("cluster-a", "huge", a_node(cpu="96", memory="256Gi").build())
    assert "cluster-a/big" in released_ids(run_round(state))


def test_a_resource_no_node_has_makes_a_job_unschedulable() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="8", memory="32Gi").times(1))
        .with_jobs(
            a_job("a").requesting_resources({"cpu": "1", "nvidia.com/gpu": 1}).named("gpu"),
            a_job("a").named("plain"),
        )
        .build()
    )

    result = run_round(state)

    assert released_ids(result) == ["plain"]
    # Parked as soon as it was known: reported as unschedulable, not looked at by the round.
    assert result.queues["a"].unschedulable == 1
    assert "gpu" not in result.skipped_jobs


def test_a_job_runs_only_in_its_own_cluster() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="8", memory="32Gi").times(1))
        .with_jobs(a_job("a").in_cluster("cluster-b").named("b-job"), a_job("a").named("a-job"))
        .build()
    )

    result = run_round(state)

    assert [(d.job_id, d.cluster) for d in result.decisions] == [("a-job", "cluster-a")]
    assert result.skipped_jobs == {"b-job": SkipReason.NO_SCHEDULABLE_NODES}

    state.set_cluster("cluster-b", a_node(cpu="8", memory="32Gi").times(1, prefix="b"))
    [decision] = run_round(state).decisions
    assert (decision.job_id, decision.cluster, decision.node_hint) == ("b-job", "cluster-b", "b-1")


def test_a_full_cluster_does_not_stop_another_cluster() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="2", memory="8Gi").times(1))
        .with_cluster("cluster-b", a_node(cpu="2", memory="8Gi").times(1))
        .with_jobs(a_job("a").in_cluster("cluster-a").running_on("node-1").times(2))
        .with_jobs(a_job("a").in_cluster("cluster-a").times(50))
        .with_jobs(a_job("a").in_cluster("cluster-b").times(2))
        .build()
    )

    result = run_round(state, lookback=5)

    assert {d.cluster for d in result.decisions} == {"cluster-b"}
    assert len(result.decisions) == 2
    # One look at the full cluster is enough: the queue does not burn its lookback on it.
    assert result.queues["a"].skipped == {SkipReason.NO_NODE_WITH_ROOM: 1}


def test_a_job_must_fit_on_one_node_not_in_the_cluster_total() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster(
            "cluster-a", a_node(cpu="4", memory="16Gi").with_unmanaged_usage(cpu="1").times(2)
        )
        .with_jobs(
            a_job("a").requesting(cpu="4").named("four"), a_job("a").requesting(cpu="3").times(2)
        )
        .build()
    )

    result = run_round(state)

    assert "four" not in released_ids(result)
    assert result.skipped_jobs["four"] is SkipReason.NO_NODE_WITH_ROOM
    assert sorted(d.node_hint for d in result.decisions) == ["node-1", "node-2"]


def test_unmanaged_usage_reduces_room() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster(
            "cluster-a", a_node(cpu="4", memory="16Gi").with_unmanaged_usage(cpu="3").times(1)
        )
        .with_jobs(a_job("a").times(4))
        .build()
    )

    assert len(run_round(state).decisions) == 1


def test_unschedulable_nodes_take_nothing() -> None:
    nodes = {
        "cordoned": a_node(cpu="8", memory="32Gi").unschedulable().build(),
        "open": a_node(cpu="1", memory="32Gi").build(),
    }
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", nodes)
        .with_jobs(a_job("a").times(3))
        .build()
    )

    result = run_round(state)

    assert [d.node_hint for d in result.decisions] == ["open"]
    assert state.pool_total()["cpu"] == 1000


def test_jobs_bound_to_a_node_use_that_node() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(2))
        .with_jobs(a_job("a").requesting(cpu="3").running_on("node-1"))
        .with_jobs(a_job("a").requesting(cpu="2").times(3))
        .build()
    )

    result = run_round(state)

    assert [d.node_hint for d in result.decisions] == ["node-2", "node-2"]


def test_released_jobs_without_a_node_are_never_over_committed() -> None:
    # Two released 3-cpu jobs not bound yet: each needs a node of its own, so a 2-cpu job fits
    # only in what remains (1 cpu on each node): nowhere.
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(2))
        .with_jobs(a_job("a").requesting(cpu="3").released().times(2))
        .with_jobs(a_job("a").requesting(cpu="2").named("two"), a_job("a").requesting(cpu="1"))
        .build()
    )

    result = run_round(state)

    assert result.skipped_jobs["two"] is SkipReason.NO_NODE_WITH_ROOM
    assert len(result.decisions) == 1


def test_released_jobs_that_fit_nowhere_stop_releases_in_their_cluster() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .with_jobs(a_job("a").requesting(cpu="3").released().times(2))
        .with_jobs(a_job("a").requesting(cpu="1").named("small"))
        .build()
    )

    result = run_round(state)

    assert result.decisions == ()
    assert result.overcommitted_clusters == {"cluster-a": 1}
    assert result.queues["a"].set_aside == ("cluster-a",)
    assert result.queues["a"].outcome is QueueOutcome.NOTHING_FITS


def test_the_round_applies_its_decisions_so_the_next_round_accounts_for_them() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .with_jobs(a_job("a").times(6))
        .build()
    )

    first = run_round(state)

    assert len(first.decisions) == 4
    for decision in first.decisions:
        job = state.job(decision.job_id)
        assert job is not None and job.state is JobState.RELEASED
    assert state.queue_usage("a").allocated_jobs == 4
    assert run_round(state).decisions == ()


def test_a_failed_release_puts_the_job_back_in_its_queue() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="1", memory="16Gi").times(1))
        .with_jobs(a_job("a").named("j"))
        .build()
    )
    assert released_ids(run_round(state)) == ["j"]
    job = state.job("j")
    assert job is not None

    state.upsert_job(replace(job, state=JobState.QUEUED))

    assert state.queue_usage("a").queued_jobs == 1
    assert state.queue_usage("a").allocated_jobs == 0
    assert released_ids(run_round(state)) == ["j"]


# ---- queues ---------------------------------------------------------------------------------


def test_a_cordoned_queue_releases_nothing() -> None:
    state = (
        a_state()
        .with_queues(a_queue("a").cordoned(), "b")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .with_jobs(a_job("a").times(4), a_job("b").times(8))
        .build()
    )

    result = run_round(state)

    assert released_per_queue(result) == {"b": 4}
    assert result.queues["a"].outcome is QueueOutcome.CORDONED
    assert result.queues["a"].queued == 4


def test_jobs_of_an_undefined_queue_wait_for_it() -> None:
    state = (
        a_state()
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .with_jobs(a_job("nobody").times(2))
        .build()
    )

    result = run_round(state)
    assert result.decisions == ()
    assert result.queues["nobody"].outcome is QueueOutcome.UNDEFINED

    state.upsert_queue(a_queue("nobody").build())
    result = run_round(state)
    assert len(result.decisions) == 2
    assert result.queues["nobody"].outcome is QueueOutcome.ALL_CONSIDERED


def test_undefined_queues_do_not_dilute_the_fair_shares_of_defined_ones() -> None:
    state = (
        a_state()
        .with_queues("a", "b")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .with_jobs(a_job("a").times(2), a_job("b").times(2), a_job("nobody").times(2))
        .build()
    )

    shares = fair_shares(state)

    assert shares["a"].fair_share == pytest.approx(0.5)
    assert shares["b"].fair_share == pytest.approx(0.5)
    assert shares["nobody"].fair_share == 0.0


def test_queue_limits_hold_across_clusters() -> None:
    state = (
        a_state()
        .with_queues(a_queue("a").limited_to(cpu="3"))
        .with_cluster("cluster-a", a_node(cpu="8", memory="32Gi").times(1))
        .with_cluster("cluster-b", a_node(cpu="8", memory="32Gi").times(1))
        .with_jobs(a_job("a").in_cluster("cluster-b").running_on("node-1"))
        .with_jobs(a_job("a").requesting(cpu="2").named("two"), a_job("a").times(5))
        .build()
    )

    result = run_round(state)

    assert released_per_queue(result) == {"a": 2}
    assert result.skipped_jobs["two"] is SkipReason.QUEUE_LIMIT
    assert state.queue_usage("a").allocation["cpu"] == 3000


@pytest.mark.parametrize(
    ("jobs", "want"),
    [
        pytest.param(
            [("old", 0, 1.0), ("new", 0, 2.0), ("newest", 0, 3.0)],
            ["old", "new", "newest"],
            id="older-first",
        ),
        pytest.param(
            [("old", 0, 1.0), ("urgent", 5, 9.0), ("new", 0, 2.0)],
            ["urgent", "old", "new"],
            id="priority-before-age",
        ),
        pytest.param(
            [("low", -1, 1.0), ("high", 2, 3.0), ("mid", 1, 2.0)],
            ["high", "mid", "low"],
            id="higher-priority-first",
        ),
    ],
)
def test_within_a_queue_priority_then_age_decide(
    jobs: list[tuple[str, int, float]], want: list[str]
) -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="8", memory="32Gi").times(1))
        .with_jobs(*(a_job("a").named(name).with_priority(p).created_at(t) for name, p, t in jobs))
        .build()
    )

    assert released_ids(run_round(state)) == want


@pytest.mark.parametrize(
    ("lookback", "small_released", "outcome"),
    [
        (0, False, QueueOutcome.LOOKBACK_EXCEEDED),
        (2, False, QueueOutcome.LOOKBACK_EXCEEDED),
        (3, True, QueueOutcome.ALL_CONSIDERED),
    ],
)
def test_a_queue_looks_past_at_most_lookback_jobs_that_do_not_fit(
    lookback: int, small_released: bool, outcome: QueueOutcome
) -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .with_jobs(a_job("a").requesting(cpu="3").running_on("node-1"))
        .with_jobs(a_job("a").requesting(cpu="4").times(3))
        .with_jobs(a_job("a").requesting(cpu="1").named("small"))
        .build()
    )

    result = run_round(state, lookback=lookback)

    assert ("small" in released_ids(result)) is small_released
    assert result.queues["a"].outcome is outcome
    assert result.queues["a"].skipped[SkipReason.NO_NODE_WITH_ROOM] == min(lookback + 1, 3)


@pytest.mark.parametrize(
    ("lookback", "outcome"),
    [(0, QueueOutcome.LOOKBACK_EXCEEDED), (100, QueueOutcome.NOTHING_FITS)],
)
def test_a_queue_whose_jobs_do_not_fit_drops_out_without_stopping_the_others(
    lookback: int, outcome: QueueOutcome
) -> None:
    # b weighs a tenth of a, so a goes first; a's jobs fit node-2's size but not its free room.
    nodes = {
        "node-1": a_node(cpu="4", memory="16Gi").build(),
        "node-2": a_node(cpu="8", memory="16Gi").with_unmanaged_usage(cpu="6").build(),
    }
    state = (
        a_state()
        .with_queues("a", a_queue("b").with_weight(0.1))
        .with_cluster("cluster-a", nodes)
        .with_jobs(a_job("a").requesting(cpu="5").times(30))
        .with_jobs(a_job("b").requesting(cpu="1").times(6))
        .build()
    )

    result = run_round(state, lookback=lookback)

    assert released_per_queue(result) == {"b": 6}
    assert result.queues["a"].outcome is outcome
    assert result.queues["a"].skipped == {SkipReason.NO_NODE_WITH_ROOM: 1}


def test_jobs_that_find_no_room_in_one_cluster_do_not_keep_a_queue_out_of_its_others() -> None:
    # The fleet simulator's finding: a queue below its target in every cluster it uses looked
    # past its lookback in the one that was full, left the round, and a queue over its target
    # took the room freed where the first was owed it. Lookback is counted per cluster.
    state = (
        a_state()
        .with_queues("a", "c", a_queue("b").with_weight(0.1))
        # cluster-a is full of c's pods (over c's target there, and nothing preempts them).
        .with_cluster("cluster-a", a_node(cpu="8", memory="64Gi").times(1))
        .with_jobs(a_job("c").requesting(cpu="1", memory="1Gi").running_on("node-1").times(8))
        # a waits there with pods of three shapes (so none is set aside for another's sake),
        # each of which ranks before its pods in cluster-b (a smaller step towards its target).
        .with_jobs(*(a_job("a").requesting(cpu="1", memory=f"{gi}Gi") for gi in (1, 2, 3)))
        .with_cluster("cluster-b", a_node(cpu="4", memory="64Gi").times(1, prefix="b"))
        .with_jobs(a_job("a").in_cluster("cluster-b").requesting(cpu="2", memory="1Gi").times(2))
        .with_jobs(a_job("b").in_cluster("cluster-b").requesting(cpu="1", memory="1Gi").times(8))
        .build()
    )
    targets = state.fair_targets()
    assert targets.queues["a"].in_cluster("cluster-a") > 0  # owed room where none is free

    result = run_round(state, lookback=2)

    assert released_per_queue(result) == {"a": 2}
    assert result.queues["a"].skipped == {SkipReason.NO_NODE_WITH_ROOM: 3}
    assert result.queues["a"].outcome is QueueOutcome.LOOKBACK_EXCEEDED


def test_max_decisions_caps_a_round() -> None:
    state = (
        a_state()
        .with_queues("a", "b")
        .with_cluster("cluster-a", a_node(cpu="16", memory="64Gi").times(1))
        .with_jobs(a_job("a").times(8), a_job("b").times(8))
        .build()
    )

    result = run_round(state, max_decisions=3)

    assert len(result.decisions) == 3
    assert {r.outcome for r in result.queues.values()} == {QueueOutcome.ROUND_LIMIT}
    assert len(run_round(state).decisions) == 13


# ---- the state's books --------------------------------------------------------------------


def test_upserting_the_same_job_twice_counts_it_once() -> None:
    job = a_job("a").requesting(cpu="2", memory="1Gi").build()
    state = a_state().with_queues("a").build()

    state.upsert_job(job)
    state.upsert_job(job)
    state.upsert_job(
        replace(job, requests=Resources.from_kubernetes({"cpu": "2", "memory": "1Gi"}))
    )

    usage = state.queue_usage("a")
    assert (usage.queued_jobs, usage.pending_requests) == (1, {"cpu": 2000, "memory": GI})
    assert len(state) == 1


def test_state_changes_move_a_job_between_queued_and_allocated() -> None:
    job = a_job("a").requesting(cpu="2").named("j").build()
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .build()
    )

    def books() -> tuple[int, int, int]:
        usage = state.queue_usage("a")
        return usage.queued_jobs, usage.allocated_jobs, usage.allocation["cpu"]

    state.upsert_job(job)
    assert books() == (1, 0, 0)
    state.upsert_job(replace(job, state=JobState.RELEASED))
    assert books() == (0, 1, 2000)
    state.upsert_job(replace(job, state=JobState.RUNNING, node_name="node-1"))
    assert books() == (0, 1, 2000)
    assert run_round(state).decisions == ()
    state.upsert_job(replace(job, state=JobState.SUCCEEDED))
    assert books() == (0, 0, 0)
    assert "j" not in state


def test_removing_jobs_updates_the_books_and_the_heap() -> None:
    jobs = a_job("a").times(100)
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .with_jobs(jobs)
        .build()
    )

    for job in jobs[:98]:
        state.remove_job(job.job_id)

    assert state.queue_usage("a").queued_jobs == 2
    # Removed jobs' heap entries are deleted lazily, and compacted once they outnumber the rest.
    assert len(state.queue_records["a"].pending["cluster-a"].entries) <= 2 * 2 + 64
    assert sorted(released_ids(run_round(state))) == sorted(j.job_id for j in jobs[98:])


def test_changing_a_queued_jobs_priority_reorders_it() -> None:
    first, second = a_job("a").times(2)
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="1", memory="16Gi").times(1))
        .with_jobs(first, second)
        .build()
    )

    state.upsert_job(replace(second, priority=1))

    assert released_ids(run_round(state)) == [second.job_id]


def test_a_job_that_leaves_and_returns_to_its_queue_is_released_once() -> None:
    job = a_job("a").named("j").build()
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .with_jobs(job)
        .build()
    )
    for _ in range(3):
        state.upsert_job(replace(job, state=JobState.RELEASED))
        state.upsert_job(job)

    assert released_ids(run_round(state)) == ["j"]
    assert run_round(state).decisions == ()


def test_moving_a_job_to_another_queue_moves_its_books() -> None:
    job = a_job("a").requesting(cpu="2").build()
    state = a_state().with_queues("a", "b").with_jobs(job).build()

    state.upsert_job(replace(job, queue="b"))

    assert state.queue_usage("a").queued_jobs == 0
    assert state.queue_usage("b").pending_requests == {"cpu": 2000}


def test_removing_a_node_removes_its_room() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="2", memory="16Gi").times(2))
        .with_jobs(a_job("a").times(4))
        .build()
    )

    state.set_cluster("cluster-a", a_node(cpu="2", memory="16Gi").times(1))

    assert state.pool_total()["cpu"] == 2000
    assert len(run_round(state).decisions) == 2


def test_a_new_resource_name_extends_every_vector() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="4", memory="16Gi").times(1))
        .with_jobs(a_job("a").running_on("node-1"))
        .build()
    )

    state.set_node(
        "cluster-a", "gpu-1", a_node(cpu="4", memory="16Gi", **{"nvidia.com/gpu": 2}).build()
    )
    state.upsert_job(
        a_job("a").requesting_resources({"cpu": "1", "nvidia.com/gpu": 2}).named("g").build()
    )

    result = run_round(state)
    assert [(d.job_id, d.node_hint) for d in result.decisions] == [("g", "gpu-1")]
    assert state.queue_usage("a").allocation == {"cpu": 2000, "nvidia.com/gpu": 2}


def test_a_node_whose_unmanaged_usage_names_a_new_resource() -> None:
    node = a_node(cpu="4", memory="16Gi").with_unmanaged_usage(cpu="1", **{"example.com/foo": 1})
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", node.times(1))
        .with_jobs(a_job("a").requesting(cpu="3"), a_job("a").requesting(cpu="1"))
        .build()
    )

    assert len(run_round(state).decisions) == 1


# ---- against a naive reference ---------------------------------------------------------------
#
# The round's heaps, caches and set-asides must not change what it decides. The reference below
# recomputes every step from scratch, in the plainest way, with the same tie-breaks.


@dataclass
class _Model:
    specs: dict[str, QueueSpec]
    nodes: dict[str, dict[str, NodeInfo]]  # cluster -> node -> info, all schedulable
    jobs: dict[str, SchedJob] = field(default_factory=dict)
    hints: dict[str, str] = field(default_factory=dict)  # released job -> node it was placed on

    def free_room(self) -> dict[tuple[str, str], dict[str, int]]:
        room = {
            (cluster, name): dict(info.allocatable - info.unmanaged_usage)
            for cluster, nodes in self.nodes.items()
            for name, info in nodes.items()
        }
        for job in self.jobs.values():
            node = job.node_name or self.hints.get(job.job_id)
            if job.state.holds_capacity:
                assert node is not None, "every released job here has a hint"
                for resource, amount in job.requests.items():
                    here = room[(job.cluster, node)]
                    here[resource] = here.get(resource, 0) - amount
        return room


def _reference_round(model: _Model, max_decisions: int, lookback: int,
                     targets: FairTargets) -> list[tuple[str, str]]:
    """The round as its docs say it, naively: each queue is ranked in each cluster by its next
    pod there. While it holds less than its fair target there and its whole allocation is short
    of its whole target: if the pod keeps it within its target there, (0, its cost after it
    over the highest cost of any target) when every queue waiting in the cluster as the round
    begins is given all it asks for, else (0, fraction of its whole target after the pod); if
    the pod carries it past, (1, minus the pod's dominant share, that fraction). Otherwise
    (2, its cost after it). The lowest rank goes, then the queue's name."""
    pool: dict[str, int] = {}
    for nodes in model.nodes.values():
        for info in nodes.values():
            for resource, amount in info.allocatable.items():
                pool[resource] = pool.get(resource, 0) + amount
    inverse = {r: 1.0 / t for r, t in pool.items() if t > 0}
    room = model.free_room()
    allocation: dict[str, dict[str, int]] = {q: {} for q in model.specs}
    allocation_in: dict[tuple[str, str], dict[str, int]] = {}
    for job in model.jobs.values():
        if job.state.holds_capacity and job.queue in allocation:
            here = allocation_in.setdefault((job.queue, job.cluster), {})
            for resource, amount in job.requests.items():
                allocation[job.queue][resource] = allocation[job.queue].get(resource, 0) + amount
                here[resource] = here.get(resource, 0) + amount

    def rank(name: str, job: SchedJob) -> tuple[int, float, float]:
        spec = model.specs[name]
        share_with = max(
            (allocation[name].get(r, 0) + job.requests[r]) * inv for r, inv in inverse.items())
        share_without = max(allocation[name].get(r, 0) * inv for r, inv in inverse.items())
        here = allocation_in.get((name, job.cluster), {})
        after = max((here.get(r, 0) + job.requests[r]) * inv for r, inv in inverse.items())
        target = targets.queues[name].in_cluster(job.cluster) if name in targets.queues else 0.0
        whole = targets.queues[name].share if name in targets.queues else 0.0
        before = max(here.get(r, 0) * inv for r, inv in inverse.items())
        if (target > 0 and before < target * (1 - 1e-9) - 1e-12
                and whole > 0 and share_without / whole < 1 - 1e-9):
            if after <= target * (1 + 1e-9) + 1e-12:
                if uncontested(job.cluster) and targets.top_cost > 0:
                    return (0, share_with * spec.priority_factor / targets.top_cost, 0.0)
                return (0, share_with / whole, 0.0)
            size = max(job.requests[r] * inv for r, inv in inverse.items())
            return (1, -size, share_with / whole)
        return (2, share_with * spec.priority_factor, 0.0)

    def too_big(job: SchedJob) -> bool:
        return not any(
            job.requests.fits_within(info.allocatable) for info in model.nodes[job.cluster].values()
        )

    waiting_in: dict[str, set[str]] = {}  # as the round begins
    for j in model.jobs.values():
        if (j.state is JobState.QUEUED and j.queue in model.specs and not too_big(j)
                and not model.specs[j.queue].cordoned):
            waiting_in.setdefault(j.cluster, set()).add(j.queue)
    by_cost = {cluster: all(q in targets.queues and targets.queues[q].capped for q in queues)
               for cluster, queues in waiting_in.items()}

    def uncontested(cluster: str) -> bool:
        return by_cost.get(cluster, True)

    looked: set[str] = set()
    skips: dict[tuple[str, str], int] = {}
    set_aside: set[tuple[str, str]] = set()  # (queue, cluster)
    no_room: dict[str, set[Resources]] = {c: set() for c in model.nodes}  # any queue's
    over_limit: dict[str, set[Resources]] = {q: set() for q in model.specs}  # any cluster
    decisions: list[tuple[str, str]] = []
    while len(decisions) < max_decisions:
        best: tuple[tuple[int, float, float], str, SchedJob] | None = None
        for name, spec in sorted(model.specs.items()):
            if spec.cordoned:
                continue
            candidates = [
                j
                for j in model.jobs.values()
                if j.queue == name
                and j.state is JobState.QUEUED
                and not too_big(j)
                and j.job_id not in looked
                and (name, j.cluster) not in set_aside
            ]
            if not candidates:
                continue
            heads: dict[str, SchedJob] = {}
            for j in sorted(candidates, key=lambda j: (-j.priority, j.created_at, j.job_id)):
                heads.setdefault(j.cluster, j)
            job = min(heads.values(), key=lambda j: (rank(name, j),
                                                     (-j.priority, j.created_at, j.job_id)))
            cost = rank(name, job)
            if best is None or (cost, name) < (best[0], best[1]):
                best = (cost, name, job)
        if best is None:
            break
        _, name, job = best
        turned_down = no_room[job.cluster] | over_limit[name]
        if job.requests in turned_down:
            waiting = [
                j.requests
                for j in model.jobs.values()
                if j.queue == name
                and j.cluster == job.cluster
                and j.state is JobState.QUEUED
                and not too_big(j)
            ]
            if all(requests in turned_down for requests in waiting):
                set_aside.add((name, job.cluster))
                continue
        limits = model.specs[name].limits
        node = None
        if not all(
            allocation[name].get(r, 0) + job.requests[r] <= limit for r, limit in limits.items()
        ):
            over_limit[name].add(job.requests)
        else:
            # Best fit among the first BEST_FIT_WINDOW nodes that fit, in name order, a perfect
            # fit ending the search: the least room left, each resource over the pool.
            window: list[tuple[float, int, str]] = []
            for position, n in enumerate(sorted(model.nodes[job.cluster])):
                if job.requests.fits_within(room[(job.cluster, n)]):
                    left = sum((room[(job.cluster, n)].get(r, 0) - amount) * inverse.get(r, 0.0)
                               for r, amount in job.requests.items())
                    window.append((left, position, n))
                    if left == 0 or len(window) == BEST_FIT_WINDOW:
                        break
            node = min(window)[2] if window else None
            if node is None:
                no_room[job.cluster].add(job.requests)
        if node is None:
            looked.add(job.job_id)
            # Lookback is counted per cluster: past it, only that cluster leaves the round.
            skips[(name, job.cluster)] = skips.get((name, job.cluster), 0) + 1
            if skips[(name, job.cluster)] > lookback:
                set_aside.add((name, job.cluster))
            continue
        for resource, amount in job.requests.items():
            here = room[(job.cluster, node)]
            here[resource] = here.get(resource, 0) - amount
            allocation[name][resource] = allocation[name].get(resource, 0) + amount
            held_here = allocation_in.setdefault((name, job.cluster), {})
            held_here[resource] = held_here.get(resource, 0) + amount
        model.jobs[job.job_id] = replace(job, state=JobState.RELEASED)
        model.hints[job.job_id] = node
        decisions.append((job.job_id, node))
    return decisions


_SHAPES = [
    {"cpu": "500m", "memory": "1Gi"},
    {"cpu": "1", "memory": "1Gi"},
    {"cpu": "1", "memory": "6Gi"},
    {"cpu": "2", "memory": "2Gi"},
    {"cpu": "3", "memory": "1Gi"},
    {"cpu": "12", "memory": "1Gi"},  # too big for every node
    {"cpu": "1", "nvidia.com/gpu": 1},  # only cluster-b has gpus
]


@pytest.mark.parametrize("seed", range(40))
def test_rounds_decide_exactly_what_a_naive_reference_decides(seed: int) -> None:
    rng = random.Random(seed)
    queues = {
        name: a_queue(name).with_priority_factor(rng.choice([0.5, 1.0, 1.0, 2.0]))
        for name in ("a", "b", "c", "d")
    }
    if rng.random() < 0.3:
        queues["d"] = queues["d"].cordoned()
    if rng.random() < 0.5:
        queues["c"] = queues["c"].limited_to(cpu=str(rng.randint(2, 6)))
    specs = {name: queue.build() for name, queue in queues.items()}
    nodes = {
        "cluster-a": {
            f"a-{i}": a_node(cpu=str(rng.choice([2, 4, 8])), memory="8Gi")
            .with_unmanaged_usage(cpu=rng.choice(["0", "500m", "1"]))
            .build()
            for i in range(rng.randint(1, 3))
        },
        "cluster-b": {
            f"b-{i}": a_node(
                cpu="4", memory="16Gi", **{"nvidia.com/gpu": rng.randint(0, 2)}
            ).build()
            for i in range(rng.randint(1, 3))
        },
    }
    model = _Model(specs=specs, nodes=nodes)
    state = SchedulerState()
    for spec in specs.values():
        state.upsert_queue(spec)
    for cluster, cluster_nodes in nodes.items():
        state.set_cluster(cluster, cluster_nodes)

    def upsert(job: SchedJob) -> None:
        if job.state.is_terminal:
            model.jobs.pop(job.job_id, None)
            model.hints.pop(job.job_id, None)
        else:
            model.jobs[job.job_id] = job
            if not job.state.holds_capacity or job.node_name is not None:
                model.hints.pop(job.job_id, None)
        state.upsert_job(job)

    clock = 0.0
    for _ in range(6):
        for _ in range(rng.randint(0, 25)):
            clock += rng.choice([0.0, 1.0])  # equal creation times happen
            upsert(
                a_job(rng.choice("abcd"))
                .in_cluster(rng.choice(["cluster-a", "cluster-b"]))
                .requesting_resources(rng.choice(_SHAPES))
                .with_priority(rng.choice([0, 0, 0, 1, 5]))
                .created_at(clock)
                .build()
            )
        if rng.random() < 0.2:  # operators change queues between rounds
            name = rng.choice("abcd")
            queue = queues[name].with_priority_factor(rng.choice([0.5, 1.0, 2.0]))
            queue = queue.cordoned() if rng.random() < 0.3 else replace(queue, is_cordoned=False)
            queues[name] = queue
            model.specs[name] = queue.build()
            state.upsert_queue(model.specs[name])
        if rng.random() < 0.15 and "a-big" not in nodes["cluster-a"]:  # a node of a new size
            big = a_node(cpu="16", memory="8Gi").build()
            nodes["cluster-a"]["a-big"] = big
            state.set_node("cluster-a", "a-big", big)
        max_decisions = rng.choice([3, 10, 1000])
        lookback = rng.choice([0, 1, 3, 1000])

        want = _reference_round(model, max_decisions, lookback, state.fair_targets())
        result = run_round(state, max_decisions=max_decisions, lookback=lookback)

        assert [(d.job_id, d.node_hint) for d in result.decisions] == want
        _assert_books_match(state, model)
        for (cluster, node), room in model.free_room().items():
            assert all(amount >= 0 for amount in room.values()), (cluster, node, room)

        for job in list(model.jobs.values()):
            roll = rng.random()
            if job.state is JobState.RELEASED and roll < 0.4:
                upsert(replace(job, state=JobState.RUNNING, node_name=model.hints[job.job_id]))
            elif job.state is JobState.RELEASED and roll < 0.5:
                upsert(replace(job, state=JobState.QUEUED))  # the release failed
            elif job.state is JobState.RUNNING and roll < 0.3:
                upsert(replace(job, state=rng.choice([JobState.SUCCEEDED, JobState.FAILED])))
            elif job.state is JobState.QUEUED and roll < 0.05:
                upsert(replace(job, state=JobState.DELETED))
            elif job.state is JobState.QUEUED and roll < 0.1:
                upsert(replace(job, priority=job.priority + 1))
            elif roll < 0.15:
                upsert(job)  # a duplicate event


def _assert_books_match(state: SchedulerState, model: _Model) -> None:
    assert len(state) == len(model.jobs)
    for name in model.specs:
        mine = [j for j in model.jobs.values() if j.queue == name]
        held = [j for j in mine if j.state.holds_capacity]
        usage = state.queue_usage(name)
        assert usage.queued_jobs == sum(1 for j in mine if j.state is JobState.QUEUED)
        assert usage.allocated_jobs == len(held)
        assert usage.allocation == Resources.sum(j.requests for j in held)
