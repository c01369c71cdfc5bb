"""Time saved is counted against a robust AR step time: on a shared CPU one slow step (another process had
the core) must not count as seconds saved for every iteration until the next probe.

The engine runs for real (stories260k, float64) on a fake clock, so every timing is a count of clock reads and
the runs compare exactly, whatever the machine's speed."""

from __future__ import annotations

import time

import pytest

import tokenswift.decode.clock as engine_clock
import tokenswift.decode.engine as engine_module
from tokenswift.decode.adaptive import CandidatePolicy
from tokenswift.decode.generate import Generator
from tokenswift.decode.metrics import RunMetrics
from tokenswift.decode.options import EngineOptions
from tokenswift.settings import Settings

SETTINGS = Settings(seed=3, max_new_tokens=80, temperature=1.0, min_p=0.1)
SLOW_S = 0.5  # what a probe costs while another process has the core


class Clock:
    """time.perf_counter: a millisecond passes at each read, and `stall` seconds more when asked. It starts where a
    process's clock would (far from 0: the first probe is due at the first warm step)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now

    def stall(self) -> None:
        self.now += SLOW_S


def run_with_probes(stories64, monkeypatch, slow, every_step: bool = True) -> tuple[list[int], float, float]:
    """A TokenSwift run that probes AR at every iteration (every_step; else at the engine's own intervals); the probes
    whose number `slow` accepts stall the clock. Returns the ids, the time saved and the final AR step time."""
    clock, probes = Clock(), []
    monkeypatch.setattr(time, "perf_counter", clock)
    if every_step:
        monkeypatch.setattr(engine_clock, "PROBE_INTERVAL_S", 0.0)
        monkeypatch.setattr(engine_clock, "EARLY_PROBE_S", 0.0)
    ar_token = engine_module.Engine._ar_token

    def probe(engine, n):
        probes.append(n)
        if slow(len(probes)):
            clock.stall()
        return ar_token(engine, n)

    monkeypatch.setattr(engine_module.Engine, "_ar_token", probe)
    gen = Generator(stories64, SETTINGS, stories64.encode("Once upon a time"))
    ids = gen.run()
    assert len(probes) > (8 if every_step else 0)  # one an iteration, or the early ones
    metrics = gen.metrics()
    return ids, metrics.time_saved_s, metrics.ar_latency_s


def test_one_slow_ar_probe_does_not_inflate_time_saved(stories64, monkeypatch):
    steady = run_with_probes(stories64, monkeypatch, lambda probe: False)
    spiked = run_with_probes(stories64, monkeypatch, lambda probe: probe == 4)
    slow = run_with_probes(stories64, monkeypatch, lambda probe: True)
    assert steady[0] == spiked[0] == slow[0]  # timings change speed only, never text
    # The outlier is not counted as seconds saved (a raw last probe would add about SLOW_S a token)...
    assert spiked[1] == pytest.approx(steady[1], abs=1e-6)
    # ... while an AR step that stays slow is what time saved is counted against.
    assert slow[2] == pytest.approx(steady[2] + SLOW_S)
    assert slow[1] > steady[1] + SLOW_S * (SETTINGS.max_new_tokens // 2)


def test_a_slow_first_probe_does_not_price_the_run(stories64, monkeypatch):
    """At the engine's own intervals the first probe stood alone for 8 s: taken while the machine was busy, it priced
    every step of a short draft at its time (a 300-token draft read 1.70x and 6 s saved where nothing was). Time
    saved now waits for clock.SETTLED probes, taken EARLY_PROBE_S apart, and prices the steps before at their
    median. (The fake clock's run lasts about half a second: its early probes come 20 ms apart.)"""
    monkeypatch.setattr(engine_clock, "EARLY_PROBE_S", 0.02)
    steady = run_with_probes(stories64, monkeypatch, lambda probe: False, every_step=False)
    spiked = run_with_probes(stories64, monkeypatch, lambda probe: probe == 1, every_step=False)
    assert steady[0] == spiked[0] and steady[2] > 0
    assert spiked[1] == pytest.approx(steady[1], abs=1e-6) and spiked[2] == pytest.approx(steady[2])


def test_the_clock_settles_on_timings_apart_and_the_steps_before_are_priced_then(monkeypatch):
    """Plain steps back to back (the adaptive policy's plain gear) share one busy moment: they count as one timing
    towards clock.SETTLED. Iterations before the estimate settles are priced at it, not dropped."""
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    step_clock = engine_clock.StepClock()
    assert [step_clock.plain_step(0.05) for _ in range(5)] == [None] * 5  # within milliseconds: one timing
    for seconds in (0.01, 0.01):
        clock.now += engine_clock.EARLY_PROBE_S
        estimate = step_clock.plain_step(seconds)
    assert step_clock.settled() and estimate == pytest.approx(0.05)  # the median of the last five timings

    metrics = RunMetrics("tokenswift")
    metrics.add_step(3, 2, 0, False, 0.01, 0.02, 0.0)  # unpriced: no estimate yet
    assert metrics.time_saved_s == 0.0 and "unpriced_tokens" not in metrics.to_dict()
    metrics.ar_latency_s = 0.02
    metrics.add_step(2, 1, 0, False, 0.01, 0.02, 0.0)
    assert metrics.time_saved_s == pytest.approx((3 + 2) * 0.02 - 0.06)


def test_a_step_after_a_pause_is_not_timed(stories64, monkeypatch):
    """Another engine's turn (bench's alternation, a Compare run's other side) leaves the next step cold: at a 7K
    context it ran 30% slower than the steps around it, and a probe taken there made the adaptive policy draft
    where plain steps were faster. Neither the probe nor the policy learns from such a step; the next warm one
    times again."""
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(engine_clock, "PROBE_INTERVAL_S", 0.0)  # a probe at every warm step
    monkeypatch.setattr(engine_clock, "EARLY_PROBE_S", 0.0)
    timings = []  # what the policy was told: ("plain", s) or ("shape", s or None)
    observe, observe_plain = CandidatePolicy.observe, CandidatePolicy.observe_plain
    monkeypatch.setattr(CandidatePolicy, "observe",
                        lambda p, levels, paths, accepted, s, *rest: (timings.append(("shape", s)),
                                                                      observe(p, levels, paths, accepted, s, *rest)))
    monkeypatch.setattr(CandidatePolicy, "observe_plain",
                        lambda p, s: (timings.append(("plain", s)), observe_plain(p, s)))
    gen = Generator(stories64, SETTINGS, stories64.encode("Once upon a time"), options=EngineOptions(adaptive=True))
    events = gen.steps()
    for _ in range(6):
        next(events)
    before = len(timings)
    clock.now += 1.0  # the pause
    next(events)
    assert timings[before:] in ([("shape", None)], [])  # a cold iteration's tokens count, not its time; no probe
    after = len(timings)
    next(events)
    assert timings[after:] and all(s is not None for _, s in timings[after:])  # warm: the probe and the step
