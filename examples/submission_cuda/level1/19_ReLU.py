# Honest CUDA: a vectorised ReLU (float4 loads and stores) on the current stream.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void relu_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = x[i];
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
        y[i] = v;
    }
}

__global__ void relu_tail(const float* __restrict__ x, float* __restrict__ y, int64_t start, int64_t n) {
    int64_t i = start + blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel(), n4 = n / 4;
    auto stream = at::cuda::getCurrentCUDAStream();
    if (n4 > 0) {
        const int threads = 256;
        const int blocks = (int)std::min<int64_t>((n4 + threads - 1) / threads, 132 * 32);
        relu_kernel<<<blocks, threads, 0, stream>>>(reinterpret_cast<const float4*>(xc.data_ptr<float>()),
                                                    reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
    }
    if (n - 4 * n4 > 0) relu_tail<<<1, 256, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(), 4 * n4, n);
    return y;
}
"""

cpp_source = "torch::Tensor relu_forward(torch::Tensor x);"

ext = load_inline(name="cudagym_example_relu_cuda", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["relu_forward"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.relu_forward(x)
