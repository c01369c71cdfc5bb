"""Time saved versus plain decoding, measured within the run: a TokenSwift engine times a plain AR step at the
current context every so often (and at each plain step the adaptive policy takes), and counts the time saved
against the median of the latest timings. Mixed into engine.Engine, which holds the state these read (length,
metrics, policy) and its AR step (_ar_token)."""

from __future__ import annotations

import statistics
import time

# How often TokenSwift re-measures an AR step at the current context. The probe's output is thrown away, so it
# is pure cost (a plain step every 2 s was 2-3% of a CPU run), while the step time it tracks grows by a few
# percent per thousand tokens of context.
PROBE_INTERVAL_S = 8.0
# Time saved is counted against the median of the latest AR timings: on a shared CPU one slow step (another
# process had the core) would otherwise count as seconds saved for every iteration until the next probe,
# and the time-saved curve would jump up and drift back.
AR_SAMPLES = 5


class EngineProbe:
    def _maybe_probe_ar(self) -> None:
        """Measure one plain AR step at the current context, so time saved is against this very run.

        It writes the root's K/V at slot `length`, exactly what the verify pass writes there next."""
        now = time.perf_counter()
        if now - self._last_probe < PROBE_INTERVAL_S:
            return
        n = self.length
        self._sync()
        b0, t0 = self._built(), time.perf_counter()
        self._ar_token(n)
        self._tops.clear()  # the probe's token is thrown away, and so are its alternatives
        self._sync()
        dt = self._less_builds(time.perf_counter() - t0, b0)
        self._observe_ar(dt)
        if self.policy is not None:
            self.policy.observe_plain(dt)
        self._last_probe = time.perf_counter()

    def _observe_ar(self, seconds: float) -> None:
        self._ar_times.append(seconds)
        self.metrics.ar_latency_s = ar_estimate(self._ar_times)


def ar_estimate(samples) -> float:
    """The AR step time that time saved is counted against (AR_SAMPLES): robust to one slow outlier."""
    return statistics.median(samples)
