"""PostgreSQL from Debian's packages, run from a data directory of the stack.

PostgreSQL refuses to run as root, so when devstack runs as root the server (and initdb) run as a
non-root OS user (`lockgate` by default, created if missing). If that user cannot reach the stack
dir (for example under /root, mode 0700), the data directory lives under /var/lib/lockgate and
`<stack>/postgres/data` is a symlink to it.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import IO

from devstack.config import HOST, PG_DATABASE, PG_PASSWORD, PG_USER, Settings
from devstack.errors import StackError
from devstack.procs import Component, tail

_EXTERNAL_ROOT = Path("/var/lib/lockgate")


def find_bin_dir() -> Path | None:
    for name in ("pg_ctl", "initdb"):
        found = shutil.which(name)
        if found:
            real = Path(found).resolve().parent
            if (real / "postgres").exists() and (real / "initdb").exists():
                return real
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/postgres"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return candidates[-1].parent if candidates else None


class Postgres:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.dir = settings.stack_dir / "postgres"
        self.link = self.dir / "data"

    @property
    def as_root(self) -> bool:
        return os.geteuid() == 0

    # -- install --
    def ensure_installed(self, say: Callable[[str], None]) -> Path:
        found = find_bin_dir()
        if found is not None:
            return found
        if not self.as_root or shutil.which("apt-get") is None:
            raise StackError(
                "PostgreSQL is missing (no initdb/pg_ctl found). Install Debian's `postgresql` "
                "package (apt-get install -y postgresql) or put PostgreSQL's bin dir on PATH."
            )
        log = self.s.cache_logs_dir / "apt-postgresql.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        say(f"installing PostgreSQL with apt-get (log {log})")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        with open(log, "ab") as logf:
            cmd = ["apt-get", "install", "-y", "--no-install-recommends", "postgresql"]
            rc = subprocess.call(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
            if rc != 0:
                say("apt-get install failed; running apt-get update and trying again")
                subprocess.call(["apt-get", "update"], stdout=logf, stderr=subprocess.STDOUT)
                rc = subprocess.call(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        found = find_bin_dir()
        if rc != 0 or found is None:
            raise StackError(f"installing PostgreSQL failed; log {log}:\n{tail(log)}")
        return found

    # -- OS user and data directory --
    def _user(self) -> pwd.struct_passwd | None:
        if not self.as_root:
            return None
        name = self.s.pg_os_user
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        rc = subprocess.call(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ]
        )
        if rc != 0:
            raise StackError(
                f"could not create OS user {name!r} to run PostgreSQL (useradd exit {rc}); "
                "create a non-root user and set LOCKGATE_STACK_PG_OS_USER to its name"
            )
        return pwd.getpwnam(name)

    def _run_as(
        self, user: pwd.struct_passwd | None, argv: list[str], stdout: IO[bytes] | None = None
    ) -> int:
        if user is None:
            return subprocess.call(argv, cwd="/", stdout=stdout, stderr=subprocess.STDOUT)
        return subprocess.call(
            argv,
            cwd="/",
            stdout=stdout,
            stderr=subprocess.STDOUT,
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
        )

    def _user_can_enter(self, user: pwd.struct_passwd, path: Path) -> bool:
        return self._run_as(user, ["test", "-x", str(path)]) == 0

    def data_dir(self) -> Path:
        """The real data directory (following the symlink, if any)."""
        if self.link.is_symlink():
            return Path(os.readlink(self.link))
        return self.link

    def prepare(self, say: Callable[[str], None]) -> None:
        bin_dir = self.ensure_installed(say)
        user = self._user()
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.link.exists() and not self.link.is_symlink():
            if user is not None and not self._user_can_enter(user, self.dir):
                key = hashlib.sha256(str(self.s.stack_dir.resolve()).encode()).hexdigest()[:12]
                real = _EXTERNAL_ROOT / f"postgres-{key}"
                _EXTERNAL_ROOT.mkdir(parents=True, exist_ok=True)
                _EXTERNAL_ROOT.chmod(0o755)
                say(
                    f"OS user {user.pw_name} cannot enter {self.dir}; PostgreSQL data goes to "
                    f"{real} (symlinked from {self.link})"
                )
                real.mkdir(mode=0o700, exist_ok=True)
                self.link.symlink_to(real)
            else:
                self.link.mkdir(mode=0o700)
        data = self.data_dir()
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        if user is not None:
            os.chown(data, user.pw_uid, user.pw_gid)
        if not (data / "PG_VERSION").exists():
            self._initdb(bin_dir, data, user, say)
        conf = (
            f"listen_addresses = '{HOST}'\n"
            f"port = {self.s.postgres_port}\n"
            "unix_socket_directories = ''\n"
            "max_connections = 300\n"
            "shared_buffers = 256MB\n"
            "logging_collector = off\n"
            "log_destination = 'stderr'\n"
            "log_line_prefix = '%m [%p] '\n"
            "log_min_messages = warning\n"
            "log_checkpoints = off\n"
            "fsync = on\n"
        )
        conf_path = data / "lockgate.conf"
        if not conf_path.exists() or conf_path.read_text() != conf:
            conf_path.write_text(conf)
            conf_path.chmod(0o644)

    def _initdb(
        self, bin_dir: Path, data: Path, user: pwd.struct_passwd | None, say: Callable[[str], None]
    ) -> None:
        say(f"initdb {data}")
        # The OS user can enter data.parent (checked in prepare): the password file goes there.
        pwfile = data.parent / f".pw-{os.getpid()}"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(PG_PASSWORD + "\n")
        if user is not None:
            os.chown(pwfile, user.pw_uid, user.pw_gid)
        log = self.s.logs_dir / "postgres-initdb.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(log, "wb") as logf:
                rc = self._run_as(
                    user,
                    [
                        str(bin_dir / "initdb"),
                        "-D",
                        str(data),
                        f"--username={PG_USER}",
                        f"--pwfile={pwfile}",
                        "--auth=scram-sha-256",
                        "--encoding=UTF8",
                        "--no-locale",
                        "--no-instructions",
                    ],
                    stdout=logf,
                )
        finally:
            pwfile.unlink(missing_ok=True)
        if rc != 0:
            raise StackError(f"initdb failed (exit {rc}); log {log}:\n{tail(log)}")
        with open(data / "postgresql.conf", "a") as f:
            f.write("\n# lockgate devstack settings\ninclude_if_exists = 'lockgate.conf'\n")

    # -- run --
    def component(self) -> Component:
        bin_dir = find_bin_dir() or Path("/usr/lib/postgresql/15/bin")
        return Component(
            name="postgres",
            argv=[str(bin_dir / "postgres"), "-D", str(self.data_dir())],
            cwd=Path("/"),
            ports=[self.s.postgres_port],
            endpoint=f"{HOST}:{self.s.postgres_port}",
            health=lambda: self.query_ok("postgres"),
            user=self.s.pg_os_user,
            # SIGINT is PostgreSQL's "fast" shutdown (SIGTERM waits for every client to leave).
            stop_signal=signal.SIGINT,
            stop_timeout=30.0,
        )

    def _psql(self, database: str, sql: str) -> subprocess.CompletedProcess[str]:
        bin_dir = find_bin_dir()
        psql = str(bin_dir / "psql") if bin_dir else (shutil.which("psql") or "psql")
        env = dict(os.environ, PGPASSWORD=PG_PASSWORD, PGCONNECT_TIMEOUT="3")
        return subprocess.run(
            [
                psql,
                "-X",
                "-q",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                HOST,
                "-p",
                str(self.s.postgres_port),
                "-U",
                PG_USER,
                "-d",
                database,
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=15,
            check=False,
        )

    def query_ok(self, database: str) -> str | None:
        try:
            res = self._psql(database, "select 1")
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{type(exc).__name__}: {exc}"
        if res.returncode == 0 and res.stdout.strip() == "1":
            return None
        return (res.stderr.strip() or res.stdout.strip() or f"psql exit {res.returncode}")[:200]

    def bootstrap(self) -> None:
        """Creates the `lockgate` database if missing."""
        query = f"select 1 from pg_database where datname = '{PG_DATABASE}'"  # noqa: S608
        res = self._psql("postgres", query)
        if res.returncode != 0:
            raise StackError(f"PostgreSQL: cannot query pg_database: {res.stderr.strip()}")
        if res.stdout.strip() != "1":
            res = self._psql("postgres", f'create database "{PG_DATABASE}"')
            if res.returncode != 0:
                raise StackError(f"PostgreSQL: create database failed: {res.stderr.strip()}")

    def purge(self) -> None:
        if self.link.is_symlink():
            real = Path(os.readlink(self.link))
            if real.is_relative_to(_EXTERNAL_ROOT):
                shutil.rmtree(real, ignore_errors=True)
