#!/usr/bin/env bash
# Train, or go on training, the default model's draft layer in the background (issue: a drafter the model agrees
# with). Safe to run again after any interruption: the teacher data resumes at its next shard, training at its
# last saved state (or, with the state gone, from the committed weights in models/smollm2-135m-instruct/draft).
# Progress: tail -f "$CACHE/train.log"; the curve so far: models/smollm2-135m-instruct/draft/curve.json.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${DRAFT_CACHE:-$HOME/.cache/tokenswift-draft}
BOOKS=../shared/data/books
PY=.venv/bin/python
mkdir -p "$CACHE"
export PYTHONPATH=$PWD
# Held-out teacher data (eval split only; 32 sequences of 1,024 tokens).
$PY -m tokenswift draft-data --data $BOOKS/eval.jsonl.xz --out "$CACHE/eval" --tokens 32768 --seed 1 --no-progress
# Training teacher data: the model's states and top-32 next tokens over shuffled sequences of the train splits.
# A piece that lost the cache draws its sequences in another order (TEACHER_SEED), so the resumed layer mostly
# meets text it has not seen.
nohup nice -n 19 $PY -m tokenswift draft-data --data $BOOKS/train.jsonl.xz $BOOKS/train-large.jsonl.xz --out "$CACHE/train" \
    --tokens "${TEACHER_TOKENS:-12000000}" --threads "${TEACHER_THREADS:-2}" --seed "${TEACHER_SEED:-0}" \
    --no-progress >> "$CACHE/extract.log" 2>&1 &
until [ -f "$CACHE/train/shard-00000/top_logp.npy" ]; do sleep 30; done
nohup nice -n 19 $PY -m tokenswift train-draft --teacher "$CACHE/train" --eval-teacher "$CACHE/eval" \
    --out models/smollm2-135m-instruct/draft --state "$CACHE/state.pt" --tokens "${TRAIN_TOKENS:-10000000}" \
    --threads "${TRAIN_THREADS:-1}" >> "$CACHE/train.log" 2>&1 &
echo "teacher data and training running in the background; logs in $CACHE"
