"""The local clusters' admin kubeconfigs work with fabric8, the Java Kubernetes client Spark and
many Java tools use (it refused the EC PKCS#8 client key stacks used to have with
`java.io.IOException: Invalid DER: object is not integer`).

fabric8's jars come from Maven Central once and are cached by version (devstack.fabric8).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from devstack import StackInfo
from devstack.fabric8 import ensure_fabric8, list_namespaces
from devstack.pki import ClusterPKI
from lockgate_adapters.tls import issue_certificate, read_certificate_and_key


def test_fabric8_lists_namespaces_with_the_admin_kubeconfig(stack: StackInfo) -> None:
    home, seconds = ensure_fabric8()
    print(f"fabric8 ready in {seconds:.1f}s")
    for cluster, kubeconfig in stack.kubeconfigs.items():
        done = list_namespaces(home, kubeconfig)
        assert done.returncode == 0, f"{cluster}: {done.stdout}{done.stderr}"
        assert {"default", "kube-system", "lockgate-system"} <= set(done.stdout.split()), cluster


def test_the_old_key_format_is_what_fabric8_refused(stack: StackInfo, tmp_path: Path) -> None:
    """Guards the test itself: an admin kubeconfig with an EC key in PKCS#8, as stacks had, is
    refused by the same program, so the test above passes because of the key format."""
    home, _ = ensure_fabric8()
    kubeconfig = Path(stack.kubeconfigs["cluster-a"])
    pki = ClusterPKI(kubeconfig.parent / "pki", "cluster-a")
    ca, ca_key = read_certificate_and_key(pki.ca_crt, pki.ca_key)
    assert ca is not None and ca_key is not None
    cert, key = issue_certificate(ca, ca_key, common_name="lockgate-admin",
                                  organizations=["system:masters"], server=False,
                                  now=dt.datetime.now(dt.UTC), valid_for=dt.timedelta(hours=1))
    config = json.loads(kubeconfig.read_text())
    user = config["users"][0]["user"]
    user["client-certificate-data"] = base64.b64encode(
        cert.public_bytes(serialization.Encoding.PEM)).decode()
    user["client-key-data"] = base64.b64encode(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())).decode()
    old = tmp_path / "old-format.kubeconfig"
    old.write_text(json.dumps(config))
    done = list_namespaces(home, old)
    assert done.returncode == 1 and "Invalid DER: object is not integer" in done.stdout, (
        done.stdout + done.stderr)
