"""queue-store's settings (env prefix LOCKGATE_QUEUE_STORE_)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from lockgate_adapters.settings import ServiceSettings


class QueueStoreSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="LOCKGATE_QUEUE_STORE_",
                                      env_nested_delimiter="__", extra="forbid")
    service_name: ClassVar[str] = "queue-store"

    # Consuming
    group_id: str = Field(default="queue-store", description="Kafka consumer group")
    max_batch: int = Field(default=2000, gt=0, le=50_000,
                           description="most messages folded into one transaction")
    poll_timeout_ms: int = Field(default=100, gt=0, description="wait for a batch to fill")
    postgres_pool_size: int = Field(default=6, ge=2, le=50)
    dead_letter_value_bytes: int = Field(
        default=64 * 1024, ge=0, le=512 * 1024,
        description="most bytes of a bad message's value its dead letter keeps (JSON-encoded); "
        "beyond it only a prefix, the size and the sha256",
    )

    # Admin API (queues, job views), for the `lockgate` CLI
    admin_host: str = Field(default="127.0.0.1", description="admin API bind address")
    admin_port: int = Field(default=58080, ge=0, le=65535, description="0 picks a free port")
