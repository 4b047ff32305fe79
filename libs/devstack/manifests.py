"""lockgate's per-cluster manifests (k8s/base) on the local control planes: the Queue CRD, and a
per-run rendering of the static MutatingWebhookConfiguration.

Why in devstack: the webhook no longer registers itself (deleting its configuration must really
switch it off), so whoever runs it locally — the launcher for the demo and tests — applies the
registration: the static one from k8s/base, renamed for the run, pointed at the local URL with
the local CA, and limited to the run's namespaces. It is removed when the run stops.
"""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from lockgate import queue_copies

BASE_DIR = Path(__file__).resolve().parents[2] / "k8s" / "base"
QUEUE_CRD = BASE_DIR / "queue-crd.yaml"
# Beside the in-cluster webhook it registers (k8s/webhook), not in k8s/base: devstack applies
# k8s/base to every local cluster, where only a per-run rendering of it may exist.
WEBHOOK_CONFIGURATION = BASE_DIR.parent / "webhook" / "mutating-webhook-configuration.yaml"


def load(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} holds no single object")
    return loaded


def render_webhook_configuration(
    static: Mapping[str, Any], *, name: str, url: str, ca_bundle_pem: bytes,
    extra_namespace_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The static configuration under `name`, calling `url` (not the in-cluster Service), with
    `ca_bundle_pem`, for namespaces that also carry `extra_namespace_labels`."""
    rendered = copy.deepcopy(dict(static))
    rendered["metadata"] = {**rendered.get("metadata", {}), "name": name}
    for hook in rendered["webhooks"]:
        hook["clientConfig"] = {"url": url,
                                "caBundle": base64.b64encode(ca_bundle_pem).decode()}
        selector = hook.setdefault("namespaceSelector", {})
        selector["matchLabels"] = {**selector.get("matchLabels", {}),
                                   **(extra_namespace_labels or {})}
    return rendered


async def apply_webhook_configuration(api: client.ApiClient, manifest: dict[str, Any]) -> str:
    """Create the configuration, or replace it if one with its name exists; returns which."""
    admission = client.AdmissionregistrationV1Api(api)
    name = manifest["metadata"]["name"]
    try:
        await admission.create_mutating_webhook_configuration(manifest)
        return "created"
    except ApiException as error:
        if error.status != 409:
            raise
    current = await admission.read_mutating_webhook_configuration(name)
    replacement = {**manifest, "metadata": {**manifest["metadata"],
                                            "resourceVersion": current.metadata.resource_version}}
    await admission.replace_mutating_webhook_configuration(name, replacement)
    return "updated"


async def delete_webhook_configuration(api: client.ApiClient, name: str) -> bool:
    """Remove the configuration; False if it was not there."""
    try:
        await client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(name)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


async def ensure_queue_crd(api: client.ApiClient, *, within_seconds: float = 30.0) -> None:
    """Create (or update) the Queue CRD from k8s/base and wait until it is served."""
    manifest = load(QUEUE_CRD)
    extensions = client.ApiextensionsV1Api(api)
    name = manifest["metadata"]["name"]
    try:
        await extensions.create_custom_resource_definition(manifest)
    except ApiException as error:
        if error.status != 409:
            raise
        current = await extensions.read_custom_resource_definition(name)
        await extensions.replace_custom_resource_definition(name, {
            **manifest, "metadata": {**manifest["metadata"],
                                     "resourceVersion": current.metadata.resource_version}})
    deadline = asyncio.get_running_loop().time() + within_seconds
    while True:
        found = await extensions.read_custom_resource_definition(name)
        conditions = (found.status.conditions if found.status else None) or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"CRD {name} not established after {within_seconds:.0f}s")
        await asyncio.sleep(0.1)


async def delete_queue_copies(api: client.ApiClient, *, source: str) -> int:
    """Delete the Queue objects of `source` (a finished local run's); returns how many."""
    custom = client.CustomObjectsApi(api)
    listing = await custom.list_cluster_custom_object(
        queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL,
        label_selector=f"{queue_copies.SOURCE_LABEL}={source}")
    for obj in listing.get("items") or []:
        try:
            await custom.delete_cluster_custom_object(
                queue_copies.GROUP, queue_copies.VERSION, queue_copies.PLURAL,
                obj["metadata"]["name"])
        except ApiException as error:
            if error.status != 404:
                raise
    return len(listing.get("items") or [])
