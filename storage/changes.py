"""Has anything been committed to the store since I last looked? For caches in front of the store.

SQLite's `PRAGMA data_version`, asked on a connection of our own that never writes, moves whenever any other
connection (of any process) commits. Asking costs microseconds and no read transaction, so a reader that
polls many times a second re-reads the store only after a commit. Other databases have no such counter:
`version()` answers None and the caller reads every time.
"""

from __future__ import annotations

import sqlite3
import threading

from storage.health import sqlite_file
from storage.repo import Store


class Changes:
    def __init__(self, store: Store):
        path = sqlite_file(store)
        self._db = sqlite3.connect(path, check_same_thread=False) if path is not None else None
        self._lock = threading.Lock()

    def version(self) -> int | None:
        if self._db is None:
            return None
        with self._lock:
            return self._db.execute("PRAGMA data_version").fetchone()[0]
