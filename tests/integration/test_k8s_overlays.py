"""Every overlay of k8s/ renders with kustomize and is accepted by a real kube-apiserver.

Rendering: `kubectl kustomize` of the kubectl devstack builds and caches by version. Applying:
`kubectl apply --server-side --dry-run=server` to the local cluster-a, so the apiserver checks
every object as it would persist it (schema and strict field validation, defaulting, admission,
server-side apply merging with what k8s/base already put there) without keeping anything: the
overlays hold a fail-closed MutatingWebhookConfiguration for every managed namespace and
Deployments whose pods would land on the stack's kwok nodes, neither of which may reach a stack
other tests share. cert-manager's CRDs are not part of the local stack: where none exist, a
minimal stand-in (tests/fixtures/cert-manager-crds-minimal.yaml) is installed for the cert-manager
overlay and removed afterwards.

Beside the apiserver's verdict, the rendered objects are checked for what issue 11 asks of them:
no service links, requests and probes on every container, a PodDisruptionBudget for the
webhook, one serving certificate Secret shared by all replicas and the caBundle it came with.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack import StackInfo
from devstack.config import Settings
from lockgate_adapters.webhook_tls import ensure_webhook_tls, service_hosts

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_CRDS = ROOT / "tests" / "fixtures" / "cert-manager-crds-minimal.yaml"
OVERLAYS = ["kind", "kind-b", "production", "production-cert-manager"]
SELF_MANAGED_TLS = {"kind", "production"}  # overlays whose ./tls the user makes
FIELD_MANAGER = "lockgate-overlay-test"


@pytest.fixture(scope="module")
def kubectl(stack: StackInfo) -> Path:
    path = Settings.from_env().bin_dir / "kubectl"
    if not path.is_file():
        pytest.fail(f"kubectl is missing from devstack's cache ({path}): run "
                    "`python -m devstack up`, which builds it", pytrace=False)
    return path


@pytest.fixture(scope="module")
def k8s_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of k8s/ with the self-managed certificate files made as docs/deploying.md says."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(ROOT / "k8s", tree, ignore=shutil.ignore_patterns("tls"))
    for overlay in SELF_MANAGED_TLS:
        ensure_webhook_tls(tree / "overlays" / overlay / "tls",
                           hosts=service_hosts("lockgate-webhook", "lockgate-system"))
    return tree


def run(*argv: str | Path, stdin: str | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], input=stdin, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, (f"{' '.join(map(str, argv))} failed ({done.returncode}):\n"
                                  f"{done.stderr}\n{done.stdout[-2000:]}")
    return done.stdout


def render(kubectl: Path, tree: Path, overlay: str) -> tuple[str, list[dict[str, Any]]]:
    text = run(kubectl, "kustomize", tree / "overlays" / overlay)
    return text, [o for o in yaml.safe_load_all(text) if o]


@pytest.fixture(scope="module")
def cert_manager_crds(stack: StackInfo, kubectl: Path) -> Any:
    kubeconfig = stack.kubeconfigs["cluster-a"]
    present = json.loads(run(kubectl, "--kubeconfig", kubeconfig, "get", "crd", "-o", "json",
                             "--field-selector", "metadata.name=certificates.cert-manager.io"))
    ours = not present["items"]
    if ours:
        run(kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side",
            f"--field-manager={FIELD_MANAGER}", "-f", FIXTURE_CRDS)
        run(kubectl, "--kubeconfig", kubeconfig, "wait", "--for=condition=Established",
            "--timeout=60s", "crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io")
    yield "minimal stand-in" if ours else "already installed"
    if ours:
        run(kubectl, "--kubeconfig", kubeconfig, "delete", "-f", FIXTURE_CRDS,
            "--ignore-not-found")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_apiserver_accepts_every_object_of_the_overlay(
        overlay: str, stack: StackInfo, kubectl: Path, k8s_tree: Path,
        request: pytest.FixtureRequest) -> None:
    if overlay == "production-cert-manager":
        request.getfixturevalue("cert_manager_crds")
    text, objects = render(kubectl, k8s_tree, overlay)
    kubeconfig = stack.kubeconfigs["cluster-a"]
    started = time.monotonic()
    # --force-conflicts: devstack's field manager owns k8s/base's objects on this stack, and an
    # atomic field (a policy's matchConstraints) would otherwise be refused as a conflict.
    out = run(kubectl, "--kubeconfig", kubeconfig, "apply", "--server-side", "--dry-run=server",
              f"--field-manager={FIELD_MANAGER}", "--force-conflicts", "-f", "-", stdin=text)
    applied = [line for line in out.splitlines() if "serverside-applied (server dry run)" in line]
    assert len(applied) == len(objects), out
    # Each object by kind and name, as the apiserver named it back.
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
            "PodDisruptionBudget", "CustomResourceDefinition", "ClusterRole"} <= kinds
    print(f"{overlay}: {len(objects)} objects accepted in {time.monotonic() - started:.1f}s")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_runs_without_service_links_with_requests_and_probes(
        overlay: str, kubectl: Path, k8s_tree: Path) -> None:
    _, objects = render(kubectl, k8s_tree, overlay)
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    assert "lockgate-webhook" in deployments
    if not overlay.startswith("kind"):  # kind runs the central services in docker compose
        assert set(deployments) == {"lockgate-webhook", "lockgate-queue-store",
                                    "lockgate-cluster-watcher", "lockgate-fair-scheduler",
                                    "lockgate-ungater"}
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["enableServiceLinks"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for container in pod["containers"]:
            assert container["resources"]["requests"]["cpu"], name
            assert container["resources"]["requests"]["memory"], name
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
            if name != "lockgate-fair-scheduler":  # a standby is healthy, never ready
                assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
    budgets = {o["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
               for o in objects if o["kind"] == "PodDisruptionBudget"}
    assert "lockgate-webhook" in budgets


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicas_share_one_certificate_that_the_registration_trusts(
        overlay: str, kubectl: Path, k8s_tree: Path) -> None:
    _, objects = render(kubectl, k8s_tree, overlay)
    webhook = next(o for o in objects if o["kind"] == "Deployment"
                   and o["metadata"]["name"] == "lockgate-webhook")
    pod = webhook["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["LOCKGATE_WEBHOOK_TLS_DIR"] == "/tls"
    (tls_volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    secret_name = tls_volume["secret"]["secretName"]
    assert not [v for v in pod["volumes"] if "emptyDir" in v and v["name"] == "tls"]
    (registration,) = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    (hook,) = registration["webhooks"]
    cluster = next(o for o in objects if o["kind"] == "ConfigMap"
                   and o["metadata"]["name"] == "lockgate-cluster")["data"]["name"]
    assert hook["clientConfig"]["service"]["path"] == f"/mutate/{cluster}"
    if overlay == "production-cert-manager":
        annotations = registration["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == "lockgate-system/lockgate-webhook"
        (certificate,) = [o for o in objects if o["kind"] == "Certificate"
                          and o["metadata"]["name"] == "lockgate-webhook"]
        assert certificate["spec"]["secretName"] == secret_name == "lockgate-webhook-tls"
        assert set(certificate["spec"]["dnsNames"]) == set(
            service_hosts("lockgate-webhook", "lockgate-system"))
        return
    (secret,) = [o for o in objects if o["kind"] == "Secret"
                 and o["metadata"]["name"] == secret_name]
    assert secret["type"] == "kubernetes.io/tls"
    ca = base64.b64decode(secret["data"]["ca.crt"])
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca
    assert ca.startswith(b"-----BEGIN CERTIFICATE-----")
