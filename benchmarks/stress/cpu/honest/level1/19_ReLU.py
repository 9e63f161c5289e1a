# stress: honest
# problem: kernelbench
# kb_version: v0
# why: CPU stand-in for the GPU set: a C++ loop over data_ptr<float>() (only allocation through ATen)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor relu_cpu(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty(xc.sizes(), xc.options());
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t n = xc.numel();
    for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] > 0.f ? xp[i] : 0.f;
    return y;
}
"""

ext = load_inline(
    name="cudagym_stress_cpu_honest_v0_l1_19_relu",
    cpp_sources=cpp_source,
    functions=["relu_cpu"],
    extra_cflags=["-O2"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.relu_cpu(x)
