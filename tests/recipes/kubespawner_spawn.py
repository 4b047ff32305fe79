"""One spawn of a user's notebook pod with JupyterHub's KubeSpawner, driven outside a hub the way
kubespawner's own tests drive it (tests/test_spawner.py: `KubeSpawner(hub=Hub(),
user=MockUser(...), config=..., _mock=True)`), and timed as JupyterHub's `User.spawn` times it:
`asyncio.wait_for(spawner.start(), timeout=start_timeout)`, then `spawner.stop()` when that
fails. Meanwhile it reads `spawner.progress()`, what the hub's spawn page shows. Run with the
recipes' clients python and KUBECONFIG set to the hub's kubeconfig (a non-admin identity).

    python kubespawner_spawn.py --namespace NS --user alice --queue Q --start-timeout 20 \
        [--cpu 2] [--node-selector k=v] [--toleration k=v]

Prints one JSON line: {"outcome": "started" | "timeout", "pod", "seconds", "progress": [...]}.
The JupyterHub objects stood in (Hub, the user) are the hub's own bookkeeping, not a part of
Kubernetes: the pod, its Events and its deletion are the real apiserver's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any
from unittest.mock import Mock

from jupyterhub.objects import Hub, Server
from kubespawner import KubeSpawner
from traitlets.config import Config


class MockUser(Mock):  # as kubespawner's tests/test_spawner.py
    name = "fake"
    server = Server()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        for key, value in kwargs.items():
            setattr(self, key, value)

    @property
    def escaped_name(self) -> str:
        return str(self.name)

    @property
    def url(self) -> str:
        return str(self.server.url)


def spawner_config(args: argparse.Namespace) -> Config:
    """docs/integrations/jupyterhub.md's settings (start_timeout short here, on purpose)."""
    c = Config()
    c.KubeSpawner.namespace = args.namespace
    c.KubeSpawner.start_timeout = args.start_timeout
    c.KubeSpawner.http_timeout = args.start_timeout
    c.KubeSpawner.extra_labels = {"lockgate.io/queue": args.queue}
    c.KubeSpawner.image = "quay.io/jupyter/base-notebook:latest"
    c.KubeSpawner.cpu_guarantee = float(args.cpu)
    c.KubeSpawner.mem_guarantee = "64M"
    c.KubeSpawner.node_selector = dict(pair.split("=", 1) for pair in args.node_selector)
    c.KubeSpawner.tolerations = [
        {"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}
        for key, value in (pair.split("=", 1) for pair in args.toleration)]
    c.KubeSpawner.delete_grace_period = 0
    return c


async def spawn(args: argparse.Namespace) -> dict[str, Any]:
    spawner = KubeSpawner(hub=Hub(), user=MockUser(name=args.user), config=spawner_config(args),
                          api_token="abc123", oauth_client_id="unused", _mock=True)
    progress: list[str] = []

    async def follow() -> None:
        async for event in spawner.progress():
            if event.get("raw_event"):
                progress.append(f"{event['raw_event']['reason']}: {event['message']}")

    started = time.monotonic()
    start = spawner.start()
    follower = asyncio.ensure_future(follow())
    try:
        await asyncio.wait_for(start, timeout=spawner.start_timeout)  # as User.spawn
        outcome = "started"
    except TimeoutError:
        outcome = "timeout"
        await spawner.stop()  # as User.spawn after a failed start: deletes the pod, waits
    seconds = time.monotonic() - started
    await asyncio.sleep(1.5)  # progress() looks once a second; let it read the last Events
    follower.cancel()
    return {"outcome": outcome, "pod": spawner.pod_name, "seconds": round(seconds, 1),
            "progress": progress}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--start-timeout", type=int, required=True)
    parser.add_argument("--cpu", default="1")
    parser.add_argument("--node-selector", action="append", default=[])
    parser.add_argument("--toleration", action="append", default=[])
    print(json.dumps(asyncio.run(spawn(parser.parse_args()))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
