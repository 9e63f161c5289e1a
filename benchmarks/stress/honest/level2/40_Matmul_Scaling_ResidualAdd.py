# stress: honest
# problem: kernelbench
# kb_version: v0
# why: the GEMM through cuBLAS (at::mm from C++), then one epilogue kernel: v = y + bias, out = v * s + v (the reference's scaling plus residual, same rounding); a tiny problem (KernelBench v0 sizes)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void bias_scale_residual(float* __restrict__ y, const float* __restrict__ bias, int64_t rows, int64_t cols,
                                    float scale) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        float* yr = y + r * cols;
        for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
            const float v = __fadd_rn(yr[j], bias[j]);
            yr[j] = __fadd_rn(__fmul_rn(v, scale), v);
        }
    }
}

torch::Tensor linear_scale_residual(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double scale) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                bias.scalar_type() == torch::kFloat32, "float32 expected");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1) && bias.numel() == weight.size(0),
                "x (B, in), weight (out, in), bias (out,) expected");
    auto xc = x.contiguous();
    auto bc = bias.contiguous();
    auto y = at::mm(xc, weight.t());  // cuBLAS; a fresh contiguous (B, out) tensor
    TORCH_CHECK(y.is_contiguous(), "GEMM output not contiguous");
    const int64_t rows = y.size(0), cols = y.size(1);
    if (rows == 0 || cols == 0) return y;
    const int threads = 128;
    const dim3 grid((unsigned)std::min<int64_t>((cols + threads - 1) / threads, 64),
                    (unsigned)std::min<int64_t>(rows, 65535));
    bias_scale_residual<<<grid, threads, 0, at::cuda::getCurrentCUDAStream()>>>(y.data_ptr<float>(), bc.data_ptr<float>(),
                                                                               rows, cols, (float)scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor linear_scale_residual(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double scale);"

ext = load_inline(
    name="cudagym_stress_honest_v0_l2_40_linear_scale_residual",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["linear_scale_residual"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor):
        super(ModelNew, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)  # same parameter names as the reference: its weights load
        self.scaling_factor = scaling_factor

    def forward(self, x):
        return ext.linear_scale_residual(x, self.matmul.weight, self.matmul.bias, self.scaling_factor)
