#!/usr/bin/env bash
# The draft layer trained on a GPU in minutes: the commands of train_draft_layer.sh (draft-data, then
# train-draft) with --device cuda, from scratch. Two layers from the same teacher data, on equal terms: one
# that fuses a low, a middle and the last layer's states (EAGLE-3's features, draft_layer.py), and one that
# reads the last layer's states alone (the committed design). Their learning curves print as tables; the
# layers, curves and logs go to OUT.
#
#   bash scripts/train_draft_gpu.sh MODEL TRAIN_BOOKS EVAL_BOOKS OUT
#
# MODEL: a .gguf file or checkpoint folder; *_BOOKS: .jsonl(.xz) book files (EVAL_BOOKS: the eval split, from
# which the held-out rows are drawn as train_draft_layer.sh draws them). Sizes through the environment:
# TEACHER_TOKENS (6M), TRAIN_TOKENS (TEACHER_TOKENS: one pass), FEATURES (2,15), BATCH (16), EVAL_EVERY (1M),
# DEV (cuda), PYTHON (python3), WORK (teacher data and states; /tmp/draft-gpu). Disk: float16 states of three
# layers, ~3.5 KB a token for the default model (3M teacher tokens: 11 GB).
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 MODEL TRAIN_BOOKS EVAL_BOOKS OUT"; exit 2; }
MODEL=$1 TRAIN=$2 EVAL=$3 OUT=$4
DEV=${DEV:-cuda} PY=${PYTHON:-python3} WORK=${WORK:-/tmp/draft-gpu}
TEACHER_TOKENS=${TEACHER_TOKENS:-6000000}
TRAIN_TOKENS=${TRAIN_TOKENS:-$TEACHER_TOKENS}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
mkdir -p "$OUT" "$WORK"
say() { echo "== $* ($(date +%T))"; }

say "teacher data: held-out rows (eval split), then training text"
data=(--model "$MODEL" --device "$DEV" --features "${FEATURES:-2,15}" --no-progress)
$PY -m tokenswift draft-data "${data[@]}" --data "$EVAL" --out "$WORK/eval" --tokens 32768 --seed 1
$PY -m tokenswift draft-data "${data[@]}" --data "$TRAIN" --out "$WORK/train" --tokens "$TEACHER_TOKENS" --seed 0

for variant in fused last; do
    say "train-draft: $variant"
    flags=()
    [ "$variant" = last ] && flags=(--last-layer-only)
    $PY -m tokenswift train-draft --model "$MODEL" --device "$DEV" --teacher "$WORK/train" \
        --eval-teacher "$WORK/eval" --out "$OUT/$variant" --state "$WORK/$variant.pt" --tokens "$TRAIN_TOKENS" \
        --batch "${BATCH:-16}" --eval-every "${EVAL_EVERY:-1000000}" --warmup 50 --no-progress "${flags[@]}"
done
say "done"
