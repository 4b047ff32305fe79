"""Queues: who shares the clusters, with what weight and within which limits."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lockgate.labels import validate_queue_name
from lockgate.resources import InvalidQuantityError, Resources, canonical_amount


class QueueSpec(BaseModel):
    """A queue as an operator defines it.

    `priority_factor` follows Armada: a queue's weight is 1 / priority_factor, so a queue with
    factor 0.5 gets twice the share of a queue with factor 1. `resource_limits` caps what the
    queue may hold across all clusters at once, as Kubernetes quantities.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    priority_factor: float = Field(default=1.0, gt=0, le=1_000_000)
    cordoned: bool = False
    resource_limits: dict[str, str] = Field(default_factory=dict)
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return validate_queue_name(name)

    @field_validator("resource_limits")
    @classmethod
    def _valid_limits(cls, limits: dict[str, str]) -> dict[str, str]:
        for resource, quantity in limits.items():
            try:
                canonical_amount(resource, quantity)
            except InvalidQuantityError as error:
                raise ValueError(f"resource limit {resource}: {error}") from error
        return limits

    @property
    def weight(self) -> float:
        return 1.0 / self.priority_factor

    @property
    def limits(self) -> Resources:
        return Resources.from_kubernetes(self.resource_limits)
