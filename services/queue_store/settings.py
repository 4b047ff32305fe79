"""queue-store's settings (env prefix LOCKGATE_QUEUE_STORE_)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from lockgate_adapters.admin_tokens import TokenConfigError, TokenEntry, parse_lines
from lockgate_adapters.settings import ServiceSettings


class CollectionSettings(BaseModel):
    """How ephemeral namespaces are collected (LOCKGATE_QUEUE_STORE_COLLECTION__*)."""

    interval_seconds: float = Field(
        default=2.0, gt=0, description="between two passes (triggers, then due steps); a "
        "command wakes the collector at once")
    check_after_seconds: float = Field(
        default=1.0, gt=0, description="after a deletion was accepted, when to look whether "
        "the namespace is gone (and again this often while it terminates)")
    finished_grace_seconds: float = Field(
        default=300.0, ge=0, description="a job set with no unfinished pods for this long is "
        "finished and its namespaces are collected")
    retry_initial_seconds: float = Field(default=1.0, gt=0,
                                         description="first backoff after a failed step")
    retry_max_seconds: float = Field(default=60.0, gt=0, description="longest backoff")
    request_timeout_seconds: float = Field(default=5.0, gt=0, description="per apiserver call")
    commands_group_id: str | None = Field(
        default=None, description="Kafka consumer group of the job-set and namespace commands; "
        "default <group_id>-commands")


class UiSettings(BaseModel):
    """The web UI at /ui/ on the admin API's port (LOCKGATE_QUEUE_STORE_UI__*; docs/web-ui.md)."""

    sample_seconds: float = Field(default=5.0, gt=0, le=3600,
                                  description="between two fairness samples")
    history_samples: int = Field(default=720, ge=1, le=100_000,
                                 description="fairness samples kept for the chart (in memory)")
    trace_url: str | None = Field(
        default=None, description="a pod's trace in your trace store, with {trace_id} in it, "
        "e.g. http://127.0.0.1:16686/trace/{trace_id} (Jaeger); unset: no link")
    traces_url: str | None = Field(
        default=None, description="the trace store's query API (Jaeger's, e.g. "
        "http://127.0.0.1:16686): the pod page draws the pod's trace from its "
        "GET /api/traces/{id}; unset: no waterfall")

    @field_validator("trace_url")
    @classmethod
    def _has_trace_id(cls, value: str | None) -> str | None:
        if value is not None and "{trace_id}" not in value:
            raise ValueError("trace_url must contain {trace_id}")
        return value


class QueueStoreSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LOCKGATE_QUEUE_STORE_",
                                      env_nested_delimiter="__", extra="forbid")
    service_name: ClassVar[str] = "queue-store"

    # Consuming
    group_id: str = Field(default="queue-store", description="Kafka consumer group")
    clusters: list[str] = Field(
        default_factory=list,
        description='the clusters of this installation (its watcher\'s), e.g. ["cluster-a", '
        '"cluster-b"]: events of any other cluster are counted and skipped, never stored '
        "(lockgate.installation); empty: every cluster's events are stored")
    max_batch: int = Field(default=2000, gt=0, le=50_000,
                           description="most messages folded into one transaction")
    poll_timeout_ms: int = Field(default=100, gt=0, description="wait for a batch to fill")
    pod_events_linger_ms: int = Field(
        default=5, ge=0, le=1000,
        description="pod events: while they keep coming (the last batch stored less than 4x "
        "this ago), wait this long once after a poll for more, so a stream of events is "
        "stored in fewer transactions; a lone pod's event is stored at once")
    outcomes_linger_ms: int = Field(
        default=25, ge=0, le=1000,
        description="release outcomes: after a poll that found some, wait this long once for "
        "more, so a trickle of outcomes is stored in fewer transactions (off the release "
        "latency path: the watcher reports the same gate removal)")
    postgres_pool_size: int = Field(default=6, ge=2, le=50)
    dead_letter_value_bytes: int = Field(
        default=64 * 1024, ge=0, le=512 * 1024,
        description="most bytes of a bad message's value its dead letter keeps (JSON-encoded); "
        "beyond it only a prefix, the size and the sha256",
    )
    place_grace_seconds: float = Field(
        default=600.0, ge=0, le=86_400,
        description="how long the place in line of a pod deleted while queued waits for a "
        "replacement doing the same work (lockgate.places; docs/pending-pods.md, \"Waits that "
        "clients survive\"); 0 keeps no places",
    )

    # Admin API (queues, job views), for the `lockgate` CLI
    admin_host: str = Field(default="127.0.0.1", description="admin API bind address")
    admin_port: int = Field(default=58080, ge=0, le=65535, description="0 picks a free port")
    admin_tokens_file: Path | None = Field(
        default=None, description="file of token lines '<name> <role> sha256:<hex>' "
                                  "(roles read-only, admin); see docs/security.md")
    admin_tokens: list[str] = Field(
        default_factory=list, description="more token lines, as a JSON list (e.g. from a Secret)")

    @model_validator(mode="after")
    def _admin_tokens_usable(self) -> QueueStoreSettings:
        self.admin_token_entries()  # a bad line or a missing file stops the start, with its reason
        return self

    def admin_token_entries(self) -> list[TokenEntry]:
        """Every configured token; at least one, since the admin API refuses anonymous calls."""
        entries = parse_lines(self.admin_tokens, source="LOCKGATE_QUEUE_STORE_ADMIN_TOKENS")
        if self.admin_tokens_file is not None:
            try:
                text = self.admin_tokens_file.read_text()
            except OSError as error:
                raise TokenConfigError(f"cannot read the admin tokens file: {error}") from error
            entries += parse_lines(text.splitlines(), source=str(self.admin_tokens_file))
        if not entries:
            raise TokenConfigError(
                "the admin API needs at least one token: set "
                "LOCKGATE_QUEUE_STORE_ADMIN_TOKENS_FILE or LOCKGATE_QUEUE_STORE_ADMIN_TOKENS "
                "(mint one with `lockgate token new`)")
        names = [e.name for e in entries]
        if len(set(names)) != len(names):
            raise TokenConfigError(f"admin token names used twice: "
                                   f"{sorted({n for n in names if names.count(n) > 1})}")
        return entries

    ui: UiSettings = Field(default_factory=UiSettings)

    # Copies of the queues in every worker cluster (Queue objects, read by the webhook there)
    queue_sync_clusters: dict[str, str] = Field(
        default_factory=dict,
        description='cluster name -> kubeconfig of the identity that writes Queue objects, e.g. '
        '{"cluster-a": "/etc/lockgate/queue-sync-a.yaml"}; empty: no copies are kept')
    queue_sync_source: str = Field(
        default="lockgate", pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
        description="value of label lockgate.io/queue-source on this installation's Queue "
                    "objects; only objects with it are changed or deleted")
    queue_sync_name_prefix: str = Field(
        default="", pattern=r"^([a-z0-9][-a-z0-9.]{0,80})?$",
        description="prefix of the Queue objects' names (lets test runs share a cluster)")
    queue_sync_resync_seconds: float = Field(
        default=30.0, gt=0, description="full pass even without a change notification")
    queue_sync_settle_seconds: float = Field(
        default=10.0, ge=0,
        description="how long a queue or namespace change waits, before it is answered, for "
                    "the copies to hold it (so a pod created next is judged by it); 0: no wait")

    # Collecting ephemeral namespaces (docs/ARCHITECTURE.md, "Ephemeral namespaces"), as the
    # namespace-keeper identity of `namespace_clusters`; a record of a cluster not listed there
    # waits, failed, until it is.
    collection: CollectionSettings = Field(default_factory=CollectionSettings)
    # Whom `lockgate status`, `lockgate explain` and the web UI ask why pods wait: the
    # fair-scheduler leader's picture of its last round (queue_store.leader).
    scheduler_urls: list[str] = Field(
        default_factory=list, description="base URLs of the fair-scheduler instances' HTTP "
        "servers (LOCKGATE_SCHEDULER_HTTP_PORT), e.g. [\"http://fair-scheduler:8080\"]: the "
        "one leading answers status, explain and the UI's reasons. Empty, or none leading: "
        "Postgres's counts and places, with the reasons unavailable")
    scheduler_timeout_seconds: float = Field(
        default=2.0, gt=0, le=60, description="per request to a fair-scheduler instance: a "
        "frozen leader slows a page by at most this")

    @property
    def commands_group(self) -> str:
        return self.collection.commands_group_id or f"{self.group_id}-commands"

    @field_validator("queue_sync_clusters", "namespace_clusters")
    @classmethod
    def _kubeconfigs_exist(cls, clusters: dict[str, str]) -> dict[str, str]:
        missing = [f"{name}: {path}" for name, path in clusters.items()
                   if not Path(path).is_file()]
        if missing:
            raise ValueError(f"kubeconfig files not found: {', '.join(missing)}")
        return clusters

    # Ephemeral namespaces (queue_store.namespaces): made as lockgate-namespace-keeper
    namespace_clusters: dict[str, str] = Field(
        default_factory=dict,
        description='cluster name -> kubeconfig of the lockgate-namespace-keeper identity, e.g. '
        '{"cluster-a": "/etc/lockgate/namespace-keeper-a.yaml"}; empty: no ephemeral namespaces')
    namespace_labels: dict[str, str] = Field(
        default_factory=dict,
        description="more labels on every ephemeral namespace (e.g. what the webhook "
                    "registration's namespaceSelector needs beyond lockgate.io/managed)")
    namespace_name_prefix: str = Field(
        default="", pattern=r"^([a-z0-9][-a-z0-9]{0,20})?$",
        description="prefix of ephemeral namespace names (lets test runs share a cluster)")
    coordinator_token_seconds: int = Field(
        default=8 * 3600, ge=600, le=7 * 86400,
        description="lifetime of a coordinator token (also at most the namespace's TTL)")
    coordinator_create_any: bool = Field(
        default=True,
        description="true: the coordinator's Role may create any kind and the admission policy "
                    "lockgate-allowed-kinds refuses those not allowed, naming the queue and its "
                    "kinds; false: RBAC alone refuses them (the apiserver's generic message)")
    namespace_resync_seconds: float = Field(
        default=30.0, gt=0, description="full Role reconciliation even without a change")
