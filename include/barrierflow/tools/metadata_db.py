"""The embedded Airflow metadata database of ``make run``: a PostgreSQL server on loopback.

Airflow's components, task processes and CLI write the metadata database at once; SQLite answers ``database is locked``, so
``make run`` runs Debian's PostgreSQL (``initdb`` into ``<AIRFLOW_HOME>/postgres`` once) on 127.0.0.1 as a child that stops with
it. Started by root, the server runs as user ``postgres``, which owns its data directory and may traverse the directories above
it. Connections are trusted: safe only as it listens on loopback and its socket directory is private."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from barrierflow.core.errors import ConfigurationError
from barrierflow.execution.process_group import stop_group

__all__ = ["EmbeddedPostgres", "DATABASE", "ROLE"]

DATABASE = "airflow"
ROLE = "airflow"
_HOST = "127.0.0.1"


def _bin_dir() -> Path:
    """Where Debian's PostgreSQL server programs are (the newest installed major version)."""
    root = Path("/usr/lib/postgresql")
    versions = sorted((p for p in root.glob("*/bin") if (p / "postgres").exists()), key=lambda p: int(p.parent.name))
    if versions:
        return versions[-1]
    found = shutil.which("postgres")
    if found:
        return Path(found).resolve().parent
    raise ConfigurationError(
        "PostgreSQL's server programs are not installed (Debian package postgresql); 'make setup' installs them"
    )


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL server for one Airflow home: data in ``data_dir``, listening on 127.0.0.1:``port``."""

    data_dir: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The SQLAlchemy URL Airflow uses."""
        return f"postgresql+psycopg2://{ROLE}@{_HOST}:{self.port}/{DATABASE}"

    @property
    def _socket_dir(self) -> Path:
        beside = self.data_dir / "socket"
        if len(f"{beside}/.s.PGSQL.{self.port}") <= 100:
            return beside
        # A Unix socket path is limited to 107 bytes: a deep data directory gets a short private one.
        digest = hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"barrierflow-pg-{digest}"

    def _run_as(self) -> Callable[[], None] | None:
        """Drop root to the ``postgres`` user in the child (PostgreSQL refuses root)."""
        if os.geteuid() != 0:
            return None
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            raise ConfigurationError("running as root needs the 'postgres' system user (Debian package postgresql)") from None

        def demote() -> None:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)

        return demote

    def _own(self, path: Path) -> None:
        """Started by root: ``path`` belongs to ``postgres``, which must also be able to reach it."""
        if os.geteuid() != 0:
            return
        user = pwd.getpwnam("postgres")
        for p in (path, *path.rglob("*")):
            os.lchown(p, user.pw_uid, user.pw_gid)
        for parent in self.data_dir.resolve().parents:
            # Traverse only (no listing): e.g. pytest's private temporary directories.
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                os.chmod(parent, mode | stat.S_IXOTH)

    def init(self) -> None:
        """``initdb`` with a trusted loopback role ``airflow`` (once)."""
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._own(self.data_dir)
        options = ["-U", ROLE, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-instructions"]
        initdb = [str(_bin_dir() / "initdb"), "-D", str(self.data_dir), *options]
        subprocess.run(initdb, check=True, capture_output=True, preexec_fn=self._run_as(), cwd="/")

    def start(self, log: IO[bytes] | int | None = None, wait_s: float = 60.0) -> "EmbeddedPostgres":
        """Start the server (initializing it first) and create the database; returns once it takes connections."""
        self.init()
        self._socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._own(self._socket_dir)
        bin_dir = _bin_dir()
        command = [str(bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port), "-k", str(self._socket_dir)]
        for setting in (f"listen_addresses={_HOST}", "max_connections=200", "fsync=on"):
            command += ["-c", setting]
        self.proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=self._run_as(),
            start_new_session=True,
            cwd="/",
        )
        # createdb until the server takes connections (it listens a moment before it does).
        createdb = bin_dir / "createdb"
        cmd = [str(createdb if createdb.exists() else "createdb"), "-h", _HOST, "-p", str(self.port), "-U", ROLE, DATABASE]
        deadline = time.monotonic() + wait_s
        while True:
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode == 0 or "already exists" in result.stderr:
                return self
            if self.proc.poll() is not None:
                raise ConfigurationError(f"PostgreSQL exited with code {self.proc.returncode} (data directory {self.data_dir})")
            if time.monotonic() > deadline:
                self.stop()
                raise ConfigurationError(f"cannot create database {DATABASE} on {_HOST}:{self.port}: {result.stderr.strip()}")
            time.sleep(0.2)

    def stop(self, grace_s: float = 20.0) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit)."""
        if self.proc is not None:
            stop_group(self.proc, signal.SIGINT, grace_s)
