#!/usr/bin/env bash
# Issue "Judge under load": its GPU runs. On the GPU box, from the repo root (carry .whl and .kb):
#   bash benchmarks/judge_gpu.sh STEP [SECONDS]
# STEP: adversarial (the CUDA fixtures, strict then paper timing, 12 at once: concurrent callers
# themselves) | audit (KernelBench v0 and v0.1 L1-3) | stress-strict | stress-paper (benchmarks/stress.py:
# 16+ concurrent eval one + an eval run) | repeat (fast honest kernels timed twice). SECONDS bounds the
# step. Results under $OUT: one log per step and JSON files.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" || exit 1
STEP=$1; LIMIT=${2:-300}
run() { local t0=$(date +%s); timeout -k 20 -s INT "$LIMIT" "$@"; local rc=$?; echo "$STEP rc=$rc $(( $(date +%s)-t0 ))s" | tee -a "$OUT/summary.txt"; }
case $STEP in
  adversarial)
    for mode in ${MODES:-strict paper}; do
      CUDAGYM_FIXTURE_TIMING_MODE=$mode run python3 -m pytest tests/eval/test_adversarial.py -k "cuda and not header" -n 12 -q \
        -p no:cacheprovider -rA > "$OUT/adversarial_$mode.txt" 2>&1
      grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/adversarial_$mode.txt" | tail -50
    done ;;
  audit)  # resumable: carry the returned audit.duckdb back as .devout/audit.duckdb
    [ -f .devout/audit.duckdb ] && [ ! -f "$OUT/audit.duckdb" ] && cp .devout/audit.duckdb "$OUT/audit.duckdb"
    for v in ${VERSIONS:-v0.1 v0}; do
      run python3 -m cudagym audit kernelbench --kb-version "$v" --json --db "$OUT/audit.duckdb" --parallel 16 \
        > "$OUT/audit_$v.json" 2> "$OUT/audit_$v.log"
      tail -2 "$OUT/audit_$v.log"
    done ;;
  stress-strict|stress-paper)
    run python3 benchmarks/stress.py --kb-version v0.1 --timing-mode "${STEP#stress-}" --callers 16 \
      --out "$OUT/$STEP.json" --deadline-s "$LIMIT" > "$OUT/$STEP.txt" 2>&1
    tail -40 "$OUT/$STEP.txt" ;;
esac
