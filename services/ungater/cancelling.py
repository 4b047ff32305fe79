"""Deleting a cancelled job set's pods, gated and running, in the clusters this ungater serves.

Why the ungater: it is the per-cluster service that already acts on pods, and each cluster's
ungater sees every job-set command (its own consumer group), so a cancel reaches every cluster.
Its identity may list and delete pods (k8s/base/ungater-rbac.yaml), nothing more.

Only the pods created before the cancel was asked for (`JobSetCommand.covers`): a cancel taken
late — after a restart, behind a backlog, redelivered — deletes what it would have deleted at
once, never a pod the job set created afterwards (queue-store leaves those jobs alone too).

Idempotent: a redelivered cancel lists the pods again and finds none left that it covers; a pod
already gone (404), or replaced under its name (409: the uid precondition), counts as deleted.
The batch is acknowledged only once every served cluster has answered; an unreachable cluster
makes the batch fail and retry.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from lockgate.events import JobSetCommand
from lockgate.labels import JOBSET_LABEL, QUEUE_LABEL
from lockgate_adapters.kafka import Received

log = logging.getLogger(__name__)


class PodDeletionError(Exception):
    """A cluster did not let the job set's pods be listed or deleted; the batch is retried."""


class JobSetCanceller:
    def __init__(self, *, apis: Mapping[str, client.ApiClient], request_timeout: float) -> None:
        self._cores = {name: client.CoreV1Api(api) for name, api in apis.items()}
        self._timeout = request_timeout

    async def handle(self, batch: list[Received[JobSetCommand]],
                     reject: Callable[[Received[JobSetCommand], str], Awaitable[None]]) -> None:
        del reject  # a well-formed cancel is always applicable
        for item in batch:
            command = item.event
            for cluster, core in self._cores.items():
                deleted = await self._delete_pods(cluster, core, command)
                log.info("job set %s/%s cancelled (%s): %d pod(s) deleted in %s",
                         command.queue, command.jobset, command.reason, deleted, cluster)

    async def _delete_pods(self, cluster: str, core: client.CoreV1Api,
                           command: JobSetCommand) -> int:
        selector = f"{QUEUE_LABEL}={command.queue},{JOBSET_LABEL}={command.jobset}"
        try:
            pods = await core.list_pod_for_all_namespaces(label_selector=selector,
                                                          _request_timeout=self._timeout)
            deleted = 0
            for pod in pods.items:
                created = pod.metadata.creation_timestamp
                if created is not None and not command.covers(created):
                    log.info("job set %s/%s: pod %s/%s was created after the cancel; left",
                             command.queue, command.jobset, pod.metadata.namespace,
                             pod.metadata.name)
                    continue
                try:
                    await core.delete_namespaced_pod(
                        pod.metadata.name, pod.metadata.namespace,
                        body=client.V1DeleteOptions(
                            preconditions=client.V1Preconditions(uid=pod.metadata.uid)),
                        _request_timeout=self._timeout)
                    deleted += 1
                except ApiException as error:
                    if error.status not in (404, 409):  # gone or replaced meanwhile: done
                        raise
        except ApiException as error:
            raise PodDeletionError(f"{cluster}: {error.status} {error.reason}") from error
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise PodDeletionError(f"{cluster}: unreachable: {error!r}") from error
        return deleted
