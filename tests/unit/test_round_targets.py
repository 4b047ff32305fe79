"""The round against the fair targets: order in a contested cluster, and holds of freed room
(no starvation by size), on built states with a simulated clock."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest
from builders import JobBuilder, a_job, a_node, a_queue, a_state, released_per_queue

from lockgate.jobs import JobState
from lockgate.scheduler import (
    QueueOutcome,
    RoundResult,
    SchedJob,
    SchedulerState,
    SkipReason,
    schedule_round,
)
from lockgate.scheduler.records import Shape
from lockgate.scheduler.room import ClusterRoom

T0 = 1_700_000_000.0


def run_round(state: SchedulerState, *, now: float | None = None,
              hold: float | None = None, holds_per_queue: int = 1) -> RoundResult:
    return schedule_round(state, max_decisions=10_000, max_lookback_per_queue=1_000, now=now,
                          room_hold_seconds=hold, room_holds_per_queue=holds_per_queue)


def run_and_bind(state: SchedulerState, *, now: float, hold: float | None) -> list[SchedJob]:
    """A round, then each released pod bound where the round placed it (it runs)."""
    bound = []
    for decision in run_round(state, now=now, hold=hold).decisions:
        job = state.job(decision.job_id)
        assert job is not None
        state.upsert_job(replace(job, state=JobState.RUNNING, node_name=decision.node_hint))
        bound.append(job)
    return bound


def test_a_flexible_queue_leaves_the_contested_cluster_to_a_pinned_one() -> None:
    # The greedy trap in a round: q1 may run in A or B, q2 only in A, A = B = 10 cpu. The
    # fair targets put q1 in B and q2 in A; ranking by pool-wide cost alone splits A.
    state = (
        a_state()
        .with_queues("q1", "q2")
        .with_cluster("A", a_node(cpu="10", memory="64Gi").times(1, prefix="a"))
        .with_cluster("B", a_node(cpu="10", memory="64Gi").times(1, prefix="b"))
        .with_jobs(a_job("q1").in_cluster("A").times(10), a_job("q1").in_cluster("B").times(10),
                   a_job("q2").in_cluster("A").times(10))
        .build()
    )
    result = run_round(state)
    by_cluster: dict[tuple[str, str], int] = {}
    for decision in result.decisions:
        key = (decision.queue, decision.cluster)
        by_cluster[key] = by_cluster.get(key, 0) + 1
    assert by_cluster == {("q2", "A"): 10, ("q1", "B"): 10}


def test_the_weight_two_queue_goes_first_when_both_wait_for_the_same_room() -> None:
    # nw1 (weight 1) came first and holds 30 of cluster-a's 64; nw2 (weight 2) holds 26. Both
    # have more queued; 8 cpu are free. Targets: nw1 24, nw2 40 (nw2 is capped by its 40):
    # every free cpu goes to nw2, none to nw1, which is above its target already.
    nodes = a_node(cpu="16", memory="64Gi").times(4, prefix="a")
    running = [a_job("nw1").running_on(f"a-{i % 4 + 1}").times(1)[0] for i in range(30)]
    running += [a_job("nw2").running_on(f"a-{i % 4 + 1}").times(1)[0] for i in range(26)]
    state = (
        a_state()
        .with_queues(a_queue("nw1"), a_queue("nw2").with_priority_factor(0.5))
        .with_cluster("cluster-a", nodes)
        .with_cluster("cluster-b", a_node(cpu="16", memory="64Gi").times(4, prefix="b"))
        .with_jobs(running, a_job("nw1").times(10), a_job("nw2").times(14))
        .build()
    )
    targets = state.fair_targets()
    assert round(targets.queues["nw1"].clusters["cluster-a"]["cpu"]) == 24_000
    assert round(targets.queues["nw2"].clusters["cluster-a"]["cpu"]) == 40_000
    assert released_per_queue(run_round(state)) == {"nw2": 8}


def test_within_their_targets_queues_fill_in_proportion_to_them() -> None:
    nodes = a_node(cpu="16", memory="64Gi").times(4, prefix="a")
    state = (
        a_state()
        .with_queues(a_queue("nw1"), a_queue("nw2").with_priority_factor(0.5))
        .with_cluster("cluster-a", nodes)
        .with_cluster("cluster-b", a_node(cpu="16", memory="64Gi").times(4, prefix="b"))
        .with_jobs(a_job("nw1").times(40), a_job("nw2").times(40))
        .build()
    )
    result = schedule_round(state, max_decisions=16, max_lookback_per_queue=1_000)
    # 24 : 40 in sixteen releases is 6 : 10.
    assert released_per_queue(result) == {"nw1": 6, "nw2": 10}
    assert released_per_queue(run_round(state)) == {"nw1": 18, "nw2": 30}


# ---- holds: no starvation by size -------------------------------------------------------------

@dataclass
class _Fleet:
    """cluster-a (4 x 16 cpu) full of queue comp's 1-cpu pods, each finishing 30-36 s after it
    started, comp always sending more; q arrives at t=0 with one 1-cpu pod and 30 of 2 cpu."""

    hold: float | None
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    state: SchedulerState = field(init=False)
    ends: dict[str, float] = field(default_factory=dict)
    sent: int = 0
    idle_cpu_seconds: float = 0.0
    q_cpu: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = (
            a_state()
            .with_queues("comp", "q")
            .with_cluster("cluster-a", a_node(cpu="16", memory="64Gi").times(4, prefix="a"))
            .with_cluster("cluster-b", a_node(cpu="16", memory="64Gi").times(4, prefix="b"))
            .build()
        )
        for i in range(64):  # started over the last 36 s
            job = a_job("comp").named(f"comp-run-{i}").running_on(f"a-{i % 4 + 1}").build()
            self.state.upsert_job(replace(job, created_at=T0 - 40))
            self.ends[job.job_id] = T0 + self.rng.uniform(0, 36)
        self.top_up(T0)
        workers = a_job("q").requesting(cpu="2").times(30)
        for i, job in enumerate([a_job("q").named("q-scheduler").build(), *workers]):
            self.state.upsert_job(replace(job, created_at=T0 + i * 0.001,
                                          job_id=f"q-{i}"))

    def top_up(self, now: float) -> None:
        queued = sum(1 for i in range(self.sent)
                     if (job := self.state.job(f"comp-{i}")) is not None
                     and job.state is JobState.QUEUED)
        for _ in range(40 - queued):
            job = a_job("comp").named(f"comp-{self.sent}").build()
            self.state.upsert_job(replace(job, created_at=now))
            self.sent += 1

    def step(self, now: float) -> None:
        """One second: each pod that finishes frees its room, and a round runs at once, as
        the leader runs one on every change that could release something."""
        for job_id, end in sorted(self.ends.items(), key=lambda item: item[1]):
            if end <= now:
                self.state.remove_job(job_id)
                del self.ends[job_id]
                self.top_up(now)
                self.round(now)
        self.round(now)
        used = sum(self.state.queue_usage(q).allocation["cpu"] for q in ("comp", "q"))
        self.idle_cpu_seconds += (64_000 - used) / 1000
        self.q_cpu.append((now - T0, self.state.queue_usage("q").allocation["cpu"] / 1000))

    def round(self, now: float) -> None:
        for job in run_and_bind(self.state, now=now, hold=self.hold):
            if job.queue == "comp":
                self.ends[job.job_id] = now + self.rng.uniform(30, 36)

    def q_at(self, seconds: float) -> float:
        return max(cpu for at, cpu in self.q_cpu if at <= seconds)

    def run(self, seconds: int) -> _Fleet:
        for tick in range(seconds):
            self.step(T0 + tick)
        return self


def test_a_queue_of_big_pods_is_not_starved_by_a_stream_of_small_ones() -> None:
    fleet = _Fleet(hold=120.0).run(90)
    # Its target in cluster-a is half: 32 cpu; 1 + 15 x 2 = 31 within it.
    assert fleet.q_at(60) >= 30, fleet.q_cpu
    assert fleet.q_at(89) <= 33, "held room never serves a queue past its target"
    # A hold left is for a queue that holds less than its target (32 cpu each) there.
    for hold in fleet.state.room_holds():
        assert fleet.state.queue_usage(hold.queue).allocation["cpu"] < 32_000, hold


def test_without_holds_every_gap_goes_to_the_small_pods() -> None:
    fleet = _Fleet(hold=None).run(90)
    assert fleet.q_at(60) < 10, fleet.q_cpu  # the starvation: only the 1-cpu pod


def test_the_work_conservation_cost_of_holds_is_a_few_idle_cpus_while_they_fill() -> None:
    with_holds = _Fleet(hold=120.0).run(90)
    without = _Fleet(hold=None).run(90)
    capacity_seconds = 64 * 90
    # Measured: without holds nothing idles (every gap is filled at once); with holds, the
    # gaps that wait for a second cpu to free on the same node idle until it does. See
    # docs/scheduling.md ("Holds") for the figure.
    assert without.idle_cpu_seconds == 0
    assert with_holds.idle_cpu_seconds <= 0.05 * capacity_seconds, with_holds.idle_cpu_seconds
    print(f"idle cpu-seconds with holds: {with_holds.idle_cpu_seconds:.0f} of "
          f"{capacity_seconds} ({with_holds.idle_cpu_seconds / capacity_seconds:.2%})")


def comp_fills_two_nodes(on_a1: int, on_a2: int,
                         *waiting: JobBuilder | list[SchedJob]) -> SchedulerState:
    """cluster-a: two 4-cpu nodes running comp's 1-cpu pods (`on_a1`, `on_a2` of them), comp
    with 10 more waiting, and `waiting` (q's pods)."""
    return (
        a_state()
        .with_queues("comp", "q")
        .with_cluster("cluster-a", a_node(cpu="4", memory="64Gi").times(2, prefix="a"))
        .with_jobs([a_job("comp").running_on("a-1").named(f"c0-{i}").build()
                    for i in range(on_a1)],
                   [a_job("comp").running_on("a-2").named(f"c1-{i}").build()
                    for i in range(on_a2)],
                   a_job("comp").times(10), *waiting)
        .build()
    )


def test_a_hold_ends_in_time_and_moves_to_another_node() -> None:
    # Node a-1 is full of pods that never finish; a-2 frees a cpu now and then. q's 2-cpu pod
    # is held on one node; when that hold expires the next goes to the other node.
    state = comp_fills_two_nodes(4, 3, a_job("q").requesting(cpu="2").named("big"))
    run_round(state, now=T0, hold=30)
    first = state.room_holds().of("big")
    assert first is not None and first.until == T0 + 30
    # a-2's free cpu went to nobody: it is held for big (comp may not take it).
    assert released_per_queue(run_round(state, now=T0 + 1, hold=30)) == {}
    run_round(state, now=T0 + 31, hold=30)
    second = state.room_holds().of("big")
    assert second is not None and second.node != first.node


def test_room_is_held_for_a_started_groups_next_member_as_for_a_single_pod() -> None:
    # q's elastic group runs its minimum of 1 on a-1; its next 2-cpu member waits behind comp's
    # 1-cpu pods, and is held room like a single pod (its queue is below its target).
    def member() -> JobBuilder:
        return a_job("q").in_elastic_group("ns/e", min_size=1, max_size=4).requesting(cpu="2")
    state = (
        a_state()
        .with_queues("comp", "q")
        .with_cluster("cluster-a", a_node(cpu="4", memory="64Gi").times(2, prefix="a"))
        .with_jobs([a_job("comp").running_on("a-1").named(f"c0-{i}").build() for i in range(2)],
                   [a_job("comp").running_on("a-2").named(f"c1-{i}").build() for i in range(3)],
                   member().running_on("a-1").named("first"),
                   a_job("comp").times(10), member().named("next"))
        .build()
    )
    run_round(state, now=T0, hold=30)
    held = state.room_holds().of("next")
    assert held is not None and held.node == "a-2"
    assert released_per_queue(run_round(state, now=T0 + 1, hold=30)) == {}


def test_room_freed_anywhere_gathers_for_a_queue_owed_room_that_could_use_any_node() -> None:
    # big (q, below its target) fits no node now; it could use either once pods end there. Its
    # hold keeps a-2's two free cpus; a-1's free cpu is nobody's hold, but comp (over its
    # target) does not take it either: room nobody is owed waits for big this round.
    state = comp_fills_two_nodes(3, 2, a_job("q").requesting(cpu="3").named("big"))
    result = run_round(state, now=T0, hold=30)
    hold = state.room_holds().of("big")
    assert hold is not None and hold.node == "a-2"  # closest to fitting it (2 of 3 free)
    assert released_per_queue(result) == {}
    assert result.queues["comp"].set_aside == ("cluster-a",)
    # Without holds nothing is kept for big: comp takes both nodes' free room.
    assert released_per_queue(run_round(state, now=T0 + 1, hold=None)) == {"comp": 3}


def test_other_pods_use_room_on_nodes_no_one_holds_where_the_owed_pod_cannot_go() -> None:
    # a-1 is too small for big ever: its free cpu cannot bring big closer, so comp takes it.
    nodes = {"a-1": a_node(cpu="2", memory="64Gi").build(),
             "a-2": a_node(cpu="4", memory="64Gi").build()}
    state = (
        a_state()
        .with_queues("comp", "q")
        .with_cluster("cluster-a", nodes)
        .with_jobs(a_job("comp").running_on("a-1").named("c0-0"),
                   [a_job("comp").running_on("a-2").named(f"c1-{i}").build() for i in range(2)],
                   a_job("comp").times(10), a_job("q").requesting(cpu="3").named("big"))
        .build()
    )
    result = run_round(state, now=T0, hold=30)
    hold = state.room_holds().of("big")
    assert hold is not None and hold.node == "a-2"
    # a-2's two free cpus are kept for big; a-1's goes to comp.
    assert released_per_queue(result) == {"comp": 1}
    assert [d.node_hint for d in result.decisions] == ["a-1"]


def test_a_queue_whose_holds_cover_what_it_is_owed_sets_the_cluster_aside() -> None:
    # q is owed two 2-cpu pods in cluster-a (its target there is 4 cpu of 8) and has 30 waiting.
    # Once room is held for two, its other pods can go there neither now (no room) nor by a new
    # hold, so the round looks at its held pods only, not its whole backlog every round
    # (in the fleet simulator's scenario (a) at scale 0.01 that halved the round's median).
    state = comp_fills_two_nodes(4, 3, a_job("q").requesting(cpu="2").times(30))
    for now in (T0, T0 + 1):
        result = run_round(state, now=now, hold=30, holds_per_queue=5)
        held = [hold.job_id for hold in state.room_holds() if hold.queue == "q"]
        assert len(held) == 2
        assert result.queues["q"].skipped == {SkipReason.NO_NODE_WITH_ROOM: 2}
        assert result.queues["q"].outcome is QueueOutcome.NOTHING_FITS
        assert set(held) <= set(result.skipped_jobs)  # the held pods were looked at
        assert released_per_queue(result) == {}


def test_held_pods_looked_at_in_a_row_look_for_room_others_hold_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # comp fills eight 4-cpu nodes; q (30 pods of 2 cpu waiting) is owed half the cluster, so
    # the first round holds room for 8 of its pods, one per node. In the next round nothing
    # frees: its 8 held pods come up one after another, and the first one's search of other
    # nodes for room held by queues that yield to it answers for the 7 after it (nobody took
    # room in between, so the answer cannot change).
    state = (
        a_state().with_queues("comp", "q")
        .with_cluster("cluster-a", a_node(cpu="4", memory="64Gi").times(8, prefix="a"))
        .with_jobs([a_job("comp").running_on(f"a-{n}").named(f"c{n}-{i}").build()
                    for n in range(1, 9) for i in range(4)],
                   a_job("comp").times(10), a_job("q").requesting(cpu="2").times(30))
        .build()
    )
    run_round(state, now=T0, hold=30, holds_per_queue=8)
    assert len([hold for hold in state.room_holds() if hold.queue == "q"]) == 8
    searches: list[str] = []
    search = ClusterRoom._place_yielded

    def counted(room: ClusterRoom, shape: Shape, queue: str, yields: Callable[..., bool]
                ) -> int:
        searches.append(queue)
        return search(room, shape, queue, yields)

    monkeypatch.setattr(ClusterRoom, "_place_yielded", counted)
    result = run_round(state, now=T0 + 1, hold=30, holds_per_queue=8)
    assert result.queues["q"].skipped == {SkipReason.NO_NODE_WITH_ROOM: 8}
    assert searches == ["q"]


def test_a_queue_holds_room_for_its_next_pod_only_unless_allowed_more() -> None:
    # q is owed two 2-cpu pods in cluster-a. By default room is held for its next pod alone
    # (each hold is looked at every round: at fleet scale the round's cost grows with the
    # holds); once that held pod was looked at, its other pods are not looked at one by one.
    state = comp_fills_two_nodes(4, 3, a_job("q").requesting(cpu="2").times(30))
    for now in (T0, T0 + 1):
        result = run_round(state, now=now, hold=30)
        assert len([hold for hold in state.room_holds() if hold.queue == "q"]) == 1
        assert result.queues["q"].skipped == {SkipReason.NO_NODE_WITH_ROOM: 1}
        assert result.queues["q"].outcome is QueueOutcome.NOTHING_FITS
    # Allowed fewer than it holds (the setting lowered), the oldest hold stays.
    state = comp_fills_two_nodes(4, 3, a_job("q").requesting(cpu="2").times(30))
    run_round(state, now=T0, hold=30, holds_per_queue=2)
    oldest = min((hold for hold in state.room_holds() if hold.queue == "q"),
                 key=lambda hold: hold.seq)
    run_round(state, now=T0 + 1, hold=30)
    assert [hold.job_id for hold in state.room_holds() if hold.queue == "q"] == [oldest.job_id]


def test_a_hold_ends_when_its_queue_no_longer_needs_it_to_reach_its_target() -> None:
    state = comp_fills_two_nodes(4, 3, a_job("q").requesting(cpu="2").named("big"))
    run_round(state, now=T0, hold=30)
    assert state.room_holds().of("big") is not None
    big = state.job("big")
    assert big is not None
    state.upsert_job(replace(big, state=JobState.SUCCEEDED))  # gone: nothing to hold for
    run_round(state, now=T0 + 1, hold=30)
    assert state.room_holds().of("big") is None
    assert state.job("big") is None


# ---- holds against the weights: two queues below their targets wait for the same room ---------

@dataclass
class _Waves:
    """cluster-a (4 x 16 cpu) full of queue fill's 64 one-cpu pods, which finish in four waves
    of 16 (4 per node) at 40, 48, 56 and 64 s; nw1 (weight 1) sends 40 one-cpu pods just
    before nw2 (weight 2) sends 40, as two Deployments applied one after the other do, the
    scheduler running a round on every change and every second, with holds at their
    default (120 s). Records (nw1, nw2) bound after every round while both wait."""

    hold: float | None = 120.0
    spread: bool = True  # each wave 4 pods per node; else unevenly
    state: SchedulerState = field(init=False)
    ends: dict[str, float] = field(default_factory=dict)
    seen: list[tuple[float, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = (
            a_state()
            .with_queues(a_queue("fill"), a_queue("nw1"),
                         a_queue("nw2").with_priority_factor(0.5))
            .with_cluster("cluster-a", a_node(cpu="16", memory="64Gi").times(4, prefix="a"))
            .with_cluster("cluster-b", a_node(cpu="16", memory="64Gi").times(4, prefix="b"))
            .build()
        )
        for i in range(64):
            node = f"a-{i % 4 + 1}" if self.spread else f"a-{(i * 7) % 64 // 16 + 1}"
            job = a_job("fill").named(f"fill-{i}").running_on(node).build()
            self.state.upsert_job(replace(job, created_at=T0 - 10))
            self.ends[job.job_id] = T0 + (40, 48, 56, 64)[i // 16]

    def arrive(self, queue: str, now: float) -> None:
        # A ReplicaSet's pods reach the scheduler a few at a time, a round after each batch.
        for batch in range(4):
            for i in range(10):
                job = a_job(queue).named(f"{queue}-{batch * 10 + i}").build()
                self.state.upsert_job(replace(job, created_at=now + batch * 0.01))
            self.round(now + batch * 0.01)

    def round(self, now: float) -> None:
        run_and_bind(self.state, now=now, hold=self.hold)
        usage = {q: self.state.queue_usage(q) for q in ("nw1", "nw2")}
        if all(u.queued_jobs for u in usage.values()):
            self.seen.append((now - T0, usage["nw1"].allocation.get("cpu", 0) // 1000,
                              usage["nw2"].allocation.get("cpu", 0) // 1000))

    def run(self) -> _Waves:
        self.arrive("nw1", T0 + 1)
        self.arrive("nw2", T0 + 1.5)
        for tick in range(2, 90):
            now = T0 + tick
            for job_id, end in sorted(self.ends.items(), key=lambda item: item[1]):
                if end <= now:
                    self.state.remove_job(job_id)
                    del self.ends[job_id]
                    self.round(now)  # the watcher reports each pod's end on its own
            self.round(now)
        return self


@pytest.mark.parametrize("spread", [True, False])
@pytest.mark.parametrize("hold", [120.0, None])
def test_holds_serve_the_weight_two_queue_first_when_both_wait(hold: float | None,
                                                              spread: bool) -> None:
    # Targets while fill holds on: fill 16, nw1 16, nw2 32 (1 : 2); once it is gone 24 : 40.
    waves = _Waves(hold=hold, spread=spread).run()
    assert waves.seen, "both queues never waited together"
    for at, a, b in waves.seen:
        # Room frees a pod at a time: nw1 never ahead of its half of nw2, nor nw2 ahead of
        # twice nw1, by more than a pod.
        assert a <= b / 2 + 1 and b <= 2 * a + 2, (at, a, b, waves.seen)
    usage = {q: waves.state.queue_usage(q).allocation["cpu"] // 1000 for q in ("nw1", "nw2")}
    assert usage == {"nw1": 24, "nw2": 40}, usage
