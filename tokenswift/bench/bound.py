"""The most TokenSwift can gain from the passes of this model on this machine: `python -m tokenswift bench-bound`.

`bench` measures what the engine achieves. This bounds what any iteration built on the same verify pass could
achieve, from two measurements the iteration cannot escape:

- Acceptance per shape. One run verifies the widest shape of the adaptive ladder at every iteration; the walk
  follows the target's own tokens, so each iteration tells exactly how many tokens every smaller shape would
  have accepted there (adaptive.accepted_under). All shapes are thus scored on the same text, which is the
  text plain decoding writes.
- The verify pass against a plain step, timed in isolation and in alternation at the given contexts: the
  model's forward over the shape's rows with the logits of one row, against one row with its logits.
  Drafting, extra logits rows, sampling, the walk and bookkeeping are left out; a real iteration pays them on
  top (a plain step samples each token too, and so does the walk, once per emitted token).

    bound(S) = tokens per iteration(S) * plain step / verify pass(rows(S))

is then the speed-up of an iteration that cost its verify forward and nothing else: no drafter with these
acceptances and no engine around these passes does better. A target above every shape's bound cannot be
reached without more accepted tokens per iteration or cheaper multi-row passes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from tokenswift.bench.gpu import random_cache
from tokenswift.bench.runs import filler_ids, sync_device
from tokenswift.decode.adaptive import CandidatePolicy, Shape, accepted_under
from tokenswift.decode.engine import Engine
from tokenswift.decode.options import EngineOptions
from tokenswift.model.loading import LoadedModel
from tokenswift.model.masks import causal_mask
from tokenswift.settings import CAPACITY_SPARE, Settings, Speculation


class WidestShape(CandidatePolicy):
    """Always the ladder's widest shape (it contains every other), tallying what each shape would have
    accepted at every iteration: whole-run means, not the adaptive policy's running estimates."""

    def __init__(self, shapes: Sequence[Shape]):
        super().__init__(shapes, plain_explore_share=None)
        self.accepted = [0] * len(self.shapes)

    def choose(self, plain_ok: bool = True) -> Shape:
        self.current = 0
        return self.shapes[0]

    def observe(self, levels, paths, accepted, seconds, switch_s: float = 0.0) -> None:
        super().observe(levels, paths, accepted, seconds, switch_s)
        for j, shape in enumerate(self.shapes):
            self.accepted[j] += accepted_under(shape, levels, paths, accepted)

    def tokens_per_iteration(self) -> list[float]:
        return [1 + a / max(self.iteration, 1) for a in self.accepted]


def acceptance(engine: Engine, produced: int, goal: int) -> dict:
    """Tokens per iteration of every ladder shape while a started adaptive engine writes `goal` tokens."""
    policy = engine.policy = WidestShape(engine.policy.shapes)
    while produced < goal:
        produced += len(engine.ts_step().tokens)
    return {"iterations": policy.iteration, "new_tokens": produced,
            "shapes": [{"shape": s.label(), "rows": s.slots, "tokens": t}
                       for s, t in zip(policy.shapes, policy.tokens_per_iteration(), strict=True)]}


@torch.inference_mode()
def pass_times(lm: LoadedModel, context: int, rows: Sequence[int], repeats: int = 15) -> dict[int, float]:
    """Median seconds of a forward over each row count after `context` cached tokens, with one row's logits
    (rows = 1: a plain step's forward). Row counts take turns within every repeat, so load drift hits all."""
    most = max(rows)
    lm.check_positions(context + most + CAPACITY_SPARE)
    # A pass's cost does not depend on what the cache holds: random K/V stand for the `context` tokens before it,
    # laid out as bench_bound's engine (no fast path) keeps them; on a CPU the slot-major layout cost a plain step at
    # a 7K context half as much again.
    cache = random_cache(lm, context + most + CAPACITY_SPARE, slot_major=False)
    ids = torch.tensor(filler_ids(lm, most), device=lm.device)
    positions = torch.arange(context, context + most, device=lm.device)
    inputs = {}
    for t in rows:
        mask = None if t == 1 else causal_mask(context, t, positions[:t], lm.config.sliding_window, lm.device)
        inputs[t] = (ids[:t], positions[:t], mask)
    times: dict[int, list[float]] = {t: [] for t in rows}
    for repeat in range(repeats + 1):
        for t in rows:
            tokens, pos, mask = inputs[t]
            sync_device(lm.device)
            t0 = time.perf_counter()
            out = lm.model(tokens, pos, cache, context, mask, logits="none", exact_rows=True)
            lm.model.logits_of(out.hidden[:1])
            sync_device(lm.device)
            if repeat:  # the first round warms kernels and allocator up
                times[t].append(time.perf_counter() - t0)
    return {t: statistics.median(v) for t, v in times.items()}


def bound(accepted: dict, costs: dict[int, dict[int, float]]) -> dict:
    """Per context and shape: the pass's cost in plain steps and the speed-up bound; the best shape's; and the
    bound over the run, with the best shape at each context (a policy that switches shapes as context grows)."""
    table = []
    for context, times in costs.items():
        plain = times[1]
        shapes = [{**s, "pass_x_plain": times[s["rows"]] / plain, "bound": s["tokens"] * plain / times[s["rows"]]}
                  for s in accepted["shapes"]]
        best = max(shapes, key=lambda s: s["bound"])
        table.append({"context": context, "plain_step_ms": 1e3 * plain, "shapes": shapes,
                      "best_shape": best["shape"], "best_bound": best["bound"]})
    # Over a run whose contexts the given ones sample evenly, each at its best shape: plain time over pass time
    run = (sum(c["plain_step_ms"] for c in table)
           / sum(c["plain_step_ms"] / c["best_bound"] for c in table))
    return {"contexts": table, "best_bound": max(c["best_bound"] for c in table), "run_bound": run}


def bench_bound(lm: LoadedModel, prompt_ids: list[int], settings: Settings, contexts: Sequence[int],
                repeats: int = 15, spec: Speculation | None = None) -> dict:
    """spec: TokenSwift's options (None: the defaults)."""
    settings = settings.replace(ignore_eos=True, stop=())
    spec = (spec or Speculation()).replace(mode="tokenswift")
    engine = Engine(lm, settings, prompt_ids, len(prompt_ids),
                    EngineOptions(adaptive=True, speculation=spec, lookahead=False))  # the passes alone
    produced = len(engine.start())  # the ladder exists once the drafter does
    # The passes before the long acceptance run: a run started beside this one is then still in that phase.
    rows = sorted({1, *(s.slots for s in engine.policy.shapes)})
    costs = {c: pass_times(lm, c, rows, repeats) for c in contexts}
    accepted = acceptance(engine, produced, settings.max_new_tokens)
    return {"model": lm.name, "device": str(lm.device), "dtype": lm.precision,
            "heads": lm.heads.gamma if lm.heads is not None else 0, "drafter": type(engine.drafter).__name__,
            "prompt_tokens": len(prompt_ids),
            "acceptance": accepted, **bound(accepted, costs),
            "pass_ms": {str(c): {str(t): 1e3 * s for t, s in times.items()} for c, times in costs.items()}}


def print_bench_bound(r: dict) -> None:
    a = r["acceptance"]
    print(f"{r['model']} on {r['device']} ({r['dtype']}), {r['drafter']}, prompt {r['prompt_tokens']} tokens; "
          f"acceptance over {a['new_tokens']} new tokens ({a['iterations']} iterations of the widest shape)")
    for c in r["contexts"]:
        print(f"context {c['context']}: plain step (forward + one row of logits) {c['plain_step_ms']:.1f} ms")
        print(f"  {'shape':<14}{'rows':>6}{'tokens/iter':>13}{'pass x plain':>14}{'bound':>8}")
        for s in c["shapes"]:
            print(f"  {s['shape']:<14}{s['rows']:>6}{s['tokens']:>13.3f}{s['pass_x_plain']:>14.2f}"
                  f"{s['bound']:>7.2f}x")
        print(f"  best: {c['best_shape']} at {c['best_bound']:.2f}x")
    print(f"upper bound on the speed-up (an iteration costing its verify forward alone): {r['best_bound']:.2f}x at "
          f"the best context; {r['run_bound']:.2f}x over a run through these contexts, the best shape at each")
