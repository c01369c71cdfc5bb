"""The compact KV caches (issue 50, item 2: bf16 and q8) against the float32 one on the default model (q4): a plain
step and 2- and 4-row verify passes at 2K and 7K contexts (the forward alone, the caches in alternation, medians),
and how close each compact cache's model stays to the float32 cache's over `--tokens` tokens of held-out text after
an opening, read by all (teacher forcing), every row computed as a plain step computes it (the C kernels' exact
rows; a prefill's torch rows would hide the kernels' own arithmetic): the share of positions where each one's
likeliest next token is the float32 cache's, and the book's own next token; and the mean KL of its next-token
distribution from float32's. Not a test; prints tables and writes JSON.

    .venv/bin/python scripts/bench_kv_cache.py --threads 1 --json runs/kv_cache.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tokenswift.bench.gpu import random_cache  # noqa: E402
from tokenswift.bench.runs import book_text, leading_tokens  # noqa: E402
from tokenswift.cli.bench import BOOKS_DIR  # noqa: E402
from tokenswift.model.default_model import default_model_path  # noqa: E402
from tokenswift.model.kv_cache import KVCache  # noqa: E402
from tokenswift.model.kv_q8 import Q8  # noqa: E402
from tokenswift.model.loading import compact_cache, load_model  # noqa: E402
from tokenswift.model.masks import causal_mask  # noqa: E402
from tokenswift.model.prefill import prefill  # noqa: E402

CACHES = {"float32": torch.float32, "bf16": torch.bfloat16, "q8": Q8}


def pass_ms(lm, caches: dict[str, KVCache], context: int, rows: int, repeats: int) -> dict[str, float]:
    """Median ms of a forward of `rows` chained rows (one row's logits) after `context` slots, per cache."""
    tokens = torch.arange(100, 100 + rows)
    positions = torch.arange(context, context + rows)
    mask = causal_mask(context, rows, positions, None, "cpu") if rows > 1 else None
    times: dict[str, list[float]] = {name: [] for name in caches}
    with torch.inference_mode():
        for _ in range(repeats + 2):
            for name, cache in caches.items():
                start = time.perf_counter()
                lm.model(tokens, positions, cache, context, mask, logits="last", exact_rows=True)
                times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t[2:]) for name, t in times.items()}


def log_probs(lm, ids: list[int], dtype: torch.dtype, last: int) -> torch.Tensor:
    """[last, vocab] float64 next-token log-probabilities at the last `last` positions, those rows replayed one at a
    time through the C kernels after a prefill of the rest."""
    cfg = lm.config
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, len(ids), cfg.head_dim, "cpu", dtype)
    with torch.inference_mode():
        states = prefill(lm.model, torch.tensor(ids), cache, keep=last, replay_from=len(ids) - last).hidden
        return torch.cat([torch.log_softmax(lm.model.logits_of(part).double(), -1) for part in states.split(256)])


def agreement(lm, opening: int, tokens: int, book: int) -> dict:
    ids = leading_tokens(lm, book_text(BOOKS_DIR / "eval.jsonl.xz", book), opening + tokens + 1)
    logp = {name: log_probs(lm, ids[:-1], dtype, tokens) for name, dtype in CACHES.items()}
    target = torch.tensor(ids[-tokens:])
    out = {f"{name}_book_top1": float((lp.argmax(-1) == target).double().mean()) for name, lp in logp.items()}
    p32 = logp["float32"].exp()
    for name in CACHES:
        if name != "float32":
            out[f"{name}_vs_float32_top1"] = float((logp[name].argmax(-1) == logp["float32"].argmax(-1)).double()
                                                   .mean())
            out[f"{name}_mean_kl"] = float((p32 * (logp["float32"] - logp[name])).sum(-1).mean())
    return {"book": book, "opening": opening, "tokens": tokens, **out}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--contexts", default="2048,7000")
    p.add_argument("--rows", default="1,2,4")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--openings", default="6000", help="opening lengths for the agreement")
    p.add_argument("--books", default="0,1", help="eval books for the agreement")
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(str(default_model_path()), device="cpu", dtype="q4", heads="none", draft="none")
    result = {"threads": args.threads, "passes": [], "agreement": []}
    contexts, row_counts = [int(c) for c in args.contexts.split(",")], [int(r) for r in args.rows.split(",")]
    # Random keys and values: the cost of a pass does not depend on them.
    caches = {name: random_cache(compact_cache(lm, name), max(contexts) + 8, slot_major=False) for name in CACHES}
    print("| context | rows | float32 cache ms | bf16 cache ms | q8 cache ms |\n|---|---|---|---|---|")
    for context in contexts:
        for rows in row_counts:
            ms = pass_ms(lm, caches, context, rows, args.repeats)
            result["passes"].append({"context": context, "rows": rows, **ms})
            print(f"| {context} | {rows} | {ms['float32']:.1f} | {ms['bf16']:.1f} | {ms['q8']:.1f} |", flush=True)
    for opening in (int(o) for o in args.openings.split(",") if o):
        for book in (int(b) for b in args.books.split(",")):
            row = agreement(lm, opening, args.tokens, book)
            result["agreement"].append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
