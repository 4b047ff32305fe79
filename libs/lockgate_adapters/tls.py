"""Minting X.509 certificates: a private CA, the certificates it issues, and their files.

Why: two parts of lockgate run their own small certificate authority — the admission webhook
(the apiservers call it over HTTPS only) and the local stack (serving and client certificates of
each cluster's control plane). Both need the same few steps: an ECDSA P-256 key (quick to make,
accepted everywhere here), a self-signed CA, leaf certificates for a server or a client, and key
files that no reader ever sees half-written.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
KeyType = Literal["ec", "rsa"]
# Certificates start being valid a little in the past, so a clock slightly behind accepts them.
BACKDATE = timedelta(hours=1)


def new_private_key(key_type: KeyType = "ec") -> PrivateKey:
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def private_key_pem(key: PrivateKey) -> bytes:
    """PKCS#8 for EC keys; PKCS#1 ("RSA PRIVATE KEY") for RSA keys, the one key format every
    Kubernetes client reads (fabric8, Java's client, refuses an EC key in PKCS#8 and needs
    BouncyCastle for any EC key)."""
    if isinstance(key, rsa.RSAPrivateKey):
        return key.private_bytes(serialization.Encoding.PEM,
                                 serialization.PrivateFormat.TraditionalOpenSSL,
                                 serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def certificate_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def new_ca(common_name: str, *, now: datetime,
           valid_for: timedelta) -> tuple[x509.Certificate, PrivateKey]:
    """A self-signed CA that signs leaf certificates only (no intermediates)."""
    key = new_private_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(certificate_signing=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def issue_certificate(
    ca_certificate: x509.Certificate, ca_key: PrivateKey, *, common_name: str, server: bool,
    now: datetime, valid_for: timedelta, hosts: Sequence[str] = (),
    organizations: Sequence[str] = (), key_type: KeyType = "ec",
) -> tuple[x509.Certificate, PrivateKey]:
    """A leaf certificate signed by the CA, for TLS serving (`server`) or client authentication.

    `hosts` (IP addresses or DNS names) become its subject alternative names; it never outlives
    its CA. `key_type` "rsa" for a certificate that other people's clients present.
    """
    key = new_private_key(key_type)
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + valid_for, ca_certificate.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(certificate_signing=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(host) for host in hosts]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def write_atomically(path: Path, content: bytes, *, mode: int) -> None:
    """Write beside `path`, then rename over it: readers never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)
    os.replace(temporary, path)


def write_certificate_and_key(certificate_path: Path, certificate: x509.Certificate,
                              key_path: Path, key: PrivateKey) -> None:
    """The certificate readable by anyone, the key by its owner only."""
    write_atomically(key_path, private_key_pem(key), mode=0o600)
    write_atomically(certificate_path, certificate_pem(certificate), mode=0o644)


def read_certificate_and_key(
    certificate_path: Path, key_path: Path
) -> tuple[x509.Certificate | None, PrivateKey | None]:
    """The pair written by `write_certificate_and_key`; (None, None) if missing or unreadable."""
    try:
        certificate = x509.load_pem_x509_certificate(certificate_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError):
        return None, None
    if not isinstance(key, PrivateKey):
        return None, None
    return certificate, key


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _key_usage(*, certificate_signing: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, key_cert_sign=certificate_signing, crl_sign=certificate_signing,
        content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, encipher_only=False, decipher_only=False,
    )
