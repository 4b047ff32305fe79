"""A gang explains itself (issue 18, item 4): explain and the Events of a pod group's members
say the group's total request, how many members arrived, what it waits for, and when its
reservation starts. The wording is pinned: users and runbooks read it."""

from __future__ import annotations

from builders import a_job, a_node, a_state

from lockgate.scheduler import (
    EVENT_REASONS,
    GroupStanding,
    Reservation,
    SchedJob,
    SchedulerState,
    WaitReason,
    explain,
    group_text,
    reservation_text,
    schedule_round,
)
from lockgate.wait_estimates import ReleaseRates

T0 = 1_700_000_000.0  # 22:13:20Z; the builders' created_at(i) is T0 + i


def _members(count: int, *, size: int = 8, name: str = "ns/g1", queue: str = "a",
             created: float = 0.0) -> list[SchedJob]:
    return [a_job(queue).in_group(name, size).requesting(cpu="2", memory="4Gi")
            .created_at(created + i).build() for i in range(count)]


def _blocked(members: list[SchedJob]) -> SchedulerState:
    """Three 8-cpu nodes, each with 6 cpu held by queue b: 6 cpu free, the group needs 16."""
    nodes = a_node(cpu="8", memory="32Gi").times(3)
    blockers = [a_job("b").requesting(cpu="6").running_on(node).build() for node in nodes]
    return (a_state().with_queues("a", "b").with_cluster("cluster-a", nodes)
            .with_jobs(blockers, members).build())


def test_a_group_still_filling_says_how_many_arrived_what_they_ask_and_whom_it_waits_for() -> None:
    members = _members(3)
    state = (a_state().with_queues("a")
             .with_cluster("cluster-a", a_node(cpu="8", memory="32Gi").times(2))
             .with_jobs(members).build())
    told = explain(state, members[0].job_id, now=T0 + 30, group_reserve_after=60)
    assert told is not None and told.reason is WaitReason.GROUP_INCOMPLETE
    assert told.message == (
        'queue "a", position 1 of 3; waiting for 5 more members of its pod group to arrive; '
        "pod group 'ns/g1': 3 of 8 members arrived (asking cpu 6, memory 12Gi so far); none "
        "is released before all 8 are here; once all are here, it reserves cluster cluster-a "
        "if it has not fitted 1m after the last arrives")
    assert told.group_standing is not None
    assert told.group_standing.reservation is Reservation.ONCE_COMPLETE
    assert EVENT_REASONS[WaitReason.GROUP_INCOMPLETE] == ("LockgateWaitingForGroup", False)
    # Releases do not bring members: no estimate from the queue's pace.
    assert ReleaseRates().estimate_for(told, now=T0 + 30).text() == (
        "no wait estimate: it waits for the rest of its pod group to arrive, which releases "
        "do not bring")


def test_a_full_group_blocked_by_room_says_its_total_and_when_it_reserves() -> None:
    members = _members(8)
    state = _blocked(members)
    told = explain(state, members[0].job_id, now=T0 + 30, group_reserve_after=60)
    assert told is not None and told.reason is WaitReason.CLUSTER_ROOM
    assert told.message.startswith(
        'queue "a", position 1 of 8; waiting for room in cluster cluster-a for its whole pod '
        "group: it needs cpu 16, memory 32Gi at once, free there cpu 6, memory 96Gi (most on "
        "one node: cpu 2, memory 32Gi)")
    # Its newest member arrived at T0 + 7: it reserves 60 s later if it still does not fit.
    assert told.group == (
        "pod group 'ns/g1': 8 of 8 members arrived, needing cpu 16, memory 32Gi in all, "
        "released together or not at all; if it does not fit by then, it reserves cluster "
        "cluster-a from about 22:14:27Z, 1m after its last member arrived")
    assert told.message.endswith(told.group)
    # Every member says the same of the group (the Event of each member).
    other = explain(state, members[5].job_id, now=T0 + 30, group_reserve_after=60)
    assert other is not None and other.group == told.group


def test_a_reserving_group_says_since_when_and_what_that_means() -> None:
    members = _members(8)
    state = _blocked(members)
    schedule_round(state, max_decisions=100, max_lookback_per_queue=100, now=T0 + 100,
                   group_reserve_after_seconds=60)
    assert state.groups().reserved == {"cluster-a": ("cluster-a", "a", "ns/g1")}
    told = explain(state, members[0].job_id, now=T0 + 101, group_reserve_after=60)
    assert told is not None and told.reason is WaitReason.CLUSTER_ROOM
    assert told.group == (
        "pod group 'ns/g1': 8 of 8 members arrived, needing cpu 16, memory 32Gi in all, "
        "released together or not at all; cluster cluster-a is reserved for it since about "
        "22:14:27Z: nothing else is released there until it fits")


def test_an_aged_group_not_yet_reserving_says_why() -> None:
    members = _members(8)
    state = _blocked(members)
    due = explain(state, members[0].job_id, now=T0 + 100, group_reserve_after=60)
    assert due is not None and due.group.endswith(
        "; it reserves cluster cluster-a at the next round (due since about 22:14:27Z)")
    # Another group holds the cluster's one reservation: it waits for that one.
    state.groups().reserved["cluster-a"] = ("cluster-a", "b", "ns/h")
    behind = explain(state, members[0].job_id, now=T0 + 100, group_reserve_after=60)
    assert behind is not None and behind.group.endswith(
        "; it reserves cluster cluster-a once pod group 'ns/h' of queue \"b\", which holds "
        "the cluster's one reservation, is released or gone")
    # Without the leader's ageing, nothing is said of when.
    unknown = explain(state, members[0].job_id, now=T0 + 100)
    assert unknown is not None and unknown.group.endswith("released together or not at all")


def test_a_group_too_big_for_its_cluster_says_it_never_reserves() -> None:
    members = _members(8)
    state = (a_state().with_queues("a")
             .with_cluster("cluster-a", a_node(cpu="8", memory="32Gi").times(1))
             .with_jobs(members).build())
    told = explain(state, members[0].job_id, now=T0 + 100, group_reserve_after=60)
    assert told is not None and told.reason is WaitReason.NODE_FIT
    assert told.message.startswith(
        'queue "a", position 1 of 8; its pod group does not fit cluster cluster-a even with '
        "every node empty: it needs cpu 16, memory 32Gi in all, the largest node offers cpu 8, "
        "memory 32Gi; lower the members' requests or the group's size, or add nodes")
    assert told.group.endswith("; it never reserves cluster cluster-a, which cannot hold it "
                               "even empty")


def test_an_elastic_group_above_its_minimum_says_its_members_go_alone() -> None:
    group = a_job("a").in_elastic_group("ns/e", min_size=3, max_size=8).requesting(cpu="1")
    running = [group.running_on("node-1").created_at(i).build() for i in range(4)]
    queued = [group.created_at(10 + i).build() for i in range(2)]
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="4").times(1))
             .with_jobs(running, queued).build())
    told = explain(state, queued[0].job_id, now=T0 + 30, group_reserve_after=60)
    assert told is not None and told.reason is WaitReason.CLUSTER_ROOM
    assert told.message == (
        'queue "a", position 1 of 2; waiting for room in cluster cluster-a: no node has cpu 1 '
        "free (most on one node: cpu 0); pod group 'ns/e' (minimum 3, maximum 8): 4 hold "
        "capacity, above its minimum; its 2 queued members are released one at a time, as "
        "fair share and room allow, and it reserves no cluster")


def test_an_elastic_group_that_has_not_started_gives_the_minimum_released_at_once() -> None:
    group = a_job("a").in_elastic_group("ns/e", min_size=3, max_size=8).requesting(cpu="1")
    queued = [group.created_at(10 + i).build() for i in range(5)]
    state = (a_state().with_queues("a").with_cluster("cluster-a", a_node(cpu="8").times(1))
             .with_jobs(queued).build())
    told = explain(state, queued[4].job_id, now=T0 + 30, group_reserve_after=60)
    assert told is not None and told.reason is WaitReason.NEXT_ROUND
    assert told.message == (
        'queue "a", position 5 of 5; there is room for its whole pod group: the next '
        "scheduling round releases it; pod group 'ns/e' (minimum 3, maximum 8): 5 members "
        "arrived; its first 3 need cpu 3 in all and are released together or not at all, the "
        "rest one at a time after them")


def test_the_reservation_sentences_of_the_pure_builder() -> None:
    base = GroupStanding(name="ns/g", size=4, max_size=4, queued=4, held=0,
                         needs={"cpu": 8000}, reservation=Reservation.LATER,
                         reserve_at=T0 + 60, reserve_after=60)
    assert group_text(base, cluster="c", now=T0) == (
        "pod group 'ns/g': 4 of 4 members arrived, needing cpu 8 in all, released together or "
        "not at all; if it does not fit by then, it reserves cluster c from about 22:14:20Z, "
        "1m after its last member arrived")
    cases = {
        Reservation.RESERVING: "cluster c is reserved for it since about 22:14:20Z: nothing "
                               "else is released there until it fits",
        Reservation.AT_LIMIT: "it reserves no room while its queue's limits hold it back",
        Reservation.STARTED: "",
        Reservation.NONE: "",
    }
    for where, text in cases.items():
        standing = GroupStanding(**{**_fields(base), "reservation": where})
        assert reservation_text(standing, cluster="c", now=T0 + 61) == text
    # Preemption reserved it before it aged: no "since".
    early = GroupStanding(**{**_fields(base), "reservation": Reservation.RESERVING})
    assert reservation_text(early, cluster="c", now=T0) == (
        "cluster c is reserved for it while preemption makes room: nothing else is released "
        "there until it fits")


def _fields(standing: GroupStanding) -> dict[str, object]:
    return {name: getattr(standing, name) for name in standing.__slots__}


