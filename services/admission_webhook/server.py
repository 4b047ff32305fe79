"""The HTTPS endpoint the apiservers call: one path per cluster, one decision per review.

Why a path per cluster: one process serves every cluster, and owner and namespace labels must be
read from the cluster the pod is being created in. Every review is answered within
`answer_within` seconds, well inside the apiserver's timeout: what could not be checked by then
is refused with a message asking to retry, never admitted ungated.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from aiohttp import web
from opentelemetry import trace
from prometheus_client import Counter, Histogram

from admission_webhook.certificates import ServingCertificates
from admission_webhook.cluster_lookups import ClusterLookups
from admission_webhook.queue_watching import QueueCopies
from lockgate.admission import (
    AdmissionRequest,
    Decision,
    MalformedReviewError,
    Outcome,
    OwnerLabels,
    admission_response,
    decide,
    exemption,
    needs_owner_labels,
    queue_to_check,
    unchanged,
    unverifiable,
)
from lockgate_adapters.telemetry import current_traceparent

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

REVIEWS = Counter("lockgate_admission_reviews", "Admission reviews answered, by outcome",
                  ["cluster", "outcome"])
REVIEW_SECONDS = Histogram(
    "lockgate_admission_review_duration", "Time to answer one admission review, in seconds",
    ["cluster"], unit="seconds",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
# Pods are at most a few MiB even with huge env or volume lists.
MAX_REVIEW_BYTES = 8 * 1024 * 1024


class AdmissionServer:
    def __init__(
        self,
        *,
        clusters: Mapping[str, ClusterLookups],
        queues: QueueCopies,
        certificates: ServingCertificates,
        host: str,
        port: int,
        answer_within: float,
    ) -> None:
        self._clusters = clusters
        self._queues = queues
        self._ssl = certificates.ssl_context()
        self._host, self._port = host, port
        self._answer_within = answer_within
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None

    async def start(self) -> int:
        app = web.Application(client_max_size=MAX_REVIEW_BYTES)
        app.router.add_post("/mutate/{cluster}", self._mutate)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port, ssl_context=self._ssl).start()
        self.bound_port = int(self._runner.addresses[0][1])
        log.info("admission webhook serving https://%s:%s/mutate/{%s}", self._host,
                 self.bound_port, ",".join(self._clusters))
        return self.bound_port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def use_certificates(self, certificates: ServingCertificates) -> None:
        """Serve a renewed certificate from the next TLS handshake on."""
        self._ssl.load_cert_chain(certificates.cert_path, certificates.key_path)

    async def review(self, cluster: str, request: AdmissionRequest) -> Decision:
        """The decision for one request, in time, whatever the dependencies do."""
        lookups = self._clusters[cluster]
        try:
            async with asyncio.timeout(self._answer_within):
                return await self._decide(lookups, request)
        except TimeoutError:
            return unverifiable(f"the queue and labels of {request.pod_description} in time")
        except Exception:
            log.exception("%s: reviewing %s failed", cluster, request.pod_description)
            return unverifiable(f"{request.pod_description} (internal error)")

    async def _mutate(self, http_request: web.Request) -> web.Response:
        cluster = http_request.match_info["cluster"]
        if cluster not in self._clusters:
            raise web.HTTPNotFound(text=f"unknown cluster {cluster!r}")
        try:
            request = AdmissionRequest.from_review(await http_request.json())
        except (ValueError, MalformedReviewError) as error:
            raise web.HTTPBadRequest(text=str(error)) from error
        started = time.perf_counter()
        with tracer.start_as_current_span(
            "admission review",
            attributes={"lockgate.cluster": cluster, "k8s.namespace.name": request.namespace,
                        "lockgate.operation": request.operation},
        ) as span:
            decision = await self.review(cluster, request)
            span.set_attribute("lockgate.outcome", decision.outcome.value)
            if decision.queue:
                span.set_attribute("lockgate.queue", decision.queue)
            # Inside the span, so the record carries its trace and span ids.
            level = logging.DEBUG if decision.allowed else logging.INFO
            log.log(level, "%s: %s %s: %s", cluster, request.pod_description,
                    decision.outcome.value, decision.message)
        REVIEWS.labels(cluster, decision.outcome.value).inc()
        REVIEW_SECONDS.labels(cluster).observe(time.perf_counter() - started)
        return web.json_response(admission_response(request.uid, decision))

    async def _decide(self, lookups: ClusterLookups, request: AdmissionRequest) -> Decision:
        # Read only what the decision needs: nothing for exempt requests, owners only when the
        # pod lacks its own labels, the queue only once it is known.
        reason = exemption(request)
        if reason is not None:
            return unchanged(reason)
        try:
            namespace_labels: dict[str, str] | None = await lookups.namespace_labels(
                request.namespace)
            namespace_annotations = await lookups.namespace_annotations(request.namespace)
        except Exception as error:  # noqa: BLE001 - unreadable namespace: refuse, say why
            log.warning("%s: cannot read namespace %s: %r", lookups.cluster, request.namespace,
                        error)
            namespace_labels = None
            namespace_annotations = {}
        owners: list[OwnerLabels] = []
        if namespace_labels is not None and needs_owner_labels(request, namespace_labels):
            owners = await lookups.controlling_owners(request.namespace,
                                                      request.pod.get("metadata") or {})
        queue = None
        if namespace_labels is not None:
            queue_name = queue_to_check(request, namespace_labels, owners)
            if queue_name is not None:
                # From this cluster's copy, in memory: no I/O for the queue, unless the copy
                # refuses (then a fresh list confirms it).
                queue = await self._queues.confirmed_lookup(
                    cluster=lookups.cluster, queue=queue_name, namespace=request.namespace,
                    namespace_labels=namespace_labels)
        decision = decide(request=request, namespace_labels=namespace_labels, owners=owners,
                          queue=queue, trace_parent=current_traceparent(),
                          namespace_annotations=namespace_annotations)
        if decision.outcome is Outcome.UNVERIFIABLE:
            log.warning("%s: %s", lookups.cluster, decision.message)
        return decision
