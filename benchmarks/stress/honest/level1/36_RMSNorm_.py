# stress: honest
# problem: kernelbench
# why: RMS over the feature dim (dim 1) of (batch, features, *): one thread per (batch, position), coalesced across positions; sums then divides, in fp32 like the reference
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// x viewed as (batch, C, S); out[b, c, s] = x[b, c, s] / sqrt(mean_c x[b, c, s]^2 + eps).
__global__ void rmsnorm_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t batch, int64_t C, int64_t S,
                               float eps) {
    const int64_t total = batch * S;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < total; p += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = p / S, s = p - b * S;
        const float* xp = x + b * C * S + s;
        float* yp = y + b * C * S + s;
        float acc = 0.f;
        for (int64_t c = 0; c < C; ++c) {
            const float v = xp[c * S];
            acc += v * v;
        }
        const float rms = sqrtf(acc / (float)C + eps);
        for (int64_t c = 0; c < C; ++c) yp[c * S] = xp[c * S] / rms;
    }
}

torch::Tensor rmsnorm_forward(torch::Tensor x, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    TORCH_CHECK(x.dim() >= 2, "a (batch, features, ...) tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty(xc.sizes(), xc.options());
    const int64_t batch = xc.size(0), C = xc.size(1);
    if (xc.numel() == 0) return y;
    const int64_t S = xc.numel() / (batch * C);
    const int threads = 256;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 16;
    const int blocks = (int)std::min<int64_t>((batch * S + threads - 1) / threads, max_blocks);
    rmsnorm_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(),
                                                                            batch, C, S, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor rmsnorm_forward(torch::Tensor x, double eps);"

ext = load_inline(
    name="cudagym_stress_honest_l1_36_rmsnorm",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rmsnorm_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super(ModelNew, self).__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.rmsnorm_forward(x, self.eps)
