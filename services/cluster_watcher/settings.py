"""cluster-watcher's settings, from LOCKGATE_WATCHER_* variables."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from lockgate_adapters.settings import ClusterServiceSettings


class WatcherSettings(ClusterServiceSettings):
    """Which clusters to watch, how long one watch request lasts, and how events are batched."""

    model_config = SettingsConfigDict(env_prefix="LOCKGATE_WATCHER_", env_nested_delimiter="__",
                                      extra="forbid")
    service_name: ClassVar[str] = "cluster-watcher"
    clusters_purpose: ClassVar[str] = "to watch"

    # Clusters: `clusters` (name → kubeconfig) comes from ClusterServiceSettings.
    watch_timeout_seconds: int = Field(
        default=300, ge=1,
        description="server-side length of one watch request; the next resumes where it ended",
    )
    list_page_size: int = Field(default=500, ge=1, description="objects per page when listing")
    pod_audit_seconds: float = Field(
        default=0.0, ge=0,
        description="every this many seconds, list the cluster's pods and report, with a "
        "warning, those of lockgate's that the watch never reported although it had passed "
        "their version (a skipped watch event leaves a pod gated forever otherwise); 0: never. "
        "Each audit is a full list of the cluster's pods, in pages",
    )
    skipped_gate_resend_seconds: float = Field(
        default=60.0, ge=0,
        description="every this many seconds, publish again the events of unfinished pods that "
        "skipped lockgate's gate (lockgate.observing), so one whose queue binds its namespace "
        "only after it started is counted then, not at its end; 0: never",
    )
    namespace_labels: dict[str, str] = Field(
        default_factory=dict,
        description='labels a namespace must carry besides lockgate.io/managed=true for its '
        'pods to be this installation\'s jobs, e.g. {"lockgate.io/run": "staging"}, when '
        "installations share a cluster (each webhook registered for its own label); empty: "
        "the managed label alone")

    # Capacity
    capacity_min_interval_seconds: float = Field(
        default=0.5, ge=0,
        description="at most one ClusterCapacity per cluster this often: changes are coalesced",
    )
    capacity_refresh_seconds: float = Field(
        default=30.0, gt=0,
        description="publish ClusterCapacity this often even when nothing changed",
    )

    # Growth: what each cluster's autoscaler (Karpenter's NodePools and NodeClaims) may add
    growth_min_interval_seconds: float = Field(
        default=1.0, ge=0,
        description="at most one ClusterGrowth per cluster this often: changes are coalesced",
    )
    growth_refresh_seconds: float = Field(
        default=30.0, gt=0,
        description="publish an autoscaled cluster's ClusterGrowth this often even when nothing "
        "changed",
    )
    growth_recheck_seconds: float = Field(
        default=60.0, gt=0,
        description="in a cluster that serves no NodePool kind (no Karpenter), or forbids the "
        "watcher to list it, look again this often: a Karpenter installed later is noticed",
    )

    # Publishing
    publish_batch_size: int = Field(
        default=5000, ge=1, description="events handed to the Kafka producer at once"
    )
    max_pending_events: int = Field(
        default=100_000, ge=1,
        description="events waiting for Kafka before watching pauses (Kafka down or slow)",
    )
    kafka_send_timeout_seconds: float = Field(
        default=15.0, gt=0, description="a batch not acknowledged by then is sent again"
    )
