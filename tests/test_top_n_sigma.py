"""Top-nσ (sampler.top_n_sigma_filter): the filter against a direct reading of its definition, its place in the
sampler, and TokenSwift with it on emitting exactly plain decoding's tokens (float64, stories260k: a tree and
n-grams, the adaptive engine, a resume, context shifts); the flag, the API's and the OpenAI endpoint's names."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import pytest
import torch
from speed import AR, speed
from test_context_shift import MEMORY, NARROW, NOTE, first_difference
from test_exactness import PROMPT, random_heads

from tokenswift.cli.main import main
from tokenswift.decode.generate import Generator
from tokenswift.sampling.sampler import Sampler, top_n_sigma_filter
from tokenswift.settings import Settings, SettingsError
from tokenswift.text.context_window import pinned_ids
from ui.api.openai_input import OpenAIError, parse_options


def reference(row: list[float], n: float) -> list[bool]:
    """Which tokens the definition keeps: logit >= max − n·σ, σ over the finite logits (population)."""
    finite = [x for x in row if math.isfinite(x)]
    top, sigma = max(finite), statistics.pstdev(finite)
    return [math.isfinite(x) and x >= top - n * sigma for x in row]


def test_top_n_sigma_keeps_what_its_definition_keeps():
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        vocab = int(torch.randint(2, 60, (), generator=gen))
        row = torch.randn(vocab, dtype=torch.float64, generator=gen) * float(torch.rand((), generator=gen) * 5)
        row[torch.rand(vocab, generator=gen) < 0.2] = -math.inf  # an earlier rule's bans: not counted in σ
        row[int(torch.randint(0, vocab, (), generator=gen))] = 3.0  # at least one finite logit
        n = [0.5, 1.0, 2.0, 3.5][trial % 4]
        kept = torch.isfinite(top_n_sigma_filter(row[None], n))[0].tolist()
        assert kept == reference(row.tolist(), n)
    out = top_n_sigma_filter(torch.tensor([[1.0, 2.0, 3.0, 10.0]], dtype=torch.float64), 1.0)
    assert out[0, :3].isinf().all() and out[0, 3] == 10.0  # σ ≈ 3.5: only the clear favourite is left


def test_top_n_sigma_sits_after_the_temperature_and_does_not_depend_on_it():
    logits = torch.randn(1, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    kept = [torch.isfinite(Sampler(Settings(temperature=t, top_n_sigma=1.0), 50, "cpu").process(logits, None))
            for t in (0.5, 1.0, 1.7)]
    assert torch.equal(kept[0], kept[1]) and torch.equal(kept[1], kept[2]) and 1 <= int(kept[0].sum()) < 50
    assert torch.isfinite(Sampler(Settings(), 50, "cpu").process(logits, None)).all()  # 0 = off
    for bad in (-1.0, math.nan, 101.0):
        with pytest.raises(SettingsError, match="top_n_sigma"):
            Settings(top_n_sigma=bad)


CASES = [("fused", 20, False, 1, dict(temperature=1.0, top_n_sigma=1.0)),
         ("fused", 20, True, 2, dict(temperature=1.5, top_n_sigma=1.0, min_p=0.01, penalty=1.2, penalty_window=32)),
         ("paper", 5, False, 3, dict(temperature=1.2, top_n_sigma=0.7, dry_multiplier=0.8, dry_range=64))]


@pytest.mark.slow
@pytest.mark.parametrize(("drafter", "k", "adaptive", "seed", "sampling"), CASES)
def test_tokenswift_equals_ar_with_top_n_sigma(stories64, drafter, k, adaptive, seed, sampling):
    lm, s, prompt, expected, ts = check_exact_and_acting(stories64, drafter, k, adaptive, seed, sampling,
                                                         {"top_n_sigma": 0.0})
    resumed = Generator(lm, s, prompt, generated_ids=expected[:150], options=ts)
    assert first_difference(resumed.run(), expected) is None


def check_exact_and_acting(stories64, drafter, k, adaptive, seed, sampling: dict, off: dict):
    """TokenSwift writes plain decoding's 300 tokens with `sampling`, and turning the sampler `off` changes them.
    Returns (the model with heads, the settings, the prompt, plain decoding's tokens, TokenSwift's options)."""
    lm = dataclasses.replace(stories64, heads=random_heads(stories64, 3))
    prompt = lm.encode(PROMPT)
    s = Settings(max_new_tokens=300, seed=seed, ignore_eos=True, **sampling)
    ts = speed(ngram_topk=k, budget=48, drafter=drafter)
    expected = Generator(lm, s, prompt, options=AR).run()
    assert expected != Generator(lm, s.replace(**off), prompt, options=AR).run()  # it acts here
    adapting = dataclasses.replace(ts, adaptive=adaptive)
    assert first_difference(Generator(lm, s, prompt, options=adapting).run(), expected) is None
    return lm, s, prompt, expected, ts


@pytest.mark.slow
def test_tokenswift_equals_ar_with_top_n_sigma_across_shifts(stories64):
    lm = dataclasses.replace(stories64, heads=random_heads(stories64, 3))
    prompt, pinned = lm.encode(PROMPT), pinned_ids(lm, MEMORY, NOTE)
    s = Settings(max_new_tokens=300, seed=5, ignore_eos=True, context_window=NARROW, note_depth=100,
                 temperature=1.3, top_n_sigma=1.5)
    expected = Generator(lm, s, prompt, options=AR, pinned=pinned).run()
    gen = Generator(lm, s, prompt, options=speed(tree=(1, 2, 2)), pinned=pinned)
    assert first_difference(gen.run(), expected) is None and gen.metrics().shifts >= 3
    resumed = Generator(lm, s, prompt, generated_ids=expected[:170], options=speed(tree=(1, 2, 2)),
                        pinned=pinned)  # past a shift
    assert first_difference(resumed.run(), expected) is None


def test_the_flag_reaches_the_settings(stories_path, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "16",
                 "--warmup-tokens", "0", "--top-n-sigma", "1.5", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["identical"] and result["settings"]["top_n_sigma"] == 1.5
    capsys.readouterr()
    code = main(["generate", "--model", str(stories_path), "--prompt", PROMPT, "--max-new-tokens", "3",
                 "--top-n-sigma", "-2"])
    assert code == 2 and capsys.readouterr().err.startswith("error: top_n_sigma:")


def test_openai_clients_names_for_top_n_sigma():
    assert parse_options({"top_n_sigma": 1.5}, "completion").settings.top_n_sigma == 1.5
    assert parse_options({"nsigma": 2}, "chat").settings.top_n_sigma == 2.0  # KoboldCpp's name
    assert parse_options({"top_n_sigma": -1}, "completion").settings.top_n_sigma == 0.0  # llama.cpp's "off"
    with pytest.raises(OpenAIError) as error:
        parse_options({"nsigma": 500}, "completion")
    assert error.value.param == "nsigma" and error.value.status == 400
