"""`make bench`'s last line: every figure of issue 19 beside its same-run baseline and target.

`summarise` is pure: it takes the JSON records the benchmarks printed (as `bench/run.py` collects
them, each with the `bench` that printed it) and returns one JSON object, one entry per figure:

- `value` and `unit`, read from the record named in `record`;
- `baseline` (same unit, measured in the same run, what it is in `baseline_of`) and `ratio`
  (value / baseline), or `baseline_missing` saying why there is none;
- `target` (on the value or on the ratio; null where the issue sets none) and `met`: true or
  false, or null where there is no target, or where the run measured other conditions than the
  target's (`not_judged` says which);
- or `missing` with the reason, when the benchmark failed, was not run, or does not measure the
  figure. Nothing is left out silently and no value is made up.

Beside them `cpu_ms_per_pod` (every component's CPU per pod released during the sustained
release, as `bench_release.py` reads it from /proc) and `cpu_ms_per_pod_raw_patch_loop` (the same
during the same run's raw patch loop), and `verdict`: the figures whose target was met, unmet,
missing, or not judged.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Record = Mapping[str, object]
Figure = dict[str, object]

# Which benchmark (bench/run.py's name for it) prints which record.
BENCH_OF_RECORD_PREFIX = (
    ("scheduler_", "scheduler_round"),
    ("targets_", "targets"),
    ("ingest_", "ingest"),
    ("raw_patch_rate", "release"),
    ("release_", "release"),
    ("ui_", "ui_pages"),
    ("leader_view_", "leader_views"),
)

# bench_release.py's names for lockgate's services in `cpu_seconds_by_component`; the issue's
# CPU target covers the first four (queue-store, watcher, scheduler, ungater).
TARGET_SERVICES = ("queue_store", "cluster_watcher", "fair_scheduler", "ungater")
STORES = ("kafka.Kafka", "postgres")
# What bench_release.py's CPU readings for the sustained release cover.
CPU_WINDOW = ("the sustained release only (fair-scheduler started -> last gate removed), per pod "
              "released; creating the pods and ingesting them came before and is not counted")
# The process that runs bench_release.py: during the raw patch loop, the tight patching client.
RAW_CLIENT = "bench_release.py"

# bench_ui_pages.py's PAGES, each printed as `ui_<page>`.
UI_PAGES = ("waiting_first_page", "waiting_last_page", "waiting_filtered_by_cluster",
            "queue_jobsets", "jobset_pods_page", "clusters", "pod_queued", "queues")

# bench_leader_views.py's calls, each printed as `leader_view_<call>` (issue 37): the four asked
# again and again, and explain of a pod asked about for the first time (the leader works it out
# after the round in progress).
LEADER_VIEWS = ("status", "explain", "ui_queue_page", "ui_pod_page", "explain_first_ask")

# The sizes issue 19's targets are set for.
RELEASE_PODS = 10_000
RELEASE_QUEUES = 100
RELEASE_CLUSTERS = 2
LATENCY_PODS = 100


@dataclass(frozen=True)
class Target:
    on: Literal["value", "ratio"]
    op: Literal["<=", ">="]
    limit: float

    def text(self, unit: str) -> str:
        limit = f"{self.limit:g}"
        return f"ratio {self.op} {limit}" if self.on == "ratio" else f"{self.op} {limit} {unit}"

    def met(self, value: float, ratio: float | None) -> bool | None:
        judged = value if self.on == "value" else ratio
        if judged is None:
            return None
        return judged <= self.limit if self.op == "<=" else judged >= self.limit


def bench_of(record_name: str) -> str:
    for prefix, bench in BENCH_OF_RECORD_PREFIX:
        if record_name.startswith(prefix):
            return bench
    return "?"


def number(record: Record | None, key: str) -> float | None:
    """A finite number under `key`, else None (booleans are not numbers here)."""
    if record is None:
        return None
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _round(value: float) -> float:
    """Four significant digits, for what the summary computes (ratios, CPU per pod); the
    records' own numbers are given as they are."""
    return float(f"{value:.4g}")


class _Summariser:
    def __init__(self, records: Sequence[Record], failed: Collection[str],
                 ran: Collection[str] | None) -> None:
        self.by_name: dict[str, Record] = {}
        for record in records:
            name = record.get("name")
            if isinstance(name, str):
                self.by_name[name] = record  # the last one wins, as in a rerun
        self.failed = failed
        self.ran = ran

    def record(self, name: str) -> Record | None:
        return self.by_name.get(name)

    def why_missing(self, name: str, key: str | None = None) -> str:
        bench = bench_of(name)
        if name in self.by_name:
            return f"`{name}` has no number under `{key}`"
        if bench in self.failed:
            return f"{bench} failed before it printed `{name}`"
        if self.ran is not None and bench not in self.ran:
            return f"{bench} was not run"
        return f"{bench} printed no `{name}` record"

    def figure(self, *, record: str, key: str, unit: str, target: Target | None,
               baseline_record: str | None = None, baseline_key: str | None = None,
               baseline_of: str | None = None, baseline_missing: str | None = None,
               not_judged: str | None = None, context: Sequence[str] = ()) -> Figure:
        """One figure: the value under `key` of `record`, beside the baseline under
        `baseline_key` of `baseline_record` (the same record when that is None)."""
        found = self.record(record)
        value = number(found, key)
        figure: Figure = {"record": record, "unit": unit,
                          "target": target.text(unit) if target else None}
        if value is None:
            return {**figure, "missing": self.why_missing(record, key), "met": None}
        figure["value"] = value
        # The conditions it was measured under (sizes), as the record gives them.
        figure.update({k: found[k] for k in context if found is not None and k in found})
        ratio: float | None = None
        if baseline_key is not None:
            source = baseline_record or record
            baseline = number(self.record(source), baseline_key)
            if baseline is None:
                figure["baseline_missing"] = self.why_missing(source, baseline_key)
            elif baseline == 0:
                figure["baseline_missing"] = f"`{source}`'s `{baseline_key}` is 0"
            else:
                ratio = value / baseline
                figure["baseline"] = baseline
                figure["baseline_of"] = baseline_of
                figure["ratio"] = _round(ratio)
        else:
            figure["baseline_missing"] = baseline_missing or "no same-run baseline is measured"
        if target is None:
            figure["met"] = None
        elif not_judged is not None:
            figure["met"] = None
            figure["not_judged"] = not_judged
        else:
            figure["met"] = target.met(value, ratio)
            if figure["met"] is None:
                figure["not_judged"] = "the target is on the ratio, and there is no baseline"
        return figure

    def release_conditions(self) -> str | None:
        """Why the sustained release does not count against the targets, if it does not."""
        found = self.record("release_throughput")
        if found is None:
            return None
        wrong = [f"{key} {number(found, key)!r} (the target's: {want:,})"
                 for key, want in (("pending_pods", RELEASE_PODS), ("queues", RELEASE_QUEUES),
                                   ("clusters", RELEASE_CLUSTERS))
                 if number(found, key) != want]
        if found.get("complete") is not True:
            wrong.append("not every pod was released before the deadline (complete: false)")
        return "; ".join(wrong) or None

    def latency_conditions(self) -> str | None:
        found = self.record("release_latency")
        if found is None:
            return None
        wrong = []
        if number(found, "pods") != LATENCY_PODS:
            wrong.append(f"pods {number(found, 'pods')!r} (the target's: {LATENCY_PODS})")
        if found.get("complete") is not True:
            wrong.append("not every pod was released within 120 s (complete: false)")
        return "; ".join(wrong) or None

    def cpu_per_pod(self, record: str, pods_key: str) -> dict[str, float] | str:
        """Every component's CPU in ms per pod, or why there is none."""
        found = self.record(record)
        pods = number(found, pods_key)
        if found is None or pods is None:
            return self.why_missing(record, pods_key)
        if pods == 0:
            return f"`{record}` released no pod"
        cpu = found.get("cpu_seconds_by_component")
        if not isinstance(cpu, Mapping):
            return self.why_missing(record, "cpu_seconds_by_component")
        return {str(name): _round(1000 * seconds / pods)
                for name, seconds in cpu.items()
                if isinstance(seconds, int | float) and not isinstance(seconds, bool)}

    def cpu_figure(self, components: Sequence[str], target: Target,
                   per_pod: dict[str, float] | str, raw_client: float | None,
                   why_no_raw: str) -> Figure:
        figure: Figure = {"record": "release_throughput", "unit": "ms CPU per pod",
                          "components": list(components), "target": target.text("ms"),
                          "measured_over": CPU_WINDOW}
        if isinstance(per_pod, str):
            return {**figure, "missing": per_pod, "met": None}
        absent = [c for c in components if c not in per_pod]
        if absent:
            return {**figure, "missing": "no CPU reading for " + ", ".join(absent),
                    "met": None}
        value = sum(per_pod[c] for c in components)
        figure["value"] = _round(value)
        if raw_client is None or raw_client == 0:
            figure["baseline_missing"] = why_no_raw
        else:
            figure["baseline"] = raw_client
            figure["baseline_of"] = ("the raw patch loop's client (bench_release.py), CPU per "
                                     "pod it ungated")
            figure["ratio"] = _round(value / raw_client)
        not_judged = self.release_conditions()
        if not_judged is not None:
            figure["met"] = None
            figure["not_judged"] = not_judged
        else:
            figure["met"] = target.met(value, None)
        return figure


def summarise(records: Sequence[Record], *, failed: Collection[str] = (),
              ran: Collection[str] | None = None) -> dict[str, object]:
    """The summary of one `make bench` run. `failed`: the benchmarks that exited non-zero;
    `ran`: those that were run (None: all of them)."""
    s = _Summariser(records, failed, ran)
    figures: dict[str, Figure] = {}
    raw_rate = "a tight kubernetes-asyncio client removing the gate on the same apiservers"

    # Sustained release: 10,000 pods, 100 queues, 2 clusters; >= 0.8x the raw patch loop.
    figures["release_throughput"] = s.figure(
        record="release_throughput", key="pods_per_second", unit="pods/s",
        target=Target("ratio", ">=", 0.8), baseline_record="raw_patch_rate",
        baseline_key="pods_per_second", baseline_of=raw_rate,
        not_judged=s.release_conditions(),
        context=("pending_pods", "queues", "clusters", "complete", "released"))

    # lockgate's CPU for those pods: <= 2 ms per pod for the services, <= 1 for Kafka + Postgres.
    per_pod = s.cpu_per_pod("release_throughput", "released")
    raw_per_pod = s.cpu_per_pod("raw_patch_rate", "pods")
    raw_client = raw_per_pod.get(RAW_CLIENT) if isinstance(raw_per_pod, dict) else None
    why_no_raw = (raw_per_pod if isinstance(raw_per_pod, str)
                  else f"no CPU reading for {RAW_CLIENT} in `raw_patch_rate`")
    figures["cpu_services_ms_per_pod"] = s.cpu_figure(
        TARGET_SERVICES, Target("value", "<=", 2.0), per_pod, raw_client, why_no_raw)
    figures["cpu_kafka_postgres_ms_per_pod"] = s.cpu_figure(
        STORES, Target("value", "<=", 1.0), per_pod, raw_client, why_no_raw)

    # Release latency with room, 100 pods one at a time.
    no_latency_baseline = "bench_release.py measures no same-run baseline for latency"
    latency_conditions = s.latency_conditions()
    for key, limit in (("p50_ms", 40.0), ("p99_ms", 100.0)):
        figures[f"release_latency_{key}"] = s.figure(
            record="release_latency", key=key, unit="ms", target=Target("value", "<=", limit),
            baseline_missing=no_latency_baseline, not_judged=latency_conditions,
            context=("pods", "complete"))
    # The issue asks for these p99s without a target of their own.
    for name, record in (("release_latency_p99_ms_1000_created_at_once",
                          "release_latency_burst"),
                         ("release_latency_p99_ms_while_releasing_10000",
                          "release_latency_while_releasing")):
        figures[name] = s.figure(
            record=record, key="p99_ms", unit="ms", target=None,
            baseline_missing=no_latency_baseline, not_judged=None,
            context=("pods", "complete"))

    # Ingest of new pods, Kafka -> queue-store -> Postgres, with 1 and with 2 instances.
    for instances, suffix in ((1, ""), (2, "_2_instances")):
        record = f"ingest_end_to_end_new_pods{suffix}"
        stem = f"ingest_new_pods_{instances}_instance{'s' if instances > 1 else ''}"
        figures[f"{stem}_vs_copy"] = s.figure(
            record=record, key="events_per_second", unit="events/s",
            target=Target("ratio", ">=", 0.5), baseline_record="ingest_baseline_copy",
            baseline_key="events_per_second",
            baseline_of="a raw COPY of the same rows (copy_records_to_table)",
            context=("events", "instances"))
        figures[f"{stem}_vs_executemany"] = s.figure(
            record=record, key="events_per_second", unit="events/s", target=None,
            baseline_record="ingest_baseline_executemany", baseline_key="events_per_second",
            baseline_of="a raw executemany INSERT of the same rows",
            context=("events", "instances"))

    # Scheduler memory: <= 300 bytes per queued job.
    figures["scheduler_memory_bytes_per_job"] = s.figure(
        record="scheduler_memory", key="bytes_per_job", unit="bytes", target=Target(
            "value", "<=", 300.0),
        baseline_missing="bench_scheduler_round.py measures no same-run baseline for memory",
        context=("jobs", "queues"))

    # Figures without a target in issue 19, beside their baselines.
    figures["scheduler_round"] = s.figure(
        record="scheduler_round", key="seconds_median", unit="s", target=None,
        baseline_record="scheduler_baseline", baseline_key="sort_seconds",
        baseline_of="sorting as many (priority, created_at, id) tuples as there are jobs",
        context=("jobs", "queues"))
    for fleet in ("pinned", "flexible"):
        figures[f"targets_{fleet}"] = s.figure(
            record=f"targets_{fleet}", key="seconds", unit="s", target=None,
            baseline_key="baseline_adjusted_fair_shares_seconds",
            baseline_of="the pool-wide adjusted fair shares of the same queues",
            context=("queues", "clusters"))
    # Every page the run printed, and those it should have printed.
    printed = [n.removeprefix("ui_") for n, r in s.by_name.items()
               if n.startswith("ui_") and "median_ms" in r]
    for page in dict.fromkeys([*UI_PAGES, *printed]):
        figures[f"ui_{page}"] = s.figure(
            record=f"ui_{page}", key="median_ms", unit="ms", target=None,
            baseline_key="baseline_median_ms",
            baseline_of="the same page with fewer queued pods (baseline_queued)",
            context=("queued", "baseline_queued"))
    # Issue 37: every call that says why pods wait answers from the leader's picture, p99 within
    # 200 ms at a million queued pods on the simulator's fleet, rounds going on.
    for call in LEADER_VIEWS:
        figures[f"leader_view_{call}"] = s.figure(
            record=f"leader_view_{call}", key="p99_ms", unit="ms",
            target=Target("value", "<=", 200.0), baseline_key="baseline_p99_ms",
            baseline_of="the same call with fewer queued pods (baseline_queued)",
            context=("queued", "baseline_queued"))

    verdict: dict[str, list[str]] = {"met": [], "unmet": [], "missing": [], "not_judged": []}
    for name, figure in figures.items():
        if "missing" in figure:
            verdict["missing"].append(name)
        elif figure["target"] is None:
            continue
        elif "not_judged" in figure:
            verdict["not_judged"].append(name)
        else:
            verdict["met" if figure["met"] else "unmet"].append(name)

    return {"summary": True, "failed": sorted(failed), **figures,
            "cpu_ms_per_pod": per_pod if isinstance(per_pod, dict) else {"missing": per_pod},
            "cpu_ms_per_pod_raw_patch_loop": raw_per_pod if isinstance(raw_per_pod, dict)
            else {"missing": raw_per_pod},
            "verdict": verdict}
