"""Pod groups: how pods name them, all-or-nothing release, one unit of fair share, reservations,
timeouts, and priority order within a queue."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import a_job, a_node, a_queue, a_state, released_ids, released_per_queue

from lockgate.groups import (
    GROUP_LABEL,
    GROUP_MAX_SIZE_KEY,
    GROUP_MIN_SIZE_KEY,
    GROUP_SIZE_KEY,
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL_ANNOTATION,
    MAX_GROUP_SIZE,
    GroupTimeoutAction,
    InvalidPodGroupError,
    PodGroup,
    pod_group,
)
from lockgate.jobs import JobState
from lockgate.scheduler import (
    RoundResult,
    SchedJob,
    SchedulerState,
    SkipReason,
    describe_group,
    schedule_round,
    timed_out,
    timeout_message,
)

T0 = 1_700_000_000.0


def run_round(state: SchedulerState, *, now: float | None = None,
              reserve_after: float | None = None, lookback: int = 1000) -> RoundResult:
    return schedule_round(state, max_decisions=10_000, max_lookback_per_queue=lookback,
                          now=now, group_reserve_after_seconds=reserve_after)


# ---- naming a group -----------------------------------------------------------------------


def test_a_pod_names_its_group_with_lockgate_or_kueue_keys() -> None:
    assert pod_group({GROUP_LABEL: "workers"}, {GROUP_SIZE_KEY: "8"}) == PodGroup("workers", 8)
    assert pod_group({KUEUE_GROUP_LABEL: "w"}, {KUEUE_TOTAL_ANNOTATION: "3"}) == PodGroup("w", 3)
    assert pod_group({GROUP_LABEL: "w", GROUP_SIZE_KEY: "2"}, {}) == PodGroup("w", 2)
    assert pod_group({"app": "x"}, {}) is None


@pytest.mark.parametrize(
    ("labels", "annotations", "expected"),
    [
        ({GROUP_LABEL: "w"}, {}, "has no size"),
        ({}, {GROUP_SIZE_KEY: "4"}, "without a group name"),
        ({GROUP_LABEL: "w"}, {GROUP_SIZE_KEY: "eight"}, "not a whole number from 1 to"),
        ({GROUP_LABEL: "w"}, {GROUP_SIZE_KEY: "0"}, "not a whole number"),
        ({GROUP_LABEL: "w"}, {GROUP_SIZE_KEY: "+3"}, "not a whole number"),
        ({GROUP_LABEL: "w"}, {GROUP_SIZE_KEY: "100001"}, "not a whole number"),
        ({GROUP_LABEL: "w", KUEUE_GROUP_LABEL: "v"}, {GROUP_SIZE_KEY: "2"}, "conflicting"),
        ({GROUP_LABEL: "w"}, {GROUP_SIZE_KEY: "2", KUEUE_TOTAL_ANNOTATION: "3"}, "conflicting"),
        ({GROUP_LABEL: "-bad-"}, {GROUP_SIZE_KEY: "2"}, "not a valid label value"),
    ],
)
def test_a_bad_group_gets_a_clear_error(labels: dict[str, str], annotations: dict[str, str],
                                        expected: str) -> None:
    with pytest.raises(InvalidPodGroupError, match=expected):
        pod_group(labels, annotations)


# ---- all or nothing -------------------------------------------------------------------------


def _gang(size: int, *, present: int | None = None, queue: str = "a", name: str = "ns/g",
          cpu: str = "1", created: float = 0.0) -> list[SchedJob]:
    return [a_job(queue).in_group(name, size).requesting(cpu=cpu).created_at(created + i)
            .build() for i in range(size if present is None else present)]


def test_a_group_of_eight_with_room_for_seven_is_not_released_then_all_at_once() -> None:
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="7").times(1))
             .with_jobs(_gang(8)).build())
    result = run_round(state)
    assert result.decisions == ()
    assert set(result.skipped_jobs.values()) == {SkipReason.GROUP_TOO_BIG}
    state.set_node("cluster-a", "node-2", a_node(cpu="1").build())  # room for the eighth
    result = run_round(state)
    assert len(result.decisions) == 8
    assert {d.node_hint for d in result.decisions} == {"node-1", "node-2"}


def test_an_incomplete_group_waits_and_releases_nothing() -> None:
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="64").times(1))
             .with_jobs(_gang(4, present=3)).build())
    result = run_round(state)
    assert result.decisions == ()
    assert set(result.skipped_jobs.values()) == {SkipReason.GROUP_INCOMPLETE}
    state.upsert_job(a_job("a").in_group("ns/g", 4).build())
    assert len(run_round(state).decisions) == 4


def test_a_group_that_fits_an_empty_cluster_but_not_now_holds_nothing() -> None:
    running = a_job("b").requesting(cpu="3").running_on("node-1").build()
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(running, _gang(2, cpu="1")).build())
    result = run_round(state)
    assert result.decisions == ()
    assert set(result.skipped_jobs.values()) == {SkipReason.NO_NODE_WITH_ROOM}
    assert state.queue_usage("a").allocated_jobs == 0  # no member was half-released


def test_a_replacement_member_of_a_released_group_is_released_alone() -> None:
    held = [a_job("a").in_group("ns/g", 3).running_on("node-1").build() for _ in range(2)]
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(held, a_job("a").in_group("ns/g", 3)).build())
    assert len(run_round(state).decisions) == 1


def test_a_replacement_member_created_after_a_sibling_finished_is_released_alone() -> None:
    # Once a group runs, a new member joins alone (an elastic group's rule, min = max = 3 here):
    # the index needs no memory of finished members, only that one still holds capacity.
    members = [a_job("a").in_group("ns/g", 3).running_on("node-1").build() for _ in range(3)]
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(members).build())
    state.upsert_job(replace(members[0], state=JobState.SUCCEEDED))  # a sibling finished
    state.upsert_job(replace(members[1], state=JobState.DELETED))  # one is made again:
    state.upsert_job(a_job("a").in_group("ns/g", 3).build())
    assert len(run_round(state).decisions) == 1


def test_groups_of_the_same_name_in_other_namespaces_or_clusters_are_apart() -> None:
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(_gang(2, present=1, name="ns1/g"), _gang(2, present=1, name="ns2/g"))
             .build())
    assert run_round(state).decisions == ()


def test_a_group_counts_as_one_unit_of_fair_share() -> None:
    # a's group of 4 costs 4 cpu at once; b with singles gets the other half first, then the
    # group goes whole when it is the cheaper unit.
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(_gang(4), a_job("b").times(8)).build())
    result = run_round(state)
    assert released_per_queue(result) == {"a": 4, "b": 4}
    a_decisions = [d for d in result.decisions if d.queue == "a"]
    assert len(a_decisions) == 4


def test_a_group_over_its_queue_limit_is_not_released() -> None:
    state = (a_state().with_queues(a_queue("a").limited_to(cpu="3"))
             .with_cluster("cluster-a", a_node(cpu="16").times(1)).with_jobs(_gang(4)).build())
    result = run_round(state)
    assert result.decisions == ()
    assert set(result.skipped_jobs.values()) == {SkipReason.QUEUE_LIMIT}


# ---- elastic groups -------------------------------------------------------------------------


def _elastic(count: int, *, min_size: int = 3, max_size: int = 8, queue: str = "a",
             name: str = "ns/e", created: float = 0.0, running_on: str | None = None
             ) -> list[SchedJob]:
    members = []
    for i in range(count):
        member = (a_job(queue).in_elastic_group(name, min_size=min_size, max_size=max_size)
                  .requesting(cpu="1").created_at(created + i))
        members.append((member if running_on is None else member.running_on(running_on))
                       .build())
    return members


def test_an_elastic_group_names_a_minimum_and_an_optional_maximum() -> None:
    assert pod_group({GROUP_LABEL: "w"}, {GROUP_MIN_SIZE_KEY: "3", GROUP_MAX_SIZE_KEY: "8"}) == (
        PodGroup("w", 3, 8))
    unbounded = pod_group({GROUP_LABEL: "w", GROUP_MIN_SIZE_KEY: "2"}, {})
    assert unbounded == PodGroup("w", 2, MAX_GROUP_SIZE) and unbounded.elastic
    assert not PodGroup("w", 4).elastic  # group-size: the static case, min = max = size


@pytest.mark.parametrize(
    ("labels", "annotations", "expected"),
    [
        ({GROUP_LABEL: "w"}, {GROUP_MIN_SIZE_KEY: "0"}, "not a whole number from 1"),
        ({GROUP_LABEL: "w"}, {GROUP_MIN_SIZE_KEY: "2.5"}, "not a whole number"),
        ({GROUP_LABEL: "w"}, {GROUP_MIN_SIZE_KEY: "3", GROUP_MAX_SIZE_KEY: "x"},
         "not a whole number"),
        ({GROUP_LABEL: "w"}, {GROUP_MIN_SIZE_KEY: "3", GROUP_MAX_SIZE_KEY: "2"},
         "must be at least the minimum"),
        ({GROUP_LABEL: "w"}, {GROUP_MAX_SIZE_KEY: "8"}, "without a minimum"),
        ({GROUP_LABEL: "w"}, {GROUP_SIZE_KEY: "4", GROUP_MIN_SIZE_KEY: "2"}, "together"),
        ({GROUP_LABEL: "w", GROUP_MIN_SIZE_KEY: "2"}, {GROUP_MIN_SIZE_KEY: "3"}, "conflicting"),
        ({}, {GROUP_MIN_SIZE_KEY: "2"}, "without a group name"),
    ],
)
def test_a_bad_elastic_group_gets_a_clear_error(labels: dict[str, str],
                                                annotations: dict[str, str],
                                                expected: str) -> None:
    with pytest.raises(InvalidPodGroupError, match=expected):
        pod_group(labels, annotations)


def test_an_elastic_groups_minimum_goes_together_or_not_at_all() -> None:
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="2").times(1))
             .with_jobs(_elastic(5)).build())
    result = run_round(state)
    assert result.decisions == ()  # room for 2 of its minimum 3: none goes
    assert set(result.skipped_jobs.values()) == {SkipReason.GROUP_TOO_BIG}
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="2").times(1))
             .with_jobs(_elastic(2)).build())
    assert set(run_round(state).skipped_jobs.values()) == {SkipReason.GROUP_INCOMPLETE}


def test_an_elastic_group_releases_its_minimum_then_members_one_at_a_time_as_room_allows() -> None:
    members = _elastic(6)
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(members).build())
    result = run_round(state)
    # The oldest three together, then one more alone: the node has room for four.
    assert released_ids(result) == [m.job_id for m in members[:4]]
    assert set(result.skipped_jobs.values()) == {SkipReason.NO_NODE_WITH_ROOM}
    state.set_node("cluster-a", "node-2", a_node(cpu="1").build())
    assert released_ids(run_round(state)) == [members[4].job_id]  # alone, as room frees


def test_members_past_the_maximum_wait_without_spending_the_queues_lookback() -> None:
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="16").times(1))
             .with_jobs(_elastic(4, max_size=4, running_on="node-1"),
                        _elastic(5, max_size=4, created=10), a_job("a").created_at(100)).build())
    result = run_round(state, lookback=0)
    assert len(result.decisions) == 1  # the single pod behind five members at the maximum
    assert set(result.skipped_jobs.values()) == {SkipReason.GROUP_AT_MAX}
    status = state.groups().status(("cluster-a", "a", "ns/e"))
    assert status is not None and status.at_max
    assert "holds its maximum" in describe_group(status)


def test_members_above_the_minimum_are_charged_to_fair_share_like_single_pods() -> None:
    # a's group started with its minimum of 2; b has singles. Above its minimum the group
    # grows one member at a time, each its queue's next unit: the cluster splits evenly.
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(_elastic(8, min_size=2), a_job("b").times(8)).build())
    result = run_round(state)
    assert released_per_queue(result) == {"a": 4, "b": 4}


def test_members_that_end_shrink_the_group_which_keeps_running_below_its_minimum() -> None:
    running = _elastic(3, running_on="node-1")
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(running).build())
    for member in running[:2]:
        state.upsert_job(replace(member, state=JobState.SUCCEEDED))
    state.upsert_job(_elastic(1, created=50)[0])
    status = state.groups().status(("cluster-a", "a", "ns/e"))
    assert status is not None and status.below_minimum and status.held == 1
    assert "runs below its minimum" in describe_group(status)
    # It is not incomplete: its new member goes alone, and no timeout ends it.
    assert timed_out(state.groups(), now=T0 + 10_000, timeout_of={"a": 60.0}) == []
    assert len(run_round(state).decisions) == 1


def test_an_aged_elastic_group_reserves_for_its_minimum_only_and_then_joins_like_pods() -> None:
    # b's small pods keep coming; a's group needs 3 cpu at once for its minimum.
    blockers = [a_job("b").requesting(cpu="1").running_on("node-1").build() for _ in range(4)]
    members = _elastic(5, created=0)
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(blockers, members, a_job("b").times(4)).build())
    assert run_round(state, now=T0 + 100, reserve_after=30).decisions == ()
    assert state.groups().reserved == {"cluster-a": ("cluster-a", "a", "ns/e")}
    for blocker in blockers[:3]:
        state.upsert_job(replace(blocker, state=JobState.SUCCEEDED))
    result = run_round(state, now=T0 + 101, reserve_after=30)
    # The minimum goes (the node is full again), and the reservation ends with it.
    assert released_ids(result) == [m.job_id for m in members[:3]]
    assert not state.groups().reserved
    # From now on a's members are single units: the next free cpu goes to b, below a.
    state.upsert_job(replace(blockers[3], state=JobState.SUCCEEDED))
    assert released_per_queue(run_round(state, now=T0 + 102, reserve_after=30)) == {"b": 1}
    assert not state.groups().reserved


def test_explain_says_a_group_runs_below_its_minimum_and_what_its_members_wait_for() -> None:
    from lockgate.scheduler import explain

    running = _elastic(3, running_on="node-1")
    waiting = _elastic(2, created=50)
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="3").times(1))
             .with_jobs(running, waiting).build())
    state.upsert_job(replace(running[0], state=JobState.SUCCEEDED))
    told = explain(state, running[1].job_id, now=T0)
    assert told is not None and told.reason is None
    assert "runs below its minimum: 2 hold capacity" in told.message
    assert "keeps running" in told.message
    queued = explain(state, waiting[0].job_id, now=T0)
    assert queued is not None and "released one at a time" in queued.message
    fresh = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="3").times(1))
             .with_jobs(waiting).build())
    told = explain(fresh, waiting[0].job_id, now=T0)
    assert told is not None
    assert "2 of its minimum 3 arrived (asking cpu 2 so far); none is released" in told.message


def test_a_group_whose_every_member_ended_starts_over_with_its_minimum() -> None:
    running = _elastic(3, running_on="node-1")
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(running, _elastic(2, created=50)).build())
    for member in running:
        state.upsert_job(replace(member, state=JobState.SUCCEEDED))
    result = run_round(state)
    assert result.decisions == ()
    assert set(result.skipped_jobs.values()) == {SkipReason.GROUP_INCOMPLETE}


# ---- starvation: reservation after aging -----------------------------------------------------


def test_a_large_group_reserves_its_cluster_after_waiting_and_small_pods_stop_filling() -> None:
    # b's small pods keep arriving; a's group of 4 needs 4 free cpu at once.
    blockers = [a_job("b").requesting(cpu="1").running_on("node-1").build() for _ in range(4)]
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(blockers, _gang(4, created=0), a_job("b").times(3)).build())
    now = T0 + 100
    first = run_round(state, now=now, reserve_after=30)
    assert first.decisions == ()
    # One blocker finishes: without a reservation b's next pod would take the gap.
    state.upsert_job(replace(blockers[0], state=JobState.SUCCEEDED))
    second = run_round(state, now=now + 1, reserve_after=30)
    assert second.decisions == ()
    assert SkipReason.RESERVED_FOR_GROUP in second.skipped_jobs.values()
    for blocker in blockers[1:]:
        state.upsert_job(replace(blocker, state=JobState.SUCCEEDED))
    third = run_round(state, now=now + 2, reserve_after=30)
    assert released_per_queue(third) == {"a": 4}
    assert not state.groups().reserved  # released: the reservation is gone


def test_a_young_group_does_not_reserve() -> None:
    blockers = [a_job("b").requesting(cpu="1").running_on("node-1").build() for _ in range(4)]
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(blockers, _gang(4, created=0), a_job("b").times(1)).build())
    run_round(state, now=T0 + 10, reserve_after=30)
    state.upsert_job(replace(blockers[0], state=JobState.SUCCEEDED))
    assert released_per_queue(run_round(state, now=T0 + 11, reserve_after=30)) == {"b": 1}


def test_a_reserved_group_that_fits_goes_whatever_its_queues_lookback() -> None:
    # a's group reserved cluster-a; then a's pods of a higher priority arrive, ahead of the
    # group in a's queue, and wait on the reservation too. Once the blockers finish the group
    # fits: it must go, however many of a's pods wait before it (more than a's lookback here),
    # or the cluster would stand empty and reserved for ever.
    blockers = [a_job("b").requesting(cpu="1").running_on("node-1").build() for _ in range(4)]
    group = _gang(4, created=0)
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(blockers, group).build())
    run_round(state, now=T0 + 100, reserve_after=30)
    assert state.groups().reserved == {"cluster-a": ("cluster-a", "a", "ns/g")}
    state.upsert_jobs(a_job("a").with_priority(10).times(3))
    for blocker in blockers:
        state.upsert_job(replace(blocker, state=JobState.SUCCEEDED))
    result = run_round(state, now=T0 + 101, reserve_after=30, lookback=2)
    assert sorted(released_ids(result)) == sorted(member.job_id for member in group)
    assert not state.groups().reserved


def test_pods_waiting_on_a_reservation_do_not_use_up_their_queues_lookback() -> None:
    # c's pods in the reserved cluster-a rank before its pod in the empty cluster-b (c is
    # further from its target in cluster-a). Looking at them one by one would use up c's
    # lookback before it got to cluster-b.
    blockers = [a_job("b").requesting(cpu="1").running_on("node-1").build() for _ in range(4)]
    state = (a_state().with_queues("a", "b", "c")
             .with_cluster("cluster-a", a_node(cpu="4").times(2))
             .with_cluster("cluster-b", a_node(cpu="4").times(1))
             .with_jobs(blockers, _gang(4, cpu="2", created=0)).build())
    run_round(state, now=T0 + 100, reserve_after=30)
    assert state.groups().reserved == {"cluster-a": ("cluster-a", "a", "ns/g")}
    state.upsert_jobs([a_job("c").created_at(10 + i).build() for i in range(3)])
    state.upsert_job(a_job("c").in_cluster("cluster-b").created_at(20).build())
    result = run_round(state, now=T0 + 101, reserve_after=30, lookback=1)
    assert released_per_queue(result) == {"c": 1}
    assert result.queues["c"].skipped == {SkipReason.RESERVED_FOR_GROUP: 1}


@pytest.mark.parametrize("a_pod_ahead", [False, True], ids=["group-only", "pod-ahead"])
def test_an_aged_group_reserves_even_when_a_smaller_pod_was_turned_down_before_it(
        a_pod_ahead: bool) -> None:
    # c's 1-cpu pod ranks before a's group of 4 and is turned down first. a must not set the
    # cluster aside for that (a pod of the same shape was turned down): its aged group has its
    # own turn, reserves, and every gap that opens is kept for it until it goes whole. With
    # a_pod_ahead, a's own single pod (older, same shape) comes up before its group.
    blockers = [a_job("b").requesting(cpu="1").running_on("node-1").build() for _ in range(4)]
    ahead = [a_job("a").requesting(cpu="1").created_at(-5).build()] if a_pod_ahead else []
    state = (a_state().with_queues("a", "b", "c")
             .with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(blockers, ahead, _gang(4, created=0), a_job("c").times(3)).build())
    run_round(state, now=T0 + 100, reserve_after=30)
    assert state.groups().reserved == {"cluster-a": ("cluster-a", "a", "ns/g")}
    state.upsert_job(replace(blockers[0], state=JobState.SUCCEEDED))
    assert run_round(state, now=T0 + 101, reserve_after=30).decisions == ()  # gap kept
    for blocker in blockers[1:]:
        state.upsert_job(replace(blocker, state=JobState.SUCCEEDED))
    assert released_per_queue(run_round(state, now=T0 + 102, reserve_after=30)) == {"a": 4}
    assert not state.groups().reserved


# ---- timeouts --------------------------------------------------------------------------------


def test_an_incomplete_group_times_out_after_its_queues_timeout_only() -> None:
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(_gang(3, present=2, created=0), _gang(3, present=2, queue="b",
                                                              name="ns/h", created=0),
                        _gang(2, queue="a", name="ns/full", created=0)).build())
    late = timed_out(state.groups(), now=T0 + 61, timeout_of={"a": 60.0, "b": None})
    assert [status.key for status in late] == [("cluster-a", "a", "ns/g")]
    assert timed_out(state.groups(), now=T0 + 59, timeout_of={"a": 60.0}) == []
    message = timeout_message(late[0], timeout=60, action=GroupTimeoutAction.DELETE)
    assert "2 of 3 members" in message and "deleted" in message


# ---- priority within a queue -----------------------------------------------------------------


def test_within_a_queue_higher_priority_goes_first_then_older() -> None:
    old_low = a_job("a").with_priority(0).created_at(1).build()
    new_high = a_job("a").with_priority(100).created_at(5).build()
    older_high = a_job("a").with_priority(100).created_at(3).build()
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="2").times(1))
             .with_jobs(old_low, new_high, older_high).build())
    assert released_ids(run_round(state)) == [older_high.job_id, new_high.job_id]


# ---- admission and observation ---------------------------------------------------------------


def test_the_webhook_refuses_a_bad_group_and_gates_a_good_one() -> None:
    from test_admission import POD, gate

    from lockgate.admission import Outcome
    from lockgate.labels import QUEUE_LABEL

    member = POD.labelled({QUEUE_LABEL: "q1", GROUP_LABEL: "w"})
    good = member.annotated({GROUP_SIZE_KEY: "8"}).manifest()
    assert gate(good).outcome is Outcome.GATED
    bad = member.manifest()
    decision = gate(bad)
    assert decision.outcome is Outcome.DENIED
    assert "has no size" in decision.message and GROUP_SIZE_KEY in decision.message


def test_the_webhook_gates_an_elastic_member_and_refuses_a_maximum_below_the_minimum() -> None:
    from test_admission import POD, gate

    from lockgate.admission import Outcome
    from lockgate.labels import QUEUE_LABEL

    member = POD.labelled({QUEUE_LABEL: "q1", GROUP_LABEL: "executors"})
    good = member.annotated({GROUP_MIN_SIZE_KEY: "3", GROUP_MAX_SIZE_KEY: "8"}).manifest()
    assert gate(good).outcome is Outcome.GATED
    for given, expected in [
        ({GROUP_MIN_SIZE_KEY: "3", GROUP_MAX_SIZE_KEY: "2"}, "must be at least the minimum"),
        ({GROUP_MIN_SIZE_KEY: "three"}, "not a whole number from 1 to"),
        ({GROUP_MAX_SIZE_KEY: "8"}, "without a minimum"),
        ({GROUP_SIZE_KEY: "8", GROUP_MIN_SIZE_KEY: "3"}, "together"),
    ]:
        decision = gate(member.annotated(given).manifest())
        assert decision.outcome is Outcome.DENIED, given
        assert expected in decision.message, decision.message


def test_the_watcher_reports_group_preemptible_label_and_priority_class() -> None:
    from datetime import UTC, datetime

    from helpers.pods import a_pod
    from lockgate.labels import PREEMPTIBLE_LABEL
    from lockgate.observing import pod_event

    member = (a_pod("p").in_namespace("ns").with_uid("u1").in_queue("q")
              .labelled({KUEUE_GROUP_LABEL: "g", PREEMPTIBLE_LABEL: "true"})
              .with_spec(priorityClassName="batch-low", priority=5))
    pod = member.annotated({KUEUE_TOTAL_ANNOTATION: "4"}).obj()
    event = pod_event(pod, cluster="c", event_id="e", observed_at=datetime.now(UTC))
    assert (event.group, event.group_size, event.preemptible, event.priority_class,
            event.priority) == ("ns/g", 4, True, "batch-low", 5)
    pod = member.annotated({KUEUE_TOTAL_ANNOTATION: "many"}).obj()
    event = pod_event(pod, cluster="c", event_id="e", observed_at=datetime.now(UTC))
    assert (event.group, event.group_size) == (None, 0)
    elastic = (a_pod("e").in_namespace("ns").with_uid("u2").in_queue("q")
               .labelled({GROUP_LABEL: "x"})
               .annotated({GROUP_MIN_SIZE_KEY: "3", GROUP_MAX_SIZE_KEY: "8"}).obj())
    event = pod_event(elastic, cluster="c", event_id="e", observed_at=datetime.now(UTC))
    assert (event.group, event.group_size, event.group_max_size) == ("ns/x", 3, 8)


def test_a_reservation_ends_when_its_queue_is_cordoned() -> None:
    blockers = [a_job("b").requesting(cpu="1").running_on("node-1").build() for _ in range(4)]
    state = (a_state().with_queues("a", "b").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(blockers, _gang(4, created=0), a_job("b").times(1)).build())
    run_round(state, now=T0 + 100, reserve_after=30)
    assert state.groups().reserved == {"cluster-a": ("cluster-a", "a", "ns/g")}
    state.upsert_queue(a_queue("a").cordoned().build())
    state.upsert_job(replace(blockers[0], state=JobState.SUCCEEDED))
    assert released_per_queue(run_round(state, now=T0 + 101, reserve_after=30)) == {"b": 1}
    assert not state.groups().reserved
