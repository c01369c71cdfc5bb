"""The one engine factory: open_store(url) -> Store, with SQLite tuned for one writer and many readers.

PRAGMAs, set on every connection (order matters: switching to WAL can itself meet a busy database):
- busy_timeout 10 s: the UI, the API and the worker share the file; a writer waits instead of failing.
- journal_mode=WAL: readers (UI polls) never block the worker's appends, and it persists in the file.
- synchronous=NORMAL: in WAL mode a commit is durable against a crash of *any process* (the WAL is in the
  OS page cache and replays on the next open); only a power loss or OS crash can drop the last commits.
  FULL would fsync on every 1 s flush for a guarantee that needs a dying machine to matter.
- foreign_keys=ON: off by default in SQLite, and deleting a book must delete its generations.

pysqlite's own transaction handling is switched off: a deferred BEGIN that later writes can fail with
SQLITE_BUSY without waiting (a read snapshot cannot be upgraded), so writers start with BEGIN IMMEDIATE
(see `_begin`), which takes the write lock up front and honours busy_timeout. Transactional DDL also
comes with it, so two processes migrating at once serialise instead of racing.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from storage.errors import StoreError
from storage.migrate import upgrade
from storage.repo import Store

BUSY_TIMEOUT_MS = 10_000
WRITE_OPTION = "tokenswift_write"  # execution option read by _begin: BEGIN IMMEDIATE


def default_url() -> str:
    """A SQLite file in the app data dir: $TOKENSWIFT_HOME or ~/.local/share/tokenswift-studio."""
    home = os.environ.get("TOKENSWIFT_HOME") or Path.home() / ".local" / "share" / "tokenswift-studio"
    return f"sqlite:///{Path(home) / 'studio.db'}"


def open_store(url: str | None = None, *, wal: bool = True) -> Store:
    """Open (creating if needed) and migrate the store. `wal=False` for network file systems, where
    WAL's shared memory does not work."""
    engine = make_engine(url or default_url(), wal=wal)
    writer = engine.execution_options(**{WRITE_OPTION: True})
    try:
        upgrade(writer)
    except OperationalError as exc:
        engine.dispose()
        raise StoreError(f"cannot open the store at {engine.url!r}: {exc.orig}") from exc
    return Store(engine, writer)


def make_engine(url: str, *, wal: bool = True) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed)
    event.listen(engine, "connect", _sqlite_connect(wal))
    event.listen(engine, "begin", _begin)
    return engine


def _sqlite_connect(wal: bool):
    def on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (module docstring)
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        if wal:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return on_connect


def _begin(connection) -> None:
    write = connection.get_execution_options().get(WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
