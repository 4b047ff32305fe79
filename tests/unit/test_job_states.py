"""What each job state says of its pod, in the words explain and the UI print (issue 38: "not
waiting: the pod is succeeded")."""

from __future__ import annotations

import pytest

from lockgate.jobs import JobState


@pytest.mark.parametrize(("state", "words"), [
    (JobState.SUCCEEDED, "the pod succeeded"), (JobState.FAILED, "the pod failed"),
    (JobState.DELETED, "the pod was deleted"), (JobState.CANCELLED, "the pod was cancelled"),
    (JobState.RUNNING, "the pod is running"), (JobState.BOUND, "the pod is bound to a node"),
])
def test_a_state_reads_as_english(state: JobState, words: str) -> None:
    assert state.of_the_pod == words


def test_every_state_has_its_words() -> None:
    assert all(state.of_the_pod.startswith("the pod ") for state in JobState)
