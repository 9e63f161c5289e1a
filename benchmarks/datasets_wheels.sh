# Sourced on the GPU box after gpu_env.sh: `source benchmarks/datasets_wheels.sh TARGET [MORE_WHEELS...]`
# installs the carried datasets, dill and multiprocess wheels (.whl-train/new or .whl-train/old; the box
# has pyarrow, xxhash and huggingface_hub but not datasets) and MORE_WHEELS into TARGET, and puts TARGET
# first on PYTHONPATH. Two sets because datasets 5.2 needs huggingface_hub >= 1.31 and pyarrow >= 24,
# while datasets 4.7 (also the oldest trl 1.16 takes) needs huggingface_hub < 2: the set that fits the
# box's packages is installed.
_target=${1:?usage: source benchmarks/datasets_wheels.sh TARGET [MORE_WHEELS...]}; shift
_set=$(python3 -c "
import importlib.metadata as md
from packaging.version import Version as V
hub, arrow = V(md.version('huggingface_hub')), V(md.version('pyarrow'))
print('new' if hub >= V('1.31') and arrow >= V('24') else 'old')") || return 1
echo "datasets wheels from .whl-train/$_set" >&2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$_target" \
  "$@" .whl-train/"$_set"/*.whl || return 1
export PYTHONPATH=$_target:${PYTHONPATH:-}
