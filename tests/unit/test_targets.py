"""The constrained (pinned) weighted max-min DRF targets: worked examples, and random fleets
checked against an independent unit-by-unit progressive filling over an integer max flow."""

from __future__ import annotations

import random

import pytest

from lockgate.scheduler.targets import (
    _SOLVED,
    Demand,
    FairTargets,
    NodeGroup,
    _FlowNetwork,
    _Problem,
    fair_targets,
)

CPU = "cpu"


def cluster(name: str, cpu: float, group: str = "all", **more: float) -> NodeGroup:
    return NodeGroup(cluster=name, name=group, capacity={CPU: cpu, **more})


def asks(queue: str, where: str, cpu: float, *, held: float = 0.0,
         groups: tuple[str, ...] | None = None, **more: float) -> Demand:
    return Demand(queue=queue, cluster=where, amount={CPU: cpu, **more},
                  held={CPU: held} if held else {}, groups=groups)


def cpus(targets: FairTargets, queue: str, where: str | None = None) -> float:
    target = targets.queues[queue]
    if where is None:
        return sum(amounts.get(CPU, 0.0) for amounts in target.clusters.values())
    return target.clusters.get(where, {}).get(CPU, 0.0)


def test_the_issues_first_test_weights_matter_when_both_are_pinned_to_one_cluster() -> None:
    # cluster-a 64 cpu, cluster-b 64 idle; nw1 weight 1, nw2 weight 2, 40 x 1 cpu each in a.
    targets = fair_targets(
        groups=[cluster("a", 64), cluster("b", 64)],
        weights={"nw1": 1.0, "nw2": 2.0},
        demands=[asks("nw1", "a", 40), asks("nw2", "a", 40)],
    )
    # Max-min with weights: nw2 is capped by its demand (40 < 2/3 of 64), nw1 gets the rest.
    assert cpus(targets, "nw1") == pytest.approx(24)
    assert cpus(targets, "nw2") == pytest.approx(40)
    assert targets.queues["nw1"].share == pytest.approx(24 / 128)
    assert targets.queues["nw2"].capped and not targets.queues["nw1"].capped
    assert targets.queues["nw1"].in_cluster("b") == 0.0


def test_equal_weights_split_a_contested_cluster_evenly() -> None:
    targets = fair_targets(
        groups=[cluster("a", 64), cluster("b", 64)],
        weights={"nw1": 1.0, "nw2": 1.0},
        demands=[asks("nw1", "a", 40), asks("nw2", "a", 40)],
    )
    assert cpus(targets, "nw1") == pytest.approx(32)
    assert cpus(targets, "nw2") == pytest.approx(32)


def test_the_issues_second_test_a_newcomer_is_owed_half_of_the_contested_cluster() -> None:
    # comp streams 1-cpu pods into cluster-a (it holds 64 and has more queued); q asks for
    # one 1-cpu scheduler and 30 x 2-cpu workers there.
    targets = fair_targets(
        groups=[cluster("a", 64), cluster("b", 64)],
        weights={"comp": 1.0, "q": 1.0},
        demands=[asks("comp", "a", 64 + 100, held=64), asks("q", "a", 61)],
    )
    assert cpus(targets, "q") == pytest.approx(32)
    assert cpus(targets, "comp") == pytest.approx(32)


def test_the_greedy_trap_a_flexible_queue_moves_aside_for_a_pinned_one() -> None:
    # q1 could run in A or B, q2 only in A: the fair answer gives q1 all of B and q2 all of A.
    # Choosing a cluster per step greedily would split A and leave q2 with 5.
    targets = fair_targets(
        groups=[cluster("A", 10), cluster("B", 10)],
        weights={"q1": 1.0, "q2": 1.0},
        demands=[asks("q1", "A", 10), asks("q1", "B", 10), asks("q2", "A", 10)],
    )
    assert cpus(targets, "q1") == pytest.approx(10)
    assert cpus(targets, "q2") == pytest.approx(10)
    assert cpus(targets, "q2", "A") == pytest.approx(10)
    assert cpus(targets, "q1", "B") == pytest.approx(10)


def test_the_trap_holds_even_when_the_flexible_queue_already_runs_in_the_contested_cluster(
) -> None:
    targets = fair_targets(
        groups=[cluster("A", 10), cluster("B", 10)],
        weights={"q1": 1.0, "q2": 1.0},
        demands=[asks("q1", "A", 10, held=10), asks("q1", "B", 10), asks("q2", "A", 10)],
    )
    assert cpus(targets, "q1", "B") == pytest.approx(10)
    assert cpus(targets, "q2", "A") == pytest.approx(10)


def test_a_team_that_holds_most_of_one_cluster_is_not_owed_more_of_another() -> None:
    # big asks for all of b and some of a; small asks only in a. Shares sum over clusters:
    # big's 60 in b already exceed what small can ever have, so small gets all it asks in a.
    targets = fair_targets(
        groups=[cluster("a", 40), cluster("b", 60)],
        weights={"big": 1.0, "small": 1.0},
        demands=[asks("big", "b", 60, held=60), asks("big", "a", 40), asks("small", "a", 30)],
    )
    assert cpus(targets, "small") == pytest.approx(30)
    assert cpus(targets, "big", "a") == pytest.approx(10)
    assert cpus(targets, "big", "b") == pytest.approx(60)


def test_without_pinning_it_is_drf_with_demand_caps_redistributed() -> None:
    # One cluster: the ordinary weighted water-filling. a asks 10, b and c unbounded, 1:1:2.
    targets = fair_targets(
        groups=[cluster("x", 100)],
        weights={"a": 1.0, "b": 1.0, "c": 2.0},
        demands=[asks("a", "x", 10), asks("b", "x", 500), asks("c", "x", 500)],
    )
    assert cpus(targets, "a") == pytest.approx(10)
    assert cpus(targets, "b") == pytest.approx(30)
    assert cpus(targets, "c") == pytest.approx(60)


def test_node_filters_keep_demand_to_the_nodes_it_may_land_on() -> None:
    # Cluster a has 8 plain cpu and 8 cpu on tainted nodes that only gpu-team tolerates.
    groups = [cluster("a", 8, "plain"), cluster("a", 8, "tainted")]
    targets = fair_targets(
        groups=groups,
        weights={"web": 1.0, "gpu-team": 1.0},
        demands=[asks("web", "a", 16, groups=("plain",)),
                 asks("gpu-team", "a", 16, groups=("plain", "tainted"))],
    )
    # gpu-team takes the tainted nodes; the plain ones go to web, who can use nothing else.
    assert cpus(targets, "web") == pytest.approx(8)
    assert cpus(targets, "gpu-team") == pytest.approx(8)


def test_the_split_keeps_a_queue_where_it_already_runs() -> None:
    # q may run in A or B, nobody else asks: it keeps its 6 in B and takes 4 more, in A first.
    targets = fair_targets(
        groups=[cluster("A", 10), cluster("B", 10)],
        weights={"q": 1.0},
        demands=[asks("q", "A", 10), asks("q", "B", 10, held=6)],
    )
    assert cpus(targets, "q") == pytest.approx(20)
    first = fair_targets(
        groups=[cluster("A", 10), cluster("B", 10)],
        weights={"q": 1.0, "r": 1.0},
        demands=[asks("q", "A", 10), asks("q", "B", 10, held=6), asks("r", "A", 2)],
    )
    assert cpus(first, "q", "B") == pytest.approx(10)
    assert cpus(first, "r") == pytest.approx(2)


def test_the_split_is_deterministic() -> None:
    def compute() -> FairTargets:
        return fair_targets(
            groups=[cluster("A", 10), cluster("B", 10), cluster("C", 10)],
            weights={"q": 1.0, "r": 1.0},
            demands=[asks("q", c, 10) for c in "ABC"] + [asks("r", c, 10) for c in "CBA"],
        )
    once, again = compute(), compute()
    assert once.queues == again.queues
    assert cpus(once, "q") == pytest.approx(15)
    assert cpus(once, "r") == pytest.approx(15)


def test_queues_without_weight_or_room_get_nothing_and_do_not_hold_others_back() -> None:
    targets = fair_targets(
        groups=[cluster("a", 10)],
        weights={"a-team": 1.0, "nowhere": 1.0, "weightless": 0.0},
        demands=[asks("a-team", "a", 100), asks("nowhere", "gone", 10),
                 asks("weightless", "a", 10)],
    )
    assert cpus(targets, "a-team") == pytest.approx(10)
    assert cpus(targets, "nowhere") == 0.0
    assert "weightless" not in targets.queues


def test_shares_are_dominant_over_the_resources_named() -> None:
    # mem-heavy's dominant resource is memory: with equal weights, equal dominant shares.
    targets = fair_targets(
        groups=[NodeGroup("a", "all", {CPU: 100, "memory": 100})],
        weights={"cpu-heavy": 1.0, "mem-heavy": 1.0},
        demands=[Demand("cpu-heavy", "a", {CPU: 100, "memory": 20}),
                 Demand("mem-heavy", "a", {CPU: 20, "memory": 100})],
    )
    assert targets.queues["cpu-heavy"].share == pytest.approx(targets.queues["mem-heavy"].share)
    cpu_heavy = targets.queues["cpu-heavy"].clusters["a"]
    assert cpu_heavy[CPU] <= 100 + 1e-9
    ignored = fair_targets(
        groups=[NodeGroup("a", "all", {CPU: 100, "memory": 100})],
        weights={"cpu-heavy": 1.0, "mem-heavy": 1.0},
        demands=[Demand("cpu-heavy", "a", {CPU: 100, "memory": 20}),
                 Demand("mem-heavy", "a", {CPU: 20, "memory": 100})],
        resources={CPU},
    )
    assert ignored.pool == {CPU: 100, "memory": 100}


# ---- against an independent model -------------------------------------------------------------

def _integer_max_flow(capacity: dict[tuple[str, str], int], source: str, sink: str) -> int:
    """Edmonds-Karp on a dict of integer capacities (another algorithm than the module's)."""
    residual = dict(capacity)
    for (u, v) in list(capacity):
        residual.setdefault((v, u), 0)
    neighbours: dict[str, list[str]] = {}
    for (u, v) in residual:
        neighbours.setdefault(u, []).append(v)
    flow = 0
    while True:
        parent: dict[str, str] = {source: source}
        frontier = [source]
        while frontier and sink not in parent:
            nxt = []
            for u in frontier:
                for v in neighbours.get(u, []):
                    if v not in parent and residual[(u, v)] > 0:
                        parent[v] = u
                        nxt.append(v)
            frontier = nxt
        if sink not in parent:
            return flow
        v, amount = sink, 10**9
        while v != source:
            amount = min(amount, residual[(parent[v], v)])
            v = parent[v]
        v = sink
        while v != source:
            residual[(parent[v], v)] -= amount
            residual[(v, parent[v])] += amount
            v = parent[v]
        flow += amount


def _unit_filling(caps: dict[str, int], weights: dict[str, int],
                  demand: dict[tuple[str, str], int]) -> dict[str, int]:
    """Progressive filling one unit at a time: the lowest (held + 1) / weight that can still be
    given one more (checked by a max flow) gets it; a queue that cannot is done."""
    given = dict.fromkeys(weights, 0)
    rising = set(weights)

    def feasible(levels: dict[str, int]) -> bool:
        edges: dict[tuple[str, str], int] = {}
        for queue, level in levels.items():
            edges[("s", "q:" + queue)] = level
        for (queue, where), amount in demand.items():
            edges[("q:" + queue, "c:" + where)] = amount
        for where, amount in caps.items():
            edges[("c:" + where, "t")] = amount
        return _integer_max_flow(edges, "s", "t") == sum(levels.values())

    while rising:
        queue = min(rising, key=lambda q: ((given[q] + 1) / weights[q], q))
        trial = dict(given)
        trial[queue] += 1
        asked = sum(a for (q, _), a in demand.items() if q == queue)
        if trial[queue] <= asked and feasible(trial):
            given = trial
        else:
            rising.discard(queue)
    return given


@pytest.mark.parametrize("seed", range(200))
def test_random_pinned_fleets_match_unit_by_unit_filling(seed: int) -> None:
    rng = random.Random(seed)
    clusters = {f"c{i}": rng.randint(0, 12) for i in range(rng.randint(1, 4))}
    queues = {f"q{i}": rng.randint(1, 3) for i in range(rng.randint(1, 5))}
    demand: dict[tuple[str, str], int] = {}
    for queue in queues:
        for where in clusters:
            if rng.random() < 0.6:
                demand[(queue, where)] = rng.randint(1, 12)
    # What queues hold already only steers the split, never the shares.
    targets = fair_targets(
        groups=[cluster(where, cpu) for where, cpu in clusters.items()],
        weights={q: float(w) for q, w in queues.items()},
        demands=[asks(q, where, amount, held=rng.randint(0, amount) * (rng.random() < 0.5))
                 for (q, where), amount in demand.items()],
    )
    # The model fills in twelfths of a cpu: a continuous answer is within half a cpu of it.
    fine = 12
    expected = _unit_filling({c: cpu * fine for c, cpu in clusters.items()}, queues,
                             {key: amount * fine for key, amount in demand.items()})
    for queue in queues:
        got = cpus(targets, queue) if queue in targets.queues else 0.0
        assert got == pytest.approx(expected[queue] / fine, abs=0.5), (seed, queue, targets)
    # Feasible: no cluster over its capacity, no queue over its demand there.
    for where, cpu in clusters.items():
        used = sum(cpus(targets, q, where) for q in targets.queues)
        assert used <= cpu + 1e-6
    for (q, where), amount in demand.items():
        assert cpus(targets, q, where) <= amount + 1e-6
    # Pareto: a cluster with room left has no queue that asks more there.
    for where, cpu in clusters.items():
        used = sum(cpus(targets, q, where) for q in targets.queues)
        if used < cpu - 1e-6:
            for (q, w), amount in demand.items():
                if w == where:
                    assert cpus(targets, q, where) >= amount - 1e-6, (seed, where, q)


def test_the_split_never_puts_more_in_a_cluster_than_is_asked_there() -> None:
    # p holds 3 in y (all it asks there) and asks 9 in x; q holds 5 in y, 3 in x, asks 4 more
    # in x. The split that keeps what they hold first must still respect each demand.
    targets = fair_targets(
        groups=[cluster("x", 4), cluster("y", 8)],
        weights={"p": 2.0, "q": 1.0},
        demands=[asks("p", "x", 9, held=1), asks("q", "x", 7, held=3),
                 asks("p", "y", 3, held=3), asks("q", "y", 5, held=5)],
    )
    assert cpus(targets, "p", "y") <= 3 + 1e-9
    assert cpus(targets, "p") == pytest.approx(7)
    assert cpus(targets, "q") == pytest.approx(5)


def test_a_queue_that_may_run_anywhere_is_split_in_proportion_to_what_it_asks() -> None:
    # Symmetric clusters, every queue asking alike in both: each target splits evenly, so the
    # round's order in each cluster is the same as over the pool.
    targets = fair_targets(
        groups=[cluster("A", 64), cluster("B", 64)],
        weights={"w1": 1.0, "w2": 2.0, "w4": 4.0},
        demands=[asks(q, c, 100) for q in ("w1", "w2", "w4") for c in "AB"],
    )
    for queue, total in (("w1", 128 / 7), ("w2", 256 / 7), ("w4", 512 / 7)):
        assert cpus(targets, queue) == pytest.approx(total)
        assert cpus(targets, queue, "A") == pytest.approx(total / 2)


@pytest.mark.parametrize("layered", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_a_max_flow_started_from_an_earlier_flow_is_a_max_flow(seed: int, layered: bool) -> None:
    """The filling keeps one network and changes only the queues' caps between max flows
    (`_FlowNetwork.set_capacity` cancels what flows beyond a lowered cap), and pushes along
    its layers first (`layer`): each answer, and who can still reach the sink, must be those
    of a plain network built afresh with those caps."""
    rng = random.Random(seed)
    queues, demands, groups = rng.randint(1, 6), rng.randint(1, 10), rng.randint(1, 4)
    owner = [rng.randrange(queues) for _ in range(demands)]
    asked = [rng.choice((0.5, 1.0, 2.0, 3.5)) for _ in range(demands)]
    usable = [rng.sample(range(groups), rng.randint(1, groups)) for _ in range(demands)]
    room = [rng.choice((1.0, 2.0, 4.0)) for _ in range(groups)]

    def build(caps: list[float]) -> tuple[_FlowNetwork, list[int]]:
        sink = 1 + queues + demands + groups
        net = _FlowNetwork(sink + 1)
        edges = [net.add(0, 1 + q, caps[q]) for q in range(queues)]
        for d in range(demands):
            net.add(1 + owner[d], 1 + queues + d, asked[d])
            for g in usable[d]:
                net.add(1 + queues + d, 1 + queues + demands + g, float("inf"))
        for g in range(groups):
            net.add(1 + queues + demands + g, sink, room[g])
        return net, edges

    kept, edges = build([0.0] * queues)
    if layered:
        kept.layer = [0] + [1] * queues + [2] * demands + [3] * groups + [4]
    for _ in range(8):
        caps = [rng.choice((0.0, 0.5, 1.0, 2.5, 6.0)) for _ in range(queues)]
        for edge, cap in zip(edges, caps, strict=True):
            kept.set_capacity(edge, cap)
        fresh, _ = build(caps)
        assert kept.max_flow(0, kept.size - 1) == pytest.approx(fresh.max_flow(0, fresh.size - 1))
        assert kept.reaching(kept.size - 1) == fresh.reaching(fresh.size - 1)
        assert kept.reachable_from(0) == fresh.reachable_from(0)
        for edge, cap in zip(edges, caps, strict=True):
            assert -1e-9 <= kept.flow_of(edge) <= cap + 1e-9


@pytest.mark.parametrize("seed", range(40))
def test_where_everything_fits_the_shortcut_gives_what_the_filling_would(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A part where every node group could take every demand that may use it is answered
    without max flows (`_Problem._everyone_fits`): the same targets, cluster by cluster, as
    the filling and split find."""
    rng = random.Random(seed)
    clusters = [f"c{i}" for i in range(rng.randint(1, 3))]
    groups = [cluster(where, 0.0, group=g) for where in clusters for g in ("gpu", "cpu")]
    demands = []
    for i in range(rng.randint(1, 6)):
        where = rng.choice(clusters)
        demands.append(asks(f"q{i % 3}", where, rng.choice((1.0, 2.5, 4.0)),
                            held=rng.choice((0.0, 1.0)),
                            groups=tuple(rng.sample(("gpu", "cpu"), rng.randint(1, 2)))))
    # Each group can take all that may ask it, and a little more.
    room = {(g.cluster, g.name): sum(d.amount[CPU] for d in demands if d.cluster == g.cluster
                                     and d.groups is not None and g.name in d.groups)
            for g in groups}
    groups = [cluster(g.cluster, room[(g.cluster, g.name)] + rng.choice((0.5, 3.0)),
                      group=g.name) for g in groups]
    weights = {f"q{i}": float(rng.randint(1, 3)) for i in range(3)}
    answers: list[bool] = []
    fits = _Problem._everyone_fits

    def spied(problem: _Problem) -> bool:
        answers.append(fits(problem))
        return answers[-1]

    monkeypatch.setattr(_Problem, "_everyone_fits", spied)
    _SOLVED.clear()
    fast = fair_targets(groups=groups, weights=weights, demands=demands)
    assert answers and all(answers)
    monkeypatch.setattr(_Problem, "_everyone_fits", lambda self: False)
    _SOLVED.clear()
    slow = fair_targets(groups=groups, weights=weights, demands=demands)
    _SOLVED.clear()
    assert set(fast.queues) == set(slow.queues)
    for name, target in slow.queues.items():
        assert fast.queues[name].share == pytest.approx(target.share, abs=1e-12)
        for where, share in target.cluster_shares.items():
            assert fast.queues[name].in_cluster(where) == pytest.approx(share, abs=1e-12)


def test_the_memo_keeps_only_the_last_call_s_parts() -> None:
    # At fleet scale the whole fleet is one part whose inputs change every round: a memo of
    # many calls held gigabytes of answers never asked for again.
    groups = [cluster("A", 10.0), cluster("B", 10.0)]
    weights = {"q1": 1.0, "q2": 1.0}
    for count in range(1, 30):
        fair_targets(groups=groups, weights=weights,
                     demands=[asks("q1", "A", float(count)), asks("q2", "B", 3.0)])
    assert len(_SOLVED) == 2  # the two clusters' parts of the last call
    again = fair_targets(groups=groups, weights=weights,
                         demands=[asks("q1", "A", 29.0), asks("q2", "B", 3.0)])
    assert again.queues["q1"].share > 0 and len(_SOLVED) == 2
