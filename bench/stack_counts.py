"""What a benchmark window cost the stack's Kafka and PostgreSQL, counted rather than timed.

Kafka: the records appended to each lockgate topic (the sum of its partitions' end offsets), and
to `__consumer_offsets` (one per offset commit of a partition: consumers commit per batch).
PostgreSQL: transactions committed in the database (`pg_stat_database.xact_commit`) and rows
inserted, updated and deleted per table (`pg_stat_user_tables`). Read once before and once after
a window; `difference` gives what the window added. The statistics collector flushes with a
short delay, so read the "after" a second or so after the work stopped.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition


async def kafka_end_offsets(bootstrap: str) -> dict[str, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                exclude_internal_topics=False)
    await consumer.start()
    try:
        metadata = await consumer._client.fetch_all_metadata()
        topics = sorted(t for t in metadata.topics(exclude_internal_topics=False)
                        if t.startswith(("lockgate.", "__consumer_offsets")))
        partitions = [TopicPartition(t, p) for t in topics
                      for p in sorted(metadata.partitions_for_topic(t) or ())]
        ends = await consumer.end_offsets(partitions)
        totals: dict[str, int] = {}
        for tp, end in ends.items():
            totals[tp.topic] = totals.get(tp.topic, 0) + end
        return totals
    finally:
        await consumer.stop()


async def postgres_counts(dsn: str) -> dict[str, int]:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("SELECT pg_stat_clear_snapshot()")
        counts = {"xact_commit": int(await connection.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))}
        for row in await connection.fetch(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables"):
            for what in ("ins", "upd", "del"):  # summed: each session's temporary tables
                key = f"{row['relname']}.{what}"
                counts[key] = counts.get(key, 0) + int(row[f"n_tup_{what}"])
        return counts
    finally:
        await connection.close()


async def stack_counts(bootstrap: str, dsn: str) -> dict[str, dict[str, int]]:
    kafka, postgres = await asyncio.gather(kafka_end_offsets(bootstrap), postgres_counts(dsn))
    return {"kafka_records": kafka, "postgres": postgres}


def difference(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]],
               per: int) -> dict[str, Any]:
    """What `after` adds to `before`, nonzero entries only, each also divided by `per`."""
    out: dict[str, Any] = {}
    for part, counts in after.items():
        moved = {k: v - before.get(part, {}).get(k, 0) for k, v in sorted(counts.items())}
        out[part] = {k: [v, round(v / per, 3)] for k, v in moved.items() if v}
    return out
