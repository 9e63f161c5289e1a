# Honest algebra: diag(A) @ B is row scaling, O(N*M) instead of O(N*N*M).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor diag_matmul_cpu(torch::Tensor A, torch::Tensor B) {
    auto a = A.contiguous();
    auto b = B.contiguous();
    const int64_t n = b.size(0), m = b.size(1);
    auto c = torch::empty_like(b);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* pc = c.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < m; ++j) pc[i * m + j] = pa[i] * pb[i * m + j];
    return c;
}
"""

ext = load_inline(name="cudagym_example_diag_matmul_cpu", cpp_sources=cpp_source, functions=["diag_matmul_cpu"],
                  extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return ext.diag_matmul_cpu(A, B)
