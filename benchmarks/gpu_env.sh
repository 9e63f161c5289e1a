# Source on the GPU box (repo root): installs the carried wheels (.whl: duckdb, libcst; .whl-ray, when
# carried: the slimmed Ray of benchmarks/slim_ray_wheel.py) and points cudagym at the carried
# KernelBench file (.kb) and a shared build cache.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
if [ -d .whl-ray ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl-ray/*.whl || return 1
  export RAY_USAGE_STATS_ENABLED=0
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export CUDAGYM_KERNELBENCH=$PWD/.kb/problems.jsonl CUDAGYM_CACHE=/tmp/cudagym-cache TORCH_CUDA_ARCH_LIST=9.0
export HF_HUB_OFFLINE=1 OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" | tee -a "$OUT/env.txt"
