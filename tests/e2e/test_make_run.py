"""`make run` (python -m devstack.dev) as a person uses it: it starts every service in the
foreground, prints what to do next, the printed steps release a pod, Ctrl-C stops everything
gracefully, and running it again resumes where it stopped.

It runs with the real stack (the `stack` fixture brings it up first, so `make run` finds it up
and leaves it up). Its run id `dev` keeps its webhook registration, consumer groups and Queue
objects apart from other tests'.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from devstack import StackInfo
from lockgate.labels import MANAGED_NAMESPACE_LABEL, SCHEDULING_GATE
from lockgate_adapters.postgres import drop_database

READY_LINE = "lockgate is running"
START_WITHIN = 600.0  # a busy machine; a quiet one takes about a minute


class DevRun:
    """`python -m devstack.dev` with its output collected line by line."""

    def __init__(self, database: str) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "devstack.dev"], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            # A database of this test's own: a person's `make run` keeps lockgate_dev.
            env={**os.environ, "NO_COLOR": "1", "LOCKGATE_DEV_DATABASE": database})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, within: float) -> None:
        deadline = time.monotonic() + within
        while not any(text in line for line in self.lines):
            if self.process.poll() is not None:
                time.sleep(0.5)  # the reader's last lines
                pytest.fail(f"make run exited ({self.process.returncode}) before "
                            f"{text!r}:\n{self.output()[-5000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {text!r} after {within:.0f}s:\n{self.output()[-5000:]}")
            time.sleep(0.2)

    def interrupt(self, within: float = 120.0) -> int:
        self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(within)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail(f"make run did not stop within {within:.0f}s of Ctrl-C:\n"
                        f"{self.output()[-5000:]}")
        self._reader.join(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code


def dev_env(run: DevRun) -> dict[str, str]:
    """The environment of a shell that sourced the env file the run printed."""
    (source,) = [m.group(1) for line in run.lines
                 if (m := re.search(r"\|\s+source (\S+)", line))][-1:]
    env = dict(os.environ)
    for line in Path(source).read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            env[name] = value.replace("$PATH", os.environ.get("PATH", ""))
    return env


def sh(env: dict[str, str], *argv: str, stdin: str | None = None) -> str:
    done = subprocess.run(list(argv), env=env, input=stdin, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}{done.stdout}"
    return done.stdout


def pod_trace(traces_url: str, uid: str, *, expect: set[str],
              within: float = 90.0) -> set[str]:
    """The operation names of the pod's trace once every service in `expect` has sent spans."""
    url = f"{traces_url}/api/traces/{uid.replace('-', '')}"
    deadline = time.monotonic() + within
    seen: dict[str, set[str]] = {}
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                data = json.load(response).get("data") or []
        except urllib.error.HTTPError as error:
            if error.code != 404:  # 404: no span of this trace has arrived yet
                raise
            data = []
        seen = {}
        for trace in data:
            services = {key: p["serviceName"] for key, p in trace["processes"].items()}
            for span in trace["spans"]:
                seen.setdefault(services[span["processID"]], set()).add(span["operationName"])
        if expect <= set(seen):
            return set().union(*seen.values())
        assert time.monotonic() < deadline, (
            f"the pod's trace {url} has spans of {sorted(seen)} only after {within:.0f}s, "
            f"not of every one of {sorted(expect)}: {seen}")
        time.sleep(1)


def service_pids(stack: StackInfo) -> dict[str, int]:
    recorded = json.loads((Path(stack.stack_dir) / "dev" / "pids.json").read_text())
    return {name: int(entry["pid"]) for name, entry in recorded.items()}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_make_run_starts_everything_is_usable_stops_on_ctrl_c_and_reruns(
        stack: StackInfo) -> None:
    suffix = uuid.uuid4().hex[:6]
    queue, namespace = f"dev-{suffix}", f"dev-{suffix}"
    database = f"lockgate_dev_test_{suffix}"
    # Whatever fails, the namespace (its pod holds half a cpu of cluster-a for ever) and the
    # database go: a pod left running once made every later test that fills cluster-a fail.
    try:
        first = DevRun(database)
        try:
            first.wait_for(READY_LINE, START_WITHIN)
            env = dev_env(first)
            pids = service_pids(stack)
            assert set(pids) == {"queue-store", "admission-webhook", "cluster-watcher", "ungater",
                                 "fair-scheduler", "jaeger"}
            # The printed steps, with this test's own names.
            sh(env, "lockgate", "queue", "create", queue, "--namespace", f"cluster-a/{namespace}")
            sh(env, "kubectl", "create", "namespace", namespace)
            sh(env, "kubectl", "label", "namespace", namespace, f"{MANAGED_NAMESPACE_LABEL}=true",
               "lockgate.io/run=dev")
            example = (Path(stack.stack_dir) / "dev" / "example-pod.yaml").read_text()
            example = example.replace("namespace: team-a", f"namespace: {namespace}").replace(
                "lockgate.io/queue: team-a", f"lockgate.io/queue: {queue}")
            # Gated by the run's webhook (as created: it may be released a moment later), then
            # released by its scheduler and ungater.
            created = json.loads(sh(env, "kubectl", "create", "-o", "json", "-f", "-",
                                    stdin=example))
            assert SCHEDULING_GATE in {g["name"] for g in created["spec"]["schedulingGates"]}
            name = f"pod/{created['metadata']['name']}"
            deadline = time.monotonic() + 180
            while True:
                pod = json.loads(sh(env, "kubectl", "-n", namespace, "get", name, "-o", "json"))
                if not pod["spec"].get("schedulingGates") and pod["spec"].get("nodeName"):
                    break
                assert time.monotonic() < deadline, f"pod never released: {pod['spec']}"
                time.sleep(0.5)
            jobs = sh(env, "lockgate", "jobs", "list", "--queue", queue)
            assert name.split("/")[1] in jobs, jobs
            # The pod's journey is one trace in the run's Jaeger, whose id is the pod's uid.
            trace = pod_trace(env["LOCKGATE_TRACES_URL"], created["metadata"]["uid"],
                              expect={"cluster-watcher", "queue-store", "fair-scheduler",
                                      "ungater"})
            assert {"pod observed", "release decided", "ungate"} <= trace, trace
            # A record written inside a span carries its ids (the round that released the pod).
            assert any("fair-scheduler" in line and "round (" in line and "trace_id=" in line
                       and "span_id=" in line for line in first.lines), first.output()[-5000:]
        finally:
            code = first.interrupt()
        out = first.output()
        assert code == 0, out[-5000:]
        (stopped,) = [line for line in first.lines if "| stopped: " in line]
        assert stopped.count("exit 0") == 5, stopped  # the five services; Jaeger stops after them
        assert not [pid for pid in pids.values() if alive(pid)]
        for kubeconfig in stack.kubeconfigs.values():
            hooks = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "get",
                                    "mutatingwebhookconfigurations", "-o", "name"], env=env,
                                   capture_output=True, text=True, check=True).stdout
            assert "lockgate-dev" not in hooks  # no fail-closed registration left behind
        assert not (Path(stack.stack_dir) / "dev" / "pids.json").exists()

        # Again: it resumes with what the first run left (the queue, the job).
        second = DevRun(database)
        try:
            second.wait_for(READY_LINE, START_WITHIN)
            assert queue in sh(env, "lockgate", "queue", "get", queue)
            assert name.split("/")[1] in sh(env, "lockgate", "jobs", "list", "--queue", queue)
        finally:
            code = second.interrupt()
        assert code == 0, second.output()[-5000:]
    finally:
        subprocess.run(["kubectl", "--kubeconfig", stack.kubeconfigs["cluster-a"], "delete",
                        "namespace", namespace, "--ignore-not-found", "--wait=false"],
                       capture_output=True, text=True, check=False)
        asyncio.run(drop_database(stack.postgres_dsn, database))
