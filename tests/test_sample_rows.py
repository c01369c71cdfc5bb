"""The sampler's C rows (tokenswift/sampling/sample_rows.c) against its torch operators, the reference: the same
scores bit for bit and the same tokens, on rows with ties, padding, repeats, infinities and NaN, under the writing
defaults and each rule alone; and a real run's text the same with and without them."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from tokenswift.model import native
from tokenswift.sampling.dry_xtc import match_lengths, match_limit
from tokenswift.sampling.no_repeat import repeat_followers
from tokenswift.sampling.row_kernel import RowKernel
from tokenswift.sampling.sampler import Sampler
from tokenswift.settings import Settings, writing_settings

V = 300
EOS = (2, 7)
BREAKERS = torch.zeros(V, dtype=torch.bool)
BREAKERS[[3, 11, 40]] = True


@pytest.fixture(scope="module")
def kernel():
    return RowKernel(native.kernels(), V)


def row_logits(seed: int, rows: int = 1) -> torch.Tensor:
    """float32 logits with ties (rounded to quarters) and, by seed, infinities or a NaN."""
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(rows, V, generator=g) * 3 * 4).round() / 4
    if seed % 5 == 1:
        z[:, torch.randint(V, (20,), generator=g)] = -math.inf
    if seed % 11 == 2:
        z[0, [0, 25, 50, 75, 100]] = math.inf  # tokens of the windows: DRY's amounts off +inf
    if seed % 13 == 3:
        z[0, 9] = math.nan
    return z


def window(seed: int, w: int = 400, alphabet: int = 12) -> torch.Tensor:
    """[1, w] history of a small alphabet (DRY and no-repeat find repeats; a breaker, 40, and an end of text, 7,
    among its tokens), left-padded with -1 by seed."""
    g = torch.Generator().manual_seed(1000 + seed)
    ids = torch.tensor([0, 25, 40, 7, 50, 75, 100, 125, 150, 175, 200, 225, 250, 275])[
        torch.randint(min(alphabet, 14), (1, w), generator=g)]
    if seed % 11 == 2:  # no breaker: the repeat below goes past DRY's largest exponent (row_logits' +inf seeds)
        ids[ids == 40] = 50
    run = min(60, w // 2)
    ids[0, -run:] = ids[0, -2 * run:-run]  # the text's end repeats an earlier run
    ids[0, : (seed % 4) * 50] = -1
    return ids


SETTINGS = {
    "writing defaults": writing_settings(),
    "no-repeat 4, DRY from 1": writing_settings(no_repeat_ngram=4, dry_allowed_length=1),
    "greedy": writing_settings(temperature=0.0),
    "no penalty, no min-p": writing_settings(penalty=1.0, min_p=0.0, dry_multiplier=0.0, no_repeat_ngram=0),
    "penalty alone": Settings(penalty=1.3, penalty_window=64, temperature=1.0),
    "T only, no eos ban": Settings(temperature=0.7, ban_eos=False),
    "DRY past float32": writing_settings(dry_multiplier=100.0, dry_base=10.0, dry_allowed_length=1, no_repeat_ngram=0),
}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (-0.0 is not 0.0; a NaN is its own bits)."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def samplers(s: Settings, kernel: RowKernel, bans=None) -> tuple[Sampler, Sampler]:
    """(torch's, the kernel's) samplers of the same settings."""
    breakers = BREAKERS if s.dry_multiplier else None
    return (Sampler(s, V, "cpu", EOS, breakers, bans), Sampler(s, V, "cpu", EOS, breakers, bans, kernel))


@pytest.mark.parametrize("name", SETTINGS)
def test_rows_are_torchs_bit_for_bit(kernel, name):
    s = SETTINGS[name]
    reference, fast = samplers(s, kernel, bans={103: [0, 25, 50], 104: list(range(V))})
    assert fast.kernel is not None
    for seed in range(40):
        z, w, position = row_logits(seed), window(seed), 100 + seed % 6
        expected = reference.process(z, w, positions=[position])
        got = fast.process(z, w, positions=[position])
        assert same_bits(got, expected), seed
        assert same_bits(fast.penalize(z, w), reference.penalize(z, w)), seed  # what a greedy draft is ranked by
        assert torch.equal(fast.choose(got, [position]), reference.choose(expected, [position])), seed
        if reference.noise is not None and not expected.isnan().any():  # the candidates and their noisy scores
            for a, b in zip(fast.noisy(got[0], position), reference.noisy(expected[0], position), strict=True):
                assert torch.equal(a, b), seed
        assert torch.equal(fast.draw(z, w, position)[0], reference.draw(z, w, position)[0]), seed


def test_several_rows_and_no_window(kernel):
    s = writing_settings()
    reference, fast = samplers(s, kernel)
    z, w = row_logits(4, rows=3), window(4).expand(3, -1)
    assert torch.equal(fast.process(z, w, positions=[5, 6, 7]), reference.process(z, w, positions=[5, 6, 7]))
    assert torch.equal(fast.process(z, None, positions=None), reference.process(z, None, positions=None))


@pytest.mark.parametrize("name", ["writing defaults", "greedy"])
def test_rows_over_a_draft_vocabulary(kernel, name):
    """A drafter's rows score part of the vocabulary (its columns: `vocab`): the rules map ids to columns."""
    reference, fast = samplers(SETTINGS[name], kernel, bans={50: [0, 25, 50, 75]})
    first = [0, 25, 2, 50]  # an end of text and banned tokens among the columns
    rest = [t for t in torch.randperm(V, generator=torch.Generator().manual_seed(9)).tolist() if t not in first]
    vocab = torch.tensor(first + rest[:116])
    for seed in range(20):
        z, w = row_logits(seed, rows=2)[:, :120], window(seed).expand(2, -1)
        expected = reference.process(z, w, vocab, positions=[49, 50])
        got = fast.process(z, w, vocab, positions=[49, 50])
        assert torch.equal(got.nan_to_num(), expected.nan_to_num()), seed
        assert same_bits(fast.penalize(z, w, vocab), reference.penalize(z, w, vocab)), seed
        if reference.noise is not None and not expected.isnan().any():
            for a, b in zip(fast.noisy(got[1], 50, vocab), reference.noisy(expected[1], 50, vocab), strict=True):
                assert torch.equal(a, b), seed


def test_rules_the_kernel_does_not_cover_run_in_torch(kernel):
    for s in (writing_settings(top_k=20), writing_settings(top_p=0.9), writing_settings(min_keep=3),
              writing_settings(xtc_probability=0.5), writing_settings(eta=0.01),
              Settings(temperature=1e-46)):  # 0 in float32: greedy to C, a division by zero to torch
        assert samplers(s, kernel)[1].kernel is None
    reference, fast = samplers(writing_settings(), kernel)
    z64, w = row_logits(0).double(), window(0)
    assert torch.equal(fast.process(z64, w, positions=[3]), reference.process(z64, w, positions=[3]))


def test_dry_lengths_and_repeat_followers_match_torchs(kernel):
    for seed in range(30):
        w = window(seed, w=64 + seed * 7, alphabet=3 + seed % 5)
        for allowed in (1, 2, 5):
            limit = match_limit(w.shape[1], allowed)
            assert torch.equal(kernel.dry_lengths(w, BREAKERS, limit), match_lengths(w.flip(1), BREAKERS, allowed))
        for n in (2, 3, 10):
            assert torch.equal(kernel.repeat_followers(w, n), repeat_followers(w, n))


def test_finite_columns(kernel):
    row = torch.tensor([0.5, -math.inf, math.inf, math.nan, -3.0, 0.0] * 50)
    assert torch.equal(kernel.finite(row), ((row > -math.inf) & (row < math.inf)).nonzero().squeeze(1))


def test_the_noise_of_a_few_tokens_is_the_full_rows(kernel):
    """The kernel's uniform draws (integer hashes, whatever the model's dtype) give the torch path's noise, bit for
    bit, at positions past 2^32 too."""
    from tokenswift.sampling.sampler import Noise

    fast, reference = Noise(11, V, "cpu", kernel), Noise(11, V, "cpu")
    ids = torch.tensor([0, 5, 6, 99, V - 1])
    for position in (0, 1, 4097, 2**32 + 3):
        assert torch.equal(fast.gumbel([position], ids), reference.gumbel([position], ids))
        assert torch.equal(fast.gumbel([position], ids), reference.gumbel([position])[:, ids])


@pytest.mark.parametrize("model", ["stories32", "stories64"])
def test_a_run_writes_the_same_text_with_and_without_the_kernel(request, model, monkeypatch):
    """float32 runs the kernel's rows; float64 (the exactness proofs' dtype) its integer work only (noise, DRY's
    lengths, no-repeat's followers), which must not change a token."""
    from tokenswift.decode.generate import Generator
    from tokenswift.decode.options import EngineOptions

    lm = request.getfixturevalue(model)
    s = writing_settings(max_new_tokens=160, seed=5, ignore_eos=True, no_repeat_ngram=4)
    prompt = lm.tokenizer.encode("Once upon a time, there was a little girl")
    kernels = []

    def spied(*args):
        kernels.append(native.sampler_rows(*args))
        return kernels[-1]

    calls = Counter()

    def counted(name):
        method = getattr(RowKernel, name)
        return lambda *args, **kwargs: calls.update([name]) or method(*args, **kwargs)

    monkeypatch.setattr("tokenswift.decode.engine.sampler_rows", spied)
    for name in ("row", "finite", "uniforms", "repeat_followers"):
        monkeypatch.setattr(RowKernel, name, counted(name))
    texts = {mode: Generator(lm, s, prompt, options=EngineOptions().speculating(mode=mode)).run()
             for mode in ("ar", "tokenswift")}
    assert len(kernels) == 2 and all(k is not None for k in kernels)
    assert calls["uniforms"] > 0 and calls["repeat_followers"] > 0
    rows = calls["row"] + calls["finite"]  # a float64 row never goes through the float32 C rows
    assert rows > 0 if model == "stories32" else rows == 0
    monkeypatch.setattr("tokenswift.decode.engine.sampler_rows", lambda *args: None)
    assert Generator(lm, s, prompt, options=EngineOptions().speculating(mode="ar")).run() == texts["ar"]
    assert texts["tokenswift"] == texts["ar"]


@pytest.mark.parametrize("s", [writing_settings(), Settings(temperature=0.0005)], ids=["min-p", "underflow"])
def test_alternatives_from_the_finite_scores_are_the_whole_rows(kernel, s):
    """The same ids (-1 where a probability is 0: filtered, or underflowing at a low temperature) and
    probabilities to a few ulps."""
    from tokenswift.sampling.alternatives import top_rows

    reference, fast = samplers(s, kernel)
    empty = 0
    for seed in range(30):
        z = torch.randn(1, V, generator=torch.Generator().manual_seed(seed)) * (1 + seed % 4)  # no ties
        scores = fast.process(z, window(seed), positions=[7])
        token = fast.choose(scores, [7])
        got, expected = fast.alternatives(scores, token), top_rows(scores, token)
        assert torch.equal(got[:, 1:6], expected[:, 1:6]), seed
        assert torch.allclose(got, expected, rtol=1e-12, atol=0), seed
        empty += int((expected[:, 1:6] == -1).sum())
    assert empty > 0  # empty slots were compared
    assert torch.equal(reference.alternatives(scores, token), top_rows(scores, token))  # no kernel: top_rows itself
