"""Never trust an unrun path: before a worker decodes on the fast path, a few prefill, decode and verify steps
run on it and on the eager model, and the first path whose tokens agree (and logits lie within the dtype's
tolerance) is the one used: flex -> sdpa -> eager passes. A path that raises mid-job hands the job back to the
queue from its saved tokens, and the next path down is self-tested in turn (`fall_back`).

The check is the same code on every device: the CPU tests run it over the eager flex and SDPA kernels, and
inject a failing or lying kernel through FastOptions.attention_factory.
"""

from __future__ import annotations

import dataclasses

import torch

from tokenswift.decode.options import EngineOptions, PathChoice
from tokenswift.model.attention import effective_kind
from tokenswift.model.fastpath import DTYPES, FastOptions, FastPasses, FastPathError, padded_capacity
from tokenswift.model.kv_cache import KVCache
from tokenswift.model.loading import LoadedModel
from tokenswift.model.masks import with_prefix
from tokenswift.model.prefill import prefill
from tokenswift.sampling.sampler import Sampler
from tokenswift.sampling.trie import build_trie, verify_inputs
from tokenswift.settings import Settings

# Largest |fast - eager| logit difference allowed, relative to the largest eager logit, per fastpath.DTYPES: any
# other dtype runs the eager passes. bf16 and fp16 are not token-exact on any path (metrics.same_text_caveat).
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}
PROMPT_LEN = 150  # crosses a 128-slot flex block: full and partial blocks are both read
STEPS = 3  # decode steps checked after the prefill
LEVELS = ((1,), (2,), (2,))  # the verify batch: a small tree, padded to VERIFY_ROWS
VERIFY_ROWS = 8


def device_defaults(lm: LoadedModel, adaptive: bool = True, fast: bool = True) -> EngineOptions:
    """What the app's worker runs with: the adaptive batch, and on a CUDA device the fast path on the best path
    that passes its self-test (sliding-window models keep the eager passes: the fast path lacks the window)."""
    if not (fast and lm.device.type == "cuda" and lm.config.sliding_window is None):
        return EngineOptions(adaptive=adaptive)
    chosen, choice = choose_path(lm, FastOptions())
    return EngineOptions(fast=chosen, adaptive=adaptive, choice=choice)


def choose_path(lm: LoadedModel, options: FastOptions, dropped: tuple[str, ...] = ()
                ) -> tuple[FastOptions | None, PathChoice]:
    """The first of `options` and the paths below it that passes the self-test (None: the eager passes)."""
    if lm.dtype not in DTYPES:
        return None, PathChoice("eager", (*dropped, f"the fast path: {lm.precision} was never tested on it"))
    for candidate in fallbacks(lm, options):
        kind = effective_kind(candidate.attention, lm.config)
        why = self_test(lm, candidate)
        if why is None:
            return candidate, PathChoice(kind, dropped)
        dropped = (*dropped, f"{kind}: {why}")
    return None, PathChoice("eager", dropped)


def fall_back(lm: LoadedModel, options: EngineOptions, failure: str) -> EngineOptions:
    """The options one path down from `options.fast`, after it failed mid-job with `failure`."""
    if options.fast is None:
        return options
    below = fallbacks(lm, options.fast)[1:]
    previous = options.choice.dropped if options.choice else ()
    dropped = (*previous, f"{effective_kind(options.fast.attention, lm.config)}: failed mid-job ({failure})")
    if not below:
        return dataclasses.replace(options, fast=None, choice=PathChoice("eager", dropped))
    chosen, choice = choose_path(lm, below[0], dropped)
    return dataclasses.replace(options, fast=chosen, choice=choice)


def fallbacks(lm: LoadedModel, options: FastOptions) -> list[FastOptions]:
    """`options`, then the same on SDPA unless it already is."""
    uses = {effective_kind(k, lm.config) for k in (options.attention, options.verify_attention or options.attention)}
    if uses == {"sdpa"}:
        return [options]
    return [options, dataclasses.replace(options, attention="sdpa", verify_attention=None)]


def self_test(lm: LoadedModel, options: FastOptions) -> str | None:
    """None if the fast path under `options` gives the eager model's tokens and logits, else what went wrong."""
    try:
        with torch.inference_mode():
            return _compare(lm, options)
    except Exception as error:  # noqa: BLE001 - whatever the path raised, it is not used
        cause = error.__cause__ if isinstance(error, FastPathError) and error.__cause__ else error
        return f"{type(cause).__name__}: {cause}"


def _compare(lm: LoadedModel, options: FastOptions) -> str | None:
    capacity = padded_capacity(PROMPT_LEN + STEPS + VERIFY_ROWS + 1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(lm.config.vocab_size, (capacity,), generator=g).to(lm.device)
    eager, cache = _prefilled(lm, ids, capacity), _prefilled(lm, ids, capacity, slot_major=True)  # as the engine
    greedy = Sampler(Settings(temperature=0.0), lm.config.vocab_size, lm.device)
    passes = FastPasses(lm, cache, options, greedy, ids, queries=False)
    tol = TOLERANCE[lm.dtype]
    n = PROMPT_LEN
    for _ in range(STEPS):
        ref = lm.model(ids[n:n + 1], torch.tensor([n], device=lm.device), eager, n).logits
        why = _differ("AR logits", passes.ar(ids[n:n + 1], n)[0], ref, tol)
        why = why or _token_differs("AR", passes.ar_token(n)[0], ref[0], tol)
        if why:
            return why
        ids[n + 1] = ref[0].argmax()
        n += 1
    return _compare_verify(lm, passes, eager, ids, n, tol)


def _compare_verify(lm: LoadedModel, passes: FastPasses, eager: KVCache, ids: torch.Tensor, n: int,
                    tol: float) -> str | None:
    g = torch.Generator().manual_seed(1)
    levels = [torch.randint(lm.config.vocab_size, w, generator=g).tolist() for w in LEVELS]
    trie = build_trie(int(ids[n]), levels, [])
    tokens, positions, tree = (t.to(lm.device) for t in verify_inputs(trie, n, VERIFY_ROWS))
    ref = lm.model(tokens, positions, eager, n, with_prefix(tree, n, positions, None)).logits
    logits, _, targets, _, _ = passes.verify(trie, n, VERIFY_ROWS)
    rows = len(trie.tokens)
    why = _differ("verify logits", logits[:rows], ref[:rows], tol)
    for row in range(rows):  # the pass samples (FastPasses was given a sampler)
        why = why or _token_differs(f"verify row {row}", targets[row], ref[row], tol)
    return why


def _prefilled(lm: LoadedModel, ids: torch.Tensor, capacity: int, slot_major: bool = False) -> KVCache:
    cfg = lm.config
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, capacity, cfg.head_dim, lm.device, lm.dtype, slot_major)
    prefill(lm.model, ids[:PROMPT_LEN], cache, keep=1)
    return cache


def _differ(what: str, got: torch.Tensor, ref: torch.Tensor, tol: float) -> str | None:
    scale = max(1.0, ref.double().abs().max().item())
    diff = (got.double() - ref.double()).abs().max().item()
    if not diff <= tol * scale:  # NaN fails too
        return f"{what} differ by {diff:.3g} (tolerance {tol * scale:.3g})"
    return None


def _token_differs(what: str, token: int, ref: torch.Tensor, tol: float) -> str | None:
    """A greedy token other than the eager one, unless the two logits tie within the tolerance."""
    scale = max(1.0, ref.double().abs().max().item())
    if ref[token] < ref.max() - tol * scale:
        return f"{what} token {token}, the eager model's {int(ref.argmax())}"
    return None
