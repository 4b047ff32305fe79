"""The Helm chart (k8s/helm/lockgate) renders what the kustomize overlays render, and a real
kube-apiserver accepts it.

The chart's manifests are k8s/'s own kustomize sources (linked into its files/), rendered with
the chart's values where the overlays apply theirs. So the verdict is a comparison: `helm
template` with the production overlay's settings gives the same objects (kind, namespace, name)
as `kubectl kustomize k8s/overlays/production`, with the values where they belong (image,
replicas, cluster name in the registration's path, the CA it trusts). Then `kubectl apply
--server-side --dry-run=server` to the local cluster-a checks every object as the apiserver
would persist it, without keeping any (the registration is fail-closed for every managed
namespace of a stack other tests share). Helm is built once from the Go module proxy
(devstack.helm).
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack import StackInfo
from devstack.config import Settings
from devstack.helm import ensure_helm
from lockgate_adapters.webhook_tls import ensure_webhook_tls, service_hosts

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "k8s" / "helm" / "lockgate"
IMAGE = ("registry.example.com/lockgate/lockgate", "0.1.0")  # the production component's
FIELD_MANAGER = "lockgate-helm-test"


def run(*argv: str | Path, stdin: str | None = None, check: bool = True
        ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], input=stdin, capture_output=True, text=True,
                          timeout=300, check=False)
    if check:
        assert done.returncode == 0, (f"{' '.join(map(str, argv))} failed ({done.returncode}):"
                                      f"\n{done.stderr}\n{done.stdout[-2000:]}")
    return done


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_helm()


@pytest.fixture(scope="module")
def kubectl(stack: StackInfo) -> Path:
    path = Settings.from_env().bin_dir / "kubectl"
    assert path.is_file(), f"kubectl is missing from devstack's cache ({path})"
    return path


@pytest.fixture(scope="module")
def k8s_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of k8s/ with the production overlay's certificate files, made as documented."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(ROOT / "k8s", tree, symlinks=True, ignore=shutil.ignore_patterns("tls"))
    ensure_webhook_tls(tree / "overlays" / "production" / "tls",
                       hosts=service_hosts("lockgate-webhook", "lockgate-system"))
    return tree


def objects_of(text: str) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(text) if o]


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    name = meta["name"]
    if obj["kind"] == "Secret" and name.startswith("lockgate-webhook-tls-"):
        # kustomize's secretGenerator suffixes a hash of the content; Helm keeps the name.
        name = "lockgate-webhook-tls"
    return obj["kind"], meta.get("namespace", ""), name


def helm_template(helm: Path, tls: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run(helm, "template", "lockgate", CHART, "--set", "central.enabled=true",
               "--set", "workerCluster.name=worker-1", *extra, check=False)


def tls_files(tls: Path) -> list[str]:
    return ["--set-file", f"workerCluster.webhook.tls.crt={tls / 'tls.crt'}",
            "--set-file", f"workerCluster.webhook.tls.key={tls / 'tls.key'}",
            "--set-file", f"workerCluster.webhook.tls.ca={tls / 'ca.crt'}"]


def test_the_chart_renders_the_production_overlays_objects_with_its_values(
        helm: Path, kubectl: Path, k8s_tree: Path) -> None:
    tls = k8s_tree / "overlays" / "production" / "tls"
    done = helm_template(helm, tls, *tls_files(tls))
    assert done.returncode == 0, done.stderr
    chart = {key(o): o for o in objects_of(done.stdout)}
    overlay = {key(o): o for o in objects_of(
        run(kubectl, "kustomize", k8s_tree / "overlays" / "production").stdout)}
    assert set(chart) == set(overlay), (
        f"only in the chart: {sorted(set(chart) - set(overlay))}; "
        f"only in the overlay: {sorted(set(overlay) - set(chart))}")
    for name, obj in chart.items():
        if name[0] == "Deployment":
            want = overlay[name]["spec"]["template"]["spec"]["containers"]
            got = obj["spec"]["template"]["spec"]["containers"]
            assert [c["image"] for c in got] == [f"{IMAGE[0]}:{IMAGE[1]}"] * len(got), name
            assert [c["resources"] for c in got] == [c["resources"] for c in want], name
            assert obj["spec"].get("replicas") == overlay[name]["spec"].get("replicas"), name
            assert [c.get("env") for c in got] == [c.get("env") for c in want], name
    registration = chart[("MutatingWebhookConfiguration", "", "lockgate")]
    (hook,) = registration["webhooks"]
    assert hook["clientConfig"]["service"]["path"] == "/mutate/worker-1"
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == (tls / "ca.crt").read_bytes()
    assert chart[("ConfigMap", "lockgate-system", "lockgate-cluster")]["data"] == {
        "name": "worker-1"}


def test_the_apiserver_accepts_every_object_the_chart_renders(
        helm: Path, kubectl: Path, k8s_tree: Path, stack: StackInfo) -> None:
    tls = k8s_tree / "overlays" / "production" / "tls"
    done = helm_template(helm, tls, *tls_files(tls))
    assert done.returncode == 0, done.stderr
    objects = objects_of(done.stdout)
    # --force-conflicts: devstack's field manager owns k8s/base's objects on this stack.
    out = run(kubectl, "--kubeconfig", stack.kubeconfigs["cluster-a"], "apply",
              "--server-side", "--dry-run=server", f"--field-manager={FIELD_MANAGER}",
              "--force-conflicts", "-f", "-", stdin=done.stdout).stdout
    applied = [line for line in out.splitlines() if "serverside-applied (server dry run)" in line]
    assert len(applied) == len(objects), out


def test_a_worker_cluster_without_a_certificate_is_refused_with_what_to_do(
        helm: Path, tmp_path: Path) -> None:
    done = helm_template(helm, tmp_path)
    assert done.returncode != 0
    assert "lockgate webhook-tls --out DIR" in done.stderr, done.stderr


def test_with_cert_manager_the_registration_is_injected_and_certificates_are_rendered(
        helm: Path, tmp_path: Path) -> None:
    done = helm_template(helm, tmp_path, "--set", "workerCluster.webhook.tls.certManager=true",
                         "--set", "central.config.LOCKGATE_LOG_LEVEL=DEBUG")
    assert done.returncode == 0, done.stderr
    objects = {key(o): o for o in objects_of(done.stdout)}
    registration = objects[("MutatingWebhookConfiguration", "", "lockgate")]
    assert registration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        "lockgate-system/lockgate-webhook")
    assert ("Certificate", "lockgate-system", "lockgate-webhook") in objects
    assert ("Secret", "lockgate-system", "lockgate-webhook-tls") not in objects  # cert-manager's
    assert objects[("ConfigMap", "lockgate-system", "lockgate-config")]["data"][
        "LOCKGATE_LOG_LEVEL"] == "DEBUG"
