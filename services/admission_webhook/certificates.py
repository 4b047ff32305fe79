"""A private CA and a serving certificate for the webhook, kept on disk and renewed when expiring.

Why: the apiserver calls webhooks only over HTTPS and verifies them against the caBundle in the
registration. The webhook runs beside the apiservers on loopback, so it mints its own CA rather
than needing a cluster's certificate machinery. The files are reused across restarts (so a
restart does not have to re-register with a new bundle) and regenerated when they expire.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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
        ca_cert, ca_key = _load_pair(directory / "ca.crt", directory / "ca.key")
        if ca_cert is None or ca_key is None or not _valid_for(ca_cert, now):
            ca_cert, ca_key = _new_ca(now)
            _write_pair(directory / "ca.crt", directory / "ca.key", ca_cert, ca_key)
            log.info("generated a new webhook CA in %s", directory)
        cert, key = _load_pair(directory / "tls.crt", directory / "tls.key")
        if cert is None or key is None or not _serves(cert, ca_cert, hosts, now):
            cert, key = _new_serving(ca_cert, ca_key, hosts, now)
            _write_pair(directory / "tls.crt", directory / "tls.key", cert, key)
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


def _new_ca(now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lockgate webhook CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                          content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, encipher_only=False,
                          decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _new_serving(
    ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: Sequence[str],
    now: datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lockgate webhook")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(min(now + SERVING_VALIDITY, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _load_pair(
    cert_path: Path, key_path: Path
) -> tuple[x509.Certificate | None, ec.EllipticCurvePrivateKey | None]:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError):
        return None, None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None, None
    return cert, key


def _write_pair(
    cert_path: Path, key_path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> None:
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    _write_atomically(key_path, key_pem, mode=0o600)
    _write_atomically(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)


def _write_atomically(path: Path, content: bytes, *, mode: int) -> None:
    # Readers never see a half-written file: write beside it, then rename over it.
    temporary = path.with_suffix(path.suffix + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)
    os.replace(temporary, path)
