"""One run of lockgate on the shared stack, of a test's own: the one way an end-to-end test
starts lockgate.

    @pytest.fixture
    async def run(stack, tmp_path) -> AsyncIterator[LockgateRun]:
        async with lockgate_run(stack, tmp_path, name="gang", env={...}) as run:
            await run.create_queues([run.name("qa")], namespaces=[run.namespace])
            await run.create_namespace(run.alias())
            yield run

Why: every end-to-end module used to carry its own copy of this setup (fresh database, migrate,
keep only the run's clusters, topics, consumer groups, Lockgate.for_stack, namespaces,
teardown), and names chosen once per module outlived the test that used them: the next test
created a namespace of the same name while the last one's was still being deleted (409
AlreadyExists: object is being deleted), which depends on how fast the apiserver collects.

Every name a run makes is new on each entry (`LockgateRun.id` is fresh): its database, cluster
aliases (so the database's trigger keeps other runs' rows out, devstack.isolation), consumer
groups and webhook registration (Lockgate's run_id), Queue objects, and the names tests ask
for with `run.name(...)` and `run.namespace`. Nothing waits for the previous run's leftovers to
be gone, and nothing needs to: no name is ever reused.

Teardown: the services are stopped (each must exit gracefully, except those the test killed on
purpose with `run.kill`), and the run's webhook registration and Queue objects are removed
(Lockgate.stop). In its namespaces the controllers are deleted, then the pods, and the teardown
waits until no pod is left (they hold room the next test may need); the namespaces themselves
are deleted without waiting (nothing reuses their names). The nodes the run added are deleted,
and awaited (a test may count the cluster's nodes). The database is dropped.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from devstack.isolation import keep_only_clusters
from devstack.launcher import STARTUP_SECONDS, Lockgate
from devstack.ports import ServicePorts
from devstack.stack import StackInfo
from helpers.kube import Namespaces, until_nodes_hold_no_pods
from helpers.pods import KWOK_NODE_ANNOTATION
from helpers.postgres import fresh_database, migrate_database
from helpers.waiting import eventually
from lockgate.labels import MANAGED_NAMESPACE_LABEL
from lockgate_adapters.kafka import ensure_topics
from lockgate_adapters.kube import api_client
from lockgate_adapters.settings import KafkaConfig


def new_run_id(name: str) -> str:
    """`name` and 6 random hex digits: short enough for every Kubernetes name built from it."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


@dataclass
class LockgateRun:
    """lockgate running for one test: its services, clusters (by alias), database and names."""

    id: str  # unique per entry of lockgate_run, e.g. "gang-3f9a1c"
    lockgate: Lockgate
    clusters: dict[str, str]  # alias -> the stack's cluster
    apis: dict[str, client.ApiClient]  # admin, by alias
    dsn: str  # the run's own database (superuser)
    pool: asyncpg.Pool
    namespaces: Namespaces
    nodes: list[tuple[str, str]] = field(default_factory=list)  # (alias, node) the run added
    killed: set[str] = field(default_factory=set)  # services SIGKILLed on purpose

    # ------------------------------------------------------------ names

    def name(self, base: str) -> str:
        """A name of this run's own: `<base>-<run id's random part>`."""
        return f"{base}-{self.id.rsplit('-', 1)[1]}"

    @property
    def namespace(self) -> str:
        """The run's usual managed namespace (created by `create_namespace`)."""
        return self.id

    def alias(self, cluster: str = "cluster-a") -> str:
        """The run's name for one of the stack's clusters."""
        return next(alias for alias, real in self.clusters.items() if real == cluster)

    # ------------------------------------------------------------ clients

    def core(self, alias: str | None = None) -> client.CoreV1Api:
        return client.CoreV1Api(self.apis[alias or self.alias()])

    def apps(self, alias: str | None = None) -> client.AppsV1Api:
        return client.AppsV1Api(self.apis[alias or self.alias()])

    def batch(self, alias: str | None = None) -> client.BatchV1Api:
        return client.BatchV1Api(self.apis[alias or self.alias()])

    def health_port(self, service: str) -> int:
        port = self.lockgate.processes[service].health_port
        assert port is not None, f"{service} has no health port"
        return port

    # ------------------------------------------------------------ pods and jobs

    async def create_pod(self, manifest: Mapping[str, Any], *, namespace: str | None = None,
                         alias: str | None = None) -> client.V1Pod:
        """Create a pod (in the run's namespace unless told otherwise); as the API returned it,
        after admission."""
        return await self.core(alias).create_namespaced_pod(namespace or self.namespace,
                                                            dict(manifest))

    async def pod(self, name: str, *, namespace: str | None = None,
                  alias: str | None = None) -> client.V1Pod | None:
        """The pod, or None if it is gone."""
        try:
            return await self.core(alias).read_namespaced_pod(name, namespace or self.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def job(self, uid: str, *, alias: str | None = None) -> asyncpg.Record | None:
        """lockgate's row for the pod with this uid."""
        row: asyncpg.Record | None = await self.pool.fetchrow(
            "SELECT * FROM jobs WHERE cluster = $1 AND uid = $2", alias or self.alias(), uid)
        return row

    # ------------------------------------------------------------ queues and namespaces

    async def create_queue(self, name: str, *, namespaces: Sequence[str] = (),
                           binding: list[dict[str, Any]] | None = None,
                           **spec: Any) -> dict[str, Any]:
        """Create a queue through the admin API (bound to `namespaces` by name, or to
        `binding`) and wait until the webhook's copy in every cluster shows it."""
        (created,) = await self.create_queues({name: spec}, namespaces=namespaces,
                                              binding=binding)
        return created

    async def create_queues(self, queues: Mapping[str, Mapping[str, Any]] | Sequence[str], *,
                            namespaces: Sequence[str] = (),
                            binding: list[dict[str, Any]] | None = None
                            ) -> list[dict[str, Any]]:
        """Queues by name (each with its own spec fields, e.g. priority_factor), then one wait
        for the webhook to see them all."""
        specs = queues if isinstance(queues, Mapping) else {name: {} for name in queues}
        bound = binding if binding is not None else [{"cluster": "*",
                                                      "names": list(namespaces)}]
        created: list[dict[str, Any]] = []
        async with aiohttp.ClientSession(headers=self.lockgate.admin_headers) as session:
            for name, spec in specs.items():
                async with session.post(f"{self.lockgate.admin_url}/api/v1/queues",
                                        json={"name": name, "namespaces": bound,
                                              **spec}) as reply:
                    assert reply.status in (200, 201), (
                        f"creating queue {name}: {await reply.text()}")
                    created.append(await reply.json())
        await self.lockgate.wait_for_queues({queue["name"]: queue for queue in created})
        return created

    async def identity_kubeconfig(self, name: str, rules: Sequence[Mapping[str, Any]],
                                  path: Path, *, alias: str | None = None) -> str:
        """A non-admin identity in the run's namespace, as a client is given one: a
        ServiceAccount `name` holding a Role of `rules`, and a kubeconfig at `path` with the
        cluster's server and CA and a token of it (TokenRequest, one hour), nothing of the
        admin's; in cluster `alias` (default: the run's cluster-a). Returns the kubeconfig's
        path."""
        alias = alias or self.alias()
        core, rbac = self.core(alias), client.RbacAuthorizationV1Api(self.apis[alias])
        namespace = self.namespace
        await core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
        await rbac.create_namespaced_role(namespace, {"metadata": {"name": name},
                                                      "rules": list(rules)})
        await rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
        token = await core.create_namespaced_service_account_token(name, namespace, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600}})
        return token_kubeconfig(self.lockgate.kubeconfigs[alias], name, token.status.token,
                                namespace, path)

    async def create_namespace(self, alias: str | None = None, name: str | None = None, *,
                               managed: bool = True,
                               labels: Mapping[str, str] | None = None) -> str:
        """A namespace in `alias` (default: the run's cluster-a), named `name` (default: the
        run's namespace), ready for pods; managed ones carry the run's label, so its webhook
        registration serves them. Deleted with the run."""
        own: dict[str, str] = {}
        if managed:
            own = {MANAGED_NAMESPACE_LABEL: "true", **self.lockgate.run_namespace_labels}
        return await self.namespaces.create(alias or self.alias(), name or self.namespace,
                                            labels={**own, **(labels or {})})

    async def add_node(self, name: str, *, alias: str | None = None,
                       allocatable: Mapping[str, str],
                       labels: Mapping[str, str] | None = None,
                       taints: list[dict[str, str]] | None = None,
                       wait_until_known: bool = True) -> str:
        """A kwok node (kwok marks it Ready and runs what binds there), deleted with the run;
        waits until lockgate has recorded it schedulable, unless told not to."""
        alias = alias or self.alias()
        await self.core(alias).create_node({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"capacity": dict(allocatable), "allocatable": dict(allocatable)},
        })
        self.nodes.append((alias, name))
        if wait_until_known:
            async def known() -> bool:
                return bool(await self.pool.fetchval(
                    "SELECT schedulable FROM cluster_nodes"
                    " WHERE cluster = $1 AND node = $2 AND present", alias, name))
            await eventually(known, within=60, what=f"node {name} Ready as lockgate sees it")
        return name

    # ------------------------------------------------------------ services

    async def start(self, *services: str) -> None:
        """Start services not started with the run (e.g. the schedulers, once a backlog is
        queued)."""
        await self.lockgate.start(only=list(services))

    async def kill(self, service: str) -> None:
        """SIGKILL a service, as in a crash. Its unclean exit is then expected at teardown,
        unless it is started again (`restart`)."""
        await self.lockgate.processes[service].kill()
        self.killed.add(service)

    async def restart(self, service: str, *, within: float = STARTUP_SECONDS) -> None:
        """Start a killed or stopped service again and wait until it is ready."""
        process = self.lockgate.processes[service]
        await process.start()
        self.killed.discard(service)
        await process.wait_ready(within)

    def logs(self, lines: int = 20) -> str:
        """The tail of each service's log, for failure messages."""
        return "\n".join(f"--- {name} ({p.log_path})\n{p.log_tail(lines)}"
                         for name, p in self.lockgate.processes.items())


async def first_notice(run: LockgateRun, uid: str) -> str:
    """The message of the pod's first LockgateQueued Event from lockgate, once it has one."""
    async def found() -> str | None:
        events = await run.core().list_namespaced_event(
            run.namespace, field_selector=f"source=lockgate-ungater,involvedObject.uid={uid}")
        return next((e.message for e in events.items if e.reason == "LockgateQueued"), None)

    return await eventually(found, within=60, every=0.5, what=f"the first Event of pod {uid}")


def token_kubeconfig(admin_kubeconfig: str, user: str, token: str, namespace: str,
                     path: Path) -> str:
    """A kubeconfig at `path` with the admin kubeconfig's server and CA and `token`, nothing
    else of the admin's; returns its path."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    (cluster,) = admin["clusters"]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": user,
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user,
                                                "namespace": namespace}}]}))
    return str(path)


@contextlib.asynccontextmanager
async def lockgate_run(
    stack: StackInfo, workdir: Path, *, name: str,
    clusters: Sequence[str] = ("cluster-a",),
    env: Mapping[str, str] | None = None,
    services: Sequence[str] | None = None,
    standby_scheduler: bool = False,
    ungater_replicas: int = 1,
    migrate: bool = True,
    only_own_clusters: bool = True,
    needs_empty_nodes: bool = False,
    own_topics: bool = False,
) -> AsyncIterator[LockgateRun]:
    """lockgate running for the block, as processes, isolated from every other run.

    - `name`: a short prefix of the run's names (the run id is `<name>-<6 hex digits>`);
    - `clusters`: which of the stack's clusters it manages (each under an alias of the run's);
    - `env`: settings for the services (LOCKGATE_*), on top of the launcher's;
    - `services`: which to start now (default: all); start the others later with `run.start`;
    - `standby_scheduler`: a second fair-scheduler instance ("fair-scheduler-standby") that
      takes over the lead, for tests of a failover (off by default: one stopped while still
      starting dies of the SIGTERM, which teardown reports as an unclean exit);
    - `ungater_replicas`: 2 adds a second ungater process ("ungater-2") in the same consumer
      group, serving the same clusters;
    - `migrate`: migrate the database before queue-store starts (it migrates too);
    - `only_own_clusters`: keep other runs' jobs and nodes out of the database (the trigger of
      devstack.isolation; it needs `migrate`);
    - `own_topics`: Kafka topics and consumer groups of the run's own (the topic prefix
      `<run id>.`, LOCKGATE_TOPIC_PREFIX), as another installation on the same Kafka has;
    - `needs_empty_nodes`: before anything starts, wait until no other test's pod is bound to a
      node of the run's clusters (helpers.kube.until_nodes_hold_no_pods), for a test that
      sizes its load from the nodes' allocatable.
    """
    run_id = new_run_id(name)
    aliases = {f"{run_id}-{real.rsplit('-', 1)[-1]}": real for real in clusters}
    workdir = workdir / run_id
    (workdir / "webhook-certs").mkdir(parents=True)
    async with fresh_database(stack.postgres_dsn,
                              prefix=f"lockgate_{run_id.replace('-', '_')}") as dsn:
        if migrate:
            await migrate_database(dsn)
            if only_own_clusters:
                await keep_only_clusters(dsn, aliases)
        elif only_own_clusters:
            raise ValueError("only_own_clusters needs a migrated database (migrate=True)")
        topic_prefix = f"{run_id}." if own_topics else ""
        await ensure_topics(KafkaConfig(stack.kafka_bootstrap, topic_prefix=topic_prefix))
        lockgate = Lockgate.for_stack(
            stack, clusters=aliases, postgres_dsn=dsn, ports=ServicePorts.free(),
            log_dir=workdir / "service-logs", cert_dir=workdir / "webhook-certs",
            extra_env=dict(env or {}), run_id=run_id, standby_scheduler=standby_scheduler,
            ungater_replicas=ungater_replicas, topic_prefix=topic_prefix)
        apis: dict[str, client.ApiClient] = {}
        # min_size=0: nothing to reconnect in the background after a test restarts Postgres.
        pool = await asyncpg.create_pool(dsn, min_size=0, max_size=4)
        run: LockgateRun | None = None
        codes: dict[str, int | None] = {}
        try:
            for alias, real in aliases.items():
                apis[alias] = await api_client(stack.kubeconfigs[real])
            if needs_empty_nodes:
                await until_nodes_hold_no_pods(apis)
            run = LockgateRun(run_id, lockgate, dict(aliases), apis, dsn, pool, Namespaces(apis))
            await lockgate.start(only=list(services) if services is not None else None)
            yield run
        finally:
            dead_on_purpose = {service for service in (run.killed if run else ())
                               if not lockgate.processes[service].alive()}
            try:
                codes = await lockgate.stop()
            finally:
                try:
                    if run is not None:
                        await _remove_what_the_run_made(run)
                finally:
                    for api in apis.values():
                        await api.close()
                    await pool.close()
    unclean = {service: code for service, code in codes.items()
               if code not in (0, None) and service not in dead_on_purpose}
    assert not unclean, f"services of run {run_id} did not stop gracefully: {unclean}"


async def _remove_what_the_run_made(run: LockgateRun) -> None:
    """Its namespaces (their controllers and pods first, awaited: they hold room on the nodes)
    and the nodes it added."""
    try:
        await run.namespaces.delete_all()
    finally:
        for alias, node in run.nodes:
            await _delete_node(run.core(alias), node)


async def _delete_node(core: client.CoreV1Api, node: str) -> None:
    """Delete the node and wait until it is gone: the next test may count the cluster's nodes."""
    try:
        await core.delete_node(node)
    except ApiException as error:
        if error.status != 404:
            raise

    async def gone() -> bool:
        try:
            await core.read_node(node)
        except ApiException as error:
            if error.status == 404:
                return True
            raise
        return False

    await eventually(gone, within=60, what=f"node {node} to be gone")
