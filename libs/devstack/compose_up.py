"""`make compose-up` / `make compose-down`: the docker compose path, brought up for a person.

Why: docs/deploying.md's compose path had six manual steps (start an engine, build the images,
copy kubeconfigs into a folder, pick a token, compose up, and something to gate pods, which
compose alone never does: the webhook runs inside each worker cluster). This does all of them,
idempotently, and leaves it running; `down` removes all of it again:

- the Docker engine: the one at DOCKER_HOST or the system socket, else lockgate's own dockerd,
  started and kept running (and stopped by `down`, only if `up` started it);
- the images (devstack.images, cached), the kubeconfig folder (`<cluster>-<identity>` copies of
  the local stack's identities), an admin token of its own;
- `docker compose -f docker-compose.yml -f docker-compose.local.yml -p lockgate-compose up`;
- in each local cluster, the webhook image run as the cluster would run `k8s/webhook`
  (devstack.incluster) and registered with the static configuration, for namespaces labelled
  `lockgate.io/managed=true` and `lockgate.io/run=compose`: pods there are really gated.

State (ports, token, what was started) lives in `$LOCKGATE_STACK_DIR/compose/`; `env.sh` there
points the CLI at this deployment.

    python -m devstack.compose_up up | down | status
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from devstack.compose import ComposeProject
from devstack.config import Settings
from devstack.docker import DockerEngine, kept_engine
from devstack.images import Images
from devstack.incluster import InClusterWebhook, kubeconfig_token_and_ca
from devstack.launcher import RUN_LABEL
from devstack.manifests import delete_queue_copies, ensure_queue_crd
from devstack.ports import COMPOSE_PORTS, COMPOSE_WEBHOOK_PORTS
from devstack.stack import Stack, StackInfo
from lockgate.labels import MANAGED_NAMESPACE_LABEL
from lockgate_adapters.admin_tokens import Role, entry_for, new_token
from lockgate_adapters.kube import api_client
from lockgate_adapters.tls import write_atomically

PROJECT = "lockgate-compose"
RUN_ID = "compose"  # namespaces labelled lockgate.io/run=compose are this deployment's
QUEUE_SOURCE = "compose"
IDENTITIES = ("cluster-watcher", "ungater", "queue-sync")


def _say(text: str) -> None:
    print(f"[compose-up] {text}", flush=True)


@dataclass(frozen=True)
class Deployment:
    """What `up` made, as `down` needs it; kept in state.json."""

    directory: Path
    ports: Mapping[str, int]
    engine_host: str
    engine_pid: int | None  # set when `up` started the engine: `down` stops it
    clusters: tuple[str, ...]

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['ADMIN']}"

    @property
    def traces_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['JAEGER_QUERY']}"

    @property
    def token_file(self) -> Path:
        return self.directory / "admin-token"

    def save(self) -> None:
        (self.directory / "state.json").write_text(json.dumps({
            "ports": dict(self.ports), "engine_host": self.engine_host,
            "engine_pid": self.engine_pid, "clusters": list(self.clusters)}, indent=2))

    @classmethod
    def load(cls, directory: Path) -> Deployment | None:
        try:
            data = json.loads((directory / "state.json").read_text())
        except (OSError, ValueError):
            return None
        return cls(directory, data["ports"], data["engine_host"], data["engine_pid"],
                   tuple(data["clusters"]))


def state_dir(settings: Settings) -> Path:
    return settings.stack_dir / "compose"


def ports_with_offset(offset: int) -> dict[str, int]:
    return {name: port + offset for name, port in COMPOSE_PORTS.items()}


def kube_dir_for(info: StackInfo, directory: Path) -> Path:
    """<cluster>-<identity> kubeconfigs, as docker-compose.yml mounts them at /kube."""
    directory.mkdir(parents=True, exist_ok=True)
    for identity in IDENTITIES:
        for cluster, path in info.kubeconfigs_of(identity).items():
            target = directory / f"{cluster}-{identity}"
            shutil.copyfile(path, target)
            target.chmod(0o644)  # the services run as uid 10001 in their containers
    return directory


def compose_env(*, kube_dir: Path, images: Mapping[str, str], admin_token: str,
                ports: Mapping[str, int], project: str = PROJECT,
                queue_source: str = QUEUE_SOURCE) -> dict[str, str]:
    """The variables docker-compose.local.yml reads."""
    return {
        **{f"LOCKGATE_COMPOSE_{name}_PORT": str(port) for name, port in ports.items()},
        "KUBECONFIG_DIR": str(kube_dir),
        "LOCKGATE_COMPOSE_ADMIN_TOKENS": json.dumps(
            [entry_for(f"{project}-admin", Role.ADMIN, admin_token).line()]),
        "LOCKGATE_COMPOSE_QUEUE_SOURCE": queue_source,
        "LOCKGATE_COMPOSE_QUEUE_PREFIX": f"{queue_source}-",
        "LOCKGATE_IMAGE": images["lockgate"],
        "LOCKGATE_POSTGRES_IMAGE": images["postgres"],
        "LOCKGATE_KAFKA_IMAGE": images["kafka"],
        "LOCKGATE_JAEGER_IMAGE": images["jaeger"],
    }


def api_port_of(kubeconfig: str) -> int:
    server = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    return int(str(server).rsplit(":", 1)[1])


def webhook_for(*, engine: DockerEngine, info: StackInfo, cluster: str,
                api: client.ApiClient, image: str, work_dir: Path, ports: tuple[int, int],
                otlp_endpoint: str | None, run_id: str = RUN_ID, project: str = PROJECT,
                queue_source: str = QUEUE_SOURCE) -> InClusterWebhook:
    """One cluster's webhook container as the cluster would run k8s/webhook, for namespaces
    labelled lockgate.io/run=<run_id> (besides lockgate.io/managed=true)."""
    token, ca = kubeconfig_token_and_ca(info.kubeconfigs_of("webhook")[cluster])
    return InClusterWebhook(
        engine=engine, image=image, cluster=cluster, admin_api=api,
        api_port=api_port_of(info.kubeconfigs[cluster]), token=token, ca_pem=ca,
        run_id=run_id, namespace_labels={RUN_LABEL: run_id}, queue_source=queue_source,
        work_dir=work_dir, project_label=project, webhook_port=ports[0],
        health_port=ports[1], otlp_endpoint=otlp_endpoint)


def next_steps(deployment: Deployment, env_file: Path) -> list[str]:
    return [
        "lockgate runs under docker compose. In another terminal:",
        f"  source {env_file}",
        "  lockgate queue create team-c --namespace team-c",
        "  kubectl create namespace team-c",
        f"  kubectl label namespace team-c {MANAGED_NAMESPACE_LABEL}=true {RUN_LABEL}={RUN_ID}",
        "  kubectl -n team-c run sleeper --image=registry.invalid/sleeper:1 "
        "--labels=lockgate.io/queue=team-c --overrides="
        "'{\"spec\":{\"tolerations\":[{\"operator\":\"Exists\"}]}}'",
        "  kubectl -n team-c get pods -w      # SchedulingGated, then Running",
        f"Admin API {deployment.admin_url}; traces {deployment.traces_url} (Jaeger).",
        f"docker compose -p {PROJECT} ps / logs: see docs/deploying.md; "
        "`make compose-down` removes it all.",
    ]


async def up(settings: Settings, say: Callable[[str], None] = _say, *,
             offset: int = 0) -> Deployment:
    directory = state_dir(settings)
    directory.mkdir(parents=True, exist_ok=True)
    info = await asyncio.to_thread(Stack(settings, say=say).up)
    earlier = Deployment.load(directory)
    engine, started_pid = await asyncio.to_thread(kept_engine, settings, say)
    engine_pid = started_pid or (earlier.engine_pid if earlier else None)
    deployment = Deployment(directory, ports_with_offset(offset), engine.host, engine_pid,
                            tuple(info.kubeconfigs))
    deployment.save()  # from here on, `down` can undo whatever follows
    images = await asyncio.to_thread(Images(engine, say).all)
    if not deployment.token_file.exists():
        write_atomically(deployment.token_file, (new_token() + "\n").encode(), mode=0o600)
    admin_token = deployment.token_file.read_text().strip()
    env = compose_env(kube_dir=kube_dir_for(info, directory / "kube"), images=images,
                      admin_token=admin_token, ports=deployment.ports)
    compose = ComposeProject(engine, PROJECT, env, say)
    await asyncio.to_thread(compose.up, timeout=600)
    say("compose services healthy: " + ", ".join(sorted(compose.health())))
    for cluster in deployment.clusters:
        api = await api_client(info.kubeconfigs[cluster])
        try:
            await ensure_queue_crd(api)
            webhook = webhook_for(
                engine=engine, info=info, cluster=cluster, api=api, image=images["lockgate"],
                work_dir=directory / f"webhook-{cluster}",
                ports=_webhook_ports(cluster, offset),
                otlp_endpoint=f"http://127.0.0.1:{deployment.ports['OTLP']}")
            await _undo(webhook)  # an earlier `up`'s, so this one starts clean
            await webhook.start()
            await webhook.register()
            say(f"{cluster}: webhook container {webhook.container} registered as "
                f"{webhook.configuration_name}")
        finally:
            await api.close()
    env_file = directory / "env.sh"
    venv_bin = Path(sys.executable).parent
    env_file.write_text(
        "# Written by `make compose-up` (python -m devstack.compose_up): source it.\n"
        f"export KUBECONFIG={info.kubeconfigs['cluster-a']}\n"
        f"export LOCKGATE_API={deployment.admin_url}\n"
        f"export LOCKGATE_TOKEN_FILE={deployment.token_file}\n"
        f"export LOCKGATE_TRACES_URL={deployment.traces_url}\n"
        f"export PATH={venv_bin}:{settings.bin_dir}:$PATH\n")
    for line in next_steps(deployment, env_file):
        say(line)
    return deployment


def _webhook_ports(cluster: str, offset: int) -> tuple[int, int]:
    webhook, health = COMPOSE_WEBHOOK_PORTS.get(cluster, (58245, 58208))
    return webhook + offset, health + offset


async def _undo(webhook: InClusterWebhook) -> None:
    """Remove a webhook deployment by its names, whichever parts of it exist."""
    webhook.container = f"{webhook.project_label}-webhook-{webhook.cluster}"
    webhook.created[:] = ["registration", "nft", "namespace"]
    await webhook.stop()


async def down(settings: Settings, say: Callable[[str], None] = _say) -> bool:
    """Undo `up`; False if there was nothing to undo."""
    directory = state_dir(settings)
    deployment = Deployment.load(directory)
    if deployment is None:
        say(f"nothing to take down (no {directory / 'state.json'})")
        return False
    engine = DockerEngine(host=deployment.engine_host, settings=settings, say=say,
                          pid=deployment.engine_pid)
    stack = Stack(settings, say=say)
    problems = await asyncio.to_thread(stack.problems)
    if problems:
        say("the local stack is not up, so the webhook registrations and Queue objects in its "
            f"clusters stay until `make stack-up` and `make compose-down` again: {problems}")
    kubeconfigs = {} if problems else (await asyncio.to_thread(stack.info)).kubeconfigs
    for cluster in deployment.clusters if kubeconfigs else ():
        api = await api_client(kubeconfigs[cluster])
        try:
            webhook = InClusterWebhook(
                engine=engine, image="", cluster=cluster, admin_api=api, api_port=0, token="",
                ca_pem=b"", run_id=RUN_ID, namespace_labels={}, queue_source=QUEUE_SOURCE,
                work_dir=directory / f"webhook-{cluster}", project_label=PROJECT)
            await _undo(webhook)
            removed = await delete_queue_copies(api, source=QUEUE_SOURCE)
            say(f"{cluster}: webhook removed, {removed} Queue objects removed")
        finally:
            await api.close()
    for cluster in deployment.clusters:  # done above when the stack is up; harmless again
        engine.docker("rm", "-f", f"{PROJECT}-webhook-{cluster}", check=False)
    compose = ComposeProject(engine, PROJECT, {"KUBECONFIG_DIR": str(directory / "kube")}, say)
    await asyncio.to_thread(compose.down)
    left = compose.leftovers()
    if deployment.engine_pid is not None:
        say(f"stopping the dockerd `up` started (pid {deployment.engine_pid})")
        await asyncio.to_thread(engine.stop)
    if kubeconfigs:
        shutil.rmtree(directory, ignore_errors=True)
    else:  # the clusters' part is left for a later `down`
        Deployment(directory, deployment.ports, deployment.engine_host, None,
                   deployment.clusters).save()
    if left:
        say(f"compose down left {left}")
    say("compose deployment removed")
    return True


def status(settings: Settings) -> dict[str, Any]:
    deployment = Deployment.load(state_dir(settings))
    if deployment is None:
        return {"up": False}
    return {"up": True, "admin_api": deployment.admin_url, "traces": deployment.traces_url,
            "engine": deployment.engine_host, "engine_started_by_up": bool(deployment.engine_pid)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.compose_up", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("up", "down", "status"))
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    if args.action == "up":
        asyncio.run(up(settings, offset=settings.postgres_port - 55432))
    elif args.action == "down":
        asyncio.run(down(settings))
    else:
        print(json.dumps(status(settings), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
