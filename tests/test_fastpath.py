"""The fast path (fastpath.py) and the adaptive candidate batch (adaptive.py).

On a CPU, in float64: every static-shape pass (AR, draft, verify; each attention kernel) gives the eager
model's logits, last-layer states, queries, K/V and sampled tokens; the FlexAttention block mask visits
exactly the filled blocks, over a span sized to the filled length; a packed verify pass traces as one graph
whose device-side lengths never force a recompile (what CUDA-graph capture needs); sampling on the device
equals the host sampler node by node; the RoPE table is built once; and the engine emits the same tokens
with the fast path (either drafter) or the adaptive batch as plain decoding does. Tests marked `cuda` check
graph capture and replay on a device (`pytest -m cuda`); they skip without one.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from speed import AR, speed

from tokenswift.bench.shapes import preset, random_heads, random_model
from tokenswift.decode.adaptive import CandidatePolicy, Shape, accepted_under, best_shape, ladder
from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.draft import drafting
from tokenswift.model import fastpath
from tokenswift.model.attention import ATTENTION, BLOCK, FlexAttention, Visible, effective_kind
from tokenswift.model.fastpath import FastOptions, FastPasses, Pass
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import ROPE_SLACK
from tokenswift.model.masks import causal_mask, with_prefix
from tokenswift.sampling.in_graph import DeviceSampler, pack_verify_inputs, trie_paths
from tokenswift.sampling.sampler import Sampler
from tokenswift.sampling.trie import build_trie, verify_inputs
from tokenswift.settings import PLAIN, Settings, SettingsError, Speculation

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
PROMPT = "The old lighthouse keeper climbed the stairs and"
MINP = dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64)
K20 = Speculation(ngram_topk=20, budget=48)  # n-grams on, a partial cache re-selected every 44 tokens


def tiny(name: str, device="cpu", dtype=torch.float64):
    return random_model(name, *preset(name, tiny=True), device, dtype)


def new_cache(lm, capacity: int) -> KVCache:
    cfg = lm.config
    return KVCache(cfg.n_layers, cfg.n_kv_heads, capacity, cfg.head_dim, lm.device, lm.dtype)


def random_trie(vocab: int, widths=(1, 3, 2), k: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    levels = [torch.randint(vocab, (w,), generator=g).tolist() for w in widths]
    paths = [(levels[0][0], *torch.randint(vocab, (3,), generator=g).tolist()) for _ in range(k)]
    return build_trie(int(torch.randint(vocab, (1,), generator=g)), levels, paths), Shape(tuple(widths), k)


def prefilled_pair(lm, length: int, capacity: int, seed: int = 0):
    """Two caches holding the same prefix: one for the eager model, one for the fast pass; and the ids
    (a buffer of `capacity` slots, slot = position, as the engine keeps them)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(lm.config.vocab_size, (capacity,), generator=g).to(lm.device)
    caches = []
    for _ in range(2):
        cache = new_cache(lm, capacity)
        pos = torch.arange(length, device=lm.device)
        lm.model(ids[:length], pos, cache, 0, causal_mask(0, length, pos, None, lm.device), logits="none")
        caches.append(cache)
    return ids, caches


def close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return (a.double() - b.double()).abs().max().item() <= tol * max(1.0, b.double().abs().max().item())


def path_of(trie, node: int) -> list[int]:
    path = []
    while node > 0:
        path.insert(0, trie.tokens[node])
        node = trie.parents[node]
    return path


def host_targets(sampler, logits, trie, ids, start: int, w: int) -> list[int]:
    """The engine's lazy walk sampling, node by node: window = last w of ids[:start+1] + the node's path."""
    history = ids[: start + 1].tolist()
    out = []
    for i in range(len(trie.tokens)):
        path = path_of(trie, i)
        window = torch.tensor((history + path)[-w:], device=logits.device)[None] if w else None
        out.append(int(sampler.sample(logits[i:i + 1], window, [start + len(path) + 1])[0]))
    return out


# -- the passes against the eager model -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kind"), [("llama3.1-8b", "sdpa"), ("llama3.1-8b", "flex"),
                                            ("qwen2.5-1.5b", "flex-fold"), ("qwen2.5-1.5b", "sdpa")])
def test_passes_match_the_eager_model(name, kind):
    lm = tiny(name)
    model, length, capacity = lm.model, 150, 300  # 150 crosses a 128-slot block: full and partial blocks
    ids, (eager, fast) = prefilled_pair(lm, length, capacity)
    sampler = Sampler(Settings(seed=3, **MINP), lm.config.vocab_size, "cpu")
    passes = FastPasses(lm, fast, FastOptions(attention=kind, bucket=64), sampler, ids)
    token = ids[length:length + 1]
    with torch.inference_mode():
        # AR: the token at slot `length`, then the one sampled for position length + 1 in the same graph
        out = model(token, torch.tensor([length]), eager, length)
        ref = out.logits
        logits, hidden = passes.ar(token, length)
        assert close(logits, ref, 1e-10) and close(hidden, out.hidden, 1e-10)
        window = ids[length + 1 - 64:length + 1][None]
        assert passes.ar_token(length)[0] == int(sampler.sample(ref, window, [length + 1])[0])
        assert close(fast.k[:, :, :length + 1], eager.k[:, :, :length + 1], 1e-12)  # its K/V, at slot `length`
        assert close(fast.v[:, :, :length + 1], eager.v[:, :, :length + 1], 1e-12)
        # verify: a padded tree batch right after it
        trie, shape = random_trie(lm.config.vocab_size)
        tokens, positions, tree = verify_inputs(trie, length + 1, shape.slots)
        mask = with_prefix(tree, length + 1, positions, None)
        ref = model(tokens, positions, eager, length + 1, mask, capture_queries=True)
        logits, queries, targets, hidden, _ = passes.verify(trie, length + 1, shape.slots)
        assert close(logits, ref.logits, 1e-10) and close(hidden, ref.hidden, 1e-10)
        assert close(queries, torch.stack(ref.queries), 1e-12)
        assert targets == host_targets(sampler, ref.logits, trie, ids, length + 1, 64)
        # draft: the root over a partial cache, with the base head and three chained draft heads
        partial_e, partial_f = new_cache(lm, 41), new_cache(lm, 41)
        for partial in (partial_e, partial_f):
            partial.k[:, :, :40], partial.v[:, :, :40] = eager.k[:, :, 100:140], eager.v[:, :, 100:140]
        out = model(token, torch.tensor([length]), partial_e, 40)
        ref = torch.cat([out.logits] + [model.head(s) for s in lm.heads(out.hidden)])
        assert close(passes.draft(partial_f, int(ids[length]), length, 40, rows=4), ref, 1e-10)


@pytest.mark.slow
def test_flex_passes_are_built_for_a_power_of_two_above_the_filled_length(monkeypatch):
    """Not the cache's capacity: the decoding kernel sizes its split-KV tiles by the KV length it is given."""
    monkeypatch.setattr(fastpath, "FLEX_MIN_SPAN", 128)
    lm = tiny("llama3.1-8b")
    capacity = 1000
    ids, (eager, fast) = prefilled_pair(lm, 600, capacity)
    passes = FastPasses(lm, fast, FastOptions(attention="flex"))
    with torch.inference_mode():
        for n in (100, 200, 300, 600):
            token = ids[n:n + 1]
            ref = lm.model(token, torch.tensor([n]), eager, n).logits
            assert close(passes.ar(token, n)[0], ref, 1e-10)
            trie, shape = random_trie(lm.config.vocab_size, seed=n)
            tokens, positions, tree = verify_inputs(trie, n + 1, shape.slots)
            ref = lm.model(tokens, positions, eager, n + 1, with_prefix(tree, n + 1, positions, None)).logits
            assert close(passes.verify(trie, n + 1, shape.slots)[0], ref, 1e-10)
    spans = sorted({p.attention.span for p in passes.passes.values()})
    assert spans == [128, 256, 512, 1000]  # 101 -> 128, ..., 601 + 28 rows -> 1024, capped at the capacity
    # Every pass calls the loaded model's one flex kernel (compiled once per model on CUDA), none of its own.
    assert all(p.attention.kernel is lm.flex for p in passes.passes.values())


@pytest.mark.parametrize("fold", [False, True])
def test_block_mask_visits_only_the_filled_blocks(fold):
    lm = tiny("llama3.1-8b")
    t, capacity = 3, 5 * BLOCK + 17
    visible = Visible(t, capacity, "cpu")
    visible.tree.copy_(torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool))
    flex = FlexAttention(lm.model, visible, fold=fold)
    group = lm.config.group if fold else 1
    rows, cols = torch.arange(group * t)[:, None], torch.arange(capacity)[None, :]
    for start in (0, 5, BLOCK - 2, BLOCK, 200, capacity - t):
        visible.start.fill_(start)
        flex.prepare()
        bm, blocks = flex.block_mask, cols // BLOCK
        full = torch.zeros(flex.kv_blocks, dtype=torch.bool)
        full[bm.full_kv_indices[0, 0, 0, : int(bm.full_kv_num_blocks[0, 0, 0])].long()] = True
        part = torch.zeros(flex.kv_blocks, dtype=torch.bool)
        part[bm.kv_indices[0, 0, 0, : int(bm.kv_num_blocks[0, 0, 0])].long()] = True
        assert not (full & part).any()
        last = math.ceil((start + t) / BLOCK)
        assert not (full | part)[last:].any(), "a block beyond the filled length is read"
        mod = bm.mask_mod(0, 0, rows, cols)
        assert mod[:, full[blocks[0]]].all(), "a block marked full must need no mask"
        dense = full[blocks] | (part[blocks] & mod)
        assert torch.equal(dense, visible.mask(capacity).repeat(group, 1))


def test_kernel_choice_follows_the_group_size():
    assert effective_kind("auto", preset("llama3.1-8b")[0]) == "flex"  # group 4: GQA decoding kernel
    assert effective_kind("auto", preset("qwen2.5-7b")[0]) == "flex-fold"  # group 7: folded rows
    assert effective_kind("flex", preset("qwen2.5-1.5b", tiny=True)[0]) == "flex"
    lm = tiny("llama3.1-8b")
    options = {t: FlexAttention(lm.model, Visible(t, 300, "cpu"), fold=False).kernel_options
               for t in (1, 27, 121)}
    assert options == {1: None, 27: None, 121: {"BLOCK_M": BLOCK}}  # 4 * 121 rows: tile capped at 128


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flex", "flex-fold", "sdpa"])
def test_a_pass_is_one_graph_for_every_length(kind):
    """fullgraph tracing fails on any host sync or data-dependent branch, and a second call at another
    length must reuse the graph: what capturing it once as a CUDA graph requires."""
    lm = tiny("qwen2.5-1.5b", dtype=torch.float32)
    vocab = lm.config.vocab_size
    # a verify pass as the engine captures it: packed inputs, sampling every row inside the graph
    sampler = DeviceSampler(Sampler(Settings(seed=3, **MINP), vocab, "cpu"), torch.randint(vocab, (400,)))
    p = Pass(lm.model, new_cache(lm, 400), 5, kind, 256, "none", queries=True, sampler=sampler, packed=True)
    trie = build_trie(7, [[3, 4], [5]], [])
    compiled = []

    def backend(gm, example_inputs):
        compiled.append(gm)
        return gm.forward

    torch._dynamo.reset()
    run = torch.compile(p._compute, backend=backend, fullgraph=True)
    with torch.inference_mode():
        for start in (150, 170, 40):
            pack_verify_inputs(trie, start, 5, True, p.inputs)
            run()
            expected, sampled = p.logits.clone(), p.sampled.clone()
            p()
            assert torch.equal(p.logits, expected) and torch.equal(p.sampled, sampled)
            assert torch.equal(p.visible.tree, verify_inputs(trie, start, 5)[2])
    assert len(compiled) == 1


# -- batched target sampling ---------------------------------------------------------------------------


@pytest.mark.parametrize(("w", "temperature"), [(0, 1.0), (3, 1.0), (64, 1.0), (64, 0.0)])
def test_device_sampling_equals_the_host_sampler_node_by_node(w, temperature):
    vocab, start = 512, 40
    trie, _ = random_trie(vocab, widths=(1, 3, 3), k=5, seed=3)
    rows = len(trie.tokens) + 3  # padded like a verify batch
    settings = Settings(temperature=temperature, min_p=0.05, penalty=1.5, penalty_window=w, seed=4)
    sampler = Sampler(settings, vocab, "cpu")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(vocab, (100,), generator=g)
    logits = torch.randn(rows, vocab, generator=g, dtype=torch.float64)
    depths = torch.tensor(trie.depths + [0] * 3)
    tokens = DeviceSampler(sampler, ids)(logits, torch.tensor(start), start + depths, trie_paths(trie, rows))
    assert tokens[: len(trie.tokens)].tolist() == host_targets(sampler, logits, trie, ids, start, w)


# -- the engine: same tokens with the fast path and the adaptive batch --------------------------------------


def ar_tokens(lm, settings, prompt):
    return Generator(lm, settings, prompt, options=AR).run()


def with_heads(lm):
    """A copy of the shared fixture with random draft heads (never mutate the fixture)."""
    return dataclasses.replace(lm, heads=random_heads(lm.config, lm.device, lm.dtype, seed=2))


@pytest.mark.slow
def test_the_rope_table_is_built_once_for_the_whole_context(stories64):
    """Captured graphs read the RoPE table: engines of any size use the one built at load, and what would not
    fit it is refused before a run starts."""
    table = stories64.model.rope_cos
    assert table.shape[0] == stories64.max_context + ROPE_SLACK
    prompt = stories64.encode(PROMPT)
    for n in (10, 400):
        Generator(stories64, Settings(max_new_tokens=n, ignore_eos=True), prompt).run()
        assert stories64.model.rope_cos is table
    with pytest.raises(ValueError, match="RoPE table"):
        stories64.check_positions(table.shape[0] + 1)
    with pytest.raises(SettingsError, match="candidate rows"):
        Generator(stories64, Settings(), prompt, options=speed(tree=(1, 40, 40), ngram_topk=0))


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["paper", "fused"])
def test_fast_engine_emits_the_same_tokens(stories64, drafter):
    """Both drafters on the static-shape passes: the fused one drafts from the states the AR and verify passes
    leave in their buffers."""
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=200, seed=2, ignore_eos=True, **MINP)
    expected = ar_tokens(stories64, s, prompt)
    lm = with_heads(stories64)
    fast = EngineOptions(fast=FastOptions(attention="sdpa", bucket=64),
                         speculation=Speculation(ngram_topk=5, tree=(1, 2, 2), budget=48, drafter=drafter))
    assert Generator(lm, s, prompt, options=fast.speculating(mode="ar")).run() == expected
    gen = Generator(lm, s, prompt, options=fast)
    assert gen.run() == expected
    assert gen.metrics().verify_batch == 1 + (1 + 2 + 4) + 5 * 4  # padded to the fixed batch


@pytest.mark.slow
def every_shape_runs(monkeypatch) -> None:
    """Rule no shape out as too slow to pay (adaptive._hopeless): the tests below are about what each shape writes
    and how its passes are kept, not whether it pays on this machine."""
    monkeypatch.setattr(CandidatePolicy, "_hopeless", lambda policy, i: False)


def test_adaptive_batch_keeps_the_text(stories64, monkeypatch):
    every_shape_runs(monkeypatch)
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=300, seed=2, ignore_eos=True, **MINP)
    expected = ar_tokens(stories64, s, prompt)
    lm = with_heads(stories64)
    gen = Generator(lm, s, prompt, options=EngineOptions(adaptive=True, speculation=K20))
    assert gen.run() == expected
    batches = gen.metrics().verify_batches
    sizes = {str(shape.slots) for shape in ladder((3, 3, 3), 20)}  # the fused drafter's: 120 ... 2 rows
    assert set(batches) == sizes  # every shape ran (at least its warm-up)
    assert str(gen.metrics().to_dict()["verify_batch"]) in sizes
    # with the fast path too: each shape is its own fixed-size pass
    both = EngineOptions(fast=FastOptions(attention="sdpa", bucket=128), adaptive=True, speculation=K20)
    assert Generator(lm, s.replace(max_new_tokens=120), prompt, options=both).run() == expected[:120]


def test_adaptive_without_heads_or_ngrams_takes_plain_steps(stories64):
    """Nothing to draft (a model without heads, k = 0): the policy has no shape, and every step is a plain one."""
    assert ladder((), 0) == []
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=60, seed=2, ignore_eos=True, **MINP)
    gen = Generator(stories64, s, prompt, options=EngineOptions(adaptive=True, speculation=Speculation(
        ngram_topk=0, drafter="fused")))
    assert gen.run() == ar_tokens(stories64, s, prompt)
    assert gen.metrics().to_dict()["plain_share"] == 1.0


@pytest.mark.slow
def test_fast_passes_are_bounded_least_recently_used_first(stories64, monkeypatch):
    """Many spans and batch shapes (adaptive, a 32-slot bucket) through a bound of 4 passes: never more are kept,
    and evicted passes built again give the same text."""
    every_shape_runs(monkeypatch)
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=300, seed=2, ignore_eos=True, **MINP)
    expected = ar_tokens(stories64, s, prompt)
    opts = EngineOptions(fast=FastOptions(attention="sdpa", bucket=32, max_passes=4), adaptive=True, speculation=K20)
    gen = Generator(with_heads(stories64), s, prompt, options=opts)
    kept = []
    for _ in gen.steps():
        kept.append(len(gen._engine.fast.passes))
    assert gen.produced == expected
    assert max(kept) == 4 and len(set(gen.metrics().verify_batches)) > 4  # more shapes ran than were kept
    with pytest.raises(ValueError, match="max_passes"):
        FastOptions(max_passes=0)


class PlainWhenever(CandidatePolicy):
    """The real policy with its timing comparison fixed to "plain is faster" and its exploring share to
    plain_explore_share, so the seams between plain steps and verify passes fall at the same places on any
    machine."""

    def _plain_is_faster(self, best: int) -> bool:
        return True

    def _plain_share(self, best: int) -> float:
        return self.plain_explore_share


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["paper", "fused"])
def test_plain_steps_inside_tokenswift_keep_the_text(stories64, drafter):
    prompt = stories64.encode(PROMPT)
    # budget 48: a partial-cache selection is due every 44 tokens, often in the middle of a plain stretch;
    # the fused drafter drafts from the plain step's own state
    s = Settings(max_new_tokens=300, seed=2, ignore_eos=True, **MINP)
    expected = ar_tokens(stories64, s, prompt)
    engine = Engine(with_heads(stories64), s, prompt, len(prompt),
                    EngineOptions(adaptive=True, speculation=K20.replace(drafter=drafter)))
    out = engine.start()
    # exploring for as long as the plain steps took: a verify pass after every few plain steps
    engine.policy = PlainWhenever(ladder(engine.drafter.widths, K20.ngram_topk), plain_explore_share=1.0)
    while len(out) < s.max_new_tokens:
        out += engine.ts_step().tokens
    assert out[: s.max_new_tokens] == expected
    m = engine.metrics.to_dict()
    assert m["plain_steps"] > 0 and m["steps"] > 8  # the warm-up, explorations and forced selections
    if drafter == "paper":
        assert engine.drafter.partial.selections >= 5
    assert m["tokens_per_step"] >= 1.0 and 0 < m["plain_share"] < 1


class FixedTimes(PlainWhenever):
    """Plain steps of 10 ms and iterations that draft of 20 ms, whatever the machine: the stretches of plain steps
    between two explorations are as long on any machine."""

    def observe_plain(self, seconds: float) -> None:
        super().observe_plain(0.01)

    def observe(self, levels, paths, accepted, seconds, switch_s=0.0) -> None:
        super().observe(levels, paths, accepted, None if seconds is None else 0.02, 0.0)


@pytest.mark.parametrize("guess", ["policy", "always plain"])
def test_a_plain_stretch_on_the_fast_path_skips_the_drafts_it_would_not_use(stories64, monkeypatch, guess):
    """The plain gear's pass makes the fused drafter's next proposals only where the next iteration may draft
    (CandidatePolicy.plain_next): on a GPU they cost 18% of the default model's plain step. Where the guess is
    wrong (always plain), the drafter makes them itself. Either way the text is plain decoding's."""
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=160, seed=2, ignore_eos=True, **MINP)
    expected = ar_tokens(stories64, s, prompt)
    monkeypatch.setattr(drafting, "ONE_READ_DEVICES", drafting.ONE_READ_DEVICES | {"cpu"})  # CUDA's drafts in passes
    engine = Engine(with_heads(stories64), s, prompt, len(prompt), EngineOptions(
        fast=FastOptions(attention="sdpa", bucket=128), adaptive=True, speculation=K20.replace(drafter="fused")))
    out = engine.start()
    # an exploration once plain steps took 0.02 / 0.3 s: every 7th iteration
    engine.policy = FixedTimes(ladder(engine.drafter.widths, K20.ngram_topk), plain_explore_share=0.3)
    if guess == "always plain":
        engine.policy.plain_next = lambda: True
    engine.clock.last_probe = math.inf  # no time-saved probe: each plain pass below is the plain gear's
    with_drafts, ar_token = [], engine.fast.ar_token

    def counted(n: int, drafts: bool = False):
        with_drafts.append(drafts)
        return ar_token(n, drafts)

    monkeypatch.setattr(engine.fast, "ar_token", counted)
    while len(out) < s.max_new_tokens:
        out += engine.ts_step().tokens
    assert out[: s.max_new_tokens] == expected
    m = engine.metrics.to_dict()
    assert m["steps"] > 10 and 0 < m["plain_share"] < 1  # explorations between stretches of plain steps
    if guess == "policy":  # the two plain steps before each exploration
        assert 0.2 < sum(with_drafts) / len(with_drafts) < 0.45
    else:
        assert not any(with_drafts)


# -- the policy -------------------------------------------------------------------------------------------


def test_ladder_is_sized_and_the_first_shape_contains_the_others():
    shapes = ladder((1, 3, 3, 3), 20)
    assert [s.slots for s in shapes] == [121, 56, 28, 13, 5, 3, 2]
    for big, small in zip(shapes, shapes[1:], strict=False):  # the paper drafter's shapes form a chain
        assert big.contains(small) and not small.contains(big)
    assert [s.slots for s in ladder((1,), 0)] == [2]
    fused = ladder((3, 3, 3), 20)  # the fused drafter's tree, then its stars: 3 or 2 guesses of the first head
    assert [s.slots for s in fused] == [120, 55, 31, 12, 4, 3, 2, 4, 3]
    assert [s.widths for s in fused[-2:]] == [(3,), (2,)] and all(s.k == 0 for s in fused[-2:])
    assert all(fused[0].contains(s) for s in fused)
    assert not fused[4].contains(fused[-1]) and not fused[-1].contains(fused[4])  # chain and star of 4 rows
    assert [(s.widths, s.k) for s in ladder((), 20)] == [((), 20), ((), 10), ((), 5), ((), 2), ((), 1)]


def test_an_iteration_updates_only_the_shapes_its_own_contains():
    chain, star = Shape((1, 1, 1), 0), Shape((3,), 0)
    policy = CandidatePolicy([Shape((3, 3, 3), 0), chain, star])
    levels = [[4, 5, 6], [7, 8, 9], [1, 2, 3]]
    policy.current = 1  # the chain ran and its first guess was wrong: the star's third guess was right
    policy.observe(chain.cut(levels), [], [], 0.01)
    assert policy.tokens == [None, 1.0, None]  # the chain's outcome says nothing about the star
    policy.current = 0
    policy.observe(levels, [], [6], 0.01)
    assert policy.tokens == [2.0, 1.0, 2.0]  # the full tree's does, for both


def test_accepted_under_a_smaller_shape():
    levels = [[7], [1, 2, 3], [4, 5, 6]]
    paths = [(7, 9, 9, 9), (7, 2, 8, 8)]
    full, small = Shape((1, 3, 3), 2), Shape((1, 1, 1), 1)
    assert accepted_under(full, levels, paths, [7, 3, 6]) == 3
    assert accepted_under(small, levels, paths, [7, 3, 6]) == 1  # 3 is beyond width 1 at depth 2
    assert accepted_under(small, levels, paths, [7, 9, 9, 9]) == 4  # the first n-gram path survives k=1
    assert accepted_under(small, levels, paths, [7, 2, 8, 8]) == 1  # the second does not
    assert accepted_under(full, levels, paths, []) == 0


def test_best_shape_maximises_tokens_per_second():
    assert best_shape([4.0, 3.0, 2.0], [0.040, 0.020, 0.019]) == 1
    assert best_shape([4.0, 3.0], [0.010, 0.010]) == 0
    assert best_shape([None, 2.0], [None, 0.01]) == 1


def test_token_estimate_is_a_mean_at_first_then_a_slow_average():
    shape = Shape((1,), 0)
    policy = CandidatePolicy([shape], token_decay=0.25)
    levels = [[5]]
    for accepted in ([5], [], [], []):  # 2, 1, 1, 1 tokens
        policy.choose(plain_ok=False)
        policy.observe(shape.cut(levels), [], accepted, 0.01)
    assert policy.tokens[0] == pytest.approx(1.25)  # the mean of the first four: none lingers
    policy.choose(plain_ok=False)
    policy.observe(shape.cut(levels), [], [5], 0.01)
    assert policy.tokens[0] == pytest.approx(1.25 + 0.25 * (2 - 1.25))  # then the moving average


def test_one_slow_iteration_moves_a_shapes_time_not_at_all():
    shape = Shape((1,), 0)
    policy = CandidatePolicy([shape])
    for seconds in (0.5, 0.01, 0.01, 0.01, 1.0):  # the first (one-off costs) is not kept; the last, a burst
        policy.choose(plain_ok=False)
        policy.observe(shape.cut([[5]]), [], [], seconds)
    assert policy.seconds[0] == 0.01
    for _ in range(2):  # a lasting change takes over in two timings
        policy.choose(plain_ok=False)
        policy.observe(shape.cut([[5]]), [], [], 1.0)
    assert policy.seconds[0] == 1.0


def test_policy_moves_to_a_smaller_batch_when_verify_gets_expensive():
    shapes = ladder((1, 3, 3, 3), 20)[:4]
    policy = CandidatePolicy(shapes, explore_every=8)
    levels, paths = [[5], [1, 2, 3], [1, 2, 3], [1, 2, 3]], []
    cost = {121: 0.050, 56: 0.020, 28: 0.015, 13: 0.012}  # long context: big batches are compute-bound
    picks = []
    for _ in range(60):
        shape = policy.choose()
        picks.append(shape.slots)
        policy.observe(shape.cut(levels), paths, [5, 1, 1], cost[shape.slots])  # top-1 path: 3 accepted
    assert picks[:8] == [13, 13, 28, 28, 56, 56, 121, 121]  # warm-up: each shape twice, smallest first
    assert picks[-10:].count(13) >= 8  # every shape accepts the top-1 path here: the cheapest wins


def test_retiming_other_shapes_keeps_within_its_share_of_the_time():
    shapes = ladder((1, 3, 3, 3), 20)[:4]
    policy = CandidatePolicy(shapes, explore_every=8, explore_share=0.05)
    levels, paths = [[5], [1, 2, 3], [1, 2, 3], [1, 2, 3]], []
    cost = {121: 0.5, 56: 0.1, 28: 0.05, 13: 0.01}  # a CPU: every shape accepts the same, the big ones cost
    spent = {slots: 0.0 for slots in cost}
    for i in range(1000):
        shape = policy.choose()
        policy.observe(shape.cut(levels), paths, [5, 1, 1], cost[shape.slots])
        if i >= 8:  # after the warm-up
            spent[shape.slots] += cost[shape.slots]
    others = sum(spent.values()) - spent[13]
    assert spent[28] > 0 and spent[56] > 0  # still re-timed as the context grows
    assert others <= 0.06 * sum(spent.values())  # the 0.5 s shape fits the share once in 10 s of passes


def test_policy_takes_plain_steps_only_while_they_are_faster():
    shapes = ladder((1, 3, 3, 3), 20)[:4]
    levels, paths = [[5], [1, 2, 3], [1, 2, 3], [1, 2, 3]], []

    def warmed(**kw) -> CandidatePolicy:
        policy = CandidatePolicy(shapes, explore_every=8, **kw)
        for _ in range(8):  # warm-up; every shape then emits 2 tokens per iteration (1 draft token accepted)
            shape = policy.choose()
            policy.observe(shape.cut(levels), paths, [5], 0.25)
        policy.observe_plain(0.0625)  # 16 tokens/s against 8 (times exact in binary: no rounding at 0.25)
        return policy

    # a verify pass once plain steps took 0.25 / 0.5 s (the shapes write at half plain decoding's speed: a sixth of
    # the share)
    policy = warmed(plain_explore_share=3.0)
    picks, plain_next = [], []
    for _ in range(17):
        plain_next.append(policy.plain_next())
        shape = policy.choose()
        picks.append(shape)
        if shape is None:
            policy.observe_plain(0.0625)
        else:
            policy.observe(shape.cut(levels), paths, [5], 0.25)
    # 8 plain steps of 0.0625 s (one of them observed in the warm-up), a verify pass, 8 more, a verify pass
    assert [p is None for p in picks] == [True] * 7 + [False] + [True] * 8 + [False]
    # Whether the iteration after each is surely plain too: not for the two plain steps before a verify pass (the
    # slack), nor for the pass itself
    assert plain_next[:-1] == [True] * 5 + [False] * 3 + [True] * 6 + [False] * 2
    assert policy.choose(plain_ok=False) is not None  # a due partial-cache selection needs a verify pass
    policy.observe_plain(1.0)  # one slow step (another process's burst) moves nothing
    assert policy.plain_seconds == 0.0625
    policy.observe_plain(1.0)  # plain steps got slower than the verify passes (~2 against 8 tokens/s)
    assert all(policy.choose() is not None for _ in range(20))
    off = warmed(plain_explore_share=None)  # plain steps off: shapes only, however fast plain is
    assert all(off.choose() is not None for _ in range(20))


def test_while_drafting_a_plain_step_now_and_then_keeps_the_plain_time_current():
    """A plain time measured once, in a slow moment, must not hold the policy to drafting: while a shape is faster but
    within PLAIN_CHECK_MARGIN, one plain step is taken each time drafting took 1 / plain_explore_share plain steps,
    and a faster plain time then sends the policy to plain steps. Far ahead of plain steps (a GPU), or with plain
    steps off, it never checks."""
    shapes = ladder((1, 3, 3, 3), 20)[:4]
    levels, paths = [[5], [1, 2, 3], [1, 2, 3], [1, 2, 3]], []

    def drafting(plain_s: float, **kw) -> tuple[CandidatePolicy, list[bool]]:
        policy = CandidatePolicy(shapes, explore_every=8, **kw)
        for _ in range(8):
            shape = policy.choose()
            policy.observe(shape.cut(levels), paths, [5], 0.25)  # 2 tokens a pass: 8 tokens/s
        policy.observe_plain(plain_s)
        picks = []
        for _ in range(12):
            shape = policy.choose()
            picks.append(shape is None)
            if shape is None:
                break
            policy.observe(shape.cut(levels), paths, [5], 0.25)
        return policy, picks

    # a burst: 0.15 s, 6.7 tokens/s; after 0.3 s of drafting (0.15 s / 0.5), a plain step
    policy, picks = drafting(0.15, plain_explore_share=0.5)
    assert picks == [False, False, True]
    policy.observe_plain(0.0625)
    policy.observe_plain(0.0625)
    assert policy.choose() is None  # the median of the latest three: plain steps are faster now
    assert drafting(0.5, plain_explore_share=0.5)[1] == [False] * 12  # drafting 4x as fast: nothing to check
    assert drafting(0.15, plain_explore_share=None)[1] == [False] * 12


def exploration_gaps(share: float, cost: float, switch_s: float = 0.0) -> list[int]:
    """The plain steps (1/16 s each) between explorations, the first gap left out, of a policy whose shapes each
    emit 2 tokens an iteration of `cost` seconds (and switch_s to switch from plain steps to drafts)."""
    shapes = ladder((1, 3, 3, 3), 20)[:4]
    levels, paths = [[5], [1, 2, 3], [1, 2, 3], [1, 2, 3]], []
    policy = CandidatePolicy(shapes, explore_every=8, plain_explore_share=share)
    for _ in range(8):  # the warm-up
        policy.observe(policy.choose().cut(levels), paths, [5], cost)
    policy.observe_plain(0.0625)
    runs, plain = [], 0
    for _ in range(400):
        shape = policy.choose()
        if shape is None:
            plain += 1
            policy.observe_plain(0.0625)
            continue
        runs.append(plain)
        plain = 0
        policy.observe(shape.cut(levels), paths, [5], cost, switch_s)
    return runs[1:]


def test_the_switch_from_plain_steps_counts_against_exploring():
    """An exploration after plain steps pays the drafter's catch-up on their rows (switch_s): not the shape's time
    (the engine leaves it out), but part of what exploring costs, so explorations come that much further apart."""
    # the shapes write at half plain decoding's speed: a sixth of the share, 0.5
    assert set(exploration_gaps(3.0, 0.25)) == {8}  # a pass of 0.25 s once plain steps took 0.25 / 0.5 s
    assert set(exploration_gaps(3.0, 0.25, switch_s=0.25)) == {16}  # the pass and its switch, 0.5 s, once they took 1 s


def test_exploring_beside_plain_steps_favours_the_shape_closest_to_paying():
    """While plain steps are faster, three explorations in four run the best shape; the fourth refreshes the
    shape timed longest ago, so every shape is still measured as the context grows."""
    shapes = ladder((1, 3, 3, 3), 20)[:4]
    levels, paths = [[5], [1, 2, 3], [1, 2, 3], [1, 2, 3]], []
    cost = {121: 1.0, 56: 0.5, 28: 0.5, 13: 0.25}  # every shape emits 2 tokens: the 13-row one is the best
    policy = CandidatePolicy(shapes, explore_every=8, plain_explore_share=3.0)  # a sixth: 0.5 (8 vs 16 tokens/s)
    explored = []
    for i in range(400):
        if i == 8:  # after the warm-up (each shape twice, smallest first), the engine's AR probe
            policy.observe_plain(0.0625)  # 16 tokens/s: plain steps stay faster than every shape
        shape = policy.choose()
        if shape is None:
            policy.observe_plain(0.0625)
            continue
        if i >= 8:
            explored.append(shape.slots)
        policy.observe(shape.cut(levels), paths, [5], cost[shape.slots])
    assert explored[:12] == [13, 13, 13, 28, 13, 13, 13, 56, 13, 13, 13, 121]


def test_exploring_takes_less_of_the_time_the_further_the_best_shape_is_behind_plain_steps():
    """While plain steps are faster, an exploration comes once they took its time / plain_explore_share where the
    best shape writes at 0.9 of their speed or more, up to six times further apart as it falls to half: on the AVX2
    EPYC at 7K, where nothing pays (the best shape at ~0.6), the full share left TokenSwift 3-4% behind."""
    # 0.94, 0.70 and 0.48 of plain steps' speed
    near, middle, far = (set(exploration_gaps(0.25, cost)) for cost in (0.1328125, 0.1796875, 0.26))
    assert near == {9}  # 0.133 s once plain steps took 0.133 / 0.25 s
    assert middle == {24}  # about half the share (0.70: about halfway from 0.5 to 0.9)
    assert far == {100}  # a sixth: 0.26 s once they took 6.24 s


def test_a_shape_that_cannot_beat_plain_steps_is_never_run():
    """With plain steps timed (the engine's probe comes first), the warm-up extrapolates each larger shape's time
    from the smaller ones: one whose deepest path, all accepted, would still write slower than plain steps (on a
    CPU the 84-row shape costs 14 plain steps) is never timed; on a GPU, where rows are nearly free, all are."""
    shapes = ladder((1, 3, 3, 3), 20)[:4]
    levels = [[5], [1, 2, 3], [1, 2, 3], [1, 2, 3]]

    def picks(cost) -> list[int]:
        policy = CandidatePolicy(shapes, explore_every=8)
        policy.observe_plain(0.014)
        slots = []
        for _ in range(40):
            shape = policy.choose()
            if shape is None:
                policy.observe_plain(0.014)
                continue
            slots.append(shape.slots)
            policy.observe(shape.cut(levels), [], [5], cost(shape.slots))
        return slots

    cpu = picks(lambda rows: 0.014 + 0.0015 * rows)  # 13 rows: 2.4 plain steps; 121 rows: 14
    assert 121 not in cpu and 56 not in cpu and cpu[:4] == [13, 13, 28, 28]
    gpu = picks(lambda rows: 0.014 + 0.00001 * rows)
    assert gpu[:8] == [13, 13, 28, 28, 56, 56, 121, 121]


def test_a_random_model_without_a_tokenizer_decodes_on_the_cpu():
    """bench.shapes' random weights have no tokenizer (the CUDA tests and bench-gpu run them through the engine):
    its ends come from the config, and TokenSwift writes plain decoding's tokens."""
    lm = tiny("qwen2.5-1.5b")
    assert lm.tokenizer is None and lm.eos_ids == tuple(sorted(set(lm.config.eos_token_ids)))
    prompt = torch.randint(lm.config.vocab_size, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    s, ts = Settings(seed=1, ignore_eos=True, **MINP), Speculation(ngram_topk=20, budget=64)
    assert run_engine(lm, s, prompt, 24, spec=ts) == run_engine(lm, s, prompt, 24, spec=PLAIN)


# -- on a CUDA device ----------------------------------------------------------------------------------


def run_engine(lm, settings, prompt, n, fast=None, adaptive=False, spec=PLAIN) -> list[int]:
    engine = Engine(lm, settings.replace(max_new_tokens=n), prompt, len(prompt),
                    EngineOptions(fast, adaptive, speculation=spec))
    out = engine.start()
    step = engine.ts_step if spec.mode == "tokenswift" else engine.ar_step
    while len(out) < n:
        out += step().tokens
    return out[:n]


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("kind", ATTENTION)
def test_cuda_graphs_replay_the_eager_passes(kind):
    lm = tiny("llama3.1-8b", device="cuda", dtype=torch.float32)
    model, capacity = lm.model, 700
    ids, (eager, fast) = prefilled_pair(lm, 300, capacity)
    passes = FastPasses(lm, fast, FastOptions(attention=kind, bucket=256))
    with torch.inference_mode():
        for n in (300, 301, 450):  # the same graph replays at new device-side lengths
            if n == 450:  # the same keys and values in both caches: one draw, copied
                filler = torch.randn_like(eager.k[:, :, 302:450])
                for cache in (eager, fast):
                    cache.k[:, :, 302:450].copy_(filler)
                    cache.v[:, :, 302:450].copy_(filler)
            token = ids[300:301]
            ref = model(token, torch.tensor([n], device="cuda"), eager, n).logits
            assert close(passes.ar(token, n)[0], ref, 1e-4)
            trie, shape = random_trie(lm.config.vocab_size, seed=n)
            tokens, positions, tree = (t.cuda() for t in verify_inputs(trie, n + 1, shape.slots))
            ref = model(tokens, positions, eager, n + 1, with_prefix(tree, n + 1, positions, None))
            assert close(passes.verify(trie, n + 1, shape.slots)[0], ref.logits, 1e-4)
    graphs = [p.graph for p in passes.passes.values()]
    assert all(g is not None for g in graphs)
    if kind != "sdpa":
        assert len(graphs) == 2  # flex: one AR and one verify graph for every length


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize(("name", "kind"), [("llama3.1-8b", "flex"), ("llama3.1-8b", "sdpa"),
                                            ("qwen2.5-1.5b", "auto"), ("qwen2.5-7b", "flex")])
def test_cuda_fast_engine_matches_plain_decoding(name, kind):
    """float32 on the device: flips are possible in principle (design §3), so report where texts part.
    The 121-row verify batch of a group of 4 takes the decoding kernel with a capped tile (llama, flex)."""
    lm = tiny(name, device="cuda", dtype=torch.float32)
    prompt = torch.randint(lm.config.vocab_size, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    s, ts = Settings(seed=1, ignore_eos=True, **MINP), Speculation(ngram_topk=20, budget=64)
    expected = run_engine(lm, s, prompt, 300, fast=None)
    fast = FastOptions(attention=kind)
    for mode, adaptive in (("ar", False), ("tokenswift", False), ("tokenswift", True)):
        got = run_engine(lm, s, prompt, 300, fast=fast, adaptive=adaptive, spec=ts.replace(mode=mode))
        first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b), None)
        assert first is None, f"{mode} (adaptive={adaptive}) diverged at token {first}"
