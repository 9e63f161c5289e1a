# Issue 14 acceptance 4 on the GPU machine: benchmarks/train_gpu.py (RFT, TRL SFT, value, PPO) on a store.
# Run from the repo root after `. benchmarks/gpu_env.sh` (its exports: PYTHONPATH, OUT, ...) and an agent run that wrote DB:
#   bash benchmarks/train_gpu.sh DB [train_gpu.py flags]      -> $OUT/train_gpu/{train_gpu.json,train_gpu.md}
# Carry: .whl (gpu_env.sh), .kb, .tok (SmolLM2's tokenizer) and .whl-train: trl plus two sets of datasets,
# dill and multiprocess wheels. datasets 5.2 needs huggingface_hub >= 1.31 and pyarrow >= 24; datasets 4.7
# (the oldest trl 1.16 takes) needs huggingface_hub < 2: the set that fits the machine's packages is installed.
db=${1:?usage: bash benchmarks/train_gpu.sh DB [train_gpu.py flags]}; shift
wheels=$(python3 -c "
import importlib.metadata as md
from packaging.version import Version as V
hub, arrow = V(md.version('huggingface_hub')), V(md.version('pyarrow'))
print('new' if hub >= V('1.31') and arrow >= V('24') else 'old')")  || exit 1
echo "train_gpu.sh: datasets wheels from .whl-train/$wheels" >&2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-train \
  .whl-train/trl-*.whl .whl-train/"$wheels"/*.whl || exit 1
PYTHONPATH=/tmp/site-train:${PYTHONPATH:-} exec python3 benchmarks/train_gpu.py --db "$db" --out "$OUT/train_gpu" --device cuda "$@"
