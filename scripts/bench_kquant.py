"""Plain decoding of GGUF files by our q4 path and by llama.cpp, side by side (issue 47): tokens/s at several
contexts and each run's peak resident memory, one process per file and peer (so each peak is its own).

    .venv/bin/python scripts/bench_kquant.py --files runs/kquant/SmolLM2-135M-Instruct.Q4_K_M.gguf,<default Q4_1> \\
        --threads 1 --contexts 1,2048,8192 --json runs/kquant/bench.json

Ours is `tokenswift bench-ar --dtype q4` (greedy, the cache filled with filler prose); llama.cpp's is
llama-cpp-python (--llamacpp: a Python that has it, per scripts/bench_llamacpp.py's docstring; skipped where
absent), the same number of single-token evaluations after a prompt of the same length. Context 1 is an empty
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

REPO = Path(__file__).resolve().parents[1]

# The peer's timing, run by the Python that has llama_cpp: argv = model, threads, contexts, steps, warmup.
LLAMACPP = r"""
import json, sys, time
from llama_cpp import Llama
model, threads, contexts, steps, warmup = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rows = []
for context in map(int, contexts.split(",")):
    llm = Llama(model_path=model, n_ctx=context + steps + warmup + 16, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)
    ids = llm.tokenize(b"It was a bright cold day in April, and the clocks were striking thirteen. " * 2048,
                       add_bos=True)[:context]
    llm.eval(ids)
    for i in range(warmup + steps):
        if i == warmup:
            start = time.perf_counter()
        llm.eval([int(llm.sample(temp=0.0))])
    elapsed = time.perf_counter() - start
    rows.append({"context": context, "tokens_per_s": steps / elapsed, "step_ms": 1e3 * elapsed / steps})
    del llm
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


def ours(file: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch) / "ar.json"
        _, peak = peak_run([sys.executable, "-m", "tokenswift", "bench-ar", "--model", file, "--dtype", "q4",
                            "--device", "cpu", "--threads", str(args.threads), "--contexts", args.contexts,
                            "--steps", str(args.steps), "--warmup", str(args.warmup), "--json", str(result)])
        rows = json.loads(result.read_text())["rows"]
    return {"engine": "tokenswift q4", "file": file, "peak_mb": peak,
            "rows": [{"context": r["context"], "tokens_per_s": r["tokens_per_s"], "step_ms": r["step_ms"]}
                     for r in rows if "skipped" not in r]}


def peer(file: str, args: argparse.Namespace) -> dict:
    text, peak = peak_run([args.llamacpp, "-c", LLAMACPP, file, str(args.threads), args.contexts, str(args.steps),
                           str(args.warmup)])
    return {"engine": "llama.cpp", "file": file, "peak_mb": peak, "rows": json.loads(text.strip().splitlines()[-1])}


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
    parser.add_argument("--steps", type=int, default=32, help="timed tokens per context")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--llamacpp", default="/tmp/llamavenv/bin/python", help="a Python with llama_cpp")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    has_peer = Path(args.llamacpp).exists() and subprocess.run([args.llamacpp, "-c", "import llama_cpp"],
                                                               capture_output=True).returncode == 0
    results = []
    for file in args.files.split(","):
        results.append(ours(file, args))
        if has_peer:
            results.append(peer(file, args))
    print(f"tokens/s, {args.threads} thread(s), greedy, {args.steps} timed tokens per context"
          + ("" if has_peer else f" (llama.cpp: no llama_cpp in {args.llamacpp})"))
    print_table(results, [int(c) for c in args.contexts.split(",")])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"threads": args.threads, "results": results}, indent=2))


if __name__ == "__main__":
    main()
