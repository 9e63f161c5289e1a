# stress: honest
# problem: kernelbench
# kb_version: v0
# why: x / sum(|x|, dim=1): one block per row, a double-accumulated block reduction, then the division; a tiny problem (KernelBench v0 sizes)
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

constexpr int THREADS = 512;

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

__global__ void __launch_bounds__(THREADS) l1norm_rows(const float* __restrict__ x, float* __restrict__ y,
                                                       int64_t rows, int64_t cols) {
    __shared__ float norm_s;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        double acc = 0.0;
        for (int64_t j = threadIdx.x; j < cols; j += THREADS) acc += fabsf(xr[j]);
        const double s = block_sum(acc);
        if (threadIdx.x == 0) norm_s = (float)s;
        __syncthreads();
        const float norm = norm_s;
        for (int64_t j = threadIdx.x; j < cols; j += THREADS) yr[j] = xr[j] / norm;
        __syncthreads();  // norm_s and the warp sums are reused for the next row
    }
}

torch::Tensor l1norm_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    TORCH_CHECK(x.dim() == 2, "a (batch, dim) tensor expected (normalised over dim 1)");
    auto xc = x.contiguous();
    auto y = torch::empty(xc.sizes(), xc.options());
    const int64_t rows = xc.size(0), cols = xc.size(1);
    if (rows == 0 || cols == 0) return y;
    const int blocks = (int)std::min<int64_t>(rows, 1 << 20);
    l1norm_rows<<<blocks, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(),
                                                                         rows, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor l1norm_forward(torch::Tensor x);"

ext = load_inline(
    name="cudagym_stress_honest_v0_l1_38_l1norm",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["l1norm_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.l1norm_forward(x)
