"""The state's index of jobs bound to a node (`SchedulerState.bound_jobs`), which preemption's
plan reads instead of passing over every job: it follows every change of a job that adds or
takes away its allocation (the autouse fixture in conftest.py also checks it against a recount
after each operation, `lockgate.scheduler.invariants`)."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest
from builders import a_job, a_node, a_state

from lockgate.jobs import JobState
from lockgate.scheduler import SchedJob, SchedulerState
from lockgate.scheduler.invariants import check_invariants
from lockgate.scheduler.records import JobRecord


def _state() -> SchedulerState:
    return (a_state().with_queues("a", "b")
            .with_cluster("cluster-a", a_node(cpu="4", memory="8Gi").times(2))
            .with_cluster("cluster-b", a_node(cpu="4", memory="8Gi").times(1))
            .build())


def _ids(state: SchedulerState, cluster: str) -> dict[str, set[str]]:
    return {node: set(on_node) for node, on_node in state.bound_jobs(cluster).items()}


def test_bound_jobs_are_indexed_per_cluster_and_node_and_others_are_not() -> None:
    running_1 = a_job("a").running_on("node-1").build()
    bound_2 = a_job("b").running_on("node-2").in_state(JobState.BOUND).build()
    ungated_2 = a_job("b").running_on("node-2").in_state(JobState.UNGATED).build()
    elsewhere = a_job("a").in_cluster("cluster-b").running_on("node-1").build()
    queued = a_job("a").build()
    released = a_job("a").released().build()
    state = _state()
    state.upsert_jobs([running_1, bound_2, ungated_2, elsewhere, queued, released])

    assert _ids(state, "cluster-a") == {"node-1": {running_1.job_id},
                                        "node-2": {bound_2.job_id, ungated_2.job_id}}
    assert _ids(state, "cluster-b") == {"node-1": {elsewhere.job_id}}
    assert _ids(state, "cluster-c") == {}
    # The state's own records, not copies: the plan reads the jobs through them.
    assert state.bound_jobs("cluster-a")["node-1"][running_1.job_id] is (
        state.job_records[running_1.job_id])
    # A released job without a node is held unbound in its cluster, not indexed.
    assert released.job_id in state.cluster_records["cluster-a"].held_unbound


def test_binding_moving_ending_and_removing_a_job_update_the_index() -> None:
    state = _state()
    job = a_job("a").released().build()
    other = a_job("a").running_on("node-1").build()
    state.upsert_jobs([job, other])
    assert _ids(state, "cluster-a") == {"node-1": {other.job_id}}

    state.upsert_job(_as(job, JobState.BOUND, "node-2"))  # it binds
    assert _ids(state, "cluster-a") == {"node-1": {other.job_id}, "node-2": {job.job_id}}

    state.upsert_job(_as(job, JobState.RUNNING, "node-1"))  # reported on another node
    assert _ids(state, "cluster-a") == {"node-1": {other.job_id, job.job_id}}

    state.upsert_job(_as(job, JobState.QUEUED, None))  # queued again (evicted and recreated)
    assert _ids(state, "cluster-a") == {"node-1": {other.job_id}}

    state.upsert_job(_as(job, JobState.RUNNING, "node-2"))
    state.upsert_job(_as(job, JobState.SUCCEEDED, "node-2"))  # it ends: it leaves the state
    assert _ids(state, "cluster-a") == {"node-1": {other.job_id}}

    state.remove_job(other.job_id)
    assert _ids(state, "cluster-a") == {}  # no empty node or cluster is left behind


def test_a_release_taken_back_through_the_rounds_transaction_leaves_the_index_as_it_was() -> None:
    state = _state()
    running = a_job("a").running_on("node-1").build()
    queued = a_job("b").build()
    state.upsert_jobs([running, queued])
    before = _ids(state, "cluster-a")

    transaction = state.begin_round()
    transaction.release(queued.job_id, state.job_records[queued.job_id], "node-2")
    assert _ids(state, "cluster-a") == before  # released, not bound yet
    transaction.take_back([queued.job_id])
    transaction.commit()

    assert state.job_records[queued.job_id].state is JobState.QUEUED
    assert _ids(state, "cluster-a") == before


def test_a_release_that_binds_before_the_commit_stays_indexed() -> None:
    state = _state()
    queued = a_job("b").build()
    state.upsert_job(queued)

    transaction = state.begin_round()
    transaction.release(queued.job_id, state.job_records[queued.job_id], "node-2")
    state.upsert_job(_as(queued, JobState.BOUND, "node-2"))  # the change is the job's own
    assert transaction.commit(kept=()) == [queued.job_id]

    assert _ids(state, "cluster-a") == {"node-2": {queued.job_id}}


def test_an_index_that_missed_a_change_is_named() -> None:
    state = _state()
    job = a_job("a").running_on("node-1").build()
    state.upsert_job(job)
    check_invariants(state)
    on_node = cast(dict[str, JobRecord], state.bound_jobs("cluster-a")["node-1"])
    del on_node[job.job_id]  # a slip: the job is bound, the index lost it
    with pytest.raises(AssertionError, match="cluster 'cluster-a''s index of bound jobs"):
        check_invariants(state)


def _as(job: SchedJob, state: JobState, node: str | None) -> SchedJob:
    """The same job, reported in another state (on another node)."""
    return replace(job, state=state, node_name=node)
