# stress: honest
# problem: kernelbench
# kb_version: v0
# why: the MSE over every element: a grid-stride reduction with double accumulators into per-block partials, then one finishing block; a tiny problem (KernelBench v0 sizes)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

constexpr int THREADS = 256;

__device__ double block_sum(double v) {
    __shared__ double warp_sums[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = (threadIdx.x < THREADS / 32) ? warp_sums[threadIdx.x] : 0.0;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;  // the block's sum, in thread 0
}

__global__ void sq_diff_partial(const float* __restrict__ p, const float* __restrict__ t, double* __restrict__ partial,
                                int64_t n) {
    double acc = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double d = (double)p[i] - (double)t[i];
        acc += d * d;
    }
    const double s = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void finish_mean(const double* __restrict__ partial, int64_t n_partial, double count, float* __restrict__ out) {
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < n_partial; i += blockDim.x) acc += partial[i];
    const double s = block_sum(acc);
    if (threadIdx.x == 0) out[0] = (float)(s / count);
}

torch::Tensor mse_forward(torch::Tensor p, torch::Tensor t) {
    TORCH_CHECK(p.is_cuda() && t.is_cuda() && p.sizes() == t.sizes() && p.numel() > 0,
                "same non-empty CUDA shapes expected");
    TORCH_CHECK(p.scalar_type() == torch::kFloat32 && t.scalar_type() == torch::kFloat32, "float32 expected");
    auto pc = p.contiguous();
    auto tc = t.contiguous();
    const int64_t n = pc.numel();
    const int64_t max_blocks = (int64_t)at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 8;
    const int blocks = (int)std::min<int64_t>((n + THREADS - 1) / THREADS, max_blocks);
    auto partial = torch::empty({(int64_t)blocks}, pc.options().dtype(torch::kFloat64));
    auto out = torch::empty({}, pc.options());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    sq_diff_partial<<<blocks, THREADS, 0, stream>>>(pc.data_ptr<float>(), tc.data_ptr<float>(),
                                                    partial.data_ptr<double>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    finish_mean<<<1, THREADS, 0, stream>>>(partial.data_ptr<double>(), (int64_t)blocks, (double)n, out.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = "torch::Tensor mse_forward(torch::Tensor p, torch::Tensor t);"

ext = load_inline(
    name="cudagym_stress_honest_v0_l1_94_mse",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["mse_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, predictions, targets):
        return ext.mse_forward(predictions, targets)
