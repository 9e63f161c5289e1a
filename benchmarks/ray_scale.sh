#!/usr/bin/env bash
# Scale-out on the GPU box: KernelBench v0.1 L1-3 baselines, then the reference-as-candidate eval
# twice (reference-a, reference-b: repeatability), all with `--runner ray` on every visible GPU (one
# Ray worker per GPU, --parallel judges on each), with the wall time of each. Runs on any kind
# (nvidia-h200, -x2, -x4, -x8); compare their walls.
#
# Carry (64 MiB a call in all; about 57 MB with these): .whl (duckdb, libcst; see gpu_env.sh),
# .whl-ray (`python benchmarks/slim_ray_wheel.py` here: ray 2.60.0 repacked without Java jars, the
# dashboard UI and unused libraries, binaries stripped, 27 MB with jsonschema and its dependencies),
# .kb (the KernelBench file), and, to resume a step cut off by the call's limit, the DuckDB file
# brought back as .devout/ray.duckdb.
# From the repo root on the GPU box:
#   [RUNS="c d"] bash benchmarks/ray_scale.sh STEP [SECONDS]
# CUDA_VISIBLE_DEVICES=0 in front runs it on one GPU of the box (Ray sees only that one).
# STEP: baselines | eval | report | all (baselines, both evals, report within SECONDS). A step is
# interrupted cleanly at SECONDS (default 540) and resumes next time. Results under $OUT (7 files; the
# device returns at most 8): ray.duckdb, summary.txt (step, exit code, wall seconds, GPUs), STEP.txt
# (each command's output: baselines, eval-a, eval-b), report.txt (benchmarks/repeatability.py), env.txt.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" || exit 1
STEP=$1; LIMIT=${2:-540}
END=$(( $(date +%s) + LIMIT ))
DB=$OUT/ray.duckdb
[ -f .devout/ray.duckdb ] && [ ! -f "$DB" ] && cp .devout/ray.duckdb "$DB"
NGPU=$(nvidia-smi -L | wc -l)  # or as many as CUDA_VISIBLE_DEVICES names (one GPU of a box: =0)
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && NGPU=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
SELECT=(--kb-version v0.1 --levels 1,2,3)

run() {  # NAME CMD...: until END, then SIGINT (what is stored stays stored)
  local name=$1; shift
  local t0; t0=$(date +%s)
  local left=$(( END - t0 )); [ "$left" -gt 20 ] || { echo "$name skipped: no time left" | tee -a "$OUT/summary.txt"; return; }
  timeout -k 30 -s INT "$left" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? wall=$(( $(date +%s) - t0 ))s gpus=$NGPU" | tee -a "$OUT/summary.txt"
}

baselines() { run baselines python3 -m cudagym baseline run --runner ray --db "$DB" "${SELECT[@]}"; }
evaluate() {  # RUN: the reference-as-candidate submission, stored as reference-RUN
  [ -d /tmp/refsub ] || python3 benchmarks/reference_submission.py /tmp/refsub --kb-version v0.1 --levels 1,2,3
  run "eval-$1" python3 -m cudagym eval run /tmp/refsub --runner ray --db "$DB" --policy permissive \
    --name "reference-$1" "${SELECT[@]}"
}
evaluate_all() { for name in "${RUNS[@]}"; do evaluate "$name"; done; }
RUNS=(${RUNS:-a b})  # names of the eval runs (reference-NAME); RUNS="c d" for a fresh pair in a carried store, RUNS=c for one
report() { python3 benchmarks/repeatability.py "$DB" --a "reference-${RUNS[0]}" --b "reference-${RUNS[1]}" 2>&1 | tee "$OUT/report.txt"; }

case $STEP in
  baselines) baselines ;;
  eval) evaluate_all ;;
  report) report ;;
  all) baselines; evaluate_all; report ;;
  *) echo "usage: bash benchmarks/ray_scale.sh baselines|eval|report|all [SECONDS]" >&2; exit 1 ;;
esac
