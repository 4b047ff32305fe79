"""Creating, updating and removing the webhook's MutatingWebhookConfiguration in a cluster.

Why: the webhook owns its registration, so the URL, port and CA bundle the apiserver uses always
match what this process serves. Removal is for tests and uninstalls only: a stopped webhook stays
registered on purpose, so pods in managed namespaces are refused instead of escaping the queue.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)


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
    replacement = {**manifest,
                   "metadata": {**manifest["metadata"],
                                "resourceVersion": current.metadata.resource_version}}
    # A concurrent writer makes this fail with 409; the caller retries the whole apply.
    await admission.replace_mutating_webhook_configuration(name, replacement)
    return "updated"


async def delete_webhook_configuration(api: client.ApiClient, name: str) -> bool:
    """Remove the configuration; False if it was not there."""
    admission = client.AdmissionregistrationV1Api(api)
    try:
        await admission.delete_mutating_webhook_configuration(name)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    log.info("deleted MutatingWebhookConfiguration %s", name)
    return True
