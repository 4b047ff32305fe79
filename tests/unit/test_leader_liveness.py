"""The leader connection's liveness settings: what reaches Postgres and the socket."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from fair_scheduler.settings import SchedulerSettings


def test_liveness_settings_reach_the_session_and_the_socket(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"LEADER_CHECK_INTERVAL_SECONDS": "1", "LEADER_CHECK_TIMEOUT_SECONDS": "2",
                        "LEADER_IDLE_SESSION_TIMEOUT_SECONDS": "9.5",
                        "POSTGRES_KEEPALIVES_IDLE_SECONDS": "7",
                        "POSTGRES_TCP_USER_TIMEOUT_SECONDS": "12"}.items():
        monkeypatch.setenv(f"LOCKGATE_SCHEDULER_{name}", value)
    liveness = SchedulerSettings().liveness()
    assert (liveness.check_interval, liveness.check_timeout) == (1, 2)
    assert liveness.server_settings() == {
        "idle_session_timeout": "9500", "idle_in_transaction_session_timeout": "9500",
        "tcp_keepalives_idle": "7", "tcp_keepalives_interval": "5",
        "tcp_keepalives_count": "3", "tcp_user_timeout": "12000"}
    options = liveness.socket_options()
    assert (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1) in options
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        assert (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 12000) in options
        assert (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 7) in options


def test_an_idle_timeout_a_live_leader_could_hit_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_SCHEDULER_LEADER_IDLE_SESSION_TIMEOUT_SECONDS", "5")
    with pytest.raises(ValidationError, match="must exceed leader_check_interval_seconds"):
        SchedulerSettings()
