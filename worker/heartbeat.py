"""A thread that keeps the worker's row and its current job's lease fresh, also during a long prefill
(the main thread may sit in one forward pass for minutes on a 100K-token resume)."""

from __future__ import annotations

import logging
import threading

from storage import Store, StoreError
from storage.records import Owner

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, store: Store, owner: Owner, interval_s: float):
        self.store, self.owner, self.interval_s = store, owner, interval_s
        self.job_id: int | None = None  # set by the worker loop while it runs a job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.store.heartbeat(self.owner, self.job_id)
            except StoreError as error:  # a full disk must not kill the thread; the job notices on flush
                log.warning("heartbeat failed: %s", error)
