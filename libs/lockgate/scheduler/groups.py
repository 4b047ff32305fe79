"""The scheduler's index of pod groups (gangs), their reservations, and which groups timed out.

Why it exists: a group is released only when every member is there and all of them fit at
once (`lockgate.groups` says how a pod names its group). The state (`lockgate.scheduler.state`)
feeds `GroupIndex` every member change, so the round can ask in O(1) whether a group is complete
and which of its members are queued; the index also holds the reservation that keeps a cluster
for a group that waited long enough behind smaller pods, or that preemption made room for.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from lockgate.groups import GroupTimeoutAction

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
    group is released or gone (see `lockgate.scheduler.round` and docs/scheduling.md, "Gangs").
    The round reserves for a group that aged; `lockgate.scheduler.preemption` for one it planned
    room for.
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

    def keys(self) -> list[GroupKey]:
        """Every group with a member still unfinished."""
        return list(self._groups)

    def held(self, key: GroupKey) -> int:
        """How many of its members hold capacity (released, running, ...)."""
        members = self._groups.get(key)
        return 0 if members is None else members.held

    def declared_size(self, key: GroupKey) -> int:
        """The largest size any of its members named (0: no such group)."""
        members = self._groups.get(key)
        return 0 if members is None else members.size

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
