"""Composition root of the admission webhook: certificates, clients, the server and its loops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from kubernetes_asyncio import client, config

from admission_webhook.certificates import ensure_certificates, needs_renewal
from admission_webhook.cluster_lookups import ClusterLookups
from admission_webhook.queue_directory import READINESS_CHECK as QUEUES_CHECK
from admission_webhook.queue_directory import QueueDirectory
from admission_webhook.registration import apply_webhook_configuration, delete_webhook_configuration
from admission_webhook.server import AdmissionServer
from admission_webhook.settings import IN_CLUSTER, WebhookSettings
from lockgate.admission import ServiceReference, webhook_configuration
from lockgate_adapters.health import Readiness
from lockgate_adapters.kube import api_client
from lockgate_adapters.retrying import BackoffIterator, sleep_unless_stopped
from lockgate_adapters.service import Loop, ServiceContext

log = logging.getLogger(__name__)

REGISTRATION_CHECK = "registration"
SERVING_CHECK = "serving"
CERTIFICATE_CHECK_SECONDS = 3600.0


async def compose(ctx: ServiceContext) -> list[Loop]:
    settings = ctx.settings
    assert isinstance(settings, WebhookSettings)
    # Declared before the first await: /readyz is already served, and no conditions means ready.
    ctx.readiness.declare(SERVING_CHECK, QUEUES_CHECK)
    if settings.register_in_clusters:
        ctx.readiness.declare(REGISTRATION_CHECK)
    # Every review asks Postgres about its queue. Apiservers are not declared: this readiness
    # steers the traffic of every cluster, and one cluster's outage must not refuse the others.
    ctx.dependencies.postgres(settings.postgres_dsn)
    if not settings.clusters:
        raise ValueError('no clusters configured: set LOCKGATE_WEBHOOK_CLUSTERS, e.g. '
                         '\'{"cluster-a": "/path/to/kubeconfig"}\'')
    certificates = await asyncio.to_thread(ensure_certificates, settings.cert_dir,
                                           hosts=settings.cert_hosts)
    apis = {name: await _api_client(kubeconfig) for name, kubeconfig in settings.clusters.items()}
    queues = QueueDirectory(
        settings.postgres_dsn, ttl=settings.queue_cache_ttl_seconds,
        check_timeout=settings.queue_check_timeout_seconds, retry=settings.retry,
        readiness=ctx.readiness,
    )
    server = AdmissionServer(
        clusters={
            name: ClusterLookups(
                name, api, timeout=settings.kube_lookup_timeout_seconds,
                namespace_ttl=settings.namespace_cache_ttl_seconds,
                owner_ttl=settings.owner_cache_ttl_seconds,
                max_owner_depth=settings.max_owner_depth,
            )
            for name, api in apis.items()
        },
        queues=queues, certificates=certificates, host=settings.host, port=settings.port,
        answer_within=settings.answer_within_seconds,
    )

    async def serve(stopping: asyncio.Event) -> None:
        """Serve, register once serving, keep registration and certificate current, then stop."""
        nonlocal certificates
        try:
            port = await server.start()
            ctx.readiness.set(SERVING_CHECK, True, f"https on port {port}")
            registrar = _Registrar(settings, apis, ctx.readiness, port)
            next_certificate_check = asyncio.get_running_loop().time()
            while not stopping.is_set():
                if asyncio.get_running_loop().time() >= next_certificate_check:
                    next_certificate_check += CERTIFICATE_CHECK_SECONDS
                    if needs_renewal(certificates):
                        certificates = await asyncio.to_thread(
                            ensure_certificates, settings.cert_dir, hosts=settings.cert_hosts)
                        server.use_certificates(certificates)
                wait = settings.reregister_interval_seconds
                if settings.register_in_clusters:
                    wait = await registrar.register(certificates.ca_pem)
                await sleep_unless_stopped(stopping, min(wait, CERTIFICATE_CHECK_SECONDS))
        finally:
            if settings.register_in_clusters and settings.unregister_on_shutdown:
                await _unregister(settings, apis)
            await server.stop()
            for api in apis.values():
                await api.close()

    return [serve, queues.run]


class _Registrar:
    """Keeps the webhook registered in every cluster, retrying the ones that failed sooner."""

    def __init__(self, settings: WebhookSettings, apis: Mapping[str, client.ApiClient],
                 readiness: Readiness, port: int) -> None:
        self._settings, self._apis, self._readiness = settings, apis, readiness
        self._port = port
        self._delays = BackoffIterator(settings.retry)

    async def register(self, ca_pem: bytes) -> float:
        """Apply the configuration everywhere; returns how long to wait before the next pass."""
        settings = self._settings
        failed: dict[str, str] = {}
        for cluster, api in self._apis.items():
            path = f"/mutate/{cluster}"
            service = None
            if settings.service is not None:
                namespace, name = settings.service.split("/")
                service = ServiceReference(namespace=namespace, name=name, path=path)
            manifest = webhook_configuration(
                name=settings.configuration_name,
                url=None if service else f"https://{settings.url_host}:{self._port}{path}",
                service=service,
                ca_bundle_pem=ca_pem,
                timeout_seconds=settings.apiserver_timeout_seconds,
                extra_namespace_labels=settings.extra_namespace_labels,
            )
            try:
                action = await apply_webhook_configuration(api, manifest)
            except Exception as error:  # noqa: BLE001 - retried; readiness says why
                failed[cluster] = repr(error)
                log.warning("%s: cannot register the webhook: %r", cluster, error)
                continue
            log.debug("%s: %s MutatingWebhookConfiguration %s", cluster, action,
                      settings.configuration_name)
        if failed:
            self._readiness.set(REGISTRATION_CHECK, False, f"not registered in {failed}")
            return next(self._delays, settings.retry.max_seconds)
        self._delays.reset()
        self._readiness.set(REGISTRATION_CHECK, True,
                            f"registered in {', '.join(self._apis)}")
        return settings.reregister_interval_seconds


async def _unregister(settings: WebhookSettings, apis: Mapping[str, client.ApiClient]) -> None:
    for cluster, api in apis.items():
        try:
            await delete_webhook_configuration(api, settings.configuration_name)
        except Exception as error:  # noqa: BLE001 - best effort on the way out
            log.warning("%s: cannot remove the webhook registration: %r", cluster, error)


async def _api_client(kubeconfig: str) -> client.ApiClient:
    if kubeconfig != IN_CLUSTER:
        return await api_client(kubeconfig)
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)
