"""devstack.clients: one venv per requirements file of tests/recipes/, each cached by its own
hash; requirements.txt's keeps the path it always had (so nothing rebuilds)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from devstack import clients


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCKGATE_CACHE_DIR", str(tmp_path))
    return tmp_path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def test_every_requirements_file_is_a_venv_the_first_being_the_clients() -> None:
    assert clients.names()[0] == "clients"
    assert "airflow" in clients.names()
    assert clients.requirements() == clients.RECIPES_DIR / "requirements.txt"
    assert clients.requirements("airflow") == clients.RECIPES_DIR / "requirements-airflow.txt"


def test_the_clients_venv_keeps_its_path_and_the_others_have_their_own(cache: Path) -> None:
    assert clients.clients_dir() == (
        cache / "clients" / f"venv-{digest(clients.RECIPES_DIR / 'requirements.txt')}")
    assert clients.clients_dir(name="airflow") == cache / "clients" / (
        f"airflow-venv-{digest(clients.RECIPES_DIR / 'requirements-airflow.txt')}")


def test_an_unknown_venv_is_refused_with_the_known_ones() -> None:
    with pytest.raises(FileNotFoundError, match="there are: clients, airflow"):
        clients.requirements("nope")
