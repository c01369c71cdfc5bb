"""Time saved versus plain decoding, measured within the run: a TokenSwift engine times a plain AR step at the
current context every so often (and at each plain step the adaptive policy takes), and counts the time saved
against the median of the latest timings. The engine runs the probe's step (Engine._maybe_probe_ar); its StepClock
says when one is due and what the plain steps took.

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
# Until this many timings EARLY_PROBE_S apart exist, the probe comes every EARLY_PROBE_S and time saved waits for their
# median (RunMetrics.add_step prices the steps in between then): a run's first probe alone, taken while a browser page
# loaded, stood for every step until the next one 8 s later, and a 300-token draft read "1.70x plain decoding, 6 s
# saved" where plain steps ran three times as fast as that probe and nothing was saved. Apart, because one busy moment
# slows steps taken back to back alike (the adaptive policy's plain steps). A few probes more cost a few plain steps.
SETTLED = 3
EARLY_PROBE_S = 0.25
# A gap this long between two steps leaves the next one cold (a step takes milliseconds, the worker's writes
# between steps well under this).
COLD_GAP_S = 0.25


@dataclass
class StepClock:
    """When the engine's steps ended, when its plain step was last timed and what its plain steps took."""
    last_probe: float = 0.0
    step_end: float = -math.inf  # -inf: no step yet, the first one is cold
    ar_times: deque[float] = field(default_factory=lambda: deque(maxlen=AR_SAMPLES))
    spread: int = 0  # timings so far at least EARLY_PROBE_S after the last one counted (SETTLED)
    last_spread: float = -math.inf

    def warm(self) -> bool:
        """Whether a step starting now follows the last one without a pause (its time is representative)."""
        return time.perf_counter() - self.step_end < COLD_GAP_S

    def ended(self) -> None:
        self.step_end = time.perf_counter()

    def probe_due(self, warm: bool) -> bool:
        """Whether to time a plain step at the current context before a warm step (PROBE_INTERVAL_S; EARLY_PROBE_S until
        settled)."""
        now = time.perf_counter()
        interval = PROBE_INTERVAL_S if self.settled() else EARLY_PROBE_S
        return warm and now - self.last_probe >= interval

    def settled(self) -> bool:
        return self.spread >= SETTLED

    def plain_step(self, seconds: float) -> float | None:
        """A warm plain step took `seconds` (a probe, or the adaptive policy's plain gear): returns the AR step time
        that time saved is counted against from now on, None until settled."""
        now = time.perf_counter()
        self.ar_times.append(seconds)
        self.last_probe = now
        if now - self.last_spread >= EARLY_PROBE_S:
            self.spread, self.last_spread = self.spread + 1, now
        return ar_estimate(self.ar_times) if self.settled() else None


def ar_estimate(samples) -> float:
    """The AR step time that time saved is counted against (AR_SAMPLES): robust to one slow outlier."""
    return statistics.median(samples)
