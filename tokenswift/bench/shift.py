"""`python -m tokenswift bench-shift`: a draft longer than the model's context, AR versus TokenSwift, and the
share of the time spent on context shifts (re-prefilling the window, tokenswift/text/context_window.py).

Both modes run in this process on the same model, prompt, seed and window, so the rates compare our own
paths on one machine (design §7); prefill is excluded from every rate, shifts are included (they are part of
writing a long draft), and the two texts must be identical.
"""

from __future__ import annotations

import time

from tokenswift.bench.runs import first_divergence
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.model.loading import LoadedModel
from tokenswift.settings import Settings
from tokenswift.text.context_window import PinnedText


def run_mode(lm: LoadedModel, settings: Settings, prompt_ids: list[int], pinned: PinnedText,
             options: EngineOptions) -> tuple[list[int], dict]:
    gen = Generator(lm, settings, prompt_ids, options=options, pinned=pinned)
    t0 = time.perf_counter()
    tokens = gen.run()
    wall = time.perf_counter() - t0
    m = gen.metrics().to_dict()
    use = gen.context_use()
    elapsed = m["elapsed_s"]
    return tokens, {
        "tokens": len(tokens), "elapsed_s": elapsed, "wall_s": wall, "tokens_per_s": m["tokens_per_s"],
        "shifts": m["shifts"], "shift_s": m["shift_s"], "shift_share": m["shift_s"] / elapsed if elapsed else 0.0,
        "shift_ready": m["shift_ready"] / m["shift_rows"] if m["shift_rows"] else 0.0,
        "prefill_s": m["prefill_s"], "steps": m["steps"], "plain_steps": m["plain_steps"],
        "tokens_per_step": m["tokens_per_step"], "alpha": m["alpha"],
        "context_pinned": use.memory if use else None, "context_recent": use.recent if use else None,
    }


def bench_shift(lm: LoadedModel, prompt_ids: list[int], settings: Settings, pinned: PinnedText | None = None,
                warmup_tokens: int = 16, options: EngineOptions | None = None) -> dict:
    """AR and TokenSwift over settings.max_new_tokens with context shifting on; a short untimed run of each
    first, so one-off costs land on neither."""
    pinned, options = pinned or PinnedText(), options or EngineOptions()
    settings = settings.replace(ignore_eos=True, stop=(), context_shift=True)
    if warmup_tokens:
        for mode in ("ar", "tokenswift"):
            n = min(warmup_tokens, settings.max_new_tokens)
            Generator(lm, settings.replace(max_new_tokens=n), prompt_ids, options=options.speculating(mode=mode),
                      pinned=pinned).run()
    ar_tokens, ar = run_mode(lm, settings, prompt_ids, pinned, options.speculating(mode="ar"))
    ts_tokens, ts = run_mode(lm, settings, prompt_ids, pinned, options.speculating(mode="tokenswift"))
    plan = Generator(lm, settings, prompt_ids, options=options, pinned=pinned).plan
    divergence = first_divergence(ar_tokens, ts_tokens)
    return {
        "model": lm.name, "device": str(lm.device), "dtype": lm.precision,
        "heads": lm.heads.gamma if lm.heads is not None else 0, "prompt_tokens": len(prompt_ids),
        "new_tokens": settings.max_new_tokens, "window": plan.size, "shift_step": plan.step,
        "pinned_tokens": plan.fixed, "identical": divergence is None, "first_divergence": divergence,
        "speedup": ts["tokens_per_s"] / ar["tokens_per_s"] if ar["tokens_per_s"] else 0.0,
        "ar": ar, "tokenswift": ts,
    }


def print_bench_shift(r: dict) -> None:
    print(f"{r['model']} on {r['device']} ({r['dtype']}), prompt {r['prompt_tokens']} tokens, {r['new_tokens']:,} "
          f"new tokens, window {r['window']:,} (shift step {r['shift_step']:,}, pinned {r['pinned_tokens']})")
    print(f"{'mode':<12}{'tokens/s':>10}{'elapsed s':>11}{'shifts':>8}{'shift s':>9}{'shift %':>9}{'ahead %':>9}")
    for name in ("ar", "tokenswift"):
        m = r[name]
        print(f"{name:<12}{m['tokens_per_s']:>10.1f}{m['elapsed_s']:>11.2f}{m['shifts']:>8}{m['shift_s']:>9.2f}"
              f"{100 * m['shift_share']:>8.1f}%{100 * m['shift_ready']:>8.1f}%")
    same = "yes" if r["identical"] else f"no (first divergence at {r['first_divergence']})"
    print(f"speed-up {r['speedup']:.2f}x | identical: {same}")
