"""TokenSwift emits exactly the tokens of plain decoding (design §3), in float64 where a rounding flip is
practically impossible: over 700 tokens, several samplers, k in {0, 5, 20}, with and without heads, and a
small partial-cache budget so the cache is re-selected many times."""

from __future__ import annotations

import pytest
import torch
from speed import AR, speed
from tiny_models import hf_model, save_checkpoint

from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator
from tokenswift.model.heads import new_heads
from tokenswift.model.loading import load_model
from tokenswift.settings import Settings

N = 700
PROMPT = "The old lighthouse keeper climbed the stairs and"

SAMPLERS = {
    "greedy": dict(temperature=0.0),
    "minp-penalty": dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64),
    "top-p": dict(temperature=1.0, top_p=0.9),
    "eta": dict(temperature=1.0, eta=0.01, min_keep=20),
}
# (drafter, sampler, k, heads, seed, tokens). The paper's drafter: k in {0, 5, 20} each with and without heads,
# across the four samplers and five seeds; one long run, the others long enough for 10+ partial-cache
# re-selections (budget 40 with 16 sinks: one every 24 tokens; 300 tokens give 12). The fused drafter: every sampler,
# k in {0, 20}, with and without heads.
SHORT = 300
CASES = [("paper", "minp-penalty", 20, True, 3, N), ("paper", "greedy", 0, True, 1, SHORT),
         ("paper", "greedy", 20, False, 1, SHORT), ("paper", "minp-penalty", 5, True, 2, SHORT),
         ("paper", "top-p", 0, False, 4, SHORT), ("paper", "eta", 5, False, 5, SHORT),
         ("fused", "greedy", 0, True, 1, SHORT), ("fused", "greedy", 20, False, 1, SHORT),
         ("fused", "minp-penalty", 20, True, 3, SHORT), ("fused", "minp-penalty", 0, True, 2, SHORT),
         ("fused", "top-p", 20, True, 4, SHORT), ("fused", "eta", 20, False, 5, SHORT)]
# The edit-test loop (-m "not slow") keeps one quick case per drafter; the full run takes them all.
QUICK = [("paper", "greedy", 20, False, 1, SHORT), ("fused", "greedy", 20, False, 1, SHORT)]

def random_heads(lm, seed):
    """Odd seeds give heads that read the next token (heads.py), even seeds the paper's heads."""
    heads = new_heads(lm.config, next_token=seed % 2 == 1)
    torch.manual_seed(seed)
    with torch.no_grad():
        for layer in heads.layers:
            layer.linear.weight.normal_(0, 0.02)
        if heads.next_token:
            heads.next_proj.weight.normal_(0, 0.02)
    return heads.to(lm.device, lm.dtype)


def with_heads(lm, heads):
    return type(lm)(lm.name, lm.path, lm.model, lm.tokenizer, lm.hf_config, heads, lm.device, lm.dtype)


@pytest.fixture(scope="module")
def ar_reference(stories64, ar_runs):
    """(the prompt, reference(sampler, seed, n): plain decoding's first n tokens)."""
    prompt = stories64.encode(PROMPT)

    def get(name, seed, n):
        return ar_runs(stories64, Settings(max_new_tokens=n, seed=seed, ignore_eos=True, **SAMPLERS[name]), prompt)

    return prompt, get


@pytest.mark.parametrize(("drafter", "sampler", "k", "heads", "seed", "n"),
                         [c if c in QUICK else pytest.param(*c, marks=pytest.mark.slow) for c in CASES])
def test_tokenswift_equals_ar_on_stories260k(stories64, ar_reference, drafter, sampler, k, heads, seed, n):
    prompt, reference = ar_reference
    lm = with_heads(stories64, random_heads(stories64, seed) if heads else None)
    s = Settings(max_new_tokens=n, seed=seed, ignore_eos=True, **SAMPLERS[sampler])
    gen = Generator(lm, s, prompt, options=speed(ngram_topk=k, budget=40, sinks=16, drafter=drafter))
    tokens = gen.run()
    expected = reference(sampler, seed, n)
    first = next((i for i, (a, b) in enumerate(zip(tokens, expected, strict=True)) if a != b), None)
    assert first is None, f"diverged at token {first}"
    m = gen.metrics()
    assert m.steps < n  # drafts were accepted: this really was speculative decoding
    if drafter == "paper":
        assert gen._engine.drafter.partial.selections > 10  # the partial cache was rebuilt many times


@pytest.mark.slow
def test_fused_drafter_proposes_from_the_heads_vocabulary_only(stories64, ar_reference):
    prompt, reference = ar_reference
    vocab = torch.arange(0, stories64.config.vocab_size, 3)
    lm = with_heads(stories64, random_heads(stories64, 6).with_vocab(vocab))
    s = Settings(max_new_tokens=300, seed=2, ignore_eos=True, **SAMPLERS["minp-penalty"])
    engine = Engine(lm, s, prompt, len(prompt), speed(ngram_topk=0))
    engine.start()
    levels = engine.drafter.propose(engine.root, engine.length, None, 3, engine.length + 1)
    assert len(levels) == 3 and {t for level in levels for t in level} <= set(vocab.tolist())
    assert Generator(lm, s, prompt, options=speed(ngram_topk=0)).run() == reference("minp-penalty", 2, 300)


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory, stories_path):
    directory = tmp_path_factory.mktemp("qwen2")
    save_checkpoint(hf_model("qwen2-bias-gqa", seed=3, max_position_embeddings=4096), directory, stories_path)
    return load_model(str(directory), dtype="float64")


@pytest.mark.slow
@pytest.mark.parametrize(("sampler", "k", "heads"), [("greedy", 20, True), ("minp-penalty", 5, False),
                                                      ("top-p", 0, True)])
def test_tokenswift_equals_ar_on_tiny_qwen2(tiny_qwen, sampler, k, heads):
    prompt = tiny_qwen.encode(PROMPT)
    s = Settings(max_new_tokens=SHORT, seed=9, ignore_eos=True, **SAMPLERS[sampler])
    expected = Generator(tiny_qwen, s, prompt, options=AR).run()
    lm = with_heads(tiny_qwen, random_heads(tiny_qwen, 1) if heads else None)
    assert Generator(lm, s, prompt, options=speed(ngram_topk=k, budget=40, sinks=8)).run() == expected


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "drafter"), [("tokenswift", "fused"), ("tokenswift", "paper"), ("ar", "fused")])
def test_resume_continues_the_same_stream(stories64, mode, drafter):
    # 150 + 150 tokens: the paper drafter's partial cache (budget 48) is re-selected on both sides of the cut (9 times).
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=300, seed=5, ignore_eos=True, **SAMPLERS["minp-penalty"])
    options = speed(mode=mode, budget=48, drafter=drafter)
    lm = with_heads(stories64, random_heads(stories64, 5))
    straight = Generator(lm, s, prompt, options=options).run()
    half = Generator(lm, s.replace(max_new_tokens=150), prompt, options=options).run()
    assert half == straight[:150]
    resumed = Generator(lm, s, prompt, generated_ids=half, options=options).run()
    assert resumed == straight


@pytest.mark.slow
def test_changing_k_and_tree_changes_speed_not_text(stories64):
    prompt = stories64.encode(PROMPT)
    # A tiny budget re-selects the partial cache every few iterations, also when n-gram paths run deeper
    # than the tree.
    s = Settings(max_new_tokens=300, seed=8, **SAMPLERS["greedy"])
    lm = with_heads(stories64, random_heads(stories64, 4))
    texts = {tuple(Generator(lm, s, prompt, options=speed(budget=24, sinks=4, ngram_lag=0, ngram_topk=k,
                                                          tree=tree)).run())
             for k, tree in [(0, (1,)), (20, (1,)), (5, (1, 2)), (20, (1, 3, 3, 3)), (50, (1, 4, 2))]}
    assert len(texts) == 1


@pytest.mark.slow
def test_sliding_window_model_tokenswift_equals_ar(tmp_path, stories_path):
    """Mistral-style local attention: every pass (prefill, AR step, verify) must hide the same old keys."""
    save_checkpoint(hf_model("mistral-window", seed=4, max_position_embeddings=4096), tmp_path, stories_path)
    lm = load_model(str(tmp_path), dtype="float64")
    prompt = lm.encode(PROMPT)
    s = Settings(max_new_tokens=300, seed=3, ignore_eos=True, **SAMPLERS["minp-penalty"])
    expected = Generator(lm, s, prompt, options=AR).run()
    assert Generator(with_heads(lm, random_heads(lm, 2)), s, prompt, options=speed(ngram_lag=0)).run() == expected


@pytest.mark.parametrize(("case", "dtype"), [("stories260k", "bfloat16"), ("mistral-window", "bfloat16"),
                                             ("mistral-window", "float16")])
def test_sixteen_bit_weights_on_a_cpu_keep_plain_decodings_text(tmp_path, stories_path, case, dtype):
    """bfloat16 and float16 on a CPU, where torch rounds a batch of rows unlike one row: a verify pass and a resume's
    replay run their rows one at a time, each as the plain step at its position (Transformer.rows_apart), so
    TokenSwift writes plain decoding's tokens and a resumed run the uninterrupted one's, also under a sliding window.
    Before, bfloat16 TokenSwift parted from plain decoding at token 15 on stories260k."""
    path = stories_path
    if case == "mistral-window":
        path = save_checkpoint(hf_model(case, seed=4, max_position_embeddings=4096), tmp_path, stories_path)
    lm = load_model(str(path), dtype=dtype)
    prompt = lm.encode(PROMPT)
    s = Settings(max_new_tokens=120, seed=3, ignore_eos=True, **SAMPLERS["minp-penalty"])
    expected = Generator(lm, s, prompt, options=AR).run()
    lm, options = with_heads(lm, random_heads(lm, 2)), speed(ngram_topk=5, tree=(1, 2, 2), ngram_lag=0)
    assert Generator(lm, s, prompt, options=options).run() == expected
    assert Generator(lm, s, prompt, generated_ids=expected[:50], options=options).run() == expected


@pytest.mark.slow
def test_banned_end_of_text_is_part_of_the_sampling_rule(tiny_qwen):
    """Seed 1 ends with EOS at token 128; banned, both modes write 600 tokens, the same ones, and nothing
    changes before the point where EOS was drawn."""
    prompt = tiny_qwen.encode(PROMPT)
    rule = dict(max_new_tokens=600, seed=1, **SAMPLERS["minp-penalty"])
    free = Generator(tiny_qwen, Settings(**rule), prompt, options=AR).run()
    assert len(free) == 128 and free[-1] in tiny_qwen.eos_ids
    banned = Settings(ban_eos=True, **rule)
    ar = Generator(tiny_qwen, banned, prompt, options=AR).run()
    ts = Generator(with_heads(tiny_qwen, random_heads(tiny_qwen, 1)), banned, prompt,
                   options=speed(ngram_topk=20, budget=48)).run()
    assert ts == ar and len(ar) == 600 and not set(ar) & set(tiny_qwen.eos_ids)
    assert ar[:127] == free[:127]
