"""Keeps the app's worker process alive: one that died (killed, out of memory, or ended after a sticky CUDA error,
which leaves its device unusable) is replaced by a fresh process, which requeues the dead one's job and resumes
it from the saved tokens (the same text: decoding is deterministic in seed and position). After a lost device
the new ones run without the fast path; one that exited cleanly (stopped) is not replaced."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess

from worker.loop import DEVICE_LOST_EXIT

log = logging.getLogger(__name__)
STEADY_S = 60.0  # a worker that lived this long died of something new: restart at once
MAX_BACKOFF_S = 60.0  # a worker that dies at start (a model that cannot load) is retried at most this seldom


class Supervisor:
    def __init__(self, start: Callable[[bool], BaseProcess], poll_s: float = 1.0):
        """start(fast): spawns one worker process and returns it (started); fast=False: without the CUDA fast path."""
        self.start, self.poll_s = start, poll_s
        self.restarts = 0
        self.fast = True  # off for good once a worker lost its device: the fast path may be what breaks it
        self.process = start(self.fast)
        self._started = time.monotonic()
        self._backoff = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="worker-supervisor", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.process.is_alive():
                continue
            if self.process.exitcode == 0:  # it was asked to stop (Ctrl+C reaches it too): the app is stopping
                log.info("the worker (pid %s) stopped", self.process.pid)
                return
            if self.process.exitcode == DEVICE_LOST_EXIT and self.fast:
                # Else a worker that passes the small self-test but breaks its device mid-job restarts forever.
                log.error("the worker's device became unusable: the next worker runs without the fast path "
                          "(as with --no-fast)")
                self.fast = False
            lived = time.monotonic() - self._started
            self._backoff = 0.0 if lived >= STEADY_S else min(MAX_BACKOFF_S, max(1.0, 2 * self._backoff))
            log.error("the worker (pid %s) exited with code %s after %.0f s; starting a new one in %.0f s",
                      self.process.pid, self.process.exitcode, lived, self._backoff)
            if self._stop.wait(self._backoff):  # also when stop() came first and the backoff is 0
                return
            self.process = self.start(self.fast)
            self._started = time.monotonic()
            self.restarts += 1

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM: the worker saves, hands its job back to the queue and exits; killed if it does not."""
        self._stop.set()
        self._thread.join()
        self.process.terminate()
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
