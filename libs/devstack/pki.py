"""A small certificate authority per cluster: serving and client certificates, and the
service-account signing key pair. ECDSA P-256 keys: quick to make, accepted everywhere here."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = dt.timedelta(days=3650)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def _write_public(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


class ClusterPKI:
    """Files under `<cluster dir>/pki`, created once and then reused."""

    def __init__(self, directory: Path, cluster: str) -> None:
        self.dir = directory
        self.cluster = cluster

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def crt(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    def ensure(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.ca_crt.exists() and self.ca_key.exists()):
            self._make_ca()
        ca_cert = x509.load_pem_x509_certificate(self.ca_crt.read_bytes())
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        if not (self.sa_key.exists() and self.sa_pub.exists()):
            sa = _new_key()
            _write_private(self.sa_key, _key_pem(sa))
            _write_public(
                self.sa_pub,
                sa.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                ),
            )
        leaves: list[tuple[str, str, list[str], list[str], list[str], bool]] = [
            # file name, CN, organizations, DNS SANs, IP SANs, server?
            (
                "apiserver",
                "kube-apiserver",
                [],
                [
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
                ["127.0.0.1", "10.96.0.1"],
                True,
            ),
            ("admin", "lockgate-admin", ["system:masters"], [], [], False),
            ("kube-controller-manager", "system:kube-controller-manager", [], [], [], False),
            ("kube-scheduler", "system:kube-scheduler", [], [], [], False),
            ("kwok", "system:kwok-controller", ["system:masters"], [], [], False),
        ]
        for name, cn, orgs, dns, ips, server in leaves:
            if self.crt(name).exists() and self.key(name).exists():
                continue
            key = _new_key()
            cert = _leaf(ca_cert, ca_key, key, cn, orgs, dns, ips, server)
            _write_private(self.key(name), _key_pem(key))
            _write_public(self.crt(name), cert.public_bytes(serialization.Encoding.PEM))

    def _make_ca(self) -> None:
        key = _new_key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"lockgate-{self.cluster}-ca")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        _write_private(self.ca_key, _key_pem(key))
        _write_public(self.ca_crt, cert.public_bytes(serialization.Encoding.PEM))


def _leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    cn: str,
    orgs: list[str],
    dns: list[str],
    ips: list[str],
    server: bool,
) -> x509.Certificate:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())
