"""bench/summary.py: `make bench`'s last line, every figure of issue 19 beside its same-run
baseline and target, or why it is missing.

The records below are shaped as the benchmarks print them (the keys are those of the scripts'
`json.dumps`/`emit` calls, quoted from bench/bench_*.py); the release and CPU numbers are those
of BENCHMARKS.md's 2026-11-29 run, the scheduler ones of a small run of
`bench_scheduler_round.py --jobs 20000 --queues 20 --rounds 2`.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_summary", ROOT / "bench" / "summary.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


summary = _load()


def scheduler_records() -> list[dict[str, Any]]:
    # bench_scheduler_round.py: "scheduler_baseline", "scheduler_round", "scheduler_memory", ...
    return [
        {"name": "scheduler_baseline", "jobs": 20000, "queues": 20, "sort_seconds": 0.0069,
         "heapify_seconds": 0.0011, "bench": "scheduler_round"},
        {"name": "scheduler_load", "jobs": 20000, "queues": 20, "seconds": 0.047,
         "cpu_seconds": 0.047, "jobs_per_second": 421104, "ratio_to_sort": 6.89,
         "bench": "scheduler_round"},
        {"name": "scheduler_round", "jobs": 20000, "queues": 20, "seconds_median": 0.0501,
         "seconds_min": 0.0495, "seconds_max": 0.0507, "cpu_seconds_median": 0.0501,
         "decisions": 2473, "decisions_per_second": 49390, "ratio_to_sort": 7.259,
         "ratio_to_heapify": 45.698, "bench": "scheduler_round"},
        {"name": "scheduler_memory", "jobs": 20000, "queues": 20, "peak_rss_mib": 45.2,
         "state_rss_mib": 5.8, "bytes_per_job": 302, "bench": "scheduler_round"},
    ]


def targets_records() -> list[dict[str, Any]]:
    # bench_targets.py: "targets_pinned", "targets_flexible", "targets_pinned_recomputed".
    return [
        {"name": "targets_pinned", "queues": 1000, "clusters": 50, "demands": 1000,
         "seconds": 1.2, "filling_steps": 39, "baseline_adjusted_fair_shares_seconds": 0.012,
         "ratio_to_baseline": 100.0, "bench": "targets"},
        {"name": "targets_pinned_recomputed", "seconds": 0.18, "filling_steps": 39,
         "bench": "targets"},
        {"name": "targets_flexible", "queues": 1000, "clusters": 50, "demands": 3000,
         "seconds": 4.74, "filling_steps": 1, "baseline_adjusted_fair_shares_seconds": 0.02257,
         "ratio_to_baseline": 210.0, "bench": "targets"},
    ]


def ingest_records() -> list[dict[str, Any]]:
    # bench_ingest.py: "ingest_baseline_executemany", "ingest_baseline_copy",
    # "ingest_store_only", "ingest_end_to_end_new_pods" + "_2_instances", ...
    def end_to_end(name: str, instances: int, rate: int) -> dict[str, Any]:
        return {"name": name, "events": 20000, "batch": 2000, "instances": instances,
                "seconds": round(20000 / rate, 3), "events_per_second": rate,
                "publish_events_per_second": 40000, "ratio_to_baseline": round(rate / 28362, 3),
                "ratio_to_copy_baseline": round(rate / 78613, 3),
                "baselines": ["ingest_baseline_executemany", "ingest_baseline_copy"],
                "bench": "ingest"}

    return [
        {"name": "ingest_baseline_executemany", "events": 20000, "events_per_second": 28362,
         "bench": "ingest"},
        {"name": "ingest_baseline_copy", "events": 20000, "events_per_second": 78613,
         "bench": "ingest"},
        {"name": "ingest_store_only", "events": 20000, "batch": 2000, "seconds": 0.912,
         "events_per_second": 21918, "ratio_to_baseline": 0.773,
         "ratio_to_copy_baseline": 0.279, "bench": "ingest"},
        end_to_end("ingest_end_to_end_new_pods", 1, 10343),
        end_to_end("ingest_end_to_end_state_changes", 1, 5264),
        end_to_end("ingest_end_to_end_new_pods_2_instances", 2, 10494),
        end_to_end("ingest_end_to_end_state_changes_2_instances", 2, 9008),
    ]


def release_records(*, pending: int = 10000, complete: bool = True) -> list[dict[str, Any]]:
    # bench_release.py: "raw_patch_rate", "release_latency", "release_latency_burst",
    # "release_throughput", "release_latency_while_releasing".
    return [
        {"name": "raw_patch_rate", "pods": 2000, "concurrency": 32, "seconds": 17.7,
         "pods_per_second": 113.0,
         "cpu_seconds_by_component": {"kube-apiserver": 18.4, "bench_release.py": 4.5,
                                      "kube-scheduler": 3.8, "kwok": 3.2, "etcd": 2.7},
         "bench": "release"},
        {"name": "release_latency", "pods": 100, "complete": True, "p50_ms": 299.0,
         "p99_ms": 872.0, "bench": "release"},
        {"name": "release_latency_burst", "pods": 1000, "complete": True, "p50_ms": 1210.0,
         "p99_ms": 2405.5, "bench": "release"},
        {"name": "release_throughput", "pending_pods": pending, "queues": 100, "clusters": 2,
         "complete": complete, "released": pending, "seconds": 170.0,
         "pods_per_second": 58.9, "pod_creation_seconds": 140.2,
         "cpu_seconds_by_component": {
             "kube-apiserver": 125.6, "queue_store": 28.1, "kube-scheduler": 25.8,
             "ungater": 25.2, "cluster_watcher": 22.5, "fair_scheduler": 21.7, "kwok": 20.5,
             "etcd": 16.0, "kafka.Kafka": 15.7, "postgres": 14.1,
             "kube-controller-manager": 12.6, "bench_release.py": 4.7},
         "ratio_to_raw_patch_rate": 0.521, "bench": "release"},
        {"name": "release_latency_while_releasing", "pods": 100, "complete": True,
         "p50_ms": 310.0, "p99_ms": 1900.0, "while_releasing_pods": pending,
         "probes_before_backlog_done": 100, "bench": "release"},
    ]


def ui_records(pages: tuple[str, ...] = summary.UI_PAGES) -> list[dict[str, Any]]:
    # bench_ui_pages.py: "ui_<page>" for each of PAGES.
    return [{"name": f"ui_{page}", "queued": 100000, "median_ms": 29.7,
             "baseline_queued": 1000, "baseline_median_ms": 18.5, "ratio_to_baseline": 1.61,
             "bench": "ui_pages"} for page in pages]


def leader_view_records() -> list[dict[str, Any]]:
    # bench_leader_views.py: "leader_view_<call>" for each call; explain misses its target.
    return [{"name": f"leader_view_{call}", "queued": 1_000_000, "p50_ms": 20.0,
             "p99_ms": 250.0 if call == "explain" else 40.0, "baseline_queued": 1000,
             "baseline_p50_ms": 10.0, "baseline_p99_ms": 20.0, "bench": "leader_views"}
            for call in summary.LEADER_VIEWS]


def every_record() -> list[dict[str, Any]]:
    return [*scheduler_records(), *targets_records(), *ingest_records(), *release_records(),
            *ui_records(), *leader_view_records()]


def test_leader_views_are_judged_on_their_p99_beside_the_same_call_at_the_baseline() -> None:
    result = summary.summarise(every_record())
    status = result["leader_view_status"]
    assert (status["value"], status["baseline"], status["met"]) == (40.0, 20.0, True)
    assert status["ratio"] == pytest.approx(2.0)
    assert "leader_view_explain" in result["verdict"]["unmet"]
    without = summary.summarise([r for r in every_record()
                                 if not r["name"].startswith("leader_view_")])
    assert "leader_view_ui_pod_page" in without["verdict"]["missing"]


def test_release_throughput_is_a_ratio_to_the_same_runs_raw_patch_loop() -> None:
    result = summary.summarise(every_record())
    figure = result["release_throughput"]
    assert figure["value"] == 58.9
    assert figure["baseline"] == 113.0
    assert figure["ratio"] == pytest.approx(58.9 / 113.0, rel=1e-3)
    assert figure["target"] == "ratio >= 0.8"
    assert figure["met"] is False
    assert figure["pending_pods"] == 10000


def test_cpu_per_pod_per_service_and_its_targets() -> None:
    result = summary.summarise(every_record())
    per_pod = result["cpu_ms_per_pod"]
    assert per_pod["queue_store"] == pytest.approx(2.81)
    assert per_pod["ungater"] == pytest.approx(2.52)
    assert per_pod["cluster_watcher"] == pytest.approx(2.25)
    assert per_pod["fair_scheduler"] == pytest.approx(2.17)
    services = result["cpu_services_ms_per_pod"]
    assert services["value"] == pytest.approx(9.75)
    # The raw loop's client: 4.5 CPU-s for 2,000 pods.
    assert services["baseline"] == pytest.approx(2.25)
    assert services["ratio"] == pytest.approx(9.75 / 2.25, rel=1e-3)
    assert services["met"] is False
    stores = result["cpu_kafka_postgres_ms_per_pod"]
    assert stores["value"] == pytest.approx(2.98)
    assert stores["met"] is False
    assert result["cpu_ms_per_pod_raw_patch_loop"]["kube-apiserver"] == pytest.approx(9.2)


def test_targets_met_and_unmet_are_judged_on_value_or_ratio() -> None:
    records = every_record()
    for record in records:
        if record["name"] == "release_throughput":
            record["pods_per_second"] = 95.0  # 0.84x the raw loop
            record["cpu_seconds_by_component"] = {
                "queue_store": 5.0, "cluster_watcher": 5.0, "fair_scheduler": 5.0,
                "ungater": 5.0, "kafka.Kafka": 6.0, "postgres": 4.0}
        if record["name"] == "release_latency":
            record.update(p50_ms=40.0, p99_ms=100.1)
        if record["name"] == "ingest_end_to_end_new_pods":
            record["events_per_second"] = 39307  # 0.5x COPY, just
        if record["name"] == "scheduler_memory":
            record["bytes_per_job"] = 300
    result = summary.summarise(records)
    assert result["release_throughput"]["met"] is True
    assert result["cpu_services_ms_per_pod"]["value"] == pytest.approx(2.0)
    assert result["cpu_services_ms_per_pod"]["met"] is True
    assert result["cpu_kafka_postgres_ms_per_pod"]["met"] is True
    assert result["release_latency_p50_ms"]["met"] is True
    assert result["release_latency_p99_ms"]["met"] is False
    assert result["ingest_new_pods_1_instance_vs_copy"]["met"] is True
    assert result["ingest_new_pods_2_instances_vs_copy"]["met"] is False
    assert result["scheduler_memory_bytes_per_job"]["met"] is True
    verdict = result["verdict"]
    assert "release_throughput" in verdict["met"]
    assert "release_latency_p99_ms" in verdict["unmet"]
    assert "ingest_new_pods_2_instances_vs_copy" in verdict["unmet"]


def test_ingest_is_given_against_both_baselines_with_1_and_2_instances() -> None:
    result = summary.summarise(every_record())
    for instances, rate in ((1, 10343), (2, 10494)):
        figure = "ingest_new_pods_1_instance" if instances == 1 else "ingest_new_pods_2_instances"
        copy = result[f"{figure}_vs_copy"]
        many = result[f"{figure}_vs_executemany"]
        assert copy["value"] == many["value"] == rate
        assert copy["instances"] == instances
        assert copy["baseline"] == 78613
        assert copy["ratio"] == pytest.approx(rate / 78613, rel=1e-3)
        assert copy["met"] is False
        assert many["baseline"] == 28362
        assert many["ratio"] == pytest.approx(rate / 28362, rel=1e-3)
        assert many["target"] is None and many["met"] is None


def test_figures_without_a_target_keep_their_baseline_and_ratio() -> None:
    result = summary.summarise(every_record())
    round_ = result["scheduler_round"]
    assert round_["baseline"] == 0.0069
    assert round_["ratio"] == pytest.approx(0.0501 / 0.0069, rel=1e-3)
    assert round_["target"] is None and round_["met"] is None
    assert result["ui_waiting_first_page"]["ratio"] == pytest.approx(29.7 / 18.5, rel=1e-3)
    assert result["targets_flexible"]["ratio"] == pytest.approx(4.74 / 0.02257, rel=1e-3)
    memory = result["scheduler_memory_bytes_per_job"]
    assert "baseline" not in memory and "ratio" not in memory
    assert "no same-run baseline" in memory["baseline_missing"]
    assert memory["met"] is False  # 302 bytes


def test_a_failed_benchmark_leaves_its_figures_missing_with_the_reason() -> None:
    records = [r for r in every_record() if r["bench"] != "release"]
    result = summary.summarise(records, failed=["release"])
    for name in ("release_throughput", "cpu_services_ms_per_pod",
                 "cpu_kafka_postgres_ms_per_pod", "release_latency_p50_ms",
                 "release_latency_p99_ms"):
        assert "release failed" in result[name]["missing"], name
        assert result[name]["met"] is None
        assert "value" not in result[name]
        assert name in result["verdict"]["missing"]
    assert "release failed" in result["cpu_ms_per_pod"]["missing"]
    assert result["failed"] == ["release"]
    # The others are still there.
    assert result["ingest_new_pods_1_instance_vs_copy"]["value"] == 10343


def test_a_benchmark_not_run_or_a_record_not_printed_is_said_so() -> None:
    records = [r for r in every_record()
               if r["bench"] != "ingest" and r["name"] != "raw_patch_rate"]
    result = summary.summarise(records, ran=["scheduler_round", "targets", "release",
                                             "ui_pages"])
    assert result["ingest_new_pods_2_instances_vs_copy"]["missing"] == "ingest was not run"
    throughput = result["release_throughput"]
    assert throughput["value"] == 58.9
    assert throughput["baseline_missing"] == "release printed no `raw_patch_rate` record"
    assert "ratio" not in throughput
    assert throughput["met"] is None  # a ratio target with no baseline is not judged
    assert "no baseline" in throughput["not_judged"]
    assert "release_throughput" in result["verdict"]["not_judged"]
    assert result["cpu_services_ms_per_pod"]["met"] is False  # judged on the value alone
    assert "raw_patch_rate" in result["cpu_services_ms_per_pod"]["baseline_missing"]


def test_the_burst_and_while_releasing_p99s_come_from_their_records() -> None:
    result = summary.summarise(every_record())
    burst = result["release_latency_p99_ms_1000_created_at_once"]
    assert (burst["record"], burst["value"], burst["pods"]) == ("release_latency_burst",
                                                                 2405.5, 1000)
    during = result["release_latency_p99_ms_while_releasing_10000"]
    assert (during["record"], during["value"]) == ("release_latency_while_releasing", 1900.0)
    for figure in (burst, during):
        assert figure["met"] is None and "missing" not in figure  # the issue sets no target


def test_a_latency_phase_that_printed_nothing_is_missing_not_made_up() -> None:
    records = [r for r in every_record() if r["name"] != "release_latency_burst"]
    result = summary.summarise(records)
    name = "release_latency_p99_ms_1000_created_at_once"
    assert "release_latency_burst" in result[name]["missing"]
    assert "value" not in result[name]
    assert name in result["verdict"]["missing"]


def test_a_release_at_another_size_or_unfinished_is_not_judged() -> None:
    records = [*scheduler_records(), *release_records(pending=3000)]
    result = summary.summarise(records)
    assert result["release_throughput"]["met"] is None
    assert "pending_pods 3000.0" in result["release_throughput"]["not_judged"]
    assert result["cpu_services_ms_per_pod"]["met"] is None
    assert "release_throughput" in result["verdict"]["not_judged"]
    unfinished = summary.summarise(release_records(complete=False))
    assert "complete: false" in unfinished["release_throughput"]["not_judged"]


def test_a_service_without_a_cpu_reading_makes_the_total_missing() -> None:
    records = every_record()
    for record in records:
        if record["name"] == "release_throughput":
            del record["cpu_seconds_by_component"]["ungater"]
    result = summary.summarise(records)
    assert result["cpu_services_ms_per_pod"]["missing"] == "no CPU reading for ungater"
    assert result["cpu_kafka_postgres_ms_per_pod"]["value"] == pytest.approx(2.98)


def test_a_record_without_its_number_is_missing_not_zero() -> None:
    records = every_record()
    for record in records:
        if record["name"] == "release_latency":
            record.update(p50_ms=None, p99_ms=None, complete=False)
    result = summary.summarise(records)
    assert result["release_latency_p50_ms"]["missing"] == "`release_latency` has no number " \
                                                          "under `p50_ms`"


def test_the_summary_is_one_json_line() -> None:
    line = json.dumps(summary.summarise(every_record()))
    assert "\n" not in line
    assert json.loads(line)["summary"] is True


def _bench_sources() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "bench").glob("bench_*.py")):
        yield path.name, path.read_text()


def test_the_record_names_and_keys_read_are_those_the_scripts_print() -> None:
    """Guards against a benchmark renaming what the summary reads."""
    sources = dict(_bench_sources())
    expected = {
        "bench_release.py": ['"raw_patch_rate"', '"release_throughput"', '"release_latency"',
                             '"pods_per_second"', '"pending_pods"', '"released"',
                             '"cpu_seconds_by_component"', '"p50_ms"', '"p99_ms"',
                             '"complete"', '"bench_release.py"', *(
                                 f'"{c}"' for c in (*summary.TARGET_SERVICES,
                                                    *summary.STORES))],
        "bench_ingest.py": ['"ingest_baseline_executemany"', '"ingest_baseline_copy"',
                            '"ingest_end_to_end_new_pods"', '"_{instances}_instances"',
                            '"events_per_second"'],
        "bench_scheduler_round.py": ['"scheduler_baseline"', '"sort_seconds"',
                                     '"scheduler_round"', '"seconds_median"',
                                     '"scheduler_memory"', '"bytes_per_job"'],
        "bench_targets.py": ['"targets_{name}"', '"baseline_adjusted_fair_shares_seconds"',
                             '("pinned", 0), ("flexible", 3)'],
        "bench_ui_pages.py": ['"ui_{name}"', '"median_ms"', '"baseline_median_ms"',
                              *(f'"{page}":' for page in summary.UI_PAGES)],
        "bench_leader_views.py": ['"leader_view_{name}"', '"p99_ms"', '"baseline_p99_ms"',
                                  *(f'"{call}":' for call in summary.LEADER_VIEWS)],
    }
    for script, needles in expected.items():
        for needle in needles:
            assert needle.replace('"', "") in sources[script].replace('"', ""), (script, needle)
