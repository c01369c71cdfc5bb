"""DRY and XTC (dry_xtc.py): DRY's penalties match a plain reading of its rule, XTC sets aside the top choices at
the positions its keyed draw picks, both change the text as they should, and TokenSwift with them on emits
exactly the tokens of plain decoding (float64, stories260k, both drafters, n-grams, adaptive, context shifts)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from speed import AR, speed
from test_context_shift import MEMORY, NARROW, NOTE, first_difference
from test_exactness import PROMPT, random_heads

from tokenswift.cli.main import main
from tokenswift.decode.generate import Generator
from tokenswift.decode.metrics import distinct_n
from tokenswift.decode.options import EngineOptions
from tokenswift.sampling.dry_xtc import dry_amounts, xtc_draws, xtc_filter
from tokenswift.sampling.sampler import Sampler
from tokenswift.settings import Settings, SettingsError, Speculation
from tokenswift.text.context_window import pinned_ids

DRY = dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_range=64)
XTC = dict(xtc_threshold=0.1, xtc_probability=0.5)


def reference_dry(history: list[int], breakers: set[int], multiplier, base, allowed, vocab) -> list[float]:
    """DRY read literally: for every earlier position j, how far the text before j matches the text's end."""
    out = [0.0] * vocab
    n = len(history)
    for j in range(1, n):  # history[j] followed history[:j]
        length = 0
        while (length < j and history[j - 1 - length] == history[n - 1 - length]
               and history[n - 1 - length] not in breakers):
            length += 1
        if length >= allowed:
            out[history[j]] = max(out[history[j]], multiplier * base ** (length - allowed))
    return out


def dry_penalties(windows, breakers, multiplier, base, allowed, vocab) -> torch.Tensor:
    """[R, vocab]: each token's largest amount (dry_amounts' followers and amounts), 0 for the others."""
    followers, amounts = dry_amounts(windows, breakers, multiplier, base, allowed)
    out = torch.zeros(windows.shape[0], vocab + 1, dtype=torch.float64)
    out.scatter_reduce_(1, torch.where(followers >= 0, followers, vocab), amounts, "amax")
    return out[:, :vocab]


def test_dry_penalties_follow_the_rule():
    torch.manual_seed(0)
    vocab = 12
    breakers = torch.zeros(vocab, dtype=torch.bool)
    breakers[[3, 7]] = True
    for _ in range(50):
        n = int(torch.randint(2, 40, ()))
        pattern = torch.randint(0, vocab, (5,))
        history = torch.cat([pattern, torch.randint(0, vocab, (n,)), pattern])[-n:].tolist()
        got = dry_penalties(torch.tensor([history]), breakers, 0.8, 1.75, 2, vocab)[0].tolist()
        want = reference_dry(history, {3, 7}, 0.8, 1.75, 2, vocab)
        assert got == pytest.approx(want)
    loop = [1, 2, 4, 5] * 30  # a match of 119 tokens: past the cap, the same capped penalty as the rule's
    got = dry_penalties(torch.tensor([loop]), breakers, 0.8, 1.75, 2, vocab)[0].tolist()
    want = reference_dry(loop, {3, 7}, 0.8, 1.75, 2, vocab)
    assert max(want) > 0.8 * 1.75 ** 40 and got == pytest.approx([min(w, 0.8 * 1.75 ** 40) for w in want])
    padded = dry_penalties(torch.tensor([[-1, -1, 1, 2, 5, 1, 2]]), breakers, 1.0, 2.0, 2, vocab)[0]
    assert padded[5] == 1.0 and padded.sum() == 1.0  # "1 2" repeats: 5 would extend it; padding matches nothing


def test_a_window_seen_again_reuses_its_repeats(monkeypatch):
    """A drafter ranks its guess with the history the target's row then samples with: the sampler works out that
    window's DRY repeats and no-repeat followers once, and the second row's scores are what a fresh sampler's are."""
    import tokenswift.sampling.sampler as sampler_module

    settings = Settings(temperature=1.0, dry_multiplier=0.8, no_repeat_ngram=4, penalty=1.2, penalty_window=8)
    calls = []
    for name in ("dry_amounts", "repeat_followers"):
        real = getattr(sampler_module, name)
        monkeypatch.setattr(sampler_module, name, lambda *a, _f=real, _n=name: (calls.append(_n), _f(*a))[1])
    vocab, breakers = 12, torch.zeros(12, dtype=torch.bool)
    window = torch.tensor([[1, 2, 4, 5, 1, 2, 4, 5, 1, 2]])
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
    sampler = Sampler(settings, vocab, "cpu", breakers=breakers)
    draft = sampler.penalize(logits[:, :6], window, torch.arange(6))  # a draft vocabulary, as a drafter's
    assert draft.shape == (1, 6) and sorted(calls) == ["dry_amounts", "repeat_followers"]
    again = sampler.penalize(logits, window)
    assert len(calls) == 2  # the target's row: nothing worked out again
    fresh = Sampler(settings, vocab, "cpu", breakers=breakers).penalize(logits, window)
    assert torch.equal(again, fresh) and math.isinf(again[0, 4]) and again[0, 4] < 0  # "5 1 2 4" would repeat
    seen = len(calls)
    sampler.penalize(logits, torch.tensor([[3, 2, 4, 5, 1, 2, 4, 5, 1, 2]]))
    assert len(calls) == seen + 2  # another window: worked out


def test_xtc_sets_aside_all_top_choices_but_the_least_likely():
    scores = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    out = xtc_filter(scores, 0.1, torch.tensor([True]))
    assert torch.isinf(out[0, :2]).all() and torch.isfinite(out[0, 2:]).all()
    assert torch.equal(xtc_filter(scores, 0.1, torch.tensor([False])), scores)
    assert torch.equal(xtc_filter(scores, 0.4, torch.tensor([True])), scores)  # one top choice: nothing to do
    draws = xtc_draws(7, list(range(2000)), "cpu")
    assert torch.equal(draws, xtc_draws(7, torch.arange(2000), "cpu"))  # host ints and device tensors agree
    assert abs(float(draws.mean()) - 0.5) < 0.03 and not torch.equal(draws, xtc_draws(8, list(range(2000)), "cpu"))


@pytest.mark.slow
def test_dry_breaks_the_loops_of_greedy_decoding(stories64):
    prompt = stories64.encode(PROMPT)
    plain = Generator(stories64, Settings(max_new_tokens=300, temperature=0, ignore_eos=True), prompt,
                      options=AR).run()
    dry = Generator(stories64, Settings(max_new_tokens=300, temperature=0, ignore_eos=True, **DRY), prompt,
                    options=AR).run()
    assert distinct_n(dry, 4) > distinct_n(plain, 4) + 0.2


CASES = [("fused", 20, False, dict(temperature=0.0, **DRY)),
         ("fused", 20, True, dict(temperature=1.0, min_p=0.05, **DRY, **XTC)),
         ("paper", 5, False, dict(temperature=1.0, top_p=0.95, penalty=1.2, penalty_window=32, **DRY, **XTC)),
         ("fused", 0, False, dict(temperature=1.0, min_p=0.05, **XTC))]


@pytest.mark.slow
@pytest.mark.parametrize(("drafter", "k", "adaptive", "sampling"), CASES)
def test_tokenswift_equals_ar_with_dry_and_xtc(stories64, drafter, k, adaptive, sampling):
    lm = dataclasses.replace(stories64, heads=random_heads(stories64, 3))
    prompt = lm.encode(PROMPT)
    s = Settings(max_new_tokens=350, seed=2, ignore_eos=True, **sampling)
    expected = Generator(lm, s, prompt, options=AR).run()
    plain = dict(dry_multiplier=0.0, xtc_probability=0.0)
    assert expected != Generator(lm, s.replace(**plain), prompt, options=AR).run()  # the controls act here
    ts = EngineOptions(adaptive=adaptive, speculation=Speculation(ngram_topk=k, budget=48, drafter=drafter))
    gen = Generator(lm, s, prompt, options=ts)
    assert first_difference(gen.run(), expected) is None


@pytest.mark.slow
def test_tokenswift_equals_ar_with_dry_and_xtc_across_shifts(stories64):
    lm = dataclasses.replace(stories64, heads=random_heads(stories64, 3))
    prompt, pinned = lm.encode(PROMPT), pinned_ids(lm, MEMORY, NOTE)
    s = Settings(max_new_tokens=300, seed=4, ignore_eos=True, context_window=NARROW, note_depth=100,
                 temperature=1.0, min_p=0.05, **DRY, **XTC)
    expected = Generator(lm, s, prompt, options=AR, pinned=pinned).run()
    gen = Generator(lm, s, prompt, options=speed(tree=(1, 2, 2)), pinned=pinned)
    assert first_difference(gen.run(), expected) is None and gen.metrics().shifts >= 3
    resumed = Generator(lm, s, prompt, generated_ids=expected[:170], options=speed(tree=(1, 2, 2)),
                        pinned=pinned)  # past a shift
    assert first_difference(resumed.run(), expected) is None


@pytest.mark.parametrize(("flag", "value", "field"), [
    ("--dry-multiplier", "-1", "dry_multiplier"), ("--dry-base", "1", "dry_base"),
    ("--dry-allowed-length", "0", "dry_allowed_length"), ("--dry-range", "100000", "dry_range"),
    ("--xtc-threshold", "0.7", "xtc_threshold"), ("--xtc-probability", "nan", "xtc_probability")])
def test_out_of_range_controls_are_refused_by_name(stories_path, capsys, flag, value, field):
    code = main(["generate", "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "3", flag, value])
    assert code == 2 and capsys.readouterr().err.startswith(f"error: {field}:")


def test_breakers_from_the_command_line_and_settings(stories_path, capsys, tmp_path):
    out = tmp_path / "o.json"
    assert main(["generate", "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "3",
                 "--dry-multiplier", "0.8", "--dry-breakers", "\\n", ".", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["settings"]["dry_breakers"] == ["\n", "."]
    with pytest.raises(SettingsError, match="dry_breakers"):
        Settings(dry_breakers=("",))
    assert Settings(dry_breakers=["\n"]).dry_breakers == ("\n",) and math.isclose(Settings().dry_base, 1.75)
