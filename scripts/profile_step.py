"""Where one plain decoding step's time goes (issue 32): torch's profiler over AR steps of the default model.

Prints, per precision and context, the step's wall time, the operators per step, and the operators that take the
most self time (with their share of the step), and writes them as JSON:

    .venv/bin/python scripts/profile_step.py --dtypes float32,q4 --contexts 0,2048 --threads 1 --json prof.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from tokenswift.bench.runs import filler_ids
from tokenswift.decode.engine import Engine
from tokenswift.decode.options import EngineOptions
from tokenswift.model.default_model import default_model_path
from tokenswift.model.loading import load_model
from tokenswift.settings import PLAIN, Settings


def profile_steps(lm, context: int, steps: int, warmup: int) -> dict:
    ids = filler_ids(lm, max(context, 1))
    engine = Engine(lm, Settings(max_new_tokens=2 * (steps + warmup) + 2, ignore_eos=True), ids, len(ids),
                    EngineOptions(speculation=PLAIN))
    engine.start()
    for _ in range(warmup):
        engine.ar_step()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.ar_step()
    plain_ms = 1e3 * (time.perf_counter() - t0) / steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.ar_step()
    events = prof.key_averages()
    total_us = sum(e.self_cpu_time_total for e in events)
    ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    top = [{"op": e.key, "calls_per_step": e.count / steps, "ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            "share": e.self_cpu_time_total / total_us} for e in ops[:15]]
    return {"context": context, "step_ms": plain_ms, "tokens_per_s": 1e3 / plain_ms,
            "ops_per_step": sum(e.count for e in events) / steps, "profiled_ms": total_us / 1e3 / steps, "top": top}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="checkpoint or GGUF (default: the app's default model)")
    p.add_argument("--dtypes", default="float32,q4")
    p.add_argument("--contexts", default="0,2048")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--json", dest="json_out")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = args.model or str(default_model_path())
    results = []
    for dtype in args.dtypes.split(","):
        lm = load_model(model, dtype=dtype, heads="none")
        for context in (int(c) for c in args.contexts.split(",")):
            r = {"dtype": dtype, "threads": args.threads, **profile_steps(lm, context, args.steps, args.warmup)}
            results.append(r)
            print(f"\n{dtype} context {context} threads {args.threads}: {r['step_ms']:.1f} ms/step "
                  f"({r['tokens_per_s']:.1f} tokens/s), {r['ops_per_step']:.0f} operators/step, "
                  f"profiled {r['profiled_ms']:.1f} ms")
            for t in r["top"]:
                print(f"  {t['op']:<44}{t['calls_per_step']:>8.0f}{t['ms_per_step']:>9.2f} ms{100 * t['share']:>6.1f}%")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
