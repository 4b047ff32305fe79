"""`lockgate status --tree`: the leader's tree, each node under its parent (sshare -l)."""

from __future__ import annotations

import json
from typing import Any

from recorded_api import RecordedApi


def a_node(name: str, parent: str | None, depth: int, **fields: Any) -> dict[str, Any]:
    node = {"name": name, "path": name if parent is None else f"{parent}/{name}",
            "parent": parent, "depth": depth, "leaf": False, "weight": 1.0,
            "weight_among_siblings": 0.5, "guarantee": {}, "limit": {}, "fair_target": 0.25,
            "actual_share": 0.5, "demand_share": 1.0, "standing": "above",
            "decayed_usage": None}
    node.update(fields)
    return node


STATUS = {"at": "2026-12-07T16:00:00+00:00", "leader": {"instance_id": "x", "round": 3},
          "reasons_unavailable": None, "queues": [], "tree_problem": None, "tree": [
              a_node("production", None, 0, weight=2.0, weight_among_siblings=0.4,
                     guarantee={"cpu": "32"}, fair_target=0.4, actual_share=0.1,
                     standing="below"),
              a_node("research", None, 0, weight=3.0, weight_among_siblings=0.6),
              a_node("nlp", "research", 1), a_node("vision", "research", 1),
              a_node("alice", "vision", 2, path="research/vision/alice", leaf=True)]}


def test_the_tree_is_shown_depth_first_and_indented() -> None:
    recorded = RecordedApi().on("GET", "/api/v1/status", STATUS)
    lines = recorded.run("status", "--tree").out.splitlines()
    assert lines[0].split() == ["QUEUE", "WEIGHT", "OF-SIBLINGS", "GUARANTEE", "LIMIT",
                                "TARGET", "ACTUAL", "DEMAND", "STANDING", "DECAYED-USAGE"]
    assert [line[:12].rstrip() for line in lines[1:]] == [
        "production", "research", "  nlp", "  vision", "    alice"]
    assert lines[1].split() == ["production", "2", "40.0%", "cpu=32", "-", "40.0%", "10.0%",
                                "100.0%", "below", "-"]
    wide = recorded.run("status", "--tree", "-o", "wide").out.splitlines()
    assert wide[-1].split()[-1] == "research/vision/alice"
    body = json.loads(recorded.run("status", "--tree", "-o", "json").out)
    assert [node["name"] for node in body["tree"]] == [
        "production", "research", "nlp", "vision", "alice"]
    assert body["tree"][0]["decayed_usage"] is None


def test_without_a_leader_it_says_the_tree_is_the_leaders() -> None:
    recorded = RecordedApi().on("GET", "/api/v1/status", {
        **STATUS, "tree": None, "leader": None,
        "reasons_unavailable": "no scheduler leader answered"})
    ran = recorded.run("status", "--tree")
    assert "the tree is the scheduler leader's: no scheduler leader answered" in ran.out + ran.err


def test_plain_status_warns_when_the_tree_cannot_be_honoured() -> None:
    problem = ("the guarantees of the root's children ask for 150 cpu, more than the fleet "
               "(100): the guarantees are served as far as the fleet allows, deepest first")
    recorded = RecordedApi().on("GET", "/api/v1/status", {**STATUS, "tree_problem": problem})
    ran = recorded.run("status")
    assert f"warning: queue tree: {problem}" in ran.out + ran.err
    tree = recorded.run("status", "--tree")
    assert f"warning: {problem}" in tree.out + tree.err
