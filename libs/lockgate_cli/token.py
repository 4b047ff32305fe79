"""`lockgate token new NAME --role admin|read-only`: mint an admin API token, offline.

It prints the token (for its holder; it is not stored) and the line queue-store's tokens file
takes (a hash of it), so an operator adds a holder without the token passing through the API.
"""

from __future__ import annotations

import click

from lockgate_adapters.admin_tokens import Role, entry_for, new_token
from lockgate_cli.output import Output, View, output_option, render
from lockgate_cli.session import Session, runs


@click.group("token")
def group() -> None:
    """Admin API tokens."""


@group.command("new")
@click.argument("name")
@click.option("--role", type=click.Choice([r.value for r in Role]),
              default=Role.READ_ONLY.value, show_default=True)
@output_option
@runs
def new(session: Session, name: str, role: str, output: Output) -> None:
    """Mint a token for NAME (who holds it, shown in queue-store's log); prints it and its
    tokens-file line."""
    token = new_token()
    line = entry_for(name, Role(role), token).line()
    render(session.out, output, View(
        {"name": name, "role": role, "token": token, "tokens_file_line": line},
        table=lambda: (f"token (give it to {name}; it is not stored anywhere): {token}\n"
                       f"line for queue-store's tokens file: {line}"),
        names=lambda: [f"token/{name}"]))
