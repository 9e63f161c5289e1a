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
# sample_load FILE [SECONDS]: load average, GPU utilisation and memory every SECONDS (15) into FILE, in the
# background (its pid in $!), each line stamped with the clock time and the seconds since the call; then
# the MiB each process holds on the GPU (its context and its allocator's cache: what the memory budget's
# shares must cover), smallest first.
sample_load() {
  local file=$1 every=${2:-15} t0; t0=$(date +%s)
  (while sleep "$every"; do
     echo "$(date +%T) +$(( $(date +%s) - t0 ))s load $(cut -d' ' -f1-3 /proc/loadavg) gpu $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader | paste -sd';') procs MiB $(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits | sort -n | paste -sd' ')"
   done) > "$file" 2>&1 &
}
