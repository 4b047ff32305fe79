"""A private CA and a serving certificate for the webhook, kept on disk and renewed when expiring.

Why: the apiserver calls webhooks only over HTTPS and verifies them against the caBundle in the
registration. The webhook runs beside the apiservers on loopback, so it mints its own CA rather
than needing a cluster's certificate machinery. The files are reused across restarts (so a
restart does not have to re-register with a new bundle) and regenerated when they expire.
"""

from __future__ import annotations

import fcntl
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
