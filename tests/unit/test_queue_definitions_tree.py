"""Queue definitions as a tree (QueueSpec's parent, guarantee and resource_limits): what the
admin API refuses, and the state rebuilding its tree from the definitions it is given (None,
today's flat path, while every queue is a child of the root without a guarantee)."""

from __future__ import annotations

import pytest
from builders import a_job, a_node, a_state

from lockgate.queue_tree import (
    QueueTreeError,
    check_queue_definitions,
    scheduling_tree,
    tree_node_of,
)
from lockgate.queues import QueueSpec


def spec(name: str, **fields: object) -> QueueSpec:
    return QueueSpec.model_validate({"name": name, **fields})


def organisation() -> list[QueueSpec]:
    return [spec("research", priority_factor=1 / 3), spec("vision", parent="research"),
            spec("alice", parent="vision"), spec("bob", parent="vision"),
            spec("nlp", parent="research"), spec("carol", parent="nlp"),
            spec("production", priority_factor=0.5, guarantee={"cpu": "32"},
                 resource_limits={"cpu": "64"})]


def test_a_spec_is_a_tree_node_in_canonical_units() -> None:
    node = tree_node_of(organisation()[-1])
    assert (node.name, node.parent, node.weight) == ("production", None, 2.0)
    assert node.guarantee == {"cpu": 32_000.0}
    assert node.limit == {"cpu": 64_000.0}
    assert tree_node_of(spec("flat")).limit is None


def test_the_spec_refuses_bad_fields() -> None:
    with pytest.raises(ValueError, match="guarantee cpu"):
        spec("a", guarantee={"cpu": "lots"})
    with pytest.raises(ValueError, match="own parent"):
        spec("a", parent="a")
    with pytest.raises(ValueError):
        spec("a", parent="Not/A/Name")


def test_the_organisation_is_a_tree_with_paths() -> None:
    tree = check_queue_definitions(organisation())
    assert tree.path("alice") == "research/vision/alice"
    assert tree.leaves == ["alice", "bob", "carol", "production"]


@pytest.mark.parametrize(("change", "message"), [
    (lambda qs: [*qs, spec("dave", parent="nobody")], "parent 'nobody' is not defined"),
    (lambda qs: [q if q.name != "research" else spec("research", parent="alice")
                 for q in qs], "cycle"),
    (lambda qs: [q if q.name != "vision" else spec(
        "vision", parent="research", namespaces=[{"names": ["vision-team"]}]) for q in qs],
     "only a leaf holds pods"),
    (lambda qs: [*qs, spec("sub", parent="production", guarantee={"cpu": "40"})],
     "ask for 40 cpu, more than 'production''s guarantee \\(32\\)"),
    (lambda qs: [q if q.name != "production" else spec(
        "production", guarantee={"cpu": "80"}, resource_limits={"cpu": "64"}) for q in qs],
     "below its guarantee"),
])
def test_what_the_admin_api_refuses(change: object, message: str) -> None:
    with pytest.raises(QueueTreeError, match=message):
        check_queue_definitions(change(organisation()))  # type: ignore[operator]


def test_a_queue_with_pods_cannot_become_a_parent() -> None:
    with pytest.raises(QueueTreeError, match="'carol' has unfinished pods"):
        check_queue_definitions([*organisation(), spec("erin", parent="carol")],
                                queues_with_pods={"carol"})
    check_queue_definitions(organisation(), queues_with_pods={"carol", "alice"})


def test_guarantees_fit_in_the_fleet_when_it_is_known() -> None:
    with pytest.raises(QueueTreeError, match="the fleet"):
        check_queue_definitions(organisation(), fleet={"cpu": 16_000.0})
    check_queue_definitions(organisation(), fleet={"cpu": 100_000.0})


def test_flat_queues_keep_todays_path() -> None:
    assert scheduling_tree([spec("a"), spec("b", priority_factor=0.5),
                            spec("c", resource_limits={"cpu": "4"})]) is None
    assert scheduling_tree([spec("a"), spec("b", guarantee={"cpu": "1"})]) is not None
    assert scheduling_tree(organisation()) is not None


def organisation_state():  # type: ignore[no-untyped-def]
    return (a_state().with_cluster("A", a_node(cpu="25", memory="100Gi").times(4, prefix="a"))
            .with_jobs(*(a_job(leaf).in_cluster("A").times(100)
                         for leaf in ("alice", "bob", "carol", "production")))
            .build())


def cpu_targets(state) -> dict[str, float]:  # type: ignore[no-untyped-def]
    return {name: round(target.clusters["A"]["cpu"] / 1000, 6)
            for name, target in state.fair_targets().queues.items()}


def test_the_state_divides_by_the_tree_its_definitions_make() -> None:
    state = organisation_state()
    for queue in organisation():
        state.upsert_queue(queue)
    assert state.refresh_queue_tree()
    assert state.queue_tree is not None
    # The docs' table (docs/scheduling.md, "Hierarchical fair targets"): production asks.
    assert cpu_targets(state) == pytest.approx(
        {"alice": 15, "bob": 15, "carol": 30, "production": 40})
    assert not state.refresh_queue_tree()  # nothing changed: nothing rebuilt
    assert state.queue_tree_problem() is None
    # Back to flat: every queue a child of the root without a guarantee.
    for queue in organisation():
        state.upsert_queue(spec(queue.name))
    assert state.refresh_queue_tree()
    assert state.queue_tree is None
    assert cpu_targets(state) == pytest.approx(
        {"alice": 25, "bob": 25, "carol": 25, "production": 25})


def test_the_state_says_when_guarantees_exceed_the_fleet() -> None:
    state = organisation_state()
    for queue in organisation():
        state.upsert_queue(queue if queue.name != "production" else spec(
            "production", priority_factor=0.5, guarantee={"cpu": "150"}))
    state.refresh_queue_tree()
    problem = state.queue_tree_problem()
    assert problem is not None
    assert "ask for 150 cpu, more than the fleet (100)" in problem


def test_definitions_that_are_no_tree_fall_back_to_weights_and_say_so() -> None:
    state = organisation_state()
    for queue in organisation():
        state.upsert_queue(queue)
    state.upsert_queue(spec("research", parent="alice"))  # past the admin API: a cycle
    state.refresh_queue_tree()
    assert state.queue_tree is None
    problem = state.queue_tree_problem()
    assert problem is not None and "cycle" in problem
