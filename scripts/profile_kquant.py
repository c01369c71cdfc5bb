"""Where a plain decoding step of a K-quant file goes (issue 47): each product's time over all layers for one row,
grouped by projection and block kind, against the whole step at a few cache lengths; the rest of the step is
attention, norms, RoPE, sampling and the step's Python.

    .venv/bin/python scripts/profile_kquant.py --model runs/kquant/random-llama3.2-1b.Q4_K_M.gguf --threads 1

Each group's products run in layer order, as in a step (the weights come from memory, not from cache), best of
--repeats; the step is the engine's plain step after a prompt of filler prose, best of --steps.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, as the other scripts are
from tokenswift.bench.runs import filler_ids  # noqa: E402
from tokenswift.decode.engine import Engine  # noqa: E402
from tokenswift.decode.options import EngineOptions  # noqa: E402
from tokenswift.model.loading import load_model  # noqa: E402
from tokenswift.model.quant import PACKED, QuantLinear  # noqa: E402
from tokenswift.settings import PLAIN, Settings  # noqa: E402


def best_of(repeats: int, fn) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def product_groups(model) -> dict[str, list[QuantLinear]]:
    """The step's block products by projection and kind (a stacked product's parts apart), the head last."""
    groups = defaultdict(list)
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear) and "embed_tokens" not in name and name != "quantized_head":
            parts = name.split(".")
            projection = f"{parts[-3]}[{parts[-1]}]" if parts[-2] == "parts" else parts[-1]
            groups[f"{projection} {module.kind}"].append(module)
    if isinstance(model.quantized_head, QuantLinear):
        groups[f"LM head {model.quantized_head.kind}"].append(model.quantized_head)
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a K-quant GGUF file")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--contexts", default="1,2048")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    lm = load_model(args.model, dtype="q4", threads=args.threads)
    total = 0.0
    print(f"{'product (1 row)':<28}{'count':>6}{'MB':>8}{'ms':>8}{'GB/s':>7}  layout")
    with torch.no_grad():
        for key, modules in product_groups(lm.model).items():
            xs = [torch.randn(1, m.in_features) for m in modules]
            seconds = best_of(args.repeats, lambda ms=modules, xs=xs: [m(x) for m, x in zip(ms, xs, strict=True)])
            mb = sum(m.product_weight.numel() for m in modules) / 1e6
            packed = "packed" if modules[0]._kind >= PACKED else "file's blocks"
            print(f"{key:<28}{len(modules):>6}{mb:>8.1f}{seconds * 1e3:>8.2f}{mb / 1e3 / seconds:>7.1f}  {packed}")
            total += seconds
    print(f"{'products':<42}{total * 1e3:>8.2f}")
    with lm.running(), torch.no_grad():
        for context in map(int, args.contexts.split(",")):
            settings = Settings(max_new_tokens=args.steps + 8, ignore_eos=True, temperature=0.0)
            engine = Engine(lm, settings, filler_ids(lm, context), context, EngineOptions(speculation=PLAIN))
            engine.start()
            step = best_of(args.steps, engine.ar_step)
            print(f"step at {context:>5} tokens: {step * 1e3:7.2f} ms ({1 / step:5.1f} tokens/s), not products "
                  f"{(step - total) * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
