"""`make compose-up` and `make compose-down` as a person uses them (docs/deploying.md): one
command brings up the engine, the images, the kubeconfigs, compose and the in-cluster webhooks;
the steps it prints gate a pod and release it; the other command removes all of it.

It runs the real commands (`python -m devstack.compose_up up|down`, which the make targets run)
against the local stack, as subprocesses, and follows the printed steps with the CLI and
kubectl from the printed env file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from devstack.compose_up import PROJECT, RUN_ID, state_dir
from devstack.config import Settings
from devstack.docker import nft_tables
from devstack.procs import pid_alive
from lockgate.labels import SCHEDULING_GATE

pytestmark = [pytest.mark.stack, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]


def compose_up(action: str, timeout: float) -> str:
    done = subprocess.run([sys.executable, "-m", "devstack.compose_up", action], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)
    out = done.stdout + done.stderr
    shown = out if len(out) < 9000 else f"{out[:2000]}\n[…]\n{out[-7000:]}"
    assert done.returncode == 0, f"compose_up {action} failed ({done.returncode}):\n{shown}"
    return out


def sourced(env_file: Path) -> dict[str, str]:
    env = dict(os.environ)
    for line in env_file.read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            env[name] = value.replace("$PATH", os.environ.get("PATH", ""))
    return env


def sh(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=120,
                          check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}{done.stdout}"
    return done.stdout


def test_compose_up_gates_and_releases_a_pod_and_compose_down_removes_everything(
        stack: object) -> None:
    settings = Settings.from_env()
    directory = state_dir(settings)
    tables_before = nft_tables()
    suffix = uuid.uuid4().hex[:6]
    queue = namespace = f"person-{suffix}"
    out = compose_up("up", timeout=1500)
    state = json.loads((directory / "state.json").read_text())
    env_file = directory / "env.sh"
    env = sourced(env_file)
    try:
        assert f"source {env_file}" in out, out[-3000:]  # the printed step
        # The printed steps, with this test's own names.
        sh(env, "lockgate", "queue", "create", queue, "--namespace", namespace)
        sh(env, "kubectl", "create", "namespace", namespace)
        sh(env, "kubectl", "label", "namespace", namespace, "lockgate.io/managed=true",
           f"lockgate.io/run={RUN_ID}")
        created = json.loads(sh(
            env, "kubectl", "-n", namespace, "run", "sleeper", "--image=registry.invalid/s:1",
            f"--labels=lockgate.io/queue={queue}", "-o", "json",
            '--overrides={"spec":{"tolerations":[{"operator":"Exists"}]}}'))
        gates = {g["name"] for g in created["spec"].get("schedulingGates") or []}
        assert SCHEDULING_GATE in gates, f"not gated by the in-cluster webhook: {created['spec']}"
        deadline = time.monotonic() + 180
        while True:
            pod = json.loads(sh(env, "kubectl", "-n", namespace, "get", "pod/sleeper", "-o",
                                "json"))
            if not pod["spec"].get("schedulingGates") and pod["spec"].get("nodeName"):
                break
            assert time.monotonic() < deadline, (
                f"the pod was not released and bound within 180 s: {pod['spec']}")
            time.sleep(1)
        sh(env, "kubectl", "delete", "namespace", namespace, "--wait=false")
    finally:
        down = compose_up("down", timeout=600)
    assert "compose deployment removed" in down, down[-3000:]
    assert not directory.exists(), f"{directory} left behind"
    hooks = sh(env, "kubectl", "--kubeconfig", str(settings.kubeconfig("cluster-a")),
               "get", "mutatingwebhookconfigurations", "-o", "name")
    assert f"lockgate-{RUN_ID}" not in hooks, "a fail-closed registration was left behind"
    assert nft_tables() <= tables_before, f"nft tables left: {nft_tables() - tables_before}"
    if state["engine_pid"]:
        assert not pid_alive(int(state["engine_pid"])), "the dockerd compose-up started runs on"
    assert PROJECT in out
