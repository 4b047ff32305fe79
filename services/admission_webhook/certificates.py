"""The webhook's serving certificate: minted by itself for local runs, or read from a mounted
Secret inside a cluster.

Why: the apiserver calls webhooks only over HTTPS and verifies them against the caBundle in the
static registration. Run beside the local apiservers on loopback, the webhook mints its own CA
(`ensure_certificates`), reused across restarts and regenerated when expiring. Inside a cluster
it must not: every pod would mint another CA (an emptyDir dies with the pod), and the replicas of
a rolling update would disagree with the one caBundle of the registration. There the
certificate comes from a Secret (cert-manager's, or one made by hand: docs/deploying.md), shared
by every replica, read as is, reloaded when the kubelet updates the mounted files, never written
(`MountedCertificates`).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from lockgate_adapters.tls import (
    issue_certificate,
    new_ca,
    read_certificate_and_key,
    write_certificate_and_key,
)

log = logging.getLogger(__name__)

CA_VALIDITY = timedelta(days=3650)
SERVING_VALIDITY = timedelta(days=365)
# Renew this long before expiry, so a long-running process never serves an expired certificate.
RENEW_BEFORE = timedelta(days=30)


@dataclass(frozen=True)
class ServingCertificates:
    ca_pem: bytes
    cert_path: Path
    key_path: Path
    not_after: datetime

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_path, self.key_path)
        return context


def ensure_certificates(
    directory: Path, *, hosts: Sequence[str], now: datetime | None = None
) -> ServingCertificates:
    """The CA and serving certificate in `directory`, (re)generated if missing or expiring.

    A file lock serialises processes sharing the directory, so they agree on one CA.
    """
    now = now or datetime.now(UTC)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ca_cert, ca_key = read_certificate_and_key(directory / "ca.crt", directory / "ca.key")
        if ca_cert is None or ca_key is None or not _valid_for(ca_cert, now):
            ca_cert, ca_key = new_ca("lockgate webhook CA", now=now, valid_for=CA_VALIDITY)
            write_certificate_and_key(directory / "ca.crt", ca_cert, directory / "ca.key", ca_key)
            log.info("generated a new webhook CA in %s", directory)
        cert, key = read_certificate_and_key(directory / "tls.crt", directory / "tls.key")
        if cert is None or key is None or not _serves(cert, ca_cert, hosts, now):
            cert, key = issue_certificate(ca_cert, ca_key, common_name="lockgate webhook",
                                          server=True, hosts=hosts, now=now,
                                          valid_for=SERVING_VALIDITY)
            write_certificate_and_key(directory / "tls.crt", cert, directory / "tls.key", key)
            log.info("generated a new serving certificate for %s", ", ".join(hosts))
        return ServingCertificates(
            ca_pem=ca_cert.public_bytes(serialization.Encoding.PEM),
            cert_path=directory / "tls.crt",
            key_path=directory / "tls.key",
            not_after=cert.not_valid_after_utc,
        )


class MountedCertificates:
    """tls.crt, tls.key and (optionally) ca.crt of a Secret mounted at `directory`.

    The files are kubernetes.io/tls Secret keys, as cert-manager writes them. `load` refuses a
    missing or mismatched pair with a message that says which Secret to fix; `changed` tells
    when the kubelet has swapped in a renewed Secret, so the server loads it without a restart.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fingerprint: str | None = None

    def _files(self) -> tuple[Path, Path, Path]:
        return (self.directory / "tls.crt", self.directory / "tls.key",
                self.directory / "ca.crt")

    def _read_fingerprint(self) -> str:
        digest = hashlib.sha256()
        for path in self._files():
            digest.update(path.read_bytes() if path.exists() else b"-")
        return digest.hexdigest()

    def load(self) -> ServingCertificates:
        cert_path, key_path, ca_path = self._files()
        missing = [p.name for p in (cert_path, key_path) if not p.is_file()]
        if missing:
            raise ValueError(
                f"{', '.join(missing)} missing in {self.directory} (LOCKGATE_WEBHOOK_TLS_DIR): "
                "mount the webhook's kubernetes.io/tls Secret there (cert-manager's "
                "lockgate-webhook-tls, or one made as docs/deploying.md shows)")
        fingerprint = self._read_fingerprint()
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            # Proves the key matches the certificate before the server depends on it.
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_path,
                                                                                key_path)
        except (ValueError, ssl.SSLError) as error:
            raise ValueError(f"unusable serving certificate in {self.directory}: "
                             f"{error}") from error
        self._fingerprint = fingerprint
        ca_pem = ca_path.read_bytes() if ca_path.is_file() else b""
        log.info("serving the certificate mounted in %s (valid until %s)", self.directory,
                 cert.not_valid_after_utc.isoformat())
        return ServingCertificates(ca_pem=ca_pem, cert_path=cert_path, key_path=key_path,
                                   not_after=cert.not_valid_after_utc)

    def changed(self) -> bool:
        try:
            return self._read_fingerprint() != self._fingerprint
        except OSError:
            return False  # mid-swap: look again at the next check


def needs_renewal(certificates: ServingCertificates, now: datetime | None = None) -> bool:
    return (now or datetime.now(UTC)) >= certificates.not_after - RENEW_BEFORE


def _valid_for(cert: x509.Certificate, now: datetime) -> bool:
    return cert.not_valid_before_utc <= now < cert.not_valid_after_utc - RENEW_BEFORE


def _serves(
    cert: x509.Certificate, ca: x509.Certificate, hosts: Sequence[str], now: datetime
) -> bool:
    if not _valid_for(cert, now) or cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (InvalidSignature, ValueError, TypeError, x509.ExtensionNotFound):
        return False
    covered = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    covered |= set(names.get_values_for_type(x509.DNSName))
    return set(hosts) <= covered
