#!/usr/bin/env bash
# Issues 13 and 14 on the GPU in one short device call: benchmarks/agent_gpu.sh (10 KernelBench v0 L1
# problems x 2 samples, 16 rollouts at once, eval run beside them; with TRACE=1 both traced for
# fast_timing_report.py, whose traced reps are timed by the plain window, not strict's queued method),
# then benchmarks/train_gpu.sh on the trajectories it stored (on .devout/trajectories-cpu.duckdb, a CPU
# replay run carried in, if the GPU run stored fewer than 2 rollouts). On the GPU box, from the repo root
# (carry .whl, .kb, .tok, .whl-train and .devout):
#   bash benchmarks/agent_train_gpu.sh [AGENT_SECONDS] [TRAIN_SECONDS]
# Returns (6 files): agent_gpu.log, smi.csv, expert.duckdb, trajectories.duckdb, agent_report.json, extra.tgz
# (train_gpu/, train.log, the traces, fast_timing.md, agent_report.md, env.txt).
set -uo pipefail
AGENT_LIMIT=${1:-300}; TRAIN_LIMIT=${2:-120}
mkdir -p /tmp/traces
TRACES=(); [ -n "${TRACE:-}" ] && TRACES=(EVAL_TRACE=/tmp/traces/eval.jsonl AGENT_TRACE=/tmp/traces/agent.jsonl)
env IDS="${IDS:-19,20,21,22,25,26,27,28,29,30}" PREBUILD_S=0 EVAL_BESIDE=1 "${TRACES[@]}" \
  bash "$(dirname "$0")/agent_gpu.sh" "$AGENT_LIMIT" > /tmp/agent_stdout.txt 2>&1
tail -15 /tmp/agent_stdout.txt
source "$(dirname "$0")/gpu_env.sh" > /dev/null || exit 1
head -30 "$OUT/agent_report.md" 2>/dev/null
DB=$OUT/trajectories.duckdb; EXTRA=()
if ! python3 -c "import duckdb, sys; c = duckdb.connect(sys.argv[1], read_only=True)
sys.exit(0 if c.execute(\"select count(*) from rollouts where status = 'finished' and reward is not null\").fetchone()[0] >= 2 else 1)" \
    "$DB" 2>/dev/null; then
  DB=.devout/trajectories-cpu.duckdb; EXTRA=(--min-reward -2)
  echo "training on the carried CPU replay store (the GPU run finished fewer than 2 judged rollouts)"
fi
timeout -k 10 -s INT "$TRAIN_LIMIT" bash "$(dirname "$0")/train_gpu.sh" "$DB" --deadline-s "$(( TRAIN_LIMIT - 35 ))" "${EXTRA[@]}" \
  > "$OUT/train.log" 2>&1
echo "train rc=$?"
tail -25 "$OUT/train.log"
if [ -n "${TRACE:-}" ]; then
  python3 "$(dirname "$0")/fast_timing_report.py" /tmp/traces/eval.jsonl /tmp/traces/agent.jsonl > "$OUT/fast_timing.md" 2>&1
  tail -14 "$OUT/fast_timing.md"
fi
cp /tmp/traces/*.jsonl /tmp/agent_stdout.txt "$OUT/" 2>/dev/null
cd "$OUT" && tar czf extra.tgz --ignore-failed-read train_gpu train.log ./*.jsonl fast_timing.md agent_report.md env.txt agent_stdout.txt 2>/dev/null
rm -rf train_gpu train.log ./*.jsonl fast_timing.md agent_report.md env.txt agent_stdout.txt
ls -la "$OUT"
