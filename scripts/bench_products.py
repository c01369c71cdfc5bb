"""The weight products of a decoder step on this CPU: F.linear against the column product (model/forward.project).

A verify pass multiplies every weight matrix by a handful of rows. MKL's float32 GEMM re-packs the weight for
each call when the rows are few, and its one-row GEMV does not reach the memory bandwidth; weight @ x.T with the
rows as 2-4 columns streams the weight once. This script measures both on the default model's shapes
(SmolLM2-135M: 30 layers; the LM head has 49,152 rows), with every layer's own copy of a weight so that, as in a
real step, the weights come from memory, not from cache.

    .venv/bin/python scripts/bench_products.py --threads 1 --json runs/products.json

Prints ms per step for each shape and row count (all layers' copies), and the ratio to one row through F.linear.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, as the other scripts are
from tokenswift.model.forward import project  # noqa: E402

# (rows of the weight, columns, copies in one step) for SmolLM2-135M
SHAPES = {"q/o 576x576": (576, 576, 60), "k/v 192x576": (192, 576, 60), "gate/up 1536x576": (1536, 576, 60),
          "down 576x1536": (576, 1536, 30), "LM head 49152x576": (49152, 576, 1)}


def timed(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,2,3,4,5,8")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="also write the table here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    print(f"{'shape':<20} {'rows':>4} {'F.linear ms':>12} {'project ms':>11} {'vs 1 row F.linear':>18}")
    for name, (n, k, copies) in SHAPES.items():
        weights = [torch.randn(n, k) for _ in range(copies)]
        base = None
        for m in rows:
            x = torch.randn(m, k)
            linear = timed(lambda: [F.linear(x, w) for w in weights], args.repeats)  # noqa: B023
            column = timed(lambda: [project(x, w) for w in weights], args.repeats)  # noqa: B023
            base = base or linear
            print(f"{name:<20} {m:>4} {linear:>12.2f} {column:>11.2f} {column / base:>17.2f}x")
            results.append({"shape": name, "rows": m, "linear_ms": linear, "project_ms": column,
                            "project_vs_one_row": column / base})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
