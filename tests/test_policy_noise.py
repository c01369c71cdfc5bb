"""The adaptive policy (decode/adaptive.py) on a machine whose speed moves: simulated iterations, no model.

Each step costs what a shape costs on this CPU at a 2K context, times the machine's speed at that moment: slow
phases (another tenant's load, x1.45, lasting half a second on average) and +-3% jitter, as this 2-core EPYC showed.
The engine's probe times a plain step every 8 s. Plain decoding over the same trace is the reference: where drafting
does not pay, the policy must not lose more than its exploring share; where it pays, it must find it.
"""

from __future__ import annotations

import bisect
import random

from tokenswift.decode.adaptive import CandidatePolicy, ladder

PLAIN_MS = 8.6
PROBE_S = 8.0  # decode/clock.PROBE_INTERVAL_S


class Speed:
    """The machine's slowdown at wall time t: phases of x`slow` and x1, exponentially long, and jitter."""

    def __init__(self, seed: int, slow: float = 1.45, mean_phase_s: float = 0.5, horizon_s: float = 400.0):
        phases, self.jitter = random.Random(seed), random.Random(seed + 1)
        self.starts, self.factors, t, slowed = [], [], 0.0, False
        while t < horizon_s:
            self.starts.append(t)
            self.factors.append(slow if slowed else 1.0)
            t += phases.expovariate(1 / mean_phase_s)
            slowed = not slowed

    def __call__(self, t: float) -> float:
        return self.factors[bisect.bisect_right(self.starts, t) - 1] * self.jitter.uniform(0.97, 1.03)


def simulate(costs_ms: dict[str, float], accept: tuple[float, ...], seed: int, tokens: int = 12000,
             policy: bool = True) -> float:
    """Tokens per second of the policy (or of plain steps alone) over the speed trace of `seed`. costs_ms: each
    shape's iteration; accept: the chance that the guess at each depth is taken, given the ones before it."""
    speed, draws = Speed(seed), random.Random(seed + 2)
    chooser = CandidatePolicy(ladder((1, 1, 1), 20))
    t, done, last_plain = 0.0, 0, -PROBE_S
    while done < tokens:
        if policy and t - last_plain >= PROBE_S:  # the engine's probe: timed, its token thrown away
            seconds = PLAIN_MS * speed(t) / 1e3
            chooser.observe_plain(seconds)
            t, last_plain = t + seconds, t + seconds
        shape = chooser.choose() if policy else None
        if shape is None:
            seconds = PLAIN_MS * speed(t) / 1e3
            if policy:
                chooser.observe_plain(seconds)
                last_plain = t
            t, done = t + seconds, done + 1
            continue
        taken = 0
        while taken < len(shape.widths) and draws.random() < accept[taken]:
            taken += 1
        seconds = costs_ms[shape.label()] * speed(t) / 1e3
        chooser.observe([[1], [2], [3]], [], [1, 2, 3][:taken], seconds)
        t, done = t + seconds, done + 1 + taken
    return done / t


# The ladder's shapes at 2K on this CPU (ms an iteration, the draft included): the 2-row pass costs 1.43 plain
# steps, and the draft layer's first guess is taken 40% of the time, so drafting is ~2% slower than plain steps.
COSTS_2K = {"1/k0": 12.3, "1-1/k0": 16.5, "1-1-1/k0": 20.5, "1-1-1/k2": 32.0, "1-1-1/k5": 50.0, "1-1-1/k10": 85.0,
            "1-1-1/k20": 150.0}


def test_where_drafting_does_not_pay_the_policy_keeps_within_its_exploring_share_of_plain_decoding():
    for seed in (0, 1):
        plain = simulate(COSTS_2K, (0.40, 0.55, 0.55), seed, policy=False)
        assert simulate(COSTS_2K, (0.40, 0.55, 0.55), seed) >= 0.98 * plain


def test_where_drafting_pays_the_policy_finds_it_through_the_slow_phases():
    costs = {**COSTS_2K, "1/k0": 10.0}  # the 2-row pass at 1.16 plain steps, its guess taken half the time: 1.29x
    for seed in (0, 1):
        plain = simulate(costs, (0.5, 0.55, 0.55), seed, policy=False)
        assert simulate(costs, (0.5, 0.55, 0.55), seed) >= 1.2 * plain
