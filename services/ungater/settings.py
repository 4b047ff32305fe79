"""The ungater's settings, from LOCKGATE_UNGATER_* variables."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from lockgate_adapters.settings import ClusterServiceSettings


class UngaterSettings(ClusterServiceSettings):
    """Which clusters this ungater serves, and how hard it tries before giving a release up.

    Consumer groups: commands for every cluster share one topic. An ungater reads all of them in
    the group `group_id` and skips commands for clusters it does not serve. The default group id
    names the served clusters (`ungater-cluster-a` for one cluster), so one ungater per cluster —
    or per set of clusters — each sees every command, while replicas serving the same set split
    the partitions. Served sets must not overlap (a shared cluster would be ungated twice, which
    is harmless but wasteful); a set served by no ungater has its commands never carried out.
    Pod notices are read the same way, in the group `<group>-notices`.
    """

    model_config = SettingsConfigDict(env_prefix="LOCKGATE_UNGATER_", env_nested_delimiter="__",
                                      extra="forbid")
    service_name: ClassVar[str] = "ungater"
    clusters_purpose: ClassVar[str] = "to serve"

    group_id: str | None = Field(
        default=None, description="Kafka consumer group; default ungater-<served clusters>"
    )
    max_in_flight_per_cluster: int = Field(
        default=64, ge=1, le=1024, description="concurrent apiserver calls per cluster"
    )
    give_up_after_seconds: float = Field(
        default=120.0, gt=0,
        description="retry an unreachable or throttling apiserver this long, then report failed",
    )
    request_timeout_seconds: float = Field(default=10.0, gt=0, description="per apiserver call")
    max_rereads: int = Field(
        default=5, ge=1, description="re-reads after a rejected patch before reporting failed"
    )
    dead_letter_value_bytes: int = Field(
        default=64 * 1024, ge=0, le=512 * 1024,
        description="most bytes of a bad message's value its dead letter keeps (JSON-encoded); "
        "beyond it only a prefix, the size and the sha256",
    )
    optimistic_first_patch: bool = Field(
        default=True,
        description="patch assuming lockgate's gate is the first one before reading the pod: "
        "one round trip in the common case; a wrong guess fails its test and falls back",
    )

    @property
    def consumer_group(self) -> str:
        return self.group_id or "ungater-" + "+".join(sorted(self.clusters))

    @property
    def notices_group(self) -> str:
        """The group for pod notices (Events on pods): the command group's name + `-notices`."""
        return f"{self.consumer_group}-notices"

    @property
    def jobsets_group(self) -> str:
        """The group for job-set commands (cancel: delete its pods): `<group>-jobsets`."""
        return f"{self.consumer_group}-jobsets"
