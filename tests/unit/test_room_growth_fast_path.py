"""`ClusterRoom.place` in an autoscaled cluster: the room index's fast path (taken when a shape
may land on every real node) picks the node a plain first-fit walk of the real nodes picks, with
the virtual nodes (`lockgate.growth`) sorted among the real ones and never chosen by `place`."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from builders import a_job, a_node, a_state

from lockgate.events import ClusterGrowth, NodePoolStatus
from lockgate.placement import Requirement
from lockgate.scheduler.room import ClusterRoom

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
KWOK_4X16 = (Requirement(key="karpenter.kwok.sh/instance-cpu", operator="In", values=("4",)),
             Requirement(key="karpenter.kwok.sh/instance-memory", operator="In",
                         values=("16Gi",)))


@pytest.mark.parametrize("seed", range(10))
def test_place_with_the_index_takes_the_node_a_walk_of_the_real_nodes_takes(seed: int) -> None:
    rng = random.Random(seed)
    # Names before and after "growth:..." so that the virtual nodes sit between real ones.
    nodes = {f"{prefix}-{i}": a_node(cpu=str(rng.choice((2, 4))), memory="16Gi").build()
             for prefix in ("a", "z") for i in range(rng.randint(2, 8))}
    jobs = [a_job(f"j{i}").in_cluster("b").requesting(cpu=str(rng.choice((1, 2))),
                                                       memory="1Gi").build()
            for i in range(12)]
    state = (a_state().with_queues("q").with_cluster("b", nodes).with_jobs(jobs).build())
    state.set_growth("b", ClusterGrowth(cluster="b", observed_at=T0, autoscaled=True, node_pools=[
        NodePoolStatus(name="default", limits={"cpu": 16_000}, in_use={},
                       requirements=KWOK_4X16)]))
    record = state.cluster_records["b"]
    indexed = ClusterRoom(record, state.fairness_inverse())
    walked = ClusterRoom(record, state.fairness_inverse())
    indexed._room_index()  # as once a cluster has holds: `place` then walks the index
    assert record.virtual_order and len(record.order) > record.real_nodes
    assert any(p < v for v in record.virtual_order for p in range(len(record.order))
               if not record.virtual_at[p]) and any(
        p > v for v in record.virtual_order for p in range(len(record.order))
        if not record.virtual_at[p])
    shapes = [state.job_records[job.job_id].shape for job in jobs] * 8
    rng.shuffle(shapes)
    placed_indexed = [indexed.place(shape) for shape in shapes]
    placed_walked = [walked.place(shape) for shape in shapes]
    assert walked.room_index is None  # it walked `order`, as before the index
    assert placed_indexed == placed_walked
    assert -1 in placed_walked  # the real nodes filled up: the walk was not trivial
    assert not any(node >= 0 and record.virtual_at[node] for node in placed_indexed)
    assert indexed.free == walked.free
