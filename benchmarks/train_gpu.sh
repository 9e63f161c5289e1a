# Issue 14 acceptance 4 on the GPU machine: benchmarks/train_gpu.py (RFT, TRL SFT, value, PPO) on a store.
# Run from the repo root after `. benchmarks/gpu_env.sh` (its exports: PYTHONPATH, OUT, ...) and an agent run that wrote DB:
#   bash benchmarks/train_gpu.sh DB [train_gpu.py flags]      -> $OUT/train_gpu/{train_gpu.json,train_gpu.md}
# (the models and checkpoints go to /tmp/train_gpu_work, off $OUT)
# Carry: .whl (gpu_env.sh), .kb, .tok (SmolLM2's tokenizer) and .whl-train: trl plus two sets of datasets,
# dill and multiprocess wheels (benchmarks/datasets_wheels.sh installs the set that fits the machine).
db=${1:?usage: bash benchmarks/train_gpu.sh DB [train_gpu.py flags]}; shift
source "$(dirname "$0")/datasets_wheels.sh" /tmp/site-train .whl-train/trl-*.whl || exit 1
rm -rf /tmp/train_gpu_work  # models and checkpoints stay on the box: only the report comes back
exec python3 benchmarks/train_gpu.py --db "$db" --out "$OUT/train_gpu" --work-dir /tmp/train_gpu_work --device cuda "$@"
