"""Settings shared by every service; each service subclasses with its own env prefix.

Why: a service must refuse to start with a typo in its configuration rather than silently run
with defaults, so unknown LOCKGATE_* variables under a service's prefix are an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import AliasChoices, BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class RetryPolicy(BaseModel):
    """Exponential backoff with jitter for retryable errors (dependency down, conflicts)."""

    initial_seconds: float = Field(default=0.2, gt=0)
    max_seconds: float = Field(default=10.0, gt=0)
    multiplier: float = Field(default=2.0, ge=1)
    max_attempts: int = Field(default=0, ge=0, description="0 retries forever")


class DependencyChecks(BaseModel):
    """How often each dependency (Kafka, Postgres, an apiserver) is probed, and how patiently.

    Unready within about `interval_seconds * failures_to_unready + timeout_seconds` of an outage;
    ready again at the first probe that succeeds.
    """

    interval_seconds: float = Field(default=2.0, gt=0, description="between two probes")
    timeout_seconds: float = Field(default=3.0, gt=0, description="one probe's time budget")
    failures_to_unready: int = Field(
        default=2, ge=1, description="consecutive failed probes before a ready dependency "
        "counts as down (one slow answer on a busy machine is not an outage)")
    summary_every_seconds: float = Field(
        default=30.0, gt=0, description="while a dependency is down, log one summary this often")


class ServiceSettings(BaseSettings):
    """Common settings. Subclasses set `model_config` with env_prefix, e.g. LOCKGATE_WATCHER_."""

    model_config = SettingsConfigDict(env_prefix="LOCKGATE_", env_nested_delimiter="__",
                                      extra="forbid", populate_by_name=True)
    service_name: ClassVar[str] = "lockgate"

    # Shared by every service (one Kafka, one Postgres, one tracing backend): read from
    # LOCKGATE_<NAME> whatever the service's own prefix is.
    kafka_bootstrap: str = Field(
        default="127.0.0.1:59092", description="Kafka bootstrap servers",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_BOOTSTRAP", "kafka_bootstrap"),
    )
    postgres_dsn: str = Field(
        default="postgresql://lockgate:lockgate@127.0.0.1:55432/lockgate",
        description="Postgres DSN",
        validation_alias=AliasChoices("LOCKGATE_POSTGRES_DSN", "postgres_dsn"),
    )
    otlp_endpoint: str | None = Field(
        default=None, description="OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318",
        validation_alias=AliasChoices("LOCKGATE_OTLP_ENDPOINT", "otlp_endpoint"),
    )
    trace_console: bool = Field(
        default=False, description="print spans to stderr",
        validation_alias=AliasChoices("LOCKGATE_TRACE_CONSOLE", "trace_console"),
    )
    log_level: str = Field(
        default="INFO", validation_alias=AliasChoices("LOCKGATE_LOG_LEVEL", "log_level")
    )
    # Per service, under the service's own prefix.
    http_host: str = Field(default="127.0.0.1", description="health/metrics bind address")
    http_port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port")
    shutdown_grace_seconds: float = Field(default=20.0, gt=0)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    dependency_checks: DependencyChecks = Field(default_factory=DependencyChecks)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_env(cls, data: Any) -> Any:
        prefix = str(cls.model_config.get("env_prefix") or "")
        if prefix and prefix != "LOCKGATE_":
            known = {name.upper() for name in cls.model_fields}
            unknown = sorted(
                key for key in os.environ
                if key.startswith(prefix) and key[len(prefix):].split("__")[0] not in known
            )
            if unknown:
                raise ValueError(f"unknown settings in the environment: {', '.join(unknown)}")
        return data



class ClusterServiceSettings(ServiceSettings):
    """Settings of a service that acts on Kubernetes clusters, each given by a kubeconfig file.

    At least one cluster, and every kubeconfig present: the service refuses to start rather
    than fail on its first call. Subclasses say what the clusters are for in `clusters_purpose`.
    """

    clusters_purpose: ClassVar[str] = "configured"

    clusters: dict[str, str] = Field(
        default_factory=dict,
        description='cluster name → kubeconfig path, e.g. {"cluster-a": "/etc/lockgate/a.yaml"}',
    )

    @field_validator("clusters")
    @classmethod
    def _clusters_with_kubeconfigs(cls, clusters: dict[str, str]) -> dict[str, str]:
        if not clusters:
            variable = f"{cls.model_config.get('env_prefix') or ''}CLUSTERS"
            raise ValueError(f"no clusters {cls.clusters_purpose}: "
                             f"set {variable}='{{\"<cluster>\": \"<kubeconfig path>\"}}'")
        missing = [f"{name}: {path}" for name, path in clusters.items()
                   if not Path(path).is_file()]
        if missing:
            raise ValueError(f"kubeconfig files not found: {', '.join(missing)}")
        return clusters
