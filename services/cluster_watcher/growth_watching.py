"""Watching what one cluster's autoscaler may still add: Karpenter's NodePools and NodeClaims.

Why beside the pod and node watchers: a gated pod never makes Karpenter grow a cluster, so
lockgate must know what each cluster could still grow by (issue 35, docs/autoscaling.md). Both
kinds are listed and watched like pods and nodes (`ResourceWatcher`: list, watch from the list's
resourceVersion, list again on 410 Gone, back off on failures); `ObservedGrowth` reads them, and
the whole picture goes out as one `ClusterGrowth` (topic CLUSTER_GROWTH) when it changed, at
most once per `min_interval`, and every `refresh` even when it did not.

A cluster without Karpenter serves no NodePool kind: the list answers 404. That is not a
failure: the cluster is not autoscaled, said once (`autoscaled=False`; no picture stored means
the same, so it is not refreshed), and both kinds are listed again every `recheck` seconds, so a
Karpenter installed later is noticed. A 403 means the watcher's ClusterRole lacks the kinds
(k8s/base/cluster-watcher-rbac.yaml, an upgrade that did not apply it): said loudly at every
recheck, and the cluster is published as not autoscaled too, so lockgate falls back to what it
did before it watched autoscalers (room on existing nodes only) rather than keep a picture it
can no longer see change. The watcher stays ready meanwhile (its pods and nodes are watched;
the `<cluster>/growth` check's detail says what is wrong): a missing rule must not stop the
pods of every cluster from being reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from datetime import datetime

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from cluster_watcher.publishing import Outbox, growth_message
from cluster_watcher.watching import ListCall, ResourceWatcher, WatchOptions
from lockgate.growth_observing import (
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    NODE_CLAIMS,
    NODE_POOLS,
    KubeObject,
    MalformedObjectError,
    ObservedGrowth,
)

log = logging.getLogger(__name__)

UNREADABLE = Counter("lockgate_watcher_unreadable_autoscaler_objects_total",
                     "NodePools and NodeClaims the watcher could not read (left out of the "
                     "cluster's growth picture; the log names each)", ["cluster", "kind"])

NOT_FOUND, FORBIDDEN = 404, 403


def _not_served_or_forbidden(error: Exception) -> bool:
    return isinstance(error, ApiException) and error.status in (NOT_FOUND, FORBIDDEN)


class GrowthWatcher:
    """Watches one cluster's NodePools and NodeClaims and publishes its ClusterGrowth."""

    def __init__(
        self,
        *,
        cluster: str,
        api: client.ApiClient,
        outbox: Outbox,
        set_ready: Callable[[str, bool, str], None],
        options: WatchOptions,
        min_interval: float = 1.0,
        refresh: float = 30.0,
        recheck: float = 60.0,
        observed: ObservedGrowth | None = None,
    ) -> None:
        self.cluster = cluster
        self.observed = observed or ObservedGrowth(cluster)
        self._outbox = outbox
        self._set_ready = set_ready
        self._min_interval, self._refresh, self._recheck = min_interval, refresh, recheck
        self._changed = asyncio.Event()
        self._revision_seen = -1
        custom = client.CustomObjectsApi(api)

        def lister(plural: str) -> ListCall:
            return functools.partial(custom.list_cluster_custom_object, KARPENTER_GROUP,
                                     KARPENTER_VERSION, plural)

        self.pools = ResourceWatcher(
            cluster=cluster, resource=NODE_POOLS, list_call=lister(NODE_POOLS),
            on_list=self._pools_listed, on_event=self._pool_changed,
            set_ready=self._watching_ready, options=options,
            gives_up_on=_not_served_or_forbidden)
        self.claims = ResourceWatcher(
            cluster=cluster, resource=NODE_CLAIMS, list_call=lister(NODE_CLAIMS),
            on_list=self._claims_listed, on_event=self._claim_changed,
            set_ready=self._watching_ready, options=options,
            gives_up_on=_not_served_or_forbidden)

    @property
    def growth_check(self) -> str:
        return f"{self.cluster}/growth"

    async def run(self, stopping: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._watch(), name=f"watch {self.cluster} growth"),
                     group.create_task(self._publish(), name=f"{self.cluster} growth")]
            await stopping.wait()
            for task in tasks:
                task.cancel()

    async def _watch(self) -> None:
        """Both kinds, until the cluster turns out not to serve them (or forbids them); then
        again after `recheck` seconds."""
        while True:
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self.pools.run(), name=f"watch {self.cluster} nodepools")
                    group.create_task(self.claims.run(), name=f"watch {self.cluster} nodeclaims")
            except* ApiException as failures:
                error = failures.exceptions[0]
                assert isinstance(error, ApiException)
                self._not_watching(error)
            await asyncio.sleep(self._recheck)

    def _not_watching(self, error: ApiException) -> None:
        """The cluster is counted as not autoscaled until the next look (module docstring)."""
        news = self.observed.not_served()
        if error.status == NOT_FOUND:
            if news:
                log.info("%s: serves no %s.%s/%s kind (no Karpenter): not autoscaled; looking "
                         "again every %.0fs", self.cluster, NODE_POOLS, KARPENTER_GROUP,
                         KARPENTER_VERSION, self._recheck)
            self._set_ready(self.growth_check, True, "no NodePool kind served: not autoscaled")
        else:
            detail = (f"may not list {NODE_POOLS}/{NODE_CLAIMS}.{KARPENTER_GROUP} "
                      f"({error.status} {str(error.reason)[:300]}): give cluster-watcher's "
                      "ClusterRole get, list and watch on them "
                      "(k8s/base/cluster-watcher-rbac.yaml)")
            log.error("%s: %s; counted as not autoscaled, trying again in %.0fs", self.cluster,
                      detail, self._recheck)
            self._set_ready(self.growth_check, True,
                            f"NOT WATCHED, counted as not autoscaled: {detail}")
        self._note()

    def _watching_ready(self, ok: bool, detail: str) -> None:
        self._set_ready(self.growth_check, ok, detail)

    # Lists and changes

    async def _pools_listed(self, pools: list[KubeObject], _started_at: datetime) -> None:
        self._report(self.observed.relist_pools(pools), "NodePool")
        self._note()

    async def _claims_listed(self, claims: list[KubeObject], _started_at: datetime) -> None:
        self._report(self.observed.relist_claims(claims), "NodeClaim")
        self._note()

    async def _pool_changed(self, kind: str, pool: KubeObject) -> None:
        try:
            self.observed.observe_pool(pool, deleted=kind == "DELETED")
        except MalformedObjectError as error:
            self._report([error], "NodePool")
        self._note()

    async def _claim_changed(self, kind: str, claim: KubeObject) -> None:
        try:
            self.observed.observe_claim(claim, deleted=kind == "DELETED")
        except MalformedObjectError as error:
            self._report([error], "NodeClaim")
        self._note()

    def _report(self, problems: list[MalformedObjectError], kind: str) -> None:
        for problem in problems:
            UNREADABLE.labels(self.cluster, kind).inc()
            log.error("%s: cannot read %s; it is left out of the cluster's growth picture",
                      self.cluster, problem)

    # Publishing

    def _note(self) -> None:
        if self.observed.revision != self._revision_seen:
            self._changed.set()

    async def _publish(self) -> None:
        """The picture when it changed (at most once per `min_interval`), and every `refresh`
        while the cluster is autoscaled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self._refresh)
            self._changed.clear()
            if not self.observed.known:
                continue
            revision = self.observed.revision
            if revision == self._revision_seen and self.observed.served is False:
                continue  # said once: no picture stored means the same
            self._revision_seen = revision
            self._outbox.put_growth(growth_message(self.observed.growth()))
            await asyncio.sleep(self._min_interval)
