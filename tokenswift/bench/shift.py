"""`python -m tokenswift bench-shift`: a draft longer than the model's context, AR versus TokenSwift, and the
share of the time spent on context shifts (re-prefilling the window, tokenswift/text/context_window.py).

Both modes run in this process on the same model, prompt, seed and window, alternating in slices (runs.alternate),
so the rates compare our own paths on one machine (design §7): run one after the other, the two halves of a
20K-token draft met a machine 8-21% slower in the second (the same prefills took that much longer), which no ratio
survives. Prefill is excluded from every rate, shifts are included (they are part of writing a long draft), and the
two texts must be identical.
"""

from __future__ import annotations

from tokenswift.bench.runs import alternate, first_divergence
from tokenswift.decode.engine import Engine
from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.model.loading import LoadedModel
from tokenswift.settings import Settings
from tokenswift.text.context_window import PinnedText

SLICE_TOKENS = 256  # a slice spans a few seconds of either mode: long against a switch, short against drift


def mode_result(engine: Engine, tokens: int) -> dict:
    m = engine.metrics.to_dict()
    use = engine.context_use()
    elapsed = m["elapsed_s"]
    return {
        "tokens": tokens, "elapsed_s": elapsed, "tokens_per_s": m["tokens_per_s"],
        "shifts": m["shifts"], "shift_s": m["shift_s"], "shift_share": m["shift_s"] / elapsed if elapsed else 0.0,
        "shift_ready": m["shift_ready"] / m["shift_rows"] if m["shift_rows"] else 0.0,
        "prefill_s": m["prefill_s"], "steps": m["steps"], "plain_steps": m["plain_steps"],
        "tokens_per_step": m["tokens_per_step"], "alpha": m["alpha"],
        "context_pinned": use.memory if use else None, "context_recent": use.recent if use else None,
    }


def bench_shift(lm: LoadedModel, prompt_ids: list[int], settings: Settings, pinned: PinnedText | None = None,
                warmup_tokens: int = 16, options: EngineOptions | None = None,
                slice_tokens: int = SLICE_TOKENS) -> dict:
    """AR and TokenSwift over settings.max_new_tokens with context shifting on, in alternating slices; a short
    untimed run of each first, so one-off costs land on neither."""
    pinned, options = pinned or PinnedText(), options or EngineOptions()
    settings = settings.replace(ignore_eos=True, stop=(), context_shift=True)
    if warmup_tokens:
        for mode in ("ar", "tokenswift"):
            n = min(warmup_tokens, settings.max_new_tokens)
            Generator(lm, settings.replace(max_new_tokens=n), prompt_ids, options=options.speculating(mode=mode),
                      pinned=pinned).run()
    plan = Generator(lm, settings, prompt_ids, options=options, pinned=pinned).plan  # checks the lengths first
    ar_tokens, ts_tokens, slices, (ar_engine, ts_engine) = alternate(lm, prompt_ids, settings, slice_tokens, options,
                                                                     pinned)
    ar, ts = mode_result(ar_engine, len(ar_tokens)), mode_result(ts_engine, len(ts_tokens))
    divergence = first_divergence(ar_tokens, ts_tokens)
    return {
        "model": lm.name, "device": str(lm.device), "dtype": lm.precision,
        "heads": lm.heads.gamma if lm.heads is not None else 0, "prompt_tokens": len(prompt_ids),
        "new_tokens": settings.max_new_tokens, "window": plan.size, "shift_step": plan.step,
        "pinned_tokens": plan.fixed, "identical": divergence is None, "first_divergence": divergence,
        "speedup": ts["tokens_per_s"] / ar["tokens_per_s"] if ar["tokens_per_s"] else 0.0,
        "slice_tokens": slice_tokens, "slices": slices, "ar": ar, "tokenswift": ts,
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
