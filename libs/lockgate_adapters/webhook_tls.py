"""The files of a self-managed serving certificate for the in-cluster webhook, for clusters
without cert-manager (made by `lockgate webhook-tls`, `lockgate_cli.webhook_tls`).

Why made once, outside the cluster: the Secret must outlive every webhook pod and be the same
for all replicas (a CA minted per pod would disagree with the registration's caBundle), so it
is made once and applied by the overlay (k8s/overlays/production: a kubernetes.io/tls Secret
from the files, and the registration's caBundle copied from the same ca.crt). Rerunning it keeps
files that are still good, so a re-apply does not rotate the CA under running pods.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509

from lockgate_adapters.tls import (
    issue_certificate,
    new_ca,
    read_certificate_and_key,
    write_certificate_and_key,
)

CA_VALIDITY = timedelta(days=5 * 365)
SERVING_VALIDITY = timedelta(days=365)
# Reissued by a rerun this long before it expires.
RENEW_BEFORE = timedelta(days=30)


def service_hosts(service: str, namespace: str) -> list[str]:
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def ensure_webhook_tls(directory: Path, *, hosts: list[str],
                       now: datetime | None = None) -> bool:
    """CA and serving certificate in `directory`; True if anything was (re)written."""
    now = now or datetime.now(UTC)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca, ca_key = read_certificate_and_key(directory / "ca.crt", directory / "ca.key")
    wrote = False
    if ca is None or ca_key is None or not _fresh(ca, now):
        ca, ca_key = new_ca("lockgate webhook CA", now=now, valid_for=CA_VALIDITY)
        write_certificate_and_key(directory / "ca.crt", ca, directory / "ca.key", ca_key)
        wrote = True
    cert, key = read_certificate_and_key(directory / "tls.crt", directory / "tls.key")
    if wrote or cert is None or key is None or not _fresh(cert, now) or not _covers(cert, hosts):
        cert, key = issue_certificate(ca, ca_key, common_name=hosts[0], server=True,
                                      hosts=hosts, now=now, valid_for=SERVING_VALIDITY)
        write_certificate_and_key(directory / "tls.crt", cert, directory / "tls.key", key)
        wrote = True
    return wrote


def _fresh(certificate: x509.Certificate, now: datetime) -> bool:
    return certificate.not_valid_before_utc <= now < certificate.not_valid_after_utc - RENEW_BEFORE


def _covers(certificate: x509.Certificate, hosts: list[str]) -> bool:
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return False
    return set(hosts) <= set(names.value.get_values_for_type(x509.DNSName))
