"""Admin API tokens: the lines queue-store is configured with, and checking a presented token."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from lockgate_adapters.admin_tokens import (
    Role,
    TokenConfigError,
    TokenVerifier,
    entry_for,
    new_token,
    parse_lines,
)
from queue_store.settings import QueueStoreSettings


def test_a_configured_line_identifies_its_token_and_only_it() -> None:
    admin, reader = new_token(), new_token()
    lines = ["# tokens", "", entry_for("ops", Role.ADMIN, admin).line(),
             entry_for("dash", Role.READ_ONLY, reader).line() + "  # the dashboard"]
    verifier = TokenVerifier(parse_lines(lines, source="test"))
    ops, dash = verifier.identify(admin), verifier.identify(reader)
    assert ops is not None and (ops.name, ops.role) == ("ops", Role.ADMIN)
    assert dash is not None and (dash.name, dash.role, dash.role.may_write) == (
        "dash", Role.READ_ONLY, False)
    assert verifier.identify(admin[:-1]) is None
    assert verifier.identify("") is None
    assert admin not in "".join(lines)  # only hashes are configured


@pytest.mark.parametrize(("line", "message"), [
    ("ops admin", "expected '<name> <role> sha256:<hex>', got 2 fields"),
    ("ops root sha256:" + "0" * 64, "unknown role 'root'"),
    ("ops admin lgt_plaintexttoken", "its hash, never the token itself"),
    ("ops admin sha256:abc", "sha256:<64 hex digits>"),
    ("o/ps admin sha256:" + "0" * 64, "invalid token name 'o/ps'"),
])
def test_a_bad_token_line_is_refused_with_its_reason(line: str, message: str) -> None:
    with pytest.raises(TokenConfigError, match="tokens line 1: ") as raised:
        parse_lines([line], source="tokens")
    assert message in str(raised.value)


def test_queue_store_refuses_to_start_without_tokens_or_with_a_bad_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="the admin API needs at least one token"):
        QueueStoreSettings()
    monkeypatch.setenv("LOCKGATE_QUEUE_STORE_ADMIN_TOKENS_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValidationError, match="cannot read the admin tokens file"):
        QueueStoreSettings()
    good = entry_for("ops", Role.ADMIN, new_token()).line()
    (tmp_path / "tokens").write_text(f"{good}\n{good}\n")
    monkeypatch.setenv("LOCKGATE_QUEUE_STORE_ADMIN_TOKENS_FILE", str(tmp_path / "tokens"))
    with pytest.raises(ValidationError, match="token names used twice"):
        QueueStoreSettings()
    (tmp_path / "tokens").write_text(good + "\n")
    reader = entry_for("dash", Role.READ_ONLY, new_token()).line()
    monkeypatch.setenv("LOCKGATE_QUEUE_STORE_ADMIN_TOKENS", f'["{reader}"]')
    assert [e.name for e in QueueStoreSettings().admin_token_entries()] == ["dash", "ops"]
