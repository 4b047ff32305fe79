"""Release pacing: a round adds at most a cluster's release budget to its ungaters' backlog, so a
newcomer's pods wait behind that many releases, not behind the whole backlog."""

from __future__ import annotations

from dataclasses import replace

from builders import a_job, a_node, a_queue, a_state, released_per_queue

from lockgate.jobs import JobState
from lockgate.scheduler import (
    PreemptionPolicy,
    QueueOutcome,
    RoundResult,
    SchedulerState,
    plan_evictions,
)
from lockgate.scheduler import schedule_round as _schedule_round

WINDOW = 4


def paced_round(state: SchedulerState, window: int = WINDOW) -> RoundResult:
    """A round as the leader runs it: each cluster's budget is the window less its backlog."""
    budget = {name: max(0, window - cluster.releasing)
              for name, cluster in state.cluster_records.items()}
    return _schedule_round(state, max_decisions=10_000, max_lookback_per_queue=1_000,
                           release_budget=budget)


def ten_jobs_with_room() -> SchedulerState:
    return (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="64", memory="256Gi").times(1))
        .with_jobs(a_job("a").times(10))
        .build()
    )


def answer(state: SchedulerState, result: RoundResult, count: int) -> None:
    """The ungaters carry out `count` of the round's releases (the gate is gone)."""
    for decision in result.decisions[:count]:
        job = state.job(decision.job_id)
        assert job is not None and job.state is JobState.RELEASED
        state.upsert_job(replace(job, state=JobState.UNGATED))


def test_a_round_releases_at_most_the_budget_per_cluster() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="64", memory="256Gi").times(1))
        .with_cluster("cluster-b", a_node(cpu="64", memory="256Gi").times(1))
        .with_jobs(a_job("a").times(10), a_job("a").in_cluster("cluster-b").times(10))
        .build()
    )

    result = paced_round(state)

    per_cluster = {c: sum(1 for d in result.decisions if d.cluster == c)
                   for c in ("cluster-a", "cluster-b")}
    assert per_cluster == {"cluster-a": WINDOW, "cluster-b": WINDOW}
    assert result.queues["a"].outcome is QueueOutcome.PACED
    assert result.queues["a"].paced == ("cluster-a", "cluster-b")
    assert result.queues["a"].set_aside == ()
    assert {c: r.releasing for c, r in state.cluster_records.items()} == per_cluster
    # Nothing answered: the next round adds nothing.
    assert paced_round(state).decisions == ()


def test_answers_open_the_window_and_a_newcomer_goes_first() -> None:
    state = (
        a_state()
        .with_queues("backlog", "newcomer")
        .with_cluster("cluster-a", a_node(cpu="64", memory="256Gi").times(1))
        .with_jobs(a_job("backlog").times(40))
        .build()
    )
    first = paced_round(state)
    assert released_per_queue(first) == {"backlog": WINDOW}
    state.upsert_job(a_job("newcomer").named("cluster-a/new-1").build())
    state.upsert_job(a_job("newcomer").named("cluster-a/new-2").build())
    assert paced_round(state).decisions == ()

    answer(state, first, 2)
    second = paced_round(state)

    # Its share is nothing, the backlog queue's is four pods: the newcomer takes both places.
    assert released_per_queue(second) == {"newcomer": 2}
    assert state.cluster_records["cluster-a"].releasing == WINDOW


def test_bound_and_ended_jobs_leave_the_backlog() -> None:
    state = ten_jobs_with_room()
    result = paced_round(state)
    ids = [d.job_id for d in result.decisions]
    first = state.job(ids[0])
    second = state.job(ids[1])
    assert first is not None and second is not None
    state.upsert_job(replace(first, state=JobState.BOUND, node_name=result.decisions[0].node_hint))
    state.upsert_job(replace(second, state=JobState.SUCCEEDED))
    state.remove_job(ids[2])

    assert state.cluster_records["cluster-a"].releasing == WINDOW - 3
    assert len(paced_round(state).decisions) == 3


def test_no_budget_means_no_cap() -> None:
    state = ten_jobs_with_room()

    result = _schedule_round(state, max_decisions=10_000, max_lookback_per_queue=1_000,
                             release_budget={"cluster-other": 0})

    assert len(result.decisions) == 10
    assert result.queues["a"].outcome is QueueOutcome.ALL_CONSIDERED


def test_a_group_goes_whole_once_the_budget_lets_its_first_member_go() -> None:
    state = (
        a_state()
        .with_queues("a")
        .with_cluster("cluster-a", a_node(cpu="64", memory="256Gi").times(1))
        .with_jobs(a_job("a").in_group("g", size=6).times(6), a_job("a").times(3))
        .build()
    )

    result = paced_round(state, window=1)

    assert len(result.decisions) == 6
    assert state.cluster_records["cluster-a"].releasing == 6
    assert paced_round(state, window=1).decisions == ()


def test_pacing_is_not_a_lack_of_room_to_preemption() -> None:
    # "low" fills the cluster and "high" waits: with room short, preemption would evict for
    # "high"; with room to spare but the window full, it must not.
    state = (
        a_state()
        .with_queues("low", a_queue("high").with_weight(4))
        .with_cluster("cluster-a", a_node(cpu="64", memory="256Gi").times(1))
        .with_jobs(a_job("low").preemptible().times(WINDOW))
        .build()
    )
    first = paced_round(state)
    answer(state, first, WINDOW)
    state.upsert_jobs(a_job("high").times(5))
    state.upsert_jobs(a_job("low").preemptible().times(5))
    paced_round(state)  # four go, one of each queue waits for the window

    waiting = paced_round(state)

    assert waiting.decisions == ()
    assert all(report.set_aside == () for report in waiting.queues.values())
    assert waiting.queues["high"].paced == ("cluster-a",)
    assert waiting.queues["high"].outcome is QueueOutcome.PACED
    assert plan_evictions(state, waiting, policy=PreemptionPolicy(),
                          evicting=set()) == []
