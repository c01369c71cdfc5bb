"""Benchmarks behind `python -m tokenswift bench` and `bench-ar`: pure functions that return dicts.

Both measure in one process on one loaded model, so the comparison is against our own fast AR path on the
same machine (design §7), never against a number from elsewhere. Prefill is excluded from every rate.
"""

from __future__ import annotations

import json
import lzma
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator, open_engine, validate
from tokenswift.decode.lookahead import matching
from tokenswift.decode.metrics import distinct
from tokenswift.decode.options import EngineOptions
from tokenswift.model.kv_cache import row_bytes
from tokenswift.model.loading import LoadedModel
from tokenswift.settings import PLAIN, DraftSettings, Settings
from tokenswift.text.context_window import PinnedText

# Filler for bench-ar contexts: real prose, so the cache holds ordinary token statistics, not one id.
FILLER = (
    "The rain had stopped by the time the coach reached the crossroads, and the driver climbed down to "
    "look at the wheel. The inn stood dark behind its hedge, and only one window showed a candle. "
    "She walked slowly along the river, counting the boats that lay at anchor, and "
    "wondered whether the letter would come before the winter set in. Nobody in the village could remember "
    "a summer so long, nor a harvest so poor, and the old men spoke of it every evening at the inn. "
)
COPY_BYTES = 256 * 2**20  # large enough that a device copy runs at full bandwidth


class BenchError(ValueError):
    """Bad benchmark input (the CLI turns it into one error line and exit code 2)."""


# -- prompts -------------------------------------------------------------------------------------------


def book_text(books: Path, index: int) -> str:
    """The text of the index-th book (0-based) of a JSON-lines .xz file, reading no further than needed."""
    if not books.is_file():
        raise BenchError(f"books file {books} not found (pass --books)")
    if index < 0:
        raise BenchError(f"book index must be >= 0, got {index}")
    count = 0
    with lzma.open(books, "rt", encoding="utf-8") as lines:
        for count, line in enumerate(lines):
            if count == index:
                return json.loads(line)["text"]
    raise BenchError(f"{books} has {count + 1} books (indices 0..{count}), asked for {index}")


def leading_tokens(lm: LoadedModel, text: str, n: int) -> list[int]:
    """BOS + the first tokens of `text`, n ids in all (fewer when the text is short).

    Tokenising a whole novel is slow, so grow a character prefix until it covers n tokens."""
    chars = 8 * n
    while True:
        ids = lm.encode(text[:chars])
        if len(ids) >= n or chars >= len(text):
            return ids[:n]
        chars *= 2


def filler_ids(lm: LoadedModel, n: int) -> list[int]:
    """A prompt of exactly n ids: BOS then the filler prose repeated."""
    body = lm.encode(FILLER)
    bos, body = body[:1], body[1:]
    reps = n // max(len(body), 1) + 1
    return (bos + body * reps)[:n]


# -- bench-ar ------------------------------------------------------------------------------------------


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work, so that a host clock times it (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int = COPY_BYTES, repeats: int = 10) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (read + write), the practical ceiling."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync_device(device)
    return 2 * nbytes * repeats / (time.perf_counter() - t0)


def weight_bytes(lm: LoadedModel) -> int:
    """Bytes of weights one decoding step reads. An untied input embedding only reads one row: left out."""
    model = lm.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if not lm.config.tie_embeddings:
        emb = model.model.embed_tokens.weight
        total -= emb.numel() * emb.element_size()
    return total


def kv_bytes_per_token(lm: LoadedModel) -> int:
    cfg = lm.config
    return 2 * cfg.n_layers * cfg.n_kv_heads * row_bytes(cfg.head_dim, lm.cache_dtype)


# bench-ar's contexts take turns (every context `steps / AR_ROUNDS` steps a round): on this shared CPU the speed moved
# by 10-30% from one minute to the next, and contexts timed one after the other compared minutes, not contexts.
AR_ROUNDS = 8


def ar_engine(lm: LoadedModel, context: int, steps: int, warmup: int = 4, temperature: float = 0.0) -> Engine:
    """A plain-decoding engine with `context` tokens already in the cache and `warmup` steps taken, room for `steps`
    more; temperature 0: greedy, as the llama.cpp peer (scripts/bench_llamacpp.py) decodes. Its steps alone are
    timed, as llama-bench times its own: no window filled ahead on the other core."""
    settings = Settings(max_new_tokens=warmup + steps + 1, ignore_eos=True, temperature=temperature)
    ids = filler_ids(lm, context)
    engine = Engine(lm, settings, ids, len(ids), EngineOptions(speculation=PLAIN, lookahead=False))
    engine.start()
    for _ in range(warmup):
        engine.ar_step()
    return engine


def _timed_steps(engine: Engine, steps: int) -> float:
    sync_device(engine.lm.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.ar_step()
    sync_device(engine.lm.device)
    return time.perf_counter() - t0


def ar_rounds(lm: LoadedModel, contexts: Sequence[int], steps: int, warmup: int = 4,
              temperature: float = 0.0) -> list[dict]:
    """Plain AR decoding speed at each context, the contexts timed in turns (AR_ROUNDS rounds, in reverse order every
    other round: the side timed second ran 5-15% slower in `alternate`'s runs): tokens/s over all of a context's
    steps, and `vs_first`, the median over rounds of its speed over the first context's in the same round (so a
    machine whose speed drifts moves both alike). Every context's engine, and so its cache, lives until the end."""
    engines = [ar_engine(lm, c, steps, warmup, temperature) for c in contexts]
    rounds = min(AR_ROUNDS, steps)
    seconds = [[] for _ in contexts]  # per context, per round: every context takes the same steps in a round
    for r in range(rounds):
        share = steps // rounds + (r < steps % rounds)
        order = range(len(engines)) if r % 2 == 0 else reversed(range(len(engines)))
        for i in order:
            seconds[i].append(_timed_steps(engines[i], share))
    rows = []
    for context, engine, times in zip(contexts, engines, seconds, strict=True):
        elapsed = sum(times)
        rows.append({"context": context, "steps": steps, "elapsed_s": elapsed, "tokens_per_s": steps / elapsed,
                     "step_ms": 1e3 * elapsed / steps, "prefill_s": engine.metrics.prefill_s,
                     "vs_first": statistics.median(a / b for a, b in zip(seconds[0], times, strict=True)),
                     # mean filled cache length while timing: what each step's attention read
                     "mean_kv_tokens": context + warmup + (steps + 1) / 2})
    return rows


def bench_ar(lm: LoadedModel, contexts: Sequence[int], steps: int = 64, warmup: int = 4,
             temperature: float = 0.0) -> dict:
    """AR tokens/s per context length (ar_rounds); on CUDA also the bandwidth achieved versus a measured copy."""
    cuda = lm.device.type == "cuda"
    copy_bw = copy_bandwidth(lm.device) if cuda else None
    weights, kv_token = weight_bytes(lm), kv_bytes_per_token(lm)
    skipped = {}
    for context in contexts:
        need = context + warmup + steps + 1
        if need > lm.max_context:
            skipped[context] = (f"context + {warmup + steps + 1} decoded tokens = {need} exceeds the model's limit "
                                f"of {lm.max_context}")
    timed = [c for c in contexts if c not in skipped]
    measured = iter(ar_rounds(lm, timed, steps, warmup, temperature) if timed else [])
    rows = []
    for context in contexts:
        if context in skipped:
            rows.append({"context": context, "skipped": skipped[context]})
            continue
        row = next(measured)  # in the order timed, each context's own row
        if cuda:
            moved = weights + kv_token * row["mean_kv_tokens"]
            row["bandwidth_gb_s"] = moved / (row["step_ms"] / 1e3) / 1e9
            row["bandwidth_fraction"] = row["bandwidth_gb_s"] * 1e9 / copy_bw
        rows.append(row)
    return {"model": lm.name, "device": str(lm.device), "dtype": lm.precision,
            "steps": steps, "warmup": warmup, "temperature": temperature, "weight_bytes": weights,
            "kv_bytes_per_token": kv_token,
            "copy_bandwidth_gb_s": copy_bw / 1e9 if copy_bw else None, "rows": rows}


# -- bench: AR versus TokenSwift -----------------------------------------------------------------------


def _run(lm: LoadedModel, settings: Settings, prompt_ids: list[int], options: EngineOptions,
         pinned: PinnedText | None = None) -> list[int]:
    return Generator(lm, settings, prompt_ids, options=options, pinned=pinned).run()


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    n = matching(a, b)
    return None if n == len(a) == len(b) else n


def _timed(engine: Engine, out: list[int], goal: int, step) -> float:
    """Step `engine` until `out` holds `goal` tokens (a TokenSwift iteration may overshoot); seconds taken."""
    sync_device(engine.lm.device)
    t0 = time.perf_counter()
    while len(out) < goal:
        out += step().tokens
    sync_device(engine.lm.device)
    return time.perf_counter() - t0


def alternate(lm: LoadedModel, prompt_ids: list[int], settings: Settings, slice_tokens: int, options: EngineOptions,
              pinned: PinnedText | None = None) -> tuple[list[int], list[int], list[dict], tuple[Engine, Engine]]:
    """Plain decoding and TokenSwift (options.speculation's) in turns of `slice_tokens`, each continuing its own
    state, so a machine whose load drifts slows both alike and every slice gives a ratio measured under the same
    load. The side timed first changes every slice: on this CPU the side timed second ran 5-15% slower in two runs
    of three (two plain-decoding sides at 7K, whichever was opened first), and TokenSwift was always timed second.
    pinned: the window's World Info (and Memory), as a draft's. Each side's lookahead (the next window filled on a
    spare core) pauses while the other side is timed: left running, it had twice a run's time to fill, and shifts
    looked cheaper than they are."""
    if slice_tokens < 1:
        raise BenchError(f"slice tokens must be >= 1, got {slice_tokens}")
    plan = validate(lm, settings, prompt_ids, [], pinned, PLAIN)  # the modes' windows are the same
    # Banned phrases hold back and rewind alike in both (generate.open_engine): the slices count final tokens.
    ar = open_engine(lm, settings, prompt_ids, len(prompt_ids), options.speculating(mode="ar"), plan)
    ts = open_engine(lm, settings, prompt_ids, len(prompt_ids), options.speculating(mode="tokenswift"), plan)
    try:
        ar_out, ts_out = ar.start(), ts.start()
        n, slices = settings.max_new_tokens, []
        while len(ar_out) < n or len(ts_out) < n:
            goal = min(n, (len(slices) + 1) * slice_tokens)
            a0, t0, m0 = len(ar_out), len(ts_out), _counts(ts)
            if len(slices) % 2:
                ts_s, ar_s = _turn(ts, ts_out, goal, ts.ts_step), _turn(ar, ar_out, goal, ar.ar_step)
            else:
                ar_s, ts_s = _turn(ar, ar_out, goal, ar.ar_step), _turn(ts, ts_out, goal, ts.ts_step)
            ar_rate = (len(ar_out) - a0) / ar_s if ar_s else 0.0
            ts_rate = (len(ts_out) - t0) / ts_s if ts_s else 0.0
            slices.append({"end": goal, "ar_tokens": len(ar_out) - a0, "ar_s": ar_s, "ts_tokens": len(ts_out) - t0,
                           "ts_s": ts_s, "ratio": ts_rate / ar_rate if ar_rate else 0.0,
                           **{k: v - m0[k] for k, v in _counts(ts).items()}})
    finally:
        ar.close()
        ts.close()
    return ar_out[:n], ts_out[:n], slices, (ar, ts)


def _turn(engine: Engine, out: list[int], goal: int, step) -> float:
    """One side's timed turn (_timed), then its lookahead paused until its next turn (untimed)."""
    seconds = _timed(engine, out, goal, step)
    engine.close()
    return seconds


SLICE_COUNTS = ("steps", "plain_steps", "accepted", "ngram_accepted")  # TokenSwift's counters, per slice


def _counts(engine: Engine) -> dict[str, int]:
    """TokenSwift's counters now; ts_emitted: the tokens its iterations and plain steps emitted (metrics.tokens,
    before a banned phrase's hold-back or rewind, as the run's tokens per step counts them)."""
    return {**{f"ts_{name}": getattr(engine.metrics, name) for name in SLICE_COUNTS},
            "ts_emitted": engine.metrics.tokens}


def windows(slices: list[dict], ts_tokens: list[int], per: int, depth: int) -> list[dict]:
    """The run in windows of `per` slices (a last part shorter than half a window joins the window before it):
    speed-up, acceptance and n-gram share, and how varied TokenSwift's text is there (distinct-4), to see whether
    the gain grows with length and whether it was earned on varied text. A window's speed-up is its tokens per
    second over its slices' (the run's headline is the median slice's)."""
    groups = [slices[i:i + per] for i in range(0, len(slices), per)]
    if len(groups) > 1 and 2 * len(groups[-1]) < per:
        groups[-2:] = [groups[-2] + groups[-1]]
    out, start = [], 0
    for group in groups:
        total = {k: sum(x[k] for x in group) for k in group[0] if k not in ("end", "ratio")}
        ar_rate = total["ar_tokens"] / total["ar_s"] if total["ar_s"] else 0.0
        ts_rate = total["ts_tokens"] / total["ts_s"] if total["ts_s"] else 0.0
        steps, accepted, plain = total["ts_steps"], total["ts_accepted"], total["ts_plain_steps"]
        end = group[-1]["end"]
        out.append({"start": start, "end": end, "ar_tokens_per_s": ar_rate, "ts_tokens_per_s": ts_rate,
                    "speedup": ts_rate / ar_rate if ar_rate else 0.0,
                    "alpha": accepted / (depth * steps) if steps else 0.0,
                    "tokens_per_step": (total["ts_emitted"] - plain) / steps if steps else 0.0,
                    "ngram_share": total["ts_ngram_accepted"] / accepted if accepted else 0.0,
                    "plain_share": plain / max(steps + plain, 1),
                    "distinct4": distinct(ts_tokens[start:end])[3]})
        start = end
    return out


def pass_costs(engine: Engine) -> dict:
    """Measured seconds and tokens per iteration of each candidate shape (adaptive runs), and a plain step's."""
    policy = engine.policy
    if policy is None:
        return {}
    shapes = [{"shape": s.label(), "rows": s.slots, "seconds": sec, "tokens": tok,
               "tokens_per_s": tok / sec if tok and sec else None}
              for s, sec, tok in zip(policy.shapes, policy.seconds, policy.tokens, strict=True)]
    return {"shapes": shapes, "plain_step_s": policy.plain_seconds}


def compare(lm: LoadedModel, prompt_ids: list[int], settings: Settings, warmup_tokens: int = 16,
            slice_tokens: int = 128, options: EngineOptions | None = None, pinned: PinnedText | None = None,
            window_tokens: int = 2048) -> dict:
    """AR and TokenSwift (options.speculation's) on the same prompt, seed and settings, in this process (fixed
    length: EOS ignored), alternating in slices (see `alternate`). The speed-up is the median of the per-slice ratios;
    `windows` the run per window_tokens new tokens (see `windows`).

    A short run of each mode first, so one-off costs (kernel selection, allocator growth, lazy imports)
    do not land on whichever mode happens to run first."""
    if window_tokens < slice_tokens or window_tokens % slice_tokens:
        raise BenchError(f"window tokens must be a multiple of the slice tokens ({slice_tokens}), got {window_tokens}")
    settings = settings.replace(ignore_eos=True, stop=())
    options = options or EngineOptions()
    if warmup_tokens:
        n = min(warmup_tokens, settings.max_new_tokens)
        for mode in ("ar", "tokenswift"):
            _run(lm, settings.replace(max_new_tokens=n), prompt_ids, options.speculating(mode=mode), pinned)
    ar_tokens, ts_tokens, slices, (_, engine) = alternate(lm, prompt_ids, settings, slice_tokens, options, pinned)
    ts = engine.metrics.to_dict()
    # Wall time of the slices (the TokenSwift side includes its periodic AR probes): what a writer waits.
    ar_s, ts_s = sum(x["ar_s"] for x in slices), sum(x["ts_s"] for x in slices)
    ar_n, ts_n = sum(x["ar_tokens"] for x in slices), sum(x["ts_tokens"] for x in slices)
    ratios = sorted(x["ratio"] for x in slices)
    divergence = first_divergence(ar_tokens, ts_tokens)
    dist = distinct(ts_tokens)
    ar_rate, ts_rate = ar_n / ar_s if ar_s else 0.0, ts_n / ts_s if ts_s else 0.0
    return {
        "model": lm.name, "device": str(lm.device), "dtype": lm.precision, "path": ts["path"],
        "capture_s": ts["capture_s"],
        "heads": lm.heads.gamma if lm.heads is not None else 0,
        "drafter": type(engine.drafter).__name__, "adaptive": engine.policy is not None,
        "prompt_tokens": len(prompt_ids), "new_tokens": len(ts_tokens),
        "ar_tokens_per_s": ar_rate, "ts_tokens_per_s": ts_rate,
        "speedup": statistics.median(ratios), "speedup_min": ratios[0], "speedup_max": ratios[-1],
        "speedup_overall": ts_rate / ar_rate if ar_rate else 0.0,
        "slice_tokens": slice_tokens, "slices": slices,
        "windows": windows(slices, ts_tokens, window_tokens // slice_tokens, ts["depth"]),
        "identical": divergence is None, "first_divergence": divergence,
        "alpha": ts["alpha"], "beta": ts["beta"], "tokens_per_step": ts["tokens_per_step"],
        "steps": ts["steps"], "plain_steps": ts["plain_steps"], "plain_share": ts["plain_share"],
        "ngram_hits": ts["ngram_hits"], "accept_histogram": ts["accept_histogram"],
        "verify_batches": ts["verify_batches"], "pass_costs": pass_costs(engine),
        "distinct": dist, "distinct_avg": sum(dist) / len(dist),
        "ar_elapsed_s": ar_s, "ts_elapsed_s": ts_s, "ts_prefill_s": ts["prefill_s"],
        "draft_s": ts["draft_s"], "verify_s": ts["verify_s"], "overhead_s": ts["overhead_s"],
        "overhead_share": ts["overhead_s"] / ts_s if ts_s else 0.0,
        "settings": DraftSettings(settings, options.speculation).values(),
    }
