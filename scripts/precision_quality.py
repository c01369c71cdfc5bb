"""How close a faster precision writes to float32 on the default model (issue 32): which precision the app may
use by default. Not a test; a measurement that prints a table and writes JSON.

For each eval-split opening, float32 writes `--tokens` tokens greedily. Each other precision then
- reads float32's text (teacher forcing) and we count the positions where its likeliest next token is float32's
  (top-1 agreement) and the mean KL divergence of its next-token distribution from float32's;
- writes its own greedy continuation and the writing defaults' sampled one (same seed as float32's), scored by
  the share of known words (words found in the eval books, as scripts/prose_quality.py) and distinct-4.

    .venv/bin/python scripts/precision_quality.py --precisions float32,q4,bfloat16 --tokens 1000 \\
        --openings 0,3 --json runs/precision_quality.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from prose_quality import books, known_share, vocabulary  # noqa: E402

from tokenswift.bench.runs import leading_tokens  # noqa: E402
from tokenswift.decode.generate import Generator  # noqa: E402
from tokenswift.decode.metrics import distinct_n  # noqa: E402
from tokenswift.decode.options import EngineOptions  # noqa: E402
from tokenswift.model.default_model import default_model_path  # noqa: E402
from tokenswift.model.kv_cache import KVCache  # noqa: E402
from tokenswift.model.loading import load_model  # noqa: E402
from tokenswift.model.prefill import prefill  # noqa: E402
from tokenswift.settings import PLAIN, Settings, writing_settings  # noqa: E402


def log_probs(lm, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] float64 log-probabilities of the next token at every position (chunked prefill)."""
    cfg = lm.config
    cache = KVCache(cfg.n_layers, cfg.n_kv_heads, len(ids), cfg.head_dim, lm.device, lm.model.rope_cos.dtype)
    with torch.inference_mode():
        states = prefill(lm.model, torch.tensor(ids), cache, keep=len(ids)).hidden
        return torch.cat([torch.log_softmax(lm.model.logits_of(part).double(), -1) for part in states.split(256)])


def same_until(a: list[int], b: list[int]) -> int:
    """The first position where two texts of ids differ (the shorter length when one extends the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def scores(lm, ids: list[int], vocab: set[str]) -> dict:
    return {"known_words": known_share(lm.decode(ids), vocab), "distinct4": distinct_n(ids, 4)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--precisions", default="float32,q4,bfloat16", help="float32 first: the reference")
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--openings", default="0,3", help="eval-split books whose openings are continued")
    p.add_argument("--prompt-tokens", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    precisions = args.precisions.split(",")
    if precisions[0] != "float32":
        raise SystemExit("--precisions must start with float32 (the reference)")
    eval_books = books()
    vocab = vocabulary([b["text"] for b in eval_books])
    model = str(default_model_path())
    greedy = Settings(max_new_tokens=args.tokens, ban_eos=True)
    sampled = writing_settings(max_new_tokens=args.tokens, seed=args.seed)
    reference, results = {}, {}
    for precision in precisions:
        lm = load_model(model, dtype=precision, heads="none", draft="none")
        rows = []
        for book in (int(i) for i in args.openings.split(",")):
            prompt = leading_tokens(lm, eval_books[book]["text"], args.prompt_tokens)
            own = Generator(lm, greedy, prompt, options=EngineOptions(speculation=PLAIN)).run()
            own_sampled = Generator(lm, sampled, prompt, options=EngineOptions(speculation=PLAIN)).run()
            row = {"opening": book, "greedy": scores(lm, own, vocab), "sampled": scores(lm, own_sampled, vocab)}
            if precision == "float32":
                reference[book] = (prompt + own, log_probs(lm, prompt + own)[len(prompt) - 1:-1], own, own_sampled)
            else:
                ids, ref_lp, ref_greedy, ref_sampled = reference[book]
                lp = log_probs(lm, ids)[len(prompt) - 1:-1]
                row["top1_agreement"] = float((lp.argmax(-1) == ref_lp.argmax(-1)).double().mean())
                row["mean_kl"] = float((ref_lp.exp() * (ref_lp - lp)).sum(-1).mean())
                row["greedy_same_until"] = same_until(own, ref_greedy)
                row["sampled_same_until"] = same_until(own_sampled, ref_sampled)
            rows.append(row)
        results[precision] = rows
        del lm
    print(f"{'precision':<10} {'opening':>7} {'top-1 agree':>11} {'mean KL':>8} {'same until':>10} "
          f"{'known greedy':>12} {'known sampled':>13} {'d4 sampled':>10}")
    for precision, rows in results.items():
        for r in rows:
            agree = f"{r['top1_agreement']:.4f}" if "top1_agreement" in r else "—"
            kl = f"{r['mean_kl']:.4f}" if "mean_kl" in r else "—"
            until = str(r.get("greedy_same_until", "—"))
            print(f"{precision:<10} {r['opening']:>7} {agree:>11} {kl:>8} {until:>10} "
                  f"{r['greedy']['known_words']:>12.3f} {r['sampled']['known_words']:>13.3f} "
                  f"{r['sampled']['distinct4']:>10.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
