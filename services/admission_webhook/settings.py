"""Settings of the admission webhook (env prefix LOCKGATE_WEBHOOK_)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from lockgate_adapters.settings import ServiceSettings

# The kubeconfig "path" that means: use the pod's service account.
IN_CLUSTER = "in-cluster"


class WebhookSettings(ServiceSettings):
    """Where the webhook listens, which clusters it serves, and its time budgets.

    No database settings and no registration: queues come from the cluster's Queue objects, and
    the MutatingWebhookConfiguration is static (k8s/base), applied by whoever installs lockgate.
    """

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
    tls_dir: Path | None = Field(
        default=None,
        description="a mounted kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt), e.g. "
                    "cert-manager's: served as is and reloaded when it changes, never written. "
                    "Required inside a cluster; unset, a CA is minted into cert_dir (local runs)")
    cert_hosts: list[str] = Field(default_factory=lambda: ["127.0.0.1", "localhost"],
                                  description="names and IPs the serving certificate covers")

    # Clusters, and the copy of the queues in each.
    clusters: dict[str, str] = Field(
        default_factory=dict,
        description='cluster name -> kubeconfig path, e.g. {"cluster-a": "/path/kubeconfig"}, '
        f'or "{IN_CLUSTER}" for the service account of a webhook running inside the cluster',
    )
    queue_source: str = Field(
        default="lockgate",
        description="read the Queue objects labelled lockgate.io/queue-source=<this> (the "
                    "queue-store's LOCKGATE_QUEUE_STORE_QUEUE_SYNC_SOURCE)")
    queue_watch_timeout_seconds: int = Field(
        default=300, ge=10, description="server-side timeout of one watch of Queue objects")

    # Time budgets: every review is answered well within the apiserver's timeout.
    apiserver_timeout_seconds: int = Field(
        default=5, ge=1, le=30,
        description="timeoutSeconds of the MutatingWebhookConfiguration (k8s/base)")
    answer_within_seconds: float = Field(
        default=3.5, gt=0, description="after this a review is refused as unverifiable")
    kube_lookup_timeout_seconds: float = Field(
        default=1.0, gt=0, description="per read of a namespace or owner")
    namespace_cache_ttl_seconds: float = Field(default=2.0, ge=0)
    namespace_stale_seconds: float = Field(
        default=30.0, ge=0,
        description="when reading a namespace again fails (the apiserver too busy to answer "
                    "within kube_lookup_timeout_seconds), labels read at most this long before "
                    "that say it is managed are used (its pods are gated either way); labels "
                    "saying it is not managed are never used stale; 0: refuse at once")
    owner_cache_ttl_seconds: float = Field(default=2.0, ge=0)
    max_owner_depth: int = Field(default=5, ge=1, le=20)

    @model_validator(mode="before")
    @classmethod
    def _no_database(cls, data: Any) -> Any:
        # The webhook reads queues from its own cluster; a DSN given to it is a leftover
        # credential, refused so it is removed rather than kept around unused.
        if os.environ.get("LOCKGATE_WEBHOOK_POSTGRES_DSN"):
            raise ValueError("LOCKGATE_WEBHOOK_POSTGRES_DSN: the webhook needs no database "
                             "(it reads Queue objects from its cluster); remove it")
        return data

    @model_validator(mode="after")
    def _answer_before_the_apiserver_gives_up(self) -> WebhookSettings:
        if self.answer_within_seconds >= self.apiserver_timeout_seconds:
            raise ValueError("answer_within_seconds must be below apiserver_timeout_seconds")
        for name in self.clusters:
            if not name or "/" in name:
                raise ValueError(f"cluster name {name!r} cannot be part of a URL path")
        return self
