"""bench/profile_release.py's summary of py-spy's collapsed stacks: which package a frame's file
belongs to, and self and inclusive shares."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def profile_release() -> ModuleType:
    spec = importlib.util.spec_from_file_location("profile_release",
                                                  ROOT / "bench" / "profile_release.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_frames_are_named_by_the_package_their_file_belongs_to() -> None:
    package_of = profile_release().package_of
    assert package_of("/w/.venv/lib/python3.11/site-packages/pydantic/main.py") == "pydantic"
    assert package_of("/w/.venv/lib/python3.11/site-packages/orjson.py") == "orjson"
    assert package_of("/w/libs/lockgate/fairness.py") == "lockgate"
    assert package_of("/w/services/queue_store/main.py") == "queue_store"
    assert package_of("/usr/lib/python3.11/asyncio/events.py") == "stdlib:asyncio"
    assert package_of("/usr/lib/python3.11/json/decoder.py") == "stdlib:json"
    # As py-spy mostly writes them: relative to their sys.path entry.
    assert package_of("pydantic/_internal/_repr.py") == "pydantic"
    assert package_of("selectors.py") == "selectors"
    assert package_of("<frozen runpy>") == "<frozen runpy>"


def test_self_shares_count_the_innermost_frame_and_inclusive_ones_every_package_once(
        tmp_path: Path) -> None:
    venv = "/w/.venv/lib/python3.11/site-packages"
    raw = tmp_path / "raw.txt"
    raw.write_text(
        f"run (/w/services/ungater/main.py:1);patch ({venv}/kubernetes_asyncio/api.py:9);"
        f"loads (/usr/lib/python3.11/json/decoder.py:3) 3\n"
        f"run (/w/services/ungater/main.py:1);patch ({venv}/kubernetes_asyncio/api.py:9) 1\n"
        f"run (/w/services/ungater/main.py:1);decide (/w/libs/lockgate/x.py:2);"
        f"decide (/w/libs/lockgate/x.py:5) 4\n"
        "not a stack line\n")
    summary = profile_release().summarise(raw)
    assert summary["samples"] == 8
    assert summary["self_by_package"] == {"lockgate": 0.5, "stdlib:json": 0.375,
                                          "kubernetes_asyncio": 0.125}
    # lockgate appears twice on one stack, counted once; the service's own frame on all.
    assert summary["inclusive_by_package"] == {"ungater": 1.0, "lockgate": 0.5,
                                               "kubernetes_asyncio": 0.5, "stdlib:json": 0.375}
    assert summary["self_by_function"]["lockgate:decide"] == 0.5
