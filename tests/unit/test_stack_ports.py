"""The ports the stack reserves are those its runs bind: `make run`, Tilt and `make compose-up`
(devstack.ports, the leaf module all of them and the stack import)."""

from __future__ import annotations

import pytest

from devstack import serve
from devstack.compose_up import ports_with_offset
from devstack.dev import ports as make_run_ports
from devstack.ports import ServicePorts, free_port
from devstack.stack import launcher_ports


@pytest.fixture(autouse=True)
def _no_port_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCKGATE_STACK_PORT_OFFSET", raising=False)  # serve.ports() reads it


def test_the_stack_reserves_every_port_make_run_tilt_and_compose_bind() -> None:
    reserved = set(launcher_ports(0))
    assert set(make_run_ports(0).all()) <= reserved
    assert set(serve.ports().all()) <= reserved
    assert set(ports_with_offset(0).values()) <= reserved
    assert {58243, 58206, 58244, 58207} <= reserved  # compose-up's webhooks in each cluster


def test_a_second_stack_reserves_the_same_ports_shifted_by_its_offset() -> None:
    assert launcher_ports(300) == [port + 300 for port in launcher_ports(0)]
    assert set(make_run_ports(300).all()) <= set(launcher_ports(300))


def test_tilt_runs_beside_make_run_on_ports_of_its_own() -> None:
    assert not set(serve.ports().all()) & set(make_run_ports(0).all())
    assert serve.ports().admin_api == ServicePorts().admin_api + 20


def test_free_ports_are_never_handed_out_twice() -> None:
    ports = ServicePorts.free().all()
    assert len(set(ports)) == len(ports)
    assert free_port() not in ports
