"""The scheduler's index of pod groups (gangs), their reservations, and which groups timed out.

Why it exists: a group is released only when every member is there and all of them fit at
once (`lockgate.groups` says how a pod names its group). The state (`lockgate.scheduler.state`)
feeds `GroupIndex` every member change, so the round can ask in O(1) whether a group is complete
and which of its members are queued; the index also holds the reservation that keeps a cluster
for a group that waited long enough behind smaller pods, or that preemption made room for.

Elastic groups (docs/scheduling.md, "Elastic groups"): a group *has started* while any member
holds capacity. Until then its oldest `size` (its minimum) queued members are its *gang*,
released together or not at all; once started, each later member is released alone, like a
single pod, while fewer than its maximum hold capacity. Started is read from the members that
hold capacity, never remembered, so a new leader rebuilds it from the jobs alone; a group whose
every member ended starts over (its next minimum goes together again). A static group is the
case minimum = maximum = size, so a replacement member of a running static group is released
alone while the group is short, even after a sibling finished.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from lockgate.groups import GroupTimeoutAction

# (cluster, queue, group): a group's members share a cluster and a queue. Pods of one group
# name in different queues form different groups (each never fills up, and times out).
GroupKey = tuple[str, str, str]


class _Members:
    __slots__ = ("held", "most", "queued", "size")

    def __init__(self) -> None:
        self.queued: dict[str, float] = {}  # queued member job id -> created_at
        self.held = 0  # members holding capacity (released, running, ...)
        self.size = 0  # the largest size (minimum) any member names
        self.most = 0  # the largest maximum any member names (a static group's: its size)


@dataclass(frozen=True, slots=True)
class GroupStatus:
    key: GroupKey
    size: int  # released together: a static group's size, an elastic group's minimum
    queued: int
    held: int
    first_created_at: float  # the oldest queued member's creation (epoch seconds)
    last_created_at: float  # the newest queued member's creation
    max_size: int = 0  # the most members that may hold capacity at once (0: `size`)

    @property
    def complete(self) -> bool:
        """Every member is there: queued and already released members make up the size."""
        return self.queued + self.held >= self.size

    @property
    def started(self) -> bool:
        """Some member holds capacity: later members are released alone (see the module)."""
        return self.held > 0

    @property
    def at_max(self) -> bool:
        """As many members hold capacity as its maximum allows: later members wait."""
        return self.held >= (self.max_size or self.size)

    @property
    def below_minimum(self) -> bool:
        """It started, and members that ended left fewer than its minimum running."""
        return 0 < self.held < self.size


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
            created_at: float, max_size: int = 0) -> None:
        members = self._groups.get(key)
        if members is None:
            members = self._groups[key] = _Members()
        if queued:
            members.queued[job_id] = created_at
        else:
            members.held += 1
        members.size = max(members.size, size)
        members.most = max(members.most, max_size or size)

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
                           last_created_at=max(created), max_size=members.most)

    def summary(self, key: GroupKey) -> GroupStatus | None:
        """Its status even with no member queued (None: no member unfinished); the creation
        times are 0 then."""
        members = self._groups.get(key)
        if members is None:
            return None
        created = members.queued.values()
        return GroupStatus(key=key, size=members.size, queued=len(members.queued),
                           held=members.held, first_created_at=min(created, default=0.0),
                           last_created_at=max(created, default=0.0), max_size=members.most)

    def started(self, key: GroupKey) -> bool:
        """Whether a member holds capacity: the group's queued members go one at a time."""
        members = self._groups.get(key)
        return members is not None and members.held > 0

    def at_max(self, key: GroupKey) -> bool:
        """Whether as many members hold capacity as the group's maximum allows."""
        members = self._groups.get(key)
        return members is not None and members.held >= max(members.most, members.size)

    def gang(self, key: GroupKey) -> list[str]:
        """The queued members released together next, oldest first: a group that has not
        started releases its minimum at once (more members follow alone); a started group has
        no gang (empty)."""
        members = self._groups.get(key)
        if members is None or members.held > 0:
            return []
        return self.queued_members(key)[:members.size]

    def declared_max_size(self, key: GroupKey) -> int:
        """The largest maximum any of its members named (a static member's: its size)."""
        members = self._groups.get(key)
        return 0 if members is None else members.most

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
        if timeout is not None and not status.complete and not status.started and (
                now - status.first_created_at > timeout):
            late.append(status)
    return late


def describe_group(status: GroupStatus) -> str:
    """A group's state in a sentence, for explain and the Events of its members."""
    group = f"pod group {status.key[2]!r}"
    most = status.max_size or status.size
    bounds = (f"of {status.size}" if most == status.size
              else f"minimum {status.size}, maximum {most}")
    waiting = (f"; its {status.queued} queued members are released one at a time, as fair "
               f"share and room allow" if status.queued else "")
    if not status.started:
        return (f"{group} ({bounds}): {status.queued} of {status.size} members exist, none "
                f"released; its first {status.size} are released together or not at all")
    if status.below_minimum:
        return (f"{group} ({bounds}) runs below its minimum: {status.held} hold capacity "
                f"after members ended, and it keeps running{waiting}")
    if status.at_max:
        return (f"{group} ({bounds}) holds its maximum, {status.held} members"
                + (f"; {status.queued} wait until members end" if status.queued else ""))
    return f"{group} ({bounds}): {status.held} hold capacity{waiting}"


def timeout_message(status: GroupStatus, *, timeout: float, action: GroupTimeoutAction) -> str:
    what = "deleted" if action is GroupTimeoutAction.DELETE else "marked Failed"
    return (f"lockgate pod group {status.key[2]!r} in queue {status.key[1]!r} did not fill up "
            f"within {timeout:g}s: {status.queued + status.held} of {status.size} members "
            f"exist; its members are {what} (no member is released until all of them fit)")
