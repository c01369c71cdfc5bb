"""Which sampling settings keep the default model writing English, measured (not a test): for each candidate,
plain decoding continues several eval-split openings, and each text is scored per window of tokens by
- known words: the share of its words found in a vocabulary of every word of the eval books (word salad and
  broken words fall out of it),
- distinct-2 and distinct-4: unique token n-grams over all n-grams (loops fall here; novels score 0.94-0.98).

    .venv/bin/python scripts/prose_quality.py --tokens 1500 --openings 0,3,6 --json runs/prose.json

Prints one table row per candidate (the worst window over all openings, and the mean) and writes every window.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tokenswift.decode.generate import Generator  # noqa: E402
from tokenswift.decode.metrics import distinct_n  # noqa: E402
from tokenswift.decode.options import EngineOptions  # noqa: E402
from tokenswift.model.default_model import default_model_path  # noqa: E402
from tokenswift.model.loading import load_model  # noqa: E402
from tokenswift.settings import PLAIN, Settings  # noqa: E402

EVAL = REPO.parent / "shared" / "data" / "books" / "eval.jsonl.xz"
WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
CANDIDATES = {
    "app-before: T1 top-p0.9 θ1.2/1024": dict(temperature=1.0, top_p=0.9, penalty=1.2, penalty_window=1024),
    "T1 min-p0.1 θ1.2/1024": dict(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024),
    "T0.7 min-p0.1": dict(temperature=0.7, min_p=0.1),
    "T0.7 min-p0.1 θ1.1/256": dict(temperature=0.7, min_p=0.1, penalty=1.1, penalty_window=256),
    "T0.7 min-p0.1 DRY0.8": dict(temperature=0.7, min_p=0.1, dry_multiplier=0.8),
    "T0.8 min-p0.1 DRY0.8": dict(temperature=0.8, min_p=0.1, dry_multiplier=0.8),
    "T1 min-p0.1 DRY0.8": dict(temperature=1.0, min_p=0.1, dry_multiplier=0.8),
    "T1 min-p0.1 DRY0.8/2048": dict(temperature=1.0, min_p=0.1, dry_multiplier=0.8, dry_range=2048),
    "T1 min-p0.1 θ1.1/256": dict(temperature=1.0, min_p=0.1, penalty=1.1, penalty_window=256),
    "T1 min-p0.1 θ1.1/256 DRY0.8": dict(temperature=1.0, min_p=0.1, penalty=1.1, penalty_window=256,
                                         dry_multiplier=0.8),
    "T1 min-p0.1 θ1.1/256 DRY0.8/2048": dict(temperature=1.0, min_p=0.1, penalty=1.1, penalty_window=256,
                                              dry_multiplier=0.8, dry_range=2048),
    "T0.8 min-p0.1 θ1.1/256 DRY0.8": dict(temperature=0.8, min_p=0.1, penalty=1.1, penalty_window=256,
                                          dry_multiplier=0.8),
    "T0.9 min-p0.1 θ1.1/256 DRY0.8": dict(temperature=0.9, min_p=0.1, penalty=1.1, penalty_window=256,
                                          dry_multiplier=0.8),
    "T1 min-p0.15 θ1.1/256 DRY0.8": dict(temperature=1.0, min_p=0.15, penalty=1.1, penalty_window=256,
                                         dry_multiplier=0.8),
    "T1 min-p0.2 θ1.1/256 DRY0.8": dict(temperature=1.0, min_p=0.2, penalty=1.1, penalty_window=256,
                                        dry_multiplier=0.8),
}


def books() -> list[dict]:
    with lzma.open(EVAL, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def vocabulary(texts: list[str]) -> set[str]:
    return {w.lower() for text in texts for w in WORD.findall(text)}


def known_share(text: str, vocab: set[str]) -> float:
    words = [w.lower() for w in WORD.findall(text)]
    return sum(w in vocab for w in words) / max(1, len(words))


def windows(lm, ids: list[int], size: int, vocab: set[str]) -> list[dict]:
    out = []
    for start in range(0, len(ids), size):
        piece = ids[start:start + size]
        if len(piece) < min(size, 200):
            break
        out.append({"start": start, "tokens": len(piece), "known_words": known_share(lm.decode(piece), vocab),
                    "distinct2": distinct_n(piece, 2), "distinct4": distinct_n(piece, 4)})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1500, help="tokens written per opening (default: %(default)s)")
    p.add_argument("--openings", default="0,3,6", help="eval-split books whose openings are continued")
    p.add_argument("--opening-chars", type=int, default=2000, help="characters of each opening (default: 2000)")
    p.add_argument("--window", type=int, default=2000, help="tokens per scored window (default: %(default)s)")
    p.add_argument("--only", nargs="*", help="candidate names to run (default: all)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write every window here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(str(default_model_path()), dtype="float32")
    eval_books = books()
    vocab = vocabulary([b["text"] for b in eval_books])
    openings = [eval_books[int(i)]["text"][:args.opening_chars] for i in args.openings.split(",")]
    results = {}
    print(f"{'candidate':<36} {'known min':>9} {'known mean':>10} {'d2 min':>7} {'d4 min':>7} {'d4 mean':>7} {'s':>6}")
    for name, values in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        t0, rows = time.perf_counter(), []
        for i, opening in zip(args.openings.split(","), openings, strict=True):
            s = Settings(max_new_tokens=args.tokens, seed=args.seed, ban_eos=True, **values)
            ids = Generator(lm, s, lm.encode(opening), options=EngineOptions(speculation=PLAIN)).run()
            rows += [{"opening": int(i), **w, "sample": lm.decode(ids[:120])} if not j else {"opening": int(i), **w}
                     for j, w in enumerate(windows(lm, ids, args.window, vocab))]
        results[name] = {"settings": values, "windows": rows}
        known = [r["known_words"] for r in rows]
        d2, d4 = [r["distinct2"] for r in rows], [r["distinct4"] for r in rows]
        print(f"{name:<36} {min(known):>9.3f} {sum(known) / len(known):>10.3f} {min(d2):>7.3f} {min(d4):>7.3f} "
              f"{sum(d4) / len(d4):>7.3f} {time.perf_counter() - t0:>6.0f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
