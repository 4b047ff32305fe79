"""Run lockgate services as real OS processes in tests, so they can be killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

LOG_DIR = Path(os.environ.get("LOCKGATE_TEST_LOG_DIR", "/tmp/lockgate-test-logs"))


class ServiceProcess:
    """One `python -m <module>` service with its env; logs to LOG_DIR/<name>.log."""

    def __init__(self, name: str, module: str, env: Mapping[str, str]) -> None:
        self.name, self.module = name, module
        self.env = {**os.environ, **env}
        self.process: asyncio.subprocess.Process | None = None
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = LOG_DIR / f"{name}.log"

    async def start(self) -> None:
        log = self.log_path.open("ab")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", self.module, env=self.env, stdout=log, stderr=log,
            start_new_session=True,
        )
        log.close()

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def kill(self) -> None:
        """SIGKILL: no shutdown hooks run, as in a crash."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()

    async def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait for a graceful exit; SIGKILL after `timeout`."""
        if not self.alive():
            return self.process.returncode if self.process else None
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            await self.kill()
            return self.process.returncode

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
