"""Instruction drafts on the default model: how much of what they write is story, and how much repeats.

For each instruction (a writer starting from nothing), a draft of --tokens tokens with the writing defaults (and the
changes given), then: the share of words in paragraphs that read as assistant talk ("I hope you enjoyed", "What do
you want me to write next?"), the share of tokens inside a run of 10 or more tokens written before, and how many
paragraphs of 20 or more words appear more than once. Prints a table and writes JSON.

    python scripts/instruction_drafts.py --tokens 1500 --json before.json
    python scripts/instruction_drafts.py --tokens 1500 --set no_repeat_ngram=10 --json after.json
"""

from __future__ import annotations

import argparse
import json
import re
import time

import torch

from tokenswift.decode.generate import Generator
from tokenswift.decode.options import EngineOptions
from tokenswift.model.default_model import default_model_path
from tokenswift.model.loading import load_model
from tokenswift.settings import writing_settings
from tokenswift.text.context_window import draft_context

INSTRUCTIONS = [
    "Write the opening chapter of a gothic novel set in a lighthouse on a northern coast, told by the keeper's "
    "daughter.",
    "Write the first chapter of a mystery novel: a village baker finds a stranger's letter hidden in a sack of flour.",
    "Write a story about two brothers who sail across the sea to find their lost father.",
    "Write the beginning of a fantasy novel about a young mapmaker who discovers that her maps change the land.",
]
# Words a story's narrator does not say to its reader, an assistant does.
TALK = re.compile(r"\b(I hope|hope you|let me know|you enjoyed|would you like|do you want|want me to|I('m| am) "
                  r"(not done|happy to|glad)|next chapter|I will write|I'll write|I can write|here is (the|a|your)|"
                  r"here's (the|a|your)|as an AI|feel free|thank you for|I'd love to|my blog|P\.S\.|your favou?rite)"
                  r"|^the end\.?$", re.IGNORECASE)


def measure(text: str, ids: list[int]) -> dict:
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n|\n", text) if p.strip()]
    words = sum(len(p.split()) for p in paragraphs) or 1
    talk = sum(len(p.split()) for p in paragraphs if TALK.search(p))
    seen, repeated = set(), 0
    for i in range(len(ids) - 9):
        gram = tuple(ids[i:i + 10])
        repeated += gram in seen
        seen.add(gram)
    long = [p for p in paragraphs if len(p.split()) >= 20]
    return {"words": words, "talk_share": talk / words, "repeated_token_share": repeated / max(1, len(ids)),
            "repeated_paragraphs": len(long) - len(set(long))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1500)
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a setting on top of the writing defaults (JSON value)")
    p.add_argument("--seeds", type=int, default=1, help="drafts per instruction, seeds 1..N")
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(1)
    changes = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    lm = load_model(str(default_model_path()), dtype="q4")
    rows = []
    for seed, instruction in ((s, i) for s in range(1, args.seeds + 1) for i in INSTRUCTIONS):
        settings = writing_settings(max_new_tokens=args.tokens, seed=seed, prompt_format="instruction", **changes)
        prompt, pinned = draft_context(lm, instruction, "instruction")
        t0 = time.perf_counter()
        ids = Generator(lm, settings, prompt, pinned=pinned, options=EngineOptions(adaptive=True)).run()
        text = lm.tokenizer.decode(ids, skip_special_tokens=True)
        rows.append({"instruction": instruction[:40], "seed": seed, "seconds": time.perf_counter() - t0,
                     **measure(text, ids), "text": text})
        r = rows[-1]
        print(f"{r['instruction']:<42} {r['words']:>5} words  talk {r['talk_share']:6.1%}  "
              f"in repeats {r['repeated_token_share']:6.1%}  repeated paragraphs {r['repeated_paragraphs']}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": changes, "tokens": args.tokens, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
