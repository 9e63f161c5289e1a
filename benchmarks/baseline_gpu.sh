#!/usr/bin/env bash
# Issue 16 "Baselines fast from cold": its GPU runs, one step per device call. On the GPU box, from the
# repo root (carry .whl and .kb; for warm also .devout, for ab also .kbsrc):
#   bash benchmarks/baseline_gpu.sh STEP [SECONDS]
# STEP:
#   cold  all 250 v0.1 L1-3 baselines from cold build caches (a fresh CUDAGYM_CACHE, so a machine left
#         warm by an earlier call is cold too), timed; then `baseline cache export` of what it compiled,
#         into $OUT as compile-cache.zip, or as 15 MiB parts compile-cache.zip.part-NN when over the
#         16 MiB a returned file may have. Carry them back as .devout/ for warm. EXPORT=0: no export (a
#         run cut short on purpose, to see how far the pipeline gets).
#   warm  `baseline cache import` of the bundle (the cold step's on this box when the box is still warm,
#         else the carried .devout/compile-cache.zip*) into a fresh cache, then the same run into a
#         fresh DB, timed (acceptance 1: under 5 minutes).
#   ab    acceptance 2 on IDS (default 1-12: 36 problems) of each level of KBV (default v0.1): `cudagym baseline run
#         --precision kernelbench --timing-mode AB_TIMING` (default strict: our queued launches; kernelbench: their
#         cuda_event window per call, which counts the host's load too) once per AB_THREADS setting (below), then KernelBench's own loop (benchmarks/kernelbench_baseline_ab.py
#         theirs, fp32 and torch's TF32 defaults, cold inductor/Triton caches of its own) in the time
#         left, then the table (compare). Make .kbsrc first: python benchmarks/kernelbench_baseline_ab.py
#         checkout <KernelBench git dir>.
# SECONDS (default 540) bounds the step, setup and exports included, inside the call's 600 s. Under $OUT: env.txt,
# summary.txt (one line per step) and the step's files (at most 8 in all); progress logs carry the
# seconds since the run started in their first column, for the time split.
set -uo pipefail
START=$(date +%s)  # the bound counts the setup too: the call's 600 s do
source "$(dirname "$0")/gpu_env.sh" || exit 1
STEP=$1; LIMIT=${2:-540}
PARALLEL=${PARALLEL:-16}; PRECISION=${PRECISION:-strict}; KBV=${KBV:-v0.1}; IDS=${IDS:-1-12}; AB_TIMING=${AB_TIMING:-strict}
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
stamp() { SECONDS=0; local line; while IFS= read -r line; do printf '%4d %s\n' "$SECONDS" "$line"; done; }
# From a stamped progress log: when compiles and stored baselines came (the time split).
split_times() {
  awk '/ compiled( \(|$)/ { if (c0 == "") c0 = $1; c1 = $1 } / stored( \(|$)/ { if (s0 == "") s0 = $1; s1 = $1; n++ }
       END { printf "compiled (compile judges) %s-%s s, stored %d at %s-%s s", c0, c1, n, s0, s1 }' "$1"
}
# A cudagym baseline run of everything selected into a fresh DB: sets RC and WALL.
baselines() {  # LOG DB ARGS...
  local log=$1 db=$2 t0; shift 2; rm -f "$db" "$db.wal"; t0=$(date +%s)
  timeout -k 20 -s INT "$(( $(left) - 30 ))" python3 -m cudagym baseline run --kb-version "$KBV" --levels 1,2,3 \
    --parallel "$PARALLEL" --db "$db" --json "$@" 2> >(stamp > "$log") > "${log%.log}.json"
  RC=$?; WALL=$(( $(date +%s) - t0 )); sleep 1  # the stamping subshell writes its last lines
}
# The stored baselines' records (the timing judge's compile_s, the reps), for the time split.
stored_records() {
  python3 -c "import duckdb, json, sys; db = duckdb.connect(sys.argv[1], read_only=True)
print(json.dumps([json.loads(r) for (r,) in db.execute('SELECT record FROM baselines ORDER BY created').fetchall()]))" "$1"
}
fresh_cache() { export CUDAGYM_CACHE; CUDAGYM_CACHE=$(mktemp -d /tmp/cudagym-cache.XXXX); }

case $STEP in
  cold)
    fresh_cache; sample_load "$OUT/load.txt" 10  # cold (appended to cold.log) and warm: ab returns 8 files already
    baselines "$OUT/cold.log" /tmp/cold.duckdb --precision "$PRECISION"
    t0=$(date +%s)
    [ "${EXPORT:-1}" = 1 ] && python3 -m cudagym baseline cache export /tmp/compile-cache.zip >> "$OUT/cold.log" 2>&1
    size=$(stat -c %s /tmp/compile-cache.zip 2>/dev/null || echo 0)
    if [ "$size" -gt $(( 16 * 1024 * 1024 )) ]; then
      split -b 15M -d /tmp/compile-cache.zip "$OUT/compile-cache.zip.part-"  # cat them back together
    else
      cp /tmp/compile-cache.zip "$OUT/" 2>/dev/null
    fi
    echo "cold rc=$RC run ${WALL}s, $(split_times "$OUT/cold.log"); export $(( $(date +%s) - t0 ))s $(( size / 1024 ))KiB" \
      | tee -a "$OUT/summary.txt"
    stored_records /tmp/cold.duckdb > "$OUT/cold_records.json"
    kill $(jobs -p) 2>/dev/null; { echo "# load.txt"; cat "$OUT/load.txt"; } >> "$OUT/cold.log" && rm "$OUT/load.txt" ;;  # 8 files
  warm)
    fresh_cache; sample_load "$OUT/load.txt" 10
    # The bundle a cold step exported on this box (a warm box: a bundle of all 250 is over the 64 MiB a
    # call carries beside .whl), else the carried .devout/compile-cache.zip or its parts, in order.
    # Either way it is loaded into fresh caches, as on a new machine.
    [ -f /tmp/compile-cache.zip ] || cat .devout/compile-cache.zip* > /tmp/compile-cache.zip || exit 1
    t0=$(date +%s)
    python3 -m cudagym baseline cache import /tmp/compile-cache.zip > "$OUT/warm_import.txt" 2>&1
    imported=$(( $(date +%s) - t0 ))
    baselines "$OUT/warm.log" /tmp/warm.duckdb --precision "$PRECISION"
    echo "warm rc=$RC import ${imported}s run ${WALL}s, $(split_times "$OUT/warm.log")" | tee -a "$OUT/summary.txt" ;;
  ab)
    # Ours once per compile-thread setting in AB_THREADS (default "default": torch's knob unset, the
    # cores shared out among the judges; a number: TORCHINDUCTOR_COMPILE_THREADS), each in fresh caches.
    for v in ${AB_THREADS:-default}; do
      fresh_cache
      if [ "$v" = default ]; then unset TORCHINDUCTOR_COMPILE_THREADS; else export TORCHINDUCTOR_COMPILE_THREADS=$v; fi
      baselines "$OUT/ab_ours_$v.log" "/tmp/ab_$v.duckdb" --ids "$IDS" --precision kernelbench --timing-mode "$AB_TIMING"
      printf -v "wall_$v" %s "$WALL"; printf -v "rc_$v" %s "$RC"
    done
    unset TORCHINDUCTOR_COMPILE_THREADS
    # Their loop gets cold inductor and Triton caches of its own, and the time left but 40 s for the tables.
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) TRITON_CACHE_DIR=$(mktemp -d) timeout -k 10 -s INT "$(( $(left) - 40 ))" \
      python3 benchmarks/kernelbench_baseline_ab.py theirs --kb-version "$KBV" --levels 1,2,3 --ids "$IDS" \
      --out "$OUT/ab_theirs.jsonl" --deadline-s "$(( $(left) - 100 ))" 2> >(stamp > "$OUT/ab_theirs.log")
    theirs_rc=$?; sleep 1
    for v in ${AB_THREADS:-default}; do
      wall=wall_$v rc=rc_$v
      python3 benchmarks/kernelbench_baseline_ab.py compare --theirs "$OUT/ab_theirs.jsonl" --db "/tmp/ab_$v.duckdb" \
        --ours-wall-s "${!wall}" --precision kernelbench --timing-mode "$AB_TIMING" --out "$OUT/ab_$v.json" \
        > "$OUT/ab_table_$v.txt" 2>&1
      echo "ab ids $IDS threads $v timing $AB_TIMING rc ours=${!rc} theirs=$theirs_rc; $(tail -2 "$OUT/ab_table_$v.txt" | tr '\n' ' ')" \
        | tee -a "$OUT/summary.txt"
      cat "$OUT/ab_table_$v.txt"
    done
    # At most 8 files come back: the logs and JSON in one archive beside env, summary and the tables.
    (cd "$OUT" && files=$(ls ab_ours_* ab_theirs.* ab_*.json 2>/dev/null | sort -u) && tar czf ab_files.tgz $files && rm -f $files) ;;
  *) echo "unknown step $STEP (cold, warm, ab)"; exit 2 ;;
esac
kill $(jobs -p) 2>/dev/null
