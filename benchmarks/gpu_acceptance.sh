#!/usr/bin/env bash
# Issue 2's GPU acceptance runs, resumable across device calls (carry .whl, .kb and the DuckDB file
# back in as .devout/gpu.duckdb). Usage on the GPU box, from the repo root:
#   bash benchmarks/gpu_acceptance.sh STEP [SECONDS]
# STEP: adversarial | baselines | eval-a | eval-b | audit | report. SECONDS bounds the step (it is
# interrupted cleanly and resumes next time). Results: $OUT/gpu.duckdb, $OUT/*.txt, $OUT/*.json.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" || exit 1
STEP=$1; LIMIT=${2:-540}
DB=$OUT/gpu.duckdb
[ -f .devout/gpu.duckdb ] && [ ! -f "$DB" ] && cp .devout/gpu.duckdb "$DB"
run() { local t0=$(date +%s); timeout -k 20 -s INT "$LIMIT" "$@"; local rc=$?; echo "$STEP rc=$rc $(( $(date +%s)-t0 ))s" | tee -a "$OUT/summary.txt"; }
case $STEP in
  adversarial) run python3 -m pytest tests/eval/test_adversarial.py -k cuda -n 8 -q -p no:cacheprovider -rA > "$OUT/adversarial_cuda.txt" 2>&1
               grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/adversarial_cuda.txt" | tail -60 ;;
  baselines)   run python3 -m cudagym baseline run --db "$DB" > "$OUT/baselines.txt" 2>&1 ;;
  eval-a|eval-b)
               python3 benchmarks/reference_submission.py /tmp/refsub
               run python3 -m cudagym eval run /tmp/refsub --db "$DB" --policy permissive --name "reference-${STEP#eval-}" > "$OUT/$STEP.txt" 2>&1 ;;
  audit)       run python3 -m cudagym audit kernelbench --json > "$OUT/audit_v0.1.json" 2> "$OUT/audit.log" ;;
  report)      python3 benchmarks/repeatability.py "$DB" | tee "$OUT/repeatability.txt" ;;
esac
