"""Keeping a run's database to its own clusters.

Why: runs on one local stack share its clusters and Kafka topics. A run watches the real clusters
under aliases of its own, but the pod and node events of other runs' watchers reach its
queue-store through the shared topics. A trigger in the run's own database drops every inserted
job, node and growth row of another cluster name, as if those watchers did not exist.
"""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg


async def keep_only_clusters(dsn: str, clusters: Iterable[str]) -> None:
    """Install the trigger in the (migrated) database at `dsn`: only rows of `clusters` stay."""
    names = sorted(clusters)
    if not names:
        raise ValueError("keep_only_clusters needs at least one cluster name")
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(
            "CREATE FUNCTION only_our_clusters() RETURNS trigger AS $$ BEGIN"
            " IF NEW.cluster = ANY(TG_ARGV) THEN RETURN NEW; END IF; RETURN NULL;"
            " END $$ LANGUAGE plpgsql")
        arguments = ", ".join(_literal(name) for name in names)
        for table in ("jobs", "cluster_nodes", "cluster_growth"):
            await connection.execute(
                f"CREATE TRIGGER only_our_clusters BEFORE INSERT ON {table} FOR EACH ROW"
                f" EXECUTE FUNCTION only_our_clusters({arguments})")
    finally:
        await connection.close()


def _literal(name: str) -> str:
    """A SQL string literal (trigger arguments cannot be bound as parameters)."""
    return "'" + name.replace("'", "''") + "'"
