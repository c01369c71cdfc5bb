"""The Model tab's drafters: what the loaded model drafts with (the worker's facts, tokenswift.draft.choice.Drafters)
and, where it has no draft layer, how to train one and how long that takes."""

from __future__ import annotations

import shlex

from storage.records import WorkerStatus
from tokenswift.draft.choice import Drafters
from ui.display import views

# scripts/train_draft_layer.sh's token counts, and the speeds the default model's draft layer was trained at on a
# 2-core server CPU (README, models/smollm2-135m-instruct/draft/README.md): teacher data on 2 threads, training on 1.
HELD_OUT_TOKENS = 32_768
TEACHER_TOKENS, TEACHER_PER_S = 12_000_000, 360
TRAIN_TOKENS, TRAIN_PER_S = 10_000_000, 450
CACHE = "~/.cache/tokenswift-draft"  # the teacher data and the training state: large, resumable, outside the repo
PY = ".venv/bin/python -m tokenswift"


def drafters_text(worker: WorkerStatus | None) -> str:
    """What the worker's model drafts with, and how to train it a draft layer where it has none; empty while no
    model is ready (or its worker reported no drafters: an older worker)."""
    if worker is None or worker.load_status != "ready" or not worker.drafters or not worker.model:
        return ""
    found = Drafters.from_json(worker.drafters)
    line = (f"**Drafters.** Auto drafts with {_auto(found)} here (which drafter guesses changes the speed, never the "
            "text).")
    return line if found.layer_vocab is not None else f"{line}\n\n{train_help(worker.model, found.layer_home)}"


def _auto(found: Drafters) -> str:
    if found.auto == "layer":
        return "the draft layer"
    if found.auto == "model":
        return f"the draft model ({found.draft_model})"
    return "the draft heads and n-grams" if found.heads else "n-grams of the text so far alone"


def train_help(model: str, home: str) -> str:
    """The commands that train a draft layer for `model` into `home` (where the worker finds it), and their time."""
    model, home = shlex.quote(model), shlex.quote(home)
    teacher = f"{PY} draft-data --model {model} --data BOOKS --out {CACHE}/train --tokens {TEACHER_TOKENS} --threads 2"
    held_out = f"{PY} draft-data --model {model} --data HELD_OUT --out {CACHE}/eval --tokens {HELD_OUT_TOKENS} --seed 1"
    train = (f"{PY} train-draft --model {model} --teacher {CACHE}/train --eval-teacher {CACHE}/eval \\\n"
             f"    --out {home} --state {CACHE}/state.pt --tokens {TRAIN_TOKENS} --threads 1")
    teaching, training = views.duration(TEACHER_TOKENS / TEACHER_PER_S), views.duration(TRAIN_TOKENS / TRAIN_PER_S)
    return (
        "**Train a draft layer for this model.** It guesses a few tokens ahead, each guess knowing the one before; on "
        "a CPU its guesses are right about three times as often as the heads', and auto drafts with it there. The "
        "model teaches it from your books (BOOKS: `.txt`, `.jsonl` or `.jsonl.xz` files, some held out as HELD_OUT "
        "to measure it by), in two steps that go on where they stopped when run again:\n\n"
        f"```bash\n{held_out}\n{teacher}\n{train}\n```\n\n"
        f"At the speeds the default model's layer was trained at on a 2-core server CPU, the teacher data takes about "
        f"{teaching} ({TEACHER_TOKENS:,} tokens at ~{TEACHER_PER_S} tokens/s on two threads) and the training about "
        f"{training} ({TRAIN_TOKENS:,} tokens at ~{TRAIN_PER_S} tokens/s on one), side by side once the first shard "
        "of teacher data is written (`scripts/train_draft_layer.sh` runs them so). A larger model takes longer, about "
        "in proportion to its size; on a GPU (`--device cuda` on each command), minutes. The worker finds the layer "
        f"in `{home}` the next time it loads the model."
    )
