# stress: honest
# problem: kernelbench
# why: exact algebra: diag(A) @ B == A[:, None] * B, one pass over B (row scaling) instead of an N^3 GEMM
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// c[r, j] = a[r] * b[r, j]; rows over blockIdx.y, columns over blockIdx.x (both grid-stride).
__global__ void row_scale(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                          int64_t rows, int64_t cols) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float s = a[r];
        const float* br = b + r * cols;
        float* cr = c + r * cols;
        for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x)
            cr[j] = s * br[j];
    }
}

torch::Tensor diag_matmul(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "CUDA tensors expected");
    TORCH_CHECK(A.scalar_type() == torch::kFloat32 && B.scalar_type() == torch::kFloat32, "float32 expected");
    TORCH_CHECK(A.dim() == 1 && B.dim() == 2 && A.size(0) == B.size(0), "A (N,) and B (N, M) expected");
    auto a = A.contiguous();
    auto b = B.contiguous();
    auto c = torch::empty(b.sizes(), b.options());
    const int64_t rows = b.size(0), cols = b.size(1);
    if (rows == 0 || cols == 0) return c;
    const int threads = 256;
    const dim3 grid((unsigned)std::min<int64_t>((cols + threads - 1) / threads, 64),
                    (unsigned)std::min<int64_t>(rows, 65535));
    row_scale<<<grid, threads, 0, at::cuda::getCurrentCUDAStream()>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                                                     c.data_ptr<float>(), rows, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c;
}
"""

cpp_source = "torch::Tensor diag_matmul(torch::Tensor A, torch::Tensor B);"

ext = load_inline(
    name="cudagym_stress_honest_l1_12_diag_matmul",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["diag_matmul"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, A, B):
        return ext.diag_matmul(A, B)
