"""Time saved versus plain decoding, as the app's chart shows it, for one draft written by the real worker.

Queues one draft on a fresh SQLite store (the app's defaults: the default model, the writing settings of the
Write tab, the default drafter, the worker's adaptive TokenSwift; a flag given here replaces its setting), runs
the worker process on it until the queue is empty, and prints the metric points the Write tab's *Time saved*
chart plots (tokens, elapsed seconds, time saved, plain share), then writes them as JSON.

    .venv/bin/python scripts/app_time_saved.py --prompt-book eval:0 --prompt-tokens 2048 --max-new-tokens 4096 \\
        --json runs/app-time-saved.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from storage import open_store  # noqa: E402
from tokenswift.bench.runs import book_text  # noqa: E402
from tokenswift.model.default_model import default_model_path  # noqa: E402
from tokenswift.settings import writing_settings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-book", default="eval:0", help="SPLIT:N, a book of ../shared/data/books")
    parser.add_argument("--prompt-tokens", type=int, default=2048, help="about this many tokens of its opening")
    parser.add_argument("--max-new-tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=float, help="default: the writing settings'")
    parser.add_argument("--min-p", type=float, help="default: the writing settings'")
    parser.add_argument("--penalty", type=float, help="default: the writing settings'")
    parser.add_argument("--threads", type=int, default=1, help="the worker's torch threads")
    parser.add_argument("--json", help="also write the metric points here")
    args = parser.parse_args()

    split, index = args.prompt_book.split(":")
    # About four characters a token: the worker tokenises the opening itself, as it does the app's prompts.
    prompt = book_text(ROOT.parent / "shared" / "data" / "books" / f"{split}.jsonl.xz", int(index))
    prompt = prompt[: 4 * args.prompt_tokens]
    given = {"temperature": args.temperature, "min_p": args.min_p, "penalty": args.penalty}
    settings = writing_settings(seed=1, max_new_tokens=args.max_new_tokens, ban_eos=True,
                                **{k: v for k, v in given.items() if v is not None})
    with tempfile.TemporaryDirectory() as home:
        url = f"sqlite:///{home}/studio.db"
        store = open_store(url)
        gen_id = store.enqueue_generation(prompt, settings).id
        worker = [sys.executable, "-m", "worker", "--db", url, "--model", str(default_model_path()), "--once",
                  "--threads", str(args.threads)]
        subprocess.run(worker,
                       cwd=ROOT, check=True, env={"TOKENSWIFT_HOME": home, "HF_HUB_OFFLINE": "1",
                                                  "PATH": "/usr/bin:/bin"})
        record = store.get_generation(gen_id, with_text=False)
        points = [p.to_dict() for p in store.progress_since(gen_id, after_tokens=-1).points]  # the whole series
        store.close()
    print(f"draft {gen_id}: {record.status}, {points[-1]['tokens']} tokens")
    print(f"{'tokens':>7} {'elapsed s':>10} {'saved s':>8} {'plain share':>12} {'tokens/step':>12}")
    step = max(1, len(points) // 12)
    for p in points[::step] + ([points[-1]] if (len(points) - 1) % step else []):
        print(f"{p['tokens']:>7} {p['elapsed_s']:10.1f} {p['time_saved_s'] or 0:8.1f} {p['plain_share'] or 0:12.2f} "
              f"{p['tokens_per_step'] or 0:12.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"settings": settings.to_json(), "status": record.status,
                                               "points": points}, indent=2))


if __name__ == "__main__":
    main()
