# stress: honest
# problem: kernelbench
# why: the tanh GELU elementwise, fp32 with accurate tanhf (no fast math), float4 loads/stores when 16-byte aligned
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cstdint>

// 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), as the reference writes it
__device__ __forceinline__ float act(float v) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * (v * v * v))));
}

__global__ void act_vec4(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = x[i];
        v.x = act(v.x); v.y = act(v.y); v.z = act(v.z); v.w = act(v.w);
        y[i] = v;
    }
}

__global__ void act_scalar(const float* __restrict__ x, float* __restrict__ y, int64_t start, int64_t n) {
    for (int64_t i = start + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = act(x[i]);
}

torch::Tensor gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty(xc.sizes(), xc.options());
    const int64_t n = xc.numel();
    if (n == 0) return y;
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int threads = 256;
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 16;
    int64_t start = 0;
    if (reinterpret_cast<uintptr_t>(xp) % 16 == 0 && reinterpret_cast<uintptr_t>(yp) % 16 == 0) {
        const int64_t n4 = n / 4;
        if (n4 > 0) {
            const int blocks = (int)std::min<int64_t>((n4 + threads - 1) / threads, max_blocks);
            act_vec4<<<blocks, threads, 0, stream>>>(reinterpret_cast<const float4*>(xp), reinterpret_cast<float4*>(yp), n4);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
        }
        start = n4 * 4;
    }
    if (start < n) {
        const int blocks = (int)std::min<int64_t>((n - start + threads - 1) / threads, max_blocks);
        act_scalar<<<blocks, threads, 0, stream>>>(xp, yp, start, n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return y;
}
"""

cpp_source = "torch::Tensor gelu_forward(torch::Tensor x);"

ext = load_inline(
    name="cudagym_stress_honest_l1_88_new_gelu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gelu_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x):
        return ext.gelu_forward(x)
