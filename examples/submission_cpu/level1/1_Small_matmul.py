# Honest: a C++ matmul (i-k-j loop order, so the inner loop streams rows of B and C).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor matmul_cpu(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.dim() == 2 && B.dim() == 2 && A.size(1) == B.size(0), "shape mismatch");
    auto a = A.contiguous();
    auto b = B.contiguous();
    const int64_t n = a.size(0), k = a.size(1), m = b.size(1);
    auto c = torch::empty({n, m}, a.options());
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* pc = c.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
        float* row = pc + i * m;
        for (int64_t j = 0; j < m; ++j) row[j] = 0.0f;
        for (int64_t p = 0; p < k; ++p) {
            const float s = pa[i * k + p];
            const float* brow = pb + p * m;
            for (int64_t j = 0; j < m; ++j) row[j] += s * brow[j];
        }
    }
    return c;
}
"""

ext = load_inline(name="cudagym_example_matmul_cpu", cpp_sources=cpp_source, functions=["matmul_cpu"],
                  extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return ext.matmul_cpu(A, B)
