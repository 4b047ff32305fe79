"""Settings shared by every service; each service subclasses with its own env prefix.

Why: a service must refuse to start with a typo in its configuration rather than silently run
with defaults, so unknown LOCKGATE_* variables under a service's prefix are an error.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from lockgate.durations import InvalidDurationError, parse_duration
from lockgate.events import Topic
from lockgate.installation import TOPIC_PREFIX_PATTERN, installation_name

KafkaProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def default_instance_id() -> str:
    """This process, where nothing names it better: host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class KafkaConfig:
    """How to reach Kafka and how lockgate's topics are made; every Kafka client takes this.

    Built from a service's settings (`ServiceSettings.kafka()`); a bare bootstrap string
    stands for the local stack: one broker, plaintext, replication 1.
    """

    bootstrap: str
    security_protocol: KafkaProtocol = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    replication_factor: int = 1
    min_insync_replicas: int = 1
    # This installation's topic prefix (lockgate.installation): "" keeps the plain names.
    topic_prefix: str = ""

    def topic_name(self, topic: Topic[Any]) -> str:
        """The name of `topic` in this installation: the one place a topic's name is made."""
        return installation_name(self.topic_prefix, topic.name)

    def group_id(self, group: str) -> str:
        """A consumer group's id in this installation, prefixed as its topics are."""
        return installation_name(self.topic_prefix, group)


# What a kubelet injects for every Service in the pod's namespace (unless the pod sets
# enableServiceLinks: false): <SVC>_SERVICE_HOST, <SVC>_SERVICE_PORT[_<port name>],
# <SVC>_PORT=tcp://ip:port and <SVC>_PORT_<n>_<PROTO>[_PROTO|_PORT|_ADDR]. A Service named
# lockgate-webhook yields LOCKGATE_WEBHOOK_PORT=tcp://10.96.0.7:443, which lands on the webhook's
# own `port` setting, and LOCKGATE_WEBHOOK_SERVICE_HOST, an "unknown setting": either would stop
# the service from starting. None of them is ever a lockgate setting, so they are ignored.
_SERVICE_LINK_NAME = re.compile(
    r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)"
    r"(_PROTO|_PORT|_ADDR)?)$")
_SERVICE_LINK_ADDRESS = re.compile(r"^(tcp|udp|sctp)://[^\s/]+:[0-9]+$")


def is_service_link(name: str, value: str | None) -> bool:
    """True for a variable the kubelet injects for a Service, never for a lockgate setting."""
    upper = name.upper()
    if _SERVICE_LINK_NAME.match(upper):
        return True
    return upper.endswith("_PORT") and bool(_SERVICE_LINK_ADDRESS.match(value or ""))


def without_service_links(environ: Mapping[str, str | None]) -> dict[str, str | None]:
    return {name: value for name, value in environ.items()
            if not is_service_link(name, value)}


def seconds_as_durations(model: type[BaseModel], data: dict[str, Any], *,
                         where: str) -> dict[str, Any]:
    """`data` with each *_seconds value spelled as a duration ("20s", "5m") turned into seconds,
    in `model`'s nested settings too; a bare number is left for the field to read as before.
    ValueError naming the variable (`where` is its prefix) and how to write a duration."""
    converted = dict(data)
    for name, field_info in model.model_fields.items():
        keys = [name, *(choice for choice in getattr(field_info.validation_alias, "choices", ())
                        if isinstance(choice, str))]
        for key in keys:
            if key not in converted:
                continue
            value = converted[key]
            nested = field_info.annotation
            if isinstance(nested, type) and issubclass(nested, BaseModel) \
                    and isinstance(value, dict):
                converted[key] = seconds_as_durations(nested, value,
                                                      where=f"{where}{name.upper()}__")
            elif name.endswith("_seconds"):
                converted[key] = _seconds(value, f"{where}{name.upper()}")
    return converted


def _seconds(value: Any, variable: str) -> Any:
    if isinstance(value, list):
        return [_seconds(item, variable) for item in value]
    if not isinstance(value, str) or not value.strip():
        return value
    try:
        float(value)
    except ValueError:
        try:
            return parse_duration(value, allow_zero=True)
        except InvalidDurationError as error:
            raise ValueError(f"{variable}: {error}") from None
    return value  # a bare number: the field reads it, and says so if it is out of bounds


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
    # Whether the health server runs on a thread of its own, so its `off_loop` views answer
    # while the service's loop is busy (lockgate_adapters.health): the fair scheduler's is.
    health_own_thread: ClassVar[bool] = False

    # Shared by every service (one Kafka, one Postgres, one tracing backend): read from
    # LOCKGATE_<NAME> whatever the service's own prefix is.
    kafka_bootstrap: str = Field(
        default="127.0.0.1:59092", description="Kafka bootstrap servers",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_BOOTSTRAP", "kafka_bootstrap"),
    )
    # Kafka TLS and SASL (docs/security.md), and how lockgate's topics are replicated.
    kafka_security_protocol: KafkaProtocol = Field(
        default="PLAINTEXT", description="SASL_SSL in production",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_SECURITY_PROTOCOL",
                                      "kafka_security_protocol"))
    kafka_ssl_cafile: Path | None = Field(
        default=None, description="CA bundle of the brokers' certificates (else the system's)",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_SSL_CAFILE", "kafka_ssl_cafile"))
    kafka_ssl_certfile: Path | None = Field(
        default=None, description="client certificate, for brokers that require mutual TLS",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_SSL_CERTFILE", "kafka_ssl_certfile"))
    kafka_ssl_keyfile: Path | None = Field(
        default=None, description="the client certificate's key",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_SSL_KEYFILE", "kafka_ssl_keyfile"))
    kafka_sasl_mechanism: SaslMechanism | None = Field(
        default=None, description="required with SASL_PLAINTEXT / SASL_SSL",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_SASL_MECHANISM", "kafka_sasl_mechanism"))
    kafka_sasl_username: str | None = Field(
        default=None,
        validation_alias=AliasChoices("LOCKGATE_KAFKA_SASL_USERNAME", "kafka_sasl_username"))
    kafka_sasl_password: SecretStr | None = Field(
        default=None, description="prefer kafka_sasl_password_file",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_SASL_PASSWORD", "kafka_sasl_password"))
    kafka_sasl_password_file: Path | None = Field(
        default=None, description="file holding the SASL password (a mounted Secret)",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_SASL_PASSWORD_FILE",
                                      "kafka_sasl_password_file"))
    kafka_replication_factor: int = Field(
        default=3, ge=1, description="replicas of each topic lockgate creates (1 locally)",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_REPLICATION_FACTOR",
                                      "kafka_replication_factor"))
    kafka_min_insync_replicas: int = Field(
        default=2, ge=1, description="min.insync.replicas of those topics: with acks=all, a "
                                     "write is acknowledged once this many replicas have it",
        validation_alias=AliasChoices("LOCKGATE_KAFKA_MIN_INSYNC_REPLICAS",
                                      "kafka_min_insync_replicas"))
    topic_prefix: str = Field(
        default="", pattern=TOPIC_PREFIX_PATTERN,
        description="prefix of every Kafka topic and consumer group of this installation, so "
        "that several (staging, production) share one Kafka cluster, e.g. \"staging.\"; the "
        "same in every service of the installation; \"\" keeps the plain names",
        validation_alias=AliasChoices("LOCKGATE_TOPIC_PREFIX", "topic_prefix"))
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
    instance_id: str = Field(
        default_factory=default_instance_id,
        description="names this process: on its dead letters, in release_decisions.decided_by "
                    "(the fair-scheduler); k8s/ sets the pod's name")
    http_host: str = Field(default="127.0.0.1", description="health/metrics bind address")
    http_port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port")
    shutdown_grace_seconds: float = Field(default=20.0, gt=0)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    dependency_checks: DependencyChecks = Field(default_factory=DependencyChecks)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if isinstance(env_settings, EnvSettingsSource):
            # Kubelet-injected service links never reach a field (see is_service_link).
            env_settings.env_vars = without_service_links(env_settings.env_vars)
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _durations(cls, data: Any) -> Any:
        """Every setting named *_seconds takes a duration as the CLI's flags do: 20s, 5m, 2h or
        bare seconds (lockgate.durations); bounds are still the field's."""
        prefix = str(cls.model_config.get("env_prefix") or "")
        return seconds_as_durations(cls, data, where=prefix) if isinstance(data, dict) else data

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_env(cls, data: Any) -> Any:
        prefix = str(cls.model_config.get("env_prefix") or "")
        if prefix and prefix != "LOCKGATE_":
            known = {name.upper() for name in cls.model_fields}
            unknown = sorted(
                key for key, value in os.environ.items()
                if key.startswith(prefix) and key[len(prefix):].split("__")[0] not in known
                and not is_service_link(key, value)
            )
            if unknown:
                raise ValueError(f"unknown settings in the environment: {', '.join(unknown)}")
        return data

    @model_validator(mode="after")
    def _kafka_options(self) -> ServiceSettings:
        self.kafka()  # refuse to start with an incomplete or contradictory Kafka configuration
        return self

    def kafka(self) -> KafkaConfig:
        """These settings as the configuration every Kafka client of the service takes."""
        protocol = self.kafka_security_protocol
        password = self.kafka_sasl_password.get_secret_value() if self.kafka_sasl_password \
            else None
        if self.kafka_sasl_password_file is not None:
            if password is not None:
                raise ValueError("set kafka_sasl_password or kafka_sasl_password_file, not both")
            try:
                password = self.kafka_sasl_password_file.read_text().strip()
            except OSError as error:
                raise ValueError(f"cannot read the Kafka SASL password file: {error}") from error
        if protocol.startswith("SASL_"):
            if self.kafka_sasl_mechanism is None or not self.kafka_sasl_username or not password:
                raise ValueError(f"kafka_security_protocol {protocol} needs "
                                 "kafka_sasl_mechanism, kafka_sasl_username and a password "
                                 "(kafka_sasl_password_file)")
        elif self.kafka_sasl_mechanism or self.kafka_sasl_username or password:
            raise ValueError(f"SASL settings are given but kafka_security_protocol is {protocol}:"
                             " use SASL_SSL (or SASL_PLAINTEXT on a trusted network)")
        files = {"kafka_ssl_cafile": self.kafka_ssl_cafile,
                 "kafka_ssl_certfile": self.kafka_ssl_certfile,
                 "kafka_ssl_keyfile": self.kafka_ssl_keyfile}
        given = {name: path for name, path in files.items() if path is not None}
        if given and not protocol.endswith("SSL"):
            raise ValueError(f"{', '.join(given)} given but kafka_security_protocol is "
                             f"{protocol}: use SSL or SASL_SSL")
        missing = [f"{name}: {path}" for name, path in given.items() if not path.is_file()]
        if missing:
            raise ValueError(f"Kafka TLS files not found: {', '.join(missing)}")
        if (self.kafka_ssl_certfile is None) != (self.kafka_ssl_keyfile is None):
            raise ValueError("kafka_ssl_certfile and kafka_ssl_keyfile go together")
        if self.kafka_min_insync_replicas > self.kafka_replication_factor:
            raise ValueError(f"kafka_min_insync_replicas ({self.kafka_min_insync_replicas}) "
                             f"exceeds kafka_replication_factor "
                             f"({self.kafka_replication_factor}): no write could succeed")
        return KafkaConfig(
            bootstrap=self.kafka_bootstrap, security_protocol=protocol,
            ssl_cafile=_str(self.kafka_ssl_cafile), ssl_certfile=_str(self.kafka_ssl_certfile),
            ssl_keyfile=_str(self.kafka_ssl_keyfile), sasl_mechanism=self.kafka_sasl_mechanism,
            sasl_username=self.kafka_sasl_username, sasl_password=password,
            replication_factor=self.kafka_replication_factor,
            min_insync_replicas=self.kafka_min_insync_replicas,
            topic_prefix=self.topic_prefix,
        )

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


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


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
