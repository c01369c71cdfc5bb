"""Long-polls (GET /api/generations/{id}?since=N&wait=S): a status read that waits for the worker's next commit
instead of the client asking again and again.

One thread, running only while some read waits, asks the store every `tick_s` whether anything was committed
(storage/changes.py: microseconds, no read transaction) and wakes the reads that were waiting on an older
version; they re-read the draft and answer, or wait again if the commit was not theirs (a heartbeat, another
draft). Twenty followers cost one cheap question per tick between them, not twenty, and nothing at all in the
event loop until there is something to send. Where the store has no such counter (PostgreSQL) the waiting
reads are woken every `fallback_s` and re-read.

Waits are asyncio futures on the event loop of the request that waits, woken thread-safely, so a read that
waits holds no server thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from dataclasses import dataclass

from storage.changes import Changes

MAX_WAIT_S = 10.0  # the longest ?wait= a status read may ask for: shorter than common proxy and client timeouts


@dataclass(eq=False)  # compared by identity: two waits on the same version are two waiters
class _Waiter:
    version: int | None  # the store's version the draft was read at (None: no counter, wake on fallback)
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class Commits:
    def __init__(self, changes: Changes, tick_s: float = 0.05, fallback_s: float = 0.5):
        self.changes, self.tick_s, self.fallback_s = changes, tick_s, fallback_s
        self._waiters: list[_Waiter] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    async def after(self, version: int | None, timeout_s: float) -> None:
        """Return once something was committed after `version` (a draft's `version`), or after `timeout_s`."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(version, loop, loop.create_future())
        with self._lock:
            self._waiters.append(waiter)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="status-long-poll", daemon=True)
                self._thread.start()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.future, timeout_s)
        finally:
            with self._lock:
                self._waiters.remove(waiter)

    def _watch(self) -> None:
        last_fallback = time.monotonic()
        while True:
            time.sleep(self.tick_s)
            try:
                version = self.changes.version()
            except sqlite3.Error:  # the file is unreadable: wake every read, whose own read reports it (503)
                version = None
            now = time.monotonic()
            fallback = now - last_fallback >= self.fallback_s
            last_fallback = now if fallback else last_fallback
            with self._lock:
                if not self._waiters:
                    self._thread = None  # the next wait starts a new one
                    return
                due = [w for w in self._waiters if (w.version is None and fallback) or
                       (w.version is not None and w.version != version)]
            for waiter in due:
                with contextlib.suppress(RuntimeError):  # its loop has closed: nobody is waiting any more
                    waiter.loop.call_soon_threadsafe(_wake, waiter.future)


def _wake(future: asyncio.Future) -> None:
    if not future.done():  # not timed out or cancelled meanwhile (this runs on the future's own loop)
        future.set_result(None)
