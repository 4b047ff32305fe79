"""A real browser for the web UI's tests: Debian's chromium, driven by Playwright from PyPI.

`make test` installs both (chromium with apt, playwright with pip; never `playwright install`,
which downloads a browser and fails offline). A missing browser fails the test with what to do,
never skips it. Screenshots go to test-artifacts/web-ui/ at the repository's root (ignored by
git), one per page, so a person can look at what the test saw.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web-ui"
# Without these, chromium reaches for Google's hosts at start (refused here, and noisy).
# Playwright gives every launch a new empty profile and runs it headless.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def chromium_path() -> str:
    found = os.environ.get("LOCKGATE_CHROMIUM") or shutil.which("chromium")
    if not found:
        pytest.fail("no chromium: `make test` installs Debian's chromium (apt-get install "
                    "chromium); or set LOCKGATE_CHROMIUM to a Chromium binary", pytrace=False)
    return found


@asynccontextmanager
async def browser() -> AsyncIterator[Any]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.fail("playwright is not installed: `make venv` installs it (pip, the dev "
                    "extra)", pytrace=False)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium_path(),
                                                    args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


async def screenshot(page: Any, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path
