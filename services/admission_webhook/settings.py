"""Settings of the admission webhook (env prefix LOCKGATE_WEBHOOK_)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from lockgate_adapters.settings import ServiceSettings

# The kubeconfig "path" that means: use the pod's service account.
IN_CLUSTER = "in-cluster"


class WebhookSettings(ServiceSettings):
    """Where the webhook listens, which clusters it registers in, and its time budgets."""

    model_config = SettingsConfigDict(env_prefix="LOCKGATE_WEBHOOK_", env_nested_delimiter="__",
                                      extra="forbid")
    service_name: ClassVar[str] = "admission-webhook"

    # Serving: HTTPS on loopback, because the apiservers run beside it.
    host: str = Field(default="127.0.0.1", description="HTTPS bind address")
    port: int = Field(default=58443, ge=0, le=65535, description="HTTPS port; 0 picks a free one")
    cert_dir: Path = Field(
        default=Path("~/.cache/lockgate/webhook-certs").expanduser(),
        description="where the CA and serving certificate are kept (regenerated when expiring)",
    )
    cert_hosts: list[str] = Field(default_factory=lambda: ["127.0.0.1", "localhost"],
                                  description="names and IPs the serving certificate covers")

    # Clusters and registration.
    clusters: dict[str, str] = Field(
        default_factory=dict,
        description='cluster name -> kubeconfig path, e.g. {"cluster-a": "/path/kubeconfig"}, '
        f'or "{IN_CLUSTER}" for the service account of a webhook running inside the cluster',
    )
    register_in_clusters: bool = Field(default=True, description="create or update the webhook "
                           "configuration in every cluster at start")
    configuration_name: str = Field(default="lockgate",
                                    description="name of the MutatingWebhookConfiguration")
    url_host: str = Field(default="127.0.0.1",
                          description="host the apiservers use to reach this webhook")
    service: str | None = Field(
        default=None, pattern=r"^[a-z0-9-]+/[a-z0-9-]+$",
        description="namespace/name of the Service in front of this webhook when it runs inside "
        "the cluster; registered instead of a URL on url_host",
    )
    extra_namespace_labels: dict[str, str] = Field(
        default_factory=dict,
        description="labels a namespace must carry besides lockgate.io/managed=true for the "
        "apiserver to call this instance (isolates test instances sharing a cluster)",
    )
    unregister_on_shutdown: bool = Field(
        default=False,
        description="delete the registration on a graceful stop. Only for local, single-replica "
                    "runs (demo, tests): in production a rolling restart must stay fail-closed, "
                    "or pods created meanwhile would bypass the queue")
    reregister_interval_seconds: float = Field(
        default=300.0, gt=0, description="how often the registration is re-asserted")

    # Time budgets: every review is answered well within the apiserver's timeout.
    apiserver_timeout_seconds: int = Field(default=5, ge=1, le=30,
                                           description="timeoutSeconds of the registration")
    answer_within_seconds: float = Field(
        default=3.5, gt=0, description="after this a review is refused as unverifiable")
    queue_check_timeout_seconds: float = Field(default=1.5, gt=0)
    kube_lookup_timeout_seconds: float = Field(
        default=1.0, gt=0, description="per read of a namespace or owner")
    queue_cache_ttl_seconds: float = Field(
        default=5.0, gt=0, description="an open queue is trusted from cache this long")
    namespace_cache_ttl_seconds: float = Field(default=2.0, ge=0)
    owner_cache_ttl_seconds: float = Field(default=2.0, ge=0)
    max_owner_depth: int = Field(default=5, ge=1, le=20)

    @model_validator(mode="after")
    def _answer_before_the_apiserver_gives_up(self) -> WebhookSettings:
        if self.answer_within_seconds >= self.apiserver_timeout_seconds:
            raise ValueError("answer_within_seconds must be below apiserver_timeout_seconds")
        for name in self.clusters:
            if not name or "/" in name:
                raise ValueError(f"cluster name {name!r} cannot be part of a URL path")
        return self
