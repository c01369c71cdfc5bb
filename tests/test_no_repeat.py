"""No verbatim repeats (tokenswift/sampling/no_repeat.py): the rule itself, then a greedy tiny model (which loops
on its own text within a few dozen tokens) writing no n-token run twice, with TokenSwift writing plain decoding's
tokens and a resumed run the uninterrupted one's (float64)."""

from __future__ import annotations

import pytest
import torch
from speed import AR, speed
from test_exactness import PROMPT, random_heads, with_heads

from tokenswift.decode.generate import Generator
from tokenswift.sampling.no_repeat import repeat_followers
from tokenswift.settings import Settings, SettingsError


def test_the_token_that_would_end_a_repeated_run_is_refused():
    windows = torch.tensor([[5, 1, 2, 3, 9, 1, 2, 3],  # "1 2 3" came before, followed by 9: 9 is refused
                            [-1, -1, 1, 2, 3, 7, 2, 3],  # "7 2 3" never came before
                            [1, 2, 3, 4, 1, 2, 3, 4]])  # "2 3 4" came before followed by 1
    def refused(rows, n=4):
        return [sorted({t for t in row if t >= 0}) for row in repeat_followers(torch.tensor(rows), n).tolist()]

    assert refused(windows.tolist()) == [[9], [], [1]]
    assert refused([[-1, -1, -1, 1, 2, 3]]) == [[]]  # padding is no text
    assert refused([[1, 2]]) == [[]]


def runs(ids: list[int], n: int) -> int:
    """How many n-token runs of ids occur again later."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(grams) - len(set(grams))


@pytest.mark.parametrize("sampler", [dict(temperature=0.0), dict(temperature=1.0, min_p=0.1, penalty=1.1,
                                                                 penalty_window=64, dry_multiplier=0.8)])
def test_no_run_is_written_twice_and_tokenswift_and_a_resume_write_plain_decodings_tokens(stories64, sampler):
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=300, seed=3, ignore_eos=True, no_repeat_ngram=6, **sampler)
    ar = Generator(stories64, s, prompt, options=AR).run()
    assert runs(prompt + ar, 6) == 0
    if sampler["temperature"] == 0:  # without the rule the greedy model loops at once
        assert runs(Generator(stories64, s.replace(no_repeat_ngram=0), prompt, options=AR).run(), 6) > 50
    lm = with_heads(stories64, random_heads(stories64, 3))
    assert Generator(lm, s, prompt, options=speed(ngram_topk=20)).run() == ar
    assert Generator(lm, s, prompt, generated_ids=ar[:150]).run() == ar


def test_the_run_length_is_checked():
    for bad in (-1, 1, 3, 65):
        with pytest.raises(SettingsError, match="no_repeat_ngram"):
            Settings(no_repeat_ngram=bad)
