"""Time saved versus plain decoding, measured within the run: a TokenSwift engine times a plain AR step at the
current context every so often (and at each plain step the adaptive policy takes), and counts the time saved
against the median of the latest timings. Mixed into engine.Engine, which holds the state these read (length,
metrics, policy, clock) and its AR step (_ar_token).

Only warm steps are timed. A step that follows a pause (another engine's turn in `bench`, a Compare run's other
side, the worker's writes, a resume) runs with the caches and TLB the other work left: at a 7K context its plain
step took 30% longer than the steps around it. The probe landed there by construction (its interval elapsed
during the pause), so the policy's plain-step time ran high, it drafted where plain steps were faster, and
TokenSwift ran 4-5% slower than plain decoding (`bench`, 7K, q4).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

# How often TokenSwift re-measures an AR step at the current context. The probe's output is thrown away, so it
# is pure cost (a plain step every 2 s was 2-3% of a CPU run), while the step time it tracks grows by a few
# percent per thousand tokens of context.
PROBE_INTERVAL_S = 8.0
# Time saved is counted against the median of the latest AR timings: on a shared CPU one slow step (another
# process had the core) would otherwise count as seconds saved for every iteration until the next probe,
# and the time-saved curve would jump up and drift back.
AR_SAMPLES = 5
# A gap this long between two steps leaves the next one cold (a step takes milliseconds, the worker's writes
# between steps well under this).
COLD_GAP_S = 0.25


@dataclass
class StepClock:
    """When the engine's steps ended and what its plain steps took."""
    last_probe: float = 0.0
    step_end: float = -math.inf  # -inf: no step yet, the first one is cold
    ar_times: deque[float] = field(default_factory=lambda: deque(maxlen=AR_SAMPLES))

    def warm(self) -> bool:
        """Whether a step starting now follows the last one without a pause (its time is representative)."""
        return time.perf_counter() - self.step_end < COLD_GAP_S

    def ended(self) -> None:
        self.step_end = time.perf_counter()


class EngineProbe:
    def _maybe_probe_ar(self, warm: bool) -> None:
        """Measure one plain AR step at the current context, so time saved is against this very run; only on a
        warm step (StepClock).

        It writes the root's K/V at slot `length`, exactly what the verify pass writes there next."""
        now = time.perf_counter()
        if not warm or now - self.clock.last_probe < PROBE_INTERVAL_S:
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
        self.clock.last_probe = time.perf_counter()

    def _observe_ar(self, seconds: float) -> None:
        self.clock.ar_times.append(seconds)
        self.metrics.ar_latency_s = ar_estimate(self.clock.ar_times)


def ar_estimate(samples) -> float:
    """The AR step time that time saved is counted against (AR_SAMPLES): robust to one slow outlier."""
    return statistics.median(samples)
