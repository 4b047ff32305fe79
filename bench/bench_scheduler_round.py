"""How fast the pure scheduling core is at scale: loading jobs, rounds, and memory.

Builds a synthetic `SchedulerState` (two clusters with room for a few thousand jobs, N queued jobs
spread over Q queues), then measures:

- load: upserting every job once (the leader's cold start);
- scheduler_round: a round releasing a few thousand jobs from empty clusters, median of several,
  finishing the released jobs between rounds to free the room again;
- scheduler_round_full: a round when nothing fits (what the leader does when capacity is gone);
- job_updates: the state changes that finish released jobs;
- memory: peak RSS and what the loaded state added.

Machines are noisy, so each figure is also given as a ratio to a baseline measured in the same
run: sorting (and heapifying) as many (priority, created_at, id) tuples as there are jobs.

Prints one JSON object per measurement on stdout.

    python bench/bench_scheduler_round.py [--jobs 1000000] [--queues 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import random
import resource
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from lockgate.jobs import JobState
from lockgate.queues import QueueSpec
from lockgate.resources import Resources
from lockgate.scheduler import NodeInfo, SchedJob, SchedulerState, schedule_round

CLUSTERS = ("cluster-a", "cluster-b")
NODES_PER_CLUSTER = 40
NODE = {"cpu": "64", "memory": "256Gi", "pods": "110"}
# (weight in the mix, requests): about 1.9 cpu per job on average, so the two clusters
# (5120 cpu) admit roughly 2,700 jobs.
SHAPES = (
    (4, {"cpu": "500m", "memory": "1Gi", "pods": "1"}),
    (3, {"cpu": "1", "memory": "4Gi", "pods": "1"}),
    (2, {"cpu": "2", "memory": "8Gi", "pods": "1"}),
    (2, {"cpu": "4", "memory": "16Gi", "pods": "1"}),
    (1, {"cpu": "8", "memory": "8Gi", "pods": "1"}),
)
CHUNK = 100_000


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def current_rss_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return rss_mib()


def emit(record: dict[str, object]) -> None:
    print(json.dumps(record), flush=True)


def baseline_seconds(count: int, rng: random.Random) -> tuple[float, float]:
    """Seconds to sort, and to heapify, `count` tuples shaped like the queue heaps' entries."""
    entries = [
        (-rng.choice((0, 0, 0, 1, 5)), 1.7e9 + i, f"cluster-a/{i:012d}") for i in range(count)
    ]
    rng.shuffle(entries)
    started = time.perf_counter()
    sorted(entries)
    sort_seconds = time.perf_counter() - started
    started = time.perf_counter()
    heapq.heapify(entries)
    heapify_seconds = time.perf_counter() - started
    return sort_seconds, heapify_seconds


def synthetic_jobs(count: int, queues: list[str], rng: random.Random) -> Iterator[list[SchedJob]]:
    """The jobs in chunks; request vectors are shared per shape, as an ingest cache would."""
    weights = [weight for weight, _ in SHAPES]
    shapes = [Resources.from_kubernetes(requests) for _, requests in SHAPES]
    for start in range(0, count, CHUNK):
        chunk = []
        for i in range(start, min(start + CHUNK, count)):
            cluster = CLUSTERS[i % len(CLUSTERS)]
            chunk.append(
                SchedJob(
                    job_id=f"{cluster}/{i:012d}",
                    queue=rng.choice(queues),
                    cluster=cluster,
                    requests=rng.choices(shapes, weights)[0],
                    priority=rng.choice((0, 0, 0, 0, 0, 0, 0, 1, 5)),
                    created_at=1.7e9 + i * 0.001,
                )
            )
        yield chunk


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--queues", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-decisions", type=int, default=10_000)
    parser.add_argument("--lookback", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    common = {"jobs": args.jobs, "queues": args.queues}

    sort_seconds, heapify_seconds = baseline_seconds(args.jobs, rng)
    emit(
        {
            "name": "scheduler_baseline",
            **common,
            "sort_seconds": round(sort_seconds, 4),
            "heapify_seconds": round(heapify_seconds, 4),
        }
    )
    gc.collect()

    queue_names = [f"queue-{i:04d}" for i in range(args.queues)]
    rss_before_state = current_rss_mib()
    state = SchedulerState()
    for name in queue_names:
        factor = rng.choice((0.5, 1.0, 1.0, 2.0))
        state.upsert_queue(QueueSpec(name=name, priority_factor=factor))
    node = NodeInfo(allocatable=Resources.from_kubernetes(NODE))
    for cluster in CLUSTERS:
        state.set_cluster(
            cluster, {f"{cluster}-node-{i:03d}": node for i in range(NODES_PER_CLUSTER)}
        )

    load_seconds = load_cpu_seconds = 0.0
    for chunk in synthetic_jobs(args.jobs, queue_names, rng):
        started, cpu_started = time.perf_counter(), time.process_time()
        for job in chunk:
            state.upsert_job(job)
        load_seconds += time.perf_counter() - started
        load_cpu_seconds += time.process_time() - cpu_started
    gc.collect()
    state_mib = current_rss_mib() - rss_before_state
    emit(
        {
            "name": "scheduler_load",
            **common,
            "seconds": round(load_seconds, 3),
            "cpu_seconds": round(load_cpu_seconds, 3),
            "jobs_per_second": round(args.jobs / load_seconds),
            "ratio_to_sort": round(load_seconds / sort_seconds, 2),
        }
    )

    round_seconds: list[float] = []
    round_cpu_seconds: list[float] = []
    decisions: list[int] = []
    update_seconds: list[float] = []
    for _ in range(args.rounds):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = schedule_round(
            state, max_decisions=args.max_decisions, max_lookback_per_queue=args.lookback
        )
        round_seconds.append(time.perf_counter() - started)
        round_cpu_seconds.append(time.process_time() - cpu_started)
        decisions.append(len(result.decisions))

        # Nothing fits now: what a round costs when capacity is gone.
        started = time.perf_counter()
        full = schedule_round(
            state, max_decisions=args.max_decisions, max_lookback_per_queue=args.lookback
        )
        full_seconds = time.perf_counter() - started
        assert not full.decisions, "the clusters should be full"

        # The released jobs run, then finish: the room is free again.
        started = time.perf_counter()
        for decision in result.decisions:
            job = state.job(decision.job_id)
            assert job is not None
            bound = replace(job, state=JobState.RUNNING, node_name=decision.node_hint)
            state.upsert_job(bound)
            state.upsert_job(replace(bound, state=JobState.SUCCEEDED))
        update_seconds.append(time.perf_counter() - started)

    median = statistics.median(round_seconds)
    emit(
        {
            "name": "scheduler_round",
            **common,
            "seconds_median": round(median, 4),
            "seconds_min": round(min(round_seconds), 4),
            "seconds_max": round(max(round_seconds), 4),
            "cpu_seconds_median": round(statistics.median(round_cpu_seconds), 4),
            "decisions": int(statistics.median(decisions)),
            "decisions_per_second": round(statistics.median(decisions) / median),
            "ratio_to_sort": round(median / sort_seconds, 3),
            "ratio_to_heapify": round(median / heapify_seconds, 3),
        }
    )
    emit(
        {
            "name": "scheduler_round_full",
            **common,
            "seconds": round(full_seconds, 4),
            "skipped": sum(full.skipped.values()),
            "ratio_to_sort": round(full_seconds / sort_seconds, 3),
        }
    )
    changes = 2 * statistics.median(decisions)
    emit(
        {
            "name": "scheduler_job_updates",
            **common,
            "changes_per_second": round(changes / statistics.median(update_seconds)),
        }
    )
    emit(
        {
            "name": "scheduler_memory",
            **common,
            "peak_rss_mib": round(rss_mib(), 1),
            "state_rss_mib": round(state_mib, 1),
            "bytes_per_job": round(state_mib * 2**20 / args.jobs),
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
