"""`make bench`: every benchmark in one run; one JSON object per measurement, then a summary.

Figures are reported beside a baseline measured in the same run (machines are noisy): the
scheduler round against sorting the same number of tuples, ingest against a raw executemany and
a raw COPY of the same rows, and release throughput against a tight client patching pods on the
same apiservers. The last line is `summary.summarise`'s: every figure of issue 19 with its value,
its same-run baseline, the ratio, the target and whether it was met, or why it is missing.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from summary import summarise

HERE = Path(__file__).resolve().parent
BENCHES = [
    ("scheduler_round", [sys.executable, str(HERE / "bench_scheduler_round.py")]),
    ("targets", [sys.executable, str(HERE / "bench_targets.py")]),
    # With 1 and with 2 queue-store instances in one consumer group (issue 19, item 4).
    ("ingest", [sys.executable, str(HERE / "bench_ingest.py"), "--instances", "1,2"]),
    ("release", [sys.executable, str(HERE / "bench_release.py")]),
    ("ui_pages", [sys.executable, str(HERE / "bench_ui_pages.py")]),
    # status, explain and two UI pages at a million queued pods, a leader running (issue 37).
    ("leader_views", [sys.executable, str(HERE / "bench_leader_views.py")]),
]


def machine() -> dict[str, object]:
    memory_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kb = int(line.split()[1])
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "memory_gib": round(memory_kb / 2**20, 1),
            "python": platform.python_version(), "platform": platform.platform()}


def main() -> int:
    only = set(sys.argv[1:])
    records: list[dict[str, object]] = []
    failed: list[str] = []
    ran: list[str] = []
    results_dir = HERE / "results"
    results_dir.mkdir(exist_ok=True)
    for name, command in BENCHES:
        if only and name not in only:
            continue
        ran.append(name)
        started = time.monotonic()
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        for line in completed.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                record = json.loads(line)
                record.setdefault("bench", name)
                records.append(record)
                print(json.dumps(record), flush=True)
        if completed.returncode != 0:
            failed.append(name)
            tail = completed.stderr[-3000:]
            sys.stderr.write(f"{name} failed ({completed.returncode}):\n{tail}\n")
        sys.stderr.write(f"{name}: {time.monotonic() - started:.0f}s\n")
    summary = {**summarise(records, failed=failed, ran=ran), "machine": machine()}
    (results_dir / "latest.jsonl").write_text(
        "\n".join(json.dumps(r) for r in [*records, summary]) + "\n")
    print(json.dumps(summary), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
