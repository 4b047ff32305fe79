"""Writing pod notices as Kubernetes Events on the pods, so `kubectl describe pod` shows them.

Why here: the ungater already holds a client for every cluster it serves and is the one service
that writes to pods. A notice becomes a Warning Event whose name is derived from the pod's uid and
the reason (`lockgate.noticing.event_name`), so a redelivered notice, or one sent again by a new
scheduler leader, finds its Event already there (409) and is done. The pod is read first: one
that is gone, replaced under its name, or no longer gated by lockgate needs no Event. Errors the
apiserver may get over (no answer, 429, 5xx) are raised, so the batch is retried before its
offsets are committed; anything else is a permanent refusal, and the notice goes to the
dead-letter topic with the apiserver's answer.

A notice with an `action` also removes its pod, running or not: it was preempted to give another
queue its fair share, or its pod group timed out (the scheduler recorded the eviction in Postgres
before publishing). The Event is written first, then the pod is deleted (its controller creates
a new, gated one) or marked Failed, each guarded by the pod's uid.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from lockgate.events import PodNotice
from lockgate.labels import SCHEDULING_GATE
from lockgate.noticing import event_for
from lockgate_adapters.kafka import Received
from ungater.pods import KubeCallError, PodGateClient

log = logging.getLogger(__name__)

NOTICES = Counter("lockgate_ungater_pod_notices",
                  "Pod notices handled, by cluster and result", ["cluster", "result"])


class RetryableNoticeError(Exception):
    """The apiserver may take the Event later: retry the batch (nothing committed)."""


class Noticer:
    """Handles batches of pod notices for the clusters it serves."""

    def __init__(self, *, pods: dict[str, PodGateClient]) -> None:
        self._pods = pods

    async def handle(
        self,
        batch: list[Received[PodNotice]],
        reject: Callable[[Received[PodNotice], str], Awaitable[None]],
    ) -> None:
        served = [item for item in batch if item.event.cluster in self._pods]
        if served:
            async with asyncio.TaskGroup() as group:
                for item in served:
                    group.create_task(self.write(item, reject))

    async def write(self, item: Received[PodNotice],
                    reject: Callable[[Received[PodNotice], str], Awaitable[None]]) -> None:
        notice = item.event
        body = event_for(notice)
        pods = self._pods[notice.cluster]
        if notice.action:
            await self._act(item, reject)
            return
        try:
            pod = await pods.read(namespace=notice.namespace, name=notice.name)
            if pod is None or pod.uid != notice.uid or SCHEDULING_GATE not in pod.gates:
                NOTICES.labels(notice.cluster, "pod_gone_or_released").inc()
                log.debug("no event for %s/%s/%s: the pod is gone, replaced or no longer gated",
                          notice.cluster, notice.namespace, notice.name)
                return
            status = await pods.create_event(namespace=notice.namespace, body=body)
        except KubeCallError as error:
            if error.status is None or error.status == 429 or error.status >= 500:
                NOTICES.labels(notice.cluster, "retried").inc()
                raise RetryableNoticeError(
                    f"event for {notice.namespace}/{notice.name}: {error}") from error
            NOTICES.labels(notice.cluster, "refused").inc()
            await reject(item, f"apiserver refused event {body['metadata']['name']}: {error}")
            return
        if status == 404:
            NOTICES.labels(notice.cluster, "namespace_gone").inc()
            log.debug("no event for %s/%s/%s: its namespace is gone", notice.cluster,
                      notice.namespace, notice.name)
        elif status == 409:
            NOTICES.labels(notice.cluster, "already_there").inc()
        else:
            NOTICES.labels(notice.cluster, "written").inc()
            log.info("told pod %s/%s/%s: %s", notice.cluster, notice.namespace, notice.name,
                     notice.reason)

    async def _act(self, item: Received[PodNotice],
                   reject: Callable[[Received[PodNotice], str], Awaitable[None]]) -> None:
        """A notice that removes its pod (preempted, or its group timed out): the Event first,
        so the reason is on record before the pod goes, then delete it or mark it Failed.

        Idempotent: the Event's name is fixed per (uid, reason), the delete has a uid
        precondition, and the Failed patch tests the uid; a pod already gone is done.
        """
        notice = item.event
        pods = self._pods[notice.cluster]
        body = event_for(notice)
        try:
            pod = await pods.read(namespace=notice.namespace, name=notice.name)
            if pod is None or pod.uid != notice.uid:
                NOTICES.labels(notice.cluster, "pod_gone").inc()
                return
            await pods.create_event(namespace=notice.namespace, body=body)
            if notice.action == "delete":
                status = await pods.delete(namespace=notice.namespace, name=notice.name,
                                           uid=notice.uid)
            else:
                status = await pods.fail(namespace=notice.namespace, name=notice.name,
                                         uid=notice.uid, reason=notice.reason,
                                         message=notice.message)
        except KubeCallError as error:
            if error.status is None or error.status == 429 or error.status >= 500:
                NOTICES.labels(notice.cluster, "retried").inc()
                raise RetryableNoticeError(
                    f"{notice.action} {notice.namespace}/{notice.name}: {error}") from error
            NOTICES.labels(notice.cluster, "refused").inc()
            await reject(item, f"apiserver refused to {notice.action} pod "
                               f"{notice.namespace}/{notice.name}: {error}")
            return
        done = {"delete": "deleted", "fail": "failed"}[notice.action]
        NOTICES.labels(notice.cluster, done if status < 300 else "pod_gone").inc()
        log.info("%s pod %s/%s/%s (%s): %s", "deleted" if notice.action == "delete" else "failed",
                 notice.cluster, notice.namespace, notice.name, notice.reason, notice.message)
