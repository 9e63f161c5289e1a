#!/usr/bin/env bash
# The GPU filter run of issue 3 (two passes, Ray, every visible GPU), resumable across device calls.
# Carry .whl, .whl-ray and .kb (see ray_scale.sh). From the repo root on the GPU box:
#   [SECS=480] [PREV=FILE.json] bash benchmarks/gpu_filter.sh
# Resumes from /tmp/gpu-filter-prev.json (this box's previous call, while it stays warm), else from
# PREV (default: the committed H200 results of 2026-12-01, all 1,069 done; PREV=none measures afresh).
# Results under $OUT: filter.json (pass it back as PREV next call), filter.log, load.txt (load
# average, GPU utilisation and memory every 15 s), env.txt.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" || exit 1
PREV_CALL=/tmp/gpu-filter-prev.json
RESUME=${PREV:-benchmarks/results/gpu-filter-h200-2026-12-01.json}
[ -f "$PREV_CALL" ] && RESUME=$PREV_CALL
echo "resume from $RESUME, $(date -u)" | tee "$OUT/filter.log"
sample_load "$OUT/load.txt"
SAMPLER=$!
python3 benchmarks/gpu_filter.py "$OUT/filter.json" --scales 16,32 --n 540 --parallel 16 --chunk 8 --runner ray \
  --seconds "${SECS:-480}" --resume "$RESUME" >> "$OUT/filter.log" 2>&1
echo "rc=$? $(date -u)" | tee -a "$OUT/filter.log"
kill $SAMPLER
cp "$OUT/filter.json" "$PREV_CALL"
grep -v '^\s*$' "$OUT/filter.log" | tail -60
