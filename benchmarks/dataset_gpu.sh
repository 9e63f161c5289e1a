#!/usr/bin/env bash
# Issue 17 acceptance 2-3 on the GPU box: `cudagym dataset build --device cuda` as a whole, toward 6,000
# rows, bounded by SECONDS (default 480) and resumable across device calls. From the repo root:
#   bash benchmarks/dataset_gpu.sh [SECONDS]          (carry .whl, .kb, .whl-train and, from call 2, .devout)
# Resumes from this box's /tmp/dataset-build (warm box), else from .devout/dataset-state.tar.gz (the
# previous call's $OUT/dataset-state.tar.gz, copied there), else starts afresh. At SECONDS the build gets
# SIGINT (Ctrl-C): it stores every decision as it comes, so it only publishes what it has (funnel.json,
# dataset/) and exits. Back under $OUT (7 files; 8 where the box has matplotlib: progress.png): report.md, report.json (benchmarks/dataset_report.py),
# card.md (the dataset card), build.log, load.txt (load, GPU use every 15 s), env.txt and
# dataset-state.tar.gz (build.duckdb, calls.jsonl, funnel.json, dataset/ and crawl/, the box's seed crawl: copy it
# to .devout/ to resume).
# Settings: TARGET (6000), SCALE_FLAGS (--scale search: each candidate sized to the runtime window;
# `--scale 32`, the better fixed scale of sessions 5-6, for the comparison; a build folder keeps the
# scale setting it started with), ROUND (150: candidates a round composes, sizes and filters; on
# the H200 in session 15 a round of 150 took ~50 s to compose, ~115 s to size and over 75 s to check,
# so a round of 300 publishes nothing within one call), PARALLEL (16 judges), FILTER_FLAGS (e.g.
# `--no-filter-stream`: a pass of check judges, then one of timing judges, for the A/B against the default
# streamed passes; `--filter-passes 1`: each judge checks, compiles and times), OVERLAP (on:
# the next round composes while this one filters, the GPU default; off: one after the other, as before session 30),
# SETUP_NOTE (words added to the call's setup in calls.jsonl and the report, e.g. what changed in the code since the
# call before), LOCK_TRACE (on: every hold of the GPU lock and of the memory budget traced, gpulock.TRACE_ENV, and
# gpulock.md says where the judges' waits went, gpulock.png when, benchmarks/gpulock_trace.py; the trace comes back gzipped), and from the
# caller's environment CUDAGYM_GPU_LOCK_POLICY (`writers-first`: the lock order's A/B, docs/evaluation.md).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" || exit 1
source "$(dirname "$0")/datasets_wheels.sh" /tmp/site-datasets || exit 1  # datasets: publish writes the parquet
LIMIT=${1:-480}
BUILD=/tmp/dataset-build
if [ ! -f "$BUILD/build.duckdb" ] && [ -f .devout/dataset-state.tar.gz ]; then
  mkdir -p "$BUILD" && tar -xzf .devout/dataset-state.tar.gz -C "$BUILD" || exit 1
fi
# the seed crawl of this box's torch and transformers (crawl.on_disk), carried in the state: 10-15 s of a call's start
[ -d "$BUILD/crawl" ] && mkdir -p "$CUDAGYM_CACHE/crawl" && cp "$BUILD"/crawl/*.pkl "$CUDAGYM_CACHE/crawl/" 2>/dev/null
echo "resume: $(ls "$BUILD" 2>/dev/null | paste -sd' ' || echo fresh), lock ${CUDAGYM_GPU_LOCK_POLICY:-turnstile}, $(date -u)" | tee "$OUT/build.log"
[ "${LOCK_TRACE:-off}" = on ] && export CUDAGYM_GPU_LOCK_TRACE="$OUT/gpulock.jsonl"
sample_load "$OUT/load.txt"
SAMPLER=$!
t0=$(date +%s)
# -s INT: the build's Ctrl-C path (publish what is stored); timeout signals the judges' process group too.
# -k 60: publishing after the stop takes seconds; a hung shutdown is killed, its store still holds every decision.
timeout -k 60 -s INT "$LIMIT" python3 -m cudagym dataset build --device cuda --out "$BUILD" --composer programmatic \
  --target "${TARGET:-6000}" ${SCALE_FLAGS:---scale search} --round-size "${ROUND:-150}" --max-rounds 1000 \
  --parallel "${PARALLEL:-16}" ${FILTER_FLAGS:-} --$([ "${OVERLAP:-on}" = off ] && echo no-)overlap >> "$OUT/build.log" 2>&1
rc=$? WALL=$(( $(date +%s) - t0 ))
echo "build rc=$rc wall $WALL s, $(date -u)" | tee -a "$OUT/build.log"
kill $SAMPLER
if [ -f "$OUT/gpulock.jsonl" ]; then
  python3 benchmarks/gpulock_trace.py "$OUT/gpulock.jsonl" --out "$OUT/gpulock.md" \
    $(python3 -c "import matplotlib" 2>/dev/null && echo --plot "$OUT/gpulock.png") > /dev/null 2>> "$OUT/build.log"
  gzip -f "$OUT/gpulock.jsonl"
fi
# record this call (calls.jsonl, which travels in the state), pack the state, then report with its size
SETUP="${FILTER_FLAGS:-streamed passes}; overlap ${OVERLAP:-on}; round ${ROUND:-150}; lock ${CUDAGYM_GPU_LOCK_POLICY:-turnstile}${SETUP_NOTE:+; $SETUP_NOTE}; $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
python3 benchmarks/dataset_report.py "$BUILD" --wall-s "$WALL" --setup "$SETUP" --out "$OUT" > /dev/null 2>> "$OUT/build.log"
mkdir -p "$BUILD/crawl" && cp "$CUDAGYM_CACHE"/crawl/*.pkl "$BUILD/crawl/" 2>/dev/null
(cd "$BUILD" && tar -czf "$OUT/dataset-state.tar.gz" build.duckdb $(ls -d build.duckdb.wal calls.jsonl funnel.json dataset crawl 2>/dev/null))
python3 benchmarks/dataset_report.py "$BUILD" --packed "$OUT/dataset-state.tar.gz" --out "$OUT" > /dev/null 2>> "$OUT/build.log"
[ -f "$BUILD/dataset/README.md" ] && cp "$BUILD/dataset/README.md" "$OUT/card.md"
size=$(stat -c %s "$OUT/dataset-state.tar.gz")
[ "$size" -gt $((15 * 1024 * 1024)) ] && echo "WARNING: dataset-state.tar.gz is $size bytes: over 16 MiB it does not come back" | tee -a "$OUT/build.log"
grep -v '^\s*$' "$OUT/build.log" | grep -v '━' | tail -25
cat "$OUT/report.md"
[ -f "$OUT/gpulock.md" ] && cat "$OUT/gpulock.md"
