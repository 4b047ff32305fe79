"""The fair scheduler's settings, from LOCKGATE_SCHEDULER_* variables."""

from __future__ import annotations

import os
import socket
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from lockgate_adapters.settings import ServiceSettings


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class SchedulerSettings(ServiceSettings):
    """Leadership, round triggering and limits, and re-publishing of unanswered releases."""

    model_config = SettingsConfigDict(env_prefix="LOCKGATE_SCHEDULER_", env_nested_delimiter="__",
                                      extra="forbid")
    service_name: ClassVar[str] = "fair-scheduler"

    instance_id: str = Field(default_factory=_default_instance_id,
                             description="names this instance in release_decisions.decided_by")
    # Leadership
    standby_retry_seconds: float = Field(
        default=1.0, gt=0, description="how often a standby tries to take the leader lock")
    # Rounds
    debounce_seconds: float = Field(
        default=0.005, ge=0, description="after a change notification, wait this long for more")
    safety_round_seconds: float = Field(
        default=5.0, gt=0, description="run a round at least this often, changes or not")
    max_decisions_per_round: int = Field(default=5000, ge=1)
    max_lookback_per_queue: int = Field(
        default=1000, ge=0, description="jobs that do not fit a queue may skip before it stops")
    # Releases that went unanswered
    release_retry_initial_seconds: float = Field(
        default=2.0, gt=0,
        description="a job whose release failed waits this long before it is released again, "
                    "doubling with each failure")
    release_retry_max_seconds: float = Field(
        default=300.0, gt=0, description="the longest such wait")
    republish_after_seconds: float = Field(
        default=60.0, gt=0,
        description="re-publish a release command whose job is still only released this long "
        "after publishing (the ungater is idempotent)")
