"""Writing pod notices as Kubernetes Events on the pods, so `kubectl describe pod` shows them.

Why here: the ungater already holds a client for every cluster it serves and is the one service
that writes to pods. A notice becomes a Warning Event whose name is derived from the pod's uid and
the reason (`lockgate.noticing.event_name`), so a redelivered notice, or one sent again by a new
scheduler leader, finds its Event already there (409) and is done. The pod is read first: one
that is gone, replaced under its name, or no longer gated by lockgate needs no Event. Errors the
apiserver may get over (no answer, 429, 5xx) are raised, so the batch is retried before its
offsets are committed; anything else is a permanent refusal, and the notice goes to the
dead-letter topic with the apiserver's answer.

A notice with an `action` removes its pod: it waited past its queue's maximum time queued (acted
on only while still gated, so a pod released meanwhile is never failed), it was preempted to give
another queue its fair share, or its pod group timed out (running or not; the scheduler recorded
the eviction in Postgres before publishing). The Event is written first, then the pod is deleted
(its controller creates a new, gated one) or marked Failed, each guarded by the pod's uid. Why the
ungater acts, not the scheduler: it already holds a client per cluster and the right to write
pods; the scheduler holds no Kubernetes credentials at all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from lockgate.events import PodNotice
from lockgate.labels import SCHEDULING_GATE
from lockgate.noticing import ABOUT_RELEASED_PODS, event_for
from lockgate_adapters.kafka import Received
from ungater.pods import KubeCallError, PodGateClient

log = logging.getLogger(__name__)

NOTICES = Counter("lockgate_ungater_pod_notices",
                  "Pod notices handled, by cluster and result", ["cluster", "result"])
ACTIONS = Counter("lockgate_ungater_max_queued_actions",
                  "Pods failed or deleted after their maximum time queued, by cluster, action and "
                  "result", ["cluster", "action", "result"])


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
            about_released = notice.reason in ABOUT_RELEASED_PODS
            if pod is None or pod.uid != notice.uid or (
                    not about_released and SCHEDULING_GATE not in pod.gates):
                NOTICES.labels(notice.cluster, "pod_gone_or_released").inc()
                log.debug("no event for %s/%s/%s: the pod is gone, replaced or no longer gated",
                          notice.cluster, notice.namespace, notice.name)
                return
            status = await pods.create_event(namespace=notice.namespace, body=body)
            if notice.delete_pod and status != 404:
                await self._delete(notice, pods)
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
            return
        if status == 409:
            NOTICES.labels(notice.cluster, "already_there").inc()
        else:
            NOTICES.labels(notice.cluster, "written").inc()
            log.info("told pod %s/%s/%s: %s", notice.cluster, notice.namespace, notice.name,
                     notice.reason)

    async def _act(self, item: Received[PodNotice],
                   reject: Callable[[Received[PodNotice], str], Awaitable[None]]) -> None:
        """A notice that removes its pod: the Event first, so the reason is on record before
        the pod goes, then delete it or mark it Failed.

        Idempotent: the Event's name is fixed per (uid, reason, series), the delete has a uid
        precondition, and the Failed patch tests the uid; a pod already gone is done. A pod past
        its maximum time queued is acted on only while it is still gated.
        """
        notice = item.event
        pods = self._pods[notice.cluster]
        body = event_for(notice)
        try:
            pod = await pods.read(namespace=notice.namespace, name=notice.name)
            if pod is None or pod.uid != notice.uid or (
                    notice.reason not in ABOUT_RELEASED_PODS and SCHEDULING_GATE not in pod.gates):
                NOTICES.labels(notice.cluster, "pod_gone_or_released").inc()
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
                ACTIONS.labels(notice.cluster, notice.action, "retried").inc()
                raise RetryableNoticeError(
                    f"{notice.action} {notice.namespace}/{notice.name}: {error}") from error
            ACTIONS.labels(notice.cluster, notice.action, "refused").inc()
            await reject(item, f"apiserver refused to {notice.action} pod "
                               f"{notice.namespace}/{notice.name}: {error}")
            return
        outcome = "done" if status < 300 else "pod_gone_or_replaced"
        ACTIONS.labels(notice.cluster, notice.action, outcome).inc()
        log.info("%s pod %s/%s/%s (%s): %s", "deleted" if notice.action == "delete" else "failed",
                 notice.cluster, notice.namespace, notice.name, outcome, notice.message)

    @staticmethod
    async def _delete(notice: PodNotice, pods: PodGateClient) -> None:
        """Delete the notice's pod so that its controller replaces it (gated again), unless it
        got bound meanwhile. Preconditions (uid, resourceVersion) make sure the pod deleted is
        the one read; a pod that changed in between is read again, a few times."""
        for _ in range(5):
            pod = await pods.read(namespace=notice.namespace, name=notice.name)
            if pod is None or pod.uid != notice.uid or pod.being_deleted:
                return
            if pod.node_name:
                log.info("not deleting %s/%s/%s: bound to %s after all", notice.cluster,
                         notice.namespace, notice.name, pod.node_name)
                return
            status = await pods.delete(namespace=notice.namespace, name=notice.name,
                                       uid=notice.uid, resource_version=pod.resource_version)
            if status != 409:
                if status < 300:
                    NOTICES.labels(notice.cluster, "deleted").inc()
                    log.info("deleted unplaceable pod %s/%s/%s; its controller replaces it",
                             notice.cluster, notice.namespace, notice.name)
                return
        log.warning("gave up deleting %s/%s/%s: it kept changing", notice.cluster,
                    notice.namespace, notice.name)
