"""One Kubernetes control plane per cluster: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, all on loopback ports, plus kubeconfigs and fake nodes.

An autoscaled cluster (config.AUTOSCALED_CLUSTERS) starts with no node and runs Karpenter too
(devstack.karpenter): Karpenter's kwok provider creates Node objects annotated
kwok.x-k8s.io/node=fake, the annotation this kwok manages, so the same kwok and its Stages
(kwok-stages.yaml) mark them Ready; Karpenter then removes its karpenter.sh/unregistered taint.
There the node Stage gives Karpenter's nodes their instance type's capacity
(`instance_sized_stages`), as a real machine has."""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
from pathlib import Path
from typing import Any

from devstack.config import AUTOSCALED_CLUSTERS, HOST, Settings
from devstack.errors import StackError
from devstack.pki import ClusterPKI
from devstack.procs import Component, http_ok

SERVICE_CIDR = "10.96.0.0/16"
POD_CIDRS = {"cluster-a": "10.244.0.1/16", "cluster-b": "10.245.0.1/16"}
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


class Cluster:
    """Paths, files and components of one cluster."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.s = settings
        self.name = name
        self.ports = settings.cluster_ports[name]
        self.dir = settings.cluster_dir(name)
        self.pki = ClusterPKI(self.dir / "pki", name)
        self.kubeconfig = settings.kubeconfig(name)
        self.autoscaled = name in AUTOSCALED_CLUSTERS

    @property
    def server(self) -> str:
        return f"https://{HOST}:{self.ports.apiserver}"

    def component_kubeconfig(self, who: str) -> Path:
        return self.dir / f"{who}.kubeconfig"

    # -- files --
    def prepare(self) -> None:
        """Writes certificates, kubeconfigs and component configs (idempotent)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "etcd").mkdir(exist_ok=True, mode=0o700)
        self.pki.ensure()
        write_if_changed(self.kubeconfig, self._kubeconfig_text("admin", f"{self.name}-admin"))
        for who in ("kube-controller-manager", "kube-scheduler", "kwok",
                    *(("karpenter",) if self.autoscaled else ())):
            write_if_changed(self.component_kubeconfig(who), self._kubeconfig_text(who, who))
        sched = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {
                "kubeconfig": str(self.component_kubeconfig("kube-scheduler")),
                "qps": 500,
                "burst": 1000,
            },
            "leaderElection": {"leaderElect": False},
        }
        write_if_changed(self.dir / "kube-scheduler.yaml", json.dumps(sched, indent=2) + "\n")
        stages = Path(__file__).with_name("kwok-stages.yaml").read_text()
        if self.autoscaled:
            stages = instance_sized_stages(stages)
        kwok_conf = (
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\n"
            "kind: KwokConfiguration\n"
            # Options given in a file get no defaults: set every one that matters.
            "options:\n"
            "  manageAllNodes: false\n"
            "  enableDebuggingHandlers: true\n"
            "  enableContentionProfiling: false\n"
            "  enableProfilingHandler: false\n"
            "  podPlayStageParallelism: 16\n"
            "  nodePlayStageParallelism: 4\n"
            "  nodeLeaseParallelism: 4\n"
            "  podsOnNodeSyncParallelism: 2\n"
            "  enablePodsOnNodeSyncListPager: true\n"
            "  enablePodsOnNodeSyncStreamWatch: false\n"
            "---\n"
        )
        write_if_changed(self.dir / "kwok.yaml", kwok_conf + stages)

    def _kubeconfig_text(self, cert_name: str, user: str) -> str:
        return self._kubeconfig_doc(user, {
            "client-certificate-data": _b64(self.pki.crt(cert_name)),
            "client-key-data": _b64(self.pki.key(cert_name)),
        })

    def token_kubeconfig_text(self, user: str, token: str) -> str:
        """A kubeconfig that authenticates with a bearer token (a ServiceAccount's)."""
        return self._kubeconfig_doc(user, {"token": token})

    def _kubeconfig_doc(self, user: str, credentials: dict[str, str]) -> str:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.name,
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(self.pki.ca_crt),
                    },
                }
            ],
            "users": [
                {"name": user, "user": credentials}
            ],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": user}}],
            "current-context": self.name,
            "preferences": {},
        }
        return json.dumps(doc, indent=2) + "\n"

    # -- components --
    def components(self) -> list[Component]:
        b = self.s.bin_dir
        p = self.ports
        pki = self.pki
        etcd_url = f"http://{HOST}:{p.etcd_client}"
        etcd = Component(
            name=f"{self.name}/etcd",
            argv=[
                str(b / "etcd"),
                f"--name={self.name}",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://{HOST}:{p.etcd_peer}",
                f"--initial-advertise-peer-urls=http://{HOST}:{p.etcd_peer}",
                f"--initial-cluster={self.name}=http://{HOST}:{p.etcd_peer}",
                "--initial-cluster-state=new",
                # Test data only: skip fsync so etcd does not stall on a busy shared disk.
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--auto-compaction-mode=periodic",
                "--auto-compaction-retention=5m",
                "--log-level=warn",
            ],
            cwd=self.dir,
            ports=[p.etcd_client, p.etcd_peer],
            endpoint=f"{HOST}:{p.etcd_client}",
            health=lambda: _etcd_health(p.etcd_client),
        )
        apiserver = Component(
            name=f"{self.name}/kube-apiserver",
            argv=[
                str(b / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={HOST}",
                f"--advertise-address={HOST}",
                f"--secure-port={p.apiserver}",
                f"--tls-cert-file={pki.crt('apiserver')}",
                f"--tls-private-key-file={pki.key('apiserver')}",
                f"--client-ca-file={pki.ca_crt}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                # Loopback is not a valid Endpoints address: do not publish `kubernetes` endpoints.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                "--max-requests-inflight=800",
                "--max-mutating-requests-inflight=400",
                "--event-ttl=30m",
                # PodTemplates, which lockgate never reads, are watched straight from etcd: a
                # test can then compact etcd and get 410 Gone at once, whatever the stack's age
                # (the watch cache keeps old events for as long as it has room).
                "--watch-cache-sizes=podtemplates#0",
                f"--cert-dir={self.dir / 'apiserver-certs'}",
            ],
            cwd=self.dir,
            ports=[p.apiserver],
            endpoint=self.server,
            health=lambda: self.get_health("/readyz"),
        )
        kcm = Component(
            name=f"{self.name}/kube-controller-manager",
            argv=[
                str(b / "kube-controller-manager"),
                f"--kubeconfig={self.component_kubeconfig('kube-controller-manager')}",
                f"--bind-address={HOST}",
                f"--secure-port={p.controller_manager}",
                f"--cert-dir={self.dir / 'kcm-certs'}",
                "--leader-elect=false",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_crt}",
                f"--cluster-signing-cert-file={pki.ca_crt}",
                f"--cluster-signing-key-file={pki.ca_key}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--profiling=false",
            ],
            cwd=self.dir,
            ports=[p.controller_manager],
            endpoint=f"https://{HOST}:{p.controller_manager}",
            health=lambda: _insecure_https_ok(p.controller_manager, "/healthz"),
        )
        scheduler = Component(
            name=f"{self.name}/kube-scheduler",
            argv=[
                str(b / "kube-scheduler"),
                f"--config={self.dir / 'kube-scheduler.yaml'}",
                f"--bind-address={HOST}",
                f"--secure-port={p.scheduler}",
                f"--cert-dir={self.dir / 'scheduler-certs'}",
                "--profiling=false",
            ],
            cwd=self.dir,
            ports=[p.scheduler],
            endpoint=f"https://{HOST}:{p.scheduler}",
            health=lambda: _insecure_https_ok(p.scheduler, "/healthz"),
        )
        kwok = Component(
            name=f"{self.name}/kwok",
            argv=[
                str(b / "kwok"),
                f"--kubeconfig={self.component_kubeconfig('kwok')}",
                f"--config={self.dir / 'kwok.yaml'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--server-address={HOST}:{p.kwok}",
                f"--cidr={POD_CIDRS.get(self.name, '10.250.0.1/16')}",
                "--node-lease-duration-seconds=40",
                # Nothing connects to the fake nodes; loopback keeps any stray attempt local.
                f"--node-ip={HOST}",
            ],
            cwd=self.dir,
            ports=[p.kwok],
            endpoint=f"http://{HOST}:{p.kwok}",
            health=lambda: http_ok(p.kwok, "/healthz"),
        )
        if not self.autoscaled:
            return [etcd, apiserver, kcm, scheduler, kwok]
        # Imported here: `python -m devstack.karpenter` runs that module as __main__, which the
        # package (devstack/__init__ imports this module) must not have imported already.
        from devstack.karpenter import karpenter_component, karpenter_dir

        karpenter = karpenter_component(
            cluster=self.name, home=karpenter_dir(self.s),
            kubeconfig=self.component_kubeconfig("karpenter"), workdir=self.dir,
            metrics_port=p.karpenter_metrics, health_port=p.karpenter_health)
        return [etcd, apiserver, kcm, scheduler, kwok, karpenter]

    # -- API access (admin identity, verified TLS) --
    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        ctx.load_cert_chain(str(self.pki.crt("admin")), str(self.pki.key("admin")))
        return ctx

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 5.0,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection(
            HOST, self.ports.apiserver, context=self._ssl(), timeout=timeout
        )
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw.decode(errors="replace")
        return resp.status, data

    def get_health(self, path: str) -> str | None:
        try:
            status, data = self.request("GET", path, timeout=3.0)
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if status == 200 else f"{path} -> {status} {str(data)[:200]}"

    def node_names(self) -> list[str]:
        """The fixed fake nodes (none in an autoscaled cluster: Karpenter makes its nodes)."""
        if self.autoscaled:
            return []
        return [f"{self.name}-node-{i}" for i in range(self.s.nodes_per_cluster)]

    @property
    def _kwok_nodes_query(self) -> str:
        """The nodes this cluster's kwok acts for: the fixed ones (label type=kwok), or in an
        autoscaled cluster every node (Karpenter's carry no label of the stack's)."""
        return "/api/v1/nodes" if self.autoscaled else "/api/v1/nodes?labelSelector=type%3Dkwok"

    def ensure_nodes(self) -> int:
        """Creates the missing fake nodes; returns how many were created."""
        status, data = self.request("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")
        if status != 200:
            raise StackError(f"{self.name}: listing nodes failed: {status} {data}")
        have = {item["metadata"]["name"] for item in data.get("items", [])}
        created = 0
        resources_ = {
            "cpu": self.s.node_cpu,
            "memory": self.s.node_memory,
            "pods": self.s.node_pods,
        }
        for node in self.node_names():
            if node in have:
                continue
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node,
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": node,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "lockgate.io/cluster": self.name,
                    },
                    "annotations": {
                        KWOK_NODE_ANNOTATION: "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                },
                "spec": {},
                "status": {"capacity": resources_, "allocatable": resources_},
            }
            status, data = self.request("POST", "/api/v1/nodes", body)
            if status not in (201, 409):
                raise StackError(f"{self.name}: creating node {node} failed: {status} {data}")
            created += status == 201
        return created

    def release_node_leases(self) -> None:
        """Deletes the kwok nodes' leases left by a previous kwok process.

        kwok only acts for nodes whose lease it holds, and each kwok process has a new identity:
        without this a restarted kwok would wait for the old leases (40 s) to expire.
        """
        status, data = self.request("GET", self._kwok_nodes_query)
        if status != 200:
            raise StackError(f"{self.name}: listing nodes failed: {status} {data}")
        for item in data.get("items", []):
            name = item["metadata"]["name"]
            path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
            status, data = self.request("DELETE", path)
            if status not in (200, 404):
                raise StackError(f"{self.name}: deleting lease {name} failed: {status} {data}")

    def readiness(self) -> str | None:
        """None when the fake nodes are Ready and schedulable and kcm made the default SA."""
        try:
            status, data = self.request("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")
            if status != 200:
                return f"listing nodes: {status}"
            ready = 0
            for item in data.get("items", []):
                conditions = item.get("status", {}).get("conditions", [])
                conds = {c["type"]: c["status"] for c in conditions}
                taints = [t["key"] for t in item.get("spec", {}).get("taints", []) or []]
                if conds.get("Ready") == "True" and not any(
                    t.startswith("node.kubernetes.io/") for t in taints
                ):
                    ready += 1
            want = len(self.node_names())
            if ready < want:
                return f"{ready}/{want} nodes Ready and untainted"
            status, _ = self.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            if status != 200:
                return "kube-controller-manager has not created ServiceAccount default/default yet"
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def nodes_summary(self) -> str:
        try:
            status, data = self.request("GET", self._kwok_nodes_query)
        except (OSError, http.client.HTTPException) as exc:
            return f"apiserver unreachable ({type(exc).__name__})"
        if status != 200:
            return f"listing nodes failed ({status})"
        items = data.get("items", [])
        ready = sum(
            1
            for it in items
            for c in it.get("status", {}).get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True"
        )
        made_by = " (Karpenter's)" if self.autoscaled else ""
        return f"{ready}/{len(items)} kwok nodes{made_by} Ready"


# The node Stage's capacity in kwok-stages.yaml, and what it becomes in an autoscaled cluster.
_NODE_CAPACITY = """      capacity:
      {{ with .status.capacity }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: "16"
        memory: 64Gi
        pods: "110"
      {{ end }}
"""
# Karpenter's kwok provider (v1.13) gives a node the capacity of its NodeClaim's pod requests
# (allocatable is the instance type's): a NodePool's status.resources and limits then count 5
# cpu for an 8-cpu node holding a 5-cpu pod, and a pool of small pods grows far beyond its cpu
# limit. A real node's capacity is its machine's, so here cpu and memory come from the instance
# type's labels (karpenter.kwok.sh/instance-cpu and -memory), everything else from allocatable.
_INSTANCE_CAPACITY = """      capacity:
      {{ $cpu := "" }}{{ $memory := "" }}
      {{ with .metadata.labels }}
      {{ $cpu = index . "karpenter.kwok.sh/instance-cpu" }}
      {{ $memory = index . "karpenter.kwok.sh/instance-memory" }}
      {{ end }}
      {{ if and $cpu $memory .status.allocatable }}
        cpu: {{ $cpu | Quote }}
        memory: {{ $memory | Quote }}
      {{ range $name, $quantity := .status.allocatable }}
      {{ if and (ne $name "cpu") (ne $name "memory") }}
        {{ $name }}: {{ $quantity | Quote }}
      {{ end }}
      {{ end }}
      {{ else }}
""" + _NODE_CAPACITY.split("\n", 1)[1] + "      {{ end }}\n"


def instance_sized_stages(stages: str) -> str:
    """kwok's Stages for an autoscaled cluster: a Karpenter node's capacity is its instance
    type's (see _INSTANCE_CAPACITY); other nodes' as in every cluster."""
    if stages.count(_NODE_CAPACITY) != 1:
        raise StackError("kwok-stages.yaml's node capacity block changed; update "
                         "devstack.kube._NODE_CAPACITY (autoscaled clusters rewrite it)")
    return stages.replace(_NODE_CAPACITY, _INSTANCE_CAPACITY)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    # A file of this process' own: two pytest sessions may refresh the same kubeconfig at once.
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")
    # Created private: kubeconfigs hold keys and tokens.
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(text)
    tmp.chmod(0o600)
    tmp.replace(path)


def compact_etcd(cluster: str, settings: Settings | None = None) -> int:
    """Compact `cluster`'s etcd up to its current revision (physically); returns that revision.

    Tests use it to make "a resourceVersion long compacted away" true on a stack of any age,
    instead of waiting for the periodic compaction.
    """
    port = (settings or Settings.from_env()).cluster_ports[cluster].etcd_client
    header = _etcd_post(port, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})
    revision = int(header["header"]["revision"])
    _etcd_post(port, "/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


def _etcd_post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One call of etcd's JSON gateway; StackError says what failed."""
    conn = http.client.HTTPConnection(HOST, port, timeout=10.0)
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        payload = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise StackError(f"etcd on port {port}: {path} failed: {exc}") from exc
    finally:
        conn.close()
    if resp.status != 200:
        raise StackError(f"etcd on port {port}: {path} -> {resp.status} {payload[:200]!r}")
    answer: dict[str, Any] = json.loads(payload)
    return answer


def _etcd_health(port: int) -> str | None:
    conn = http.client.HTTPConnection(HOST, port, timeout=2.0)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        body = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    if resp.status == 200 and b'"health":"true"' in body.replace(b" ", b""):
        return None
    return f"/health -> {resp.status} {body[:100]!r}"


def _insecure_https_ok(port: int, path: str) -> str | None:
    # kube-controller-manager and kube-scheduler serve a self-signed certificate on loopback;
    # this only asks whether they are alive.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return http_ok(port, path, tls=ctx)
