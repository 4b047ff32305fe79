"""lockgate's webhook image run as a container the way a kubelet would run its pod.

Why: k8s/webhook runs the webhook inside each worker cluster, reached through the Service
lockgate-webhook, and kind (which would run it for real) is out of reach here. So this does what
the cluster would: a Service with a ClusterIP in a namespace of the run's own; the kubelet's
environment (service-link variables of that Service, KUBERNETES_SERVICE_HOST/PORT pointing at the
local apiserver), the ServiceAccount token, CA and namespace mounted at
/var/run/secrets/kubernetes.io/serviceaccount; and kube-proxy's part, a DNAT rule (an nft table
of the run's own) from the Service's ClusterIP to the container. The apiserver then calls the
webhook through the static configuration's Service reference, as in a real cluster: without
--enable-aggregator-routing it resolves a webhook Service to its ClusterIP.
The container shares the host's network (the local apiserver listens on 127.0.0.1 only), so the
webhook binds 127.0.0.1 and the DNAT rule points there.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import random
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.docker import DockerEngine
from devstack.errors import StackError
from devstack.manifests import (
    WEBHOOK_CONFIGURATION,
    apply_webhook_configuration,
    delete_webhook_configuration,
    load,
)

SERVICE_NAME = "lockgate-webhook"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
WEBHOOK_UID = 10001


def service_link_env(service: str, cluster_ip: str, ports: Mapping[str, int]) -> dict[str, str]:
    """The variables a kubelet gives every container for a Service of its namespace
    (enableServiceLinks), e.g. LOCKGATE_WEBHOOK_SERVICE_HOST, LOCKGATE_WEBHOOK_PORT_443_TCP."""
    name = service.upper().replace("-", "_")
    env: dict[str, str] = {f"{name}_SERVICE_HOST": cluster_ip}
    first = True
    for port_name, port in ports.items():
        if first:
            env[f"{name}_SERVICE_PORT"] = str(port)
            env[f"{name}_PORT"] = f"tcp://{cluster_ip}:{port}"
            first = False
        if port_name:
            env[f"{name}_SERVICE_PORT_{port_name.upper().replace('-', '_')}"] = str(port)
        base = f"{name}_PORT_{port}_TCP"
        env.update({base: f"tcp://{cluster_ip}:{port}", f"{base}_PROTO": "tcp",
                    f"{base}_PORT": str(port), f"{base}_ADDR": cluster_ip})
    return env


def render_for_service(static: Mapping[str, Any], *, name: str, namespace: str,
                       ca_bundle_pem: bytes, namespace_labels: Mapping[str, str]
                       ) -> dict[str, Any]:
    """The static configuration under `name`, its Service reference moved to `namespace`, with
    `ca_bundle_pem`, and only for namespaces that also carry `namespace_labels`."""
    rendered = copy.deepcopy(dict(static))
    rendered["metadata"] = {**rendered.get("metadata", {}), "name": name}
    for hook in rendered["webhooks"]:
        service = hook["clientConfig"]["service"]
        hook["clientConfig"] = {"service": {**service, "namespace": namespace},
                                "caBundle": base64.b64encode(ca_bundle_pem).decode()}
        selector = hook.setdefault("namespaceSelector", {})
        selector["matchLabels"] = {**selector.get("matchLabels", {}), **namespace_labels}
    return rendered


def _nft(*args: str) -> None:
    done = subprocess.run(["nft", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StackError(f"nft {' '.join(args)} failed: {done.stderr.strip()} (the nftables "
                         "package gives the nft tool: `apt-get install nftables`)")


def _delete_nft_table(table: str) -> None:
    subprocess.run(["nft", "delete", "table", "ip", table], check=False)


@dataclass
class InClusterWebhook:
    """One cluster's webhook container, its Service, DNAT rule and registration."""

    engine: DockerEngine
    image: str
    cluster: str
    admin_api: client.ApiClient
    api_port: int  # the local apiserver's, on 127.0.0.1
    token: str  # the webhook ServiceAccount's (k8s/base/webhook-rbac.yaml)
    ca_pem: bytes  # the cluster's CA
    run_id: str
    namespace_labels: Mapping[str, str]  # the run's managed namespaces carry these
    queue_source: str
    work_dir: Path
    project_label: str  # com.docker.compose.project of the run, so leftovers are found
    webhook_port: int = 0
    health_port: int = 0
    otlp_endpoint: str | None = None
    cluster_ip: str = ""
    container: str = ""
    created: list[str] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return f"lgc-{self.run_id}-system"

    @property
    def configuration_name(self) -> str:
        return f"lockgate-{self.run_id}"

    @property
    def nft_table(self) -> str:
        return f"lockgate_{self.run_id.replace('-', '_')}_{self.cluster.replace('-', '_')}"

    async def start(self, *, within_seconds: float = 90.0) -> None:
        core = client.CoreV1Api(self.admin_api)
        await core.create_namespace({"metadata": {"name": self.namespace}})
        self.created.append("namespace")
        await self._create_service(core)
        self._add_dnat()
        self._write_service_account()
        self._run_container()
        await self._wait_ready(within_seconds)

    async def _create_service(self, core: client.CoreV1Api) -> None:
        # An explicit ClusterIP from a corner of the range: both local clusters allocate from the
        # same range, and one DNAT rule per IP must not match the other cluster's Service.
        for _ in range(20):
            ip = f"10.96.{random.randint(200, 254)}.{random.randint(2, 254)}"
            try:
                await core.create_namespaced_service(self.namespace, {
                    "metadata": {"name": SERVICE_NAME},
                    "spec": {"clusterIP": ip, "selector": {"app.kubernetes.io/name": SERVICE_NAME},
                             "ports": [{"name": "https", "port": 443, "targetPort": 8443}]}})
            except ApiException as error:
                if error.status == 422:  # allocated already
                    continue
                raise
            self.cluster_ip = ip
            return
        raise StackError("no free ClusterIP for the webhook Service")

    def _add_dnat(self) -> None:
        # kube-proxy's part: ClusterIP:443 -> the webhook (on the host's loopback).
        _nft("add", "table", "ip", self.nft_table)
        self.created.append("nft")
        _nft("add", "chain", "ip", self.nft_table, "out",
             "{ type nat hook output priority -100 ; }")
        _nft("add", "rule", "ip", self.nft_table, "out", "ip", "daddr", self.cluster_ip,
             "tcp", "dport", "443", "dnat", "to", f"127.0.0.1:{self.webhook_port}")

    def _write_service_account(self) -> None:
        sa = self.work_dir / "serviceaccount"
        sa.mkdir(parents=True, exist_ok=True)
        (sa / "token").write_text(self.token)
        (sa / "ca.crt").write_bytes(self.ca_pem)
        (sa / "namespace").write_text("lockgate-system")
        certs = self.work_dir / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        for path in (sa, *sa.iterdir(), certs):
            path.chmod(0o755 if path.is_dir() else 0o644)
        os.chown(certs, WEBHOOK_UID, WEBHOOK_UID)  # the webhook writes its CA and certificate

    def environment(self) -> dict[str, str]:
        """As a kubelet sets it for k8s/webhook/deployment.yaml's container, but bound to
        127.0.0.1 (host network) on free ports."""
        api = str(self.api_port)
        env = {
            # The apiserver's Service (kubernetes.default) as the kubelet announces it; here the
            # apiserver itself, on the host's loopback.
            "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": api,
            "KUBERNETES_SERVICE_PORT_HTTPS": api, "KUBERNETES_PORT": f"tcp://127.0.0.1:{api}",
            f"KUBERNETES_PORT_{api}_TCP": f"tcp://127.0.0.1:{api}",
            f"KUBERNETES_PORT_{api}_TCP_PROTO": "tcp", f"KUBERNETES_PORT_{api}_TCP_PORT": api,
            f"KUBERNETES_PORT_{api}_TCP_ADDR": "127.0.0.1",
            **service_link_env(SERVICE_NAME, self.cluster_ip, {"https": 443}),
            # The Deployment's own variables (explicit ones win over service links).
            "LOCKGATE_WEBHOOK_CLUSTERS": json.dumps({"local": "in-cluster"}),
            "LOCKGATE_WEBHOOK_CERT_HOSTS": json.dumps(
                [f"{SERVICE_NAME}.{self.namespace}.svc"]),
            "LOCKGATE_WEBHOOK_CERT_DIR": "/certs",
            "LOCKGATE_WEBHOOK_HOST": "127.0.0.1",
            "LOCKGATE_WEBHOOK_PORT": str(self.webhook_port),
            "LOCKGATE_WEBHOOK_HTTP_HOST": "127.0.0.1",
            "LOCKGATE_WEBHOOK_HTTP_PORT": str(self.health_port),
            "LOCKGATE_WEBHOOK_QUEUE_SOURCE": self.queue_source,
        }
        if self.otlp_endpoint:
            env["LOCKGATE_OTLP_ENDPOINT"] = self.otlp_endpoint
        return env

    def _run_container(self) -> None:
        self.container = f"{self.project_label}-webhook-{self.cluster}"
        argv = ["run", "-d", "--name", self.container, "--network", "host",
                "--label", f"com.docker.compose.project={self.project_label}",
                "--user", str(WEBHOOK_UID), "--read-only", "--cap-drop", "ALL",
                "--security-opt", "no-new-privileges",
                "-v", f"{self.work_dir / 'serviceaccount'}:{SA_DIR}:ro",
                "-v", f"{self.work_dir / 'certs'}:/certs"]
        for key, value in self.environment().items():
            argv += ["-e", f"{key}={value}"]
        self.engine.docker(*argv, self.image, "python", "-m", "admission_webhook")

    def logs(self) -> str:
        done = self.engine.docker("logs", "--tail", "60", self.container, check=False)
        return (done.stdout or "") + (done.stderr or "")

    async def _wait_ready(self, within_seconds: float) -> None:
        deadline = time.monotonic() + within_seconds
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                state = self.engine.docker("inspect", "-f", "{{.State.Status}}", self.container,
                                           check=False).stdout.strip()
                if state not in ("running", "created") or time.monotonic() > deadline:
                    raise StackError(f"the webhook container of {self.cluster} is not ready "
                                     f"({state}); its log:\n{self.logs()}")
                await asyncio.sleep(0.5)

    async def register(self) -> dict[str, Any]:
        """Apply the static configuration (k8s/base), scoped to the run's namespaces."""
        manifest = render_for_service(
            load(WEBHOOK_CONFIGURATION), name=self.configuration_name,
            namespace=self.namespace,
            ca_bundle_pem=(self.work_dir / "certs" / "ca.crt").read_bytes(),
            namespace_labels=self.namespace_labels)
        await apply_webhook_configuration(self.admin_api, manifest)
        self.created.append("registration")
        return manifest

    async def stop(self) -> None:
        """Undo everything, registration first (a fail-closed hook with nothing behind it)."""
        if "registration" in self.created:
            await delete_webhook_configuration(self.admin_api, self.configuration_name)
        if self.container:
            self.engine.docker("rm", "-f", self.container, check=False)
        if "nft" in self.created:
            _delete_nft_table(self.nft_table)
        if "namespace" in self.created:
            try:
                await client.CoreV1Api(self.admin_api).delete_namespace(self.namespace)
            except ApiException as error:
                if error.status != 404:
                    raise
        self.created.clear()


def kubeconfig_token_and_ca(path: str) -> tuple[str, bytes]:
    """The bearer token and CA of a token kubeconfig (the stack's identity kubeconfigs)."""
    config = yaml.safe_load(Path(path).read_text())
    token = str(config["users"][0]["user"]["token"])
    ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"])
    return token, ca
