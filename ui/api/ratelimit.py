"""Status reads per client address: a token bucket each, checked in the front door (ui/api/guard.py) before the
request reaches the API, so a read over the limit costs a dictionary lookup and a short 429, never a store read.

A status read is GET (or HEAD) /api/generations/{id}: what clients poll while a draft is written. Other routes
(creating, controlling, exporting a draft, the page) are not limited here: they are not polled.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

STATUS_READ = re.compile(r"/api/generations/[^/]+/?")


def is_status_read(scope) -> bool:
    return scope["method"] in ("GET", "HEAD") and STATUS_READ.fullmatch(scope["path"]) is not None


class Buckets:
    """A token bucket per client: `burst` tokens at most, refilled at `rate_per_s`; each read takes one."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = 10_000):
        self.rate_per_s, self.burst, self.clock, self.max_clients = rate_per_s, burst, clock, max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, when counted)
        self._lock = threading.Lock()  # TestClient and several event loops may call at once

    def take(self, client: str) -> float:
        """Take a token for `client`: 0.0 when it had one, else the seconds until it will (nothing taken)."""
        if self.rate_per_s <= 0:
            return 0.0  # no limit
        now = self.clock()
        with self._lock:
            tokens, then = self._buckets.pop(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - then) * self.rate_per_s)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate_per_s
            self._buckets[client] = (tokens - 1 if wait == 0 else tokens, now)
            # The least recently seen client is dropped first: it has refilled longest, so forgetting it
            # (a full bucket again) gives it at most one burst it would nearly have had anyway.
            while len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        return wait


def retry_after(wait_s: float) -> int:
    """Retry-After is whole seconds: round up, so a client that honours it finds a token waiting."""
    return max(1, math.ceil(wait_s))
