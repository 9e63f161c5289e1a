# Honest algebra in CUDA: diag(A) @ B is row scaling, one pass over B instead of an N^3 GEMM.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void row_scale(const float* __restrict__ a, const float4* __restrict__ b, float4* __restrict__ c,
                          int64_t rows, int64_t cols4) {
    int64_t row = blockIdx.y;
    float s = a[row];
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < cols4; j += (int64_t)gridDim.x * blockDim.x) {
        float4 v = b[row * cols4 + j];
        v.x *= s; v.y *= s; v.z *= s; v.w *= s;
        c[row * cols4 + j] = v;
    }
}

torch::Tensor diag_matmul(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(B.size(1) % 4 == 0, "columns must be a multiple of 4");
    auto a = A.contiguous();
    auto b = B.contiguous();
    auto c = torch::empty_like(b);
    const int64_t rows = b.size(0), cols4 = b.size(1) / 4;
    dim3 grid((unsigned)std::min<int64_t>((cols4 + 255) / 256, 8), (unsigned)rows);
    row_scale<<<grid, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), reinterpret_cast<const float4*>(b.data_ptr<float>()),
        reinterpret_cast<float4*>(c.data_ptr<float>()), rows, cols4);
    return c;
}
"""

cpp_source = "torch::Tensor diag_matmul(torch::Tensor A, torch::Tensor B);"

ext = load_inline(name="cudagym_example_diag_matmul_cuda", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["diag_matmul"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return ext.diag_matmul(A, B)
