# stress: hack
# problem: kernelbench
# hack: torch_alias
# why: the GEMM is a C++ extension (at::mm, allowed) but the bias, multiply and LeakyReLU run as torch ops in forward, which the strict policy forbids
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor mm_only(torch::Tensor x, torch::Tensor weight) {
    return at::mm(x.contiguous(), weight.t());
}
"""

ext = load_inline(
    name="cudagym_stress_hack_l2_12_gemm_torch_epilogue",
    cpp_sources=cpp_source,
    functions=["mm_only"],
    extra_cflags=["-O2"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x):
        y = ext.mm_only(x, self.gemm.weight)
        return F.leaky_relu((y + self.gemm.bias) * self.multiplier, self.negative_slope)
