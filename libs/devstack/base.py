"""The objects every worker cluster needs (k8s/base), applied to each local control plane, and
a kubeconfig per lockgate identity so each local service runs with its own ServiceAccount.

Why: the local clusters must be set up the way a real worker cluster is, from the same files, so
the tests prove that the RBAC in k8s/base suffices and that the admission policies hold. The
applier is generic: every object of every file listed under `resources` in the kustomization,
with server-side apply (idempotent; a re-apply after a file changed updates the object).
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devstack.config import HOST
from devstack.errors import StackError
from devstack.kube import Cluster, write_if_changed

BASE_DIR = Path(__file__).resolve().parents[2] / "k8s" / "base"
FIELD_MANAGER = "lockgate-devstack"
IDENTITY_NAMESPACE = "lockgate-system"
# lockgate identity → its ServiceAccount in IDENTITY_NAMESPACE (k8s/base/*-rbac.yaml).
IDENTITIES = {
    "cluster-watcher": "lockgate-cluster-watcher",
    "ungater": "lockgate-ungater",
    "webhook": "lockgate-webhook",
    "queue-sync": "lockgate-queue-sync",
    "namespace-keeper": "lockgate-namespace-keeper",
}
TOKEN_SECONDS = 365 * 24 * 3600
# A token this close to expiry is replaced at the next `up`.
RENEW_BEFORE_SECONDS = 30 * 24 * 3600
# What devstack understands of a kustomization: a plain list of files and directories. Anything
# else (patches, namespace, generators) would be silently ignored, so it is refused instead.
_SUPPORTED_KUSTOMIZATION_FIELDS = frozenset({"apiVersion", "kind", "resources"})
# Applied before everything else: the objects the others live in or are instances of.
_FIRST_KINDS = ("Namespace", "CustomResourceDefinition")


def identity_kubeconfig(cluster: Cluster, identity: str) -> Path:
    return cluster.dir / "identities" / f"{identity}.kubeconfig"


def load_objects(directory: Path = BASE_DIR) -> list[dict[str, Any]]:
    """Every object of every resource the kustomization lists, in its order (directories that
    hold a kustomization of their own are followed)."""
    kustomization = directory / "kustomization.yaml"
    if not kustomization.is_file():
        raise StackError(f"{kustomization} is missing: the cluster objects cannot be applied")
    spec = yaml.safe_load(kustomization.read_text()) or {}
    unsupported = sorted(set(spec) - _SUPPORTED_KUSTOMIZATION_FIELDS)
    if unsupported:
        raise StackError(
            f"{kustomization} uses {', '.join(unsupported)}, which devstack's applier does not "
            "implement (only `resources`: files or directories); keep k8s/base plain, or "
            "teach libs/devstack/base.py the field")
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources") or []:
        path = (directory / str(entry)).resolve()
        if path.is_dir():
            objects += load_objects(path)
            continue
        if not path.is_file():
            raise StackError(f"{kustomization} lists {entry}, which does not exist")
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            if not isinstance(document, dict) or not document.get("kind") or not document.get(
                    "apiVersion") or not (document.get("metadata") or {}).get("name"):
                raise StackError(f"{path}: every document needs apiVersion, kind and "
                                 f"metadata.name; got {str(document)[:200]}")
            objects.append(document)
    first = [o for kind in _FIRST_KINDS for o in objects if o["kind"] == kind]
    return first + [o for o in objects if o["kind"] not in _FIRST_KINDS]


@dataclass(frozen=True)
class _Resource:
    plural: str
    namespaced: bool


class _Discovery:
    """Which URL an apiVersion/kind lives at, from the cluster's API discovery."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._cache: dict[str, dict[str, _Resource]] = {}

    def resource(self, api_version: str, kind: str, *, within: float) -> _Resource:
        deadline = time.monotonic() + within
        while True:
            kinds = self._cache.get(api_version)
            if kinds is None or kind not in kinds:
                kinds = self._cache[api_version] = self._load(api_version)
            if kind in kinds:
                return kinds[kind]
            # A CustomResourceDefinition applied a moment ago takes a moment to be served.
            if time.monotonic() > deadline:
                raise StackError(f"{self._cluster.name}: the API serves no kind {kind} in "
                                 f"{api_version}")
            time.sleep(0.2)

    def _load(self, api_version: str) -> dict[str, _Resource]:
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        status, data = self._cluster.request("GET", path)
        if status == 404:
            return {}
        if status != 200:
            raise StackError(f"{self._cluster.name}: discovery of {api_version}: {status} "
                             f"{str(data)[:300]}")
        return {
            str(entry["kind"]): _Resource(str(entry["name"]), bool(entry.get("namespaced")))
            for entry in data.get("resources") or []
            if "/" not in str(entry.get("name", ""))
        }


def _object_path(resource: _Resource, obj: dict[str, Any]) -> str:
    api_version = str(obj["apiVersion"])
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    metadata = obj["metadata"]
    scope = ""
    if resource.namespaced:
        namespace = metadata.get("namespace")
        if not namespace:
            raise StackError(f"{obj['kind']} {metadata['name']} is namespaced but names no "
                             "metadata.namespace")
        scope = f"/namespaces/{namespace}"
    return f"{prefix}{scope}/{resource.plural}/{urllib.parse.quote(metadata['name'])}"


def apply_objects(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    """Server-side apply of each object, as field manager lockgate-devstack (forcing conflicts:
    these files are the truth for the local clusters)."""
    discovery = _Discovery(cluster)
    query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
    for obj in objects:
        resource = discovery.resource(str(obj["apiVersion"]), str(obj["kind"]), within=30.0)
        path = f"{_object_path(resource, obj)}?{query}"
        status, data = cluster.request("PATCH", path, obj,
                                       content_type="application/apply-patch+yaml")
        if status not in (200, 201):
            raise StackError(f"{cluster.name}: applying {obj['kind']} "
                             f"{obj['metadata']['name']} failed: {status} {str(data)[:500]}")


# ---------------------------------------------------------------- identities


def ensure_identity_kubeconfigs(cluster: Cluster) -> dict[str, str]:
    """A kubeconfig per identity (a ServiceAccount token of a year, via the TokenRequest API),
    kept while its token still authenticates and is not near expiry; identity → path."""
    out = {}
    for identity, account in IDENTITIES.items():
        path = identity_kubeconfig(cluster, identity)
        if not _still_good(cluster, path):
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            token = _request_token(cluster, account)
            write_if_changed(path, cluster.token_kubeconfig_text(
                f"{IDENTITY_NAMESPACE}:{account}", token))
        out[identity] = str(path)
    return out


def _request_token(cluster: Cluster, account: str) -> str:
    path = (f"/api/v1/namespaces/{IDENTITY_NAMESPACE}/serviceaccounts/{account}/token")
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": TOKEN_SECONDS}}
    status, data = cluster.request("POST", path, body)
    if status != 201:
        raise StackError(f"{cluster.name}: requesting a token for ServiceAccount "
                         f"{IDENTITY_NAMESPACE}/{account} failed: {status} {str(data)[:300]}")
    return str(data["status"]["token"])


def _token_of(path: Path) -> str | None:
    try:
        config = json.loads(path.read_text())
        return str(config["users"][0]["user"]["token"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _expires_at(token: str) -> float | None:
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError, binascii.Error):
        return None


def _still_good(cluster: Cluster, path: Path) -> bool:
    token = _token_of(path) if path.exists() else None
    if token is None:
        return False
    expires = _expires_at(token)
    if expires is None or expires - time.time() < RENEW_BEFORE_SECONDS:
        return False
    # The token is bound to its ServiceAccount's uid: a recreated account (a purged stack, a
    # deleted namespace) makes it invalid.
    return _authenticates(cluster, token)


def _authenticates(cluster: Cluster, token: str) -> bool:
    context = ssl.create_default_context(cafile=str(cluster.pki.ca_crt))
    conn = http.client.HTTPSConnection(HOST, cluster.ports.apiserver, context=context,
                                       timeout=5.0)
    body = json.dumps({"apiVersion": "authentication.k8s.io/v1",
                       "kind": "SelfSubjectReview"}).encode()
    try:
        conn.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=body,
                     headers={"Authorization": f"Bearer {token}",
                              "Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
    return response.status == 201


def install(clusters: list[Cluster], directory: Path = BASE_DIR) -> Iterator[str]:
    """Applies k8s/base to each cluster and refreshes its identities' kubeconfigs; yields a line
    per cluster for the summary."""
    objects = load_objects(directory)
    for cluster in clusters:
        started = time.monotonic()
        apply_objects(cluster, objects)
        ensure_identity_kubeconfigs(cluster)
        yield (f"{cluster.name}: applied {len(objects)} objects of {directory.name}/ and "
               f"{len(IDENTITIES)} identity kubeconfigs in {time.monotonic() - started:.1f}s")
