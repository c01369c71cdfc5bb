"""Issue 48's GPU measurement in one short call: `python -m tokenswift.bench.gpu48 OUT` (scripts/gpu_issue48.sh).

1. profile: one plain step and one 4-row verify of the Llama-3.1-8B shape at 4K under torch.profiler: the top
   kernels and the host gaps between consecutive kernels (a gap is the device waiting for Python);
2. the 8B shape (random bf16 weights, bench/shapes.py; the cache filled with random values) at 4K/32K/100K: plain
   step (forward, sampling, the token's read) as tokens/s and bandwidth against the card's peak, and the verify
   pass for 2-64 rows as a multiple of a plain step;
3. the minutes for 100K new tokens after a 4K prompt, plain and TokenSwift, with the default model's measured
   tokens per iteration and with the paper's (alpha 0.84), beside the paper's 90 minutes (A100, 8B);
4. the default model (or, where its 98 MB GGUF did not travel, stories260k) TokenSwift vs plain at 2K and 7K
   prompts, with the syncs and replays of one iteration counted (bench/counting.py) on a run of its own.
DRY_RUN_CPU=1: the same code on a CPU with tiny shapes and short runs (the suite's rehearsal).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from tokenswift.bench.counting import per_step
from tokenswift.bench.gpu import SAMPLING, candidate_trie, integrate, random_cache, timed
from tokenswift.bench.runs import compare, copy_bandwidth, filler_ids, kv_bytes_per_token, weight_bytes
from tokenswift.bench.shapes import preset, random_model
from tokenswift.decode.adaptive import Shape
from tokenswift.decode.engine import Engine
from tokenswift.decode.options import EngineOptions
from tokenswift.draft import drafting
from tokenswift.model.fastpath import FastOptions, FastPasses, padded_capacity
from tokenswift.sampling.sampler import Sampler

PEAK_GB_S = {"H100 PCIe": 2000, "H100": 3350, "H200": 4800, "A100": 2039, "L40S": 864, "GH200": 4000}
PAPER = {"alpha": 0.84, "minutes": 90.0, "ar_minutes": 294.0, "prompt": 4096, "new_tokens": 100_000}
ROWS = (2, 4, 8, 16, 32, 64)


def plan(dry: bool) -> dict:
    """What to measure: the full run on CUDA, or the rehearsal's tiny one."""
    if dry:
        return dict(device="cpu", dtype=torch.float32, tiny=True, contexts=(64, 256), rows=(2, 4), steps=2, reps=1,
                    prompts=(32, 64), new_tokens=16, slice_tokens=8, attention="sdpa")
    return dict(device="cuda", dtype=torch.bfloat16, tiny=False, contexts=(4096, 32768, 100_000), rows=ROWS,
                steps=16, reps=8, prompts=(2048, 7168), new_tokens=1024, slice_tokens=128, attention="auto")


def peak_gb_s(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_GB_S.items() if k in name), None)


def passes_at(lm, p: dict) -> tuple[FastPasses, torch.Tensor]:
    """Fast passes over one random cache long enough for the longest context and the widest verify."""
    capacity = padded_capacity(max(p["contexts"]) + max(p["rows"]) + 8)
    ids = torch.randint(lm.config.vocab_size, (capacity,), device=lm.device)
    sampler = Sampler(SAMPLING, lm.config.vocab_size, lm.device)
    return FastPasses(lm, random_cache(lm, capacity), FastOptions(attention=p["attention"]), sampler, ids), ids


def trie_of(rows: int, vocab: int):
    """A star of rows - 1 children below the root: exactly `rows` nodes (a padded verify batch of `rows`)."""
    return candidate_trie(Shape((rows - 1,), 0), vocab)


def shape_rows(lm, p: dict) -> list[dict]:
    """Plain step and verify costs at each context (item 2 of the module docstring)."""
    passes, _ = passes_at(lm, p)
    peak, per_kv, weights = peak_gb_s(lm.device), kv_bytes_per_token(lm), weight_bytes(lm)
    out = []
    for ctx in p["contexts"]:
        step = timed(lambda c=ctx: passes.ar_token(c), p["steps"], lm.device)
        gb_s = (weights + per_kv * ctx) / step / 1e9
        verify = {}
        for rows in p["rows"]:
            trie = trie_of(rows, lm.config.vocab_size)
            verify[rows] = timed(lambda c=ctx, t=trie, r=rows: passes.verify(t, c, r), p["reps"], lm.device) / step
        out.append({"context": ctx, "plain_ms": step * 1e3, "plain_tokens_per_s": 1 / step, "gb_s": gb_s,
                    "peak_share": gb_s / peak if peak else None, "verify_over_plain": verify})
    return out


def profile(lm, p: dict, top: int = 12) -> dict:
    """Top kernels and host gaps of one plain step and one 4-row verify at the first context."""
    passes, _ = passes_at(lm, p)
    ctx, trie = p["contexts"][0], trie_of(4, lm.config.vocab_size)
    cuda = lm.device.type == "cuda"
    out = {}
    for name, fn in (("plain", lambda: passes.ar_token(ctx)), ("verify4", lambda: passes.verify(trie, ctx, 4))):
        timed(fn, 1, lm.device)  # captured and warm before profiling
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities) as prof:
            fn()
        key = "self_device_time_total" if cuda else "self_cpu_time_total"
        rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:top]
        kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                         key=lambda e: e.time_range.start)
        gaps = [b.time_range.start - a.time_range.end for a, b in zip(kernels, kernels[1:], strict=False)]
        out[name] = {"top": [{"name": e.key[:90], "us": getattr(e, key), "calls": e.count} for e in rows],
                     "kernels": len(kernels), "gap_us_total": sum(gaps), "gap_us_max": max(gaps, default=0.0)}
    return out


def shaped(p: dict):
    """The 8B shape; the rehearsal's is tiny, with a small vocabulary too (the LM head would take most of its time)."""
    cfg, hf = preset("llama3.1-8b", tiny=p["tiny"])
    if p["tiny"]:
        cfg = dataclasses.replace(cfg, vocab_size=512, bos_token_id=0, eos_token_ids=(1,))
    return random_model("llama3.1-8b", cfg, hf, p["device"], p["dtype"])


def default_model(p: dict):
    """The default model where its GGUF is here (TSWIFT_DEFAULT_MODEL or the installed package), else stories260k
    (TSWIFT_STORIES, shared/models, ../shared/models, .carry/), else None; the rehearsal: a tiny random model."""
    from tokenswift.model.default_model import default_model_path
    from tokenswift.model.loading import load_model

    if p["tiny"]:
        return shaped(p), "tiny-random"
    found = [os.environ.get("TSWIFT_DEFAULT_MODEL")]
    with contextlib.suppress(Exception):  # not installed here: the next candidate
        found.append(str(default_model_path()))
    found += [os.environ.get("TSWIFT_STORIES"), "shared/models/stories260k", "../shared/models/stories260k",
              ".carry/stories260k"]
    for path in (f for f in found if f and Path(f).exists()):
        return load_model(path, device=p["device"], dtype="bfloat16"), Path(path).name
    return None, "none found"


def engine_runs(lm, p: dict) -> list[dict]:
    """TokenSwift vs plain at each prompt length on the fast path, adaptive, with the counts of one iteration."""
    options = EngineOptions(fast=FastOptions(attention=p["attention"]), adaptive=True)
    settings = SAMPLING.replace(max_new_tokens=p["new_tokens"], seed=1)
    out = []
    for n in p["prompts"]:
        ids = filler_ids(lm, n) if lm.tokenizer is not None else list(range(5, 5 + n))
        r = compare(lm, ids, settings, slice_tokens=p["slice_tokens"], window_tokens=p["slice_tokens"],
                    options=options)
        counted = {}
        for mode in ("ar", "tokenswift"):
            engine = Engine(lm, settings.replace(ignore_eos=True), ids, len(ids),
                            EngineOptions(fast=options.fast, adaptive=False).speculating(mode=mode))
            engine.start()
            step = engine.ts_step if mode == "tokenswift" else engine.ar_step
            for _ in range(3):
                step()
            # The iteration's own counts: the time-saved probe (a plain step every PROBE_INTERVAL_S, ~1 in 1,000
            # iterations on a GPU) would land in 8 slow CPU iterations.
            engine.clock.last_probe = math.inf
            counted[mode] = per_step(step, 8)
        out.append({k: r[k] for k in ("prompt_tokens", "new_tokens", "ar_tokens_per_s", "ts_tokens_per_s", "speedup",
                                      "speedup_overall", "tokens_per_step", "plain_share", "identical",
                                      "first_divergence", "path", "capture_s", "pass_costs", "verify_batches")}
                   | {"syncs_per_iteration": counted["tokenswift"]["syncs_per_iteration"],
                      "replays_per_iteration": counted["tokenswift"]["replays_per_iteration"],
                      "plain_step": counted["ar"]})
        print(json.dumps(out[-1], default=str), flush=True)  # in the log, should the call's time run out
    return out


def projection(rows: list[dict], tau: float | None) -> float | None:
    """Minutes for the paper's 100K tokens after 4K: per token (a draft pass ~ a plain step at 4K, plus the 64-row
    verify at the context reached) / tokens per iteration, interpolated between the measured contexts."""
    if not tau:
        return None
    xs = [r["context"] for r in rows]
    widest = max(rows[0]["verify_over_plain"])
    per_token = [(rows[0]["plain_ms"] + r["verify_over_plain"][widest] * r["plain_ms"]) / tau for r in rows]
    lo = PAPER["prompt"]
    return integrate(xs, per_token, lo, lo + PAPER["new_tokens"]) / 1e3 / 60


def plain_minutes(rows: list[dict]) -> float:
    xs = [r["context"] for r in rows]
    return integrate(xs, [r["plain_ms"] for r in rows], PAPER["prompt"], PAPER["prompt"] + PAPER["new_tokens"]) / 6e4


def table(result: dict) -> str:
    lines = [f"{result['device']}  peak {result['peak_gb_s']} GB/s  copy {result['copy_gb_s']:.0f} GB/s  "
             f"({result['seconds']:.0f} s)", "8B shape: context  plain ms  tok/s   GB/s  peak  verify/plain by rows"]
    for r in result["shape"]:
        share = f"{r['peak_share']:.0%}" if r["peak_share"] else "-"
        ratios = " ".join(f"{k}:{v:.2f}" for k, v in r["verify_over_plain"].items())
        lines.append(f"  {r['context']:>7} {r['plain_ms']:>9.2f} {r['plain_tokens_per_s']:>6.0f} {r['gb_s']:>6.0f} "
                     f"{share:>5}  {ratios}")
    for name, prof in result["profile"].items():
        lines.append(f"profile {name}: {prof['kernels']} kernels, host gaps {prof['gap_us_total']:.0f} us "
                     f"(max {prof['gap_us_max']:.0f}); top: " + ", ".join(f"{t['name'][:40]} {t['us']:.0f}us"
                                                                        for t in prof["top"][:3]))
    m = result["minutes_100k"]
    lines.append(f"100K tokens: plain {m['plain']:.1f} min; TokenSwift {m['tokenswift_default_tau'] or 0:.1f} min "
                 f"(default model's tau), {m['tokenswift_paper_tau']:.1f} min (paper's tau); paper "
                 f"{PAPER['minutes']} min")
    lines.append(f"{result['model']}: prompt  plain tok/s  TS tok/s  speed-up  tau  syncs/it  replays/it  identical")
    for r in result["model_runs"]:
        lines.append(f"  {r['prompt_tokens']:>13} {r['ar_tokens_per_s']:>12.0f} {r['ts_tokens_per_s']:>9.0f} "
                     f"{r['speedup']:>8.2f}x {r['tokens_per_step']:>4.2f} {r['syncs_per_iteration']:>9.1f} "
                     f"{r['replays_per_iteration']:>11.1f}  {r['identical'] or r['first_divergence']}")
    return "\n".join(lines)


def run(out: Path, dry: bool) -> dict:
    """Every part, saved as it ends. The rehearsal runs CUDA's branches (the drafts' one read, drafting.py) and puts
    the devices back when it ends, however it ends: a test runs it in the suite's process."""
    devices = drafting.ONE_READ_DEVICES
    if dry:
        drafting.ONE_READ_DEVICES = devices | {"cpu"}
    try:
        return _measure(out, plan(dry), dry)
    finally:
        drafting.ONE_READ_DEVICES = devices


def _measure(out: Path, p: dict, dry: bool) -> dict:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    big = shaped(p)
    result = {"device": torch.cuda.get_device_name(0) if p["device"] == "cuda" else "cpu", "dry_run": dry,
              "peak_gb_s": peak_gb_s(big.device), "copy_gb_s": copy_bandwidth(big.device) / 1e9}
    # Each part is saved as it ends: a call cut short by its time limit still brings back what it measured.
    for key, measure in (("profile", profile), ("shape", shape_rows)):
        result[key] = measure(big, p)
        _save(out, result, t0)
    del big
    torch.cuda.empty_cache() if p["device"] == "cuda" else None
    small, result["model"] = default_model(p)
    result["model_runs"] = engine_runs(small, p) if small is not None else []
    taus = [r["tokens_per_step"] for r in result["model_runs"]]
    result["minutes_100k"] = {"plain": plain_minutes(result["shape"]),
                              "tokenswift_default_tau": projection(result["shape"], max(taus, default=None)),
                              "tokenswift_paper_tau": projection(result["shape"], 1 + 4 * PAPER["alpha"]),
                              "paper_tokenswift": PAPER["minutes"], "paper_ar": PAPER["ar_minutes"]}
    _save(out, result, t0)
    (out / "issue48.txt").write_text(table(result) + "\n")
    return result


def _save(out: Path, result: dict, t0: float) -> None:
    result["seconds"] = time.perf_counter() - t0
    (out / "issue48.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"saved {sorted(result)} after {result['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    res = run(Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "gpu-out")),
              os.environ.get("DRY_RUN_CPU") == "1")
    print(table(res))
