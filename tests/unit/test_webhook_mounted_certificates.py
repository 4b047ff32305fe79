"""The in-cluster webhook serves the certificate of a mounted Secret: it never mints a CA, every
replica serves the same one, and a renewed Secret is picked up without a restart."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from admission_webhook.certificates import MountedCertificates, ensure_certificates


def a_secret(directory: Path, source: Path) -> Path:
    """What the kubelet mounts for a kubernetes.io/tls Secret (cert-manager's keys)."""
    minted = ensure_certificates(source, hosts=["lockgate-webhook.lockgate-system.svc"])
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(minted.cert_path, directory / "tls.crt")
    shutil.copy(minted.key_path, directory / "tls.key")
    shutil.copy(source / "ca.crt", directory / "ca.crt")
    return directory


def test_replicas_serve_the_one_certificate_of_the_secret_and_write_nothing(
        tmp_path: Path) -> None:
    secret = a_secret(tmp_path / "secret", tmp_path / "minted")
    before = sorted(p.name for p in secret.iterdir())
    first, second = MountedCertificates(secret).load(), MountedCertificates(secret).load()
    assert first.ca_pem == second.ca_pem == (secret / "ca.crt").read_bytes()
    assert first.cert_path == second.cert_path == secret / "tls.crt"
    assert first.not_after > datetime.now(UTC)
    assert sorted(p.name for p in secret.iterdir()) == before  # no CA minted beside it
    first.ssl_context()  # usable by the server


def test_a_missing_secret_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tls\.crt, tls\.key missing .*LOCKGATE_WEBHOOK_TLS_DIR"):
        MountedCertificates(tmp_path).load()


def test_a_key_of_another_certificate_is_refused(tmp_path: Path) -> None:
    secret = a_secret(tmp_path / "secret", tmp_path / "minted")
    other = a_secret(tmp_path / "other", tmp_path / "minted-other")
    shutil.copy(other / "tls.key", secret / "tls.key")
    with pytest.raises(ValueError, match="unusable serving certificate"):
        MountedCertificates(secret).load()


def test_a_renewed_secret_is_noticed(tmp_path: Path) -> None:
    secret = a_secret(tmp_path / "secret", tmp_path / "minted")
    mounted = MountedCertificates(secret)
    first = mounted.load()
    assert not mounted.changed()
    a_secret(secret, tmp_path / "renewed")  # cert-manager renewed it: new CA, new pair
    assert mounted.changed()
    renewed = mounted.load()
    assert renewed.ca_pem != first.ca_pem and not mounted.changed()
