"""A throwaway PostgreSQL server for the tests: Debian's binaries, `initdb` into a temp dir, `pg_ctl start` on
a free localhost port (loopback only, trust auth), run as `nobody` when the tests run as root (initdb refuses
root). Each test gets a fresh database, a copy of one migrated template (CREATE DATABASE ... TEMPLATE)."""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import weakref
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

ROLE = "tokenswift"
TEMPLATE = "tokenswift_template"


def find_bin_dir() -> Path | None:
    """Where initdb and pg_ctl live: on PATH, else Debian's /usr/lib/postgresql/<version>/bin (newest)."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, bin_dir: Path):
        self.bin_dir, self.port = bin_dir, free_port()
        self.user = pwd.getpwnam("nobody") if os.getuid() == 0 else None
        # As root, under /tmp: nobody must be able to reach the folder (root's $TMPDIR may be private).
        self.root = Path(tempfile.mkdtemp(prefix="tokenswift-pg-", dir="/tmp" if self.user else None))
        self.data = self.root / "data"
        self._names = itertools.count()
        if self.user:  # the server's files must be its own; mkdtemp made the folder 0700 for root
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        # pg_ctl detaches the server from this process: should destroy() never run (a run stopped twice, an error
        # in a teardown), the server is stopped and its folder removed when this process exits.
        self._leftover = weakref.finalize(self, _remove, self.bin_dir, self.data, self.root, self.user)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{ROLE}@127.0.0.1:{self.port}/{database}"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin_dir / tool), *args]
        kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid} if self.user else {}
        done = subprocess.run(command, cwd=self.root, capture_output=True, text=True, timeout=120, **kwargs)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n{self.log()}")

    def log(self) -> str:
        log = self.root / "server.log"
        return log.read_text(errors="replace")[-4000:] if log.exists() else ""

    def init(self) -> Cluster:
        self._run("initdb", "-D", str(self.data), "-U", ROLE, "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()
        return self

    def start(self) -> None:
        # Loopback only; the socket sits in the data dir; fsync off: a test cluster needs no power-loss safety
        # (a killed server still replays its WAL, which the OS already holds).
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data} -c fsync=off"
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-o", options)

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-t", "60", "-D", str(self.data), "-m", mode)

    def restart(self, mode: str = "immediate") -> None:
        """immediate: like a crash, recovery from the WAL on start."""
        self.stop(mode)
        self.start()

    def migrate_template(self) -> None:
        from storage import open_store

        self.execute(f"CREATE DATABASE {TEMPLATE}")
        open_store(self.url(TEMPLATE)).close()  # no connection may stay open on a template

    def new_database(self, migrated: bool = True) -> str:
        name = f"t{next(self._names)}"
        self.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {TEMPLATE}" if migrated else ""))
        return self.url(name)

    def drop_database(self, url: str) -> None:
        self.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")

    def execute(self, sql: str) -> None:
        engine = create_engine(self.url(), isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            with engine.connect() as connection:
                connection.execute(text(sql))
        finally:
            engine.dispose()

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        finally:
            self._leftover.detach()
            shutil.rmtree(self.root, ignore_errors=True)


def _remove(bin_dir: Path, data: Path, root: Path, user) -> None:
    kwargs = {"user": user.pw_uid, "group": user.pw_gid} if user else {}
    if (data / "postmaster.pid").exists():
        subprocess.run([str(bin_dir / "pg_ctl"), "stop", "-w", "-t", "30", "-D", str(data), "-m", "immediate"],
                       cwd=root, capture_output=True, timeout=60, **kwargs)
    shutil.rmtree(root, ignore_errors=True)
