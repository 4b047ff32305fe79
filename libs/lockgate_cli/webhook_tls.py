"""`lockgate webhook-tls --out DIR`: make (or keep) the in-cluster webhook's CA and serving
certificate files, for a self-managed Secret on clusters without cert-manager (see
docs/deploying.md and `lockgate_adapters.webhook_tls`, which makes them)."""

from __future__ import annotations

from pathlib import Path

import click

from lockgate_cli.session import Session, runs


@click.command("webhook-tls")
@click.option("--out", "directory", required=True, type=click.Path(path_type=Path),
              help="directory for ca.crt, tls.crt and tls.key (keep it out of git)")
@click.option("--namespace", default="lockgate-system", show_default=True)
@click.option("--service", default="lockgate-webhook", show_default=True)
@runs
def command(session: Session, directory: Path, namespace: str, service: str) -> None:
    """Make (or keep) the in-cluster webhook's CA and serving certificate files."""
    # Imported here: cryptography is slow to load, and only this command needs it.
    from lockgate_adapters.webhook_tls import ensure_webhook_tls, service_hosts

    hosts = service_hosts(service, namespace)
    made = ensure_webhook_tls(directory, hosts=hosts)
    print(f"{'wrote' if made else 'kept'} {directory}/ca.crt, tls.crt, tls.key "
          f"(serving {', '.join(hosts)})", file=session.out)
