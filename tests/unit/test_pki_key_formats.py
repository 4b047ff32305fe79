"""The local clusters' client keys are RSA PKCS#1, which every common Kubernetes client reads
(fabric8 refused EC PKCS#8); a stack made with the old format is moved over safely: same CA,
reissued client certificates, the serving certificate untouched."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from devstack.pki import ClusterPKI, is_client_key_format
from lockgate_adapters.tls import issue_certificate, read_certificate_and_key

CLIENTS = ("admin", "kube-controller-manager", "kube-scheduler", "kwok")


def test_client_keys_are_rsa_pkcs1_and_the_serving_key_stays_ec(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path, "cluster-a")
    pki.ensure()
    for name in CLIENTS:
        assert pki.key(name).read_bytes().startswith(b"-----BEGIN RSA PRIVATE KEY-----")
        key = serialization.load_pem_private_key(pki.key(name).read_bytes(), password=None)
        assert isinstance(key, rsa.RSAPrivateKey) and key.key_size >= 2048
    serving = serialization.load_pem_private_key(pki.key("apiserver").read_bytes(), None)
    assert isinstance(serving, ec.EllipticCurvePrivateKey)


def test_an_old_stack_gets_new_client_certificates_from_the_same_ca(tmp_path: Path) -> None:
    pki = ClusterPKI(tmp_path, "cluster-a")
    pki.ensure()
    ca_cert, ca_key = read_certificate_and_key(pki.ca_crt, pki.ca_key)
    assert ca_cert is not None and ca_key is not None
    # What stacks made before this change hold: an EC key in PKCS#8.
    old_cert, old_key = issue_certificate(
        ca_cert, ca_key, common_name="lockgate-admin", organizations=["system:masters"],
        server=False, now=dt.datetime.now(dt.UTC), valid_for=dt.timedelta(days=30))
    pki.key("admin").write_bytes(old_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    pki.crt("admin").write_bytes(old_cert.public_bytes(serialization.Encoding.PEM))
    assert not is_client_key_format(pki.key("admin"))
    ca_before, serving_before = pki.ca_crt.read_bytes(), pki.crt("apiserver").read_bytes()
    kwok_before = pki.crt("kwok").read_bytes()

    pki.ensure()

    assert is_client_key_format(pki.key("admin"))
    assert pki.ca_crt.read_bytes() == ca_before
    assert pki.crt("apiserver").read_bytes() == serving_before
    assert pki.crt("kwok").read_bytes() == kwok_before  # already in the new format: kept
    admin = x509.load_pem_x509_certificate(pki.crt("admin").read_bytes())
    admin.verify_directly_issued_by(ca_cert)
    key = serialization.load_pem_private_key(pki.key("admin").read_bytes(), password=None)
    assert key.public_key().public_numbers() == admin.public_key().public_numbers()
    assert admin.subject.rfc4514_string() == "CN=lockgate-admin,O=system:masters"
