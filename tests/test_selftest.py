"""The fast path's self-test and fallback (selftest.py), its one-off costs booked apart, and the paper drafter's
draft graph, on a CPU where the same code runs: the eager flex and SDPA kernels pass the self-test; a kernel
injected through FastOptions.attention_factory that raises or lies is caught, at load or mid-run, and the next
path down writes the very same text.
"""

from __future__ import annotations

import copy
import dataclasses
import time

import pytest
import torch
from speed import AR

from tokenswift.bench.counting import counting
from tokenswift.bench.shapes import preset, random_heads, random_model
from tokenswift.decode.clock import PROBE_INTERVAL_S
from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions, PathChoice
from tokenswift.decode.selftest import choose_path, device_defaults, fall_back, self_test
from tokenswift.draft.drafting import HeadsDrafter
from tokenswift.model.attention import make_attention
from tokenswift.model.fastpath import FastOptions, FastPasses, FastPathError
from tokenswift.model.heads import new_heads
from tokenswift.model.kv_cache import KVCache
from tokenswift.sampling.in_graph import pack_verify_inputs
from tokenswift.sampling.sampler import Sampler
from tokenswift.sampling.trie import build_trie
from tokenswift.settings import Settings, Speculation

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
PROMPT = "The old lighthouse keeper climbed the stairs and"
MINP = dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=64)


def tiny(name: str, dtype=torch.float64):
    return random_model(name, *preset(name, tiny=True), "cpu", dtype)


class Kernel:
    """A pass's real attention kernel, made to raise or to be off by `error` from some call on."""

    def __init__(self, inner, faults: Faults):
        self.inner, self.faults = inner, faults

    def prepare(self) -> None:
        self.faults.calls += 1
        if self.faults.raise_after is not None and self.faults.calls > self.faults.raise_after:
            raise RuntimeError("injected kernel failure")
        self.inner.prepare()

    def __call__(self, q, k, v):
        return self.inner(q, k, v) + self.faults.error


@dataclasses.dataclass
class Faults:
    """attention_factory for FastOptions: wraps the kernels of the kinds in `kinds`."""

    kinds: tuple[str, ...]
    raise_after: int | None = None  # raise from this many prepared passes on
    error: float = 0.0  # added to every attention output
    calls: int = 0

    def __call__(self, kind, model, visible, span):
        inner = make_attention(kind, model, visible, span)
        return Kernel(inner, self) if kind in self.kinds else inner


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kind"), [("llama3.1-8b", "flex"), ("llama3.1-8b", "sdpa"),
                                            ("qwen2.5-1.5b", "auto"), ("qwen2.5-1.5b", "sdpa")])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_cpu_paths_pass_the_self_test(name, kind, dtype):
    lm = tiny(name, dtype)
    options = FastOptions(attention=kind)
    assert self_test(lm, options) is None
    assert choose_path(lm, options) == (options, PathChoice("sdpa" if kind == "sdpa" else
                                                            ("flex" if name.startswith("llama") else "flex-fold")))


def test_a_kernel_that_raises_or_lies_falls_back_flex_then_sdpa_then_eager():
    lm = tiny("llama3.1-8b")
    raising = FastOptions(attention="flex", attention_factory=Faults(("flex",), raise_after=0))
    chosen, choice = choose_path(lm, raising)
    assert chosen.attention == "sdpa" and choice.path == "sdpa"
    assert choice.dropped == ("flex: RuntimeError: injected kernel failure",)
    lying = FastOptions(attention="flex", attention_factory=Faults(("flex", "sdpa"), error=1e-6))
    chosen, choice = choose_path(lm, lying)
    assert chosen is None and choice.path == "eager"
    assert [why.split(":")[0] for why in choice.dropped] == ["flex", "sdpa"]
    assert all("AR logits differ" in why for why in choice.dropped)
    assert "eager passes; not flex: AR logits differ" in choice.describe()


def test_the_worker_takes_no_fast_path_off_cuda_nor_in_an_untested_dtype(stories64):
    assert device_defaults(stories64) == EngineOptions(adaptive=True)  # a CPU: the eager passes, no self-test
    odd = dataclasses.replace(tiny("llama3.1-8b"), dtype=torch.int8)
    chosen, choice = choose_path(odd, FastOptions())
    assert chosen is None and choice.dropped == ("the fast path: int8 was never tested on it",)


def test_a_fast_path_failing_mid_run_resumes_on_the_next_path_with_the_same_text(stories64):
    """The run stops with a FastPathError; fall_back picks the next path (stories260k's tiny heads leave SDPA only,
    so: the eager passes), and a run resumed from the tokens emitted so far writes the uninterrupted run's."""
    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=120, seed=2, ignore_eos=True, **MINP)
    expected = Generator(stories64, s, prompt, options=AR).run()
    lm = dataclasses.replace(stories64, heads=random_heads(stories64.config, "cpu", torch.float64, seed=2))
    options = EngineOptions(fast=FastOptions(attention="sdpa", attention_factory=Faults(("sdpa",), raise_after=9)),
                            choice=PathChoice("sdpa"), speculation=Speculation(ngram_topk=5, budget=48))
    gen = Generator(lm, s, prompt, options=options)
    with pytest.raises(FastPathError, match="sdpa attention failed"):
        gen.run()
    saved = gen.produced
    assert 0 < len(saved) < len(expected)
    below = fall_back(lm, options, "injected")
    assert below.fast is None and below.choice == PathChoice("eager", ("sdpa: failed mid-job (injected)",))
    assert Generator(lm, s, prompt, generated_ids=saved, options=below).run() == expected


@pytest.mark.slow
def test_capture_and_compilation_are_booked_apart_from_decoding(stories64):
    """A pass whose first call takes seconds (as a CUDA-graph capture or a kernel compilation may): they land in
    capture_s, not in the step times that time saved and the adaptive policy read. Checked as bookkeeping on one
    clock, whatever the machine's speed: the booked times and capture_s add up to no more than the run's wall
    time, where booking the capture twice would exceed it by the capture itself."""
    slow = 1.0

    class SlowFirstCall:
        def __init__(self, kind, model, visible, span):
            self.inner, self.first = make_attention(kind, model, visible, span), True

        def prepare(self):
            if self.first:
                time.sleep(slow)
                self.first = False
            self.inner.prepare()

        def __call__(self, q, k, v):
            return self.inner(q, k, v)

    prompt = stories64.encode(PROMPT)
    s = Settings(max_new_tokens=40, seed=2, ignore_eos=True, **MINP)
    fast = FastOptions(attention="sdpa", bucket=128, attention_factory=SlowFirstCall)  # one span: 128 slots
    for mode, passes in (("ar", 1), ("tokenswift", 2)):  # AR: one pass; TokenSwift: its AR probe and verify
        start = time.perf_counter()
        gen = Generator(dataclasses.replace(stories64, heads=None), s, prompt,
                        options=EngineOptions(fast=fast, speculation=Speculation(mode=mode, ngram_topk=5,
                                                                                 drafter="fused")))
        ids = gen.run()
        wall = time.perf_counter() - start
        assert ids == Generator(stories64, s, prompt, options=AR).run()
        m = gen.metrics()
        assert m.capture_s >= passes * slow
        assert m.elapsed_s + m.capture_s <= wall


def next_token_heads(cfg):
    heads = new_heads(cfg, 3, next_token=True).to(torch.float64).requires_grad_(False)
    g = torch.Generator().manual_seed(5)
    for name, p in heads.named_parameters():
        p.copy_(torch.ones_like(p) if "norm" in name else 0.02 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return heads


@pytest.mark.parametrize("next_token", [False, True])
def test_the_draft_graph_computes_the_eager_drafters_rows(next_token):
    """The paper drafter's draft pass (fastpath.FastPasses.draft) against its eager pass (HeadsDrafter), with
    heads that read the next token: the depth-1 guess drawn inside the pass by the device sampler."""
    lm = tiny("llama3.1-8b")
    cfg = lm.config
    heads = next_token_heads(cfg) if next_token else random_heads(cfg, "cpu", torch.float64, seed=2)
    lm = dataclasses.replace(lm, heads=heads)
    s = Settings(seed=3, **MINP)
    sampler = Sampler(s, cfg.vocab_size, "cpu")
    ids = torch.randint(cfg.vocab_size, (300,), generator=torch.Generator().manual_seed(0))
    eager = HeadsDrafter(lm, Speculation(), sampler, budget=64)
    full = KVCache(cfg.n_layers, cfg.n_kv_heads, 300, cfg.head_dim, "cpu", lm.dtype)
    passes = FastPasses(lm, full, FastOptions(attention="flex"), sampler, ids)
    partial = eager.partial.cache
    partial.k[:, :, :40].normal_(generator=torch.Generator().manual_seed(1))
    partial.v[:, :, :40].copy_(partial.k[:, :, :40].flip(-1))
    eager.partial.n = 40  # as if 40 slots had been selected: the root goes to slot 40
    root, position = int(ids[200]), 200
    window = ids[position + 1 - 64:position + 1][None]
    with torch.inference_mode():
        fast = passes.draft(_copy(partial, cfg), root, position, 40, rows=4).clone()
        ref = eager._draft_logits(root, position, window, 4, position + 1)
    assert (fast - ref).abs().max().item() < 1e-10


def _copy(cache: KVCache, cfg) -> KVCache:
    other = KVCache(cfg.n_layers, cfg.n_kv_heads, cache.capacity, cfg.head_dim, "cpu", cache.k.dtype)
    other.k.copy_(cache.k)
    other.v.copy_(cache.v)
    return other


def kernel_layouts(slot_major: bool) -> set:
    """What the compiled flex kernel specialises on, per call: every tensor's shape and strides, and the block
    mask's, for a 200-token AR step in caches of three capacities."""
    lm, seen = tiny("llama3.1-8b"), set()

    def recording(kind, model, visible, span):
        flex = make_attention(kind, model, visible, span)
        real = flex.kernel

        def kernel(q, k, v, block_mask, **kw):
            masks = (block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_indices)
            seen.add(tuple((tuple(t.shape), t.stride()) for t in (q, k, v, *masks)) + (block_mask.seq_lengths,))
            return real(q, k, v, block_mask=block_mask, **kw)

        flex.kernel = kernel
        return flex

    cfg = lm.config
    for capacity in (4096, 8192, 12288):  # engine capacities (fastpath.padded_capacity)
        cache = KVCache(cfg.n_layers, cfg.n_kv_heads, capacity, cfg.head_dim, "cpu", lm.dtype, slot_major)
        passes = FastPasses(lm, cache, FastOptions(attention="flex", attention_factory=recording))
        with torch.inference_mode():
            passes.ar(torch.tensor([3]), 200)
    return seen


@pytest.mark.slow
def test_the_flex_kernel_sees_one_layout_whatever_the_capacity():
    """The engine's slot-major cache gives the kernel the same shapes and strides in every job, so torch.compile
    builds it once per pass shape and span, not once per job; the head-major layout would not."""
    assert len(kernel_layouts(slot_major=True)) == 1
    assert len(kernel_layouts(slot_major=False)) == 3


def on_meta(lm):
    """The model moved to the meta device: no data, and an op that mixes in a tensor on another device raises."""
    model = copy.deepcopy(lm.model).to("meta")
    model.set_rope(lm.model.rope_cos.to("meta"), lm.model.rope_sin.to("meta"))
    return dataclasses.replace(lm, model=model, device=torch.device("meta"), heads=lm.heads.to("meta"))


def tensors_of(obj, seen=None) -> list[torch.Tensor]:
    """Every tensor an object holds, through its attributes, lists and dicts (not the model's weights)."""
    seen = seen if seen is not None else set()
    if id(obj) in seen or isinstance(obj, (torch.nn.Module, type, str, int, float)) or obj is None:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else \
        vars(obj).values() if hasattr(obj, "__dict__") else []
    return [t for item in items for t in tensors_of(item, seen)]


@pytest.mark.parametrize("kind", ["flex", "sdpa"])
def test_every_fast_path_tensor_is_allocated_on_the_models_device(kind):
    """cuda:N needs each buffer, mask and index on device N: on the meta device, a tensor allocated elsewhere
    shows in the passes' buffers, and (SDPA, which runs on meta) breaks the passes' ops."""
    lm = tiny("llama3.1-8b", torch.float32)
    lm = on_meta(dataclasses.replace(lm, heads=random_heads(lm.config, "cpu", torch.float32)))
    cfg = lm.config
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, 4096, cfg.head_dim, "meta", lm.dtype, slot_major=True)
    partial = KVCache(cfg.n_layers, cfg.n_kv_heads, 65, cfg.head_dim, "meta", lm.dtype)
    ids = torch.zeros(4096, dtype=torch.long, device="meta")
    sampler = Sampler(Settings(seed=1, **MINP), cfg.vocab_size, "meta")
    passes = FastPasses(lm, cache, FastOptions(attention=kind), sampler, ids)
    trie = build_trie(3, [[1], [2, 3]], [])
    with torch.inference_mode():
        for name, t, c, end, kw in (("ar", 1, cache, 201, {}), ("draft", 1, partial, 41, dict(
                heads=lm.heads, draft_rows=4, sampler=passes.draw)), ("verify+sample", 8, cache, 209, dict(
                queries=True, sampler=passes.draw, packed=True))):
            p = passes._get(name, c, t, kind, end, **kw)
            if kind == "sdpa":
                if p.inputs is not None:
                    pack_verify_inputs(trie, 201, 8, True, p.host_inputs)
                    p.inputs.copy_(p.host_inputs)
                p()
    held = [t for p in passes.passes.values() for t in tensors_of(p)]
    elsewhere = [t for t in held if t.device.type != "meta"]
    staging = [p.host_inputs for p in passes.passes.values() if p.inputs is not None]  # host memory by design
    assert len(held) > 20 and len(elsewhere) == len(staging) and all(any(t is s for s in staging) for t in elsewhere)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["fused", "paper"])
def test_host_syncs_per_iteration_on_the_fast_path(stories64, drafter, monkeypatch):
    """The same code as on a GPU (the sampler without its C rows, as there): an AR step reads its token once; a
    TokenSwift iteration reads the targets once (fastpath.py) and sends its ids through pinned memory (engine.py:
    none). What remains is the drafts' top-k, a nonzero and a read per draft depth (drafting.py, sampler.py) plus the
    noise keys' upload (keys.py): the CPU's ranking; on CUDA one read for every depth (test_iteration_counts.py)."""
    monkeypatch.setattr("tokenswift.decode.engine.sampler_rows", lambda *args: None)
    # the counted steps meet no AR probe: the next after the warm-up's comes 8 s later, not EARLY_PROBE_S
    monkeypatch.setattr("tokenswift.decode.clock.EARLY_PROBE_S", PROBE_INTERVAL_S)
    lm = dataclasses.replace(stories64, heads=random_heads(stories64.config, "cpu", torch.float64, seed=2))
    prompt = lm.encode(PROMPT)
    s = Settings(max_new_tokens=400, seed=2, ignore_eos=True, **MINP)
    options = EngineOptions(fast=FastOptions(attention="sdpa", bucket=4096),
                            speculation=Speculation(ngram_topk=5, tree=(1, 2, 2), budget=48, drafter=drafter))
    for mode, depth in (("ar", 0), ("tokenswift", 2 if drafter == "fused" else 3)):
        engine = Engine(lm, s, prompt, len(prompt), options.speculating(mode=mode))
        step = engine.ts_step if mode == "tokenswift" else engine.ar_step
        engine.start()
        for _ in range(5):  # past the first AR probe
            step()
        with counting(skip=("test_selftest.py",)) as counts:
            for _ in range(10):
                step()
        drafts = {"drafting.py": 10 * depth, "sampler.py": 10 * depth, "keys.py": 10 * depth} if depth else {}
        assert counts.syncs == {"fastpath.py": 10, **drafts}
        assert counts.replays == 10 * (1 + (mode == "tokenswift" and drafter == "paper"))
    draft_passes = [p for key, p in engine.fast.passes.items() if key[0] == "draft"]
    assert [p.sampled for p in draft_passes] == ([None] if drafter == "paper" else [])  # no sample for nothing


def test_the_same_text_promise_is_qualified_where_it_does_not_hold(stories64):
    """16-bit numbers are not token-exact and float32 on a GPU rarely parts at a near tie: the model notice says
    so; float64, and float32 and q4 on a CPU (verify rows run the plain step's kernels) make no such note. The fast
    path refuses a dtype it was never tested in."""
    from storage.records import WorkerStatus, utcnow
    from ui.display.views import model_notice, resume_caveat

    def worker(dtype: str, device: str = "cuda") -> WorkerStatus:
        return WorkerStatus("w", "h", 1, utcnow(), utcnow(), "m", None, device, dtype, "ready", None, None, None, None)

    def notice(dtype: str, device: str = "cuda") -> str:
        return model_notice(worker(dtype, device))

    for dtype in ("bfloat16", "float16"):
        assert "can part from plain decoding's at a near tie" in notice(dtype)
        assert "rarely" not in notice(dtype)
    assert "can rarely (about once in 10,000-100,000 tokens) part" in notice("float32")
    for dtype, device in (("float64", "cuda"), ("float64", "cpu"), ("float32", "cpu"), ("q4", "cpu")):
        assert "near tie" not in notice(dtype, device)
    assert "near tie" in notice("bfloat16", "cpu")
    # A paused draft says where its resume can part from the uninterrupted text (a rebuilt cache rounds otherwise).
    assert "near tie" in resume_caveat(worker("bfloat16")) and "bfloat16 on cuda" in resume_caveat(worker("bfloat16"))
    assert resume_caveat(worker("q4", "cpu")) == resume_caveat(worker("float32", "cpu")) == resume_caveat(None) == ""
    odd = dataclasses.replace(stories64, dtype=torch.int8)
    with pytest.raises(ValueError, match="never tested in torch.int8"):
        FastPasses(odd, KVCache(1, 1, 8, 8, "cpu", torch.float64), FastOptions())


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("name", "kind"), [("llama3.1-8b", "flex"), ("qwen2.5-1.5b", "auto"), ("llama3.1-8b", "sdpa")])
def test_cuda_paths_pass_the_self_test_on_every_device(name, kind, dtype):
    """Captured graphs against the eager passes, on the last device too (cuda:N, N > 0, where there is one)."""
    device = f"cuda:{torch.cuda.device_count() - 1}"
    lm = random_model(name, *preset(name, tiny=True), device, dtype)
    chosen, choice = choose_path(lm, FastOptions(attention=kind))
    assert choice.dropped == () and chosen is not None, choice.describe()
