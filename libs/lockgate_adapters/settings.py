"""Settings shared by every service; each service subclasses with its own env prefix.

Why: a service must refuse to start with a typo in its configuration rather than silently run
with defaults, so unknown LOCKGATE_* variables under a service's prefix are an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from pydantic import AliasChoices, BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class RetryPolicy(BaseModel):
    """Exponential backoff with jitter for retryable errors (dependency down, conflicts)."""

    initial_seconds: float = Field(default=0.2, gt=0)
    max_seconds: float = Field(default=10.0, gt=0)
    multiplier: float = Field(default=2.0, ge=1)
    max_attempts: int = Field(default=0, ge=0, description="0 retries forever")


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
    # Postgres TLS and credentials, folded into postgres_dsn (libpq's parameter names, which
    # asyncpg reads from the DSN); a parameter already in the DSN is kept unless set here.
    postgres_sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca",
                              "verify-full"] | None = Field(
        default=None, description="TLS to Postgres; verify-full in production",
        validation_alias=AliasChoices("LOCKGATE_POSTGRES_SSLMODE", "postgres_sslmode"),
    )
    postgres_sslrootcert: Path | None = Field(
        default=None, description="CA bundle that signed the Postgres server's certificate",
        validation_alias=AliasChoices("LOCKGATE_POSTGRES_SSLROOTCERT", "postgres_sslrootcert"),
    )
    postgres_sslcert: Path | None = Field(
        default=None, description="client certificate (for Postgres `cert` authentication)",
        validation_alias=AliasChoices("LOCKGATE_POSTGRES_SSLCERT", "postgres_sslcert"),
    )
    postgres_sslkey: Path | None = Field(
        default=None, description="the client certificate's key",
        validation_alias=AliasChoices("LOCKGATE_POSTGRES_SSLKEY", "postgres_sslkey"),
    )
    postgres_password_file: Path | None = Field(
        default=None, description="file holding the password of the DSN's user (a mounted "
                                  "Secret), so the password is not in the environment",
        validation_alias=AliasChoices("LOCKGATE_POSTGRES_PASSWORD_FILE",
                                      "postgres_password_file"),
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

    @model_validator(mode="after")
    def _postgres_connection_options(self) -> ServiceSettings:
        password = None
        if self.postgres_password_file is not None:
            try:
                password = self.postgres_password_file.read_text().strip()
            except OSError as error:
                raise ValueError(f"cannot read the Postgres password file: {error}") from error
        params = {name: str(value) for name, value in (
            ("sslmode", self.postgres_sslmode), ("sslrootcert", self.postgres_sslrootcert),
            ("sslcert", self.postgres_sslcert), ("sslkey", self.postgres_sslkey),
        ) if value is not None}
        missing = [f"{name}: {path}" for name, path in params.items()
                   if name != "sslmode" and not Path(path).is_file()]
        if missing:
            raise ValueError(f"Postgres TLS files not found: {', '.join(missing)}")
        self.postgres_dsn = dsn_with(self.postgres_dsn, params=params, password=password)
        return self


def dsn_with(dsn: str, *, params: dict[str, str], password: str | None = None) -> str:
    """`dsn` with query parameters set (others kept) and, if given, the password replaced."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query.update(params)
    netloc = parts.netloc
    if password is not None:
        userinfo, at, hostport = netloc.rpartition("@")
        if not at:
            raise ValueError("a Postgres password file needs a user in the DSN "
                             "(postgresql://<user>@host/db)")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{quote(password, safe='')}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))


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
