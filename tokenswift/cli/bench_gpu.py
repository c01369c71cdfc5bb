"""`bench-gpu`: fast-path pass costs of full-size shapes at 4K-100K contexts (the run: bench/gpu.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from tokenswift.cli.common import CliError, note, open_model, write_json
from tokenswift.cli.flags import add_model_args, int_list_arg

if TYPE_CHECKING:
    from tokenswift.model.loading import LoadedModel



def add_command(sub) -> None:
    """bench-gpu"""
    gpu = sub.add_parser("bench-gpu", help="fast-path pass costs at 4K-100K contexts, bandwidth, 100K projection")
    add_model_args(gpu)
    gpu.add_argument("--preset", default=None,
                     help="comma list of llama3.1-8b,qwen2.5-7b,qwen2.5-1.5b (random weights); default: all "
                          "three, or none when --model is given")
    gpu.add_argument("--tiny", action="store_true",
                     help="shrink the presets so the run takes seconds (CPU; default: off)")
    gpu.add_argument("--contexts", type=int_list_arg, default=None,
                     help="contexts to time (default: 4096,32768,65536,100000)")
    gpu.add_argument("--kernels", default=None, help="fast-path kernels to time: flex,flex-fold,sdpa "
                                                     "(default flex,sdpa; sdpa on a CPU)")
    gpu.add_argument("--graphs", default=None, help="cuda | none (default: cuda on CUDA, else none)")
    gpu.add_argument("--steps", type=int, default=16, help="timed AR steps per context (default: %(default)s)")
    gpu.add_argument("--reps", type=int, default=8,
                     help="timed draft/verify passes per context and shape (default: %(default)s)")
    gpu.add_argument("--budget", type=int, default=None,
                     help="partial-cache size in tokens (default 4096; 32 with --tiny)")
    gpu.add_argument("--tokens-per-iter", type=float, default=4.0,
                     help="TokenSwift tokens per iteration assumed by the 100K projection (default: %(default)s)")
    gpu.add_argument("--no-eager", action="store_true", help="skip timing the eager path (default: time it)")
    gpu.set_defaults(func=cmd_bench_gpu)


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    from tokenswift.bench.gpu import CONTEXTS, TINY_CONTEXTS, GpuBench, run
    from tokenswift.bench.gpu_report import summary_rows, table
    from tokenswift.bench.shapes import PRESETS, preset, random_model
    from tokenswift.model.attention import ATTENTION
    from tokenswift.model.fastpath import GRAPHS
    from tokenswift.model.loading import resolve_device, resolve_dtype
    from tokenswift.model.run_defaults import default_device, default_dtype

    try:
        device = args.device or default_device()
        dev, dtype = resolve_device(device), resolve_dtype(args.dtype or default_dtype(device))
    except ValueError as error:
        raise CliError(str(error)) from None
    if dev.type != "cuda" and not args.tiny:
        raise CliError("bench-gpu on a CPU needs --tiny: full-size models would take hours")
    names = args.preset.split(",") if args.preset else ([] if args.model else list(PRESETS))
    kernels = (args.kernels or ("flex,sdpa" if dev.type == "cuda" else "sdpa")).split(",")
    choose("preset", names, PRESETS)
    choose("kernels", kernels, ATTENTION)
    choose("graphs", [args.graphs] if args.graphs else [], GRAPHS)
    if args.steps < 1 or args.reps < 1 or args.tokens_per_iter < 1:
        raise CliError("steps and reps must be >= 1, tokens-per-iter >= 1")
    contexts = args.contexts or list(TINY_CONTEXTS if args.tiny else CONTEXTS)
    scale = {"contexts": contexts}
    if args.tiny:  # project over the measured range only: tiny timings are too noisy to extrapolate
        scale.update(prompt=min(contexts), new_tokens=max(1, max(contexts) - min(contexts)))
    bench = GpuBench(kernels=kernels, graphs=args.graphs, steps=args.steps, reps=args.reps,
                     budget=args.budget or (32 if args.tiny else 4096), tokens_per_iter=args.tokens_per_iter,
                     eager=not args.no_eager, **scale)

    def build(name: str):  # models are built one at a time, inside run(), and freed after
        return lambda: random_model(name, *preset(name, tiny=args.tiny), dev, dtype)

    # tiny shapes get their own names, so no paper reference is printed beside them
    models = [(name + ("-tiny" if args.tiny else ""), build(name)) for name in names]
    if args.model:
        models.append((Path(args.model).name, lambda: checkpoint_for_bench(args)))
    result = run(models, bench, dev, log=note)
    print(table(result))
    print()
    print("\n".join(summary_rows(result)))
    write_json(args.json_out, result)
    return 0


def choose(flag: str, values: list[str], allowed) -> None:
    for value in values:
        if value not in allowed:
            raise CliError(f"{flag}: unknown {value!r}; choose from {', '.join(allowed)}")


def checkpoint_for_bench(args: argparse.Namespace) -> LoadedModel:
    """A real checkpoint; without draft heads it gets random ones (the draft pass costs the same)."""
    from tokenswift.bench.shapes import random_heads

    lm = open_model(args)
    if lm.heads is None:
        lm.heads = random_heads(lm.config, lm.device, lm.dtype)
        lm.random_heads = True
    return lm
