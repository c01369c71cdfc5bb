"""Two builds of the C kernels in one process, alternating: a git revision's sources (A) against the working tree's
(B), on the default model in q4 (or, --dtype float64, the float64 row kernels on a checkpoint such as stories260k,
the exactness tests' model) over a real prefilled cache, the passes a plain step and a verify batch run.

On this shared CPU the speed moves by 10-60% from one minute to the next, so two runs of a benchmark compare minutes;
here every repeat times A and B back to back (in alternating order) and the ratio is the median of the pairs. The
logits of both builds are compared bit for bit: a kernel change that should not change the text must not.

    .venv/bin/python scripts/kernels_ab.py --rev HEAD --contexts 2048,7168 --rows 1,2,4 --json runs/kernels_ab.json
    .venv/bin/python scripts/kernels_ab.py --rev HEAD --dtype float64 --contexts 400,1500 --rows 1,8

Prints, per context and rows, A's and B's median ms for the forward (layers and the LM head of every row), B / A
(the median of the pairs, with the 10th and 90th percentiles) and whether the logits are identical.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout, as the other scripts are
from tokenswift.bench.runs import book_text, leading_tokens  # noqa: E402
from tokenswift.model import native  # noqa: E402
from tokenswift.model.default_model import default_model_path  # noqa: E402
from tokenswift.model.kv_cache import KVCache  # noqa: E402
from tokenswift.model.loading import load_model  # noqa: E402
from tokenswift.model.masks import causal_mask  # noqa: E402
from tokenswift.model.prefill import prefill  # noqa: E402


def build(sources: list[Path], lib: Path, double: bool) -> ctypes.CDLL:
    native._compile(lib, tuple(sources), native.DOUBLE if double else ())
    return native.opened(lib, double)


def revision_sources(rev: str, folder: Path, sources: tuple[Path, ...]) -> list[Path]:
    """The kernels' `sources` and headers as they are at `rev`, under `folder` (the same layout)."""
    paths = []
    for path in (*sources, *native.HEADERS):
        relative = path.relative_to(ROOT)
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{relative}"], capture_output=True,
                              check=True).stdout
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(text)
        paths.append(folder / relative)
    return paths[:len(sources)]


def use(lm, dll: ctypes.CDLL) -> None:
    """Every kernel call of the model through `dll`: its layers' and its products' (the LM head's)."""
    lm.model.native.lib = dll
    for module in lm.model.modules():
        if hasattr(module, "_lib"):
            module._lib = dll


def forward(lm, cache: KVCache, ids: list[int], context: int, rows: int) -> tuple[float, torch.Tensor]:
    positions = torch.arange(context, context + rows)
    mask = None if rows == 1 else causal_mask(context, rows, positions, lm.config.sliding_window, lm.device)
    t0 = time.perf_counter()
    out = lm.model(torch.tensor(ids[context:context + rows]), positions, cache, context, mask, logits="none",
                   exact_rows=True)
    logits = lm.model.logits_of(out.hidden)
    return time.perf_counter() - t0, logits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="HEAD", help="the git revision whose kernels are A (default: %(default)s)")
    parser.add_argument("--contexts", default="2048,7168", help="cached tokens before the rows (default: %(default)s)")
    parser.add_argument("--rows", default="1,2,4", help="rows of a pass: 1 a plain step (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=30, help="A/B pairs per shape (default: %(default)s)")
    parser.add_argument("--dtype", choices=("q4", "float64"), default="q4",
                        help="q4: the default model's kernels; float64: the row kernels, on --model "
                             "(default: %(default)s)")
    parser.add_argument("--model", help="a checkpoint (default: the default model in q4, ../shared/models/stories260k "
                                        "in float64)")
    parser.add_argument("--json", type=Path, help="also write the table here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    contexts, row_counts = [int(c) for c in args.contexts.split(",")], [int(r) for r in args.rows.split(",")]
    double = args.dtype == "float64"
    sources = native.ROW_SOURCES if double else native.SOURCES
    with tempfile.TemporaryDirectory() as scratch:
        libs = {"A": build(revision_sources(args.rev, Path(scratch) / "a", sources), Path(scratch) / "a.so", double),
                "B": build(list(sources), Path(scratch) / "b.so", double)}
    model = args.model or str((ROOT.parent / "shared/models/stories260k") if double else default_model_path())
    lm = load_model(model, dtype=args.dtype, threads=1)
    cfg, table = lm.config, []
    book = book_text(ROOT.parent / "shared/data/books/eval.jsonl.xz", 0)  # held-out prose
    for context in contexts:
        ids = leading_tokens(lm, book, context + max(row_counts))
        cache = KVCache(cfg.n_layers, cfg.n_kv_heads, context + max(row_counts) + 8, cfg.head_dim, lm.device,
                        lm.cache_dtype)
        use(lm, libs["B"])
        prefill(lm.model, torch.tensor(ids[:context]), cache, 0)
        for rows in row_counts:
            times, logits = {"A": [], "B": []}, {}
            for repeat in range(args.repeats + 1):
                for side in ("AB" if repeat % 2 == 0 else "BA"):
                    use(lm, libs[side])
                    seconds, logits[side] = forward(lm, cache, ids, context, rows)
                    if repeat:  # the first pair warms both up
                        times[side].append(seconds)
            pairs = sorted(b / a for a, b in zip(times["A"], times["B"], strict=True))
            row = {"context": context, "rows": rows, "a_ms": 1e3 * statistics.median(times["A"]),
                   "b_ms": 1e3 * statistics.median(times["B"]), "b_over_a": statistics.median(pairs),
                   "p10": pairs[len(pairs) // 10], "p90": pairs[-len(pairs) // 10 - 1],
                   "identical": torch.equal(logits["A"], logits["B"])}
            table.append(row)
            print(f"context {context:>6}  rows {rows:>2}  A {row['a_ms']:8.2f} ms  B {row['b_ms']:8.2f} ms  "
                  f"B/A {row['b_over_a']:.3f} [{row['p10']:.3f}..{row['p90']:.3f}]  identical logits: "
                  f"{'yes' if row['identical'] else 'NO'}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"rev": args.rev, "dtype": args.dtype, "model": model, "rows": table}
        args.json.write_text(json.dumps(record, indent=1))
    return 0 if all(row["identical"] for row in table) else 1


if __name__ == "__main__":
    sys.exit(main())
