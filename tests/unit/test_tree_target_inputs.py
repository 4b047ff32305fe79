"""The state's fair targets divide by a queue tree once told one (`use_queue_tree`), both when
the round solves them and when a worker process does (`target_problem`), and go back to
today's flat targets when told None."""

from __future__ import annotations

import pickle

import pytest
from builders import a_job, a_node, a_state

from lockgate.queue_tree import QueueTree, TreeNode
from lockgate.scheduler import SchedulerState


def organisation_state() -> SchedulerState:
    return (
        a_state()
        .with_queues("alice", "bob", "production")
        .with_cluster("A", a_node(cpu="25", memory="100Gi").times(4, prefix="a"))
        .with_jobs(a_job("alice").in_cluster("A").times(100),
                   a_job("bob").in_cluster("A").times(100),
                   a_job("production").in_cluster("A").times(100))
        .build()
    )


def cpu(state: SchedulerState) -> dict[str, float]:
    targets = state.fair_targets()
    return {name: round(target.clusters["A"]["cpu"] / 1000, 6)
            for name, target in targets.queues.items()}


def test_the_targets_follow_the_tree_and_back() -> None:
    state = organisation_state()
    flat = cpu(state)
    assert flat == pytest.approx({"alice": 33.333333, "bob": 33.333333, "production": 33.333333})
    tree = QueueTree.build([
        TreeNode("research", weight=3), TreeNode("alice", parent="research"),
        TreeNode("bob", parent="research"),
        # Canonical units: cpu in millicores.
        TreeNode("production", weight=1, guarantee={"cpu": 32_000})])
    state.use_queue_tree(tree)
    assert cpu(state) == pytest.approx({"alice": 34.0, "bob": 34.0, "production": 32.0})
    problem, _ = state.target_problem()
    solved = pickle.loads(pickle.dumps(problem)).solve()  # as the worker process would
    assert {name: t.share for name, t in solved.queues.items()} == pytest.approx(
        {"alice": 0.34, "bob": 0.34, "production": 0.32})
    assert solved.node_shares["research"] == pytest.approx(0.68)
    state.use_queue_tree(None)
    assert cpu(state) == flat
