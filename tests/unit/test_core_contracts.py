"""Resources, job states, labels, queues and events: the vocabulary all services share."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from lockgate.events import ALL_TOPICS, POD_EVENTS, RELEASE_COMMANDS, PodEvent, ReleaseCommand
from lockgate.jobs import JobState, advance, can_return_to_queue
from lockgate.labels import (
    InvalidLabelError,
    is_managed_namespace,
    resolve_label,
    validate_queue_name,
)
from lockgate.queues import QueueSpec
from lockgate.resources import InvalidQuantityError, Resources, canonical_amount

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("resource", "quantity", "want"),
    [
        ("cpu", "500m", 500),
        ("cpu", "2", 2000),
        ("cpu", "0.5", 500),
        ("cpu", "1.0001", 1001),  # rounds up: a fraction of a millicore still takes room
        ("memory", "1Gi", 2**30),
        ("memory", "1G", 10**9),
        ("memory", "128974848", 128974848),
        ("memory", "1.5Mi", 1572864),
        ("nvidia.com/gpu", "2", 2),
        ("memory", "1e3", 1000),
    ],
)
def test_canonical_amounts(resource: str, quantity: str, want: int) -> None:
    assert canonical_amount(resource, quantity) == want


@pytest.mark.parametrize("bad", ["", "abc", "1Qi", "--1", "1.2.3"])
def test_invalid_quantities_are_rejected_with_the_value(bad: str) -> None:
    with pytest.raises(InvalidQuantityError, match="invalid quantity"):
        canonical_amount("cpu", bad)


def test_resource_arithmetic_and_fit() -> None:
    node = Resources.from_kubernetes({"cpu": "4", "memory": "8Gi", "pods": "110"})
    pod = Resources.from_kubernetes({"cpu": "1500m", "memory": "1Gi"})
    left = node - pod - pod
    assert left["cpu"] == 1000 and left["memory"] == 6 * 2**30
    assert pod.fits_within(node)
    assert not pod.fits_within(left)
    assert Resources({"cpu": 0}) == Resources()  # zero amounts are absent, not distinct
    assert Resources.sum([pod, pod]) == pod + pod
    assert Resources({"gpu": 1}).fits_within(node) is False


@pytest.mark.parametrize(
    ("current", "observed", "want"),
    [
        (None, JobState.QUEUED, JobState.QUEUED),
        (JobState.QUEUED, JobState.RUNNING, JobState.RUNNING),  # missed the middle: jump ahead
        (JobState.RUNNING, JobState.QUEUED, JobState.RUNNING),  # stale event: ignored
        (JobState.BOUND, JobState.UNGATED, JobState.BOUND),
        (JobState.SUCCEEDED, JobState.DELETED, JobState.SUCCEEDED),  # terminal is final
        (JobState.DELETED, JobState.RUNNING, JobState.DELETED),
        (JobState.RELEASED, JobState.RELEASED, JobState.RELEASED),  # duplicate
        (JobState.RUNNING, JobState.FAILED, JobState.FAILED),
    ],
)
def test_states_only_move_forward(
    current: JobState | None, observed: JobState, want: JobState
) -> None:
    assert advance(current, observed) is want


def test_only_released_jobs_return_to_their_queue() -> None:
    assert can_return_to_queue(JobState.RELEASED)
    assert not any(can_return_to_queue(s) for s in JobState if s is not JobState.RELEASED)
    assert {s for s in JobState if s.holds_capacity} == {
        JobState.RELEASED, JobState.UNGATED, JobState.BOUND, JobState.RUNNING,
    }


def test_label_resolution_prefers_the_nearest_source() -> None:
    sources = [
        ("pod", {}),
        ("ReplicaSet/web-1", {"lockgate.io/queue": ""}),
        ("Deployment/web", {"lockgate.io/queue": "team-a"}),
        ("Namespace/ns", {"lockgate.io/queue": "team-b"}),
    ]
    assert resolve_label("lockgate.io/queue", sources) == ("team-a", "Deployment/web")
    assert resolve_label("lockgate.io/jobset", sources) is None
    with pytest.raises(InvalidLabelError, match="not a valid label value"):
        resolve_label("lockgate.io/queue", [("pod", {"lockgate.io/queue": "bad value!"})])


def test_managed_namespaces() -> None:
    assert is_managed_namespace("team", {"lockgate.io/managed": "true"})
    assert not is_managed_namespace("team", {"lockgate.io/managed": "false"})
    assert not is_managed_namespace("team", {})
    assert not is_managed_namespace("kube-system", {"lockgate.io/managed": "true"})


def test_queue_spec_validation() -> None:
    queue = QueueSpec(name="team-a", priority_factor=0.5, resource_limits={"cpu": "100"})
    assert queue.weight == 2.0
    assert queue.limits["cpu"] == 100_000
    with pytest.raises(ValidationError, match="queue name"):
        QueueSpec(name="Team_A")
    with pytest.raises(ValidationError, match="greater than 0"):
        QueueSpec(name="q", priority_factor=0)
    with pytest.raises(ValidationError, match="resource limit cpu"):
        QueueSpec(name="q", resource_limits={"cpu": "lots"})
    with pytest.raises(ValidationError, match="Extra inputs"):
        QueueSpec.model_validate({"name": "q", "weight": 3})
    with pytest.raises(InvalidLabelError):
        validate_queue_name("-q")


def _pod_event(**overrides: object) -> PodEvent:
    fields: dict[str, object] = {
        "event_id": "e1", "cluster": "cluster-a", "namespace": "ns", "name": "p", "uid": "u-1",
        "state": JobState.QUEUED, "queue": "q", "jobset": "js", "requests": {"cpu": 500},
        "created_at": NOW, "observed_at": NOW,
    }
    fields.update(overrides)
    return PodEvent.model_validate(fields)


def test_events_round_trip_and_are_keyed_for_per_pod_order() -> None:
    event = _pod_event()
    assert POD_EVENTS.decode(POD_EVENTS.encode(event)) == event
    assert POD_EVENTS.key_bytes(event) == b"u-1"
    command = ReleaseCommand(decision_id="d", cluster="cluster-b", namespace="ns", name="p",
                             uid="u-2", queue="q", decided_at=NOW)
    assert RELEASE_COMMANDS.key_bytes(command) == b"u-2"


def test_events_reject_unknown_versions_and_fields() -> None:
    payload = POD_EVENTS.encode(_pod_event()).replace(b'"v":1', b'"v":2')
    with pytest.raises(ValidationError):
        POD_EVENTS.decode(payload)
    with pytest.raises(ValidationError):
        _pod_event(surprise=True)
    with pytest.raises(ValidationError):
        POD_EVENTS.decode(b"not json")


def test_every_topic_is_versioned_and_unique() -> None:
    names = [t.name for t in ALL_TOPICS]
    assert len(names) == len(set(names))
    assert all(name.startswith("lockgate.") and name.endswith(".v1") for name in names)
    assert all(t.why for t in ALL_TOPICS)
