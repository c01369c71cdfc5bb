"""`python -m tokenswift bench-gpu`: the fast path's pass costs at long contexts, and what they imply.

For each model (a preset shape with random weights, or a real checkpoint) and each context (4K..100K):
- AR tokens/s and achieved bandwidth: (weights + filled KV bytes) per step ÷ step time, also as a fraction
  of a measured device-to-device copy (the practical ceiling). A step is what decoding pays: the forward,
  sampling (the paper's Llama settings: min-p 0.1, penalty 1.2 over 1024 tokens) and the host sync for
  the token; the forward alone is reported beside it;
- draft and verify pass times for each candidate-batch shape of the adaptive ladder;
- each attention kernel of the fast path (attention.ATTENTION) and the eager path, so the kernel is chosen
  by measurement; the best per pass feeds the projection.
The KV cache is filled with random values instead of a prefill: attention time does not depend on them.
Then: peak memory, whether a 100K context with full + partial caches fits, and projected minutes for 100K
new tokens (AR, and TokenSwift at a given tokens-per-iteration), next to the paper's A100 minutes and the
H100 bandwidth floor (design §8). All numbers are returned as one dict (the CLI prints it with gpu_report.py, and
writes it as JSON).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from tokenswift.bench.runs import copy_bandwidth, kv_bytes_per_token, sync_device, weight_bytes
from tokenswift.decode.adaptive import Shape, ladder
from tokenswift.model import kv_q8
from tokenswift.model.fastpath import FastOptions, FastPasses, padded_capacity
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel
from tokenswift.model.masks import with_prefix
from tokenswift.sampling.in_graph import pack_verify_inputs, packed_size
from tokenswift.sampling.sampler import Sampler
from tokenswift.sampling.trie import build_trie, verify_inputs, walk
from tokenswift.settings import Settings

CONTEXTS = (4096, 32768, 65536, 100_000)
TINY_CONTEXTS = (64, 256)
# Paper (design §8): 100K tokens after a 4K prompt on an A100-80GB, their eager AR baseline.
PAPER_MINUTES = {"llama3.1-8b": {"ar": 294.0, "tokenswift": 90.0},
                 "qwen2.5-7b": {"ar": 244.2, "tokenswift": 75.6},
                 "qwen2.5-1.5b": {"ar": 187.8, "tokenswift": 60.0}}
H100_FLOOR_MINUTES = {"llama3.1-8b": 12.7}  # weights + KV read once per token at H100 bandwidth (§8)
SPARE = 8  # slots beyond the last verify batch, as the engine allocates
SAMPLING = Settings(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024)  # paper, Llama-3.1-8B


@dataclass
class GpuBench:
    contexts: Sequence[int] = CONTEXTS
    kernels: Sequence[str] = ("flex", "sdpa")
    graphs: str | None = None  # fastpath graphs mode; None = cuda on CUDA, none on CPU
    steps: int = 16  # timed AR steps per context (after warm-up)
    reps: int = 8  # timed draft / verify passes per context and shape
    budget: int = 4096  # partial cache |B|
    tree: tuple[int, ...] = (1, 3, 3, 3)
    ngram_topk: int = 20
    tokens_per_iter: float = 4.0  # TokenSwift tokens per iteration assumed by the projection
    prompt: int = 4096
    new_tokens: int = 100_000
    eager: bool = True  # also time the eager path (the engine without --fast)
    shapes: list[Shape] = field(init=False)

    def __post_init__(self) -> None:
        self.shapes = ladder(self.tree, self.ngram_topk)


# -- timing ---------------------------------------------------------------------------------------------


def timed(fn: Callable[[], object], reps: int, device: torch.device, warmup: int = 2) -> float:
    """Mean seconds per call, host work included (what the decoding loop pays), after warm-up calls
    (the first ones capture graphs and compile kernels)."""
    for _ in range(warmup):
        fn()
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync_device(device)
    return (time.perf_counter() - t0) / reps


def attempt(fn: Callable[[], float]) -> float | str:
    """A measurement, or the error that stopped it (one failing kernel must not end the whole run)."""
    try:
        return fn()
    except Exception as error:  # noqa: BLE001 - reported in the results, never swallowed silently
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


def random_cache(lm: LoadedModel, capacity: int, seed: int = 0, slot_major: bool = True) -> KVCache:
    """A cache of random keys and values, in the fast path's slot-major layout unless slot_major is False (the
    eager engine's, as on a CPU)."""
    cfg = lm.config
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, capacity, cfg.head_dim, lm.device, lm.cache_dtype, slot_major)
    generator = torch.Generator(device=lm.device).manual_seed(seed)
    for buf, key in ((cache.k, True), (cache.v, False)):
        if buf.dtype != kv_q8.Q8:
            buf.normal_(0.0, 1.0, generator=generator)  # in place: no temporary the size of the cache
            continue
        for layer in buf:  # q8 rows of random values, a layer at a time
            layer.copy_(kv_q8.quantize(torch.randn(*layer.shape[:-1], cfg.head_dim, generator=generator), key))
    return cache


def candidate_trie(shape: Shape, vocab: int, seed: int = 0):
    """A realistic candidate set of `shape`: a random draft tree plus random n-gram paths."""
    g = torch.Generator().manual_seed(seed)
    levels = [torch.randint(vocab, (w,), generator=g).tolist() for w in shape.widths]
    first = levels[0][0]
    paths = [(first, *torch.randint(vocab, (3,), generator=g).tolist()) for _ in range(shape.k)]
    return build_trie(torch.randint(vocab, (1,), generator=g).item(), levels, paths)


def candidate_inputs(shape: Shape, vocab: int, start: int, device) -> tuple:
    """(trie, [tokens, positions, tree mask] on the device) of a verify batch padded to the shape."""
    trie = candidate_trie(shape, vocab)
    return trie, [t.to(device) for t in verify_inputs(trie, start, shape.slots)]


# -- one model ------------------------------------------------------------------------------------------


def bench_model(lm: LoadedModel, name: str, b: GpuBench, copy_bw: float | None) -> dict:
    """Every measurement for one model; contexts that do not fit the model's limit are skipped."""
    dev = lm.device
    contexts = [c for c in b.contexts if c + b.shapes[0].slots + SPARE <= lm.max_context]
    if not contexts:
        raise ValueError(f"no context of {list(b.contexts)} fits {name}'s limit of {lm.max_context} tokens")
    capacity = padded_capacity(max(contexts) + b.shapes[0].slots + SPARE)  # as the engine's fast path
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    cache = random_cache(lm, capacity)
    partial = random_cache(lm, b.budget + 1, seed=1)
    result = {
        "name": name, "dtype": str(lm.dtype).removeprefix("torch."), "contexts": contexts,
        "skipped_contexts": [c for c in b.contexts if c not in contexts],
        "parameters": sum(p.numel() for p in lm.model.parameters()),
        "weight_bytes": weight_bytes(lm), "kv_bytes_per_token": kv_bytes_per_token(lm), "budget": b.budget,
        "shapes": [{"label": s.label(), "slots": s.slots} for s in b.shapes],
        "heads": "random" if lm.random_heads else "checkpoint",
    }
    kernels = {}
    if b.eager:
        kernels["eager"] = eager_rows(lm, cache, partial, contexts, b)
    for kind in b.kernels:
        kernels[kind] = fast_rows(lm, cache, partial, contexts, b, kind)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    result["kernels"] = kernels
    add_bandwidth(result, copy_bw)
    result["best"] = best_rows(result, b)
    result["overhead_ms"] = {s.label(): 1e3 * attempt(lambda s=s: iteration_overhead(lm, s, b.reps))
                             for s in b.shapes[:1]}
    result["memory"] = memory_report(lm, result, b, cache, partial)
    result["projection"] = projection(result, b, copy_bw, name)
    return result


def fast_rows(lm: LoadedModel, cache: KVCache, partial: KVCache, contexts: list[int], b: GpuBench,
              kind: str) -> dict:
    dev, vocab = lm.device, lm.config.vocab_size
    ids = torch.randint(vocab, (cache.capacity,), device=dev)  # the token history the sampler's penalty reads
    options = FastOptions(attention=kind, verify_attention=kind, graphs=b.graphs)
    try:
        passes = FastPasses(lm, cache, options, Sampler(SAMPLING, vocab, dev), ids)
    except Exception as error:  # noqa: BLE001
        return {"error": f"{type(error).__name__}: {error}", "rows": []}
    rows_draft = 1 + (lm.heads.gamma if lm.heads is not None else 0)
    token = ids[:1]
    # the draft pass reads the partial cache only: one time serves every context
    draft = attempt(lambda: timed(lambda: passes.draft(partial, 1, b.budget, b.budget, rows_draft), b.reps, dev))
    rows = []
    for context in contexts:
        row: dict = {"context": context}
        row["ar_ms"] = _ms(attempt(lambda c=context: timed(lambda: passes.ar_token(c), b.steps, dev)))
        row["forward_ms"] = _ms(attempt(lambda c=context: timed(lambda: passes.ar(token, c), b.steps, dev)))
        row["draft_ms"] = _ms(draft)
        row["verify_ms"] = {}
        for shape in b.shapes:  # verify + sampling every node + the host sync for the targets
            trie = candidate_trie(shape, vocab)
            run = lambda c=context, t=trie, n=shape.slots: passes.verify(t, c, n)  # noqa: E731
            row["verify_ms"][shape.label()] = _ms(attempt(lambda r=run: timed(r, b.reps, dev)))
        rows.append(row)
    return {"error": None, "rows": rows}


def eager_rows(lm: LoadedModel, cache: KVCache, partial: KVCache, contexts: list[int], b: GpuBench) -> dict:
    """The engine's eager passes (no graphs, SDPA over the exact filled length), for comparison. The AR
    step samples as the engine does; the verify time is the forward pass alone."""
    model, dev, vocab = lm.model, lm.device, lm.config.vocab_size
    token = torch.zeros(1, dtype=torch.long, device=dev)
    sampler, history = Sampler(SAMPLING, vocab, dev), torch.randint(vocab, (1, 1024), device=dev)

    def ar(c: int) -> None:
        logits = model(token, torch.tensor([c], device=dev), cache, c).logits
        int(sampler.sample(logits, history, [c + 1])[0])

    def draft() -> None:
        out = model(token, torch.tensor([b.budget], device=dev), partial, b.budget)
        if lm.heads is not None:
            lm.heads.logits(model, out.hidden, out.logits.argmax(-1), lm.heads.gamma)

    def verify(c: int, inputs) -> None:
        tokens, positions, tree = inputs[1]
        model(tokens, positions, cache, c, with_prefix(tree, c, positions, None), capture_queries=True)

    with torch.inference_mode():
        draft_s = attempt(lambda: timed(draft, b.reps, dev))
        rows = []
        for c in contexts:
            row = {"context": c, "ar_ms": _ms(attempt(lambda c=c: timed(lambda: ar(c), b.steps, dev))),
                   "draft_ms": _ms(draft_s), "verify_ms": {}}
            for shape in b.shapes[:1]:  # the configured batch: what the engine runs today
                inputs = candidate_inputs(shape, vocab, c, dev)
                row["verify_ms"][shape.label()] = _ms(attempt(lambda c=c, i=inputs: timed(lambda: verify(c, i),
                                                                                          b.reps, dev)))
            rows.append(row)
    return {"error": None, "rows": rows}


def _ms(seconds: float | str) -> float | str:
    return 1e3 * seconds if isinstance(seconds, float) else seconds


def add_bandwidth(result: dict, copy_bw: float | None) -> None:
    """AR tokens/s and bytes moved per step ÷ step time (weights + the filled KV), against the copy."""
    weights, kv = result["weight_bytes"], result["kv_bytes_per_token"]
    for kernel in result["kernels"].values():
        for row in kernel["rows"]:
            if not isinstance(row["ar_ms"], float):
                continue
            seconds = row["ar_ms"] / 1e3
            row["tokens_per_s"] = 1 / seconds
            row["bandwidth_gb_s"] = (weights + kv * (row["context"] + 1)) / seconds / 1e9
            row["bandwidth_fraction"] = row["bandwidth_gb_s"] * 1e9 / copy_bw if copy_bw else None


def best_rows(result: dict, b: GpuBench) -> list[dict]:
    """Per context, the fastest kernel of each pass (the eager path competes too)."""
    rows = []
    for i, context in enumerate(result["contexts"]):
        candidates = {k: v["rows"][i] for k, v in result["kernels"].items() if len(v["rows"]) > i}
        row = {"context": context}
        row["ar_kernel"], row["ar_ms"] = _fastest({k: r["ar_ms"] for k, r in candidates.items()})
        row["draft_kernel"], row["draft_ms"] = _fastest({k: r["draft_ms"] for k, r in candidates.items()})
        row["verify_kernel"], row["verify_ms"] = {}, {}
        for shape in b.shapes:
            label = shape.label()
            times = {k: r["verify_ms"].get(label) for k, r in candidates.items()}
            row["verify_kernel"][label], row["verify_ms"][label] = _fastest(times)
        rows.append(row)
    return rows


def _fastest(times: dict[str, float | str | None]) -> tuple[str | None, float | None]:
    valid = {k: v for k, v in times.items() if isinstance(v, float)}
    if not valid:
        return None, None
    kind = min(valid, key=valid.get)
    return kind, valid[kind]


def iteration_overhead(lm: LoadedModel, shape: Shape, reps: int) -> float:
    """Seconds of host-side work per TokenSwift iteration outside the two passes (whose graphs sample):
    the trie, the verify inputs packed and copied to the device, the walk, the K/V commit."""
    dev, vocab = lm.device, lm.config.vocab_size
    cache = KVCache(lm.config.n_layers, lm.config.n_kv_heads, 2048, lm.config.head_dim, dev, lm.dtype)
    g = torch.Generator().manual_seed(0)
    size = packed_size(shape.slots, True)
    host = torch.empty(size, dtype=torch.long, pin_memory=dev.type == "cuda")
    staged = torch.empty(size, dtype=torch.long, device=dev)

    def one() -> None:
        levels = [torch.randint(vocab, (w,), generator=g).tolist() for w in shape.widths]
        paths = [(levels[0][0], *torch.randint(vocab, (3,), generator=g).tolist()) for _ in range(shape.k)]
        trie = build_trie(levels[0][0], levels, paths)
        pack_verify_inputs(trie, 1000, shape.slots, True, host)
        staged.copy_(host, non_blocking=True)
        # the target always picks an existing child: the longest walk
        targets = [min(children) if children else 0 for children in trie.children]
        accepted, _ = walk(trie, targets)
        cache.commit(torch.tensor([1000 + i for i in accepted], device=dev), 1000)

    with torch.inference_mode():
        return timed(one, reps, dev)


# -- memory and projection ------------------------------------------------------------------------------


def memory_report(lm: LoadedModel, result: dict, b: GpuBench, cache: KVCache, partial: KVCache) -> dict:
    """Peak memory of this run, and whether a 100K-token generation after the prompt fits."""
    kv = result["kv_bytes_per_token"]
    params = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    heads = sum(p.numel() * p.element_size() for p in lm.heads.parameters()) if lm.heads is not None else 0
    full_slots = padded_capacity(b.prompt + b.new_tokens + b.shapes[0].slots + SPARE)
    need = params + heads + kv * (full_slots + b.budget + 1)
    report = {"weights_gb": params / 1e9, "full_cache_gb_100k": kv * full_slots / 1e9,
              "partial_cache_gb": kv * (b.budget + 1) / 1e9, "static_need_gb": need / 1e9}
    if lm.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(lm.device)
        total = torch.cuda.get_device_properties(lm.device).total_memory
        # scratch beyond weights and caches (activations, logits, graphs), as measured in this run
        workspace = max(0, peak - params - heads - cache.nbytes() - partial.nbytes())
        report.update(peak_gb=peak / 1e9, device_gb=total / 1e9, workspace_gb=workspace / 1e9,
                      fits_100k=need + workspace <= total)
    return report


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through the points, extended linearly beyond the first and last."""
    if len(xs) == 1:
        return ys[0]
    i = max(1, min(len(xs) - 1, next((j for j, v in enumerate(xs) if v >= x), len(xs) - 1)))
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))  # a noisy slope must not extrapolate below 0


def integrate(xs: Sequence[float], ys: Sequence[float], lo: float, hi: float, points: int = 400) -> float:
    """∫ f over [lo, hi] for f interpolated through (xs, ys): a cost per token summed over a range."""
    step = (hi - lo) / points
    return sum(interpolate(xs, ys, lo + (i + 0.5) * step) for i in range(points)) * step


def projection(result: dict, b: GpuBench, copy_bw: float | None, name: str) -> dict:
    """Minutes for `new_tokens` after the prompt, from the best measured pass costs at each context."""
    best = [r for r in result["best"] if r["ar_ms"] is not None]
    label = b.shapes[0].label()
    out = {"new_tokens": b.new_tokens, "prompt": b.prompt, "tokens_per_iter": b.tokens_per_iter,
           "paper_a100_minutes": PAPER_MINUTES.get(name), "h100_floor_minutes": H100_FLOOR_MINUTES.get(name)}
    if not best:
        return out
    lo, hi = b.prompt, b.prompt + b.new_tokens
    xs = [r["context"] for r in best]
    out["ar_minutes"] = integrate(xs, [r["ar_ms"] for r in best], lo, hi) / 6e4
    overhead = result["overhead_ms"].get(label)
    overhead = overhead if isinstance(overhead, float) else 0.0
    iters = [r for r in best if r["draft_ms"] is not None and r["verify_ms"].get(label) is not None]
    if iters:
        costs = [r["draft_ms"] + r["verify_ms"][label] + overhead for r in iters]
        per_token = [c / b.tokens_per_iter for c in costs]
        out["tokenswift_minutes"] = integrate([r["context"] for r in iters], per_token, lo, hi) / 6e4
        out["iteration_ms"] = dict(zip([r["context"] for r in iters], costs, strict=True))
    if copy_bw:
        weights, kv = result["weight_bytes"], result["kv_bytes_per_token"]
        out["floor_minutes"] = (weights * (hi - lo) + kv * (hi * hi - lo * lo) / 2) / copy_bw / 60
    return out


# -- several models -------------------------------------------------------------------------------------


def run(models: Sequence[tuple[str, Callable[[], LoadedModel]]], b: GpuBench, device: torch.device,
        log: Callable[[str], None] = lambda _: None) -> dict:
    """Bench each model in turn (built lazily and freed after, so only one is on the device at a time)."""
    copy_bw = copy_bandwidth(device) if device.type == "cuda" else None
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "copy_bandwidth_gb_s": copy_bw / 1e9 if copy_bw else None,
           "settings": {k: v for k, v in vars(b).items() if k != "shapes"}, "models": []}
    for name, build in models:
        log(f"bench-gpu: {name} ...")
        t0 = time.perf_counter()
        lm = build()
        result = bench_model(lm, name, b, copy_bw)
        result["seconds"] = time.perf_counter() - t0
        out["models"].append(result)
        del lm
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out
