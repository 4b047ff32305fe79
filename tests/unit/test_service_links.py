"""Kubelet-injected service-link variables never stop a lockgate service from starting.

A kubelet gives every container <SVC>_SERVICE_HOST, <SVC>_PORT=tcp://ip:port and friends for
each Service in its namespace (unless enableServiceLinks is false). For Services named after
lockgate's own (lockgate-webhook, lockgate-queue-store, ...) those names fall under the services'
env prefixes: LOCKGATE_WEBHOOK_PORT=tcp://... even lands on the webhook's `port` setting.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from admission_webhook.settings import WebhookSettings
from cluster_watcher.settings import WatcherSettings
from fair_scheduler.settings import SchedulerSettings
from lockgate_adapters.admin_tokens import Role, entry_for, new_token
from lockgate_adapters.settings import ServiceSettings, is_service_link
from queue_store.settings import QueueStoreSettings
from ungater.settings import UngaterSettings


def service_links(service: str, port: int, port_name: str = "https",
                  ip: str = "10.96.0.7") -> dict[str, str]:
    """What kubelet's envvars.go makes of one Service with one TCP port."""
    s = service.upper().replace("-", "_")
    return {
        f"{s}_SERVICE_HOST": ip,
        f"{s}_SERVICE_PORT": str(port),
        f"{s}_SERVICE_PORT_{port_name.upper().replace('-', '_')}": str(port),
        f"{s}_PORT": f"tcp://{ip}:{port}",
        f"{s}_PORT_{port}_TCP": f"tcp://{ip}:{port}",
        f"{s}_PORT_{port}_TCP_PROTO": "tcp",
        f"{s}_PORT_{port}_TCP_PORT": str(port),
        f"{s}_PORT_{port}_TCP_ADDR": ip,
    }


# Services a lockgate namespace may hold: every lockgate service's, plus names that collide
# with real settings (LOCKGATE_WEBHOOK_HTTP_PORT, LOCKGATE_QUEUE_STORE_ADMIN_PORT).
SERVICES = {
    "lockgate-webhook": 443, "lockgate-webhook-http": 8080, "lockgate-queue-store": 8080,
    "lockgate-queue-store-admin": 8080, "lockgate-watcher": 8080, "lockgate-watcher-http": 8080,
    "lockgate-scheduler": 8080, "lockgate-scheduler-http": 8080, "lockgate-ungater": 8080,
    "lockgate-ungater-http": 8080, "lockgate-kafka": 9092, "lockgate-postgres": 5432,
}


@pytest.fixture
def kubelet_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for service, port in SERVICES.items():
        for name, value in service_links(service, port).items():
            monkeypatch.setenv(name, value)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    return kubeconfig


@pytest.mark.parametrize("settings_class", [
    WebhookSettings, WatcherSettings, SchedulerSettings, QueueStoreSettings, UngaterSettings])
def test_every_service_starts_with_kubelet_service_links(
        kubelet_environment: Path, settings_class: type[ServiceSettings]) -> None:
    clusters = {"clusters": {"a": str(kubelet_environment)}}
    needs_clusters = settings_class in (WebhookSettings, WatcherSettings, UngaterSettings)
    options: dict[str, object] = dict(clusters) if needs_clusters else {}
    if settings_class is QueueStoreSettings:
        options["admin_tokens"] = [entry_for("ops", Role.ADMIN, new_token()).line()]
    settings = settings_class(**options)
    # Defaults, not the kubelet's addresses.
    assert settings.http_port == 0
    if isinstance(settings, WebhookSettings):
        assert settings.port == 58443


def test_an_explicit_setting_still_wins_beside_the_links(
        kubelet_environment: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In a pod spec the container's own env overrides the kubelet's link of the same name.
    monkeypatch.setenv("LOCKGATE_WEBHOOK_PORT", "8443")
    monkeypatch.setenv("LOCKGATE_WEBHOOK_HTTP_PORT", "8080")
    settings = WebhookSettings(clusters={"a": str(kubelet_environment)})
    assert (settings.port, settings.http_port) == (8443, 8080)


def test_a_real_typo_is_still_refused(kubelet_environment: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_WEBHOOK_CERT_DIRR", "/certs")
    with pytest.raises(ValueError, match="LOCKGATE_WEBHOOK_CERT_DIRR"):
        WebhookSettings(clusters={"a": str(kubelet_environment)})


def test_a_port_that_is_not_an_address_is_a_setting_not_a_link() -> None:
    assert is_service_link("LOCKGATE_WEBHOOK_PORT", "tcp://10.0.0.1:443")
    assert not is_service_link("LOCKGATE_WEBHOOK_PORT", "8443")
    assert not is_service_link("LOCKGATE_WEBHOOK_HTTP_PORT", "tcp:/broken")
    assert is_service_link("LOCKGATE_WEBHOOK_PORT_443_TCP_ADDR", "10.0.0.1")
    assert is_service_link("LOCKGATE_WEBHOOK_SERVICE_PORT_HTTPS", "443")
