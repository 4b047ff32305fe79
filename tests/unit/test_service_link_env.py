"""A kubelet's service-link variables for a Service named like a settings prefix are no settings.

The Service lockgate-webhook makes every pod of its namespace get LOCKGATE_WEBHOOK_SERVICE_HOST,
LOCKGATE_WEBHOOK_PORT_443_TCP and the like; the webhook must start with them, and still refuse
a misspelt setting.
"""

from __future__ import annotations

import pytest

from admission_webhook.settings import WebhookSettings

SERVICE_LINKS = {
    "LOCKGATE_WEBHOOK_SERVICE_HOST": "10.96.0.12",
    "LOCKGATE_WEBHOOK_SERVICE_PORT": "443",
    "LOCKGATE_WEBHOOK_SERVICE_PORT_HTTPS": "443",
    "LOCKGATE_WEBHOOK_PORT_443_TCP": "tcp://10.96.0.12:443",
    "LOCKGATE_WEBHOOK_PORT_443_TCP_PROTO": "tcp",
    "LOCKGATE_WEBHOOK_PORT_443_TCP_PORT": "443",
    "LOCKGATE_WEBHOOK_PORT_443_TCP_ADDR": "10.96.0.12",
}


def test_service_link_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SERVICE_LINKS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOCKGATE_WEBHOOK_PORT", "8443")  # set explicitly, as the Deployment does
    assert WebhookSettings().port == 8443


def test_a_misspelt_setting_is_still_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_WEBHOOK_SERVICE_HOST", "10.96.0.12")
    monkeypatch.setenv("LOCKGATE_WEBHOOK_CERT_DIRS", "/certs")
    with pytest.raises(ValueError, match="LOCKGATE_WEBHOOK_CERT_DIRS"):
        WebhookSettings()
