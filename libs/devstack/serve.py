"""One lockgate service at a time against the local stack, for the Tiltfile's `local` mode
(each service a `local_resource` that Tilt restarts when the code changes).

    python -m devstack.serve setup              once: database, consumer groups, Queue CRD
    python -m devstack.serve run <service>      exec the service with its environment
    python -m devstack.serve register           the webhook registration, once it is ready
    python -m devstack.serve unregister         remove it again

Why separate from `make run`: Tilt owns the processes here, so each is started (and restarted)
on its own; what `Lockgate.start` does around them is split into the other commands. Like
`make run` it uses a run id of its own (`tilt`: a webhook registration for namespaces labelled
lockgate.io/run=tilt, its own consumer groups and Queue objects), its own database
(lockgate_tilt), fixed ports (make run's + 20, plus LOCKGATE_STACK_PORT_OFFSET) and admin tokens
kept in the stack directory, so every process agrees on them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from devstack.config import Settings
from devstack.dev import keep_database
from devstack.launcher import Lockgate
from devstack.ports import TILT_PORT_SHIFT, ServicePorts
from devstack.stack import stack_info
from lockgate_adapters.admin_tokens import new_token
from lockgate_adapters.postgres import with_database
from lockgate_adapters.tls import write_atomically

RUN_ID = "tilt"
DATABASE = "lockgate_tilt"


def tilt_dir(settings: Settings) -> Path:
    return settings.stack_dir / "tilt"


def ports() -> ServicePorts:
    offset = int(os.environ.get("LOCKGATE_STACK_PORT_OFFSET") or 0) + TILT_PORT_SHIFT
    return ServicePorts.shifted(offset)


def _token(path: Path) -> str:
    if not path.exists():
        write_atomically(path, (new_token() + "\n").encode(), mode=0o600)
    return path.read_text().strip()


def lockgate(postgres_dsn: str | None = None) -> Lockgate:
    settings = Settings.from_env()
    info = stack_info(settings)
    directory = tilt_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    dsn = postgres_dsn or with_database(info.postgres_dsn, DATABASE)
    return Lockgate.for_stack(
        info, postgres_dsn=dsn, run_id=RUN_ID, ports=ports(), log_dir=directory,
        standby_scheduler=False, admin_token=_token(directory / "admin-token"),
        read_only_token=_token(directory / "read-only-token"))


async def setup() -> None:
    info = stack_info()
    dsn = await keep_database(info.postgres_dsn, DATABASE)
    run = lockgate(dsn)
    # What Lockgate.start does before the first service: consumer groups of the run's own,
    # the services' roles and schema rights in the database, the Queue CRD.
    await run.start(only=[])
    print(f"ready: database {DATABASE}, run id {RUN_ID}; admin API {run.admin_url} "
          f"(token file {tilt_dir(Settings.from_env()) / 'admin-token'})")


def exec_service(name: str) -> None:
    run = lockgate()
    for service, module, env, _health in run.definitions():
        if service == name:
            full = {**os.environ, **run._common_env(), **env}
            if module == "admission_webhook":
                full.pop("LOCKGATE_POSTGRES_DSN", None)
            # Replaced by the service: Tilt then stops and restarts the service itself.
            os.execvpe(sys.executable, [sys.executable, "-m", module], full)  # noqa: S606
    known = ", ".join(d[0] for d in run.definitions())
    raise SystemExit(f"no service {name!r}; known: {known}")


async def register() -> None:
    run = lockgate()
    await run.register_webhook()
    print(f"registered {run.webhook_configuration_name} in {', '.join(run.registered_in)}")


async def unregister() -> None:
    run = lockgate()
    run.registered_in = list(run.kubeconfigs)
    await run.unregister_webhook()
    print(f"removed {run.webhook_configuration_name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.serve", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup")
    running = commands.add_parser("run")
    running.add_argument("service")
    commands.add_parser("register")
    commands.add_parser("unregister")
    args = parser.parse_args(argv)
    if args.command == "run":
        exec_service(args.service)
    elif args.command == "setup":
        asyncio.run(setup())
    elif args.command == "register":
        asyncio.run(register())
    else:
        asyncio.run(unregister())
    return 0


if __name__ == "__main__":
    sys.exit(main())
