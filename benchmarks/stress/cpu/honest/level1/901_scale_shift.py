# stress: honest
# problem: local
# why: CPU stand-in for a problem of the benchmark's own (problems/1_901_scale_shift.py): one C++ loop, x * 3 + 1
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor scale_shift_cpu(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty(xc.sizes(), xc.options());
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t n = xc.numel();
    for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] * 3.0f + 1.0f;
    return y;
}
"""

ext = load_inline(
    name="cudagym_stress_cpu_honest_local_l1_901_scale_shift",
    cpp_sources=cpp_source,
    functions=["scale_shift_cpu"],
    extra_cflags=["-O2"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.scale_shift_cpu(x)
