"""Can the store take writes now? /api/health says "store unwritable" while a full disk or a read-only file
lasts, so a worker's failing writes do not hide behind a "ready" model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from storage.errors import StoreError
from storage.repo import Store

MIN_FREE_BYTES = 1 * 2**20  # below this, a flush of a few hundred tokens (with its WAL frames) may not fit


def store_problem(store: Store) -> str | None:
    """None if the store can be written, else why not: the file system holding a SQLite file (read-only,
    full), or this process's last failed write, until a probe write succeeds again."""
    path = sqlite_file(store)
    if path is not None:
        folder = path.parent
        if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            return f"{path} is read-only"
        free = shutil.disk_usage(folder).free
        if free < MIN_FREE_BYTES:
            return f"the disk holding {path} is full ({free:,} bytes free)"
    if store.fault is None:
        return None
    try:
        store.probe_write()
    except StoreError:
        return store.fault
    return None


def sqlite_file(store: Store) -> Path | None:
    url = store.engine.url
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database).expanduser().resolve()
