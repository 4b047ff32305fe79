"""The queue tree as status --tree and explain say it (lockgate.scheduler.tree_status): every
level's target and actual share add up from the leaves, and explain names the level that holds
a pod back."""

from __future__ import annotations

import pytest
from builders import a_job, a_node, a_state

from lockgate.queues import QueueSpec
from lockgate.scheduler.explain import Explainer, WaitReason
from lockgate.scheduler.tree_status import TreeNodeStatus, holding_level, tree_statuses


def spec(name: str, **fields: object) -> QueueSpec:
    return QueueSpec.model_validate({"name": name, **fields})


ORGANISATION = [spec("research", priority_factor=1 / 3), spec("vision", parent="research"),
                spec("alice", parent="vision"), spec("bob", parent="vision"),
                spec("nlp", parent="research"), spec("carol", parent="nlp"),
                spec("production", priority_factor=0.5, guarantee={"cpu": "32"})]


def node(name: str, parent: str | None, target: float, actual: float,
         demand: float = 1.0) -> TreeNodeStatus:
    return TreeNodeStatus(name=name, path=name, parent=parent, depth=0, leaf=False, weight=1.0,
                          weight_among_siblings=0.5, guarantee={}, limit={},
                          fair_target=target, actual_share=actual, demand_share=demand)


def test_the_issues_sentence() -> None:
    nodes = {n.name: n for n in [
        node("research", None, 0.6, 0.9), node("production", None, 0.4, 0.1),
        node("vision", "research", 0.3, 0.2), node("nlp", "research", 0.3, 0.7),
        node("alice", "vision", 0.15, 0.15), node("bob", "vision", 0.15, 0.05)]}
    assert holding_level(nodes, "alice") == (
        "queue alice is at its share of vision; vision is below its share of research, but "
        "research is above its share of the root, and production is owed this room")


def test_no_level_holds_back_a_branch_below_its_share_everywhere() -> None:
    nodes = {n.name: n for n in [node("research", None, 0.6, 0.1),
                                 node("alice", "research", 0.6, 0.1)]}
    assert holding_level(nodes, "alice").endswith("no level of its branch holds it back")
    assert holding_level(nodes, "nobody") == ""


def organisation_state():  # type: ignore[no-untyped-def]
    state = (a_state().with_cluster("A", a_node(cpu="25", memory="100Gi").times(4, prefix="a"))
             .with_jobs(*(a_job(leaf).in_cluster("A").times(100)
                          for leaf in ("alice", "bob", "carol", "production")))
             .build())
    for queue in ORGANISATION:
        state.upsert_queue(queue)
    state.refresh_queue_tree()
    return state


def test_every_level_adds_up_from_its_leaves() -> None:
    state = organisation_state()
    statuses = {n.name: n for n in tree_statuses(state)}
    assert [n.name for n in tree_statuses(state)][:2] == ["production", "research"]
    targets = {name: n.fair_target for name, n in statuses.items()}
    assert targets == pytest.approx({"production": 0.4, "research": 0.6, "nlp": 0.3,
                                     "vision": 0.3, "alice": 0.15, "bob": 0.15, "carol": 0.3})
    assert statuses["alice"].path == "research/vision/alice"
    assert statuses["production"].guarantee == {"cpu": "32"}
    assert statuses["research"].weight_among_siblings == pytest.approx(0.6)
    assert all(n.actual_share == 0 and n.standing == "below" for n in statuses.values())
    assert statuses["vision"].demand_share == pytest.approx(
        statuses["alice"].demand_share + statuses["bob"].demand_share)
    assert statuses["research"].decayed_usage is None


def test_explain_names_the_level_in_the_tree() -> None:
    # One node of 100 cpu, full: alice holds her 15 (her target), bob 5 of his 15, carol 70
    # of her 30, production 10 of its 40; bob and production ask for more. alice's next pod
    # waits: she is at her share of vision, vision below its share of research, research
    # above its share of the root, and production is owed the room.
    running = {"alice": 15, "bob": 5, "carol": 70, "production": 10}
    state = (a_state().with_cluster("A", a_node(cpu="100", memory="400Gi").times(1, prefix="a"))
             .with_jobs(*(job for leaf, count in running.items() for job in
                          a_job(leaf).in_cluster("A").requesting(cpu="1").running_on("a-1")
                          .times(count)),
                        a_job("alice").in_cluster("A").requesting(cpu="1").named("waiting")
                        .build(),
                        *a_job("bob").in_cluster("A").requesting(cpu="1").times(20),
                        *a_job("production").in_cluster("A").requesting(cpu="1").times(50))
             .build())
    for queue in ORGANISATION:
        state.upsert_queue(queue)
    state.refresh_queue_tree()
    explanation = Explainer(state, now=0.0).explain("waiting")
    assert explanation is not None
    assert explanation.reason in (WaitReason.FAIR_SHARE, WaitReason.CLUSTER_ROOM)
    assert explanation.tree == (
        "queue alice is at its share of vision; vision is below its share of research, but "
        "research is above its share of the root, and production is owed this room")
    assert "in the queue tree, queue alice is at its share of vision" in explanation.message
