"""A small certificate authority per cluster: serving and client certificates, and the
service-account signing key pair (minted with `lockgate_adapters.tls`).

Client certificates (the admin kubeconfig's above all) have RSA keys in PKCS#1, the format every
common Kubernetes client reads: fabric8 (Java, e.g. Spark's) refused the EC PKCS#8 key stacks
used to have with `Invalid DER: object is not integer`. A stack made before keeps its CA; its
client certificates in the old format are reissued by the same CA at the next `up`, so running
components, which trust the CA and not the leaf, never notice.
"""

from __future__ import annotations

import datetime as dt
import fcntl
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from lockgate_adapters.tls import (
    issue_certificate,
    new_ca,
    new_private_key,
    private_key_pem,
    read_certificate_and_key,
    write_atomically,
    write_certificate_and_key,
)

_VALID = dt.timedelta(days=3650)


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
        # Several processes (pytest sessions, `up`) may ensure at once: one writes, the others
        # then find its files, never a key of one with the certificate of another.
        with open(self.dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._ensure()

    def _ensure(self) -> None:
        now = dt.datetime.now(dt.UTC)
        if not (self.ca_crt.exists() and self.ca_key.exists()):
            made_cert, made_key = new_ca(f"lockgate-{self.cluster}-ca", now=now, valid_for=_VALID)
            write_certificate_and_key(self.ca_crt, made_cert, self.ca_key, made_key)
        ca_cert, ca_key = read_certificate_and_key(self.ca_crt, self.ca_key)
        assert ca_cert is not None and ca_key is not None, f"unreadable CA in {self.dir}"
        if not (self.sa_key.exists() and self.sa_pub.exists()):
            sa = new_private_key()
            write_atomically(self.sa_key, private_key_pem(sa), mode=0o600)
            write_atomically(
                self.sa_pub,
                sa.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                ),
                mode=0o644,
            )
        leaves: list[tuple[str, str, list[str], list[str], bool]] = [
            # file name, CN, organizations, hosts (DNS names and IPs), server?
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
                    "127.0.0.1",
                    "10.96.0.1",
                ],
                True,
            ),
            ("admin", "lockgate-admin", ["system:masters"], [], False),
            ("kube-controller-manager", "system:kube-controller-manager", [], [], False),
            ("kube-scheduler", "system:kube-scheduler", [], [], False),
            ("kwok", "system:kwok-controller", ["system:masters"], [], False),
            # Karpenter of an autoscaled cluster (devstack.karpenter): it creates and deletes
            # nodes, NodeClaims and evictions cluster-wide.
            ("karpenter", "system:karpenter", ["system:masters"], [], False),
        ]
        for name, cn, orgs, hosts, server in leaves:
            if self.crt(name).exists() and self.key(name).exists() and (
                    server or is_client_key_format(self.key(name))):
                continue
            cert, key = issue_certificate(ca_cert, ca_key, common_name=cn, organizations=orgs,
                                          hosts=hosts, server=server, now=now, valid_for=_VALID,
                                          key_type="ec" if server else "rsa")
            # Key first, then certificate, each replaced atomically; kubeconfigs that embed
            # them are rewritten from both afterwards (Cluster.prepare).
            write_certificate_and_key(self.crt(name), cert, self.key(name), key)


def is_client_key_format(path: Path) -> bool:
    """An RSA key in PKCS#1, what ClusterPKI gives client certificates."""
    try:
        return path.read_bytes().lstrip().startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    except OSError:
        return False
