"""The one engine factory: open_store(url) -> Store, with SQLite tuned for one writer and many readers, and
PostgreSQL (postgresql+psycopg://) for workers on several machines sharing one store.

PRAGMAs, set on every connection (order matters: switching to WAL can itself meet a busy database):
- busy_timeout 10 s: the UI, the API and the worker share the file; a writer waits instead of failing.
- journal_mode=WAL: readers (UI polls) never block the worker's appends, and it persists in the file.
- synchronous=NORMAL: in WAL mode a commit is durable against a crash of *any process* (the WAL is in the
  OS page cache and replays on the next open); only a power loss or OS crash can drop the last commits.
  FULL would fsync on every 1 s flush for a guarantee that needs a dying machine to matter.
- foreign_keys=ON: off by default in SQLite, and deleting a book must delete its generations.
- wal_autocheckpoint=256 pages (1 MiB) and journal_size_limit=4 MiB: the WAL is copied into the database
  file every MiB and cut back after a checkpoint, so it cannot grow without bound (the worker also
  checkpoints when a job stops, Store.checkpoint).

pysqlite's own transaction handling is switched off: a deferred BEGIN that later writes can fail with
SQLITE_BUSY without waiting (a read snapshot cannot be upgraded), so writers start with BEGIN IMMEDIATE
(see `_begin`), which takes the write lock up front and honours busy_timeout. Transactional DDL also
comes with it, so two processes migrating at once serialise instead of racing.

PostgreSQL, per connection (`_POSTGRES`): a server that is down or unreachable is an error within 10 s, not a
hang; TCP keepalives (idle) and a TCP user timeout (unacknowledged data) notice a vanished server or network
within about half a minute; a lock wait gives up
after 10 s like SQLite's busy_timeout; a session left idle inside a transaction (a frozen worker holding a row
lock) is ended by the server after a minute. pool_pre_ping replaces connections that a server restart broke.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from storage.errors import StoreError
from storage.home import data_home
from storage.migrate import upgrade
from storage.repo import Store

BUSY_TIMEOUT_MS = 10_000
WAL_AUTOCHECKPOINT_PAGES = 256
JOURNAL_SIZE_LIMIT = 4 * 2**20
WRITE_OPTION = "tokenswift_write"  # execution option read by _begin: BEGIN IMMEDIATE


def default_url() -> str:
    """A SQLite file in the app data dir (storage/home.py): $TOKENSWIFT_HOME or ~/.local/share/tokenswift-studio."""
    return f"sqlite:///{data_home() / 'studio.db'}"


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


_POSTGRES = {
    "connect_timeout": 10,
    "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
    "options": f"-c lock_timeout={BUSY_TIMEOUT_MS} -c idle_in_transaction_session_timeout=60000",
    "application_name": "tokenswift-studio",
}


def make_engine(url: str, *, wal: bool = True) -> Engine:
    parsed = make_url(url)
    if parsed.drivername == "postgresql":  # a plain postgresql:// URL: the driver we ship, not psycopg2
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "postgresql":
        return create_engine(parsed, pool_pre_ping=True, connect_args=_POSTGRES)
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
            _switch_to_wal(cursor)
            cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
            cursor.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return on_connect


def _switch_to_wal(cursor) -> None:
    """PRAGMA journal_mode=WAL, waiting for a busy database as busy_timeout would. On a new file, processes opening
    it at once (the app, its worker, a second worker) each read it and then need it alone to switch it: SQLite sees
    that deadlock and answers one of them "database is locked" at once instead of calling its busy handler (3 processes
    at once: 93 failures in 300 tries). Once one has switched, the file stays in WAL and the others' switch is a
    no-op. (A try that SQLite itself makes wait adds up to its busy_timeout to this one's.)"""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY  # SQLITE_BUSY_RECOVERY and the like too
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _begin(connection) -> None:
    write = connection.get_execution_options().get(WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
