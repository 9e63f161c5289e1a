#!/usr/bin/env bash
# Issue 13 acceptance 4 on the GPU: the scripted expert (scripted:replay of the honest CUDA kernels for
# KernelBench v0 level-1 problems that benchmarks/expert_submission.py writes to /tmp/expert) through
# `agent eval` with 16 rollouts at once, against `eval run` of the same folder. On the GPU box, from the
# repo root (carry .whl and .kb):
#   bash benchmarks/agent_gpu.sh [SECONDS]
# SECONDS (default 540, for one 600-s device call) bounds the whole script: first every kernel's CUDA
# extension is built, one per core at once (benchmarks/prebuild.py, at most PREBUILD_S, default 150;
# ~90 s for 10 kernels on the H200 box), where the judges of both runs find it in the shared build cache
# (a judge that builds its own takes ~75 s under load); then eval run gets EVAL_S (default 120), agent
# eval the rest less the report's margin. All three resume: built extensions are kept, and a returned
# expert.duckdb / trajectories.duckdb carried back in as .devout/ goes on where it stopped.
# Env: PREBUILD_S=0 skips the prebuild, EVAL_BESIDE=1 runs eval run beside agent eval; IDS (default: every problem of the submission; others' files are removed, so nothing else is built),
# N_SAMPLES (2), PARALLEL (16), EVAL_TRACE / AGENT_TRACE (a CUDAGYM_TIMING_TRACE file for the eval run's /
# the rollouts' judges: benchmarks/fast_timing_report.py).
# Results under $OUT (few files: only 8 come back): agent_gpu.log, env.txt, smi.csv (nvidia-smi every
# 500 ms), expert.duckdb (eval run), trajectories.duckdb (agent eval), agent_report.json / .md.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" || exit 1
LIMIT=${1:-540}; PREBUILD_S=${PREBUILD_S:-150}; EVAL_S=${EVAL_S:-120}; MARGIN=40
N_SAMPLES=${N_SAMPLES:-2}; PARALLEL=${PARALLEL:-16}
LOG=$OUT/agent_gpu.log; RUN=/tmp/agentrun; EXPERT=/tmp/expert; T0=$(date +%s)
python3 benchmarks/expert_submission.py "$EXPERT" | tee -a "$LOG" || exit 1
if [ -n "${IDS:-}" ]; then
  for f in "$EXPERT"/level1/*.py; do
    id=$(basename "$f" | sed 's/_.*//'); [[ ",$IDS," == *",$id,"* ]] || rm -f "$f"
  done
fi
IDS=${IDS:-$(ls "$EXPERT"/level1/*.py | sed 's#.*/##; s/_.*//' | sort -n | paste -sd, -)}
COMMON=(--kb-version v0 --levels 1 --ids "$IDS" --device cuda)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
# DuckDB keeps recent writes in a .wal beside the file until a checkpoint; a run stopped by the timeout
# may leave one, and only the .duckdb comes back: fold it in first.
checkpoint() { python3 -c "import duckdb, sys; c = duckdb.connect(sys.argv[1]); c.execute('CHECKPOINT'); c.close()" "$1"; }

[ -f .devout/expert.duckdb ] && [ ! -f "$OUT/expert.duckdb" ] && cp .devout/expert.duckdb "$OUT/expert.duckdb"
mkdir -p "$RUN"
[ -f .devout/trajectories.duckdb ] && [ ! -f "$RUN/trajectories.duckdb" ] && cp .devout/trajectories.duckdb "$RUN/"

nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 > "$OUT/smi.csv" 2>&1 &
SMI=$!
log "problems $IDS, $N_SAMPLES samples each, $PARALLEL rollouts at once, ${LIMIT}s in all"

# every extension built before anything is timed (its own deadline stops it; the SIGINT is a last resort)
if [ "$PREBUILD_S" -gt 0 ]; then
  timeout -k 10 -s INT "$(( PREBUILD_S + 10 ))" python3 benchmarks/prebuild.py "$EXPERT" --parallel "$(nproc)" \
    --deadline-s "$PREBUILD_S" >> "$LOG" 2>&1
  log "prebuild rc=$?"
fi

# the same kernels through eval run: the verdicts the rollouts must match (its JSONL is in the DuckDB file).
# EVAL_BESIDE=1: started with the rollouts instead of before them (a short call: the two share the time)
eval_run() {
  CUDAGYM_TIMING_TRACE=${EVAL_TRACE:-} timeout -k 20 -s INT "$1" python3 -m cudagym eval run "$EXPERT" "${COMMON[@]}" \
    --db "$OUT/expert.duckdb" --name expert --json > /dev/null 2>> "$LOG"
  log "eval run rc=$?"
  checkpoint "$OUT/expert.duckdb"
}
[ -z "${EVAL_BESIDE:-}" ] && eval_run "$EVAL_S"

AGENT_S=$(( LIMIT - ($(date +%s) - T0) - MARGIN ))
START=$(date +%s.%N)
EVAL_PID=
if [ -n "${EVAL_BESIDE:-}" ]; then eval_run "$AGENT_S" & EVAL_PID=$!; fi
CUDAGYM_TIMING_TRACE=${AGENT_TRACE:-} timeout -k 20 -s INT "$AGENT_S" python3 -m cudagym agent eval --model scripted:replay --replay "$EXPERT" \
  "${COMMON[@]}" --n-samples "$N_SAMPLES" --parallel "$PARALLEL" --out "$RUN" --json >> "$LOG" 2>&1
log "agent eval rc=$? in ${AGENT_S}s at most"
END=$(date +%s.%N)
[ -n "$EVAL_PID" ] && wait "$EVAL_PID"
kill "$SMI"
checkpoint "$RUN/trajectories.duckdb" && cp "$RUN/trajectories.duckdb" "$OUT/"

python3 benchmarks/agent_report.py --eval-db "$OUT/expert.duckdb" --name expert --run "$OUT/trajectories.duckdb" \
  --smi "$OUT/smi.csv" --window "$START,$END" --out-json "$OUT/agent_report.json" --out-md "$OUT/agent_report.md" \
  2>> "$LOG"
log "report rc=$?"
