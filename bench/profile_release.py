"""Where lockgate's CPU goes on the release path: py-spy samples every service while
bench_release.py runs, then a summary per service of what dominates.

    python bench/profile_release.py [--out DIR] [-- bench_release.py arguments]

py-spy (PyPI) reads the interpreters from outside, so the services run unchanged. Idle
threads are not sampled, so a service's samples are its busy time. The summary groups each
sample's innermost frame by the package its file belongs to (kubernetes_asyncio, pydantic,
aiokafka, asyncpg, lockgate, the standard library's modules, ...): "self" shares. "Inclusive"
shares count a sample once for every package anywhere on its stack, which shows the library
calls that run other code (kubernetes_asyncio deserialising into model objects, say).

Prints one JSON object per service and writes the raw stacks (collapsed format, for any flame
graph tool) to DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
SERVICES = ("queue_store", "cluster_watcher", "fair_scheduler", "ungater", "admission_webhook")
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def children_of(root: int) -> dict[int, str]:
    """Every descendant of `root`: pid -> command line."""
    parents: dict[int, int] = {}
    lines: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        lines[int(entry)] = cmdline.decode(errors="replace")
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = lines[pid]
                frontier.append(pid)
    return found


def service_of(cmdline: str) -> str | None:
    return next((s for s in SERVICES if f"-m {s}" in cmdline or f"/{s}/" in cmdline), None)


def package_of(file: str) -> str:
    """The package a frame's file belongs to, as a reader of a profile would name it. py-spy
    mostly gives paths relative to their sys.path entry ("pydantic/main.py", "selectors.py")."""
    if not file.startswith("/"):
        return file.split("/", 1)[0].removesuffix(".py")
    if "site-packages/" in file:
        return file.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    for root in ("libs/", "services/"):
        if f"/{root}" in file or file.startswith(root):
            return file.split(root, 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/lib/python3" in file:
        rest = file.split("/lib/python3", 1)[1].split("/", 1)[-1]
        return "stdlib:" + rest.split("/", 1)[0].removesuffix(".py")
    return file or "?"


def summarise(raw: Path, top: int = 8) -> dict[str, object]:
    self_by_package: Counter[str] = Counter()
    inclusive_by_package: Counter[str] = Counter()
    self_by_function: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = []
        for frame in stack.split(";"):
            match = FRAME.match(frame)
            if match:
                frames.append((match["function"], match["file"]))
        if not frames:
            continue
        total += count
        function, file = frames[-1]
        package = package_of(file)
        self_by_package[package] += count
        self_by_function[f"{package}:{function}"] += count
        for seen in {package_of(f) for _, f in frames}:
            inclusive_by_package[seen] += count

    def shares(counter: Counter[str]) -> dict[str, float]:
        return {name: round(n / total, 3) for name, n in counter.most_common(top)} if total else {}

    return {"samples": total, "self_by_package": shares(self_by_package),
            "inclusive_by_package": shares(inclusive_by_package),
            "self_by_function": shares(self_by_function)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "profile-release")
    parser.add_argument("--rate", type=int, default=50, help="samples per second")
    args, bench_args = parser.parse_known_args()
    bench_args = [a for a in bench_args if a != "--"]
    args.out.mkdir(parents=True, exist_ok=True)
    py_spy = Path(sys.executable).with_name("py-spy")
    if not py_spy.exists():
        sys.exit(f"py-spy is not in {py_spy.parent}: pip install py-spy")
    bench = subprocess.Popen([sys.executable, str(HERE / "bench_release.py"), *bench_args])
    samplers: dict[int, tuple[str, subprocess.Popen[bytes], Path]] = {}
    try:
        while bench.poll() is None:
            for pid, cmdline in children_of(bench.pid).items():
                service = service_of(cmdline)
                if service is None or pid in samplers:
                    continue
                raw = args.out / f"{service}-{pid}.txt"
                samplers[pid] = (service, subprocess.Popen(
                    [str(py_spy), "record", "--pid", str(pid), "--format", "raw",
                     "--rate", str(args.rate), "--nonblocking", "--output", str(raw)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), raw)
            time.sleep(0.5)
    finally:
        for _, sampler, _ in samplers.values():
            if sampler.poll() is None:
                sampler.send_signal(signal.SIGINT)
        for _, sampler, _ in samplers.values():
            sampler.wait(timeout=60)
    by_service: dict[str, list[Path]] = {}
    for service, _, raw in samplers.values():
        if raw.exists():
            by_service.setdefault(service, []).append(raw)
    for service, raws in sorted(by_service.items()):
        merged = args.out / f"{service}.txt"
        merged.write_text("".join(r.read_text() for r in raws))
        print(json.dumps({"name": "profile", "service": service, **summarise(merged)}),
              flush=True)
    return bench.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
