"""Shared pytest setup.

- Tests under tests/integration and tests/e2e are marked `stack` automatically.
- Stack fixtures (`stack`, `kube_clients`, `kafka_bootstrap`, `pg_dsn`, `pg_pool`,
  `make_namespace`) import devstack, the clients and `helpers` (tests/helpers, shared by the
  integration and end-to-end tests) lazily, only when a test asks for them, so tests/unit runs
  alone, fast, without the stack and without importing devstack.
- Every test fails if it leaves asyncio tasks running.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import asyncpg
    from kubernetes_asyncio.client import ApiClient, CoreV1Api

    from devstack import StackInfo

_TESTS_DIR = Path(__file__).resolve().parent

# The local stack has one Kafka broker: services under test (in this process or started from
# it) create topics with one replica, not the production default of 3.
os.environ.setdefault("LOCKGATE_KAFKA_REPLICATION_FACTOR", "1")
os.environ.setdefault("LOCKGATE_KAFKA_MIN_INSYNC_REPLICAS", "1")
_STACK_DIRS = {"integration", "e2e", "compose"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            relative = Path(str(item.path)).resolve().relative_to(_TESTS_DIR)
        except ValueError:
            continue
        if relative.parts and relative.parts[0] in _STACK_DIRS:
            item.add_marker(pytest.mark.stack)


# ---------------------------------------------------------------- the local stack


@pytest.fixture(scope="session")
def stack() -> StackInfo:
    """The local stack: reused when healthy, else brought up (`python -m devstack up`).

    If it cannot come up, every test that needs it FAILS with devstack's message (never skips).
    A cold machine builds the Kubernetes binaries first (10-25 min): run
    `python -m devstack up` once before pytest so test timeouts do not cover that build.
    """
    import devstack

    try:
        return devstack.ensure_up()
    except devstack.StackError as exc:
        problem = str(exc)
    pytest.fail(f"the local stack is not available:\n{problem}", pytrace=False)


@pytest.fixture(scope="session")
def autoscaled_stack(stack: StackInfo) -> StackInfo:
    """The stack with its autoscaled cluster "cluster-c" (no node until Karpenter makes one;
    devstack.karpenter), started if it does not run yet (nothing else is restarted).

    Its kubeconfig is `autoscaled_stack.kubeconfigs["cluster-c"]`; a lockgate run names it
    like the others (`lockgate_run(autoscaled_stack, ..., clusters=("cluster-c",))`, under the
    run's alias `run.alias("cluster-c")`). If it cannot start, the test FAILS with devstack's
    message (never skips).
    """
    import devstack
    from helpers.karpenter import AUTOSCALED_CLUSTER

    try:
        return devstack.ensure_up(autoscaled=[AUTOSCALED_CLUSTER]).including_autoscaled()
    except devstack.StackError as exc:
        problem = str(exc)
    pytest.fail(f"the stack's autoscaled cluster {AUTOSCALED_CLUSTER} is not available:\n"
                f"{problem}", pytrace=False)


@pytest.fixture(scope="session")
def kafka_bootstrap(stack: StackInfo) -> str:
    return stack.kafka_bootstrap


@pytest.fixture(scope="session")
def pg_dsn(stack: StackInfo) -> str:
    return stack.postgres_dsn


@pytest.fixture(scope="session")
async def kube_clients(stack: StackInfo) -> AsyncIterator[dict[str, ApiClient]]:
    """cluster name ("cluster-a", "cluster-b") -> kubernetes_asyncio ApiClient (admin)."""
    from kubernetes_asyncio import config

    clients: dict[str, ApiClient] = {}
    try:
        for name, path in stack.kubeconfigs.items():
            clients[name] = await config.new_client_from_config(
                config_file=path, persist_config=False
            )
        yield clients
    finally:
        for api in clients.values():
            await api.close()


@pytest.fixture(scope="session")
async def ungaters(stack: StackInfo) -> AsyncIterator[dict[str, CoreV1Api]]:
    """cluster name -> CoreV1Api as lockgate's ungater (its ServiceAccount token, k8s/base).

    Only this identity may remove lockgate's scheduling gate in a managed namespace (the
    ValidatingAdmissionPolicy lockgate-admission-gate applies to admin too).
    """
    from kubernetes_asyncio import client, config

    clients: dict[str, ApiClient] = {}
    try:
        for name, path in stack.kubeconfigs_of("ungater").items():
            clients[name] = await config.new_client_from_config(
                config_file=path, persist_config=False
            )
        yield {name: client.CoreV1Api(api) for name, api in clients.items()}
    finally:
        for api in clients.values():
            await api.close()


@pytest.fixture(scope="session")
async def pg_pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    import asyncpg

    # min_size=0: no floor to restore in the background after a test restarts Postgres.
    pool = await asyncpg.create_pool(pg_dsn, min_size=0, max_size=10)
    try:
        yield pool
    finally:
        await pool.close()


MakeNamespace = Callable[..., Awaitable[str]]


@pytest.fixture
async def make_namespace(kube_clients: dict[str, ApiClient]) -> AsyncIterator[MakeNamespace]:
    """`await make_namespace("cluster-a", prefix="t", labels=None)` -> a new namespace's name.

    Waits until kube-controller-manager has created its `default` ServiceAccount (pods are
    rejected before that). After the test it deletes each namespace's controllers and pods and
    waits until the pods are gone (they hold room on the nodes), then deletes the namespaces
    (without waiting: their names are never reused).
    """
    from helpers.kube import temporary_namespaces

    async with temporary_namespaces(kube_clients) as namespaces:

        async def make(cluster: str, prefix: str = "t",
                       labels: dict[str, str] | None = None) -> str:
            return await namespaces.create(cluster, f"{prefix}-{uuid.uuid4().hex[:8]}",
                                           labels=labels)

        yield make


# ---------------------------------------------------------------- asyncio hygiene


def _describe(task: asyncio.Task[object]) -> str:
    coro = task.get_coro()
    where = getattr(coro, "__qualname__", repr(coro))
    return f"{task.get_name()} ({where})"


@pytest.fixture(autouse=True)
async def _no_leaked_asyncio_tasks() -> AsyncIterator[None]:
    """Fails the test if it leaves asyncio tasks running (cancels them first)."""
    before = set(asyncio.all_tasks())
    yield
    me = asyncio.current_task()

    def leftovers() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() if t not in before and t is not me and not t.done()]

    # Tasks cancelled during teardown get a moment to finish.
    for _ in range(20):
        if not leftovers():
            return
        await asyncio.sleep(0.01)
    leaked = leftovers()
    names = ", ".join(_describe(t) for t in leaked)
    for task in leaked:
        task.cancel()
    await asyncio.gather(*leaked, return_exceptions=True)
    pytest.fail(f"the test left {len(leaked)} asyncio task(s) running: {names}", pytrace=False)
