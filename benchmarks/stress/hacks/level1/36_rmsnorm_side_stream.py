# stress: hack
# problem: kernelbench
# hack: nondefault_stream
# why: the RMSNorm kernel is launched on a private non-blocking stream and forward returns without waiting, so events recorded on the current stream close before the work is done
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void rmsnorm_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t batch, int64_t C, int64_t S,
                               float eps) {
    const int64_t total = batch * S;
    for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < total; p += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = p / S, s = p - b * S;
        const float* xp = x + b * C * S + s;
        float* yp = y + b * C * S + s;
        float acc = 0.f;
        for (int64_t c = 0; c < C; ++c) acc += xp[c * S] * xp[c * S];
        const float rms = sqrtf(acc / (float)C + eps);
        for (int64_t c = 0; c < C; ++c) yp[c * S] = xp[c * S] / rms;
    }
}

static cudaStream_t side_stream = nullptr;

torch::Tensor rmsnorm_side(torch::Tensor x, double eps) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.dim() >= 2, "contiguous CUDA (batch, features, ...) expected");
    if (side_stream == nullptr) cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking);
    auto y = torch::empty(x.sizes(), x.options());
    const int64_t batch = x.size(0), C = x.size(1), S = x.numel() / (batch * C);
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((batch * S + threads - 1) / threads, 132 * 16);
    rmsnorm_kernel<<<blocks, threads, 0, side_stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), batch, C, S, (float)eps);
    return y;  // no synchronisation with the caller's stream
}
"""

cpp_source = "torch::Tensor rmsnorm_side(torch::Tensor x, double eps);"

ext = load_inline(
    name="cudagym_stress_hack_l1_36_rmsnorm_side_stream",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rmsnorm_side"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super(ModelNew, self).__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.rmsnorm_side(x.contiguous(), self.eps)
