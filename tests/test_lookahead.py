"""The next window filled ahead of its shift (decode/lookahead.py): what the story settles of it is the window's
own beginning, and a run that fills ahead writes what a run that does not writes, a Memory edited under it
included, in the app's configuration (the default model in q4, whose prefill runs by rows)."""

from __future__ import annotations

import random
import time

import pytest
import torch

from tokenswift.decode.generate import Generator
from tokenswift.decode.lookahead import Lookahead
from tokenswift.decode.options import EngineOptions
from tokenswift.draft.build import DraftNeeds
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.prefill import prefill
from tokenswift.settings import Speculation, writing_settings
from tokenswift.text.context_window import PinnedText, WindowPlan, pinned_ids

STARTS = frozenset(range(0, 100, 3))  # ids that begin a word


@pytest.mark.parametrize("note", [(), (900, 901, 902)])
def test_what_the_story_settles_is_the_windows_beginning(note):
    rng = random.Random(5)
    ids = [1] + [rng.randrange(100) for _ in range(700)]
    plan = WindowPlan(ids[:30], 1, PinnedText(memory=(500, 501), note=note, word_starts=STARTS), 160, 40, 24)
    b = plan.next_boundary(400)
    window = plan.window(ids, b)
    for t in range(b - 160, b):
        guess = plan.ahead(ids[:t], b)
        assert guess == window[:len(guess)], t
    assert len(plan.ahead(ids[:b - 1], b)) == len(window) - 1  # all but the boundary's own token, once written
    assert len(plan.ahead(ids[:b - 40], b)) == len(window) - len(note) - 40
    # The note's place moves back to a word's start up to WORD_REACH (8) tokens: those wait for the token there.
    assert len(plan.ahead(ids[:b - 26], b)) == len(window) - len(note) - (31 if note else 26)


def test_rows_filled_ahead_are_a_prefills(smollm2_q4):
    """The lookahead's rows, computed a piece at a time on its thread, are the rows one prefill computes; only the
    leading slots whose tokens match are taken."""
    model, cfg = smollm2_q4.model, smollm2_q4.config
    tokens = smollm2_q4.encode("The lighthouse keeper counted the ships that never came back to the harbour.")
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, 64, cfg.head_dim, "cpu", smollm2_q4.cache_dtype)
    with torch.inference_mode():
        whole = prefill(model, torch.tensor(tokens), cache, keep=len(tokens)).hidden
    ahead = Lookahead(model, cache, DraftNeeds())
    ahead.want(tokens[:5])
    ahead.want(tokens)  # while the first piece is in flight
    into = KVCache(cfg.n_layers, cfg.n_kv_heads, 64, cfg.head_dim, "cpu", smollm2_q4.cache_dtype)
    _wait_for(ahead, len(tokens))
    ready, states = ahead.take([*tokens[:9], -1], into, limit=64, keep=4)
    assert ready == 9 and torch.equal(states, whole[5:9])
    assert torch.equal(into.k[:, :, :9], cache.k[:, :, :9]) and torch.equal(into.v[:, :, :9], cache.v[:, :, :9])
    assert not into.k[:, :, 9:].any()


def _wait_for(ahead: Lookahead, rows: int) -> None:
    for _ in range(600):
        if len(ahead.tokens) >= rows:
            return
        time.sleep(0.05)
    raise AssertionError("the lookahead did not fill its rows")


class Edits:
    """The draft's Memory, rewritten after the first shift (Generator's pinned_source)."""

    def __init__(self, lm):
        self.lm, self.calls = lm, 0

    def __call__(self) -> PinnedText:
        self.calls += 1
        memory = "A quiet town by the sea." if self.calls < 2 else "A city of bridges, at night."
        return pinned_ids(self.lm, memory, "Keep the tone sombre.")


@pytest.mark.parametrize("mode", ["ar", "tokenswift"])
def test_a_run_filled_ahead_writes_what_a_run_that_is_not_writes(smollm2_q4, mode):
    lm = smollm2_q4
    settings = writing_settings(max_new_tokens=220, seed=11, context_window=160, note_depth=40)
    prompt = lm.encode("The harbour froze the winter my father left. We did not speak of it, and the ice")
    runs = {}
    for ahead in (False, True):
        options = EngineOptions(adaptive=True, lookahead=ahead, speculation=Speculation(mode=mode))
        gen = Generator(lm, settings, prompt, options=options, pinned=Edits(lm)(), pinned_source=Edits(lm))
        runs[ahead] = gen.run(), gen.metrics()
    (plain, _), (filled, metrics) = runs[False], runs[True]
    assert filled == plain
    assert metrics.shifts >= 3 and metrics.shift_ready > metrics.shift_rows / 2  # most of each window came ahead


def test_the_side_waiting_its_turn_in_bench_fills_nothing_ahead(smollm2_q4, monkeypatch):
    """bench and bench-shift alternate the modes (bench/runs.alternate): while one side is timed the other's
    lookahead waits (left running, it had twice a run's time to fill, and shifts looked cheaper than they are), and
    it goes on at its own next turn; the two texts are plain decoding's."""
    from tokenswift.bench import runs

    lm = smollm2_q4
    settings = writing_settings(max_new_tokens=200, seed=11, context_window=160, note_depth=40, ignore_eos=True)
    prompt = lm.encode("The harbour froze the winter my father left. We did not speak of it, and the ice")
    opened, filled_meanwhile = [], []
    open_engine, timed = runs.open_engine, runs._timed

    def opening(*args, **kwargs):
        opened.append(open_engine(*args, **kwargs))
        return opened[-1]

    def watched(engine, out, goal, step):
        others = [e.window.lookahead for e in opened if e is not engine]
        before = [len(ahead.tokens) for ahead in others]
        seconds = timed(engine, out, goal, step)
        filled_meanwhile.extend(len(ahead.tokens) - n for ahead, n in zip(others, before, strict=True))
        return seconds

    monkeypatch.setattr(runs, "open_engine", opening)
    monkeypatch.setattr(runs, "_timed", watched)
    options = EngineOptions(adaptive=True, lookahead=True)
    ar_out, ts_out, _, (ar, ts) = runs.alternate(lm, prompt, settings, 16, options)
    assert ar_out == ts_out == Generator(lm, settings, prompt, options=options.speculating(mode="ar")).run()
    assert len(filled_meanwhile) > 20 and not any(filled_meanwhile)
    for engine in (ar, ts):
        assert engine.metrics.shifts >= 2 and engine.metrics.shift_ready > engine.metrics.shift_rows / 2
