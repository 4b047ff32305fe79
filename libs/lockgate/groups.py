"""Pod groups (gangs): pods that are useless unless all of them run, released all or none.

Why it exists: Spark executors, MPI ranks or a training job's workers each hold capacity and do
nothing until every member of their group runs. Released one at a time, they would hold room
while waiting for the rest, and two half-released groups can deadlock a cluster. So a group is
released only when every member is there (its size is known) and all of them fit on nodes of
their origin cluster at the same time, in one round, and the round charges the group against
its queue's fair share as one unit.

This module holds what is pure about groups: how a pod names its group (`pod_group`, checked by
the admission webhook and read by the watcher), the scheduler state's index of members
(`GroupIndex`, fed by `lockgate.scheduling`), the reservation that keeps a large group from
starving behind small pods, and which groups timed out (`timed_out`). The round itself, which
places a whole group or nothing, is in `lockgate.fairness`.

Accepted spellings (one group per pod):
- `lockgate.io/group` (label) with `lockgate.io/group-size` (annotation or label);
- Kueue's `kueue.x-k8s.io/pod-group-name` (label) with `kueue.x-k8s.io/pod-group-total-count`
  (annotation), so pods written for Kueue's plain-pod groups work unchanged.
A group is named per namespace (two namespaces may both have a group "workers").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum

from lockgate.labels import DOMAIN, InvalidLabelError, validate_label_value

GROUP_LABEL = f"{DOMAIN}/group"
GROUP_SIZE_KEY = f"{DOMAIN}/group-size"  # an annotation (a label is accepted too)
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# Larger gangs exist nowhere we know of; a typo (80000 for 8) would otherwise wait forever.
MAX_GROUP_SIZE = 10_000


class InvalidPodGroupError(ValueError):
    """A pod's group name or size that lockgate cannot honour; the message says what to fix."""


class GroupTimeoutAction(StrEnum):
    """What becomes of the members of a group that did not fill up in time (per queue)."""

    DELETE = "delete"  # delete the pods; a controller may create a new, gated set
    FAIL = "fail"  # mark the pods Failed (status), so a Job counts the failure and backs off


@dataclass(frozen=True, slots=True)
class PodGroup:
    name: str
    size: int


def pod_group(labels: Mapping[str, str], annotations: Mapping[str, str]) -> PodGroup | None:
    """The group a pod belongs to, None if it names none; raises InvalidPodGroupError."""
    name = _one_of(
        "group name",
        (GROUP_LABEL, labels.get(GROUP_LABEL)),
        (KUEUE_GROUP_LABEL, labels.get(KUEUE_GROUP_LABEL)),
    )
    size_text = _one_of(
        "group size",
        (GROUP_SIZE_KEY, annotations.get(GROUP_SIZE_KEY) or labels.get(GROUP_SIZE_KEY)),
        (KUEUE_TOTAL_ANNOTATION, annotations.get(KUEUE_TOTAL_ANNOTATION)),
    )
    if name is None and size_text is None:
        return None
    if name is None:
        assert size_text is not None
        raise InvalidPodGroupError(
            f"pod group size {size_text[1]!r} ({size_text[0]}) without a group name: "
            f"add the label {GROUP_LABEL}=<name>, the same on every member")
    if size_text is None:
        raise InvalidPodGroupError(
            f"pod group {name[1]!r} ({name[0]}) has no size: add the annotation "
            f"{GROUP_SIZE_KEY}=<number of pods in the group>, the same on every member")
    try:
        validate_label_value(name[0], name[1])
    except InvalidLabelError as error:
        raise InvalidPodGroupError(str(error)) from error
    key, text = size_text
    try:
        size = int(text.strip())
    except ValueError:
        size = 0
        valid = False
    else:
        valid = str(size) == text.strip()
    if not valid or not 1 <= size <= MAX_GROUP_SIZE:
        raise InvalidPodGroupError(
            f"pod group {name[1]!r}: {key}={text!r} is not a whole number from 1 to "
            f"{MAX_GROUP_SIZE}; give the number of pods in the group, e.g. {key}=8")
    return PodGroup(name=name[1], size=size)


def _one_of(what: str, *candidates: tuple[str, str | None]) -> tuple[str, str] | None:
    """The single value given under any of several keys; two different values are an error."""
    given = [(key, value) for key, value in candidates if value]
    if len({value for _, value in given}) > 1:
        spelled = ", ".join(f"{key}={value!r}" for key, value in given)
        raise InvalidPodGroupError(f"pod group: conflicting {what}s ({spelled}); give one")
    return given[0] if given else None


# (cluster, queue, group): a group's members share a cluster and a queue. Pods of one group
# name in different queues form different groups (each never fills up, and times out).
GroupKey = tuple[str, str, str]


class _Members:
    __slots__ = ("held", "queued", "size")

    def __init__(self) -> None:
        self.queued: dict[str, float] = {}  # queued member job id -> created_at
        self.held = 0  # members holding capacity (released, running, ...)
        self.size = 0  # the largest size any member names


@dataclass(frozen=True, slots=True)
class GroupStatus:
    key: GroupKey
    size: int
    queued: int
    held: int
    first_created_at: float  # the oldest queued member's creation (epoch seconds)
    last_created_at: float  # the newest queued member's creation

    @property
    def complete(self) -> bool:
        """Every member is there: queued and already released members make up the size."""
        return self.queued + self.held >= self.size


class GroupIndex:
    """Unfinished members of every group, kept current by `SchedulerState` change by change.

    Also holds the reservations: a cluster reserved for a group releases nothing else until the
    group is released or gone (see `lockgate.fairness` and docs/scheduling.md, "Gangs"). The
    round reserves for a group that aged; `lockgate.preemption` for one it planned room for.
    """

    def __init__(self) -> None:
        self._groups: dict[GroupKey, _Members] = {}
        self.reserved: dict[str, GroupKey] = {}  # cluster -> the group it is reserved for

    def add(self, key: GroupKey, job_id: str, *, size: int, queued: bool,
            created_at: float) -> None:
        members = self._groups.get(key)
        if members is None:
            members = self._groups[key] = _Members()
        if queued:
            members.queued[job_id] = created_at
        else:
            members.held += 1
        members.size = max(members.size, size)

    def remove(self, key: GroupKey, job_id: str, *, queued: bool) -> None:
        members = self._groups.get(key)
        if members is None:
            return
        if queued:
            members.queued.pop(job_id, None)
        else:
            members.held -= 1
        if not members.queued and members.held <= 0:
            del self._groups[key]
            if self.reserved.get(key[0]) == key:
                del self.reserved[key[0]]

    def queued_members(self, key: GroupKey) -> list[str]:
        members = self._groups.get(key)
        return [] if members is None else sorted(members.queued, key=members.queued.__getitem__)

    def status(self, key: GroupKey) -> GroupStatus | None:
        members = self._groups.get(key)
        if members is None or not members.queued:
            return None
        created = members.queued.values()
        return GroupStatus(key=key, size=members.size, queued=len(members.queued),
                           held=members.held, first_created_at=min(created),
                           last_created_at=max(created))

    def waiting(self) -> Iterator[GroupStatus]:
        """Every group with members still queued."""
        for key in list(self._groups):
            status = self.status(key)
            if status is not None:
                yield status

    def __len__(self) -> int:
        return len(self._groups)


def timed_out(index: GroupIndex, *, now: float,
              timeout_of: Mapping[str, float | None]) -> list[GroupStatus]:
    """Incomplete groups whose oldest queued member waited longer than its queue's timeout.

    `timeout_of` maps a queue to its group timeout in seconds (None or absent: never). Counted
    from the oldest queued member's creation, so the answer depends only on the pods, not on
    when a scheduler started leading.
    """
    late: list[GroupStatus] = []
    for status in index.waiting():
        timeout = timeout_of.get(status.key[1])
        if timeout is not None and not status.complete and (
                now - status.first_created_at > timeout):
            late.append(status)
    return late


def timeout_message(status: GroupStatus, *, timeout: float, action: GroupTimeoutAction) -> str:
    what = "deleted" if action is GroupTimeoutAction.DELETE else "marked Failed"
    return (f"lockgate pod group {status.key[2]!r} in queue {status.key[1]!r} did not fill up "
            f"within {timeout:g}s: {status.queued + status.held} of {status.size} members "
            f"exist; its members are {what} (no member is released until all of them fit)")
