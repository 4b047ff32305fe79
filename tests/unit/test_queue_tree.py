"""The queue tree's model and validation (lockgate.queue_tree, issue 36 item 1): every rule
refuses what breaks it with an error naming the node, and a valid tree reads as it was built."""

from __future__ import annotations

import pytest

from lockgate.queue_tree import QueueTree, QueueTreeError, TreeNode


def organisation() -> list[TreeNode]:
    return [TreeNode("research", weight=3, guarantee={"cpu": 40}),
            TreeNode("production", weight=2, guarantee={"cpu": 32}, limit={"cpu": 80}),
            TreeNode("vision", parent="research", guarantee={"cpu": 20}),
            TreeNode("nlp", parent="research"),
            TreeNode("alice", parent="vision"), TreeNode("bob", parent="vision"),
            TreeNode("carol", parent="nlp")]


def test_a_valid_tree_reads_as_built() -> None:
    tree = QueueTree.build(organisation(), fleet={"cpu": 100})
    assert tree.leaves == ["alice", "bob", "carol", "production"]
    assert tree.children(None) == ["production", "research"]
    assert tree.children("vision") == ["alice", "bob"]
    assert tree.path("alice") == "research/vision/alice"
    assert tree.ancestors("carol") == ["nlp", "research"]
    assert tree.depth("alice") == 2 and tree.depth("production") == 0
    assert tree.leaves_under("research") == ["alice", "bob", "carol"]
    assert tree.names.index("research") < tree.names.index("vision") < tree.names.index("bob")
    assert not tree.is_flat
    tree.require_leaf("alice")
    with pytest.raises(QueueTreeError, match="'vision' has child queues"):
        tree.require_leaf("vision")
    with pytest.raises(QueueTreeError, match="not defined"):
        tree.require_leaf("nobody")


def test_flat_queues_are_the_roots_children() -> None:
    tree = QueueTree.flat({"a": 1.0, "b": 2.0})
    assert tree.is_flat and tree.leaves == ["a", "b"] and tree.children(None) == ["a", "b"]
    assert tree.node("b").weight == 2.0 and tree.path("b") == "b"


@pytest.mark.parametrize(("nodes", "message"), [
    ([TreeNode("a"), TreeNode("a")], "defined twice"),
    ([TreeNode("a", parent="ghost")], "its parent 'ghost' is not defined"),
    ([TreeNode("a", parent="b"), TreeNode("b", parent="a")], "cycle: a -> b -> a"),
    ([TreeNode("a", parent="a")], "cycle: a -> a"),
    ([TreeNode("a", weight=0)], "weight must be positive"),
    ([TreeNode("A/b")], "is invalid"),
    ([TreeNode("a", guarantee={"cpu": 10}, limit={"cpu": 5})],
     "its limit of cpu \\(5\\) is below its guarantee \\(10\\)"),
    ([TreeNode("a", guarantee={"cpu": -1})], "guarantee of cpu must not be negative"),
    ([TreeNode("p", guarantee={"cpu": 10}), TreeNode("x", parent="p", guarantee={"cpu": 6}),
      TreeNode("y", parent="p", guarantee={"cpu": 6})],
     "guarantees of the children of 'p' ask for 12 cpu, more than 'p'.s guarantee \\(10\\)"),
    ([TreeNode("p", guarantee={"cpu": 10}), TreeNode("x", parent="p", guarantee={"gpu": 1})],
     "ask for 1 gpu, more than 'p'.s guarantee \\(0\\)"),
    ([TreeNode("p", limit={"cpu": 4}), TreeNode("x", parent="p", guarantee={"cpu": 6})],
     "more than 'p'.s limit \\(4\\)"),
    ([TreeNode("a", guarantee={"cpu": 60}), TreeNode("b", guarantee={"cpu": 50})],
     "the root's children ask for 110 cpu, more than the fleet \\(100\\)"),
    # Guarantees deep under unguaranteed nodes still have to fit in the fleet.
    ([TreeNode("p"), TreeNode("x", parent="p", guarantee={"cpu": 70}),
      TreeNode("y", parent="p", guarantee={"cpu": 70})],
     "the root's children ask for 140 cpu, more than the fleet"),
])
def test_a_tree_that_cannot_be_honoured_is_refused(nodes: list[TreeNode], message: str) -> None:
    with pytest.raises(QueueTreeError, match=message):
        QueueTree.build(nodes, fleet={"cpu": 100})


def test_with_weights_replaces_weights_and_refuses_nonpositive_ones() -> None:
    tree = QueueTree.build(organisation())
    heavier = tree.with_weights({"nlp": 5.0})
    assert heavier.node("nlp").weight == 5.0 and tree.node("nlp").weight == 1.0
    assert heavier.path("carol") == "research/nlp/carol"
    with pytest.raises(QueueTreeError, match="weight must be positive"):
        tree.with_weights({"nlp": 0.0})
