"""Bearer tokens of the admin API: roles, how tokens are stored, how a presented one is checked.

Why hashes: queue-store's configuration (a Kubernetes Secret, an env file) then holds no usable
credential; only whoever was handed a token can present it. Tokens are long random strings
(`new_token`, 256 bits), so a plain SHA-256 is enough — a slow password hash protects guessable
secrets, and these are not guessable. A presented token is hashed and compared with every
configured hash by `hmac.compare_digest`, so the answer's timing says nothing about how close a
guess came.

A token line (in the tokens file, or in the settings' list) is `<name> <role> sha256:<hex>`;
the name is who holds the token, for the log. Roles: `read-only` may read queues and jobs,
`admin` may also create, change and delete queues.

Stdlib only: the `lockgate` CLI imports this to mint tokens and must start fast.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

HASH_PREFIX = "sha256:"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,62}$")
_HEX = re.compile(r"^[0-9a-f]{64}$")


class Role(enum.Enum):
    READ_ONLY = "read-only"
    ADMIN = "admin"

    @property
    def may_write(self) -> bool:
        return self is Role.ADMIN


class TokenConfigError(ValueError):
    """A token line that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class TokenEntry:
    name: str
    role: Role
    digest: bytes  # SHA-256 of the token

    def line(self) -> str:
        return f"{self.name} {self.role.value} {HASH_PREFIX}{self.digest.hex()}"


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe), prefixed so it is recognisable in a leak scan."""
    return "lgt_" + secrets.token_urlsafe(32)


def entry_for(name: str, role: Role, token: str) -> TokenEntry:
    return TokenEntry(name=name, role=role, digest=hash_token(token))


def parse_lines(lines: Iterable[str], *, source: str) -> list[TokenEntry]:
    """Token entries from `<name> <role> sha256:<hex>` lines; blank lines and # comments skip."""
    entries: list[TokenEntry] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {number}"
        parts = line.split()
        if len(parts) != 3:
            raise TokenConfigError(f"{where}: expected '<name> <role> sha256:<hex>', "
                                   f"got {len(parts)} fields")
        name, role_text, hashed = parts
        if not _NAME.match(name):
            raise TokenConfigError(f"{where}: invalid token name {name!r}")
        try:
            role = Role(role_text)
        except ValueError:
            raise TokenConfigError(f"{where}: unknown role {role_text!r}; roles are "
                                   f"{[r.value for r in Role]}") from None
        if not hashed.startswith(HASH_PREFIX) or not _HEX.match(hashed[len(HASH_PREFIX):]):
            raise TokenConfigError(f"{where}: the token must be given as sha256:<64 hex digits> "
                                   "(its hash, never the token itself; `lockgate token new` "
                                   "prints both)")
        entries.append(TokenEntry(name, role, bytes.fromhex(hashed[len(HASH_PREFIX):])))
    names = [e.name for e in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TokenConfigError(f"{source}: token names used twice: {duplicates}")
    return entries


class TokenVerifier:
    """Who holds a presented token, if anyone; every configured hash is compared, always."""

    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self.entries = tuple(entries)

    def identify(self, token: str) -> TokenEntry | None:
        digest = hash_token(token)
        found = None
        for entry in self.entries:
            # No early exit: the time taken does not depend on which entry matched.
            if hmac.compare_digest(entry.digest, digest):
                found = entry
        return found
