"""Pod groups (gangs): pods that are useless unless all of them run, released all or none.

Why it exists: Spark executors, MPI ranks or a training job's workers each hold capacity and do
nothing until every member of their group runs. Released one at a time, they would hold room
while waiting for the rest, and two half-released groups can deadlock a cluster. So a group is
released only when every member is there (its size is known) and all of them fit on nodes of
their origin cluster at the same time, in one round, and the round charges the group against
its queue's fair share as one unit. An *elastic* group (Spark dynamic allocation, Dask adaptive)
names a minimum instead: that many are released together, and once it runs, later members join
one at a time like single pods, up to its maximum (docs/scheduling.md, "Elastic groups").

This module holds how a pod names its group (`pod_group`, checked by the admission webhook and
read by the watcher) and what a queue does with a group that never fills up. The scheduler's side
(its index of members, the reservation that keeps a large group from starving behind small pods,
which groups timed out) is `lockgate.scheduler.groups`; the round, which places a whole group or
nothing, is `lockgate.scheduler.round`.

Accepted spellings (one group per pod):
- `lockgate.io/group` (label) with `lockgate.io/group-size` (annotation or label);
- Kueue's `kueue.x-k8s.io/pod-group-name` (label) with `kueue.x-k8s.io/pod-group-total-count`
  (annotation), so pods written for Kueue's plain-pod groups work unchanged;
- elastic: `lockgate.io/group` with `lockgate.io/group-min-size` and, optionally,
  `lockgate.io/group-max-size` (annotations or labels), never with a group size.
A group is named per namespace (two namespaces may both have a group "workers").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from lockgate.labels import DOMAIN, InvalidLabelError, validate_label_value

GROUP_LABEL = f"{DOMAIN}/group"
GROUP_SIZE_KEY = f"{DOMAIN}/group-size"  # an annotation (a label is accepted too)
# Elastic groups: released `min` together, then one member at a time up to `max` (annotations,
# labels accepted too). `group-size` is the static case, min = max = size.
GROUP_MIN_SIZE_KEY = f"{DOMAIN}/group-min-size"
GROUP_MAX_SIZE_KEY = f"{DOMAIN}/group-max-size"
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
    """A pod's group: `size` members are released together (the minimum of an elastic group);
    `max_size` is 0 for a static group (exactly `size`), else the most members an elastic group
    may hold at once (MAX_GROUP_SIZE when it named no maximum)."""

    name: str
    size: int
    max_size: int = 0

    @property
    def elastic(self) -> bool:
        return self.max_size != 0


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
    # An annotation or a label; both, differing, is an error rather than a silent choice.
    min_text = _one_of("group minimum",
                       (GROUP_MIN_SIZE_KEY, annotations.get(GROUP_MIN_SIZE_KEY)),
                       (GROUP_MIN_SIZE_KEY, labels.get(GROUP_MIN_SIZE_KEY)))
    max_text = _one_of("group maximum",
                       (GROUP_MAX_SIZE_KEY, annotations.get(GROUP_MAX_SIZE_KEY)),
                       (GROUP_MAX_SIZE_KEY, labels.get(GROUP_MAX_SIZE_KEY)))
    if name is None and size_text is None and min_text is None and max_text is None:
        return None
    if name is None:
        given = next(text for text in (size_text, min_text, max_text) if text is not None)
        raise InvalidPodGroupError(
            f"pod group {given[0]}={given[1]!r} without a group name: "
            f"add the label {GROUP_LABEL}=<name>, the same on every member")
    if size_text is not None and (min_text is not None or max_text is not None):
        other = min_text or max_text
        assert other is not None
        raise InvalidPodGroupError(
            f"pod group {name[1]!r}: {size_text[0]} (a static group) and {other[0]} (an "
            f"elastic group) together; give {size_text[0]} alone, or {GROUP_MIN_SIZE_KEY} "
            f"with an optional {GROUP_MAX_SIZE_KEY}")
    if size_text is None and min_text is None and max_text is not None:
        raise InvalidPodGroupError(
            f"pod group {name[1]!r}: {max_text[0]}={max_text[1]!r} without a minimum: add "
            f"{GROUP_MIN_SIZE_KEY}=<members released together>, the same on every member")
    if size_text is None and min_text is None:
        raise InvalidPodGroupError(
            f"pod group {name[1]!r} ({name[0]}) has no size: add the annotation "
            f"{GROUP_SIZE_KEY}=<number of pods in the group> (or {GROUP_MIN_SIZE_KEY}=<n> for "
            f"an elastic group), the same on every member")
    try:
        validate_label_value(name[0], name[1])
    except InvalidLabelError as error:
        raise InvalidPodGroupError(str(error)) from error
    if size_text is not None:
        return PodGroup(name=name[1], size=_count(name[1], *size_text))
    assert min_text is not None
    minimum = _count(name[1], *min_text)
    if max_text is None:
        return PodGroup(name=name[1], size=minimum, max_size=MAX_GROUP_SIZE)
    maximum = _count(name[1], *max_text)
    if maximum < minimum:
        raise InvalidPodGroupError(
            f"pod group {name[1]!r}: {GROUP_MAX_SIZE_KEY}={max_text[1]!r} is below "
            f"{GROUP_MIN_SIZE_KEY}={min_text[1]!r}; the maximum must be at least the minimum")
    return PodGroup(name=name[1], size=minimum, max_size=maximum)


def _count(group: str, key: str, text: str) -> int:
    """A member count: a whole number from 1 to MAX_GROUP_SIZE, written plainly."""
    try:
        size = int(text.strip())
    except ValueError:
        size = 0
        valid = False
    else:
        valid = str(size) == text.strip()
    if not valid or not 1 <= size <= MAX_GROUP_SIZE:
        raise InvalidPodGroupError(
            f"pod group {group!r}: {key}={text!r} is not a whole number from 1 to "
            f"{MAX_GROUP_SIZE}; give a number of pods, e.g. {key}=8")
    return size


def _one_of(what: str, *candidates: tuple[str, str | None]) -> tuple[str, str] | None:
    """The single value given under any of several keys; two different values are an error."""
    given = [(key, value) for key, value in candidates if value]
    if len({value for _, value in given}) > 1:
        spelled = ", ".join(f"{key}={value!r}" for key, value in given)
        raise InvalidPodGroupError(f"pod group: conflicting {what}s ({spelled}); give one")
    return given[0] if given else None
