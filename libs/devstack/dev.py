"""`make run` (python -m devstack.dev): the local stack and every lockgate service in the
foreground, for a person to use, with one prefixed log stream; Ctrl-C stops it all.

Why beside the demo: `make demo` runs a script and stops; this leaves lockgate running and says
how to use it (the env to source, a queue, a namespace, a pod to watch being released).

What it keeps between runs, so running it again simply resumes:
- its own database (lockgate_dev; LOCKGATE_DEV_DATABASE names another, as its tests do) and
  run id `dev`: consumer groups, Queue objects and a webhook
  registration of its own, for namespaces labelled lockgate.io/managed=true and
  lockgate.io/run=dev, so tests and demos sharing the stack never meet it;
- fixed ports (58080 admin API, ... plus LOCKGATE_STACK_PORT_OFFSET);
- a pid file: services a killed earlier run left behind are stopped first;
- a Jaeger of its own (devstack.jaeger, memory only: traces last as long as the run), which
  every service sends its spans to (`--no-traces` starts none).
Ctrl-C (or SIGTERM) stops the services gracefully, removes the webhook registration, and stops
the stack too if this command started it (`--keep-stack` leaves it up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path

import asyncpg

from devstack.config import Settings
from devstack.jaeger import JaegerPorts, JaegerProcess, ensure_binary
from devstack.launcher import Lockgate
from devstack.ports import ServicePorts, free_port
from devstack.procs import cmdline, pid_alive
from devstack.stack import Stack
from lockgate.labels import MANAGED_NAMESPACE_LABEL, QUEUE_LABEL
from lockgate_adapters.postgres import create_database, with_database

RUN_ID = "dev"
DATABASE = "lockgate_dev"
# Tests of `make run` set this, so they never write into the database a person's runs keep.
DATABASE_ENV = "LOCKGATE_DEV_DATABASE"
QUEUE, NAMESPACE, CLUSTER = "team-a", "team-a", "cluster-a"
COLOURS = ("36", "32", "35", "33", "34", "31")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def dev_dir(settings: Settings) -> Path:
    return settings.stack_dir / "dev"


def ports(offset: int) -> ServicePorts:
    return ServicePorts.shifted(offset)


BUSY_PORT_PATIENCE_SECONDS = 20.0


def busy_ports(chosen: ServicePorts) -> list[int]:
    busy = []
    for f in fields(ServicePorts):
        port = getattr(chosen, f.name)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


def stop_leftovers(pid_file: Path, say: Say) -> None:
    """SIGTERM (then SIGKILL) the services an earlier run recorded, if they still run."""
    try:
        recorded = json.loads(pid_file.read_text())
    except (OSError, ValueError):
        return
    for name, entry in recorded.items():
        pid, module = int(entry["pid"]), str(entry["module"])
        command = cmdline(pid) or []
        if not pid_alive(pid) or module not in command:
            continue  # gone, or the pid now belongs to something else
        say.line("dev", f"stopping {name} (pid {pid}), left running by an earlier run")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 25
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)


async def keep_database(dsn: str, database: str) -> str:
    """The run's own database, created the first time and kept afterwards."""
    try:
        return await create_database(dsn, database)
    except asyncpg.DuplicateDatabaseError:
        return with_database(dsn, database)


class Say:
    """One output stream: `name | line`, the name coloured on a terminal."""

    def __init__(self) -> None:
        self.colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        self.width = 22
        self._colours: dict[str, str] = {}

    def line(self, name: str, text: str) -> None:
        label = name.ljust(self.width)
        if self.colour:
            code = self._colours.setdefault(name, COLOURS[len(self._colours) % len(COLOURS)])
            label = f"\033[{code}m{label}\033[0m"
        print(f"{label}| {text}", flush=True)


def readable(line: str) -> str:
    """A service's JSON log record as `HH:MM:SS LEVEL logger: message key=value`."""
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict) or "msg" not in record:
        return line
    rest = " ".join(f"{k}={v}" for k, v in record.items()
                    if k not in ("ts", "level", "logger", "msg"))
    clock = str(record.get("ts", ""))[11:19]
    return (f"{clock} {record.get('level', '')!s:<7} {record.get('logger', '')}: "
            f"{record['msg']}{' ' + rest if rest else ''}")


def _read_from(path: Path, offset: int) -> bytes:
    if not path.exists():
        return b""
    with path.open("rb") as log:
        log.seek(offset)
        return log.read()


async def follow(name: str, path: Path, say: Say, stopping: asyncio.Event) -> None:
    """Print what the service appends to its log, from where the log ends now."""
    offset = len(await asyncio.to_thread(_read_from, path, 0))
    pending = b""
    while True:
        chunk = await asyncio.to_thread(_read_from, path, offset)
        if chunk:
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                say.line(name, readable(raw.decode(errors="replace")))
        if stopping.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), 0.2)


def write_instructions(lockgate: Lockgate, settings: Settings, stack_env: Mapping[str, str],
                       kubeconfigs: dict[str, str], token_file: Path,
                       traces_url: str | None = None) -> tuple[Path, Path]:
    """The one env file `make run` prints: the stack's variables (`stack_env`, its database
    this run's) and the CLI's and kubectl's; and an example pod."""
    directory = dev_dir(settings)
    env = directory / "env.sh"
    venv_bin = Path(sys.executable).parent
    env.write_text(
        "# Written by `make run` (python -m devstack.dev): source it in another terminal.\n"
        + "".join(f"export {name}={shlex.quote(value)}\n"
                  for name, value in stack_env.items() if not name.startswith(
                      "LOCKGATE_KUBECONFIG_"))
        + f"export KUBECONFIG={kubeconfigs[CLUSTER]}\n"
        + "".join(f"export LOCKGATE_KUBECONFIG_{c.upper().replace('-', '_')}={p}\n"
                  for c, p in kubeconfigs.items())
        + f"export LOCKGATE_API={lockgate.admin_url}\n"
        + (f"export LOCKGATE_TRACES_URL={traces_url}\n" if traces_url else "")
        +         f"export LOCKGATE_TOKEN_FILE={token_file}\n"
        f"export PATH={venv_bin}:{settings.bin_dir}:$PATH\n")
    pod = directory / "example-pod.yaml"
    pod.write_text(f"""# A pod for lockgate's queue {QUEUE}: created gated, released by the fair
# scheduler.
apiVersion: v1
kind: Pod
metadata:
  generateName: sleeper-
  namespace: {NAMESPACE}
  labels: {{{QUEUE_LABEL}: {QUEUE}}}
spec:
  restartPolicy: Never
  # The local stack's nodes are kwok's (tainted, simulated): nothing really runs.
  tolerations: [{{operator: Exists}}]
  containers:
    - name: main
      image: registry.invalid/sleeper:1
      resources: {{requests: {{cpu: 500m, memory: 256Mi}}}}
""")
    return env, pod


def next_steps(env: Path, pod: Path, lockgate: Lockgate,
               token_files: dict[str, Path], traces_url: str | None = None) -> list[str]:
    traces = ([f"Traces: Jaeger's query API {traces_url}. A pod's trace as a waterfall:",
               f"  lockgate trace {CLUSTER}/{NAMESPACE}/<pod>",
               f"  {lockgate.admin_url}/ui/#/pods/{CLUSTER}/{NAMESPACE}/<pod>   # the UI's pod "
               "page draws it too",
               f"  {traces_url}/api/traces/$(kubectl -n {NAMESPACE} get pod <pod> -o "
               "jsonpath='{.metadata.uid}' | tr -d -)   # the spans as JSON"]
              if traces_url else ["Traces are off (--no-traces)."])
    return [
        "lockgate is running. In another terminal:",
        f"  source {env}",
        f"  lockgate queue create {QUEUE} --namespace {CLUSTER}/{NAMESPACE}",
        f"  kubectl create namespace {NAMESPACE}",
        f"  kubectl label namespace {NAMESPACE} {MANAGED_NAMESPACE_LABEL}=true "
        f"lockgate.io/run={RUN_ID}",
        f"  kubectl create -f {pod}",
        f"  kubectl -n {NAMESPACE} get pods -w      # Running within a second: there is room",
        f"  lockgate jobs list --queue {QUEUE}",
        f"Admin API {lockgate.admin_url}; logs also in {lockgate.log_dir}.",
        f"Web UI {lockgate.admin_url}/ui/ : sign in with the token in {token_files['admin']} "
        f"(admin: sees and acts) or {token_files['read-only']} (read-only: sees).",
        *traces,
        "Ctrl-C stops lockgate's services (and the stack, if this command started it).",
    ]


async def run(args: argparse.Namespace) -> int:
    say = Say()
    # This process's own Kafka admin calls (isolating the run's consumer groups) would print
    # aiokafka's retries unformatted into the stream; the services log their own.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    settings = Settings.from_env()
    # The stack's summary names no env file of its own: the run's (below) has its variables.
    stack = Stack(settings, say=lambda text: say.line("devstack", text), announce_env=False)
    directory = dev_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    pid_file = directory / "pids.json"
    await asyncio.to_thread(stop_leftovers, pid_file, say)
    chosen = ports(int(os.environ.get("LOCKGATE_STACK_PORT_OFFSET") or 0))
    # A health port taken by someone else only moves (nobody types it; the next steps print
    # what matters). These fixed ports lie in the kernel's ephemeral range, where any client
    # connection, even a long-lived one (an apiserver's to its etcd), may hold one.
    health = {f.name: getattr(chosen, f.name) for f in fields(ServicePorts)
              if f.name != "admin_api"}
    taken = set(busy_ports(chosen))
    moved = {name: free_port() for name, port in health.items() if port in taken}
    if moved:
        say.line("dev", "health ports taken, using others: " + ", ".join(
            f"{name} {health[name]} -> {port}" for name, port in moved.items()))
        chosen = replace(chosen, **moved)
    # The admin API's port is the one people use: wait a moment for a passing connection.
    deadline = time.monotonic() + BUSY_PORT_PATIENCE_SECONDS
    busy = busy_ports(chosen)
    while busy and time.monotonic() < deadline:
        await asyncio.sleep(1)
        busy = busy_ports(chosen)
    if busy:
        say.line("dev", f"ports {', '.join(map(str, busy))} are taken: is another `make run` "
                        "(or a program of yours) using them? Stop it and run again.")
        return 1
    stack_was_up = not await asyncio.to_thread(stack.problems)
    info = await asyncio.to_thread(stack.up)
    started_stack = not stack_was_up
    dsn = await keep_database(info.postgres_dsn, os.environ.get(DATABASE_ENV) or DATABASE)
    jaeger: JaegerProcess | None = None
    # Filled in once Jaeger answers: the services read it when they start.
    extra_env: dict[str, str] = {}
    jaeger_ports = JaegerPorts.with_offset(int(os.environ.get("LOCKGATE_STACK_PORT_OFFSET") or 0))
    traces_url = None if args.no_traces else jaeger_ports.ui_url
    # A second installation beside this one (other ports, database and topic prefix) reads
    # nothing of this one's (docs/local-stack.md, "A second installation").
    lockgate = Lockgate.for_stack(info, postgres_dsn=dsn, run_id=RUN_ID, ports=chosen,
                                  log_dir=directory / "logs", standby_scheduler=False,
                                  extra_env=extra_env,
                                  topic_prefix=os.environ.get("LOCKGATE_TOPIC_PREFIX", ""))
    stopping, followers_done = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for stop_signal in STOP_SIGNALS:
        loop.add_signal_handler(stop_signal, stopping.set)
    followers = [asyncio.create_task(follow(name, lockgate.log_dir / f"{name}.log", say,
                                            followers_done))
                 for name, *_ in lockgate.definitions()]
    code = 0
    try:
        if not args.no_traces:
            binary = await asyncio.to_thread(ensure_binary, settings,
                                             lambda text: say.line("devstack", text))
            jaeger = JaegerProcess(binary, directory / "jaeger", jaeger_ports)
            await jaeger.start()
            assert jaeger.process is not None
            pid_file.write_text(json.dumps({"jaeger": {"pid": jaeger.process.pid,
                                                       "module": str(binary)}}))
            say.line("dev", f"Jaeger is up: query API {jaeger_ports.ui_url}")
            extra_env["LOCKGATE_OTLP_ENDPOINT"] = jaeger_ports.otlp_endpoint
            # The web UI's pod page draws the pod's trace from Jaeger's query API. No link to
            # Jaeger's own UI: this build from the Go module proxy serves only a placeholder.
            extra_env["LOCKGATE_QUEUE_STORE_UI__TRACES_URL"] = jaeger_ports.ui_url
        starting = asyncio.create_task(lockgate.start())
        waiting = asyncio.create_task(stopping.wait())
        await asyncio.wait({starting, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
        else:
            waiting.cancel()
            starting.result()  # a service that did not come up: its log tail is in the error
            recorded = {name: {"pid": p.pid, "module": p.module}
                        for name, p in lockgate.processes.items()}
            if jaeger is not None and jaeger.process is not None:
                recorded["jaeger"] = {"pid": jaeger.process.pid, "module": str(jaeger.binary)}
            pid_file.write_text(json.dumps(recorded))
            token_files = lockgate.write_token_files()
            env, pod = write_instructions(
                lockgate, settings, {**info.env(), "LOCKGATE_POSTGRES_DSN": dsn},
                info.kubeconfigs, token_files["admin"], traces_url)
            for text in next_steps(env, pod, lockgate, token_files, traces_url):
                say.line("dev", text)
            while not stopping.is_set():
                crashed = lockgate.crashed()
                if crashed:
                    say.line("dev", f"{', '.join(crashed)} exited: stopping everything")
                    code = 1
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), 0.5)
    except Exception as error:  # noqa: BLE001 - reported, then everything is stopped
        say.line("dev", f"error: {error}")
        code = 1
    finally:
        say.line("dev", "stopping lockgate's services")
        codes = await lockgate.stop()
        pid_file.unlink(missing_ok=True)
        followers_done.set()
        await asyncio.gather(*followers)
        say.line("dev", "stopped: " + ", ".join(f"{name} exit {c}" for name, c in codes.items()))
        if jaeger is not None:
            await jaeger.stop()  # after the services, so their last spans were received
        if started_stack and not args.keep_stack:
            say.line("dev", "stopping the stack this command started (--keep-stack keeps it)")
            await asyncio.to_thread(stack.down)
        elif started_stack:
            say.line("dev", "the stack stays up: `make stack-down` stops it")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.dev", description=__doc__)
    parser.add_argument("--keep-stack", action="store_true",
                        help="leave the local stack running on exit even if this started it")
    parser.add_argument("--no-traces", action="store_true",
                        help="start no Jaeger and send no traces")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
