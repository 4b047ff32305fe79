"""Composition root of the admission webhook: certificates, clients, the queue copies, the server.

It needs nothing outside the clusters it serves: no database, and it does not register itself
(the MutatingWebhookConfiguration is static, k8s/base; deleting it is the off-switch).
"""

from __future__ import annotations

import asyncio
import logging

from kubernetes_asyncio import client, config

from admission_webhook.certificates import (
    MountedCertificates,
    ServingCertificates,
    ensure_certificates,
    needs_renewal,
)
from admission_webhook.cluster_lookups import ClusterLookups
from admission_webhook.queue_watching import ClusterQueues, QueueCopies
from admission_webhook.server import AdmissionServer
from admission_webhook.settings import IN_CLUSTER, WebhookSettings
from lockgate_adapters.kube import api_client
from lockgate_adapters.retrying import sleep_unless_stopped
from lockgate_adapters.service import Loop, ServiceContext

log = logging.getLogger(__name__)

SERVING_CHECK = "serving"
# What each cluster's copy holds now: operators (and the launcher) see what admission knows.
QUEUES_PATH = "/api/v1/queues"
CERTIFICATE_CHECK_SECONDS = 3600.0
# A mounted Secret is renewed by someone else (cert-manager): look for a new one this often.
MOUNTED_CHECK_SECONDS = 30.0


async def compose(ctx: ServiceContext) -> list[Loop]:
    settings = ctx.settings
    assert isinstance(settings, WebhookSettings)
    # Declared before the first await: /readyz is already served, and no conditions means ready.
    ctx.readiness.declare(SERVING_CHECK)
    if not settings.clusters:
        raise ValueError('no clusters configured: set LOCKGATE_WEBHOOK_CLUSTERS, e.g. '
                         '\'{"cluster-a": "/path/to/kubeconfig"}\'')
    mounted = MountedCertificates(settings.tls_dir) if settings.tls_dir else None

    def current_certificates() -> ServingCertificates:
        if mounted is not None:
            return mounted.load()
        return ensure_certificates(settings.cert_dir, hosts=settings.cert_hosts)

    certificates = await asyncio.to_thread(current_certificates)
    apis = {name: await _api_client(kubeconfig) for name, kubeconfig in settings.clusters.items()}
    queues = QueueCopies({
        name: ClusterQueues(name, api, source=settings.queue_source, readiness=ctx.readiness,
                            retry=settings.retry,
                            watch_timeout_seconds=settings.queue_watch_timeout_seconds,
                            confirm_timeout_seconds=settings.kube_lookup_timeout_seconds)
        for name, api in apis.items()
    })
    ctx.health.add_json_view(QUEUES_PATH, queues.as_json)
    server = AdmissionServer(
        clusters={
            name: ClusterLookups(
                name, api, timeout=settings.kube_lookup_timeout_seconds,
                namespace_ttl=settings.namespace_cache_ttl_seconds,
                namespace_stale_seconds=settings.namespace_stale_seconds,
                owner_ttl=settings.owner_cache_ttl_seconds,
                max_owner_depth=settings.max_owner_depth,
            )
            for name, api in apis.items()
        },
        queues=queues, certificates=certificates, host=settings.host, port=settings.port,
        answer_within=settings.answer_within_seconds,
    )

    async def serve(stopping: asyncio.Event) -> None:
        """Serve, keep the certificate current, then stop."""
        nonlocal certificates
        try:
            port = await server.start()
            ctx.readiness.set(SERVING_CHECK, True, f"https on port {port}")
            while not stopping.is_set():
                if mounted is not None and mounted.changed():
                    try:
                        certificates = await asyncio.to_thread(mounted.load)
                        server.use_certificates(certificates)
                    except ValueError as error:
                        # Keep serving the previous pair; a half-updated Secret is retried.
                        log.warning("not reloading the serving certificate: %s", error)
                elif mounted is None and needs_renewal(certificates):
                    certificates = await asyncio.to_thread(current_certificates)
                    server.use_certificates(certificates)
                await sleep_unless_stopped(stopping, MOUNTED_CHECK_SECONDS if mounted
                                           else CERTIFICATE_CHECK_SECONDS)
        finally:
            await server.stop()

    async def watch_queues(stopping: asyncio.Event) -> None:
        try:
            await queues.run(stopping)
        finally:
            for api in apis.values():
                await api.close()

    return [serve, watch_queues]


async def _api_client(kubeconfig: str) -> client.ApiClient:
    if kubeconfig != IN_CLUSTER:
        return await api_client(kubeconfig)
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)
