"""Plain decoding of GGUF files by our q4 path and by llama.cpp, side by side (issue 47): tokens/s at several
contexts and each run's peak resident memory, one process per file and peer (so each peak is its own).

    .venv/bin/python scripts/bench_kquant.py --files runs/kquant/SmolLM2-135M-Instruct.Q4_K_M.gguf,<default Q4_1> \\
        --threads 1 --contexts 1,2048,8192 --json runs/kquant/bench.json

Ours is the engine's plain step (`--dtype q4`, greedy, the cache filled with filler prose, as bench-ar);
llama.cpp's is llama-cpp-python (--llamacpp: a Python that has it, per scripts/bench_llamacpp.py's docstring;
skipped where absent), the same single-token evaluations after a prompt of the same length. Context 1 is an empty
cache but for the first token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]

# Each engine's timing, run in its own process: argv = model, threads, contexts, blocks, block, warmup. After the
# prompt and `warmup` tokens, `blocks` blocks of `block` tokens are timed apart: on a machine that other work
# shares, the best block is the engine's speed and the median what a writer would see then.
LLAMACPP = r"""
import json, sys, time
from llama_cpp import Llama
model, threads, contexts, blocks, block, warmup = sys.argv[1], int(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:7])
rows = []
for context in map(int, contexts.split(",")):
    llm = Llama(model_path=model, n_ctx=context + blocks * block + warmup + 16, n_threads=threads,
                n_threads_batch=threads, n_batch=512, verbose=False)
    ids = llm.tokenize(b"It was a bright cold day in April, and the clocks were striking thirteen. " * 2048,
                       add_bos=True)[:context]
    llm.eval(ids)
    for _ in range(warmup):
        llm.eval([int(llm.sample(temp=0.0))])
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(block):
            llm.eval([int(llm.sample(temp=0.0))])
        times.append(time.perf_counter() - start)
    rows.append({"context": context, "block_s": times})
    del llm
print(json.dumps(rows))
"""
OURS = r"""
import json, sys, time
sys.path.insert(0, ".")
import torch
from tokenswift.bench.runs import filler_ids
from tokenswift.decode.engine import Engine
from tokenswift.decode.options import EngineOptions
from tokenswift.settings import PLAIN, Settings
from tokenswift.model.loading import load_model
model, threads, contexts, blocks, block, warmup = sys.argv[1], int(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:7])
lm = load_model(model, dtype="q4", threads=threads)
rows = []
with lm.running(), torch.no_grad():
    for context in map(int, contexts.split(",")):
        settings = Settings(max_new_tokens=warmup + blocks * block + 1, ignore_eos=True, temperature=0.0)
        engine = Engine(lm, settings, filler_ids(lm, context), context, EngineOptions(speculation=PLAIN))
        engine.start()
        for _ in range(warmup):
            engine.ar_step()
        times = []
        for _ in range(blocks):
            start = time.perf_counter()
            for _ in range(block):
                engine.ar_step()
            times.append(time.perf_counter() - start)
        rows.append({"context": context, "block_s": times})
print(json.dumps(rows))
"""


def peak_run(command: list[str]) -> tuple[str, float]:
    """stdout of `command` and its peak resident memory in MB (its own, from wait4)."""
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(command, stdout=out, cwd=REPO)
        _, status, usage = os.wait4(process.pid, 0)
        out.seek(0)
        text = out.read().decode()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(command)} failed:\n{text[-2000:]}")
    return text, usage.ru_maxrss / 1024


def timed(engine: str, python: str, script: str, file: str, args: argparse.Namespace) -> dict:
    text, peak = peak_run([python, "-c", script, file, str(args.threads), args.contexts, str(args.blocks),
                           str(args.block), str(args.warmup)])
    rows = []
    for row in json.loads(text.strip().splitlines()[-1]):
        speeds = sorted(args.block / t for t in row["block_s"])
        rows.append({"context": row["context"], "tokens_per_s": speeds[-1], "median_tokens_per_s": median(speeds)})
    return {"engine": engine, "file": file, "peak_mb": peak, "rows": rows}


def print_table(results: list[dict], contexts: list[int]) -> None:
    print(f"{'file':<44}{'engine':<15}" + "".join(f"{'ctx ' + str(c):>11}" for c in contexts) + f"{'peak MB':>10}")
    for r in results:
        speeds = {row["context"]: row["tokens_per_s"] for row in r["rows"]}
        cells = "".join(f"{speeds[c]:>11.1f}" if c in speeds else f"{'-':>11}" for c in contexts)
        print(f"{Path(r['file']).name[:43]:<44}{r['engine']:<15}{cells}{r['peak_mb']:>10.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", required=True, help="GGUF files, comma-separated")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--contexts", default="1,2048,8192", help="cache lengths, comma-separated")
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks per context")
    parser.add_argument("--block", type=int, default=8, help="tokens per timed block")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--llamacpp", default="/tmp/llamavenv/bin/python", help="a Python with llama_cpp")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    has_peer = Path(args.llamacpp).exists() and subprocess.run([args.llamacpp, "-c", "import llama_cpp"],
                                                               capture_output=True).returncode == 0
    results = []
    for file in args.files.split(","):
        results.append(timed("tokenswift q4", sys.executable, OURS, file, args))
        if has_peer:
            results.append(timed("llama.cpp", args.llamacpp, LLAMACPP, file, args))
    print(f"tokens/s (best block of {args.block} tokens of {args.blocks}; median in JSON), {args.threads} thread(s), "
          "greedy"
          + ("" if has_peer else f" (llama.cpp: no llama_cpp in {args.llamacpp})"))
    print_table(results, [int(c) for c in args.contexts.split(",")])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": args.threads, "block": args.block, "results": results}, indent=2))


if __name__ == "__main__":
    main()
