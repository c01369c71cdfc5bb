"""Time saved is counted against a robust AR step time: on a shared CPU one slow step (another process had
the core) must not count as seconds saved for every iteration until the next probe."""

from __future__ import annotations

from collections import deque

from tokenswift.decode.engine import AR_SAMPLES, ar_estimate
from tokenswift.decode.metrics import RunMetrics


def test_one_slow_ar_timing_does_not_inflate_time_saved():
    times = deque([0.010, 0.011, 0.010, 0.012], maxlen=AR_SAMPLES)
    times.append(0.500)  # one plain step that waited for the CPU
    steady, spiked = RunMetrics("tokenswift"), RunMetrics("tokenswift")
    steady.ar_latency_s, spiked.ar_latency_s = ar_estimate(times), 0.500
    for metrics in (steady, spiked):
        for _ in range(10):  # ten iterations of 3 tokens in 0.03 s each: exactly break-even at 0.010 s a token
            metrics.add_step(3, 2, 0, False, 0.01, 0.015, 0.005)
    assert abs(steady.time_saved_s) < 0.05  # about what it is: nothing saved
    assert spiked.time_saved_s > 14  # what one raw outlier used to add, and then drift back from
