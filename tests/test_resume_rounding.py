"""A resumed draft writes what the uninterrupted draft writes in the app's own configuration: the default model in q4
(and float32) on the CPU, the writing defaults, the auto drafter, the adaptive engine, one thread.

There a prefill rounds otherwise than the steps it replaces (torch's GEMMs against the C kernels' rows), and a near-tie
flips a sampled token within a few dozen tokens: before the rebuilt cache replayed the tokens written since its
window was built (model/prefill.py), a resume 200 tokens in parted from the straight run 17 tokens later. float64
(stories260k) cannot see this: the exactness tests there keep their own resume proofs."""

from __future__ import annotations

import json
import lzma

import pytest
import torch
from conftest import BOOKS, need_shared

from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.settings import writing_settings
from tokenswift.text.context_window import pinned_ids

N = 200
MORE = 60  # tokens a resumed run writes past its cut: a flip came within 17-27 tokens of a cut
# A 160-token window with Memory and note shifts a quarter at a time (the first shift comes about 70 tokens in, then
# every 41), so the cuts below land mid-window before any shift, and right before and after a shift.
SETTINGS = writing_settings(max_new_tokens=N, seed=7, context_window=160, note_depth=64)
MEMORY, NOTE = "A quiet town by the sea, in winter.", "Keep the tone sombre."
APP = EngineOptions(adaptive=True, alternatives=True)  # the worker's options


@pytest.fixture(scope="module")
def opening() -> str:
    """A held-out novel's opening (eval never trains the drafters)."""
    with lzma.open(need_shared(BOOKS / "eval.jsonl.xz"), "rt") as f:
        return json.loads(f.readline())["text"][:400]


def straight_and_resumed(lm, opening: str, cuts: list[int]) -> tuple[list[int], dict[int, list[int]]]:
    """The uninterrupted run's tokens up to MORE past the last cut, and each resumed run's up to MORE past its cut
    (with the EOS banned, a shorter run writes a prefix of a longer one)."""
    prompt, pinned = lm.encode(opening)[:60], pinned_ids(lm, MEMORY, NOTE)
    s = SETTINGS.replace(max_new_tokens=max(cuts) + MORE)
    run = Generator(lm, s, prompt, options=APP, pinned=pinned)
    straight = run.run()
    resumed = {cut: Generator(lm, s.replace(max_new_tokens=cut + MORE), prompt, generated_ids=straight[:cut],
                              options=APP, pinned=pinned).run()
               for cut in cuts}
    return straight, resumed


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def shift_points(lm, opening: str) -> list[int]:
    """Generated-token counts at which the window is rebuilt (the plan's boundaries past the prompt)."""
    prompt = lm.encode(opening)[:60]
    plan = Generator(lm, SETTINGS, prompt, pinned=pinned_ids(lm, MEMORY, NOTE)).plan
    points, b = [], plan.next_boundary(len(prompt))
    while b - len(prompt) < N:
        points.append(b - len(prompt))
        b = plan.next_boundary(b)
    return points


def check(resumed: dict[int, list[int]], straight: list[int]) -> None:
    for cut, ids in resumed.items():
        parted = first_difference(ids, straight[:len(ids)])
        assert parted is None, f"resumed at {cut}: parted from the uninterrupted run at token {parted}"


def test_q4_resumes_mid_window_and_around_a_shift_exactly(smollm2_q4, opening):
    first, second = shift_points(smollm2_q4, opening)[:2]
    assert first > 40
    # mid-window before any shift (where the first window was prefilled at the prompt), then just before and just
    # after a shift (a window prefilled all but its root, a resume at its boundary, one token past it)
    straight, resumed = straight_and_resumed(smollm2_q4, opening, [40, second - 1, second + 1])
    check(resumed, straight)


def caches_at(lm, opening: str, cuts: list[int]):
    """For each cut: (the filled K/V of one uninterrupted run once it has that many new tokens or more, and of an
    engine resumed from its ids then)."""
    prompt, pinned = lm.encode(opening)[:60], pinned_ids(lm, MEMORY, NOTE)
    run = Generator(lm, SETTINGS, prompt, options=APP, pinned=pinned)
    out, pending = [], list(cuts)
    for _ in run.steps():
        if len(run.produced) < pending[0]:
            continue
        engine = run._engine
        resumed = Engine(lm, SETTINGS, list(engine.ids), len(prompt), APP, plan=run.plan)
        resumed.start()
        assert (resumed.length, resumed.window.offset) == (engine.length, engine.window.offset)
        out.append(([(k[:, :engine.length].clone(), v[:, :engine.length].clone()) for k, v in engine.cache.layers],
                     [(k[:, :resumed.length], v[:, :resumed.length]) for k, v in resumed.cache.layers]))
        pending.pop(0)
        if not pending:
            return out
    raise AssertionError("the run ended before its last cut")


@pytest.mark.parametrize("model", ["stories32", "smollm2_q4"])
def test_a_rebuilt_cache_holds_the_uninterrupted_runs_values_bit_for_bit(request, model, opening):
    """Token by token, float32 parts from a resume only at a rare near-tie; its cache shows every rounding at once:
    mid-window (the prompt's prefill, then steps) and past a shift (the window's prefill, then steps). float32 on
    stories260k (the same C row kernels and GEMMs as the default model's float32 path, at a fraction of its cost)
    and the default model in q4."""
    lm = request.getfixturevalue(model)
    cuts = (30, shift_points(lm, opening)[0] + 20)
    for cut, (straight, resumed) in zip(cuts, caches_at(lm, opening, list(cuts)), strict=True):
        for layer, ((k, v), (k2, v2)) in enumerate(zip(straight, resumed, strict=True)):
            assert torch.equal(k, k2) and torch.equal(v, v2), f"{cut} tokens in: layer {layer}'s keys or values differ"
