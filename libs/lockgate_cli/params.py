"""The argument types the commands share: durations, resource limits, pod and namespace names.

Why here: a usage error should read the same in every command and name the option it is about
(click does that, given a ParamType that fails with a message saying what to write).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from click.shell_completion import CompletionItem

from lockgate.durations import InvalidDurationError, parse_duration, whole_seconds
from lockgate.namespace_access import DEFAULT_ALLOWED_KINDS, InvalidKindError, parse_kind
from lockgate_cli.completing import complete_pod


class Duration(click.ParamType[float | int]):
    """Every duration flag: 20s, 5m, 2h, 1d, 1h30m or bare seconds (lockgate.durations, the
    grammar settings and annotations read too); `whole` rounds to whole seconds, `allow_zero`
    takes 0 (e.g. `--wait 0`: do not wait)."""

    name = "duration"

    def __init__(self, *, whole: bool = False, allow_zero: bool = False) -> None:
        self.whole = whole
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float | int:
        if isinstance(value, int | float):
            return value
        try:
            if self.whole:
                return whole_seconds(str(value))
            return parse_duration(str(value), allow_zero=self.allow_zero)
        except InvalidDurationError as error:
            self.fail(str(error), param, ctx)


class Limit(click.ParamType[tuple[str, str]]):
    """RESOURCE=QUANTITY, e.g. cpu=100 or memory=1Ti (the API checks the quantity)."""

    name = "resource=quantity"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        resource, sep, quantity = str(value).partition("=")
        if not sep or not resource.strip() or not quantity.strip():
            self.fail(f"takes RESOURCE=QUANTITY (e.g. cpu=100 or memory=1Ti), not {value!r}",
                      param, ctx)
        return resource.strip(), quantity.strip()


Completer = Callable[[click.Context, click.Parameter, str], list[CompletionItem]]


class Path3(click.ParamType[tuple[str, ...]]):
    """CLUSTER/NAMESPACE/POD (or another slash-separated name of `parts` parts); `complete`
    offers names to a shell."""

    def __init__(self, spelled: str, example: str, complete: Completer | None = None) -> None:
        self.name = spelled
        self.parts = spelled.count("/") + 1
        self.example = example
        self.complete = complete

    def shell_complete(self, ctx: click.Context, param: click.Parameter,
                       incomplete: str) -> list[CompletionItem]:
        return [] if self.complete is None else self.complete(ctx, param, incomplete)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        parts = tuple(str(value).split("/"))
        if len(parts) != self.parts or not all(parts):
            self.fail(f"takes {self.name} (e.g. {self.example}), not {value!r}", param, ctx)
        return parts


POD = Path3("CLUSTER/NAMESPACE/POD", "cluster-a/team-a/worker-0", complete=complete_pod)
NAMESPACE_REF = Path3("CLUSTER/NAME", "cluster-a/analytics-dask-0142-3f0c9a1e")


# Offered by shell completion after --allow-kind, --only-kind and --disallow-kind: the default
# kinds and those coordinators commonly add (a Dask operator's resources, Spark's, Ray's).
# Any other kind may be typed: completion only suggests.
COMMON_KINDS: tuple[str, ...] = (
    *DEFAULT_ALLOWED_KINDS, "secrets", "persistentvolumeclaims", "replicasets.apps",
    "cronjobs.batch", "poddisruptionbudgets.policy",
    "daskclusters.kubernetes.dask.org", "daskworkergroups.kubernetes.dask.org",
    "daskjobs.kubernetes.dask.org", "daskautoscalers.kubernetes.dask.org",
    "sparkapplications.sparkoperator.k8s.io", "rayclusters.ray.io", "rayjobs.ray.io",
)


class Kind(click.ParamType[str]):
    """A kind a queue's ephemeral namespaces may create: plural resource and API group
    (`pods`, `deployments.apps`); refused before anything is sent if the API would refuse it."""

    name = "kind"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        try:
            return parse_kind(str(value)).spelled
        except InvalidKindError as error:
            self.fail(str(error), param, ctx)

    def shell_complete(self, ctx: click.Context, param: click.Parameter,
                       incomplete: str) -> list[CompletionItem]:
        return [CompletionItem(kind) for kind in COMMON_KINDS if kind.startswith(incomplete)]
