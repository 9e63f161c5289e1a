# stress: honest
# problem: kernelbench
# why: the GEMM through cuBLAS (at::mm from C++, allowed under strict), then one fused epilogue kernel: + bias, * multiplier, LeakyReLU
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// y[r, j] = leaky((y[r, j] + bias[j]) * mult), in place on the GEMM's own output.
__global__ void bias_mul_leaky(float* __restrict__ y, const float* __restrict__ bias, int64_t rows, int64_t cols,
                               float mult, float slope) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        float* yr = y + r * cols;
        for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
            const float v = __fmul_rn(__fadd_rn(yr[j], bias[j]), mult);
            yr[j] = v > 0.f ? v : __fmul_rn(v, slope);
        }
    }
}

torch::Tensor gemm_mul_leaky(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double mult, double slope) {
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
    const int threads = 256;
    const dim3 grid((unsigned)std::min<int64_t>((cols + threads - 1) / threads, 64),
                    (unsigned)std::min<int64_t>(rows, 65535));
    bias_mul_leaky<<<grid, threads, 0, at::cuda::getCurrentCUDAStream()>>>(y.data_ptr<float>(), bc.data_ptr<float>(),
                                                                          rows, cols, (float)mult, (float)slope);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor gemm_mul_leaky(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double mult, double slope);"

ext = load_inline(
    name="cudagym_stress_honest_l2_12_gemm_mul_leaky",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gemm_mul_leaky"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)  # same parameter names as the reference: its weights load
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x):
        return ext.gemm_mul_leaky(x, self.gemm.weight, self.gemm.bias, self.multiplier, self.negative_slope)
