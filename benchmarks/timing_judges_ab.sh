#!/usr/bin/env bash
# A/B of the GPU filter's timing pass (not yet run to the end; see benchmarks/NOTES.md, session 6):
# the same checked tasks timed with 8, 4 and 16 judges per GPU. Carry .whl and .kb; from the repo
# root on the GPU box: bash benchmarks/timing_judges_ab.sh. About 6 minutes on one H200 from cold.
# The check pass's --seconds counts from the end of composing (~20 s), so each outer `timeout` leaves
# room for composing and the stop; a call killed by it writes no JSON.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" || exit 1
A="--scales 16,32 --n 64 --compose-procs 4 --parallel 16 --chunk 8"
timeout 330 python3 benchmarks/gpu_filter.py "$OUT/a.json" $A --check-only --seconds 270 > "$OUT/run.log" 2>&1
echo "check pass rc=$? $(date +%T)" | tee -a "$OUT/run.log"
for j in 8 4 16; do
  timeout 150 python3 benchmarks/gpu_filter.py "$OUT/t$j.json" $A --resume "$OUT/a.json" --timing-judges $j \
    --seconds 100 >> "$OUT/run.log" 2>&1
  echo "judges $j rc=$? $(date +%T)" | tee -a "$OUT/run.log"
done
python3 - <<'PY' | tee "$OUT/summary.txt"
import json, os, statistics as st
out = os.environ["OUT"]
a = json.load(open(f"{out}/a.json"))
print("check pass:", a["report"]["this_call_filter_s"], "s,", len(a["results"]), "decided,", len(a["checked"]), "checked")
runs = {j: json.load(open(f"{out}/t{j}.json")) for j in (4, 8, 16) if os.path.exists(f"{out}/t{j}.json")}
for j, d in runs.items():
    new = {k: v for k, v in d["results"].items() if k not in a["results"]}
    print(f"judges {j}: {d['report']['this_call_filter_s']} s for {len(new)} timed, {sum(v['keep'] for v in new.values())}"
          f" kept, GPU held alone {sum(v['timing_s'] or 0 for v in new.values()):.1f} s")
base = runs.get(4)
for j, d in runs.items():
    if j == 4 or not base:
        continue
    both = [k for k in d["results"] if k not in a["results"] and k in base["results"]]
    rel = sorted(abs(d["results"][k]["t_eager_ms"] / base["results"][k]["t_eager_ms"] - 1) for k in both
                 if d["results"][k]["t_eager_ms"] and base["results"][k]["t_eager_ms"])
    flips = sum(d["results"][k]["keep"] != base["results"][k]["keep"] for k in both)
    if rel:
        print(f"judges {j} vs 4: eager time rel. diff median {st.median(rel):.2%}, p90 {rel[int(.9 * (len(rel) - 1))]:.2%},"
              f" max {rel[-1]:.1%}; {flips} of {len(both)} decisions differ")
PY
