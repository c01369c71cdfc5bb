"""Samplers against direct formulas, and the position-keyed noise's determinism and batch independence."""

from __future__ import annotations

import math

import pytest
import torch

from tokenswift.sampling.keys import mix32, position_key
from tokenswift.sampling.no_repeat import repeat_followers
from tokenswift.sampling.sampler import (
    Noise,
    Sampler,
    _keep_best,
    apply_penalty,
    eta_filter,
    min_p_filter,
    penalty_mask,
    top_k_filter,
    top_p_filter,
)
from tokenswift.settings import Settings

V = 50


def logits(rows=3, seed=0):
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3


def kept(scores):
    return [set(torch.nonzero(torch.isfinite(r)).flatten().tolist()) for r in scores]


def test_penalty_sign_aware():
    z = torch.tensor([[2.0, -2.0, 1.0, -1.0]], dtype=torch.float64)
    mask = penalty_mask(torch.tensor([[0, 1, 1, -1]]), 4)
    assert mask.tolist() == [[True, True, False, False]]
    assert apply_penalty(z, mask, 1.25).tolist() == [[1.6, -2.5, 1.0, -1.0]]


def test_top_k_and_top_p_against_direct_formulas():
    z = logits()
    for row, keep in zip(z, kept(top_k_filter(z, 7)), strict=True):
        assert keep == set(torch.argsort(row, descending=True)[:7].tolist())
    for row, keep in zip(z, kept(top_p_filter(z, 0.8, 1)), strict=True):
        probs = row.softmax(-1)
        order = torch.argsort(probs, descending=True).tolist()
        direct, total = set(), 0.0
        for i in order:  # the smallest prefix of the ranking whose mass reaches top_p
            direct.add(i)
            total += probs[i].item()
            if total >= 0.8:
                break
        assert keep == direct


def test_min_p_and_eta_against_direct_formulas():
    z = logits()
    for row, keep in zip(z, kept(min_p_filter(z, 0.1, 1)), strict=True):
        probs = row.softmax(-1)
        assert keep == set(torch.nonzero(probs >= 0.1 * probs.max()).flatten().tolist())
    eps = 0.02
    for row, keep in zip(z, kept(eta_filter(z, eps, 1)), strict=True):
        probs = row.softmax(-1)
        entropy = -(probs * probs.log()).sum().item()
        eta = min(eps, math.sqrt(eps) * math.exp(-entropy))
        assert keep == set(torch.nonzero(probs >= eta).flatten().tolist())


def test_min_p_keeping_one_token_is_the_general_rule_on_odd_rows():
    """min_p_filter skips _keep_best for min_keep = 1 (the best token is never below min_p of itself): the same scores
    as the general rule on ties, -inf, +inf and NaN rows, bit for bit."""
    inf, nan = math.inf, math.nan
    rows = torch.tensor([[1.0, 3.0, 3.0, -inf, 0.5], [-inf] * 5, [2.0, inf, 1.0, inf, -inf],
                         [1.0, nan, 2.0, -inf, 2.0], [nan] * 5, [0.0, -1e30, 1e30, 5.0, 5.0]])
    for min_p in (0.05, 0.5, 1.0):
        general = _keep_best(rows, rows - rows.amax(dim=-1, keepdim=True) < math.log(min_p), 1)
        assert torch.equal(min_p_filter(rows, min_p, 1).isnan(), general.isnan())
        assert torch.equal(min_p_filter(rows, min_p, 1).nan_to_num(), general.nan_to_num())


def test_min_keep_is_honoured():
    z = logits(1)
    z[0, 0] = 100.0  # one dominant token: min-p alone would keep just it
    assert len(kept(min_p_filter(z, 0.5, 1))[0]) == 1
    assert len(kept(min_p_filter(z, 0.5, 20))[0]) == 20
    assert len(kept(eta_filter(z, 0.5, 20))[0]) == 20


def test_one_kept_token_is_the_first_of_equal_maxima():
    z = torch.full((1, V), -1.0, dtype=torch.float64)
    z[0, [20, 3, 7]] = 5.0
    remove_all = torch.ones_like(z, dtype=torch.bool)
    assert kept(_keep_best(z, remove_all, 1)) == [{3}]  # as the stable sort of the general path would keep
    assert kept(_keep_best(z, remove_all, 2)) == [{3, 7}]


def test_noise_for_some_tokens_equals_the_full_rows():
    noise = Noise(4, V, "cpu")
    ids = torch.tensor([2, 9, 31])
    assert torch.equal(noise.gumbel([17, 40], ids), noise.gumbel([17, 40])[:, ids])


def test_mix32_same_for_ints_and_tensors():
    values = [0, 1, 12345, 2**31, 2**32 - 1]
    assert mix32(torch.tensor(values)).tolist() == [mix32(v) for v in values]


def test_noise_is_a_pure_function_of_seed_and_position():
    a, b = Noise(7, V, "cpu"), Noise(7, V, "cpu")
    assert torch.equal(a.gumbel([5, 9]), b.gumbel([5, 9]))
    assert torch.equal(a.gumbel([9])[0], a.gumbel([5, 9, 11])[1])  # batch-independent
    assert not torch.equal(a.gumbel([5])[0], a.gumbel([6])[0])
    assert not torch.equal(a.gumbel([5]), Noise(8, V, "cpu").gumbel([5]))
    assert position_key(7, 2**33 + 5) != position_key(7, 5)


def test_gumbel_max_samples_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    sampler = Sampler(Settings(temperature=1.0, seed=3), 3, "cpu")
    draws = [int(sampler.sample(probs.log()[None], None, [p])[0]) for p in range(6000)]
    freq = torch.bincount(torch.tensor(draws), minlength=3).double() / len(draws)
    assert torch.allclose(freq, probs, atol=0.03)


@pytest.mark.parametrize("kw", [dict(temperature=0), dict(min_p=0.1, penalty=1.2), dict(top_p=0.9, top_k=20),
                                dict(eta=0.01, min_keep=5)])
def test_sampler_rows_are_batch_independent(kw):
    sampler = Sampler(Settings(seed=11, penalty_window=4, **kw), V, "cpu")
    z = logits(6, seed=2)
    windows = torch.randint(0, V, (6, 4), generator=torch.Generator().manual_seed(5))
    together = sampler.sample(z, windows, list(range(100, 106)))
    alone = [int(sampler.sample(z[i:i + 1], windows[i:i + 1], [100 + i])[0]) for i in range(6)]
    assert together.tolist() == alone


# -- drafts ranked under the noise they will be sampled with --------------------------------------------


def test_a_draft_equal_to_the_model_is_the_token_it_samples():
    """best_per_depth ranks a sampled draft with its position's own noise: a draft row equal to the model's
    logits names, as its best guess, exactly the token the model then draws there. Ranked by probability alone
    (as greedy is), a T=1 draft would name the likeliest token, which the sample often is not."""
    from tokenswift.draft.drafting import best_per_depth

    rows = logits(rows=40, seed=5) / 2
    window = torch.tensor([[3, 7, 7, 11]])
    sampler = Sampler(Settings(temperature=1.0, min_p=0.05, penalty=1.3), V, "cpu")
    drafts = best_per_depth(rows, sampler, window, [3] * len(rows), key=1000)
    drawn = [int(sampler.sample(rows[d:d + 1], window, [1000 + d])[0]) for d in range(len(rows))]
    assert [level[0] for level in drafts] == drawn
    assert all(len(set(level)) == len(level) <= 3 for level in drafts)
    likeliest = best_per_depth(rows, Sampler(Settings(temperature=0.0, penalty=1.3), V, "cpu"), window,
                               [1] * len(rows), key=1000)
    assert sum(a == [b] for a, b in zip(likeliest, drawn, strict=True)) < len(rows) - 5


def test_the_penalties_read_and_write_only_their_tokens_as_the_whole_row_rules_do():
    """Sampler.penalize changes the columns of the ends of text, the window's tokens and the tokens a repeat would
    go on with, by gather and scatter: the same scores as each rule applied to the whole row, on the whole
    vocabulary and on a drafter's part of it."""
    from test_dry_xtc import dry_penalties

    breakers = torch.zeros(V, dtype=torch.bool)
    breakers[[3, 7]] = True
    s = Settings(penalty=1.3, penalty_window=12, dry_multiplier=0.8, dry_range=16, ban_eos=True, no_repeat_ngram=4)
    sampler = Sampler(s, V, "cpu", (0, 1), breakers)
    windows = torch.randint(0, 9, (3, 40), generator=torch.Generator().manual_seed(1))
    windows[0, -3:] = windows[0, 10:13]  # row 0 ends in a run that came before: the token after it is refused
    windows[2, :30] = -1
    z = logits()
    dense = z.masked_fill(torch.isin(torch.arange(V), torch.tensor([0, 1])), -math.inf)
    dense = apply_penalty(dense, penalty_mask(windows[:, -12:], V), 1.3)
    followers = repeat_followers(windows, 4)
    refused = torch.zeros(3, V + 1, dtype=torch.bool).scatter_(1, torch.where(followers >= 0, followers, V),
                                                                True)[:, :V]
    dense = dense.masked_fill(refused, -math.inf)
    dense = dense - dry_penalties(windows[:, -16:], breakers, 0.8, 1.75, 2, V)
    assert refused.any() and torch.equal(sampler.penalize(z, windows), dense)
    vocab = torch.arange(0, V, 2)
    assert torch.equal(sampler.penalize(z[:, vocab], windows, vocab), dense[:, vocab])


def test_a_history_row_is_the_last_tokens_of_the_text_and_path_padded_on_the_left():
    from tokenswift.sampling.windows import history_row

    ids = torch.arange(100, 130)
    for end in (0, 1, 5, 20, 30):
        for length in (1, 4, 12, 40):
            for path in ([], [7], [7, 8, 9], list(range(200, 215))):
                text = ids[:end].tolist() + path
                expected = ([-1] * length + text)[-length:]
                assert history_row(ids, end, length, path).tolist() == [expected], (end, length, path)
    assert history_row(ids, 10, 0, [1]) is None
