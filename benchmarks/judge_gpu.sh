#!/usr/bin/env bash
# Issue "Judge under load": its GPU runs. On the GPU box, from the repo root (carry .whl and .kb):
#   bash benchmarks/judge_gpu.sh STEP [SECONDS]
# STEP: adversarial (the CUDA fixtures, strict then paper timing (MODES), 12 at once: concurrent callers
# themselves) | audit (KernelBench v0 and v0.1 L1-3) | stress-strict | stress-paper (benchmarks/stress.py:
# 16+ concurrent eval one + an eval run) | stress-both (both modes at once: every candidate, multi-GB ones
# included, as an eval one in each mode, and one eval run per mode without the multi-GB problems; the lone
# yardstick from LONE_FROM, an earlier results JSON; PYTEST_FLAGS adds to the adversarial pytest, e.g. --durations=0) | repeat (the 19 fast honest kernels of
# benchmarks/expert_submission.py, KernelBench v0 L1, timed by two eval runs, each with its own store so
# both time compile: benchmarks/repeatability.py --by-measure; REPEAT_TRACE=1 traces every rep for
# benchmarks/fast_timing_report.py; run a is named `expert` in $OUT/expert.duckdb, which agent_gpu.sh
# resumes when carried back as .devout/expert.duckdb). SECONDS bounds the step. Results under $OUT: one log
# per step and JSON files.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" || exit 1
STEP=$1; LIMIT=${2:-300}; T0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - T0) - ${1:-0} )); }
run() { local t0=$(date +%s); timeout -k 20 -s INT "$LIMIT" "$@"; local rc=$?; echo "$STEP rc=$rc $(( $(date +%s)-t0 ))s" | tee -a "$OUT/summary.txt"; }
case $STEP in
  adversarial)
    for mode in ${MODES:-strict paper}; do
      CUDAGYM_FIXTURE_TIMING_MODE=$mode run python3 -m pytest tests/eval/test_adversarial.py -k "cuda and not header" -n 12 -q ${PYTEST_FLAGS:-} \
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
  stress-both)
    python3 benchmarks/timing_sanity.py > "$OUT/timing_sanity.txt" 2>&1 || { tail -12 "$OUT/timing_sanity.txt"; exit 1; }
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 2 > "$OUT/smi.csv" 2>&1 &
    SMI=$!
    timeout -k 10 -s INT "${PREBUILD_S:-170}" python3 benchmarks/stress.py --kb-version v0.1 --phases prebuild \
      --build-parallel 16 --out "$OUT/prebuild.json" --deadline-s "$(( ${PREBUILD_S:-170} - 10 ))" > "$OUT/stress-both.txt" 2>&1
    echo "prebuild rc=$? at $(( $(date +%s) - T0 ))s" | tee -a "$OUT/summary.txt"
    RUN_ONLY=${RUN_ONLY:-'honest/level(1/(12|21|38|47|88|94)|2/)'}  # the eval runs leave out L1/19, 23, 36 (GBs of inputs)
    LONE=(); PIDS=()
    [ -n "${LONE_FROM:-}" ] && LONE=(--lone-from "$LONE_FROM")
    DL=$(left 25)
    for mode in strict paper; do
      timeout -k 10 -s INT "$(( DL + 10 ))" python3 benchmarks/stress.py --kb-version v0.1 --timing-mode "$mode" \
        --phases concurrent --callers 19 --run-only "$RUN_ONLY" "${LONE[@]}" --out "$OUT/stress-$mode.json" \
        --deadline-s "$DL" > "$OUT/stress-$mode.txt" 2>&1 &
      PIDS+=($!)
    done
    wait "${PIDS[@]}"
    kill $SMI
    for mode in strict paper; do tail -30 "$OUT/stress-$mode.txt"; done
    sort -t, -k3 -n "$OUT/smi.csv" | tail -1 ;;
  repeat)
    EXPERT=/tmp/expert; LOG=$OUT/repeat.log
    # First the queued method itself (stop early if it fails), then, while the expert kernels build, the
    # references of launch-heavy L3 networks as candidates: long host paths, spins that must grow, no false evidence.
    python3 benchmarks/timing_sanity.py --json "$OUT/timing_sanity.json" > "$OUT/timing_sanity.txt" 2>&1; rc=$?
    tail -12 "$OUT/timing_sanity.txt"; [ $rc = 0 ] || exit 1
    python3 benchmarks/reference_submission.py /tmp/refsub --kb-version v0.1 --levels 3
    timeout -k 10 -s INT "${L3_S:-200}" python3 -m cudagym eval run /tmp/refsub --kb-version v0.1 --levels 3 --ids "${L3_IDS:-3,9,10,15}" \
      --policy permissive --device cuda --db "$OUT/l3ref.duckdb" --name l3ref --json > "$OUT/l3ref.jsonl" 2> "$OUT/l3ref.log" &
    L3=$!
    python3 benchmarks/expert_submission.py "$EXPERT" > "$LOG" 2>&1 || exit 1
    timeout -k 10 -s INT "$(( ${PREBUILD_S:-150} + 10 ))" python3 benchmarks/prebuild.py "$EXPERT" --parallel "$(nproc)" \
      --deadline-s "${PREBUILD_S:-150}" >> "$LOG" 2>&1
    echo "prebuild rc=$? at $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
    python3 -c "
import json
from cudagym.eval.judge import trace_about, Request
from cudagym.kernelbench import load_problems
# the trace's problem key (judge.trace_about) -> a readable name
print(json.dumps({trace_about(Request(mode='eval', ref_code=p.code, workdir=''))['problem']: f'v0 L{p.level}/{p.problem_id} {p.name}'
                  for p in load_problems('v0', levels=[1])}))" > "$OUT/names.json" 2>> "$LOG"
    wait $L3; echo "l3 references rc=$? at $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
    python3 -c "
import json, sys
for line in open(sys.argv[1]):
    v = json.loads(line); t = v.get('timing') or {}
    print('l3ref', v['problem_id'], v['name'][:24], v['status'], v.get('flags'), str(v.get('reason', ''))[:120],
          {k: t.get(k) for k in ('method', 'median_ms', 'window_median_ms', 'host_median_ms', 'exposed_fraction')}, (t.get('info') or {}).get('time_floors_ms'))
" "$OUT/l3ref.jsonl" 2>&1 | tee -a "$LOG"
    IDS=$(ls "$EXPERT"/level1/*.py | sed 's#.*/##; s/_.*//' | sort -n | paste -sd, -)
    RUN_S=$(( $(left 40) / 2 ))
    mkdir -p /tmp/traces  # judges may write only there (and their caches), not $OUT: the folder of the trace file
    for run in a b; do
      name=expert; db=$OUT/expert.duckdb; [ $run = b ] && name=expert-b && db=$OUT/expert-b.duckdb  # b times compile again
      trace=(); [ -n "${REPEAT_TRACE:-}" ] && trace=(env CUDAGYM_TIMING_TRACE=/tmp/traces/trace-$run.jsonl)
      "${trace[@]}" timeout -k 10 -s INT "$RUN_S" python3 -m cudagym eval run "$EXPERT" \
        --kb-version v0 --levels 1 --ids "$IDS" --device cuda --db "$db" --name "$name" --json > /dev/null 2>> "$LOG"
      echo "eval run $run rc=$? at $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
      python3 -c "import duckdb, sys; c = duckdb.connect(sys.argv[1]); c.execute('CHECKPOINT'); c.close()" "$db"
    done
    python3 benchmarks/repeatability.py "$OUT/expert.duckdb" --db-b "$OUT/expert-b.duckdb" --a expert --b expert-b \
      --by-measure 2>&1 | tee -a "$LOG"
    if [ -n "${REPEAT_TRACE:-}" ]; then
      gzip -c /tmp/traces/trace-a.jsonl > "$OUT/trace-a.jsonl.gz"; gzip -c /tmp/traces/trace-b.jsonl > "$OUT/trace-b.jsonl.gz"
      python3 benchmarks/fast_timing_report.py /tmp/traces/trace-a.jsonl /tmp/traces/trace-b.jsonl --names "$OUT/names.json" \
        --out-md "$OUT/fast_timing.md" 2>&1 | tee -a "$LOG"
    fi ;;
esac
