"""Fair targets solved elsewhere (docs/scheduling.md, "Fair targets off the round's path"): the
problem a state hands over solves to the targets it would compute itself, adopted targets are
used while recent enough whatever changed since, and a round ranks by them."""

from __future__ import annotations

import pickle
from dataclasses import replace

from builders import a_job, a_node, a_queue, a_state

from lockgate.scheduler import (
    SchedulerState,
    TargetProblem,
    check_invariants,
    schedule_round,
    solve_problem,
)

T0 = 1_700_000_000.0


def two_queues_in_one_cluster() -> SchedulerState:
    """One cluster of 4 cpu (a second, idle, in the pool), queues a and b of weight 1, each
    with 4 pods of 1 cpu queued in the first."""
    return (
        a_state()
        .with_queues(a_queue("a"), a_queue("b"))
        .with_cluster("one", a_node(cpu="4", memory="64Gi").times(1, prefix="one"))
        .with_cluster("two", a_node(cpu="4", memory="64Gi").times(1, prefix="two"))
        .with_jobs(a_job("a").in_cluster("one").times(4), a_job("b").in_cluster("one").times(4))
        .build()
    )


def released(state: SchedulerState, **options: float | None) -> dict[str, int]:
    result = schedule_round(state, max_decisions=100, max_lookback_per_queue=100, now=T0 + 5,
                            **options)  # type: ignore[arg-type]
    check_invariants(state)
    counts: dict[str, int] = {}
    for decision in result.decisions:
        counts[decision.queue] = counts.get(decision.queue, 0) + 1
    return counts


def test_the_problem_handed_over_solves_to_the_targets_computed_in_place() -> None:
    state = (
        a_state()
        .with_queues(a_queue("q1"), a_queue("q2").with_priority_factor(0.5), a_queue("q3"))
        .with_cluster("A", a_node(cpu="10", memory="64Gi").times(2, prefix="a"))
        .with_cluster("B", a_node(cpu="10", memory="64Gi").times(1, prefix="b"))
        .with_jobs(a_job("q1").in_cluster("A").times(12), a_job("q1").in_cluster("B").times(6),
                   a_job("q2").in_cluster("A").times(15), a_job("q3").in_cluster("B").times(9))
        .build()
    )
    problem, key = state.target_problem()
    # What crosses to the worker process and back.
    shipped: TargetProblem = pickle.loads(pickle.dumps(problem))
    answer = pickle.loads(pickle.dumps(solve_problem(shipped)))
    assert answer == state.fair_targets()
    assert {name for name, target in answer.queues.items() if target.share > 0} == {
        "q1", "q2", "q3"}
    assert state.targets_current(key)


def test_adopted_targets_are_kept_whatever_changed_until_too_old() -> None:
    state = two_queues_in_one_cluster()
    problem, key = state.target_problem()
    adopted = problem.solve()
    state.adopt_targets(key, adopted, at=T0)
    assert state.targets_current(key)
    # A new queue asks in a new cluster: the inputs' structure changed.
    state.upsert_queue(a_queue("c").build())
    state.upsert_job(a_job("c").in_cluster("two").times(1)[0])
    assert not state.targets_current(state.target_problem()[1])
    assert state.fair_targets(now=T0 + 10, adopted_max_age=10) is adopted
    assert state.fair_targets(latest=True) is adopted  # what the round ranked by, for its report
    # Too old: solved here, from the inputs as they are, and no longer the adopted ones.
    fresh = state.fair_targets(now=T0 + 11, adopted_max_age=10)
    assert fresh is not adopted and "c" in fresh.queues and "c" not in adopted.queues
    assert state.fair_targets(latest=True) is fresh


def test_without_an_age_for_adopted_targets_a_changed_state_is_solved_in_place() -> None:
    state = two_queues_in_one_cluster()
    problem, key = state.target_problem()
    adopted = problem.solve()
    state.adopt_targets(key, adopted, at=T0)
    assert state.fair_targets(now=T0 + 1) is adopted  # solved from these very inputs
    state.upsert_job(a_job("b").in_cluster("two").times(1)[0])
    assert state.fair_targets(now=T0 + 1) is not adopted


def test_a_round_ranks_by_the_adopted_targets_while_they_are_recent() -> None:
    # In place, a and b (weight 1 each) split the 4 cpu 2 : 2. Targets solved for b at
    # weight 3 (as if its weight had just changed, the worker's answer not yet replaced):
    # while they are recent, the round follows them, 1 : 3.
    state = two_queues_in_one_cluster()
    problem, key = state.target_problem()
    weighted = replace(problem, weights={**problem.weights, "b": 3.0})
    state.adopt_targets(key, weighted.solve(), at=T0)
    assert released(state, adopted_targets_max_age=30) == {"a": 1, "b": 3}

    in_place = two_queues_in_one_cluster()
    assert released(in_place) == {"a": 2, "b": 2}
    stale = two_queues_in_one_cluster()
    problem, key = stale.target_problem()
    stale.adopt_targets(key, replace(problem, weights={**problem.weights, "b": 3.0}).solve(),
                        at=T0 - 60)
    stale.upsert_job(a_job("b").in_cluster("one").times(1)[0])  # the inputs changed since
    assert released(stale, adopted_targets_max_age=30) == {"a": 2, "b": 2}  # too old


def test_a_small_problem_is_not_handed_over_and_leaves_the_round_its_own_targets() -> None:
    state = two_queues_in_one_cluster()
    computed = state.fair_targets(now=T0)
    assert state.hand_over_targets(at=T0 + 1, min_demands=3) is None  # 2 demands: too few
    state.upsert_job(a_job("b").in_cluster("two").times(1)[0])  # b now asks in "two" too
    assert state.fair_targets(now=T0 + 2, adopted_max_age=30) is not computed


def test_targets_current_when_handed_over_count_as_adopted_then() -> None:
    state = two_queues_in_one_cluster()
    handed = state.hand_over_targets(at=T0)
    assert handed is not None
    problem, key = handed
    state.adopt_targets(key, problem.solve(), at=T0)
    adopted = state.fair_targets(latest=True)
    # Nothing changed by T0 + 25: nothing to solve, and they count as solved then...
    assert state.hand_over_targets(at=T0 + 25) is None
    state.upsert_job(a_job("b").in_cluster("one").times(1)[0])
    # ...so a round at T0 + 50 still takes them (25 s old, not 50), and one at T0 + 60 not.
    assert state.fair_targets(now=T0 + 50, adopted_max_age=30) is adopted
    assert state.fair_targets(now=T0 + 60, adopted_max_age=30) is not adopted
