"""Write the expert submission: honest CUDA kernels for KernelBench v0 level-1 problems, the kernels
issue 13 acceptance 4's scripted expert replays (benchmarks/agent_gpu.sh).

    python benchmarks/expert_submission.py OUT_DIR

OUT_DIR/level1/{task.name}.py, the layout `eval run` and `agent eval --replay` read. Two sources, so
that no kernel is written twice in the tree:
- STRESS: the stress benchmark's honest kernels (benchmarks/stress/honest/level1, checked on an H200)
  whose problem is the same in v0: the same op and constructor, shapes read at run time (v0.1's bigger
  sizes and rand instead of randn aside); copied without their `# stress:` headers;
- ELEMENTWISE: new elementwise kernels made from the stress 21_Sigmoid.py by swapping its `act`
  function (fp32 with the accurate expf / tanhf / erff / expm1f / log1pf, as torch computes; no fast
  math), and for a module with a constructor argument (LeakyReLU's negative_slope, ELU's alpha) passing
  it to the kernels as `p`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HONEST = Path(__file__).resolve().parent / "stress" / "honest" / "level1"
STRESS = ["12_Matmul_with_diagonal_matrices_", "19_ReLU", "21_Sigmoid", "23_Softmax", "36_RMSNorm_", "38_L1Norm_",
          "47_Sum_reduction_over_a_dimension", "88_MinGPTNewGelu", "94_MSELoss"]
TEMPLATE, TEMPLATE_STEM = HONEST / "21_Sigmoid.py", "sigmoid"
TEMPLATE_ACT = "return 1.0f / (1.0f + expf(-v));"

# task name -> (function stem, why, the body of act(v) or act(v, p), constructor parameter or None)
ELEMENTWISE = {
    "20_LeakyReLU": ("leaky_relu", "elementwise LeakyReLU with the module's negative_slope (default 0.01)",
                     "return v > 0.f ? v : v * p;", ("negative_slope", "0.01")),
    "22_Tanh": ("tanh", "elementwise tanh with accurate tanhf", "return tanhf(v);", None),
    "25_Swish": ("swish", "elementwise Swish x * sigmoid(x), the sigmoid as 1 / (1 + exp(-x)) with accurate expf",
                 "return v * (1.0f / (1.0f + expf(-v)));", None),
    "26_GELU_": ("gelu", "elementwise exact GELU (torch's default, approximate='none'): 0.5 x (1 + erf(x / sqrt(2)))",
                 "return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));", None),
    "27_SELU_": ("selu", "elementwise SELU with torch's scale and alpha: scale * (x > 0 ? x : alpha * (exp(x) - 1))",
                 "return v > 0.f ? 1.0507009873554804934f * v : 1.0507009873554804934f * 1.6732632423543772848f * expm1f(v);",
                 None),
    "28_HardSigmoid": ("hardsigmoid", "elementwise HardSigmoid as torch computes it: min(max(x + 3, 0), 6) / 6",
                       "return fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) / 6.0f;", None),
    "29_Softplus": ("softplus", "elementwise Softplus with torch's defaults: beta 1, x itself above the threshold 20",
                    "return v > 20.0f ? v : log1pf(expf(v));", None),
    "30_Softsign": ("softsign", "elementwise Softsign x / (1 + |x|)", "return v / (1.0f + fabsf(v));", None),
    "31_ELU": ("elu", "elementwise ELU with the module's alpha (KernelBench passes 1.0): x > 0 ? x : alpha * (exp(x) - 1)",
               "return v > 0.f ? v : p * expm1f(v);", ("alpha", "1.0")),
    "32_HardTanh": ("hardtanh", "elementwise HardTanh, the problem's clamp(x, -1, 1)",
                    "return fminf(fmaxf(v, -1.0f), 1.0f);", None),
}


def _swap(text: str, old: str, new: str) -> str:
    """Replace every `old`; the template must hold it (a changed template fails here, not on the GPU)."""
    if old not in text:
        raise SystemExit(f"expert_submission: error: {TEMPLATE.name} no longer holds {old!r}")
    return text.replace(old, new)


def _stress_kernel(name: str) -> str:
    return "".join(line for line in (HONEST / f"{name}.py").read_text().splitlines(keepends=True)
                   if not re.match(r"# (stress|problem|kb_version): ", line))


def elementwise_kernel(name: str) -> str:
    stem, why, act, param = ELEMENTWISE[name]
    text = _stress_kernel(TEMPLATE.stem)
    text = _swap(text, text.splitlines(keepends=True)[0], f"# why: {why}\n")
    if param is None:
        text = _swap(text, TEMPLATE_ACT, act)
    else:
        attr, default = param
        for old, new in [
            (f"act(float v) {{ {TEMPLATE_ACT} }}", f"act(float v, float p) {{ {act} }}"),
            ("int64_t n4) {", "int64_t n4, float p) {"), ("int64_t start, int64_t n) {", "int64_t start, int64_t n, float p) {"),
            ("v.x = act(v.x); v.y = act(v.y); v.z = act(v.z); v.w = act(v.w);",
             "v.x = act(v.x, p); v.y = act(v.y, p); v.z = act(v.z, p); v.w = act(v.w, p);"),
            ("y[i] = act(x[i]);", "y[i] = act(x[i], p);"),
            (f"torch::Tensor {TEMPLATE_STEM}_forward(torch::Tensor x) {{",
             f"torch::Tensor {TEMPLATE_STEM}_forward(torch::Tensor x, double param) {{\n    const float p = (float)param;"),
            (f"torch::Tensor {TEMPLATE_STEM}_forward(torch::Tensor x);", f"torch::Tensor {TEMPLATE_STEM}_forward(torch::Tensor x, double param);"),
            ("n4);", "n4, p);"), ("(xp, yp, start, n);", "(xp, yp, start, n, p);"),
            ("    def __init__(self):\n        super(ModelNew, self).__init__()\n",
             f"    def __init__(self, {attr}: float = {default}):\n        super(ModelNew, self).__init__()\n"
             f"        self.{attr} = {attr}\n"),
            (f"return ext.{TEMPLATE_STEM}_forward(x)", f"return ext.{TEMPLATE_STEM}_forward(x, self.{attr})")]:
            text = _swap(text, old, new)
    # its own extension name: one build per kernel in a shared build cache
    text = re.sub(r'name="[^"]+"', f'name="cudagym_expert_v0_l1_{name.split("_")[0]}_{stem}"', text)
    return _swap(text, f"{TEMPLATE_STEM}_forward", f"{stem}_forward")


def write_submission(out: Path) -> list[Path]:
    folder = out / "level1"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in STRESS + list(ELEMENTWISE):
        path = folder / f"{name}.py"
        path.write_text(_stress_kernel(name) if name in STRESS else elementwise_kernel(name))
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/expert_submission.py OUT_DIR")
    print(f"{len(write_submission(Path(sys.argv[1])))} kernels in {sys.argv[1]}/level1")
